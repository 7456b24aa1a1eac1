//! The domain: what an outbox event is, independent of how it was read or where it goes.
//!
//! - [`event`]: [`event::OutboxEvent`], the one event type every source produces, and the one way
//!   from an event to a sink's record (`crate::sink::SinkRecord`);
//! - [`column_types`]: the column mapping checked against a table's columns and their types;
//! - [`layout`]: the event of a streamed row (column mapping over pgoutput Relations);
//! - [`message`]: the event of a `pg_logical_emit_message`;
//! - [`payload`]: the record value of the payload column (text as is, `bytea` decoded to its bytes);
//! - [`timestamp`]: the record timestamp from the timestamp column's text;
//! - [`routing`]: the destination of an event (the configured `[route]` rule, then the sink's
//!   name rule);
//! - [`cloudevents`]: the record as a CloudEvent 1.0 (`[cloudevents]`, binary or structured);
//! - [`trace_context`]: whether a W3C `traceparent` from `outbox.trace_column` is well formed;
//! - [`bad_event`]: [`bad_event::BadEvent`], why an event cannot be published, and its dead letter;
//! - [`connect`]: the record in Debezium's format (`[debezium]`: Connect schemas, converters,
//!   the EventRouter's expansion and placements).
//!
//! Invariant: pure (no I/O); imports only `config` and the adapters' value types — of the sinks,
//! only the interface (`crate::sink`), never a broker's adapter.

pub(crate) mod bad_event;
pub(crate) mod cloudevents;
pub(crate) mod column_types;
pub(crate) mod connect;
pub(crate) mod event;
pub(crate) mod layout;
pub(crate) mod message;
pub(crate) mod payload;
pub(crate) mod routing;
pub(crate) mod timestamp;
pub(crate) mod trace_context;
