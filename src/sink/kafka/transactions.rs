//! Exactly-once through Kafka transactions (`[kafka] exactly_once = "transactions"`): the
//! idempotent producer of `producer.rs`, made transactional, and the checkpoint stored with
//! each transaction.
//!
//! **Role.** The caller hands records over as usual and, at a point of its choosing, seals them
//! ([`Sealer::seal`]): this adapter then commits the Kafka transaction holding every record
//! since the previous seal, *together with the caller's checkpoint*, and reports the outcome as
//! one more completion; nothing of an unsealed transaction is visible to a `read_committed`
//! consumer.
//!
//! **The checkpoint** is an offset commit inside the transaction
//! (`send_offsets_to_transaction`): consumer group `outbox-relay.<transactional.id>`, partition
//! 0 of `[kafka] checkpoint_topic` (created here with one partition if missing: the broker
//! refuses offsets for a partition that does not exist), offset = the caller's checkpoint,
//! metadata = its label. The broker writes it with the transaction's records, atomically: it is
//! committed exactly when they are. It is read back once, right after `init_transactions`,
//! with a `read_committed` offset fetch (which waits for a pending one), and handed to the
//! caller with the sink ([`Transactional::checkpoint`]).
//!
//! **Fencing.** Creating the sink calls `init_transactions`: the broker bumps the producer epoch
//! of `transactional.id`, aborts the previous producer's open transaction (or completes its
//! commit, if the commit was already under way) and refuses that producer's later writes
//! (`PRODUCER_FENCED`). So the checkpoint read afterwards is final: no earlier producer can
//! still commit. A fenced producer's seal and records fail as transient failures naming the
//! fencing; the caller abandons it.
//!
//! **Threads.** librdkafka's transactional calls block (each is a round trip or more; a commit
//! first flushes every record): creation runs them on tokio's blocking pool, seals on a thread
//! of this producer's own (`rdk:txn`), one at a time, in the order they were asked for.
//!
//! Invariant: a seal's completion is sent after the completions of the records it commits
//! (the commit flushes them, and their reports are served before it returns), and `Ok` only
//! once the broker committed the transaction and its checkpoint.

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, PurgeConfig};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::config::KafkaProperties;
use super::logs::QuietContext;
use super::producer::{Budget, DeliveryReports, Publisher};
use crate::sink::{Completion, FailureKind, Handover, Refusal, Sealer, Sink, SinkError, SinkFailure, Transactional};

/// One seal asked for: the checkpoint to store (`None`: abort the open transaction instead)
/// and the caller's tag for the outcome.
struct SealJob<Tag> {
    checkpoint: Option<u64>,
    label: String,
    tag: Box<Tag>,
}

type SharedProducer<Tag> = Arc<BaseProducer<DeliveryReports<Tag>>>;

pub(crate) struct TransactionalPublisher<Tag: Send + Sync + 'static> {
    inner: Publisher<Tag>,
    jobs: Jobs<Tag>,
}

/// To the `rdk:txn` thread, shared by the publisher and its [`KafkaSealer`]: the abandon takes
/// it, which ends the thread, and seals asked for afterwards are refused.
type Jobs<Tag> = Arc<std::sync::Mutex<Option<std_mpsc::Sender<SealJob<Tag>>>>>;

/// Seals what the publisher was handed since the previous seal.
struct KafkaSealer<Tag> {
    jobs: Jobs<Tag>,
}

impl<Tag: Send + 'static> Sealer<Tag> for KafkaSealer<Tag> {
    fn seal(&self, checkpoint: u64, label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        self.ask(SealJob {
            checkpoint: Some(checkpoint),
            label: label.to_owned(),
            tag,
        })
    }

    fn abort(&self, label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        self.ask(SealJob {
            checkpoint: None,
            label: label.to_owned(),
            tag,
        })
    }
}

impl<Tag: Send + 'static> KafkaSealer<Tag> {
    /// Hands `job` to the `rdk:txn` thread.
    fn ask(&self, job: SealJob<Tag>) -> Result<(), Refusal<Tag>> {
        let jobs = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match jobs.as_ref() {
            Some(tx) => tx.send(job).map_err(|std_mpsc::SendError(job)| {
                Refusal::transient(job.tag, "the transaction thread is gone".into())
            }),
            None => Err(Refusal::transient(job.tag, "the producer was abandoned".into())),
        }
    }
}

/// The consumer group that carries the checkpoint of `transactional.id`.
pub(crate) fn checkpoint_group(transactional_id: &str) -> String {
    format!("outbox-relay.{transactional_id}")
}

fn sink_error(cause: String, transient: bool) -> SinkError {
    SinkError {
        sink: "Kafka",
        cause,
        transient,
    }
}

