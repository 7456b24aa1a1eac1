//! The domain: what an outbox event is, independent of how it was read or where it goes.
//!
//! - [`event`]: column mapping and extraction of an event from an outbox row;
//! - [`message`]: events sent as `pg_logical_emit_message`;
//! - [`routing`]: the topic of an event (the configured `[route]` rule, then Kafka's name rule);
//! - [`bad_event`]: why an event cannot be published, and its dead letter.
//!
//! Invariant: pure (no I/O); imports only `config` and the adapters' value types.

pub mod bad_event;
pub mod event;
pub mod message;
pub mod routing;
