//! The Kafka side: an idempotent librdkafka producer that hands back one completion per event.
//!
//! Every record carries a boxed tag of the caller's type as its librdkafka opaque; librdkafka's delivery
//! report callback (on the producer's polling thread, [`POLL_WAIT`]) sends it back through an
//! unbounded channel together with the outcome. The channel is bounded in practice by `max_in_flight`, because the
//! relay stops reading the WAL while that many events are outstanding.
//!
//! librdkafka's local queue is sized from the caller's budget plus one produce batch
//! ([`queue_limits`]), so it does not fill while the caller keeps to its budget; should it fill
//! anyway (limits the user set smaller), `send` answers [`FailureKind::Full`]: backpressure,
//! never a failed delivery.
//!
//! "Delivered" means what librdkafka's delivery report means with `acks=all` and idempotence:
//! every in-sync replica has the record. Failures arrive only after librdkafka's own retries,
//! bounded by `message.timeout.ms`.
//!
//! A producer is never reused after a failure: the relay abandons it (purging its queue and
//! waiting, bounded, for requests already on the wire) and builds a new one before replaying.
//!
//! Invariant: nothing handed over after a failed delivery, nor queued behind it, is sent
//! ([`Flow`]). The first transient failure halts the producer: the delivery-report callback
//! purges the local queue before it returns, and later records fail without being produced.
//! Otherwise records of a partition queued behind one that expired while the broker was
//! unreachable would go out once it answers again, ahead of the expired one's replay — which
//! the exactly-once read-back then skips, leaving the aggregate's first deliveries out of order
//! (docs/reliability.md, section 10).
//!
//! Before the first record to a topic, [`Sink::send`] waits (bounded) until the topic's
//! partitions have their logs (`ready.rs`: a just-created partition lost its first batch).
//!
//! The tag is the caller's: the relay's carries its watermark ticket, the poller's its claimed
//! batch, the backfill's only its size. This adapter never looks inside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;
use tokio::sync::mpsc;
use tracing::warn;

use super::config::KafkaProperties;
use super::late::{self, Handed};
use super::logs::ClientLog;
use super::ready::ReadyTopics;
use super::topic_limit::{SizeCheck, TopicLimits};
use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Handover, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

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

pub(crate) struct DeliveryReports<Tag: Send + Sync + 'static> {
    pub(super) tx: mpsc::UnboundedSender<Completion<Tag>>,
    log: ClientLog,
    /// Keys with a refused record the caller has not released ([`Sink::release`]).
    fence: KeyFence,
    /// Whether records are still handed to librdkafka; held while one is.
    flow: Mutex<Flow>,
    /// The producer this context belongs to, for the halt's purge (set once it exists).
    producer: OnceLock<Weak<BaseProducer<DeliveryReports<Tag>>>>,
    /// What was handed over and learnt stored, for the read-back's late-write fence (`late.rs`).
    handed: Handed,
}

/// Whether the producer still hands records to librdkafka. Once a delivery failed transiently,
/// what librdkafka holds behind it must not reach the broker before its replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Open,
    /// A delivery failed: the queue was purged, nothing is produced any more.
    Halted,
}

