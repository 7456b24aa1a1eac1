//! The Kafka adapter: an idempotent librdkafka producer with one completion per record, and the
//! classification of what Kafka refused (the record itself versus the cluster or producer).
//!
//! Invariant: this layer knows nothing of PostgreSQL, WAL positions or the watermark: callers
//! attach their own tag to each record and get it back with the outcome. It imports only
//! `config`.

pub(crate) mod producer;
