//! Reading back the tail of one partition: the positions a given writer put there since a floor.
//!
//! Used once per partition and streaming session by the relay's exactly-once resume
//! (`relay::resume`). The reader is an rdkafka `BaseConsumer` that never joins a group and never
//! commits: it is assigned one partition at a time, reads from a little below the high
//! watermark to the end of the partition, and starts again further back (×4 each time, each
//! lower window stopping where the one above began returning records), collecting the caller's
//! positions at or above the floor, until a window holds one of the caller's records below the
//! floor, reaches the partition's start, or would reach further back than `max_records`.
//!
//! Before it reads a topic, it waits for what an earlier producer of this process may still
//! deliver: bytes this host's kernel holds (`unsettled.rs`), and requests a peer holds, fenced
//! by the topic's timestamp bound (`late.rs`).
//!
//! Invariant: every call blocks (metadata, watermarks, fetches), bounded by the reader's
//! timeout; callers run it on a thread of its own, never on an async runtime's workers. This
//! adapter knows nothing of what a position is: the caller's `own` closure reads the headers.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::logs::QuietContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedHeaders, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use tracing::{info, warn};

use super::config::KafkaProperties;
use super::late::{self, Bound};
use super::topic_config::describe_topic;
use crate::sink::{HeaderGet, ReadBackError, Seen};

/// The first window read below the high watermark; a single writer's newest record is almost
/// always in it.
const FIRST_WINDOW: i64 = 8;

/// Producer-only properties, left out of the reader's configuration (librdkafka would warn
/// about each).
pub(crate) const PRODUCER_ONLY: &[&str] = &[
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "partitioner",
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "compression.level",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "request.timeout.ms",
    "retries",
    "message.send.max.retries",
    "sticky.partitioning.linger.ms",
    "transactional.id",
    "transaction.timeout.ms",
    "delivery.report.only.error",
    "dr_cb",
    "dr_msg_cb",
];

/// A record's headers, for the caller's `own` test.
pub(crate) struct HeaderLookup<'m>(Option<&'m BorrowedHeaders>);

impl HeaderGet for HeaderLookup<'_> {
    /// The value of the first header called `name` (`None`: absent or null).
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0?.iter().find(|h| h.key == name).and_then(|h| h.value)
    }
}

/// A partition, in a read-back error's words.
fn lane(topic: &str, partition: i32) -> String {
    format!("{topic} partition {partition}")
}

/// librdkafka's error, said in the sink-neutral error.
fn broker(topic: &str, partition: i32) -> impl Fn(KafkaError) -> ReadBackError + Copy + '_ {
    move |source| ReadBackError::Broker {
        lane: lane(topic, partition),
        cause: source.to_string(),
    }
}

/// The longest [`TailReader::scan`] waits for an earlier producer's requests to arrive or be
/// dropped before it errs (the session then starts again and waits anew). Past a silent cut
/// the kernel's retransmission timer backs off to tens of seconds, so data written into the cut
/// can arrive that long after the heal.
const SETTLE_MAX: Duration = Duration::from_secs(120);