impl<Tag: Send + Sync + 'static> DeliveryReports<Tag> {
    fn flow(&self) -> std::sync::MutexGuard<'_, Flow> {
        self.flow.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Purges the local queue, once, and refuses what is handed over from now on. Under the
    /// lock [`Sink::send`] holds while it produces, so no record handed over before the halt is
    /// enqueued after the purge. librdkafka serves the purged records' reports later, on this
    /// thread; requests already on the wire are not recalled (docs/reliability.md).
    fn halt(&self) {
        self.purge_unsent(Flow::Halted);
    }

    /// After the broker refused a record: drops what librdkafka has not sent yet, so that as
    /// little as possible of what was queued behind it reaches the broker ahead of its replay.
    /// Every caller ends its session on such a refusal (a suspect sent alone has nothing
    /// behind it). The purged records fail as transient, and the first of their reports halts
    /// the producer.
    fn purge_queued(&self) {
        self.purge_unsent(Flow::Open);
    }

    /// While the flow is open: purges what librdkafka has not sent, and leaves the flow `then`.
    fn purge_unsent(&self, then: Flow) {
        let mut flow = self.flow();
        if *flow == Flow::Open {
            if let Some(producer) = self.producer.get().and_then(Weak::upgrade) {
                producer.purge(PurgeConfig::default().queue());
            }
            *flow = then;
        }
    }
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
            Ok(_) => {
                self.log.acknowledged();
                self.handed.stored();
                Ok(())
            }
            Err((error, msg)) => {
                // A failed record's timestamp is not reported; its hand-over time is, and is its
                // stamp unless records carry their own.
                let (sent, handed_over_ms) = on_the_wire(msg);
                let stamp = handed_over_ms.filter(|_| self.handed.stamped_at_hand_over());
                self.handed.failed(stamp, sent);
                let mut failure = failure(
                    error,
                    msg.topic(),
                    (msg.partition() >= 0).then_some(msg.partition()),
                    msg.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == "id")
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    }),
                );
                // Stamped when handed over, a record refused for its timestamp arrived later than
                // the topic's bound allows (a broker or network that held it): the replay stamps
                // it anew. Only a record carrying its own time can be refused for what it is.
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::InvalidTimestamp)
                    && self.handed.stamped_at_hand_over()
                {
                    failure.kind = FailureKind::Transient;
                    failure.cause = format!(
                        "{error}: the record reached topic \"{}\" more than the topic's \
                         message.timestamp.before.max.ms after it was handed over (a broker or the network held \
                         it); the relay replays it, stamped anew. If this repeats, raise the topic's bound above \
                         message.timeout.ms + 2 s",
                        msg.topic()
                    );
                }
                Err(failure)
            }
        };
        // What the cluster said last is what the outage summary names (a topic that does not
        // exist, an ACL that denies it), rather than "no acknowledgement".
        if let Err(f) = &outcome {
            if f.kind == FailureKind::Transient {
                self.log.note(&f.cause);
            }
        }
        // Stops what is queued behind this record before librdkafka sends it (module docs).
        // After the report is on its way: a record stopped by the halt is reported after it.
        let halts = matches!(&outcome, Err(f) if f.kind == FailureKind::Transient);
        let outcome_refused = matches!(&outcome, Err(f) if f.kind == FailureKind::Refused);
        // The receiver is gone only while the relay abandons this producer; nothing to do then.
        match &outcome {
            // Later records of the key are not produced until the caller decided about this
            // one (`sink/fence.rs`); those librdkafka already holds may still go ahead of it.
            Err(f) if f.kind == FailureKind::Refused => {
                let key = KeyHash::of(result.as_ref().err().and_then(|(_, m)| m.key()).unwrap_or_default());
                self.fence.close_then(key, || {
                    let _ = self.tx.send(Completion { tag, outcome });
                });
            }
            _ => {
                let _ = self.tx.send(Completion { tag, outcome });
            }
        }
        if halts {
            self.halt();
        } else if outcome_refused {
            self.purge_queued();
        }
    }
}

/// Whether a failed record's request may have reached a broker (librdkafka's message status is
/// not `NOT_PERSISTED`: such a record can still be appended later, `late.rs`), and when it was
/// handed over (ms since the epoch, from librdkafka's latency of the message).
#[allow(unsafe_code)] // The crate's FFI calls: rdkafka wraps neither function.
fn on_the_wire(msg: &rdkafka::message::BorrowedMessage<'_>) -> (bool, Option<i64>) {
    // SAFETY: `msg` borrows a live librdkafka message (the delivery report's, for the length of
    // the callback), and both functions only read fields of it.
    let (status, latency_us) = unsafe {
        (
            rdkafka_sys::rd_kafka_message_status(msg.ptr()),
            rdkafka_sys::rd_kafka_message_latency(msg.ptr()),
        )
    };
    let sent = status != rdkafka_sys::rd_kafka_msg_status_t::RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
    let handed_over = (latency_us >= 0).then(|| late::now_ms() - latency_us / 1000);
    (sent, handed_over)
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
        cause: explain(error, topic),
    }
}

/// librdkafka's words, and for what an operator fixes on the cluster, what to do.
fn explain(error: &KafkaError, topic: &str) -> String {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition) => format!(
            "{error}: topic \"{topic}\" does not exist and the cluster does not create topics on first use \
             (auto.create.topics.enable = false). Create it (kafka-topics.sh --create --topic {topic} \
             --partitions N --replication-factor 3): the relay retries until it exists and confirms nothing past \
             this event meanwhile"
        ),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => format!(
            "{error}: the cluster's ACLs do not let the relay's principal write to topic \"{topic}\". Grant it \
             WRITE and DESCRIBE on the topic (kafka-acls.sh --add --allow-principal User:<relay user> \
             --operation Write --operation Describe --topic {topic}); the relay retries meanwhile and confirms \
             nothing past it"
        ),
        Some(RDKafkaErrorCode::InvalidTimestamp) => format!(
            "{error}: topic \"{topic}\" refuses the record's timestamp as too old or too far ahead (the topic's \
             message.timestamp.before.max.ms / message.timestamp.after.max.ms). Records carry the event's own \
             time when outbox.timestamp_column is set, and a catch-up publishes events later than such a bound \
             allows: unset outbox.timestamp_column (records are then stamped when handed over) or raise the \
             topic's bound"
        ),
        Some(RDKafkaErrorCode::ClusterAuthorizationFailed) => format!(
            "{error}: the cluster's ACLs deny the relay's principal IDEMPOTENT_WRITE on the cluster (brokers \
             before Kafka 3.0 need it for the idempotent producer): grant it (kafka-acls.sh --add \
             --allow-principal User:<relay user> --operation IdempotentWrite --cluster)"
        ),
        _ => error.to_string(),
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

