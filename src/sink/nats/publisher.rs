//! Publishing to JetStream: [`Sink::send`] checks a record on sight (subject, size against the
//! server's `max_payload`, header syntax), turns it into a message and queues it for a tokio
//! task that publishes in hand-over order on one connection and awaits the PubAcks pipelined,
//! sending one completion per record in whatever order the acks come.
//!
//! Failures: a lost connection fails everything in flight and everything queued as
//! `Transient` (the connection is never re-established: the next sink connects anew). Any
//! transient failure of one record (ack timeout, 503 no responders, a stream error) stops the
//! sink from publishing anything more: later records fail `Transient` without being sent, so
//! nothing handed over after the failed one is stored ahead of it, except what was already on
//! the wire (docs/sink-nats.md, "Order").

use std::collections::HashMap;
use std::future::IntoFuture;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::{Event, HeaderMap};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{checked_stream, connect, context};
use crate::config::nats::{filter_covers, validate_subject, NatsSettings};
use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

/// The header the record's key travels in (NATS messages have no key of their own).
pub(crate) const KEY_HEADER: &str = "key";
/// The header the record's timestamp travels in: milliseconds since the Unix epoch, as text.
pub(crate) const TIMESTAMP_HEADER: &str = "timestamp";
/// JetStream's deduplication header.
pub(crate) const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// A record ready to publish.
struct Outgoing<Tag> {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
    tag: Box<Tag>,
    event_id: String,
    /// When `send` took it: a record that waited longer than the ack timeout is not sent.
    queued_at: Instant,
    key: KeyHash,
}

/// What a completion needs of a record once it is on the wire.
struct InFlight<Tag> {
    subject: String,
    event_id: String,
    tag: Box<Tag>,
    key: KeyHash,
}

pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    queue: mpsc::UnboundedSender<Outgoing<Tag>>,
    /// The stream's subject filters: a subject outside them is refused on sight.
    subjects: Arc<Vec<String>>,
    stream: String,
    /// The server's `max_payload` (headers and payload), from its INFO.
    max_payload: usize,
    /// `Some(wait)`: abandoned, with how long to wait for what is on the wire.
    stop: watch::Sender<Option<Duration>>,
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    /// Keys with a refused record the caller has not released (closed by the task).
    fence: Arc<KeyFence>,
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// Connects, checks the stream, and spawns the publishing task on the current runtime.
    pub(crate) async fn create(
        settings: &NatsSettings,
        max_in_flight: usize,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let client = connect(settings, Some(events_tx)).await?;
        let max_payload = client.server_info().max_payload;
        if settings.max_payload > max_payload {
            warn!(
                configured = settings.max_payload,
                server = max_payload,
                "[nats] max_payload is larger than the server's: events between the two are refused as bad events \
                 and dead letters may not fit; set [nats] max_payload = {max_payload}"
            );
        }
        let js = context(client, settings, max_in_flight);
        let info = checked_stream(&js, settings).await?;
        let (queue, queued) = mpsc::unbounded_channel();
        let (completions_tx, completions) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(None);
        let (done_tx, done) = std::sync::mpsc::channel();
        let fence = Arc::new(KeyFence::default());
        let task = Task {
            fence: Arc::clone(&fence),
            js,
            stream: settings.stream.clone(),
            completions: completions_tx,
            in_flight: HashMap::new(),
            next: 0,
            failed: None,
            ack_timeout: settings.ack_timeout,
            saw_duplicate: false,
        };
        tokio::spawn(async move {
            task.run(queued, events, stopped).await;
            let _ = done_tx.send(());
        });
        debug!(stream = %settings.stream, max_payload, url = %settings.url, "NATS publisher connected");
        Ok((
            Publisher {
                queue,
                subjects: Arc::new(info.config.subjects),
                stream: settings.stream.clone(),
                max_payload,
                stop,
                done: std::sync::Mutex::new(done),
                fence,
            },
            completions,
        ))
    }

    /// The record as a NATS message, or why it can never be published.
    fn message(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
    ) -> Result<(HeaderMap, Bytes), String> {
        let subject = &*record.destination;
        validate_subject(subject, false).map_err(|m| format!("subject {subject:?} {m}"))?;
        if !self.subjects.iter().any(|f| filter_covers(f, subject)) {
            return Err(format!(
                "no subject of stream {:?} ({:?}) covers {subject:?}, so no stream would store it",
                self.stream, self.subjects
            ));
        }
        let mut pairs: Vec<(&str, &[u8])> = Vec::with_capacity(4 + record.headers.len() + extra.len());
        pairs.push(("id", record.event_id));
        pairs.extend(
            record
                .headers_with(extra)
                .map(|(name, value)| (name, value.unwrap_or_default())),
        );
        pairs.push((KEY_HEADER, &record.key));
        let timestamp = record.timestamp_ms.map(|ts| ts.to_string());
        if let Some(ts) = &timestamp {
            pairs.push((TIMESTAMP_HEADER, ts.as_bytes()));
        }
        if let Some(id) = dedup_key {
            pairs.push((MSG_ID_HEADER, id.as_bytes()));
        }
        let payload = record.value.as_deref().unwrap_or_default();
        // As the server counts it: "NATS/1.0\r\n", "name: value\r\n" each, "\r\n", the payload.
        let size = 12 + pairs.iter().map(|(n, v)| n.len() + v.len() + 4).sum::<usize>() + payload.len();
        if size > self.max_payload {
            return Err(format!(
                "the message is {size} bytes with its headers, more than the server's max_payload of {} bytes",
                self.max_payload
            ));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            let header_name = HeaderName::from_str(name)
                .map_err(|_| format!("header name {name:?} is not a valid NATS header name"))?;
            let text = std::str::from_utf8(value)
                .map_err(|_| format!("header {name:?} is not UTF-8 text, which NATS headers must be"))?;
            let header_value = HeaderValue::from_str(text)
                .map_err(|_| format!("header {name:?} contains a line break, which NATS headers may not"))?;
            headers.append(header_name, header_value);
        }
        Ok((headers, Bytes::copy_from_slice(payload)))
    }

    fn abandon_now(&self, wait: Duration) {
        let _ = self.stop.send(Some(wait));
        // Crash tests: die while the abandoned sink's publishes may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        // The task waits at most `wait` itself; the margin covers its wind-down.
        if done.recv_timeout(wait + Duration::from_millis(200)).is_err() {
            warn!(stream = %self.stream, "abandoned NATS publisher did not stop in time");
        }
    }
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for Publisher<Tag> {
    /// `dedup_key` becomes the `Nats-Msg-Id` header: JetStream drops a message whose id it
    /// stored within the stream's duplicate window, and acks it as a duplicate.
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        let event_id = String::from_utf8_lossy(record.event_id).into_owned();
        let refusal = |tag, kind, cause| Refusal {
            tag,
            failure: SinkFailure {
                kind,
                destination: record.destination.to_string(),
                partition: None,
                event_id: Some(event_id.clone()),
                cause,
            },
        };
        let (headers, payload) = match self.message(record, extra, dedup_key) {
            Ok(message) => message,
            Err(cause) => return Err(refusal(tag, FailureKind::Refused, cause)),
        };
        self.queue
            .send(Outgoing {
                subject: record.destination.to_string(),
                headers,
                payload,
                tag,
                event_id: event_id.clone(),
                queued_at: Instant::now(),
                key: KeyHash::of(&record.key),
            })
            .map_err(|e| {
                refusal(
                    e.0.tag,
                    FailureKind::Transient,
                    "the NATS publisher has stopped (connection lost)".into(),
                )
            })
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        self.abandon_now(wait);
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }
}

