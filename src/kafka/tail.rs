//! Reading back the tail of one partition: the positions a given writer put there since a floor.
//!
//! Used once per partition and streaming session by the relay's exactly-once resume
//! (`relay::resume`). The reader is an rdkafka `BaseConsumer` that never joins a group and never
//! commits: it is assigned one partition at a time, reads from a little below the high
//! watermark to the end of the partition, and starts again further back (×4 each time),
//! collecting the caller's positions at or above the floor, until a window holds one of the
//! caller's records below the floor, reaches the partition's start, or would reach further back
//! than `max_records`.
//!
//! Invariant: every call blocks (metadata, watermarks, fetches), bounded by the reader's
//! timeout; callers run it on a thread of its own, never on an async runtime's workers. This
//! adapter knows nothing of what a position is: the caller's `own` closure reads the headers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedHeaders, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::kafka::KafkaProperties;

/// The first window read below the high watermark; a single writer's newest record is almost
/// always in it.
const FIRST_WINDOW: i64 = 8;

/// Producer-only properties, left out of the reader's configuration (librdkafka would warn
/// about each).
const PRODUCER_ONLY: &[&str] = &[
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

impl<'m> HeaderLookup<'m> {
    pub(crate) fn new(headers: Option<&'m BorrowedHeaders>) -> Self {
        HeaderLookup(headers)
    }

    /// The value of the first header called `name` (`None`: absent or null).
    pub(crate) fn get(&self, name: &str) -> Option<&'m [u8]> {
        self.0?.iter().find(|h| h.key == name).and_then(|h| h.value)
    }
}

/// What reading back one partition found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tail<P> {
    /// Every position of the caller's records at or above the floor, from the partition's end
    /// back to its first record below the floor (or the partition's start).
    pub(crate) positions: BTreeSet<P>,
    pub(crate) records_read: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    #[error("reading back the tail of {topic} partition {partition} failed: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        source: KafkaError,
    },
    #[error("reading back the tail of {topic} partition {partition} timed out after {timeout_ms} ms")]
    Timeout {
        topic: String,
        partition: i32,
        timeout_ms: u64,
    },
    #[error(
        "read back {read} records of {topic} partition {partition} (offsets {from}..{high}) without reaching \
         this relay's records from before the replay, so which events Kafka already holds is unknown; raise \
         relay.read_back_max_records (now {max}) or restart once with relay.delivery = \"at-least-once\" \
         (which may publish the replayed events twice)"
    )]
    BoundHit {
        topic: String,
        partition: i32,
        read: u64,
        from: i64,
        high: i64,
        max: u64,
    },
}

impl ReadBackError {
    /// Only the bound is the operator's to change; everything else is the cluster's and passes.
    pub(crate) fn is_transient(&self) -> bool {
        !matches!(self, ReadBackError::BoundHit { .. })
    }
}

pub(crate) struct TailReader {
    consumer: BaseConsumer,
    timeout: Duration,
    max_records: u64,
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
            .set("fetch.wait.max.ms", "50")
            .set("isolation.level", "read_uncommitted");
        let consumer: BaseConsumer = config.create()?;
        Ok(TailReader {
            consumer,
            timeout,
            max_records: max_records as u64,
        })
    }

    /// The topic's partition count; `None` when the topic does not exist.
    pub(crate) fn partition_count(&self, topic: &str) -> Result<Option<i32>, ReadBackError> {
        let err = |source| ReadBackError::Kafka {
            topic: topic.to_owned(),
            partition: -1,
            source,
        };
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
    pub(crate) fn own_since<P: Ord>(
        &self,
        topic: &str,
        partition: i32,
        floor: &P,
        own: impl Fn(&HeaderLookup<'_>) -> Option<P>,
    ) -> Result<Tail<P>, ReadBackError> {
        let err = |source| ReadBackError::Kafka {
            topic: topic.to_owned(),
            partition,
            source,
        };
        let (low, high) = self
            .consumer
            .fetch_watermarks(topic, partition, self.timeout)
            .map_err(err)?;
        let max = self.max_records.max(1) as i64;
        let mut span = FIRST_WINDOW.min(max);
        let mut read = 0u64;
        let mut positions = BTreeSet::new();
        if high <= low {
            return Ok(Tail {
                positions,
                records_read: read,
            });
        }
        loop {
            let start = (high - span).max(low);
            let (reached_floor, n) = self.read_to_end(topic, partition, start, floor, &own, &mut positions)?;
            read += n;
            if reached_floor || start == low {
                return Ok(Tail {
                    positions,
                    records_read: read,
                });
            }
            if span >= max {
                return Err(ReadBackError::BoundHit {
                    topic: topic.to_owned(),
                    partition,
                    read,
                    from: start,
                    high,
                    max: self.max_records,
                });
            }
            span = (span * 4).min(max);
        }
    }

    /// Reads from offset `start` to the end of the partition into `positions` (own positions at
    /// or above `floor`); whether one of the caller's records below `floor` was among them, and
    /// how many records came.
    fn read_to_end<P: Ord>(
        &self,
        topic: &str,
        partition: i32,
        start: i64,
        floor: &P,
        own: &impl Fn(&HeaderLookup<'_>) -> Option<P>,
        positions: &mut BTreeSet<P>,
    ) -> Result<(bool, u64), ReadBackError> {
        let err = |source| ReadBackError::Kafka {
            topic: topic.to_owned(),
            partition,
            source,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(err)?;
        self.consumer.assign(&tpl).map_err(err)?;
        let deadline = Instant::now() + self.timeout;
        let mut reached_floor = false;
        let mut read = 0u64;
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(ReadBackError::Timeout {
                    topic: topic.to_owned(),
                    partition,
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
                    read += 1;
                    match own(&HeaderLookup::new(msg.headers())) {
                        Some(p) if p >= *floor => {
                            positions.insert(p);
                        }
                        Some(_) => reached_floor = true,
                        None => {}
                    }
                }
            }
        };
        let _ = self.consumer.unassign();
        outcome.map(|()| (reached_floor, read))
    }
}
