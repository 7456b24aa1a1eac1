//! Kafka for the conformance suite: a topic namespace ([`KafkaNs`]) on the shared real broker
//! (`kafka_real.rs`), or on a broker of the test's own that it freezes (SIGSTOP: its connections
//! stay open and silent, as a hung broker's; a killed one is `failures.rs`'s
//! `all_brokers_down_for_30_seconds`). Topics are made up front with 3 partitions (every
//! partition's log exists before a relay publishes: docs/reliability.md, defect 5) and read back
//! from the beginning, every partition to its end, so a read-back sees duplicates too.
//!
//! Exactly-once here is the read-back: a restarted session reads the topics' tails for its
//! source positions and skips what the broker holds. (On tansu the kill scenario caught a
//! read-back that trusted the high watermark: tansu reports one below its end and answers a
//! fetch inside a batch from the next batch. `kafka::tail` reads each window to the end of the
//! partition.)

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use super::{BadKind, BadRow, Capabilities, ExactlyOnce, Policy, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::kafka_real::{shared_kafka, ClusterSpec, KafkaCluster, KafkaNs};

/// The producer's `message.max.bytes` in the bad-event scenarios.
const MAX_MESSAGE: usize = 100_000;
/// Topic `good`'s `max.message.bytes` there: below the producer's, so only the broker refuses
/// a record between the two.
const TOPIC_LIMIT: usize = 20_000;

pub struct Kafka {
    ns: KafkaNs,
    own: Option<KafkaCluster>,
    made: Mutex<HashSet<String>>,
}

impl SinkHarness for Kafka {
    const NAME: &'static str = "Kafka";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: Some(ExactlyOnce {
                how: "read-back of the topics' tails",
                kills: 5,
                long_kills: 50,
                per_kill: 200,
            }),
            timestamps: true,
            workload: (2_000, 40),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(_test: &str, server: Server) -> Option<Kafka> {
        let (ns, own) = match server {
            Server::Shared => (shared_kafka().await?, None),
            Server::Own => {
                let cluster = KafkaCluster::start(ClusterSpec::single()).await?;
                (cluster.own_ns(), Some(cluster))
            }
        };
        Some(Kafka {
            ns,
            own,
            made: Mutex::new(HashSet::new()),
        })
    }

    async fn create(&self, names: &[&str]) {
        for name in names {
            if self.made.lock().unwrap().insert(name.to_string()) {
                self.ns.create_topic(name, 3).await;
            }
        }
    }

    fn destination(&self, name: &str) -> String {
        self.ns.topic(name)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        config.on_kafka(&self.ns).route(regex, name)
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        // `collect` stops at a count of records, duplicates included: until `want` distinct
        // arrived, ask again for the records read so far plus the events still missing.
        let deadline = std::time::Instant::now() + timeout;
        let mut ask = want;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut records = self.ns.collect(names, ask, left.max(Duration::from_secs(2))).await;
            for r in &mut records {
                r.topic = self.ns.topic(&r.topic);
            }
            let have = super::distinct(&records);
            if have >= want || std::time::Instant::now() >= deadline {
                return records;
            }
            ask = records.len() + (want - have);
        }
    }

    /// SIGSTOP: a hung broker (connections open, nothing answered).
    async fn take_down(&mut self) {
        let cluster = self.own.as_ref().expect("a broker of the test's own (Server::Own)");
        assert!(cluster.pause(1), "SIGSTOP the broker");
    }

    async fn bring_back(&mut self) {
        let cluster = self.own.as_ref().expect("a broker of the test's own (Server::Own)");
        assert!(cluster.resume(1), "SIGCONT the broker");
    }

    /// Deliveries time out in 5 s instead of 300: sessions fail and replay during the outage
    /// (the restart path).
    fn short_timeouts(&self, config: RelayConfig) -> RelayConfig {
        config.kafka("message.timeout.ms", "5000")
    }

    /// With the shipped 300 s message timeout the records wait in librdkafka: the relay's outage
    /// summary. With 5 s they expire: failed deliveries, sessions replaying (in exactly-once
    /// mode each new session's read-back fails too until the broker answers, so no events wait
    /// long enough for the summary).
    fn check_outage_log(&self, log: &str, variant: Variant) {
        if variant == Variant::ShippedDefaults {
            assert!(
                log.contains("has acknowledged nothing for") && log.contains("acknowledges again"),
                "Kafka: the outage should show in the log:\n{log}"
            );
        } else {
            assert!(
                log.contains("Kafka delivery failed"),
                "Kafka: the outage should have failed deliveries (5 s message timeout):\n{log}"
            );
        }
    }

    fn exactly_once_refusal(&self, _config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        None
    }

    /// Every refusal comes before the record leaves: nothing after it is published under
    /// `fail`. The topic's own limit too — the relay reads the topic's `max.message.bytes` and
    /// refuses a record over it before it is sent (`sink/kafka/topic_limit.rs`); sent, the broker's
    /// refusal of its batch came back after the partition's next batch was stored, and the
    /// replay put the batch's good events behind it (docs/reliability.md, section 3).
    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new(
                "too large for the producer",
                BadRow::Payload(MAX_MESSAGE + 50_000),
                "Kafka refused the record",
            )
            .nothing_after(),
            BadKind::new(
                "a topic name Kafka refuses",
                BadRow::Route("bad topic!".into()),
                "contains ' '",
            )
            .nothing_after(),
            BadKind::new(
                "too large for the topic",
                BadRow::Payload(TOPIC_LIMIT + 5_000),
                "too large for topic",
            )
            .nothing_after(),
        ]
    }

    /// `message.max.bytes` lowered to 100,000 and topic `good` made with `max.message.bytes` =
    /// 20,000 (real clusters set it per topic, below the client's): one record the producer
    /// refuses, one only the topic's limit does (which the relay reads and applies itself).
    async fn prepare_bad(&self, _client: &tokio_postgres::Client, config: RelayConfig, _policy: Policy) -> RelayConfig {
        let cluster = match &self.own {
            Some(c) => c,
            None => crate::harness::kafka_real::shared_cluster()
                .await
                .expect("shared Kafka"),
        };
        let limit = TOPIC_LIMIT.to_string();
        cluster
            .create_topic_with(&self.ns.topic("good"), 1, &[("max.message.bytes", &limit)])
            .await;
        self.made.lock().unwrap().insert("good".into());
        config.kafka("message.max.bytes", &MAX_MESSAGE.to_string())
    }

    fn check_dead_letter(&self, letter: &Received, kind: &BadKind) {
        if kind.row == BadRow::Payload(MAX_MESSAGE + 50_000) {
            assert!(
                letter.header("outbox-relay-truncated-from").is_some()
                    && letter.payload.as_ref().is_some_and(|p| p.len() < MAX_MESSAGE),
                "the oversized raw row cut to fit: {:?}",
                letter.headers
            );
        }
    }
}
