//! The domain: what an outbox event is, independent of how it was read or where it goes.
//!
//! - [`event`]: [`event::OutboxEvent`], the one event type every source produces, and the one way
//!   from an event to a Kafka record; [`event::BadEvent`], why that can fail;
//! - [`layout`]: the event of a streamed row (column mapping over pgoutput Relations);
//! - [`message`]: the event of a `pg_logical_emit_message`;
//! - [`payload`]: the record value of the payload column (text as is, `bytea` decoded to its bytes);
//! - [`timestamp`]: the record timestamp from the timestamp column's text;
//! - [`routing`]: the topic of an event (the configured `[route]` rule, then Kafka's name rule);
//! - [`bad_event`]: what happens to a bad event, and its dead letter;
//! - [`connect`]: the record in Debezium's format (`[debezium]`: Connect schemas, converters,
//!   the EventRouter's expansion and placements).
//!
//! Invariant: pure (no I/O); imports only `config` and the adapters' value types.

pub(crate) mod bad_event;
pub(crate) mod connect;
pub(crate) mod event;
pub(crate) mod layout;
pub(crate) mod message;
pub(crate) mod payload;
pub(crate) mod routing;
pub(crate) mod timestamp;