/// How long [`Publisher::abandon_now`] serves the purged records' reports.
const SETTLE_REPORTS: Duration = Duration::from_secs(1);

/// The transactional producer's keys: only `kafka::transactions` passes them to librdkafka.
pub(super) const TRANSACTIONAL_ONLY: &[&str] = &["transactional.id", "transaction.timeout.ms"];

pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    /// Each topic's `max.message.bytes` (`topic_limit.rs`: a record over it is refused here).
    /// First, so dropped first: its requests' queues belong to the producer's handle, which
    /// must outlive them (fields drop in declaration order).
    limits: TopicLimits,
    pub(super) producer: Arc<BaseProducer<DeliveryReports<Tag>>>,
    /// Tells the polling thread to end; it holds the other reference to the producer, which is
    /// destroyed when the thread ends (at most [`POLL_WAIT`] after the publisher is dropped,
    /// with nothing left to send: see [`Publisher::abandon_now`]).
    stop: Arc<AtomicBool>,
    /// Topics whose partitions' logs exist (`ready.rs`: checked before the first record).
    ready: ReadyTopics,
    /// `bootstrap.servers`, for [`Sink::unreachable`].
    bootstrap: String,
}

impl<Tag: Send + Sync + 'static> Drop for Publisher<Tag> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // What this producer may still have on its way: the next read-back fences it.
        self.producer.context().handed.retire();
    }
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// A producer whose records carry the caller's `Tag`. `budget` sizes librdkafka's local
    /// queue so it never refuses a record the caller's own budget allows ([`queue_limits`]).
    pub(crate) fn create(
        props: &KafkaProperties,
        budget: Budget,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        Self::create_with(props, budget, false)
    }

    /// [`Publisher::create`]; `transactional`: with `transactional.id` (the caller then runs
    /// the transactions: `kafka::transactions`), otherwise without it whatever the properties
    /// say (`poll` and `setup --backfill` share the `[kafka]` section with the relay).
    pub(super) fn create_with(
        props: &KafkaProperties,
        budget: Budget,
        transactional: bool,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        let mut config = ClientConfig::new();
        for (k, v) in &props.0 {
            if transactional || !TRANSACTIONAL_ONLY.contains(&k.as_str()) {
                config.set(k, v);
            }
        }
        for (key, value) in queue_limits(props, budget) {
            config.set(key, value);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let producer: Arc<BaseProducer<DeliveryReports<Tag>>> = Arc::new(
            config
                .create_with_context(DeliveryReports {
                    tx,
                    log: ClientLog::default(),
                    fence: KeyFence::default(),
                    flow: Mutex::new(Flow::Open),
                    producer: OnceLock::new(),
                    handed: Handed::new(&late::cluster_of(props)),
                })
                .map_err(|e| SinkError {
                    sink: "Kafka",
                    cause: format!("cannot create the producer: {e}. Check the [kafka] properties"),
                    transient: false,
                })?,
        );
        // Nothing is produced before this is set: the halt always finds the producer.
        let _ = producer.context().producer.set(Arc::downgrade(&producer));
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
        Ok((
            Publisher {
                producer,
                stop,
                ready: ReadyTopics::default(),
                limits: TopicLimits::new(props),
                bootstrap: props.0.get("bootstrap.servers").cloned().unwrap_or_default(),
            },
            rx,
        ))
    }

    /// Gives up on this producer: drops what is still queued locally, and waits (bounded) for
    /// requests already on the wire, so a replay by the next producer cannot overtake them.
    /// What is still in flight after the wait is purged too: the producer is destroyed by its
    /// polling thread a little later (up to [`POLL_WAIT`]), and must not retry anything meanwhile.
    pub(super) fn abandon_now(self, wait: Duration) {
        self.producer.purge(PurgeConfig::default().queue());
        // Crash tests: die while the abandoned producer's requests may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        if let Err(e) = self.producer.flush(wait) {
            warn!(error = %e, "abandoned producer still had requests in flight");
            self.producer.purge(PurgeConfig::default().queue().inflight());
        }
        // The purged records' reports, served before the publisher goes: each says whether its
        // request had been sent, which is what the next read-back fences (`late.rs`); a record
        // still unreported when it goes counts as sent. Bounded: the reports are queued already.
        let settle_until = std::time::Instant::now() + SETTLE_REPORTS;
        let handed = &self.producer.context().handed;
        while !handed.all_settled() && std::time::Instant::now() < settle_until {
            self.producer.poll(Duration::from_millis(10));
        }
    }
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for Publisher<Tag> {
    /// Kafka does not deduplicate by key: exactly-once reads back instead (`dedup_key` unused).
    fn send(&self, handover: Handover<'_, '_>, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        let Handover { record, extra, .. } = handover;
        let context = self.producer.context();
        // Before the lock below (the delivery-report callback's halt takes it): the first
        // record to a topic waits, bounded, until its partitions' logs exist (`ready.rs`).
        // Then the topic's size limit, never waiting: while it is being read the record is not
        // taken (`Full`: the caller keeps its loop and hands it over again); a record over it
        // is refused before anything behind it is sent (`topic_limit.rs`).
        let size = if *context.flow() == Flow::Open {
            let readiness = self.ready.ensure(self.producer.client(), &record.destination);
            self.limits
                .check(self.producer.client(), record, extra, readiness.configs_askable())
        } else {
            SizeCheck::Fits
        };
        let too_large = match size {
            SizeCheck::Fits => None,
            SizeCheck::TooLarge(cause) => Some(cause),
            SizeCheck::Wait => {
                let cause = format!("reading topic \"{}\"'s max.message.bytes", record.destination);
                return Err(Refusal::of(record, tag, FailureKind::Full, cause));
            }
        };
        // Held while the record is produced: the halt's purge cannot slip in between.
        let flow = context.flow();
        if *flow != Flow::Open {
            let failure = SinkFailure::of(record, FailureKind::Transient, halted_cause());
            let _ = context.tx.send(Completion {
                tag,
                outcome: Err(failure),
            });
            return Ok(());
        }
        context.fence.admit(
            &record.key,
            tag,
            |tag| match too_large {
                Some(cause) => Err(Refusal::of(record, tag, FailureKind::Refused, cause)),
                None => self.produce(record, extra, tag),
            },
            |tag| {
                let failure = SinkFailure::of(record, FailureKind::Transient, stopped_cause());
                // After the refusal that closed the fence, on the same channel (`fence.rs`).
                let _ = context.tx.send(Completion {
                    tag,
                    outcome: Err(failure),
                });
                Ok(())
            },
        )
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        self.abandon_now(wait);
    }

    fn release(&self, key: &[u8]) {
        self.producer.context().fence.open(key);
    }

    fn complaint(&self) -> Option<String> {
        self.producer.context().log.last_error()
    }

    fn unreachable(&self) -> Option<String> {
        let cause = self.producer.context().log.unreachable()?;
        Some(format!(
            "no broker of bootstrap.servers = {:?} answers ({cause})",
            self.bootstrap
        ))
    }

    fn verdict(&self) -> Option<SinkError> {
        self.producer.context().log.verdict()
    }
}

