//! What happens to an outbox event that can never become a Kafka record.
//!
//! A *bad event* is one whose own content is the problem: a NULL in a mapped column, a route
//! value that makes an illegal topic name, a record Kafka refuses for its size or shape, a
//! malformed `pg_logical_emit_message` event. Replaying it cannot help, so the relay applies the
//! operator's [`BadEventPolicy`](crate::config::relay::BadEventPolicy) (`[relay] on_bad_event`):
//!
//! * `fail` (default): stop with an error naming the event id, the commit LSN and the cause;
//!   the event's transaction is never confirmed, so nothing from it on is lost or skipped.
//! * `dead-letter`: publish the raw event to `[relay] dead_letter_topic` — for a row, every column
//!   as a JSON object of column → text (or null); for a message, its content as-is — with the
//!   error in headers ([`RawEvent::dead_letter`]). It goes through the same producer and counts in the
//!   watermark like any event, so the WAL is only released once the dead letter is in Kafka.
//! * `skip`: log at WARN with id, LSN and cause, count it, go on.
//!
//! Whatever the policy, every bad event is counted in
//! [`crate::ops::metrics::BAD_EVENTS_TOTAL`]`{policy, cause}`.

use std::borrow::Cow;

use bytes::Bytes;

use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::{ColumnValue, Relation, TupleData};
use crate::sink::{RecordHeader, SinkLimits, SinkRecord};

/// Why one event cannot become a Kafka record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadEvent {
    #[error("column {column:?} ({role}) is NULL")]
    Null { column: String, role: &'static str },
    #[error("column {column:?} ({role}) is not valid UTF-8 text")]
    NotUtf8 { column: String, role: &'static str },
    #[error("column {column:?} (payload, bytea) is not PostgreSQL's hex bytea text: {cause}")]
    Bytea { column: String, cause: String },
    #[error("column {column:?} arrived in binary format, which the relay never requests")]
    Binary { column: String },
    #[error("the row has {got} columns but the table's Relation message described {expected}")]
    ShortTuple { got: usize, expected: usize },
    #[error("{0}")]
    Topic(String),
    /// The broker (or its client) refused the record: "<broker> refused the record: <why>".
    #[error("{0}")]
    Rejected(String),
    #[error("logical decoding message: {0}")]
    Message(String),
    /// `[debezium]`: the event has no record in Debezium's format (Debezium's own task would
    /// stop on it, or a column's text is not of its type).
    #[error("no record in Debezium's format: {0}")]
    Debezium(String),
}

impl BadEvent {
    /// `broker` (e.g. "Kafka") refused the record for `cause`.
    pub(crate) fn refused_by(broker: &str, cause: &str) -> BadEvent {
        BadEvent::Rejected(format!("{broker} refused the record: {cause}"))
    }

    /// The `cause` label of `outbox_relay_bad_events_total`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            BadEvent::Null { .. } => "null_column",
            BadEvent::NotUtf8 { .. } => "not_utf8",
            BadEvent::Binary { .. } => "binary_value",
            BadEvent::Bytea { .. } => "bad_bytea",
            BadEvent::ShortTuple { .. } => "short_tuple",
            BadEvent::Topic(_) => "invalid_topic",
            BadEvent::Rejected(_) => "kafka_rejected",
            BadEvent::Message(_) => "bad_message",
            BadEvent::Debezium(_) => "debezium_format",
        }
    }
}

/// Header names of a dead-letter record (besides `id`, the event id as for every record).
pub(crate) const HEADER_ERROR: &str = "outbox-relay-error";
pub(crate) const HEADER_LSN: &str = "outbox-relay-lsn";
pub(crate) const HEADER_SOURCE: &str = "outbox-relay-source-table";
/// Present only when the raw content was cut to fit the sink's largest message: the original length.
pub(crate) const HEADER_TRUNCATED: &str = "outbox-relay-truncated-from";

/// Room left for the framing a broker counts against its message size limit.
const RECORD_OVERHEAD: usize = 4096;

/// The event as it was written, for a dead letter: not the mapped [`crate::outbox::event::OutboxEvent`]
/// (which may be what failed, and leaves unmapped columns out) but the whole row or message.
/// Rendering a row costs an allocation, so callers build it only when a bad event needs it, or
/// keep it with a suspect the relay holds back (`relay::quarantine`).
#[derive(Debug, Clone)]
pub(crate) struct RawEvent {
    /// `schema.table` of the row, or `pg_logical_emit_message:<prefix>`.
    pub(crate) source: String,
    /// A row as a JSON object of column → text/null; a message's content unchanged.
    pub(crate) content: Bytes,
    /// The record key to use, when the event has a usable one (keeps the dead letter next to
    /// its aggregate's other events).
    pub(crate) key: Option<Bytes>,
}

