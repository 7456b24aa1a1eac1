//! The Kafka side: an idempotent librdkafka producer that hands back one completion per event.
//!
//! Every record carries a boxed tag of the caller's type as its librdkafka opaque; librdkafka's delivery
//! report callback (on the producer's polling thread) sends it back through an unbounded channel
//! together with the outcome. The channel is bounded in practice by `max_in_flight`, because the
//! relay stops reading the WAL while that many events are outstanding.
//!
//! "Delivered" means what librdkafka's delivery report means with `acks=all` and idempotence:
//! every in-sync replica has the record. Failures arrive only after librdkafka's own retries,
//! bounded by `message.timeout.ms`.
//!
//! A producer is never reused after a failure: the relay abandons it (purging its queue and
//! waiting, bounded, for requests already on the wire) and builds a new one before replaying.
//!
//! The tag is the caller's: the relay's carries its watermark ticket, the poller's its claimed
//! batch, the backfill's only its size. This adapter never looks inside it.

use std::borrow::Cow;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::mpsc;
use tracing::warn;

use crate::config::kafka::KafkaProperties;

/// The outcome of one event.
#[derive(Debug)]
pub(crate) struct Delivery<Tag> {
    pub(crate) tag: Box<Tag>,
    pub(crate) outcome: Result<(), DeliveryFailure>,
}

#[derive(Debug, Clone)]
pub struct DeliveryFailure {
    pub(crate) error: KafkaError,
    pub(crate) topic: String,
    /// The partition librdkafka had chosen, `-1` when none was (unknown topic, …).
    pub(crate) partition: i32,
    pub(crate) event_id: Option<String>,
}

impl std::fmt::Display for DeliveryFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "event id={} to topic {:?}{} failed: {}",
            self.event_id.as_deref().unwrap_or("?"),
            self.topic,
            if self.partition >= 0 {
                format!(" partition {}", self.partition)
            } else {
                String::new()
            },
            self.error
        )
    }
}

impl std::error::Error for DeliveryFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// One extra header of a record: name and value (`None`: a null header).
pub(crate) type RecordHeader<'a> = (Cow<'a, str>, Option<Cow<'a, [u8]>>);

/// One record ready for Kafka: what [`Publisher::send`] hands to librdkafka (which copies it),
/// borrowed from whatever the caller keeps.
///
/// It stays a shape of its own, apart from the domain's `OutboxEvent`, because the adapter
/// knows nothing of outbox events (dependencies point from the domain to the adapters), and
/// because not every record is an event: a dead letter is a record made from an event's raw
/// form. Events become records only through `crate::outbox::event::OutboxEvent::record`, dead
/// letters through `crate::outbox::bad_event::RawEvent::dead_letter`. The topic is a `Cow`
/// because routing may build it; the headers are a `Cow` so a dead letter can own the ones it
/// makes up while an event's record borrows the event's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboundRecord<'a> {
    pub(crate) topic: Cow<'a, str>,
    pub(crate) key: Cow<'a, [u8]>,
    /// `None`: a null value (a tombstone).
    pub(crate) payload: Option<Cow<'a, [u8]>>,
    /// Sent as the first header, `id`.
    pub(crate) event_id: &'a [u8],
    pub(crate) timestamp_ms: Option<i64>,
    /// Sent after `id`, in this order.
    pub(crate) headers: Cow<'a, [RecordHeader<'a>]>,
    /// `None`: the partitioner picks (murmur2 of the key, as Java's producer).
    pub(crate) partition: Option<i32>,
}

impl OutboundRecord<'_> {
    /// What this record costs against the in-flight byte budget.
    pub(crate) fn size(&self) -> usize {
        self.key.len()
            + self.payload.as_ref().map_or(0, |p| p.len())
            + self.event_id.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
                .sum::<usize>()
    }
}

/// librdkafka refused a record before queueing it.
#[derive(Debug)]
pub(crate) struct Rejected<Tag> {
    pub(crate) tag: Box<Tag>,
    pub(crate) error: KafkaError,
}

impl<Tag> Rejected<Tag> {
    /// The record itself is unacceptable (too large, bad topic), as opposed to the producer.
    pub(crate) fn is_bad_record(&self) -> bool {
        is_record_rejection(&self.error)
    }
}

