//! The Kafka side: an idempotent librdkafka producer that hands back one completion per event.
//!
//! Every record carries a boxed tag of the caller's type as its librdkafka opaque; librdkafka's delivery
//! report callback (on the producer's polling thread, [`POLL_WAIT`]) sends it back through an
//! unbounded channel together with the outcome. The channel is bounded in practice by `max_in_flight`, because the
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;
use tokio::sync::mpsc;
use tracing::warn;

use super::logs::ClientLog;
use crate::config::kafka::KafkaProperties;
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

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
    tx: mpsc::UnboundedSender<Completion<Tag>>,
    log: ClientLog,
}

impl<Tag: Send + Sync + 'static> ClientContext for DeliveryReports<Tag> {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.log.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log.error(&error, reason);
    }
}

impl<Tag: Send + Sync + 'static> ProducerContext for DeliveryReports<Tag> {
    type DeliveryOpaque = Box<Tag>;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: Self::DeliveryOpaque) {
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((error, msg)) => Err(failure(
                error,
                msg.topic(),
                (msg.partition() >= 0).then_some(msg.partition()),
                msg.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "id")
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                }),
            )),
        };
        // The receiver is gone only while the relay abandons this producer; nothing to do then.
        let _ = self.tx.send(Completion { tag, outcome });
    }
}

/// A Kafka error as a sink-neutral failure: refused for what the record is, or transient.
pub(crate) fn failure(
    error: &KafkaError,
    topic: &str,
    partition: Option<i32>,
    event_id: Option<String>,
) -> SinkFailure {
    SinkFailure {
        kind: if is_record_rejection(error) {
            FailureKind::Refused
        } else {
            FailureKind::Transient
        },
        destination: topic.to_owned(),
        partition,
        event_id,
        cause: error.to_string(),
    }
}

/// How long one call of the polling thread waits for delivery reports before it looks at its stop
/// flag. Reports are handed over the moment they arrive whatever this is; it only sets how often
/// an idle producer wakes up. rdkafka's `ThreadedProducer` polls every 100 ms, and each of its
/// polls ends by spinning through the last fraction of a millisecond (the remaining time is
/// passed to librdkafka in whole milliseconds, so it turns into 0-ms polls): 0.4 ms of CPU per
/// wake-up, 0.4 % of a core for an idle relay, nine tenths of its idle CPU
/// (docs/benchmarks.md, "Where the time and the CPU go"). Once every 5 s makes that negligible.
const POLL_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    producer: Arc<BaseProducer<DeliveryReports<Tag>>>,
    /// Tells the polling thread to end; it holds the other reference to the producer, which is
    /// destroyed when the thread ends (at most [`POLL_WAIT`] after the publisher is dropped,
    /// with nothing left to send: see [`Publisher::abandon_now`]).
    stop: Arc<AtomicBool>,
}

impl<Tag: Send + Sync + 'static> Drop for Publisher<Tag> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// A producer whose records carry the caller's `Tag`. `max_in_flight` sizes librdkafka's
    /// local queue so it never rejects a record the caller's own budget allows.
    pub(crate) fn create(
        props: &KafkaProperties,
        max_in_flight: usize,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
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
        let producer: Arc<BaseProducer<DeliveryReports<Tag>>> = Arc::new(
            config
                .create_with_context(DeliveryReports {
                    tx,
                    log: ClientLog::default(),
                })
                .map_err(|e| SinkError {
                    sink: "Kafka",
                    cause: format!("cannot create the producer: {e}. Check the [kafka] properties"),
                    transient: false,
                })?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopped) = (Arc::clone(&producer), Arc::clone(&stop));
        // Serves delivery reports (and librdkafka's logs and errors) as they arrive. Not joined
        // when the publisher goes: the thread ends on its own within POLL_WAIT, and the
        // producer it then destroys has nothing left to send.
        std::thread::Builder::new()
            .name("rdk:reports".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    polled.poll(POLL_WAIT);
                }
            })
            .map_err(|e| SinkError {
                sink: "Kafka",
                cause: format!("cannot start the producer's delivery-report thread: {e}"),
                transient: true,
            })?;
        Ok((Publisher { producer, stop }, rx))
    }

    /// Gives up on this producer: drops what is still queued locally, and waits (bounded) for
    /// requests already on the wire, so a replay by the next producer cannot overtake them.
    /// What is still in flight after the wait is purged too: the producer is destroyed by its
    /// polling thread a little later (up to [`POLL_WAIT`]), and must not retry anything meanwhile.
    fn abandon_now(self, wait: Duration) {
        self.producer.purge(PurgeConfig::default().queue());
        // Crash tests: die while the abandoned producer's requests may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        if let Err(e) = self.producer.flush(wait) {
            warn!(error = %e, "abandoned producer still had requests in flight");
            self.producer.purge(PurgeConfig::default().queue().inflight());
        }
    }
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for Publisher<Tag> {
    /// Kafka does not deduplicate by key: exactly-once reads back instead (`dedup_key` unused).
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        _dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        let mut headers = OwnedHeaders::new_with_capacity(1 + record.headers.len() + extra.len());
        headers = headers.insert(Header {
            key: "id",
            value: Some(record.event_id),
        });
        for (key, value) in record.headers_with(extra) {
            headers = headers.insert(Header { key, value });
        }
        let mut base = BaseRecord::with_opaque_to(&record.destination, tag)
            .key(&*record.key)
            .headers(headers);
        if let Some(value) = &record.value {
            base = base.payload(&**value);
        }
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        if let Some(ts) = record.timestamp_ms {
            base = base.timestamp(ts);
        }
        self.producer.send(base).map_err(|(error, rec)| Refusal {
            tag: rec.delivery_opaque,
            failure: failure(
                &error,
                &record.destination,
                record.partition,
                Some(String::from_utf8_lossy(record.event_id).into_owned()),
            ),
        })
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        self.abandon_now(wait);
    }

    fn complaint(&self) -> Option<String> {
        self.producer.context().log.last_error()
    }
}