impl RawEvent {
    pub(crate) fn row(table: &str, relation: &Relation, tuple: &TupleData, key: Option<Bytes>) -> Self {
        RawEvent {
            source: table.to_owned(),
            content: Bytes::from(row_json(relation, tuple)),
            key,
        }
    }

    pub(crate) fn message(prefix: &str, content: Bytes) -> Self {
        RawEvent {
            source: format!("pg_logical_emit_message:{prefix}"),
            content,
            key: None,
        }
    }
}

/// Renders a row as `{"column": "text" | null, …}` in column order. Values that are not text
/// (the relay never asks for binary values, and inserts never carry unchanged-TOAST markers)
/// are rendered as null; bytes that are not UTF-8 are replaced, since JSON cannot carry them.
pub(crate) fn row_json(relation: &Relation, tuple: &TupleData) -> String {
    let mut out = String::with_capacity(64 + tuple.columns.iter().map(value_len).sum::<usize>());
    out.push('{');
    for (i, value) in tuple.columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let name = relation
            .columns
            .get(i)
            .map_or_else(|| format!("#{i}"), |c| c.name.clone());
        push_json_string(&mut out, &name);
        out.push(':');
        match value {
            ColumnValue::Text(b) => push_json_string(&mut out, &String::from_utf8_lossy(b)),
            ColumnValue::Null | ColumnValue::UnchangedToast | ColumnValue::Binary(_) => out.push_str("null"),
        }
    }
    out.push('}');
    out
}

fn value_len(v: &ColumnValue) -> usize {
    match v {
        ColumnValue::Text(b) | ColumnValue::Binary(b) => b.len() + 8,
        ColumnValue::Null | ColumnValue::UnchangedToast => 8,
    }
}

fn push_json_string(out: &mut String, s: &str) {
    // serde_json's escaping; a String never fails to serialize.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

impl RawEvent {
    /// The dead-letter record of this event, rejected for `cause`, from the transaction
    /// committed at `commit_lsn`: to `topic`, with the event's key when it has a usable one, the
    /// raw content as the value, `id` as for every record, and the cause in headers. The content
    /// is cut (at a character boundary when it is text) so the record fits the producer's
    /// largest message (Kafka: `message.max.bytes`): a dead letter refused in turn would stall the relay, and
    /// the header [`HEADER_TRUNCATED`] says how long it was.
    pub(crate) fn dead_letter<'a>(
        &'a self,
        topic: &'a str,
        event_id: &'a [u8],
        commit_lsn: Lsn,
        cause: &BadEvent,
        limits: &SinkLimits,
    ) -> SinkRecord<'a> {
        let text = |s: String| Some(Cow::Owned(s.into_bytes()));
        let mut headers: Vec<RecordHeader<'a>> = vec![
            (Cow::Borrowed(HEADER_ERROR), text(cause.to_string())),
            (Cow::Borrowed(HEADER_LSN), text(commit_lsn.to_string())),
            (
                Cow::Borrowed(HEADER_SOURCE),
                Some(Cow::Borrowed(self.source.as_bytes())),
            ),
        ];
        let key: &[u8] = self.key.as_deref().unwrap_or_default();
        let fixed = key.len()
            + event_id.len()
            + headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
                .sum::<usize>()
            + HEADER_TRUNCATED.len()
            + 20;
        let limit = limits
            .max_message_bytes
            .saturating_sub(fixed + RECORD_OVERHEAD)
            .max(1024);
        let payload = if self.content.len() > limit {
            headers.push((Cow::Borrowed(HEADER_TRUNCATED), text(self.content.len().to_string())));
            &self.content[..char_boundary_at_or_before(&self.content, limit)]
        } else {
            &self.content[..]
        };
        SinkRecord {
            destination: Cow::Borrowed(topic),
            key: Cow::Borrowed(key),
            value: Some(Cow::Borrowed(payload)),
            event_id,
            timestamp_ms: None,
            headers: Cow::Owned(headers),
            partition: None,
        }
    }
}

/// The largest cut ≤ `limit` that does not split a UTF-8 sequence (any cut for non-text).
fn char_boundary_at_or_before(content: &[u8], limit: usize) -> usize {
    if std::str::from_utf8(content).is_err() {
        return limit.min(content.len());
    }
    let mut cut = limit.min(content.len());
    // UTF-8 continuation bytes are 0b10xx_xxxx.
    while cut > 0 && content.get(cut).is_some_and(|b| b & 0xC0 == 0x80) {
        cut -= 1;
    }
    cut
}

#[cfg(test)]
mod tests {

    use proptest::prelude::*;

    use super::*;

