//! A record the broker would refuse for its size is refused here, before anything behind it is
//! handed to librdkafka.
//!
//! Why: a broker refuses a record batch larger than its topic's `max.message.bytes`. When that
//! limit is below the producer's `message.max.bytes` (librdkafka's own, local check), the refusal
//! only comes back in the delivery report — by then librdkafka may have sent the records queued
//! behind it in the same partition, and they are stored ahead of the refused batch's innocent
//! records and of its replay (docs/reliability.md, section 3). Checked locally, the oversized
//! record is refused from `send` like one over `message.max.bytes`: nothing after it is handed
//! over until the relay has decided about it, so first deliveries keep commit order.
//!
//! The size is the one the broker compares: the record alone in a v2 record batch (61 bytes of
//! batch header, the record's varint-framed fields). A record over the limit alone is refused by
//! the broker whatever batch it is in, so a local refusal never condemns a record the broker
//! would take — except when the topic's limit was raised after this producer read it: a record
//! over the limit read is looked up again before it is refused.
//!
//! Never blocking: each topic's limit is asked (DescribeConfigs, `topic_config.rs`) at its first
//! record, and until the answer is there — 3 to 34 ms on a local KRaft broker, at most
//! [`LOOKUP_WAIT`] — the topic's records are answered [`SizeCheck::Wait`]: the sink says `Full`,
//! and the caller keeps its loop (status updates, delivery reports) and hands the same record
//! over again (backpressure, `sink/mod.rs`). The same while a record over a known limit is
//! looked up again.
//!
//! Invariant: unknown means unchecked. A topic whose limit cannot be read (no DescribeConfigs
//! ACL, no answer within [`LOOKUP_WAIT`], the cluster not answering at the topic's first record
//! or naming no controller to ask — librdkafka's mock cluster, the demo's —, a compression codec
//! that makes the stored size unknowable here) is left to the broker, as before. A limit is read
//! once per producer and topic, and again only to refuse a record.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use tracing::{debug, warn};

use super::config::KafkaProperties;
use super::producer::DEFAULT_BATCH_SIZE;
use super::topic_config::{Describe, TopicConfig};
use crate::sink::SinkRecord;

/// librdkafka's bound on one DescribeConfigs request.
const LOOKUP_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a topic's records wait for its limit before they go unchecked: librdkafka answers a
/// request that timed out itself; this is the bound should that answer not come.
const LOOKUP_WAIT: Duration = Duration::from_millis(1500);
/// A v2 record batch's header (base offset, length, epoch, magic, CRC, attributes, last offset
/// delta, timestamps, producer id and epoch, base sequence, record count).
const BATCH_OVERHEAD: usize = 61;

/// What the topic's size limit says about a record.
#[derive(Debug)]
pub(crate) enum SizeCheck {
    /// Within the limit, or the limit is unknown: hand it to librdkafka.
    Fits,
    /// The limit is being read: nothing of the record is queued; the caller hands it over again.
    Wait,
    /// The broker would refuse it: why, and what to do.
    TooLarge(String),
}

/// What this producer knows of one topic's `max.message.bytes`.
enum Limit {
    /// Asked, not answered yet. `known`: the limit read before, when this is a second look.
    Asked {
        request: Describe,
        since: Instant,
        known: Option<usize>,
    },
    /// Read (`None`: unknown, not asked again).
    Read(Option<usize>),
}

/// Each topic's `max.message.bytes` as this producer read it.
pub(crate) struct TopicLimits {
    /// Off when records are compressed: the broker compares the compressed batch.
    enabled: bool,
    /// The largest batch librdkafka builds: the smaller of `batch.size` and `message.max.bytes`.
    batch_limit: usize,
    limits: Mutex<HashMap<String, Limit>>,
}

impl std::fmt::Debug for TopicLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicLimits")
            .field("enabled", &self.enabled)
            .field("batch_limit", &self.batch_limit)
            .finish_non_exhaustive()
    }
}

impl TopicLimits {
    pub(crate) fn new(props: &KafkaProperties) -> TopicLimits {
        let codec = ["compression.type", "compression.codec"]
            .iter()
            .find_map(|k| props.0.get(*k))
            .map(|v| v.trim().to_ascii_lowercase());
        let batch_size = props.0.get("batch.size").and_then(|v| v.trim().parse().ok());
        TopicLimits {
            enabled: codec.as_deref().is_none_or(|c| c == "none"),
            batch_limit: batch_size
                .unwrap_or(DEFAULT_BATCH_SIZE)
                .min(super::message_max_bytes(props)),
            limits: Mutex::default(),
        }
    }

