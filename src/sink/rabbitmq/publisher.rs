//! The RabbitMQ adapter: [`Sink::send`] copies the record into an AMQP message and hands it to a
//! task (spawned on the caller's runtime at [`Publisher::create`]) that owns the channel, in
//! confirm mode, and publishes.
//!
//! **Confirms.** Every publish gets a lapin `PublisherConfirm`, which lapin resolves from the
//! broker's `basic.ack`/`basic.nack` by delivery tag — including acks with `multiple` and acks
//! that arrive out of publish order — so each record is completed from its own confirm:
//! * ack → delivered (with `delivery_mode = 2` and durable queues, the message is on disk in
//!   every queue it was routed to);
//! * ack carrying a `basic.return` (`mandatory`, no queue bound for the routing key) →
//!   [`FailureKind::Refused`]: the broker would otherwise drop it silently, so it is a bad event
//!   and `relay.on_bad_event` decides; the records of the same key queued behind it, and those
//!   handed over later until the caller releases the key ([`Sink::release`]), are not published
//!   but fail `Transient` (the caller replays them once it decided about this one);
//! * nack, a failed publish, a closed channel or connection → [`FailureKind::Transient`], and
//!   the sink is *broken*: everything queued behind fails `Transient` at once and nothing more
//!   is published (no reconnect inside one sink; the relay abandons it and replays).
//!
//! **Order.** At most one unconfirmed message per aggregate key: a record whose key already has
//! a message on the wire waits in this task until that one is confirmed. So a nack of message k
//! can never leave message k+1 of the same aggregate stored ahead of it — k+1 was not sent yet,
//! and fails with the sink. Different keys are pipelined freely. The cost: one aggregate gets
//! at most one message per confirm round trip (docs/sink-rabbitmq.md has numbers).
//!
//! **CloudEvents** (`[cloudevents]`, the AMQP protocol binding 1.0.2): the record arrives with
//! the Kafka binding's names (`ce_<attr>` headers, `content-type`), and [`message`] moves them
//! where AMQP puts them. Binary mode: each `ce_<attr>` becomes the application property (header)
//! `cloudEvents:<attr>`, a string (the binding allows the canonical string form for every
//! type), and `content-type` becomes the `content_type` property (the `datacontenttype`).
//! Structured mode: the body is the JSON envelope and `content_type` its media type. The config
//! refuses header columns named `ce_*` or `content-type` with `[cloudevents]`, so every such
//! name here is one the relay wrote.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::{check_exchange, connect, words, MAX_MESSAGE_BYTES, SINK};
use crate::config::cloudevents::CloudEventsMode;
use crate::config::rabbitmq::{validate_routing_key, RabbitMqSettings, MAX_SHORT_STRING};
use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

/// Header holding the event id (also the `message_id` property).
pub(crate) const ID_HEADER: &str = "id";
/// Header holding the aggregate key (the Kafka record key), as bytes.
pub(crate) const KEY_HEADER: &str = "key";
/// The AMQP binding's prefix of a CloudEvents attribute's application property.
pub(crate) const CE_PROPERTY_PREFIX: &str = "cloudEvents:";
/// The prefix of a CloudEvents attribute's header in the record (the Kafka binding's).
const CE_HEADER_PREFIX: &str = "ce_";
/// The record header carrying the content type in CloudEvents modes.
const CONTENT_TYPE_HEADER: &str = "content-type";

/// One message for the task, owning everything.
struct Outgoing<Tag> {
    routing_key: String,
    key: Vec<u8>,
    body: Vec<u8>,
    properties: BasicProperties,
    event_id: String,
    tag: Box<Tag>,
}

impl<Tag> Outgoing<Tag> {
    fn failure(&self, kind: FailureKind, cause: String) -> SinkFailure {
        SinkFailure {
            kind,
            destination: self.routing_key.clone(),
            partition: None,
            event_id: Some(self.event_id.clone()),
            cause,
        }
    }
}