/// What a record librdkafka's full queue did not take waits for.
const QUEUE_FULL: &str =
    "librdkafka's local queue is full (queue.buffering.max.messages, queue.buffering.max.kbytes); \
                          the record is handed over again once delivery reports free room";

/// The caller's in-flight budget: what it may have handed over and not yet seen completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    pub(crate) events: usize,
    /// In [`SinkRecord::size`] bytes (key, value, id and headers).
    pub(crate) bytes: usize,
}

/// librdkafka's defaults for one produce batch (`batch.num.messages`, `batch.size`) and the
/// queue's byte limit (`queue.buffering.max.kbytes`).
const DEFAULT_BATCH_NUM_MESSAGES: usize = 10_000;
pub(super) const DEFAULT_BATCH_SIZE: usize = 1_000_000;
const DEFAULT_QUEUE_KBYTES: usize = 1_048_576;

/// librdkafka's queue limits for `budget`, where the properties leave them unset: room for
/// everything the budget lets be in flight plus one produce batch. The records of one delivery
/// report (one batch: up to `batch.num.messages` / `batch.size`) count against the queue until
/// the report's last completion was handed over — rdkafka serves a report as one event and
/// frees its records with it — while the caller, already told of the first ones, hands over
/// more. A queue of the budget plus a small margin therefore filled in a transaction larger
/// than it. A limit the user set is kept: the relay then waits for room when it fills
/// ([`FailureKind::Full`]). librdkafka counts only values against `.kbytes`, which the byte
/// budget (keys, values, ids, headers) bounds from above.
fn queue_limits(props: &KafkaProperties, budget: Budget) -> Vec<(&'static str, String)> {
    let get = |key: &str| props.0.get(key).and_then(|v| v.trim().parse::<usize>().ok());
    let mut limits = Vec::new();
    if !props.0.contains_key("queue.buffering.max.messages") {
        limits.push((
            "queue.buffering.max.messages",
            queue_messages(props, budget.events).to_string(),
        ));
    }
    if !props.0.contains_key("queue.buffering.max.kbytes") {
        let batch = get("batch.size").unwrap_or(DEFAULT_BATCH_SIZE);
        let kbytes = budget
            .bytes
            .saturating_add(batch)
            .div_ceil(1024)
            .max(DEFAULT_QUEUE_KBYTES);
        // librdkafka's upper bound for the property.
        limits.push(("queue.buffering.max.kbytes", kbytes.min(i32::MAX as usize).to_string()));
    }
    limits
}

