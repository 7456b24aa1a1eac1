//! [`OutboxEvent`]: one outbox event, whatever it was read from, and the one way it becomes a
//! Kafka record.
//!
//! Four sources give an event, each in one place:
//!
//! | source | where | produced by |
//! |---|---|---|
//! | an inserted row, streamed (pgoutput) | `relay::decode` | [`OutboxLayout::extract`](super::layout::OutboxLayout::extract) |
//! | a `pg_logical_emit_message`, streamed | `relay::publish` | [`OutboxEvent::from_message`] (`message.rs`) |
//! | a row claimed by the polling relayer | `poll::worker` | [`OutboxEvent::from_columns`] |
//! | a pending row read by the backfill | `control::backfill` | [`OutboxEvent::from_columns`] |
//!
//! and [`OutboxEvent::record`] is the only way to a record: the route-by value goes through the
//! [`TopicRoute`], the topic is checked against Kafka's rules, the id becomes the first header
//! (`id`), the extra headers follow in the mapping's order. So the same content gives
//! byte-identical records from every source (the unit tests below, and `tests/it/poll.rs`
//! against a broker).
//!
//! An event borrows from what it was read from (the decoded WAL message, the claimed row): on
//! the streaming path, building it allocates nothing but the header list, and only when header
//! columns are mapped. [`OutboxEvent::into_owned`] detaches it where it must outlive its source.

use std::borrow::Cow;

use crate::config::outbox::{OutboxMapping, TopicRoute};
use crate::kafka::producer::{OutboundRecord, RecordHeader};
use crate::outbox::routing;
use crate::outbox::timestamp::parse_timestamp_ms;

/// Why one event cannot become a Kafka record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadEvent {
    #[error("column {column:?} ({role}) is NULL")]
    Null { column: String, role: &'static str },
    #[error("column {column:?} ({role}) is not valid UTF-8 text")]
    NotUtf8 { column: String, role: &'static str },
    #[error("column {column:?} arrived in binary format, which the relay never requests")]
    Binary { column: String },
    #[error("the row has {got} columns but the table's Relation message described {expected}")]
    ShortTuple { got: usize, expected: usize },
    #[error("{0}")]
    Topic(String),
    #[error("Kafka refused the record: {0}")]
    Rejected(String),
    #[error("logical decoding message: {0}")]
    Message(String),
}

impl BadEvent {
    /// The `cause` label of `outbox_relay_bad_events_total`.
    pub fn label(&self) -> &'static str {
        match self {
            BadEvent::Null { .. } => "null_column",
            BadEvent::NotUtf8 { .. } => "not_utf8",
            BadEvent::Binary { .. } => "binary_value",
            BadEvent::ShortTuple { .. } => "short_tuple",
            BadEvent::Topic(_) => "invalid_topic",
            BadEvent::Rejected(_) => "kafka_rejected",
            BadEvent::Message(_) => "bad_message",
        }
    }
}

/// One outbox event: the values its record is made of, before routing.
///
/// Values are the text PostgreSQL's output functions render (for a message, the JSON text as
/// written), passed through as bytes. Fields are `Cow`s: borrowed from the source where it
/// holds them as they are (rows; a message's payload), owned where the source had to make them
/// (a message's id and key, which may be JSON numbers or escaped strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent<'a> {
    /// The `id` header.
    pub id: Cow<'a, [u8]>,
    /// The record key (the aggregate id).
    pub key: Cow<'a, [u8]>,
    /// What the topic is routed from (Debezium's `routedByValue`).
    pub route_value: Cow<'a, str>,
    /// The record value.
    pub payload: Cow<'a, [u8]>,
    /// The record timestamp; `None` leaves it to the producer.
    pub timestamp_ms: Option<i64>,
    /// Headers after `id`, in the mapping's order (`header_columns`); a NULL gives a null header.
    pub headers: Vec<RecordHeader<'a>>,
}

impl<'a> OutboxEvent<'a> {
    /// The Kafka record of this event: topic routed by `router` and checked against Kafka's
    /// naming rules (an illegal topic is [`BadEvent::Topic`]); everything else borrowed.
    pub fn record<'r>(&'r self, router: &TopicRoute) -> Result<OutboundRecord<'r>, BadEvent> {
        let topic = routing::topic(router, &self.route_value)?;
        Ok(OutboundRecord {
            topic,
            key: &self.key,
            payload: &self.payload,
            event_id: &self.id,
            timestamp_ms: self.timestamp_ms,
            headers: Cow::Borrowed(&self.headers),
        })
    }

    /// The same event owning all its values, to outlive its source (a suspect the relay holds
    /// back, `relay::quarantine`). Copies; never on the streaming path's normal course.
    pub fn into_owned(self) -> OutboxEvent<'static> {
        OutboxEvent {
            id: Cow::Owned(self.id.into_owned()),
            key: Cow::Owned(self.key.into_owned()),
            route_value: Cow::Owned(self.route_value.into_owned()),
            payload: Cow::Owned(self.payload.into_owned()),
            timestamp_ms: self.timestamp_ms,
            headers: self
                .headers
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name.into_owned()), value.map(|v| Cow::Owned(v.into_owned()))))
                .collect(),
        }
    }

    /// The event of a row read with SQL: `values` are the mapped columns' text in
    /// [`OutboxMapping::columns`] order (`None` = NULL), as the polling relayer's claim query
    /// and the backfill's snapshot read select them (in text format, under the replication
    /// connection's output settings, so the text is what pgoutput would have sent).
    ///
    /// The rules are the streaming path's: id, key, route-by value and payload must not be
    /// NULL; an unparseable timestamp leaves the record timestamp to the producer; a NULL header
    /// column gives a null header.
    pub fn from_columns(mapping: &'a OutboxMapping, values: &[Option<&'a str>]) -> Result<Self, BadEvent> {
        let value = |i: usize| values.get(i).copied().flatten();
        let required = |i: usize, role: &'static str| {
            value(i).ok_or_else(|| BadEvent::Null {
                column: mapping.columns()[i].1.as_str().to_owned(),
                role,
            })
        };
        let id = required(0, "event id")?;
        let key = required(1, "message key")?;
        let route_value = required(2, "route-by value")?;
        let payload = required(3, "payload")?;
        let mut next = 4;
        let timestamp_ms = if mapping.timestamp.is_some() {
            next += 1;
            value(4).and_then(|t| parse_timestamp_ms(t.as_bytes()))
        } else {
            None
        };
        let headers = mapping
            .headers
            .iter()
            .enumerate()
            .map(|(i, (_, name))| {
                (
                    Cow::Borrowed(name.as_str()),
                    value(next + i).map(|v| Cow::Borrowed(v.as_bytes())),
                )
            })
            .collect();
        Ok(OutboxEvent {
            id: Cow::Borrowed(id.as_bytes()),
            key: Cow::Borrowed(key.as_bytes()),
            route_value: Cow::Borrowed(route_value),
            payload: Cow::Borrowed(payload.as_bytes()),
            timestamp_ms,
            headers,
        })
    }

    /// The event id of `values` (as for [`from_columns`](Self::from_columns)) for error
    /// messages, also when they are no event: `?` when the id itself is NULL.
    pub fn id_of_columns<'v>(values: &[Option<&'v str>]) -> &'v str {
        values.first().copied().flatten().unwrap_or("?")
    }
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
