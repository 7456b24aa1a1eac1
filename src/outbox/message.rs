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

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::outbox::event::BadEvent;

/// The parts of a message event (cheap `Bytes` slices of the message content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub id: Bytes,
    pub key: Bytes,
    pub route_value: String,
    pub payload: Bytes,
}

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

impl OutboxMessage {
    /// Parses one message's content.
    pub fn parse(content: &Bytes) -> Result<OutboxMessage, BadEvent> {
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
            Some(raw) if raw.get() != "null" => content.slice_ref(raw.get().as_bytes()),
            _ => return Err(BadEvent::Message("field \"payload\" is missing or null".into())),
        };
        Ok(OutboxMessage {
            id,
            key,
            route_value,
            payload,
        })
    }
}

impl OutboxMessage {
    /// The `id` of content that failed [`parse`](Self::parse), for error messages: `?` when
    /// there is none to find.
    pub fn best_effort_id(content: &[u8]) -> String {
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
}

fn scalar_text(field: &'static str, value: Option<Scalar>) -> Result<Bytes, BadEvent> {
    match value {
        Some(Scalar::Text(s)) => Ok(Bytes::from(s)),
        Some(Scalar::Number(n)) => Ok(Bytes::from(n.to_string())),
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

    fn parse(s: &str) -> Result<OutboxMessage, BadEvent> {
        OutboxMessage::parse(&Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn the_documented_shape() {
        let m =
            parse(r#"{"type":"order.placed","aggregate_id":"a-1","id":"e-1","payload": {"b": 1,  "a": [2]}}"#).unwrap();
        assert_eq!(m.route_value, "order.placed");
        assert_eq!(m.key, "a-1");
        assert_eq!(m.id, "e-1");
        assert_eq!(m.payload, r#"{"b": 1,  "a": [2]}"#, "payload bytes exactly as written");
    }

    #[test]
    fn numbers_are_accepted_for_ids_and_any_payload_but_null() {
        let m = parse(r#"{"type":"t","aggregate_id":42,"id":7,"payload":"text","extra":true}"#).unwrap();
        assert_eq!(
            (m.key.as_ref(), m.id.as_ref(), m.payload.as_ref()),
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
        assert!(OutboxMessage::parse(&Bytes::from_static(b"\xff\xfe"))
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
    }

    proptest! {
        #[test]
        fn arbitrary_content_never_panics(content in any::<Vec<u8>>()) {
            let _ = OutboxMessage::parse(&Bytes::from(content));
        }

        #[test]
        fn well_formed_messages_round_trip(ty in "[a-z.]{1,20}", agg in "\\PC{0,20}", id in "\\PC{0,20}", n in any::<i64>()) {
            let content = serde_json::json!({"type": ty, "aggregate_id": agg, "id": id, "payload": {"n": n}}).to_string();
            let m = OutboxMessage::parse(&Bytes::from(content)).unwrap();
            prop_assert_eq!(m.route_value, ty);
            prop_assert_eq!(m.key, agg.as_bytes());
            prop_assert_eq!(m.id, id.as_bytes());
            let payload: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            prop_assert_eq!(payload["n"].as_i64(), Some(n));
        }
    }
}