/// The queue's message limit for a budget of `events` ([`queue_limits`]).
fn queue_messages(props: &KafkaProperties, events: usize) -> usize {
    let batch = props
        .0
        .get("batch.num.messages")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_BATCH_NUM_MESSAGES);
    events.saturating_add(batch)
}

/// `run`'s start warning when the user's `queue.buffering.max.messages` holds less than
/// `relay.max_in_flight` and one produce batch: not wrong, but the relay then waits on it.
pub(super) fn small_queue_note(props: &KafkaProperties, max_in_flight: usize) -> Option<String> {
    let set = props
        .0
        .get("queue.buffering.max.messages")?
        .trim()
        .parse::<usize>()
        .ok()?;
    let needed = queue_messages(props, max_in_flight);
    (set < needed).then(|| {
        format!(
            "[kafka] queue.buffering.max.messages = {set} holds less than relay.max_in_flight + batch.num.messages \
             ({needed}): when it fills, the relay waits for room (nothing fails, nothing is replayed), so throughput \
             may be lower. Remove the key and the relay sizes the queue itself"
        )
    })
}

/// The cause a record handed over after a failed delivery fails with.
fn halted_cause() -> String {
    "not published: an earlier delivery of this producer failed, and nothing may reach Kafka ahead of its replay \
     (the relay replays this one after it)"
        .to_owned()
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    fn produce(&self, record: &SinkRecord<'_>, extra: &[(&str, &[u8])], tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
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
        // Stamped here rather than by librdkafka, so that the stamp a late-write fence
        // measures from is known (`late.rs`); librdkafka would stamp the same moment.
        let now = late::now_ms();
        let stamp = record.timestamp_ms.unwrap_or(now);
        base = base.timestamp(stamp);
        let explicit = record.timestamp_ms.is_some();
        self.producer
            .send(base)
            .map(|()| self.producer.context().handed.handed(stamp, now, explicit))
            .map_err(|(error, rec)| {
                let tag = rec.delivery_opaque;
                // Backpressure, not a failure: nothing was queued (`sink/mod.rs`).
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) {
                    return Refusal::of(record, tag, FailureKind::Full, format!("{error}: {QUEUE_FULL}"));
                }
                Refusal {
                    tag,
                    failure: failure(
                        &error,
                        &record.destination,
                        record.partition,
                        Some(String::from_utf8_lossy(record.event_id).into_owned()),
                    ),
                }
            })
    }
}

#[cfg(test)]
mod tests {
    //! The key fence against librdkafka's mock cluster (`sink/fence.rs`).

    use std::collections::BTreeMap;
    use std::time::Instant;

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;
    use crate::sink::memory::send_taken;

    fn record<'a>(key: &'a [u8], id: &'a [u8]) -> SinkRecord<'a> {
        crate::sink::memory::record("fenced", key, b"{}", id)
    }