/// The client properties for the admin client and the checkpoint reader (no producer keys).
fn client_config(props: &KafkaProperties) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in &props.0 {
        if !super::tail::PRODUCER_ONLY.contains(&k.as_str()) {
            config.set(k, v);
        }
    }
    config
}

impl<Tag: Send + Sync + 'static> TransactionalPublisher<Tag> {
    /// A transactional producer that has fenced every earlier producer of its
    /// `transactional.id`, read the committed checkpoint and begun its first transaction, with
    /// its sealer.
    pub(crate) async fn create(
        props: &KafkaProperties,
        budget: Budget,
        checkpoint_topic: &str,
        timeout: Duration,
    ) -> Result<Transactional<Tag>, SinkError> {
        let id = props
            .0
            .get("transactional.id")
            .cloned()
            .ok_or_else(|| sink_error("[kafka] transactional.id is missing".into(), false))?;
        ensure_checkpoint_topic(props, checkpoint_topic, timeout).await?;
        let (inner, completions) = Publisher::create_with(props, budget, true)?;
        let producer = Arc::clone(&inner.producer);
        let mut config = client_config(props);
        config
            .set("group.id", checkpoint_group(&id))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let topic = checkpoint_topic.to_owned();
        // A commit flushes first: give it the records' own time to land, and the round trips.
        let op_timeout = props.message_timeout() + timeout;
        let started = std::time::Instant::now();
        let (group, checkpoint) = tokio::task::spawn_blocking({
            let (producer, topic, id) = (Arc::clone(&producer), topic.clone(), id.clone());
            move || -> Result<(ConsumerGroupMetadata, Option<u64>), SinkError> {
                // Fences the previous producer of this id and settles its open transaction.
                producer.init_transactions(timeout).map_err(|e| {
                    sink_error(
                        format!("init_transactions for transactional.id {id:?} failed: {e}"),
                        !is_fatal(&e),
                    )
                })?;
                let consumer: BaseConsumer<QuietContext> = config
                    .create_with_context(QuietContext::default())
                    .map_err(|e| sink_error(format!("cannot create the checkpoint reader: {e}"), false))?;
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&topic, 0);
                let committed = consumer.committed_offsets(tpl, timeout).map_err(|e| {
                    sink_error(
                        format!(
                            "reading the checkpoint (group {:?}, topic {topic:?}) failed: {e}",
                            checkpoint_group(&id)
                        ),
                        true,
                    )
                })?;
                let checkpoint = committed.elements().first().and_then(|e| match e.offset() {
                    Offset::Offset(n) if n >= 0 => Some(n as u64),
                    _ => None,
                });
                let group = consumer
                    .group_metadata()
                    .ok_or_else(|| sink_error("the checkpoint reader has no group metadata".into(), false))?;
                producer
                    .begin_transaction()
                    .map_err(|e| sink_error(format!("begin_transaction failed: {e}"), true))?;
                Ok((group, checkpoint))
            }
        })
        .await
        .map_err(|e| sink_error(format!("the transactional producer's start failed: {e}"), true))??;
        info!(
            transactional_id = %id,
            checkpoint_group = %checkpoint_group(&id),
            checkpoint = ?checkpoint,
            init_ms = started.elapsed().as_millis() as u64,
            "Kafka transactions: earlier producers of this transactional.id fenced; checkpoint read"
        );
        let (jobs, rx) = std_mpsc::channel::<SealJob<Tag>>();
        std::thread::Builder::new()
            .name("rdk:txn".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let done = match job.checkpoint {
                        Some(checkpoint) => seal(&producer, &group, &topic, checkpoint, &job.label, op_timeout),
                        None => abort(&producer, &job.label, op_timeout),
                    };
                    let outcome = done.map_err(|e| SinkFailure {
                        kind: FailureKind::Transient,
                        destination: topic.clone(),
                        partition: None,
                        event_id: None,
                        cause: explain(&e, &id),
                    });
                    let _ = producer.context().tx.send(Completion { tag: job.tag, outcome });
                }
            })
            .map_err(|e| sink_error(format!("cannot start the transaction thread: {e}"), true))?;
        let jobs: Jobs<Tag> = Arc::new(std::sync::Mutex::new(Some(jobs)));
        Ok(Transactional {
            sink: Box::new(TransactionalPublisher {
                inner,
                jobs: Arc::clone(&jobs),
            }),
            completions,
            sealer: Box::new(KafkaSealer { jobs }),
            checkpoint,
        })
    }
}