/// A consumer that reads partitions' tails for [`TailReader::scan`]; one per streaming
/// session, reused for every partition it checks.
pub(crate) struct TailReader {
    consumer: BaseConsumer<QuietContext>,
    timeout: Duration,
    max_records: u64,
    /// What an earlier producer of this process may still deliver (`unsettled.rs`): waited
    /// for before the first partition is read.
    unsettled: std::sync::Mutex<super::unsettled::Unsettled>,
    /// The cluster's key for `late.rs`.
    cluster: String,
    /// The producer's `message.timeout.ms`: the shortest timestamp bound that never refuses a
    /// record of a running session depends on it.
    message_timeout: Duration,
    /// Topics whose late writes were fenced (or found unfenceable) by this reader.
    fenced: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl TailReader {
    /// A reader connecting like the producer (same servers, security settings); `timeout`
    /// bounds each metadata request and each window's reading, `max_records` the records read
    /// per partition.
    pub(crate) fn create(props: &KafkaProperties, timeout: Duration, max_records: usize) -> Result<Self, KafkaError> {
        let mut config = ClientConfig::new();
        for (k, v) in &props.0 {
            if !PRODUCER_ONLY.contains(&k.as_str()) {
                config.set(k, v);
            }
        }
        config
            // Never used to join a group or commit: partitions are assigned, not subscribed.
            .set("group.id", "outbox-relay-read-back")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("allow.auto.create.topics", "false")
            .set("auto.offset.reset", "earliest")
            // Only the top window ends at the end of the partition, and it learns that from a
            // fetch that comes back empty after this wait: keep it short (a once-per-restart
            // read, not a steady consumer).
            .set("fetch.wait.max.ms", "10")
            .set("isolation.level", "read_uncommitted");
        let consumer: BaseConsumer<QuietContext> = config.create_with_context(QuietContext::default())?;
        Ok(TailReader {
            consumer,
            timeout,
            max_records: max_records as u64,
            unsettled: std::sync::Mutex::new(super::unsettled::Unsettled::snapshot()),
            cluster: late::cluster_of(props),
            message_timeout: props.message_timeout(),
            fenced: Default::default(),
        })
    }

    /// Waits until the topic's timestamp bound refuses every record an earlier producer of
    /// this process handed over without learning it stored (`late.rs`); once per topic. A
    /// topic without a bound is read at once, with a warning naming the bound to set.
    fn fence_late_writes(&self, topic: &str, partition: i32) -> Result<(), ReadBackError> {
        let Some(newest) = late::unsettled_since(&self.cluster) else {
            return Ok(());
        };
        let mut fenced = self.fenced.lock().unwrap_or_else(|e| e.into_inner());
        if fenced.contains(topic) {
            return Ok(());
        }
        let bound = self.topic_bound(topic).unwrap_or_else(|cause| {
            warn!(
                topic,
                cause,
                "exactly-once: cannot read the topic's configuration (DescribeConfigs), so its timestamp bound \
                 is unknown; grant the relay's principal DESCRIBE_CONFIGS on the topic"
            );
            Bound::Unbounded
        });
        match bound {
            Bound::Unbounded => warn!(
                topic,
                "exactly-once by read-back: an earlier session ended with records it does not know stored, and \
                 the topic has no timestamp bound, so a produce request a stalled broker or a middlebox still \
                 holds can land after this read-back and publish its events twice. Set one of about \
                 message.timeout.ms + 5 s (kafka-configs.sh --alter --entity-type topics --entity-name <topic> \
                 --add-config message.timestamp.before.max.ms=15000), or use [kafka] exactly_once = \
                 \"transactions\" (docs/reliability.md, section 10, defect 6)"
            ),
            Bound::Refuses(bound) => {
                let safe = late::shortest_safe_bound(self.message_timeout);
                if bound < safe {
                    warn!(
                        topic,
                        bound_ms = bound.as_millis() as u64,
                        shortest_ms = safe.as_millis() as u64,
                        "the topic's message.timestamp.before.max.ms is shorter than message.timeout.ms + 2 s: \
                         the broker can refuse a running session's records as too old, and each refusal restarts the \
                         session. Raise it"
                    );
                }
                let wait_ms = late::deadline(newest, bound).saturating_sub(late::now_ms());
                if wait_ms > 0 {
                    let wait = Duration::from_millis(wait_ms as u64);
                    if wait > SETTLE_MAX {
                        return Err(ReadBackError::Broker {
                            lane: lane(topic, partition),
                            cause: format!(
                                "an earlier session's records may still land for {} s more (the topic's \
                                 message.timestamp.before.max.ms is {} ms); the session starts again and waits \
                                 anew. A bound of about message.timeout.ms + 5 s keeps this wait short",
                                wait.as_secs(),
                                bound.as_millis()
                            ),
                        });
                    }
                    info!(
                        topic,
                        wait_ms,
                        bound_ms = bound.as_millis() as u64,
                        "exactly-once: waiting until the topic's timestamp bound refuses what an earlier session may \
                         still have on its way; then reading back"
                    );
                    std::thread::sleep(wait);
                }
            }
        }
        fenced.insert(topic.to_owned());
        Ok(())
    }

    /// The topic's timestamp bound, from its configuration (one DescribeConfigs request, on
    /// the reader's own connections: `topic_config.rs`).
    fn topic_bound(&self, topic: &str) -> Result<Bound, String> {
        let config = describe_topic(self.consumer.client(), topic, self.timeout)?;
        Ok(Bound::of(|k| config.get(k).map(String::as_str)))
    }

    /// Waits until nothing an earlier producer of this process wrote to the cluster's brokers
    /// can still arrive there (`unsettled.rs`), at most [`SETTLE_MAX`].
    fn settle(&self, topic: &str, partition: i32) -> Result<(), ReadBackError> {
        let mut unsettled = self.unsettled.lock().unwrap_or_else(|e| e.into_inner());
        if unsettled.is_empty() {
            return Ok(());
        }
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(broker(topic, partition))?;
        let brokers: Vec<std::net::SocketAddr> = metadata
            .brokers()
            .iter()
            .filter_map(|b| std::net::ToSocketAddrs::to_socket_addrs(&(b.host(), b.port() as u16)).ok())
            .flatten()
            .collect();
        match unsettled.settle(&brokers, SETTLE_MAX) {
            Ok(super::unsettled::Settled::Nothing) => Ok(()),
            Ok(super::unsettled::Settled::After { connections, waited }) => {
                tracing::info!(
                    connections,
                    waited_ms = waited.as_millis() as u64,
                    "exactly-once: what an earlier session had on its way to the brokers arrived or was dropped; reading back"
                );
                Ok(())
            }
            Err(still) => Err(ReadBackError::Broker {
                lane: lane(topic, partition),
                cause: still.to_string(),
            }),
        }
    }

    /// The topic's partition count; `None` when the topic does not exist.
    pub(crate) fn partition_count(&self, topic: &str) -> Result<Option<i32>, ReadBackError> {
        let err = broker(topic, -1);
        let metadata = self.consumer.fetch_metadata(Some(topic), self.timeout).map_err(err)?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        if !t.partitions().is_empty() {
            return Ok(Some(t.partitions().len() as i32));
        }
        match t.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) | Some(RDKafkaErrorCode::UnknownTopic) | None => Ok(None),
            Some(code) => Err(err(KafkaError::MetadataFetch(code))),
        }
    }

    /// Reads `topic`/`partition` backwards from its end, window by window, collecting the
    /// positions `own` recognises at or above `floor`, until a window holds one of the caller's
    /// records below `floor` (everything after it was read) or the partition's start; errs when
    /// a window would reach further back than `max_records` below the end.
    ///
    /// Every window is read *forward to the end of the partition* (the fetch's end-of-partition),
    /// not to the high watermark `ListOffsets` gave: some brokers report less there than they
    /// hold (tansu 0.6 answers the newest batch's base offset + 1) and answer a fetch inside a
    /// batch from the next batch on, so a window cut at either would miss records it should see
    /// — and each record missed is a duplicate. The watermark only places the windows' starts.
    /// A lower window stops at the first offset the window above returned: everything from
    /// there to the end was read already (one forward read has no holes), so the union of the
    /// windows is what reading each to the end would give, without reading the tail again and
    /// without waiting for another end-of-partition.
    pub(crate) fn scan(
        &self,
        topic: &str,
        partition: i32,
        seen: &mut dyn FnMut(&dyn HeaderGet) -> Seen,
    ) -> Result<u64, ReadBackError> {
        let err = broker(topic, partition);
        self.settle(topic, partition)?;
        self.fence_late_writes(topic, partition)?;
        let (low, high) = self
            .consumer
            .fetch_watermarks(topic, partition, self.timeout)
            .map_err(err)?;
        let max = self.max_records.max(1) as i64;
        let mut span = FIRST_WINDOW.min(max);
        let mut read = 0u64;
        // The lowest offset read so far: where the window below stops.
        let mut read_from: Option<i64> = None;
        if high <= low {
            return Ok(read);
        }
        loop {
            let start = (high - span).max(low);
            let window = self.read_window(topic, partition, start, read_from, seen)?;
            read += window.records;
            read_from = window.first_offset.or(read_from);
            if window.reached_floor || start == low {
                return Ok(read);
            }
            if span >= max {
                return Err(ReadBackError::BoundHit {
                    lane: lane(topic, partition),
                    read,
                    from: start,
                    high,
                    max: self.max_records,
                });
            }
            span = (span * 4).min(max);
        }
    }

    /// Reads from offset `start` up to offset `stop` (exclusive), or to the end of the partition
    /// without one, showing each record to `seen`.
    fn read_window(
        &self,
        topic: &str,
        partition: i32,
        start: i64,
        stop: Option<i64>,
        seen: &mut dyn FnMut(&dyn HeaderGet) -> Seen,
    ) -> Result<Window, ReadBackError> {
        let err = broker(topic, partition);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(err)?;
        self.consumer.assign(&tpl).map_err(err)?;
        let deadline = Instant::now() + self.timeout;
        let mut window = Window {
            reached_floor: false,
            records: 0,
            first_offset: None,
        };
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(ReadBackError::Timeout {
                    lane: lane(topic, partition),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            match self.consumer.poll(left.min(Duration::from_millis(100))) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => break Ok(()),
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => break Err(err(e)),
                Some(Ok(msg)) => {
                    if msg.topic() != topic || msg.partition() != partition || msg.offset() < start {
                        continue;
                    }
                    if stop.is_some_and(|stop| msg.offset() >= stop) {
                        break Ok(());
                    }
                    window.records += 1;
                    window.first_offset.get_or_insert(msg.offset());
                    if seen(&HeaderLookup(msg.headers())) == Seen::Below {
                        window.reached_floor = true;
                    }
                }
            }
        };
        let _ = self.consumer.unassign();
        outcome.map(|()| window)
    }
}