    fn next(rx: &mut Completions<u32>) -> (u32, Result<(), SinkFailure>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(c) = rx.try_recv() {
                return (*c.tag, c.outcome);
            }
            assert!(Instant::now() < deadline, "no completion within 20 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A one-broker mock cluster with a topic `fenced` of one partition, and a producer with the
    /// relay's properties plus `extra`, warmed up (metadata, producer id) so that an injected
    /// error hits the records that follow.
    fn warmed_sink(
        extra: &[(&str, &str)],
    ) -> (
        MockCluster<'static, DefaultProducerContext>,
        Publisher<u32>,
        Completions<u32>,
    ) {
        let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("fenced", 1, 1).expect("topic");
        let value = |v: &str| crate::sink::kafka::config::KafkaValue(v.to_owned());
        let mut raw = BTreeMap::from([("bootstrap.servers".to_owned(), value(&cluster.bootstrap_servers()))]);
        raw.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), value(v))));
        let props = KafkaProperties::validate(raw).expect("properties");
        let budget = Budget {
            events: 100,
            bytes: 1 << 20,
        };
        let (sink, mut rx) = Publisher::<u32>::create(&props, budget).expect("producer");
        send(&sink, b"warm", 0);
        assert!(next(&mut rx).1.is_ok());
        (cluster, sink, rx)
    }

    /// The cluster's next Produce request fails with `error`.
    fn fail_next_produce(cluster: &MockCluster<'static, DefaultProducerContext>, error: RDKafkaRespErr) {
        cluster.request_errors(RDKafkaApiKey::Produce, &[error]);
    }

    /// [`warmed_sink`] with the cluster's next Produce request failing with `error`, and
    /// record 1 of key `k` handed over: its failure, and the cluster (alive while it is held)
    /// and the sink for what follows.
    fn first_record_failing(
        error: RDKafkaRespErr,
    ) -> (
        MockCluster<'static, DefaultProducerContext>,
        Publisher<u32>,
        Completions<u32>,
        SinkFailure,
    ) {
        let (cluster, sink, mut rx) = warmed_sink(&[]);
        fail_next_produce(&cluster, error);
        send(&sink, b"k", 1);
        let (tag, outcome) = next(&mut rx);
        assert_eq!(tag, 1, "{outcome:?}");
        (cluster, sink, rx, outcome.expect_err("record 1 fails"))
    }

    /// Hands over the record keyed `key` whose id and tag are `n`.
    fn send(sink: &Publisher<u32>, key: &[u8], n: u32) {
        let id = n.to_string();
        send_taken(sink, Handover::of(&record(key, id.as_bytes())), n);
    }

    /// Why `linger.ms` stays 5 and docs/reliability.md calls first-delivery order across a
    /// failed request a known gap: librdkafka may send what is queued behind a request that
    /// failed for good right after it, before the application hears of the failure — even with
    /// one request in flight per connection and `enable.gapless.guarantee`. The halt on the
    /// first failure purges what it has not sent yet; what it had sent is a prefix, in order.
    #[test]
    fn librdkafka_sends_what_queued_behind_a_failed_request_before_anyone_can_stop_it() {
        let (cluster, sink, mut rx) = warmed_sink(&[
            ("linger.ms", "0"),
            ("max.in.flight.requests.per.connection", "1"),
            ("enable.gapless.guarantee", "true"),
        ]);
        // Permanent for librdkafka, and not a refusal of the record: the relay would replay it.
        fail_next_produce(&cluster, RDKafkaRespErr::RD_KAFKA_RESP_ERR_POLICY_VIOLATION);
        // Long enough that 2..6 are queued before record 1's failure comes back, even on a
        // loaded machine.
        cluster
            .broker_round_trip_time(-1, Duration::from_secs(1))
            .expect("round trip time");
        send(&sink, b"k", 1);
        // Record 1 is on the wire alone; 2..6 queue behind it while its failure comes back.
        std::thread::sleep(Duration::from_millis(50));
        for n in 2..=6u32 {
            send(&sink, b"k", n);
        }
        let outcomes: Vec<(u32, Result<(), SinkFailure>)> = (1..=6).map(|_| next(&mut rx)).collect();
        assert_eq!(outcomes[0].0, 1, "record 1's failure is reported first: {outcomes:?}");
        assert_eq!(
            outcomes[0].1.as_ref().map_err(|f| f.kind),
            Err(FailureKind::Transient),
            "{outcomes:?}"
        );
        // What librdkafka already put on the wire behind record 1 is stored ahead of record 1's
        // replay, in order from record 2; what was still queued when record 1's failure halted
        // the producer fails as purged. Which side each lands on is a race between librdkafka's
        // sender and the delivery callback's purge: all of 2..6 were seen stored, and none.
        // Reports of stored and purged records may interleave: judged by tag, not by arrival.
        let stored: Vec<u32> = outcomes.iter().filter(|(_, o)| o.is_ok()).map(|(t, _)| *t).collect();
        let expected: Vec<u32> = (2..2 + stored.len() as u32).collect();
        assert_eq!(
            stored, expected,
            "a prefix of 2..6 stored, acknowledged in order: {outcomes:?}"
        );
        for (tag, outcome) in &outcomes[1..] {
            let Err(failure) = outcome else { continue };
            assert!(*tag > 1 + stored.len() as u32, "a gap in what was stored: {outcomes:?}");
            assert!(
                failure.cause.contains("Purge") || failure.cause.contains("earlier delivery"),
                "{outcomes:?}"
            );
        }
        Box::new(sink).abandon(Duration::from_secs(1));
    }

    /// The Kafka exactly-once defect the nemesis found (docs/reliability.md, section 10): a
    /// record that expired in librdkafka's queue while the broker was unreachable failed, and the
    /// records queued behind it in its partition were still sent once the broker answered again
    /// (the session's wind-down waited for them). The replay's read-back then found the later
    /// positions, skipped them and sent the expired one after them: first deliveries out of
    /// order. Now the first failed delivery halts the producer: what is queued is purged, nothing
    /// handed over later is produced, and all of it is replayed in order.
    #[test]
    fn a_record_that_expired_in_the_queue_halts_what_was_queued_behind_it() {
        let (cluster, sink, mut rx) = warmed_sink(&[
            ("linger.ms", "0"),
            ("message.timeout.ms", "2000"),
            ("reconnect.backoff.ms", "10"),
            ("reconnect.backoff.max.ms", "100"),
        ]);
        cluster.broker_down(1).expect("broker down");
        send(&sink, b"k", 1);
        // librdkafka looks for expired records once a second: record 2 expires at least one
        // scan after record 1, so it is still queued when record 1's failure is reported.
        std::thread::sleep(Duration::from_millis(1500));
        send(&sink, b"k", 2);
        let (tag, outcome) = next(&mut rx);
        assert_eq!(tag, 1, "record 1 is reported first: {outcome:?}");
        let expired = outcome.expect_err("record 1 expired while the broker was down");
        assert_eq!(expired.kind, FailureKind::Transient, "{expired}");
        // The broker answers again while record 2 is still queued.
        cluster.broker_up(1).expect("broker up");
        send(&sink, b"k", 3);
        let mut rest: Vec<(u32, Result<(), SinkFailure>)> = (0..2).map(|_| next(&mut rx)).collect();
        rest.sort_by_key(|(t, _)| *t);
        let stored: Vec<u32> = rest.iter().filter(|(_, o)| o.is_ok()).map(|(t, _)| *t).collect();
        assert!(
            stored.is_empty(),
            "records behind the expired one were stored ahead of its replay: {stored:?} ({rest:?})"
        );
        Box::new(sink).abandon(Duration::from_secs(1));
    }

    /// A record the relay stamped when it handed it over and the broker refused for its
    /// timestamp arrived later than the topic's bound allows (`late.rs`): replayed, stamped
    /// anew — not a bad event. A record carrying its own time is refused for what it is.
    #[test]
    fn a_timestamp_refusal_is_lateness_for_hand_over_stamps_and_the_record_s_fault_otherwise() {
        let (_cluster, sink, _rx, late) = first_record_failing(RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP);
        assert_eq!(late.kind, FailureKind::Transient, "{late}");
        assert!(late.cause.contains("message.timestamp.before.max.ms"), "{late}");
        Box::new(sink).abandon(Duration::from_secs(1));

        let (cluster, sink, mut rx) = warmed_sink(&[]);
        fail_next_produce(&cluster, RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP);
        let mut own_time = record(b"k", b"2");
        own_time.timestamp_ms = Some(1_000);
        send_taken(&sink, Handover::of(&own_time), 2);
        let refused = next(&mut rx).1.expect_err("refused");
        assert_eq!(refused.kind, FailureKind::Refused, "{refused}");
        Box::new(sink).abandon(Duration::from_secs(1));
    }

    /// What a producer leaves for the next read-back to fence (`late.rs`): a record that failed
    /// in librdkafka's queue never reached a broker, nothing to fence; one whose request was on
    /// the wire when it failed may still be appended, from its own stamp.
    #[test]
    fn a_producer_leaves_to_fence_only_what_it_sent_without_an_answer() {
        let timeouts = [
            ("linger.ms", "0"),
            ("message.timeout.ms", "1500"),
            ("reconnect.backoff.ms", "10"),
            ("reconnect.backoff.max.ms", "100"),
        ];
        let (cluster, sink, mut rx) = warmed_sink(&timeouts);
        let servers = cluster.bootstrap_servers();
        cluster.broker_down(1).expect("broker down");
        send(&sink, b"k", 1);
        assert!(next(&mut rx).1.is_err(), "expired in the queue");
        Box::new(sink).abandon(Duration::from_secs(1));
        assert_eq!(late::unsettled_since(&servers), None, "nothing was sent");

        let (cluster, sink, mut rx) = warmed_sink(&timeouts);
        let servers = cluster.bootstrap_servers();
        cluster
            .broker_round_trip_time(-1, Duration::from_secs(5))
            .expect("round trip time");
        let before = late::now_ms();
        send(&sink, b"k", 1);
        assert!(next(&mut rx).1.is_err(), "timed out on the wire");
        Box::new(sink).abandon(Duration::from_secs(1));
        let stamp = late::unsettled_since(&servers).expect("a request on the wire is fenced");
        // From librdkafka's latency of the message: the hand-over, to within a millisecond.
        assert!((before - 2..=late::now_ms()).contains(&stamp), "{stamp} vs {before}");
    }

    /// Issue 44: a queue of the budget plus 1024 filled in a 200,000-event transaction, because
    /// the records of a delivery report are freed only after its last completion. Unset limits
    /// hold the budget and one produce batch; limits the user set are kept.
    #[test]
    fn the_queue_holds_the_budget_and_one_batch_unless_the_user_sized_it() {
        let props = |extra: &[(&str, &str)]| {
            let value = |v: &str| crate::sink::kafka::config::KafkaValue(v.to_owned());
            let mut raw = BTreeMap::from([("bootstrap.servers".to_owned(), value("k:9092"))]);
            raw.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), value(v))));
            KafkaProperties::validate(raw).expect("properties")
        };
        let budget = Budget {
            events: 10_000,
            bytes: 64 << 20,
        };
        let limits = queue_limits(&props(&[]), budget);
        assert_eq!(limits[0], ("queue.buffering.max.messages", "20000".to_owned()));
        assert_eq!(
            limits[1],
            ("queue.buffering.max.kbytes", DEFAULT_QUEUE_KBYTES.to_string())
        );
        let big = Budget {
            events: 10,
            bytes: 2 << 30,
        };
        let limits = queue_limits(&props(&[("batch.num.messages", "500"), ("batch.size", "1024")]), big);
        assert_eq!(limits[0], ("queue.buffering.max.messages", "510".to_owned()));
        assert_eq!(limits[1], ("queue.buffering.max.kbytes", ((2 << 20) + 1).to_string()));
        let user = props(&[
            ("queue.buffering.max.messages", "7"),
            ("queue.buffering.max.kbytes", "9"),
        ]);
        assert!(queue_limits(&user, budget).is_empty());
    }

    /// A full local queue is backpressure: `send` answers `Full` with the tag, nothing queued
    /// and no completion, and takes the same record once the reports freed room.
    #[test]
    fn a_full_queue_answers_full_and_takes_the_record_once_room_frees() {
        let (cluster, sink, mut rx) = warmed_sink(&[("queue.buffering.max.messages", "3"), ("linger.ms", "0")]);
        cluster
            .broker_round_trip_time(-1, Duration::from_millis(300))
            .expect("round trip time");
        for n in 1..=3 {
            send(&sink, b"k", n);
        }
        let refusal = sink
            .send(Handover::of(&record(b"k", b"4")), Box::new(4))
            .expect_err("the queue holds three");
        assert_eq!(
            (*refusal.tag, refusal.failure.kind),
            (4, FailureKind::Full),
            "{}",
            refusal.failure
        );
        assert!(
            refusal.failure.cause.contains("queue.buffering.max.messages"),
            "{}",
            refusal.failure
        );
        let mut tag = refusal.tag;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match sink.send(Handover::of(&record(b"k", b"4")), tag) {
                Ok(()) => break,
                Err(r) if r.failure.is_full() && Instant::now() < deadline => {
                    tag = r.tag;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(r) => panic!("not taken once room freed: {}", r.failure),
            }
        }
        let mut tags: Vec<u32> = (1..=4)
            .map(|_| {
                let (tag, outcome) = next(&mut rx);
                assert!(outcome.is_ok(), "{outcome:?}");
                tag
            })
            .collect();
        tags.sort_unstable();
        assert_eq!(tags, [1, 2, 3, 4], "each record completed once");
        assert!(rx.try_recv().is_err(), "no completion for the answer Full");
        Box::new(sink).abandon(Duration::from_secs(1));
    }

    /// After a refusal the broker reported, later records of the key fail without being
    /// produced until the caller releases the key; other keys go on.
    #[test]
    fn a_refused_record_fences_its_key_until_released() {
        let (_cluster, sink, mut rx, refused) =
            first_record_failing(RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
        assert_eq!(refused.kind, FailureKind::Refused, "{refused}");
        // Not produced: it would land ahead of record 1, which the caller replays.
        send(&sink, b"k", 2);
        let (tag, outcome) = next(&mut rx);
        let stopped = outcome.unwrap_err();
        assert_eq!((tag, stopped.kind), (2, FailureKind::Transient), "{stopped}");
        assert!(stopped.cause.contains("refused"), "{stopped}");
        send(&sink, b"other", 3);
        assert_eq!(next(&mut rx).0, 3);
        sink.release(b"k");
        send(&sink, b"k", 4);
        let (tag, outcome) = next(&mut rx);
        assert!(tag == 4 && outcome.is_ok(), "{outcome:?}");
        Box::new(sink).abandon(Duration::from_secs(1));
    }
}
