//! Outbox events without a table: logical decoding messages.
//!
//! A service can write an event with
//! `SELECT pg_logical_emit_message(true, '<prefix>', '<json>')` inside its business
//! transaction instead of inserting an outbox row. With `[outbox] message_prefix` set, the relay
//! turns every *transactional* message with that prefix into an event routed exactly like a row.
//! The content is one JSON object:
//!
//! ```json
//! {"type": "order.placed", "aggregate_id": "4b1c…", "id": "9f2e…", "payload": {"total": 42}}
//! ```
//!
//! * `type` — the route-by value (topic routing as for rows); a string.
//! * `aggregate_id` — the Kafka key; a string or a number (its JSON text).
//! * `id` — the `id` header; a string or a number.
//! * `payload` — any JSON value except null; the Kafka value is its text exactly as written in
//!   the message (no re-serialization, so key order and spacing are preserved).
//!
//! Other fields are ignored. Anything else — content that is not UTF-8 JSON, a missing or null
//! field, a field of the wrong type — is a bad event, handled by `[relay] on_bad_event`.
//!
//! Non-transactional messages (`pg_logical_emit_message(false, …)`) are ignored: the server
//! writes them immediately, outside the transaction, and decodes them even if the transaction
//! that emitted them rolls back — publishing them would announce business changes that never
//! happened, and their position is not tied to any commit the relay could confirm.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::outbox::bad_event::BadEvent;
use crate::outbox::event::OutboxEvent;

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(rename = "type")]
    event_type: Option<Scalar>,
    aggregate_id: Option<Scalar>,
    id: Option<Scalar>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
}

/// A JSON string or number; anything else is refused with the field's name.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Number(serde_json::Number),
    Other(serde::de::IgnoredAny),
}

impl<'a> OutboxEvent<'a> {
    /// The event of one message's content: the payload borrowed from `content`, the id and key
    /// made from their JSON (strings unescaped, numbers as their JSON text).
    pub(crate) fn from_message(content: &'a [u8]) -> Result<Self, BadEvent> {
        let text =
            std::str::from_utf8(content).map_err(|_| BadEvent::Message("the content is not UTF-8 text".into()))?;
        let wire: Wire<'_> = serde_json::from_str(text).map_err(|e| {
            BadEvent::Message(format!(
                "the content is not a JSON object of type, aggregate_id, id and payload ({e})"
            ))
        })?;
        let route_value = match wire.event_type {
            Some(Scalar::Text(s)) => s,
            other => return Err(field_error("type", other.as_ref(), "a string")),
        };
        let key = scalar_text("aggregate_id", wire.aggregate_id)?;
        let id = scalar_text("id", wire.id)?;
        let payload = match wire.payload {
            Some(raw) if raw.get() != "null" => raw.get().as_bytes(),
            _ => return Err(BadEvent::Message("field \"payload\" is missing or null".into())),
        };
        Ok(OutboxEvent {
            id: Cow::Owned(id),
            key: Cow::Owned(key),
            route_value: Cow::Owned(route_value),
            payload: Some(Cow::Borrowed(payload)),
            timestamp_ms: None,
            headers: Vec::new(),
            placed: Vec::new(),
            // Debezium has no outbox records of logical messages: they keep the plain format.
            connect: None,
            table: None,
            payload_format: crate::outbox::payload::PayloadFormat::Text,
            commit_time_us: None,
            // A message has no columns: no trace context, no extensions.
            traceparent: None,
            tracestate: None,
            extensions: Vec::new(),
            // `[route]` templates read a message's route-by value, key and id by their column
            // names (`OutboxEvent::template_value`).
            routing_columns: Vec::new(),
        })
    }
}

/// The `id` of content that failed [`OutboxEvent::from_message`], for error messages: `?` when
/// there is none to find.
pub(crate) fn best_effort_id(content: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(content)
        .ok()
        .as_ref()
        .and_then(|v| v.get("id"))
    {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => "?".into(),
    }
}

