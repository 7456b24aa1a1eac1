//! The demo's consumer: reads the demo topic, counts distinct events by their `id` header (so
//! duplicates show), and measures order-placed-to-consumed latency from the payload's
//! `placed_at_us`.
//!
//! It assigns partitions itself instead of joining a consumer group (a group join would add
//! seconds of rebalance delay to a short demo), re-discovering them every second because the
//! topic only appears when the relay first produces to it. Records that predate the demo (a
//! reused broker with `--bootstrap`) are skipped by starting each partition that existed at the
//! start at its high watermark then, and by the payload's `run` id.
//!
//! The consuming thread makes no other broker calls per second (it used to read four partition
//! watermarks every second for the `published` count, and each record that arrived meanwhile
//! waited for them: up to tens of ms at p99). `published` is the relay's own count of
//! acknowledgements instead (`stats.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::stats::Stats;
use super::DemoError;

const REFRESH: Duration = Duration::from_secs(1);
/// How long a demo consumer waits for one call to its broker.
pub(crate) const BROKER_TIMEOUT: Duration = Duration::from_secs(5);

/// `f`, bounded by [`BROKER_TIMEOUT`], its error naming the broker and what was being done.
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    broker: &str,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DemoError> {
    match tokio::time::timeout(BROKER_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| DemoError::Sink(format!("{broker}, {what}: {e}"))),
        Err(_) => Err(DemoError::Sink(format!(
            "{broker}, {what}: no answer within {BROKER_TIMEOUT:?}"
        ))),
    }
}
const METADATA_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) struct DemoConsumer {
    consumer: BaseConsumer,
    topic: String,
    run_id: String,
    /// Per partition: the high watermark when the demo started (0 for partitions created since).
    baseline: BTreeMap<i32, i64>,
}

impl DemoConsumer {
    /// Connects and records where the topic stands before the demo produces anything.
    pub(crate) fn new(bootstrap: &str, topic: &str, run_id: &str) -> Result<DemoConsumer, DemoError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("outbox-relay-demo-{run_id}"))
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "false")
            // A fetch that finds nothing waits this long on the broker before it returns; a
            // record produced meanwhile waits for the next fetch. The benchmark's consumer uses
            // the same, so the demo's end-to-end figure is comparable with its commit->consumer.
            .set("fetch.wait.max.ms", "5")
            .set("fetch.min.bytes", "1")
            .set("fetch.error.backoff.ms", "10")
            .create()
            .map_err(|e| DemoError::Kafka(format!("cannot create the demo consumer: {e}")))?;
        let mut me = DemoConsumer {
            consumer,
            topic: topic.to_owned(),
            run_id: run_id.to_owned(),
            baseline: BTreeMap::new(),
        };
        for partition in me.partitions() {
            let (_, high) = me
                .consumer
                .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
                .map_err(|e| DemoError::Kafka(format!("reading the offsets of {topic}: {e}")))?;
            me.baseline.insert(partition, high);
        }
        Ok(me)
    }

    /// Runs on its own thread until `stop`.
    pub(crate) fn spawn(mut self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("demo-consumer".into())
            .spawn(move || self.run(&stats, &stop))
    }

    fn run(&mut self, stats: &Stats, stop: &AtomicBool) {
        let mut assigned: Vec<i32> = Vec::new();
        let mut next_refresh = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next_refresh {
                // Look often until the topic appears: the first events wait for it.
                next_refresh = Instant::now() + if assigned.is_empty() { REFRESH / 10 } else { REFRESH };
                let partitions = self.partitions();
                if partitions.len() > assigned.len() {
                    self.assign(&partitions, &assigned);
                    assigned = partitions;
                }
            }
            // Errors are transient broker trouble that librdkafka retries by itself.
            if let Some(Ok(message)) = self.consumer.poll(Duration::from_millis(100)) {
                self.record(&message, stats);
            }
        }
    }

    fn partitions(&self) -> Vec<i32> {
        match self.consumer.fetch_metadata(Some(&self.topic), METADATA_TIMEOUT) {
            Ok(md) => md
                .topics()
                .iter()
                .filter(|t| t.name() == self.topic && t.error().is_none())
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Adds the newly found partitions, keeping the positions of those already read.
    fn assign(&self, partitions: &[i32], already: &[i32]) {
        let mut tpl = TopicPartitionList::new();
        let positions = self.consumer.position().unwrap_or_default();
        for &p in partitions {
            let offset = if already.contains(&p) {
                positions
                    .find_partition(&self.topic, p)
                    .map_or(Offset::Stored, |e| e.offset())
            } else {
                Offset::Offset(self.baseline.get(&p).copied().unwrap_or(0))
            };
            let offset = if matches!(offset, Offset::Invalid) {
                Offset::Offset(self.baseline.get(&p).copied().unwrap_or(0))
            } else {
                offset
            };
            let _ = tpl.add_partition_offset(&self.topic, p, offset);
        }
        let _ = self.consumer.assign(&tpl);
    }

    fn record(&self, message: &rdkafka::message::BorrowedMessage<'_>, stats: &Stats) {
        let id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
            .and_then(parse_id);
        record_event(stats, &self.run_id, id, message.payload());
    }
}

/// One message read by any of the demo's consumers: counted when it carries an event id and a
/// payload of this run (`run`), with its latency from the payload's `placed_at_us`. Returns
/// whether it was counted.
pub(crate) fn record_event(stats: &Stats, run_id: &str, id: Option<i64>, payload: Option<&[u8]>) -> bool {
    let payload: Option<serde_json::Value> = payload.and_then(|p| serde_json::from_slice(p).ok());
    let (Some(id), Some(payload)) = (id, payload) else {
        return false;
    };
    if payload.get("run").and_then(|r| r.as_str()) != Some(run_id) {
        return false;
    }
    let placed_at_us = payload
        .get("placed_at_us")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    stats.consumed(id, Duration::from_micros((now_us - placed_at_us).max(0) as u64));
    true
}

/// The event id as the brokers carry it: decimal text.
pub(crate) fn parse_id(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}
