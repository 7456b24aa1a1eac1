//! Publishing to JetStream: [`Sink::send`] checks a record on sight (subject, size against the
//! server's `max_payload`, header syntax), turns it into a message and queues it for a tokio
//! task that publishes in hand-over order on one connection, each message with a reply subject
//! of the sink's own PubAck subscription (`<inbox>.<record number>`), and sends one completion
//! per record in whatever order the acks come. A record without its PubAck after
//! `ack_timeout_ms` fails (one timer checks the oldest on the wire).
//!
//! Failures: a lost connection fails everything in flight and everything queued as
//! `Transient` (the connection is never re-established: the next sink connects anew). Any
//! transient failure of one record (ack timeout, 503 no responders, a stream error) stops the
//! sink from publishing anything more: later records fail `Transient` without being sent, so
//! nothing handed over after the failed one is stored ahead of it, except what was already on
//! the wire (docs/sink-nats.md, "Order").

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::response::Response;
use async_nats::{Client, Event, HeaderMap, Message, StatusCode, Subscriber};
use bytes::Bytes;
use futures_util::stream::StreamExt;
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
/// async-nats's default queue of a subscription, in messages.
const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 64 * 1024;
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
    /// When it went to the connection: the ack timeout counts from here.
    sent_at: Instant,
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
        // Every PubAck on the wire may wait in the reply subscription's queue at once: a full
        // queue would drop acks (a slow consumer), so it holds the whole in-flight budget.
        let capacity = max_in_flight.saturating_add(1024).max(DEFAULT_SUBSCRIPTION_CAPACITY);
        let client = connect(settings, Some(events_tx), Some(capacity)).await?;
        let max_payload = client.server_info().max_payload;
        if settings.max_payload > max_payload {
            warn!(
                configured = settings.max_payload,
                server = max_payload,
                "[nats] max_payload is larger than the server's: events between the two are refused as bad events \
                 and dead letters may not fit; set [nats] max_payload = {max_payload}"
            );
        }
        let js = context(client.clone(), settings);
        let info = checked_stream(&js, settings).await?;
        // One subscription for every PubAck of this sink: `<inbox>.<record number>`. Publishing
        // with a reply subject of our own instead of JetStream's request API saves a timer, a
        // channel and an inbox per record (about half the sink's CPU per record).
        let reply_prefix = format!("{}.", client.new_inbox());
        let replies = client
            .subscribe(format!("{reply_prefix}*"))
            .await
            .map_err(|e| SinkError {
                sink: super::SINK,
                cause: format!("cannot subscribe to PubAcks: {e}"),
                transient: true,
            })?;
        let (queue, queued) = mpsc::unbounded_channel();
        let (completions_tx, completions) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(None);
        let (done_tx, done) = std::sync::mpsc::channel();
        let fence = Arc::new(KeyFence::default());
        let task = Task {
            fence: Arc::clone(&fence),
            client,
            reply_prefix,
            stream: settings.stream.clone(),
            completions: completions_tx,
            in_flight: BTreeMap::new(),
            next: 0,
            failed: None,
            ack_timeout: settings.ack_timeout,
            saw_duplicate: false,
        };
        tokio::spawn(async move {
            task.run(queued, replies, events, stopped).await;
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
        let timestamp = record.timestamp_ms.map(|ts| {
            let mut text = String::with_capacity(20);
            push_decimal(&mut text, ts.into());
            text
        });
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
            let header_name = match name {
                // The sink's own names need no check and no copy.
                "id" => HeaderName::from_static("id"),
                KEY_HEADER => HeaderName::from_static(KEY_HEADER),
                TIMESTAMP_HEADER => HeaderName::from_static(TIMESTAMP_HEADER),
                MSG_ID_HEADER => HeaderName::from_static(MSG_ID_HEADER),
                _ => HeaderName::from_str(name)
                    .map_err(|_| format!("header name {name:?} is not a valid NATS header name"))?,
            };
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

struct Task<Tag> {
    client: Client,
    /// `<prefix>.` of every reply subject this sink asks for: the record's number follows.
    reply_prefix: String,
    stream: String,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    /// By record number, so the first entry is the oldest on the wire.
    in_flight: BTreeMap<u64, InFlight<Tag>>,
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
        mut replies: Subscriber,
        mut events: mpsc::UnboundedReceiver<Event>,
        mut stop: watch::Receiver<Option<Duration>>,
    ) {
        // Dropped without abandon: wait as long as an ack may take.
        let mut wait = self.ack_timeout;
        let mut events_open = true;
        // One timer for every ack timeout (not one per record): it only runs while something is
        // on the wire, so an idle sink never wakes.
        let mut overdue = tokio::time::interval(self.ack_check_period());
        overdue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                        // No ack can come any more on this connection: fail what is in flight.
                        self.lost(format!("connection to NATS lost ({})", event.map(|e| e.to_string()).unwrap_or_default()));
                    }
                    // The client dropped replies it could not queue: which acks are gone is
                    // unknown, so nothing in flight can be trusted to complete.
                    Some(event @ Event::SlowConsumer(_)) => self.lost(format!("PubAcks dropped by the client ({event})")),
                    Some(event @ Event::ServerError(_)) => warn!(stream = %self.stream, %event, "NATS server error"),
                    Some(event) => debug!(%event, "NATS client event"),
                    None => events_open = false,
                },
                Some(reply) = replies.next() => self.reply(&reply),
                _ = overdue.tick(), if !self.in_flight.is_empty() => self.time_out_overdue(),
                next = queued.recv() => match next {
                    Some(out) => self.publish(out).await,
                    None => break,
                },
            }
        }
        // Abandoned (or the sink dropped): drop what is queued, wait (bounded by the ack
        // timeout) for what is on the wire, so a replay cannot be overtaken by stragglers.
        queued.close();
        while queued.try_recv().is_ok() {}
        let drain = async {
            while !self.in_flight.is_empty() {
                match replies.next().await {
                    Some(reply) => self.reply(&reply),
                    None => break,
                }
            }
        };
        if tokio::time::timeout(wait, drain).await.is_err() {
            debug!(stream = %self.stream, "abandoned NATS publisher gave up waiting for its acks");
        }
    }

    /// How often the oldest record on the wire is checked against the ack timeout.
    fn ack_check_period(&self) -> Duration {
        (self.ack_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Publishes one record (hands it to the connection), asking for its PubAck on a reply
    /// subject of this sink's subscription.
    async fn publish(&mut self, out: Outgoing<Tag>) {
        if let Some(cause) = &self.failed {
            let cause = format!("not sent: an earlier record failed ({cause})");
            self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            return;
        }
        if self.fence.is_closed(out.key) {
            let cause = stopped_cause();
            self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            return;
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
            return;
        }
        let n = self.next;
        self.next += 1;
        let mut reply = String::with_capacity(self.reply_prefix.len() + 20);
        reply.push_str(&self.reply_prefix);
        push_decimal(&mut reply, n.into());
        // The publish borrows the client: settled before anything else touches `self`.
        let sent = {
            let publish =
                self.client
                    .publish_with_reply_and_headers(out.subject.clone(), reply, out.headers, out.payload);
            let mut publish = std::pin::pin!(publish);
            // The client's command queue has room unless the connection is stuck: then the wait is
            // bounded, like an ack. The timer only for that case (a timeout on every publish cost 4 %
            // of the relay's instructions draining; docs/benchmarks.md).
            match futures_util::poll!(publish.as_mut()) {
                std::task::Poll::Ready(sent) => sent.map_err(|e| e.to_string()),
                std::task::Poll::Pending => match tokio::time::timeout(self.ack_timeout, publish).await {
                    Ok(sent) => sent.map_err(|e| e.to_string()),
                    Err(_) => Err(format!(
                        "the connection took no message for the ack timeout ({} ms)",
                        self.ack_timeout.as_millis()
                    )),
                },
            }
        };
        match sent {
            Ok(()) => {
                self.in_flight.insert(
                    n,
                    InFlight {
                        subject: out.subject,
                        event_id: out.event_id,
                        tag: out.tag,
                        key: out.key,
                        sent_at: Instant::now(),
                    },
                );
            }
            Err(e) => {
                let cause = format!("publish failed: {e}");
                self.fail(cause.clone());
                self.send_completion(out.tag, out.subject, out.event_id, Err((FailureKind::Transient, cause)));
            }
        }
    }

    /// A message on the reply subscription: the PubAck (or the server's refusal) of one record.
    fn reply(&mut self, reply: &Message) {
        let Some(n) = reply
            .subject
            .strip_prefix(self.reply_prefix.as_str())
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return;
        };
        let Some(rec) = self.in_flight.remove(&n) else {
            return; // failed already (timed out or connection lost)
        };
        let outcome = self.outcome(reply);
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

    /// What a reply says of its record: stored (or a duplicate of a stored one), refused for
    /// good, or failed for now.
    fn outcome(&mut self, reply: &Message) -> Result<(), (FailureKind, String)> {
        if reply.status == Some(StatusCode::NO_RESPONDERS) {
            return Err((
                FailureKind::Transient,
                format!(
                    "no responders: JetStream has no stream for the subject right now (503); is stream {:?} there?",
                    self.stream
                ),
            ));
        }
        if let Some(status) = reply.status.filter(|s| !s.is_success()) {
            let what = reply.description.as_deref().unwrap_or_default();
            return Err((FailureKind::Transient, format!("the server answered {status} {what}")));
        }
        // Nearly every reply is a plain PubAck: read it without async-nats's untagged response
        // type, whose deserializer buffers the whole document first (10 % of the relay's
        // instructions draining into NATS; docs/benchmarks.md). Anything else — an error, a
        // duplicate (logged with its sequence), escapes in the name — takes the full parse.
        if plain_ack_of(&reply.payload, &self.stream) {
            return Ok(());
        }
        match serde_json::from_slice::<Response<PublishAck>>(&reply.payload) {
            Ok(Response::Ok(ack)) if ack.stream == self.stream => {
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
            Ok(Response::Ok(ack)) => Err((
                FailureKind::Transient,
                format!(
                    "stored in stream {:?}, not {:?}: check the streams' subjects",
                    ack.stream, self.stream
                ),
            )),
            Ok(Response::Err { error }) => Err((classify(&error), format!("JetStream refused it: {error}"))),
            Err(e) => Err((
                FailureKind::Transient,
                format!(
                    "unreadable PubAck ({e}): {:?}",
                    String::from_utf8_lossy(&reply.payload[..reply.payload.len().min(200)])
                ),
            )),
        }
    }

    /// Records on the wire longer than the ack timeout fail (transient), and with them the sink.
    fn time_out_overdue(&mut self) {
        while let Some(entry) = self.in_flight.first_entry() {
            let waited = entry.get().sent_at.elapsed();
            if waited <= self.ack_timeout {
                break;
            }
            let rec = entry.remove();
            let cause = format!("no PubAck within the ack timeout ({} ms)", self.ack_timeout.as_millis());
            self.fail(cause.clone());
            self.send_completion(rec.tag, rec.subject, rec.event_id, Err((FailureKind::Transient, cause)));
        }
    }

    /// The connection (or its replies) can no longer be trusted: fail it all.
    fn lost(&mut self, cause: String) {
        self.fail(cause);
        let cause = self.failed.clone().unwrap_or_default();
        // In record order, as they were handed over.
        for (_, rec) in std::mem::take(&mut self.in_flight) {
            self.send_completion(
                rec.tag,
                rec.subject,
                rec.event_id,
                Err((FailureKind::Transient, cause.clone())),
            );
        }
    }

    fn fail(&mut self, cause: String) {
        if self.failed.is_none() {
            warn!(stream = %self.stream, %cause, "NATS publisher failed; it sends nothing more");
            self.failed = Some(cause);
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

/// Whether `payload` is a plain PubAck from `stream`: `{"stream":"<stream>",` and neither an
/// `"error"` nor a `"duplicate"` key (names cannot hold an unescaped `"`, so those keys cannot hide
/// in a value). `false` only means "read it in full".
fn plain_ack_of(payload: &[u8], stream: &str) -> bool {
    const PREFIX: &[u8] = b"{\"stream\":\"";
    let has = |needle: &[u8]| payload.windows(needle.len()).any(|w| w == needle);
    payload
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix(stream.as_bytes()))
        .is_some_and(|rest| rest.starts_with(b"\","))
        && !has(b"\"error\"")
        && !has(b"\"duplicate\"")
}

/// Appends `n` in decimal (what `to_string` gives, without the formatting machinery: it runs
/// for every record).
fn push_decimal(out: &mut String, n: i128) {
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push('-');
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// Refused (the record itself can never be stored: larger than the stream's `max_msg_size`) or
/// transient (everything else: timeouts, 503 no responders, a full stream, a lost connection).
fn classify(e: &jetstream::Error) -> FailureKind {
    if e.error_code() == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM {
        FailureKind::Refused
    } else {
        FailureKind::Transient
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn decimals_are_what_to_string_gives() {
        for n in [
            0i128,
            7,
            10,
            99,
            1_700_000_000_123,
            -1,
            -1_234,
            i64::MAX.into(),
            i64::MIN.into(),
            u64::MAX.into(),
        ] {
            let mut text = String::from("x.");
            push_decimal(&mut text, n);
            assert_eq!(text, format!("x.{n}"));
        }
    }

    #[test]
    fn only_a_plain_ack_takes_the_short_parse() {
        let plain = |json: &str| plain_ack_of(json.as_bytes(), "S");
        assert!(plain(r#"{"stream":"S","seq":12}"#));
        assert!(plain(r#"{"stream":"S","domain":"hub","seq":12}"#));
        assert!(!plain(r#"{"stream":"S","seq":12,"duplicate":true}"#));
        assert!(!plain(r#"{"stream":"SS","seq":12}"#), "another stream");
        assert!(!plain(r#"{"stream":"S"}"#), "no sequence");
        assert!(!plain(
            r#"{"error":{"code":503,"err_code":10077,"description":"x"},"stream":"S"}"#
        ));
        assert!(!plain(r#"{"stream":"S","error":{"code":400}}"#));
        assert!(
            !plain(r#"{"stream":"\u0053","seq":1}"#),
            "escaped: the full parse decides"
        );
        assert!(!plain(r#"{"seq":1}"#));
    }
}
