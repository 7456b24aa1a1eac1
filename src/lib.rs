//! outbox-relay: a transactional-outbox relay from PostgreSQL logical replication to Kafka.
//!
//! See `docs/architecture.md` for the path of one event from WAL bytes to Kafka ack to LSN
//! confirmation, and which module owns each step.

pub mod bad_event;
pub mod cli;
pub mod config;
pub mod control;
pub mod demo;
pub mod failpoints;
pub mod health;
pub mod http;
pub mod latency;
pub mod logging;
pub mod lsn;
pub mod metrics;
pub mod outbox_event;
pub mod outbox_message;
pub mod pg_client;
pub mod pgoutput;
pub mod poll;
pub mod publisher;
pub mod redact;
pub mod relay;
pub mod replication;
pub mod routing;
pub mod sql_ident;
pub mod tls;
pub mod watermark;