type Acked = BoxFuture<
    'static,
    (
        u64,
        Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
    ),
>;

struct Task<Tag> {
    js: jetstream::Context,
    stream: String,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    in_flight: HashMap<u64, InFlight<Tag>>,
    next: u64,
    /// Set at the first failure: nothing is published after it.
    failed: Option<String>,
    ack_timeout: Duration,
    /// Whether a duplicate PubAck was logged already (once per sink).
    saw_duplicate: bool,
    /// Keys with a refused record the caller has not released: their records are not sent.
    fence: Arc<KeyFence>,
}

impl<Tag: Send + Sync + 'static> Task<Tag> {
    async fn run(
        mut self,
        mut queued: mpsc::UnboundedReceiver<Outgoing<Tag>>,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut stop: watch::Receiver<Option<Duration>>,
    ) {
        // Dropped without abandon: wait as long as an ack may take.
        let mut wait = self.ack_timeout;
        let mut acks: FuturesUnordered<Acked> = FuturesUnordered::new();
        let mut events_open = true;
        loop {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_ok() {
                        wait = stop.borrow().unwrap_or(wait);
                    }
                    break;
                }
                event = events.recv(), if events_open => match event {
                    Some(Event::Disconnected | Event::Closed) | Some(Event::ClientError(_)) => {
                        let cause = format!("connection to NATS lost ({})", event.map(|e| e.to_string()).unwrap_or_default());
                        // No ack can come any more on this connection: fail what is in flight.
                        acks.clear();
                        self.fail(cause);
                        self.fail_in_flight();
                    }
                    Some(event @ Event::ServerError(_)) => warn!(stream = %self.stream, %event, "NATS server error"),
                    Some(event) => debug!(%event, "NATS client event"),
                    None => events_open = false,
                },
                Some((n, result)) = acks.next(), if !acks.is_empty() => self.complete(n, result),
                next = queued.recv() => match next {
                    Some(out) => {
                        if let Some(ack) = self.publish(out).await {
                            acks.push(ack);
                        }
                    }
                    None => break,
                },
            }
        }
        // Abandoned (or the sink dropped): drop what is queued, wait (bounded by the ack
        // timeout) for what is on the wire, so a replay cannot be overtaken by stragglers.
        queued.close();
        while queued.try_recv().is_ok() {}
        let drain = async {
            while let Some((n, result)) = acks.next().await {
                self.complete(n, result);
            }
        };
        if tokio::time::timeout(wait, drain).await.is_err() {
            debug!(stream = %self.stream, "abandoned NATS publisher gave up waiting for its acks");
        }
    }

    /// Publishes one record (hands it to the connection); `None` when it failed at once.
    async fn publish(&mut self, out: Outgoing<Tag>) -> Option<Acked> {
        if let Some(cause) = &self.failed {
            let cause = format!("not sent: an earlier record failed ({cause})");
            self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            return None;
        }
        if self.fence.is_closed(out.key) {
            let cause = stopped_cause();
            self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            return None;
        }
        let waited = out.queued_at.elapsed();
        if waited > self.ack_timeout {
            // A process frozen (or starved) this long may have been replaced by a standby that
            // replays: like librdkafka's message.timeout.ms, a stale record is not sent late.
            let cause = format!(
                "not sent: it waited {} ms in the queue, more than the ack timeout",
                waited.as_millis()
            );
            self.fail(cause.clone());
            self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            return None;
        }
        let n = self.next;
        self.next += 1;
        let publish = jetstream::message::PublishMessage::build()
            .payload(out.payload)
            .headers(out.headers);
        match self.js.send_publish(out.subject.clone(), publish).await {
            Ok(ack) => {
                self.in_flight.insert(
                    n,
                    InFlight {
                        subject: out.subject,
                        event_id: out.event_id,
                        tag: out.tag,
                        key: out.key,
                    },
                );
                Some(Box::pin(async move { (n, ack_future(ack).await) }))
            }
            Err(e) => {
                let cause = format!("publish failed: {e}");
                self.fail(cause.clone());
                self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
                None
            }
        }
    }

    fn complete(&mut self, n: u64, result: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>) {
        let Some(rec) = self.in_flight.remove(&n) else {
            return; // failed already (connection lost)
        };
        let outcome = match result {
            Ok(ack) if ack.stream == self.stream => {
                if ack.duplicate && !self.saw_duplicate {
                    self.saw_duplicate = true;
                    info!(
                        stream = %self.stream,
                        sequence = ack.sequence,
                        "JetStream acknowledged a replayed record as a duplicate (its Nats-Msg-Id is in the stream's \
                         duplicate window): counted as delivered, not stored again"
                    );
                }
                Ok(())
            }
            Ok(ack) => Err((
                FailureKind::Transient,
                format!(
                    "stored in stream {:?}, not {:?}: check the streams' subjects",
                    ack.stream, self.stream
                ),
            )),
            Err(e) => {
                let kind = classify(&e);
                let cause = match e.kind() {
                    PublishErrorKind::StreamNotFound => format!(
                        "no responders: JetStream has no stream for the subject right now (503): {e}; is stream {:?} there?",
                        self.stream
                    ),
                    _ => e.to_string(),
                };
                Err((kind, cause))
            }
        };
        match &outcome {
            Err((FailureKind::Transient, cause)) => self.fail(cause.clone()),
            Err((FailureKind::Refused, _)) => {
                // Later records of the key wait for the caller's decision (`sink/fence.rs`).
                let fence = Arc::clone(&self.fence);
                fence.close_then(rec.key, || {
                    self.send_completion(rec.tag, rec.subject, rec.event_id, outcome);
                });
                return;
            }
            Ok(()) => {}
        }
        self.send_completion(rec.tag, rec.subject, rec.event_id, outcome);
    }

    fn fail(&mut self, cause: String) {
        if self.failed.is_none() {
            warn!(stream = %self.stream, %cause, "NATS publisher failed; it sends nothing more");
            self.failed = Some(cause);
        }
    }

    fn fail_in_flight(&mut self) {
        let cause = self.failed.clone().unwrap_or_default();
        let mut pending: Vec<(u64, InFlight<Tag>)> = self.in_flight.drain().collect();
        pending.sort_by_key(|(n, _)| *n);
        for (_, rec) in pending {
            self.send_completion(
                rec.tag,
                rec.subject,
                rec.event_id,
                Err((FailureKind::Transient, cause.clone())),
            );
        }
    }

    fn send_completion(
        &self,
        tag: Box<Tag>,
        subject: String,
        event_id: String,
        outcome: Result<(), (FailureKind, String)>,
    ) {
        let outcome = outcome.map_err(|(kind, cause)| SinkFailure {
            kind,
            destination: subject,
            partition: None,
            event_id: Some(event_id),
            cause,
        });
        // The receiver is gone only once the sink was abandoned; nothing to do then.
        let _ = self.completions.send(Completion { tag, outcome });
    }
}

async fn ack_future(ack: PublishAckFuture) -> Result<jetstream::publish::PublishAck, jetstream::context::PublishError> {
    ack.into_future().await
}

/// Refused (the record itself can never be stored: larger than the stream's `max_msg_size`) or
/// transient (everything else: timeouts, 503 no responders, a full stream, a lost connection).
fn classify(e: &jetstream::context::PublishError) -> FailureKind {
    let code = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|j| j.error_code());
    if code == Some(jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) {
        FailureKind::Refused
    } else {
        FailureKind::Transient
    }
}