/// What one window's read found.
struct Window {
    /// One of the caller's records below the floor was among its records.
    reached_floor: bool,
    records: u64,
    /// The first (lowest) offset it returned.
    first_offset: Option<i64>,
}

#[cfg(test)]
mod tests {
    //! The window walk against librdkafka's mock cluster: what is found, what is read (each
    //! record once), and the bound.

    use std::collections::BTreeMap;

    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

    use super::*;
    use std::collections::BTreeSet;

    const TOPIC: &str = "tail";

    impl TailReader {
        /// The positions `own` finds at or above `floor` (as the relay's read-back does).
        fn own_since<P: Ord>(
            self: &std::sync::Arc<Self>,
            topic: &str,
            partition: i32,
            floor: &P,
            own: impl Fn(&dyn HeaderGet) -> Option<P>,
        ) -> Result<crate::sink::Tail<P>, ReadBackError> {
            crate::sink::tail_since(&**self, topic, partition, floor, own)
        }
    }

    /// A one-partition topic holding `count` records: every third foreign (no header), the
    /// others ours with position = offset.
    fn cluster_with(count: i64) -> (MockCluster<'static, DefaultProducerContext>, KafkaProperties) {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic(TOPIC, 1, 1).expect("topic");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "5")
            .create()
            .expect("producer");
        for offset in 0..count {
            let value = offset.to_string();
            let mut record = BaseRecord::<(), str>::to(TOPIC).partition(0).payload(&value);
            if offset % 3 != 0 {
                record = record.headers(OwnedHeaders::new().insert(Header {
                    key: "pos",
                    value: Some(&value),
                }));
            }
            producer.send(record).expect("queued");
        }
        producer.flush(Duration::from_secs(10)).expect("flushed");
        let props = KafkaProperties(BTreeMap::from([(
            "bootstrap.servers".to_owned(),
            cluster.bootstrap_servers(),
        )]));
        (cluster, props)
    }

