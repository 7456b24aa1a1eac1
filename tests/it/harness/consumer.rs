//! Reading back what was published (and writing single records for harness tests).
//!
//! The consumer assigns partitions itself (no consumer-group join): the mock cluster
//! delays every group join by 3 s, and a test's reader must not depend on group rebalances.
//! Topics and partitions are re-discovered every [`REFRESH`], so topics created while
//! collecting are picked up. Records are de-duplicated by (topic, partition, offset) only,
//! which drops client-side re-deliveries but never hides a duplicate the relay produced
//! (those have distinct offsets).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use regex::Regex;

use super::util::unique_name;

/// Grace period after the expected count was reached, to catch duplicates.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(1500);
/// How often topics/partitions are re-discovered.
pub const REFRESH: Duration = Duration::from_millis(500);

/// One consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
}

impl Received {
    pub fn key_str(&self) -> Option<&str> {
        self.key.as_deref().and_then(|k| std::str::from_utf8(k).ok())
    }

    pub fn payload_str(&self) -> Option<&str> {
        self.payload.as_deref().and_then(|p| std::str::from_utf8(p).ok())
    }

    /// Value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }
}

/// Which topics to read.
#[derive(Debug, Clone)]
pub enum Topics {
    List(Vec<String>),
    /// Every topic whose name matches, except internal ones (`__consumer_offsets`, …).
    Regex(String),
}

impl Topics {
    pub fn all() -> Topics {
        Topics::Regex("^.*$".into())
    }
}

/// Reads `topics` from the beginning until `expected_count` records arrived (then
/// [`DEFAULT_GRACE`] more) or `timeout` passed.
pub async fn collect(bootstrap: &str, topics: &[&str], expected_count: usize, timeout: Duration) -> Vec<Received> {
    let list = Topics::List(topics.iter().map(|t| t.to_string()).collect());
    collect_with(bootstrap, &list, expected_count, timeout, DEFAULT_GRACE).await
}

/// Like [`collect`] over every non-internal topic whose name matches `regex`.
pub async fn collect_matching(bootstrap: &str, regex: &str, expected_count: usize, timeout: Duration) -> Vec<Received> {
    let sel = Topics::Regex(regex.to_string());
    collect_with(bootstrap, &sel, expected_count, timeout, DEFAULT_GRACE).await
}

/// The general form: records in arrival order (per partition: offset order).
pub async fn collect_with(
    bootstrap: &str,
    topics: &Topics,
    expected_count: usize,
    timeout: Duration,
    grace: Duration,
) -> Vec<Received> {
    collect_isolated(bootstrap, topics, expected_count, timeout, grace, "read_committed").await
}

/// [`collect_with`] at `isolation` (`isolation.level`: `read_committed`, librdkafka's default,
/// or `read_uncommitted`, which also returns records of aborted transactions).
pub async fn collect_isolated(
    bootstrap: &str,
    topics: &Topics,
    expected_count: usize,
    timeout: Duration,
    grace: Duration,
    isolation: &str,
) -> Vec<Received> {
    let consumer: Arc<StreamConsumer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", isolation)
            .set("group.id", unique_name("collect"))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("allow.auto.create.topics", "false")
            .set("fetch.wait.max.ms", "100")
            .create()
            .expect("create collect consumer"),
    );
    let filter = match topics {
        Topics::Regex(r) => Some(Regex::new(r).expect("topic regex")),
        Topics::List(_) => None,
    };

    let mut deadline = Instant::now() + timeout;
    let mut reached = false;
    let mut assigned: BTreeSet<(String, i32)> = BTreeSet::new();
    // Next offset to read per partition, so re-assigning keeps positions.
    let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut seen: HashSet<(String, i32, i64)> = HashSet::new();
    let mut out = Vec::new();
    let mut next_refresh = Instant::now();

    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if now >= next_refresh {
            next_refresh = now + REFRESH;
            let found = discover(&consumer, topics, filter.as_ref()).await;
            if found.iter().any(|tp| !assigned.contains(tp)) {
                assigned.extend(found);
                let mut tpl = TopicPartitionList::new();
                for (t, p) in &assigned {
                    let off = match next.get(&(t.clone(), *p)) {
                        Some(o) => Offset::Offset(*o),
                        None => Offset::Beginning,
                    };
                    tpl.add_partition_offset(t, *p, off).expect("tpl offset");
                }
                consumer.assign(&tpl).expect("assign partitions");
            }
        }
        let wait = next_refresh.min(deadline).saturating_duration_since(Instant::now());
        let msg = match tokio::time::timeout(wait, consumer.recv()).await {
            Err(_) => continue,
            Ok(Err(e)) => {
                // Transport errors while brokers are down are expected in some tests.
                eprintln!("collect: consumer error (retrying): {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Ok(m)) => m,
        };
        let id = (msg.topic().to_string(), msg.partition(), msg.offset());
        next.insert((id.0.clone(), id.1), id.2 + 1);
        if !seen.insert(id) {
            continue;
        }
        let headers = msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|Header { key, value }| (key.to_string(), value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Received {
            topic: msg.topic().to_string(),
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            payload: msg.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: msg.timestamp().to_millis(),
        });
        if !reached && out.len() >= expected_count {
            reached = true;
            deadline = deadline.min(Instant::now() + grace);
        }
    }
    out
}

/// Current (topic, partition) pairs selected by `topics`. Metadata calls block, so they
/// run on the blocking pool.
async fn discover(consumer: &Arc<StreamConsumer>, topics: &Topics, filter: Option<&Regex>) -> Vec<(String, i32)> {
    let consumer = Arc::clone(consumer);
    let topics = topics.clone();
    let filter = filter.cloned();
    tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        let mut add = |md: rdkafka::metadata::Metadata| {
            for t in md.topics() {
                let name = t.name();
                if name.starts_with("__") || t.error().is_some() {
                    continue;
                }
                if filter.as_ref().is_some_and(|re| !re.is_match(name)) {
                    continue;
                }
                for p in t.partitions() {
                    found.push((name.to_string(), p.id()));
                }
            }
        };
        match &topics {
            Topics::List(list) => {
                for t in list {
                    if let Ok(md) = consumer.fetch_metadata(Some(t), Duration::from_secs(2)) {
                        add(md);
                    }
                }
            }
            Topics::Regex(_) => {
                if let Ok(md) = consumer.fetch_metadata(None, Duration::from_secs(2)) {
                    add(md);
                }
            }
        }
        found
    })
    .await
    .unwrap_or_default()
}

/// Produces one record and waits for the ack; returns (partition, offset).
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(&str, &[u8])],
) -> (i32, i64) {
    try_produce(bootstrap, topic, key, payload, headers)
        .await
        .unwrap_or_else(|e| panic!("produce to {topic}: {e}"))
}

/// [`produce`], the broker's refusal returned.
pub async fn try_produce(
    bootstrap: &str,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(&str, &[u8])],
) -> Result<(i32, i64), String> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.timeout.ms", "15000")
        .create()
        .expect("create producer");
    let mut hs = OwnedHeaders::new();
    for (k, v) in headers {
        hs = hs.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    let mut rec = FutureRecord::<[u8], [u8]>::to(topic).payload(payload).headers(hs);
    if let Some(k) = key {
        rec = rec.key(k);
    }
    let delivery = producer
        .send(rec, Duration::from_secs(15))
        .await
        .map_err(|(e, _)| format!("{e} ({e:?})"))?;
    Ok((delivery.partition, delivery.offset))
}