/// Whether Kafka (librdkafka locally, or the broker in a delivery report) refused a record for
/// what it *is* — its size, shape, timestamp or topic — so that sending it again can never
/// succeed. Everything else (timeouts, transport, leadership, authorization, a broken
/// producer) is the cluster's or the producer's problem, and the relay replays.
/// docs/reliability.md has the table, with the reasons.
pub(crate) fn is_record_rejection(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            // Larger than message.max.bytes (librdkafka, locally) or the broker's/topic's limit.
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                // The broker refused the record batch's content or its timestamp
                // (message.timestamp.difference.max.ms).
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTimestamp
                | RDKafkaErrorCode::MessageBatchTooLarge
                // The routed topic is illegal, or the cluster says it does not exist and will
                // not create it (auto-creation off).
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::UnknownTopic
        )
    )
}

pub(crate) struct DeliveryReports<Tag> {
    tx: mpsc::UnboundedSender<Delivery<Tag>>,
}

impl<Tag: Send + Sync + 'static> ClientContext for DeliveryReports<Tag> {}

impl<Tag: Send + Sync + 'static> ProducerContext for DeliveryReports<Tag> {
    type DeliveryOpaque = Box<Tag>;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: Self::DeliveryOpaque) {
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((error, msg)) => Err(DeliveryFailure {
                error: error.clone(),
                topic: msg.topic().to_owned(),
                partition: msg.partition(),
                event_id: msg.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "id")
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                }),
            }),
        };
        // The receiver is gone only while the relay abandons this producer; nothing to do then.
        let _ = self.tx.send(Delivery { tag, outcome });
    }
}

pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    producer: ThreadedProducer<DeliveryReports<Tag>>,
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// A producer whose records carry the caller's `Tag`. `max_in_flight` sizes librdkafka's
    /// local queue so it never rejects a record the caller's own budget allows.
    pub(crate) fn create(
        props: &KafkaProperties,
        max_in_flight: usize,
    ) -> Result<(Publisher<Tag>, mpsc::UnboundedReceiver<Delivery<Tag>>), KafkaError> {
        let mut config = ClientConfig::new();
        for (k, v) in &props.0 {
            config.set(k, v);
        }
        let min_queue = (max_in_flight + 1024).to_string();
        let queue_ok = props
            .0
            .get("queue.buffering.max.messages")
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|v| v > max_in_flight);
        if !queue_ok {
            config.set("queue.buffering.max.messages", &min_queue);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let producer = config.create_with_context(DeliveryReports { tx })?;
        Ok((Publisher { producer }, rx))
    }

    pub(crate) fn send(&self, record: &OutboundRecord<'_>, tag: Box<Tag>) -> Result<(), Rejected<Tag>> {
        self.send_with(record, &[], tag)
    }

    /// [`send`](Self::send) with `trailer` headers after the record's own (the relay's source
    /// position in exactly-once mode).
    pub(crate) fn send_with(
        &self,
        record: &OutboundRecord<'_>,
        trailer: &[(&str, &[u8])],
        tag: Box<Tag>,
    ) -> Result<(), Rejected<Tag>> {
        let mut headers = OwnedHeaders::new_with_capacity(1 + record.headers.len() + trailer.len());
        headers = headers.insert(Header {
            key: "id",
            value: Some(record.event_id),
        });
        for (name, value) in record.headers.iter() {
            headers = headers.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        for &(name, value) in trailer {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let mut base = BaseRecord::with_opaque_to(&record.topic, tag)
            .key(&*record.key)
            .headers(headers);
        if let Some(payload) = &record.payload {
            base = base.payload(&**payload);
        }
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        if let Some(ts) = record.timestamp_ms {
            base = base.timestamp(ts);
        }
        self.producer.send(base).map_err(|(error, rec)| Rejected {
            tag: rec.delivery_opaque,
            error,
        })
    }

    /// Gives up on this producer: drops what is still queued locally, and waits (bounded) for
    /// requests already on the wire, so a replay by the next producer cannot overtake them.
    pub(crate) fn abandon(self, wait: Duration) {
        self.producer.purge(PurgeConfig::default().queue());
        // Crash tests: die while the abandoned producer's requests may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        if let Err(e) = self.producer.flush(wait) {
            warn!(error = %e, "abandoned producer still had requests in flight");
        }
    }
}