/// A message on the wire, waiting for its confirm.
struct InFlight<Tag> {
    routing_key: String,
    key: Vec<u8>,
    event_id: String,
    tag: Box<Tag>,
}

type Confirm = Pin<Box<dyn Future<Output = (u64, lapin::Result<Confirmation>)> + Send>>;

/// The sink: a sender to the publishing task.
pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    exchange: String,
    to_task: mpsc::UnboundedSender<Outgoing<Tag>>,
    /// Completions for records the task can no longer take (it ended).
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    /// `Some(wait)`: abandon, waiting at most `wait` for confirms.
    stop: watch::Sender<Option<Duration>>,
    /// Disconnected once the task has closed the connection.
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    /// Keys refused and not released yet (closed by the task, opened by [`Sink::release`]).
    fence: Arc<KeyFence>,
    /// `[cloudevents]`'s mode: records carry CloudEvents headers to map to the AMQP binding.
    cloudevents: Option<CloudEventsMode>,
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// Connects, checks the exchange, turns on publisher confirms and starts the task on the
    /// current runtime. `_max_in_flight` needs no local queue sizing: the task's queue is
    /// unbounded and the caller's budget bounds it. `cloudevents`: `[cloudevents]`'s mode, if set.
    pub(crate) async fn create(
        settings: &RabbitMqSettings,
        _max_in_flight: usize,
        cloudevents: Option<CloudEventsMode>,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        let (connection, channel) = connect(settings).await?;
        if let Err(e) = check_exchange(&channel, settings).await {
            let _ = tokio::time::timeout(Duration::from_secs(2), connection.close(200, "")).await;
            return Err(e);
        }
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| SinkError {
                sink: SINK,
                cause: format!("cannot turn on publisher confirms: {}", words(&e)),
                transient: true,
            })?;
        let (to_task, from_sink) = mpsc::unbounded_channel();
        let (completions, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(None);
        let (done_tx, done) = std::sync::mpsc::channel();
        let fence = Arc::new(KeyFence::default());
        let task = Task {
            fence: Arc::clone(&fence),
            exchange: settings.exchange.clone(),
            connection,
            channel,
            completions: completions.clone(),
            waiting: HashMap::new(),
            in_flight: HashMap::new(),
            confirms: FuturesUnordered::new(),
            next_seq: 0,
            broken: None,
        };
        tokio::spawn(async move {
            task.run(from_sink, stopped).await;
            drop(done_tx);
        });
        Ok((
            Publisher {
                exchange: settings.exchange.clone(),
                to_task,
                completions,
                stop,
                done: std::sync::Mutex::new(done),
                fence,
                cloudevents,
            },
            rx,
        ))
    }
}

fn refusal<Tag>(record: &SinkRecord<'_>, tag: Box<Tag>, cause: String) -> Refusal<Tag> {
    Refusal {
        tag,
        failure: SinkFailure {
            kind: FailureKind::Refused,
            destination: record.destination.clone().into_owned(),
            partition: None,
            event_id: Some(String::from_utf8_lossy(record.event_id).into_owned()),
            cause,
        },
    }
}

