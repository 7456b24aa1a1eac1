//! Kafka's half of `outbox-relay demo`: the run publishes to the embedded Kafka (librdkafka's
//! mock cluster, `mock_cluster.rs`) unless `--bootstrap` gives one, and [`KafkaConsumer`] reads
//! the demo topic, counting distinct events by their `id` header (so duplicates show).
//!
//! With `--bootstrap` the run creates the topic before the relay publishes (and waits for its
//! leaders), so topic creation is no part of any latency figure, and deletes it at the end; a
//! topic that existed before the run is left as it was. The summary says which.
//!
//! The consumer assigns partitions itself instead of joining a consumer group (a group join would
//! add seconds of rebalance delay to a short demo), re-discovering them every second because the
//! topic only appears when the relay first produces to it. Records that predate the demo (a
//! reused broker with `--bootstrap`) are skipped by starting each partition that existed at the
//! start at its high watermark then, and by the payload's `run` id.
//!
//! The consuming thread makes no other broker calls per second (it used to read four partition
//! watermarks every second for the `published` count, and each record that arrived meanwhile
//! waited for them: up to tens of ms at p99). `published` is the relay's own count of
//! acknowledgements instead (`src/demo/stats.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::mock_cluster::EmbeddedKafka;
use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    parse_id, toml_string, Consuming, DemoConfig, DemoRun, DemoTarget, Server, SinkDemo, Starting, Tally,
};

const REFRESH: Duration = Duration::from_secs(1);
const METADATA_TIMEOUT: Duration = Duration::from_secs(2);
/// Creating or deleting the demo topic on a given broker.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct KafkaConsumer {
    consumer: BaseConsumer,
    topic: String,
    /// Per partition: the high watermark when the demo started (0 for partitions created since).
    baseline: BTreeMap<i32, i64>,
}

impl KafkaConsumer {
    /// Connects and records where the topic stands before the demo produces anything.
    pub(crate) fn new(bootstrap: &str, topic: &str, run_id: &str) -> Result<KafkaConsumer, String> {
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
            .map_err(|e| format!("Kafka: cannot create the demo consumer: {e}"))?;
        let mut me = KafkaConsumer {
            consumer,
            topic: topic.to_owned(),
            baseline: BTreeMap::new(),
        };
        for partition in me.partitions() {
            let (_, high) = me
                .consumer
                .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
                .map_err(|e| format!("Kafka: reading the offsets of {topic}: {e}"))?;
            me.baseline.insert(partition, high);
        }
        Ok(me)
    }

    /// Runs on its own thread until `stop`.
    pub(crate) fn spawn(mut self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("demo-consumer".into())
            .spawn(move || self.run(&*tally, &stop))
    }

    fn run(&mut self, tally: &dyn Tally, stop: &AtomicBool) {
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
                self.record(&message, tally);
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

    fn record(&self, message: &rdkafka::message::BorrowedMessage<'_>, tally: &dyn Tally) {
        let id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
            .and_then(parse_id);
        tally.record(id, message.payload());
    }
}

/// Kafka's answers to the demo.
pub(crate) const DEMO: SinkDemo = SinkDemo::new(Server::Embedded("Kafka"), open);

/// Starts the embedded Kafka, with the demo topic created up front, unless `--bootstrap`
/// gave one.
fn open(bootstrap: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    let (embedded, bootstrap) = match bootstrap {
        Some(servers) => (None, servers),
        None => {
            let kafka = EmbeddedKafka::start(run.event_type)?;
            let servers = kafka.bootstrap_servers().to_owned();
            (Some(kafka), servers)
        }
    };
    Ok(Box::new(KafkaTarget {
        embedded,
        bootstrap,
        run_id: run.id.clone(),
    }))
}

/// Where the run publishes: the embedded Kafka (stopped when this is dropped) or a given one.
struct KafkaTarget {
    embedded: Option<EmbeddedKafka>,
    bootstrap: String,
    run_id: String,
}

impl DemoTarget for KafkaTarget {
    fn config(&self) -> DemoConfig {
        DemoConfig {
            keys: format!("\"bootstrap.servers\" = {}\n", toml_string(&self.bootstrap)),
            route: None,
        }
    }

    fn describe(&self, _: &SinkSettings) -> String {
        match self.embedded {
            Some(_) => format!("the embedded Kafka ({})", self.bootstrap),
            None => self.bootstrap.clone(),
        }
    }

    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        Box::pin(async move {
            // The embedded Kafka has the topic already (the mock cluster has no CreateTopics).
            let created = match self.embedded {
                Some(_) => None,
                None => Some(create_topic(&self.bootstrap, topic).await?),
            };
            let (bootstrap, name, run_id) = (self.bootstrap.clone(), topic.to_owned(), self.run_id.clone());
            let consumer = tokio::task::spawn_blocking(move || KafkaConsumer::new(&bootstrap, &name, &run_id))
                .await
                .map_err(|e| format!("Kafka: {e}"))??;
            let thread = consumer
                .spawn(tally, stop)
                .map_err(|e| format!("starting the consumer thread: {e}"))?;
            let (bootstrap, topic) = (self.bootstrap.clone(), topic.to_owned());
            Ok(Consuming::Task(tokio::spawn(async move {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                match created {
                    None => Vec::new(),
                    Some(false) => vec![format!(
                        "Kafka topic {topic} on {bootstrap} left as it was: it existed before the run"
                    )],
                    Some(true) => vec![delete_topic(&bootstrap, &topic).await],
                }
            })))
        })
    }
}

/// On a given broker the run creates its topic before the relay publishes, and waits for its
/// partitions' leaders: the first events then do not wait for the broker to create it (which
/// showed in the first run's p99), and the run knows the topic is its own to delete at the end.
/// `true`: created; `false`: it was there (and is left as it is).
async fn create_topic(bootstrap: &str, topic: &str) -> Result<bool, String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("Kafka: cannot create an admin client for {bootstrap}: {e}"))?;
    // The broker's defaults (num.partitions, default.replication.factor).
    let new = NewTopic::new(topic, -1, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let results = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| format!("Kafka: creating topic {topic} on {bootstrap}: {e}"))?;
    let created = match results.into_iter().next() {
        Some(Ok(_)) => true,
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => false,
        Some(Err((_, code))) => return Err(format!("Kafka: creating topic {topic} on {bootstrap}: {code}")),
    };
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("Kafka: cannot create a client for {bootstrap}: {e}"))?;
    let topic_name = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        while Instant::now() < deadline {
            let led = consumer
                .fetch_metadata(Some(&topic_name), METADATA_TIMEOUT)
                .ok()
                .and_then(|m| {
                    let t = m
                        .topics()
                        .iter()
                        .find(|t| t.name() == topic_name && t.error().is_none())?;
                    Some(!t.partitions().is_empty() && t.partitions().iter().all(|p| p.leader() >= 0))
                })
                .unwrap_or(false);
            if led {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .map_err(|e| format!("Kafka: {e}"))?;
    Ok(created)
}

/// Deletes the topic the run created; the summary's cleanup line.
async fn delete_topic(bootstrap: &str, topic: &str) -> String {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create();
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let outcome = match admin {
        Ok(admin) => match admin.delete_topics(&[topic], &options).await {
            Ok(results) => match results.into_iter().next() {
                Some(Err((_, code))) => Err(code.to_string()),
                _ => Ok(()),
            },
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    match outcome {
        Ok(()) => format!("Kafka topic {topic} on {bootstrap} deleted (the run created it)"),
        Err(e) => format!("FAILED: deleting Kafka topic {topic} on {bootstrap} (the run created it): {e}"),
    }
}