fn scalar_text(field: &'static str, value: Option<Scalar>) -> Result<Vec<u8>, BadEvent> {
    match value {
        Some(Scalar::Text(s)) => Ok(s.into_bytes()),
        Some(Scalar::Number(n)) => Ok(n.to_string().into_bytes()),
        other => Err(field_error(field, other.as_ref(), "a string or a number")),
    }
}

fn field_error(field: &'static str, value: Option<&Scalar>, expected: &str) -> BadEvent {
    let what = if value.is_some() {
        "has the wrong type"
    } else {
        "is missing or null"
    };
    BadEvent::Message(format!("field {field:?} {what}; it must be {expected}"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(s: &str) -> Result<OutboxEvent<'_>, BadEvent> {
        OutboxEvent::from_message(s.as_bytes())
    }

    #[test]
    fn the_documented_shape() {
        let m =
            parse(r#"{"type":"order.placed","aggregate_id":"a-1","id":"e-1","payload": {"b": 1,  "a": [2]}}"#).unwrap();
        assert_eq!(m.route_value, "order.placed");
        assert_eq!(&*m.key, b"a-1");
        assert_eq!(&*m.id, b"e-1");
        assert_eq!(
            m.payload.as_deref().unwrap(),
            br#"{"b": 1,  "a": [2]}"#,
            "payload bytes exactly as written"
        );
        assert!(
            matches!(m.payload, Some(Cow::Borrowed(_))),
            "the payload is borrowed from the content"
        );
        assert_eq!((m.timestamp_ms, m.headers.len()), (None, 0));
    }

    #[test]
    fn numbers_are_accepted_for_ids_and_any_payload_but_null() {
        let m = parse(r#"{"type":"t","aggregate_id":42,"id":7,"payload":"text","extra":true}"#).unwrap();
        assert_eq!(
            (m.key.as_ref(), m.id.as_ref(), m.payload.as_deref().unwrap()),
            (&b"42"[..], &b"7"[..], &br#""text""#[..])
        );
        assert!(parse(r#"{"type":"t","aggregate_id":"a","id":"i","payload":[]}"#).is_ok());
    }

    #[test]
    fn bad_shapes_name_the_problem() {
        let err = |s: &str| parse(s).unwrap_err().to_string();
        assert!(err("not json").contains("not a JSON object"));
        assert!(err(r#"{"aggregate_id":"a","id":"i","payload":1}"#).contains("\"type\" is missing"));
        assert!(err(r#"{"type":1,"aggregate_id":"a","id":"i","payload":1}"#).contains("\"type\" has the wrong type"));
        assert!(err(r#"{"type":"t","aggregate_id":null,"id":"i","payload":1}"#).contains("\"aggregate_id\""));
        assert!(err(r#"{"type":"t","aggregate_id":"a","id":{},"payload":1}"#).contains("\"id\" has the wrong type"));
        assert!(err(r#"{"type":"t","aggregate_id":"a","id":"i","payload":null}"#).contains("\"payload\""));
        assert!(err(r#"{"type":"t","aggregate_id":"a","id":"i"}"#).contains("\"payload\""));
        assert!(OutboxEvent::from_message(b"\xff\xfe")
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
    }

    proptest! {
        #[test]
        fn arbitrary_content_never_panics(content in any::<Vec<u8>>()) {
            let _ = OutboxEvent::from_message(&content);
        }

        #[test]
        fn well_formed_messages_round_trip(ty in "[a-z.]{1,20}", agg in "\\PC{0,20}", id in "\\PC{0,20}", n in any::<i64>()) {
            let content = serde_json::json!({"type": ty, "aggregate_id": agg, "id": id, "payload": {"n": n}}).to_string();
            let m = OutboxEvent::from_message(content.as_bytes()).unwrap();
            prop_assert_eq!(m.route_value, ty);
            prop_assert_eq!(&*m.key, agg.as_bytes());
            prop_assert_eq!(&*m.id, id.as_bytes());
            let payload: serde_json::Value = serde_json::from_slice(m.payload.as_deref().unwrap()).unwrap();
            prop_assert_eq!(payload["n"].as_i64(), Some(n));
        }
    }
}
