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
pub(crate) mod transactions;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use self::logs::QuietContext;
use crate::config::kafka::{validate_topic_name, KafkaProperties};
use crate::sink::{SinkError, SinkLimits};

/// How long `status` waits for the cluster's metadata.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// After a failed metadata request, how often and how long the probe serves the client's
/// queued errors to look for a verdict (`logs::ClientLog::verdict`): at most a second.
const VERDICT_POLLS: u32 = 10;
const VERDICT_POLL: Duration = Duration::from_millis(100);

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

/// `setup`: nothing to create — topics are named by the route rule, so they are created by the
/// brokers (`auto.create.topics.enable`) or by the operator.
pub(crate) fn prepare() -> Vec<String> {
    vec![
        "Kafka: nothing to create; the route rule names the topics — create them, or let the brokers \
          auto-create them (auto.create.topics.enable)"
            .to_owned(),
    ]
}

/// `status`: the cluster's metadata, read with the producer's connection settings.
pub(crate) async fn probe(props: &KafkaProperties) -> Result<String, SinkError> {
    let props = props.clone();
    let unreachable = |cause: String| SinkError {
        sink: "Kafka",
        cause,
        transient: true,
    };
    tokio::task::spawn_blocking(move || {
        let mut config = ClientConfig::new();
        for (k, v) in &props.0 {
            if !tail::PRODUCER_ONLY.contains(&k.as_str()) {
                config.set(k, v);
            }
        }
        let consumer: BaseConsumer<QuietContext> =
            config
                .create_with_context(QuietContext::default())
                .map_err(|e| SinkError {
                    sink: "Kafka",
                    cause: format!("cannot create a client: {e}. Check the [kafka] properties"),
                    transient: false,
                })?;
        let metadata = consumer.fetch_metadata(None, PROBE_TIMEOUT).map_err(|e| {
            // A refused password, an untrusted certificate, an unresolvable host: what `run`
            // would stop on, said the same way (not "unreachable", which waiting may mend).
            // librdkafka hands its global errors to the context only while the client is
            // polled: serve them (bounded) before deciding.
            for _ in 0..VERDICT_POLLS {
                if let Some(fatal) = consumer.context().0.verdict() {
                    return fatal;
                }
                let _ = consumer.poll(VERDICT_POLL);
            }
            consumer
                .context()
                .0
                .verdict()
                .unwrap_or_else(|| unreachable(format!("no metadata within {} s: {e}", PROBE_TIMEOUT.as_secs())))
        })?;
        Ok(format!(
            "reachable: {} broker(s), {} topic(s)",
            metadata.brokers().len(),
            metadata.topics().len()
        ))
    })
    .await
    .map_err(|e| unreachable(e.to_string()))?
}