    /// Whether the broker would take `record` (with the `id` header and `extra`) for its size.
    /// Never blocks (module docs). `askable`: whether the topic's readiness wait just now
    /// found a cluster to ask (`ready.rs`); a topic first seen when it did not is left
    /// unchecked rather than held a second time.
    pub(crate) fn check<C: ClientContext>(
        &self,
        client: &Client<C>,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        askable: bool,
    ) -> SizeCheck {
        if !self.enabled {
            return SizeCheck::Fits;
        }
        let topic = &*record.destination;
        let mut limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        let (limit, fresh) = match limits.get(topic) {
            Some(Limit::Read(None)) => return SizeCheck::Fits,
            Some(Limit::Read(Some(limit))) => (*limit, false),
            // The topic's first record, and no cluster to ask: unknown.
            None if !askable => {
                limits.insert(topic.to_owned(), Limit::Read(None));
                return SizeCheck::Fits;
            }
            None => {
                limits.insert(topic.to_owned(), self.ask(client, topic, None));
                return SizeCheck::Wait;
            }
            Some(Limit::Asked { request, since, known }) => {
                let answer = request.poll(Duration::ZERO);
                if answer.is_none() && since.elapsed() < LOOKUP_WAIT {
                    return SizeCheck::Wait;
                }
                // A second look that found nothing keeps what the first one read.
                let known = *known;
                let limit = self.read(topic, answer, known.is_none()).or(known);
                limits.insert(topic.to_owned(), Limit::Read(limit));
                match limit {
                    Some(limit) => (limit, true),
                    None => return SizeCheck::Fits,
                }
            }
        };
        let size = batch_size(record, extra);
        if size <= limit {
            SizeCheck::Fits
        } else if !fresh {
            // The operator may have raised the limit since it was read: look again first.
            limits.insert(topic.to_owned(), self.ask(client, topic, Some(limit)));
            SizeCheck::Wait
        } else {
            SizeCheck::TooLarge(format!(
                "the record is too large for topic \"{topic}\": {size} bytes as a record batch, above the topic's \
                 max.message.bytes = {limit}. Raise the topic's limit (kafka-configs.sh --alter --entity-type topics \
                 --entity-name {topic} --add-config max.message.bytes=N) or make the event smaller"
            ))
        }
    }

    /// Starts a lookup (`known`: the limit read before); one that cannot start is unknown.
    fn ask<C: ClientContext>(&self, client: &Client<C>, topic: &str, known: Option<usize>) -> Limit {
        match Describe::start(client, topic, LOOKUP_TIMEOUT) {
            Ok(request) => Limit::Asked {
                request,
                since: Instant::now(),
                known,
            },
            Err(cause) => {
                debug!(topic, cause, "topic's max.message.bytes unknown: left to the broker");
                Limit::Read(None)
            }
        }
    }

    /// The limit in the cluster's answer (`None`: no answer in time, or none readable). `first`:
    /// the topic's first lookup, when a limit below the producer's batch limit is warned about.
    fn read(&self, topic: &str, answer: Option<TopicConfig>, first: bool) -> Option<usize> {
        let answer = answer.unwrap_or_else(|| Err(format!("no answer within {} ms", LOOKUP_WAIT.as_millis())));
        let limit = answer.and_then(|config| {
            config
                .get("max.message.bytes")
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| "no readable max.message.bytes".to_owned())
        });
        match limit {
            Err(cause) => {
                debug!(topic, cause, "topic's max.message.bytes unknown: left to the broker");
                None
            }
            // Good records batched together would be refused whole, then sent again one by one.
            Ok(limit) if limit < self.batch_limit && first => {
                warn!(
                    topic,
                    max_message_bytes = limit,
                    "the topic's max.message.bytes is below the producer's batch limit ({} bytes: the smaller of \
                     [kafka] batch.size and message.max.bytes): a batch of good events larger than the topic takes \
                     is refused whole, and its events are sent again one by one. Set [kafka] batch.size = {limit} (or \
                     raise the topic's max.message.bytes)",
                    self.batch_limit
                );
                Some(limit)
            }
            Ok(limit) => Some(limit),
        }
    }
}

/// The size of a v2 record batch holding only this record, as the broker measures it.
pub(crate) fn batch_size(record: &SinkRecord<'_>, extra: &[(&str, &[u8])]) -> usize {
    let field = |len: Option<usize>| match len {
        Some(n) => varint_len(n as i64) + n,
        None => varint_len(-1),
    };
    let id = field(Some("id".len())) + field(Some(record.event_id.len()));
    let (count, headers) = record
        .headers_with(extra)
        .fold((1usize, id), |(count, size), (name, value)| {
            (
                count + 1,
                size + field(Some(name.len())) + field(value.map(<[u8]>::len)),
            )
        });
    // Attributes, timestamp delta 0, offset delta 0.
    let body = 3
        + field(Some(record.key.len()))
        + field(record.value.as_ref().map(|v| v.len()))
        + varint_len(count as i64)
        + headers;
    BATCH_OVERHEAD + varint_len(body as i64) + body
}

/// Bytes of a zig-zag varint (Kafka's record fields).
fn varint_len(v: i64) -> usize {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut n = 1;
    while z >= 0x80 {
        z >>= 7;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_zig_zag() {
        assert_eq!(varint_len(-1), 1);
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(63), 1);
        assert_eq!(varint_len(64), 2);
        assert_eq!(varint_len(8191), 2);
        assert_eq!(varint_len(8192), 3);
    }

    /// The broker's own number for one record, as Kafka's `DefaultRecordBatch` counts it: a
    /// 16-byte key, a 10-byte value, header `id` = 3 bytes.
    #[test]
    fn one_record_batch_size_matches_kafkas_count() {
        let record = crate::sink::memory::record("t", &[7u8; 16], b"0123456789", b"abc");
        // body: attributes 1, timestamp delta 1, offset delta 1, key 1+16, value 1+10, header
        // count 1, "id" 1+2, "abc" 1+3 = 39; length varint 1; batch header 61.
        let extra_headers: usize = record
            .headers_with(&[])
            .map(|(k, v)| 2 + k.len() + v.map_or(0, <[u8]>::len))
            .sum();
        assert_eq!(batch_size(&record, &[]), 61 + 1 + 39 + extra_headers);
    }
}
