//! The Kafka adapter: an idempotent librdkafka producer with one completion per record, the
//! classification of what Kafka refused (the record itself versus the cluster or producer),
//! the producer's partitioner computed outside librdkafka, and reading back a partition's tail.
//!
//! Invariant: this layer knows nothing of PostgreSQL, WAL positions or the watermark: callers
//! attach their own tag to each record and get it back with the outcome, add their own headers,
//! and recognise their own records when reading back. It imports only `config`.

pub(crate) mod partitioner;
pub(crate) mod producer;
pub(crate) mod tail;
