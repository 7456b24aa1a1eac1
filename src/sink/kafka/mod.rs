//! The Kafka sink: an idempotent librdkafka producer with one completion per record, the
//! classification of what Kafka refused (the record itself versus the cluster or producer),
//! the producer's partitioner computed outside librdkafka, and reading back a partition's tail
//! (exactly-once mode).
//!
//! Invariant: this adapter knows nothing of PostgreSQL, WAL positions or the watermark: callers
//! attach their own tag to each record and get it back with the outcome, add their own headers,
//! and recognise their own records when reading back. It imports only `config` and the sink
//! interface.

pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
mod late;
mod logs;
#[cfg(feature = "demo")]
mod mock_cluster;
pub(crate) mod partitioner;
pub(crate) mod producer;
mod ready;
pub(crate) mod tail;
mod topic_config;
mod topic_limit;
pub(crate) mod transactions;
mod unsettled;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use self::logs::QuietContext;
use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{
    boxed, ClientQueueExpiry, Created, ExactlyOnce, HeaderGet, ReadBackError, ReadBackReader, ReadBackSource, Seen,
    SinkError, SinkLimits, SinkTag, Transactional,
};
use config::{validate_topic_name, KafkaExactlyOnce, KafkaProperties, KafkaSettings};

/// The Kafka sink (`[sink] kind = "kafka"`, the default).
pub(crate) struct Kafka;

impl SinkPlugin for Kafka {
    type Config = KafkaSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    const MESSAGING_SYSTEM: &'static str = "kafka";

    const KEY_ATTRIBUTE: Option<&'static str> = Some("messaging.kafka.message.key");

    /// librdkafka's lines go through its log callback (`logs.rs`), which routes the chatter
    /// to DEBUG and keeps what it calls critical at WARN.
    const LOG_TARGETS: &'static [ClientLogTarget] = &[
        ClientLogTarget::at("rdkafka", "warn"),
        ClientLogTarget::at("librdkafka", "warn"),
    ];

    fn limits(&self, config: &KafkaSettings) -> SinkLimits {
        limits(&config.properties)
    }

    /// The strategy `[kafka] exactly_once` names, unless the properties rule exactly-once out.
    fn exactly_once(&self, config: &KafkaSettings) -> ExactlyOnce {
        if let Some(reason) = config.exactly_once_refusal() {
            return ExactlyOnce::Unsupported(reason.to_owned().into());
        }
        match config.exactly_once {
            KafkaExactlyOnce::Transactions => ExactlyOnce::Transactions,
            KafkaExactlyOnce::ReadBack => ExactlyOnce::ReadBack(Arc::new(TailSource(config.exactly_once_properties()))),
        }
    }

    async fn prepare(&self, _: &KafkaSettings) -> Result<Vec<String>, SinkError> {
        Ok(prepare())
    }

    async fn probe(&self, config: &KafkaSettings) -> Result<String, SinkError> {
        probe(&config.properties).await
    }

    async fn create<Tag: SinkTag>(&self, config: &KafkaSettings, cx: &SinkContext) -> Created<Tag> {
        Ok(boxed(producer::Publisher::create(&config.properties, budget(cx))?))
    }

    /// A producer whose queued records expire in the time the read-back source names (its
    /// `message.timeout.ms` bounded unless the user set it): what a takeover waits for.
    async fn create_read_back<Tag: SinkTag>(&self, config: &KafkaSettings, cx: &SinkContext) -> Created<Tag> {
        Ok(boxed(producer::Publisher::create(
            &config.exactly_once_properties(),
            budget(cx),
        )?))
    }

    async fn create_transactional<Tag: SinkTag>(
        &self,
        config: &KafkaSettings,
        cx: &SinkContext,
    ) -> Result<Transactional<Tag>, SinkError> {
        transactions::TransactionalPublisher::create(
            &config.exactly_once_properties(),
            budget(cx),
            &config.checkpoint_topic,
            cx.connect_timeout,
        )
        .await
    }
}

/// The caller's budget, which sizes the producer's queue.
fn budget(cx: &SinkContext) -> producer::Budget {
    producer::Budget {
        events: cx.max_in_flight,
        bytes: cx.max_in_flight_bytes,
    }
}

/// Opens [`tail::TailReader`]s with the exactly-once producer's connection settings.
#[derive(Debug)]
struct TailSource(KafkaProperties);

impl ReadBackSource for TailSource {
    fn lane_of(&self, key: &[u8], lanes: i32) -> Option<i32> {
        partitioner::partition_for(key, lanes)
    }

    fn queue_expiry(&self) -> Option<ClientQueueExpiry> {
        let user = self.0.user_message_timeout().map(|(key, _)| key);
        Some(ClientQueueExpiry {
            expiry: self.0.message_timeout(),
            key: user.unwrap_or("message.timeout.ms"),
            unset: user.map(|_| config::EXACTLY_ONCE_MESSAGE_TIMEOUT),
        })
    }

    fn open(&self, timeout: Duration, max_records: usize) -> Result<Box<dyn ReadBackReader>, ReadBackError> {
        tail::TailReader::create(&self.0, timeout, max_records)
            .map(|r| Box::new(r) as Box<dyn ReadBackReader>)
            .map_err(|e| ReadBackError::Broker {
                lane: "(no partition yet)".into(),
                cause: format!("cannot create the Kafka reader: {e}"),
            })
    }
}

/// A topic's lanes are its partitions.
impl ReadBackReader for tail::TailReader {
    fn lanes(&self, topic: &str) -> Result<Option<i32>, ReadBackError> {
        tail::TailReader::partition_count(self, topic)
    }

    fn scan(
        &self,
        topic: &str,
        partition: i32,
        seen: &mut dyn FnMut(&dyn HeaderGet) -> Seen,
    ) -> Result<u64, ReadBackError> {
        tail::TailReader::scan(self, topic, partition, seen)
    }
}

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
pub(super) fn message_max_bytes(kafka: &KafkaProperties) -> usize {
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
