//! The Kafka sink: an idempotent librdkafka producer with one completion per record, the
//! classification of what Kafka refused (the record itself versus the cluster or producer),
//! the producer's partitioner computed outside librdkafka, and reading back a partition's tail
//! (exactly-once mode).
//!
//! Invariant: this adapter knows nothing of PostgreSQL, WAL positions or the watermark: callers
//! attach their own tag to each record and get it back with the outcome, add their own headers,
//! and recognise their own records when reading back. It imports only `config` and the sink
//! interface.

mod logs;
pub(crate) mod partitioner;
pub(crate) mod producer;
pub(crate) mod tail;

use crate::config::kafka::{validate_topic_name, KafkaProperties};
use crate::sink::SinkLimits;

/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// Kafka's topic-name rule and the producer's `message.max.bytes`.
pub(crate) fn limits(kafka: &KafkaProperties) -> SinkLimits {
    SinkLimits {
        check_name: validate_topic_name,
        max_message_bytes: message_max_bytes(kafka),
    }
}

/// The producer's `message.max.bytes` (librdkafka's default when unset or unreadable).
fn message_max_bytes(kafka: &KafkaProperties) -> usize {
    kafka
        .0
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES)
}