    fn relation(names: &[&str]) -> Relation {
        Relation::text_columns("public", "outbox", names)
    }

    /// A sink taking messages up to `max` bytes (Kafka's default: 1,000,000).
    fn limits(max: Option<usize>) -> SinkLimits {
        SinkLimits {
            check_name: |_| Ok(()),
            max_message_bytes: max.unwrap_or(1_000_000),
        }
    }

    #[test]
    fn rows_render_as_json_objects_in_column_order() {
        let rel = relation(&["id", "type", "payload", "note"]);
        let tuple = TupleData {
            columns: vec![
                ColumnValue::Text(Bytes::from_static(b"7")),
                ColumnValue::Null,
                ColumnValue::Text(Bytes::from_static(r#"{"a": "ü\"x"}"#.as_bytes())),
                ColumnValue::Binary(Bytes::from_static(b"\x00")),
            ],
        };
        let json = row_json(&rel, &tuple);
        assert_eq!(
            json,
            r#"{"id":"7","type":null,"payload":"{\"a\": \"ü\\\"x\"}","note":null}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["payload"], r#"{"a": "ü\"x"}"#);
    }

    #[test]
    fn dead_letter_headers_and_truncation() {
        let raw = RawEvent {
            source: "public.outbox".into(),
            content: Bytes::from("é".repeat(10_000)),
            key: Some(Bytes::from_static(b"agg")),
        };
        let cause = BadEvent::Null {
            column: "type".into(),
            role: "route-by value",
        };
        let small = raw.dead_letter("dlq", b"42", Lsn(0x16B3748), &cause, &limits(Some(8192)));
        assert!(
            small.value.as_deref().unwrap().len() < 8192 && small.value.as_deref().unwrap().len() >= 1024,
            "{}",
            small.value.as_deref().unwrap().len()
        );
        assert!(
            std::str::from_utf8(small.value.as_deref().unwrap()).is_ok(),
            "cut inside a character"
        );
        let header = |name: &str| {
            small
                .headers
                .iter()
                .find(|(k, _)| *k == name)
                .and_then(|(_, v)| v.clone())
                .map(|v| Bytes::from(v.into_owned()))
        };
        assert_eq!(header(HEADER_TRUNCATED).unwrap(), "20000");
        assert_eq!(header(HEADER_LSN).unwrap(), "0/16B3748");
        assert_eq!(header(HEADER_SOURCE).unwrap(), "public.outbox");
        assert!(String::from_utf8_lossy(&header(HEADER_ERROR).unwrap()).contains("\"type\""));
        assert_eq!(&*small.key, b"agg");
        assert_eq!(
            (&*small.destination, small.event_id, small.timestamp_ms),
            ("dlq", &b"42"[..], None)
        );
        let whole = raw.dead_letter("dlq", b"42", Lsn(1), &cause, &limits(None));
        assert_eq!(whole.value.as_deref().unwrap().len(), 20_000);
        assert!(whole.headers.iter().all(|(k, _)| *k != HEADER_TRUNCATED));
    }

    proptest! {
        #[test]
        fn row_json_is_always_valid_json(values in proptest::collection::vec(proptest::option::of(any::<Vec<u8>>()), 0..6)) {
            let names: Vec<String> = (0..values.len()).map(|i| format!("c\"{i}")).collect();
            let rel = relation(&names.iter().map(String::as_str).collect::<Vec<_>>());
            let tuple = TupleData {
                columns: values
                    .iter()
                    .map(|v| v.as_ref().map_or(ColumnValue::Null, |b| ColumnValue::Text(Bytes::from(b.clone()))))
                    .collect(),
            };
            let parsed: serde_json::Value = serde_json::from_str(&row_json(&rel, &tuple)).unwrap();
            prop_assert_eq!(parsed.as_object().unwrap().len(), values.len());
        }

        #[test]
        fn truncation_respects_the_limit(len in 0usize..40_000, max in 2_000usize..30_000, multibyte in any::<bool>()) {
            let text = if multibyte { "ü".repeat(len / 2) } else { "x".repeat(len) };
            let raw = RawEvent { source: "s".into(), content: Bytes::from(text), key: None };
            let cause = BadEvent::Topic("t".into());
            let dl = raw.dead_letter("dlq", b"1", Lsn(1), &cause, &limits(Some(max)));
            let total = dl.value.as_deref().unwrap().len() + dl.key.len() + dl.event_id.len()
                + dl.headers.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len())).sum::<usize>();
            prop_assert!(total <= max.max(1024 + total - dl.value.as_deref().unwrap().len()));
            prop_assert!(std::str::from_utf8(dl.value.as_deref().unwrap()).is_ok());
        }
    }
}