/// `application/json` when the body is JSON, else nothing (consumers get the bytes as they are).
fn content_type(body: &[u8]) -> Option<&'static str> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    (matches!(first, b'{' | b'[' | b'"') && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok())
        .then_some("application/json")
}

/// The AMQP message of a record: headers (the record's, the extra ones, then `id` and `key`,
/// which win over a record header of the same name), properties, body. With `cloudevents`, the
/// CloudEvents headers are mapped to the AMQP binding (module docs) and the content type is the
/// event's, never derived from the body.
fn message(
    record: &SinkRecord<'_>,
    extra: &[(&str, &[u8])],
    cloudevents: Option<CloudEventsMode>,
) -> Result<(BasicProperties, Vec<u8>), String> {
    let mut headers = FieldTable::default();
    let named = |name: &str| -> Result<ShortString, String> {
        if name.len() > MAX_SHORT_STRING {
            return Err(format!(
                "header {:?}… is {} bytes long; AMQP header names allow at most {MAX_SHORT_STRING}",
                name.chars().take(32).collect::<String>(),
                name.len()
            ));
        }
        Ok(name.into())
    };
    let mut ce_content_type: Option<String> = None;
    for (name, value) in record.headers_with(extra) {
        if cloudevents.is_some() && name == CONTENT_TYPE_HEADER {
            let ct = value
                .and_then(|v| std::str::from_utf8(v).ok())
                .filter(|ct| ct.len() <= MAX_SHORT_STRING);
            ce_content_type = Some(
                ct.ok_or_else(|| {
                    "the CloudEvents content type is not UTF-8 text of at most 255 bytes, so it cannot be the AMQP \
                     content_type property; set [cloudevents] content_type to a shorter media type"
                        .to_owned()
                })?
                .to_owned(),
            );
            continue;
        }
        let value = match value {
            Some(v) => AMQPValue::LongString(LongString::from(v.to_vec())),
            None => AMQPValue::Void,
        };
        let name = match (cloudevents, name.strip_prefix(CE_HEADER_PREFIX)) {
            (Some(CloudEventsMode::Binary), Some(attribute)) => named(&format!("{CE_PROPERTY_PREFIX}{attribute}"))?,
            _ => named(name)?,
        };
        headers.insert(name, value);
    }
    headers.insert(
        ID_HEADER.into(),
        AMQPValue::LongString(LongString::from(record.event_id.to_vec())),
    );
    headers.insert(
        KEY_HEADER.into(),
        AMQPValue::LongString(LongString::from(record.key.to_vec())),
    );
    let event_id = std::str::from_utf8(record.event_id)
        .ok()
        .filter(|id| id.len() <= MAX_SHORT_STRING)
        .ok_or_else(|| {
            "the event id is not UTF-8 text of at most 255 bytes, so it cannot be the AMQP message_id".to_owned()
        })?;
    let body = record.value.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(event_id.into())
        .with_app_id("outbox-relay".into())
        .with_headers(headers);
    if let Some(ms) = record.timestamp_ms.filter(|ms| *ms >= 0) {
        // AMQP timestamps are whole seconds.
        properties = properties.with_timestamp((ms / 1000) as u64);
    }
    match ce_content_type {
        Some(ct) => properties = properties.with_content_type(ct.into()),
        // A CloudEvent's content type is its `datacontenttype` or nothing: a guess from the body
        // would state an attribute the event does not have.
        None if cloudevents.is_some() => {}
        None => {
            if let Some(ct) = content_type(&body) {
                properties = properties.with_content_type(ct.into());
            }
        }
    }
    Ok((properties, body))
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for Publisher<Tag> {
    /// AMQP 0-9-1 does not deduplicate: `dedup_key` is unused (exactly-once is refused at start).
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        _dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        if let Err(e) = validate_routing_key(&record.destination) {
            return Err(refusal(record, tag, e));
        }
        if record.size() > MAX_MESSAGE_BYTES {
            return Err(refusal(
                record,
                tag,
                format!(
                    "the message is {} bytes; RabbitMQ's max_message_size is {MAX_MESSAGE_BYTES} by default",
                    record.size()
                ),
            ));
        }
        let (properties, body) = match message(record, extra, self.cloudevents) {
            Ok(m) => m,
            Err(e) => return Err(refusal(record, tag, e)),
        };
        let outgoing = Outgoing {
            routing_key: record.destination.clone().into_owned(),
            key: record.key.to_vec(),
            body,
            properties,
            event_id: String::from_utf8_lossy(record.event_id).into_owned(),
            tag,
        };
        if let Err(mpsc::error::SendError(outgoing)) = self.to_task.send(outgoing) {
            // The task ended (abandoned): a transient failure, as for a lost connection.
            let failure = outgoing.failure(
                FailureKind::Transient,
                format!("the RabbitMQ publisher for exchange {:?} has stopped", self.exchange),
            );
            let _ = self.completions.send(Completion {
                tag: outgoing.tag,
                outcome: Err(failure),
            });
        }
        Ok(())
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        let _ = self.stop.send(Some(wait));
        // The task drops what is queued, waits up to `wait` for confirms, then closes (bounded).
        // A panic elsewhere while holding the lock does not make the receiver unusable: waiting
        // for the task still bounds what a replay can be overtaken by (as the other sinks do).
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let _ = done.recv_timeout(wait + Duration::from_secs(3));
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }
}

struct Task<Tag> {
    exchange: String,
    connection: Connection,
    channel: Channel,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    /// Keys with a message on the wire, and the records of that key waiting behind it.
    waiting: HashMap<Vec<u8>, VecDeque<Outgoing<Tag>>>,
    in_flight: HashMap<u64, InFlight<Tag>>,
    confirms: FuturesUnordered<Confirm>,
    next_seq: u64,
    /// Why this sink stopped publishing (a nack, a failed publish, a lost channel).
    broken: Option<String>,
    /// Keys with a refused record the caller has not released: their records are not published.
    fence: Arc<KeyFence>,
}

impl<Tag: Send + Sync + 'static> Task<Tag> {
    async fn run(
        mut self,
        mut from_sink: mpsc::UnboundedReceiver<Outgoing<Tag>>,
        mut stop: watch::Receiver<Option<Duration>>,
    ) {
        let wait = loop {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    // A dropped sink (no abandon) stops at once.
                    break if changed.is_ok() { (*stop.borrow()).unwrap_or_default() } else { Duration::ZERO };
                }
                Some((seq, confirmation)) = self.confirms.next(), if !self.confirms.is_empty() => {
                    self.confirmed(seq, confirmation).await;
                }
                outgoing = from_sink.recv() => match outgoing {
                    Some(outgoing) => self.accept(outgoing).await,
                    None => break Duration::ZERO,
                },
            }
        };
        // Abandoned: drop what was not published (no completions), wait (bounded) for what is
        // on the wire so a replay cannot be overtaken by it, then close.
        drop(from_sink);
        self.waiting.clear();
        let pending = self.confirms.len();
        let drained = tokio::time::timeout(wait, async { while self.confirms.next().await.is_some() {} }).await;
        if drained.is_err() {
            warn!(exchange = %self.exchange, pending, "abandoned RabbitMQ publisher still had unconfirmed messages");
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.channel.close(200, "abandoned")).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.connection.close(200, "abandoned")).await;
        debug!(exchange = %self.exchange, "RabbitMQ publisher closed");
    }

    fn complete(&self, tag: Box<Tag>, outcome: Result<(), SinkFailure>) {
        // The receiver is gone only while the caller abandons this sink.
        let _ = self.completions.send(Completion { tag, outcome });
    }

    /// A new record: published now, or queued behind its key's unconfirmed message.
    async fn accept(&mut self, outgoing: Outgoing<Tag>) {
        if let Some(cause) = &self.broken {
            let failure = outgoing.failure(FailureKind::Transient, cause.clone());
            self.complete(outgoing.tag, Err(failure));
            return;
        }
        if self.fence.is_closed(KeyHash::of(&outgoing.key)) {
            let failure = outgoing.failure(FailureKind::Transient, stopped_cause());
            self.complete(outgoing.tag, Err(failure));
            return;
        }
        match self.waiting.get_mut(&outgoing.key) {
            Some(queue) => queue.push_back(outgoing),
            None => {
                self.waiting.insert(outgoing.key.clone(), VecDeque::new());
                self.publish(outgoing).await;
            }
        }
    }

    async fn publish(&mut self, outgoing: Outgoing<Tag>) {
        let Outgoing {
            routing_key,
            key,
            body,
            properties,
            event_id,
            tag,
        } = outgoing;
        let published = self
            .channel
            .basic_publish(
                &self.exchange,
                &routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body,
                properties,
            )
            .await;
        match published {
            Ok(confirm) => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.in_flight.insert(
                    seq,
                    InFlight {
                        routing_key,
                        key,
                        event_id,
                        tag,
                    },
                );
                self.confirms.push(Box::pin(async move { (seq, confirm.await) }));
            }
            Err(e) => {
                let cause = format!("publish to exchange {:?} failed: {}", self.exchange, words(&e));
                let failure = SinkFailure {
                    kind: FailureKind::Transient,
                    destination: routing_key,
                    partition: None,
                    event_id: Some(event_id),
                    cause: cause.clone(),
                };
                self.complete(tag, Err(failure));
                self.break_with(cause);
            }
        }
    }

    /// The sink is broken: everything waiting fails now, later records as they come.
    fn break_with(&mut self, cause: String) {
        if self.broken.is_none() {
            warn!(exchange = %self.exchange, cause = %cause, "RabbitMQ publisher broken; the relay will replay");
            self.broken = Some(cause.clone());
        }
        let waiting: Vec<Outgoing<Tag>> = self.waiting.drain().flat_map(|(_, q)| q).collect();
        for outgoing in waiting {
            let failure = outgoing.failure(FailureKind::Transient, format!("not published: {cause}"));
            self.complete(outgoing.tag, Err(failure));
        }
    }

    async fn confirmed(&mut self, seq: u64, confirmation: lapin::Result<Confirmation>) {
        let Some(sent) = self.in_flight.remove(&seq) else {
            return;
        };
        let failure = |kind, cause: String| SinkFailure {
            kind,
            destination: sent.routing_key.clone(),
            partition: None,
            event_id: Some(sent.event_id.clone()),
            cause,
        };
        let outcome = match confirmation {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(failure(
                FailureKind::Refused,
                format!(
                    "unroutable: exchange {:?} has no queue bound for routing key {:?} (the broker returned it: {} \
                     {}); bind a queue whose pattern matches, or route the event elsewhere",
                    self.exchange, sent.routing_key, returned.reply_code, returned.reply_text
                ),
            )),
            Ok(Confirmation::Nack(_)) => Err(failure(
                FailureKind::Transient,
                format!(
                    "RabbitMQ nacked the message (it could not store it in every queue bound for routing key {:?})",
                    sent.routing_key
                ),
            )),
            Ok(Confirmation::NotRequested) => Err(failure(
                FailureKind::Transient,
                "the channel is not in confirm mode".into(),
            )),
            Err(e) => Err(failure(
                FailureKind::Transient,
                format!("no confirm from RabbitMQ: {}", words(&e)),
            )),
        };
        let failed = outcome.as_ref().err().map(|f| (f.kind, f.cause.clone()));
        if matches!(failed, Some((FailureKind::Refused, _))) {
            self.fence
                .close_then(KeyHash::of(&sent.key), || self.complete(sent.tag, outcome));
        } else {
            self.complete(sent.tag, outcome);
        }
        match failed {
            Some((FailureKind::Transient, cause)) => {
                self.break_with(cause);
                return;
            }
            Some((FailureKind::Refused, cause)) => {
                // What waits behind a refused record of its aggregate is not published: the
                // caller ends its session on a refusal and replays them after deciding about
                // this one, so publishing them now would only store them ahead of it (and
                // twice). Records of the key handed over later meet the closed fence.
                let behind = self.waiting.remove(&sent.key).unwrap_or_default();
                for outgoing in behind {
                    let failure = outgoing.failure(
                        FailureKind::Transient,
                        format!("not published: an earlier record of the same key was refused ({cause})"),
                    );
                    self.complete(outgoing.tag, Err(failure));
                }
                return;
            }
            None => {}
        }
        // The key's next record, if any, goes now.
        let next = match self.waiting.get_mut(&sent.key) {
            Some(queue) => queue.pop_front(),
            None => None,
        };
        match next {
            Some(next) => {
                if let Some(cause) = &self.broken {
                    let failure = next.failure(FailureKind::Transient, cause.clone());
                    self.complete(next.tag, Err(failure));
                } else {
                    self.publish(next).await;
                }
            }
            None => {
                self.waiting.remove(&sent.key);
            }
        }
    }
}