/// Commits the open transaction with the checkpoint and begins the next. An abortable failure
/// aborts it (its records are then invisible to `read_committed` consumers); a fatal one (fenced)
/// leaves the producer unusable, which the caller abandons.
fn seal<Tag: Send + Sync + 'static>(
    producer: &SharedProducer<Tag>,
    group: &ConsumerGroupMetadata,
    topic: &str,
    checkpoint: u64,
    label: &str,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let attempt = || -> Result<(), KafkaError> {
        // rdkafka's commit_transaction flushes first, polling in 100 ms steps that stay idle
        // here (the delivery-report thread serves the reports): measured, that added about
        // 50 ms to every commit. Waiting for the records in 1 ms steps leaves it nothing to do.
        let deadline = Instant::now() + timeout;
        while producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut tpl = TopicPartitionList::new();
        let mut at = tpl.add_partition(topic, 0);
        at.set_offset(Offset::Offset(checkpoint as i64))?;
        at.set_metadata(label);
        producer.send_offsets_to_transaction(&tpl, group, timeout)?;
        producer.commit_transaction(timeout)
    };
    if let Err(e) = attempt() {
        if let KafkaError::Transaction(t) = &e {
            if t.txn_requires_abort() {
                if let Err(abort) = producer.abort_transaction(timeout) {
                    warn!(error = %abort, "aborting the failed Kafka transaction failed too");
                }
            }
        }
        return Err(e);
    }
    producer.begin_transaction()
}

/// Aborts the open transaction on purpose (the caller's records in it may never be committed:
/// a streamed source transaction that aborted, or that falls back to being published at its
/// commit) and begins the next. librdkafka purges what is still queued; those records' reports
/// come back as failures the caller ignores.
fn abort<Tag: Send + Sync + 'static>(
    producer: &SharedProducer<Tag>,
    label: &str,
    timeout: Duration,
) -> Result<(), KafkaError> {
    producer.abort_transaction(timeout)?;
    info!(unit = label, "Kafka transaction aborted on purpose");
    producer.begin_transaction()
}

fn is_fatal(error: &KafkaError) -> bool {
    match error {
        KafkaError::Transaction(t) => t.is_fatal(),
        _ => false,
    }
}

/// The failure's words; a fencing says what happened.
fn explain(error: &KafkaError, id: &str) -> String {
    let fenced = matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced)
    ) || error.to_string().to_lowercase().contains("fenced");
    if fenced {
        format!(
            "{error}: fenced — another producer with transactional.id {id:?} (a standby, or this relay restarted) \
             called init_transactions; this one's transaction was aborted by the broker and it publishes nothing more"
        )
    } else {
        format!("Kafka transaction aborted: {error}")
    }
}

/// Creates the checkpoint topic (one partition, the cluster's replication factor) unless it
/// exists: the broker refuses an offset commit for a partition it does not know.
async fn ensure_checkpoint_topic(props: &KafkaProperties, topic: &str, timeout: Duration) -> Result<(), SinkError> {
    let admin: AdminClient<QuietContext> = client_config(props)
        .create_with_context(QuietContext::default())
        .map_err(|e| sink_error(format!("cannot create an admin client: {e}"), false))?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1));
    let opts = AdminOptions::new().operation_timeout(Some(timeout));
    let created = tokio::time::timeout(timeout, admin.create_topics([&new], &opts))
        .await
        .map_err(|_| sink_error(format!("creating the checkpoint topic {topic:?} timed out"), true))?
        .map_err(|e| sink_error(format!("creating the checkpoint topic {topic:?} failed: {e}"), true))?;
    for outcome in created {
        match outcome {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed)) => {
                // Not allowed to create it: fine if an operator did (the offset commit says).
                warn!(
                    topic,
                    "may not create the checkpoint topic; it must exist (one partition)"
                );
            }
            Err((_, code)) => {
                return Err(sink_error(
                    format!(
                        "creating the checkpoint topic {topic:?} failed: {code}. Create it (kafka-topics.sh --create \
                         --topic {topic} --partitions 1) or name another with relay.checkpoint_topic"
                    ),
                    true,
                ))
            }
        }
    }
    Ok(())
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for TransactionalPublisher<Tag> {
    fn send(&self, handover: Handover<'_, '_>, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        self.inner.send(handover, tag)
    }

    /// Aborts the open transaction (bounded by `wait`) so that `read_committed` consumers are
    /// not held back until `transaction.timeout.ms`, then gives the producer up.
    fn abandon(self: Box<Self>, wait: Duration) {
        let TransactionalPublisher { inner, jobs } = *self;
        drop(jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        inner.producer.purge(PurgeConfig::default().queue());
        if let Err(e) = inner.producer.abort_transaction(wait) {
            warn!(error = %e, "aborting the abandoned producer's Kafka transaction failed; the next producer of its \
                               transactional.id aborts it");
        }
        inner.abandon_now(Duration::from_millis(100).min(wait));
    }

    fn release(&self, key: &[u8]) {
        self.inner.release(key)
    }

    fn complaint(&self) -> Option<String> {
        self.inner.complaint()
    }

    fn unreachable(&self) -> Option<String> {
        self.inner.unreachable()
    }

    fn verdict(&self) -> Option<SinkError> {
        self.inner.verdict()
    }
}