    fn own(h: &dyn HeaderGet) -> Option<i64> {
        std::str::from_utf8(h.get("pos")?).ok()?.parse().ok()
    }

    fn ours_from(floor: i64, count: i64) -> BTreeSet<i64> {
        (floor..count).filter(|o| o % 3 != 0).collect()
    }

    #[test]
    fn windows_find_every_own_position_down_to_the_floor_reading_each_record_once() {
        let (_cluster, props) = cluster_with(1_000);
        let reader = std::sync::Arc::new(TailReader::create(&props, Duration::from_secs(10), 100_000).expect("reader"));
        // Windows from 992, 968, 872: the third holds own records below 900.
        let tail = reader.own_since(TOPIC, 0, &900, own).expect("read back");
        assert_eq!(tail.positions, ours_from(900, 1_000));
        assert_eq!(tail.records_read, 128, "each record of the three windows read once");
    }

    #[test]
    fn a_floor_below_everything_reads_to_the_partition_start() {
        let (_cluster, props) = cluster_with(300);
        let reader = std::sync::Arc::new(TailReader::create(&props, Duration::from_secs(10), 100_000).expect("reader"));
        let tail = reader.own_since(TOPIC, 0, &-1, own).expect("read back");
        assert_eq!(tail.positions, ours_from(0, 300));
        assert_eq!(tail.records_read, 300);
    }

    #[test]
    fn the_bound_stops_with_an_error_naming_the_setting() {
        let (_cluster, props) = cluster_with(300);
        let reader = std::sync::Arc::new(TailReader::create(&props, Duration::from_secs(10), 50).expect("reader"));
        let err = reader.own_since(TOPIC, 0, &-1, own).expect_err("bound hit");
        assert!(
            matches!(
                err,
                ReadBackError::BoundHit {
                    read: 50,
                    from: 250,
                    high: 300,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.is_transient());
        assert!(err.to_string().contains("relay.read_back_max_records"), "{err}");
    }

    #[test]
    fn an_empty_partition_has_no_tail() {
        let (_cluster, props) = cluster_with(0);
        let reader = std::sync::Arc::new(TailReader::create(&props, Duration::from_secs(10), 100).expect("reader"));
        let tail = reader.own_since(TOPIC, 0, &0, own).expect("read back");
        assert!(tail.positions.is_empty());
        assert_eq!(tail.records_read, 0);
        assert_eq!(reader.partition_count(TOPIC).expect("metadata"), Some(1));
    }
}
