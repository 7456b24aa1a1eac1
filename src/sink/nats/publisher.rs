//! Publishing to JetStream, run by the shared driver (`sink/driver.rs`, pipelined): `encode`
//! checks a record on sight (subject, size against the server's `max_payload`, header syntax)
//! and turns it into a message; `send` publishes it on the one connection, in hand-over order,
//! with a reply subject of the sink's own PubAck subscription (`<inbox>.<record number>`), and
//! hands back the future of that PubAck; `classify` reads it. A demultiplexing task routes each
//! PubAck to its record. A record without its PubAck after `ack_timeout_ms` fails (the driver's
//! reply timeout).
//!
//! Failures: a lost connection (or PubAcks the client dropped) fails everything in flight as
//! `Transient` (the connection is never re-established: the next sink connects anew). Any
//! transient failure of one record (ack timeout, 503 no responders, a stream error) stops the
//! driver from sending anything more: later records fail `Transient` without being sent, so
//! nothing handed over after the failed one is stored ahead of it, except what was already on
//! the wire (docs/sink-nats.md, "Order").

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::response::Response;
use async_nats::{Client, Event, HeaderMap, Message, StatusCode, Subscriber};
use bytes::Bytes;
use futures_util::stream::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::{checked_stream, connect, context};
use crate::config::nats::{filter_covers, validate_subject, NatsSettings};
use crate::sink::driver::{self, Concurrency, Driven, DriverOptions, Exchange, Outcome, ReplyFuture};
use crate::sink::{Completions, FailureKind, SinkError, SinkRecord};

/// The header the record's key travels in (NATS messages have no key of their own).
pub(crate) const KEY_HEADER: &str = "key";
/// The header the record's timestamp travels in: milliseconds since the Unix epoch, as text.
pub(crate) const TIMESTAMP_HEADER: &str = "timestamp";
/// async-nats's default queue of a subscription, in messages.
const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 64 * 1024;
/// JetStream's deduplication header.
pub(crate) const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// The JetStream sink: the driver running a [`NatsExchange`].
pub(crate) type Publisher<Tag> = Driven<NatsExchange, Tag>;

/// A record ready to publish.
pub(crate) struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// What a PubAck's future resolves to: the reply, or why none can come.
pub(crate) type Reply = Result<Message, String>;

/// The records waiting for their PubAck, by record number, and why none can come any more.
#[derive(Default)]
struct Waiting {
    acks: HashMap<u64, oneshot::Sender<Message>>,
    /// Set once the connection (or its replies) can no longer be trusted.
    lost: Option<String>,
}

/// The JetStream side of the driver.
pub(crate) struct NatsExchange {
    client: Client,
    /// `<prefix>.` of every reply subject this sink asks for: the record's number follows.
    reply_prefix: String,
    /// The stream's subject filters: a subject outside them is refused on sight.
    subjects: Vec<String>,
    stream: String,
    /// The server's `max_payload` (headers and payload), from its INFO.
    max_payload: usize,
    ack_timeout: Duration,
    next: AtomicU64,
    waiting: Arc<Mutex<Waiting>>,
    /// Whether a duplicate PubAck was logged already (once per sink).
    saw_duplicate: AtomicBool,
    /// Dropped with the exchange: ends the demultiplexing task.
    _demux: oneshot::Sender<()>,
}

impl<Tag: Send + Sync + 'static> Driven<NatsExchange, Tag> {
    /// Connects, checks the stream, and starts the driver and the PubAck demultiplexer on the
    /// current runtime.
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
        // with a reply subject of our own instead of JetStream's request API saves a timer, an
        // inbox and a subscription per record.
        let reply_prefix = format!("{}.", client.new_inbox());
        let replies = client
            .subscribe(format!("{reply_prefix}*"))
            .await
            .map_err(|e| SinkError {
                sink: super::SINK,
                cause: format!("cannot subscribe to PubAcks: {e}"),
                transient: true,
            })?;
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let (demux_stop, demux_stopped) = oneshot::channel();
        tokio::spawn(demux(
            replies,
            events,
            reply_prefix.clone(),
            settings.stream.clone(),
            Arc::clone(&waiting),
            demux_stopped,
        ));
        debug!(stream = %settings.stream, max_payload, url = %settings.url, "NATS publisher connected");
        let exchange = NatsExchange {
            client,
            reply_prefix,
            subjects: info.config.subjects,
            stream: settings.stream.clone(),
            max_payload,
            ack_timeout: settings.ack_timeout,
            next: AtomicU64::new(0),
            waiting,
            saw_duplicate: AtomicBool::new(false),
            _demux: demux_stop,
        };
        Ok(driver::start(
            Arc::new(exchange),
            DriverOptions {
                concurrency: Concurrency::Pipelined,
                max_in_flight: max_in_flight.max(1),
                max_in_flight_bytes: usize::MAX,
                reply_timeout: Some(settings.ack_timeout),
                // A process frozen (or starved) this long may have been replaced by a standby
                // that replays: like librdkafka's message.timeout.ms, a stale record is not sent.
                max_queue_wait: Some(settings.ack_timeout),
                // Dropped without abandon: wait as long as an ack may take.
                drop_wait: settings.ack_timeout,
            },
        ))
    }
}

/// Routes each PubAck on the reply subscription to its record's future; on a lost connection
/// (or PubAcks the client dropped) fails every record waiting. Ends when the exchange is gone.
async fn demux(
    mut replies: Subscriber,
    mut events: mpsc::UnboundedReceiver<Event>,
    reply_prefix: String,
    stream: String,
    waiting: Arc<Mutex<Waiting>>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut events_open = true;
    let lost = |cause: String| {
        let mut w = waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if w.lost.is_none() {
            warn!(stream = %stream, %cause, "NATS publisher failed; it sends nothing more");
            w.lost = Some(cause);
        }
        // Dropping the senders fails each waiting record with `lost`.
        w.acks.clear();
    };
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            event = events.recv(), if events_open => match event {
                Some(Event::Disconnected | Event::Closed) | Some(Event::ClientError(_)) => {
                    // No ack can come any more on this connection: fail what is in flight.
                    lost(format!("connection to NATS lost ({})", event.map(|e| e.to_string()).unwrap_or_default()));
                }
                // The client dropped replies it could not queue: which acks are gone is
                // unknown, so nothing in flight can be trusted to complete.
                Some(event @ Event::SlowConsumer(_)) => lost(format!("PubAcks dropped by the client ({event})")),
                Some(event @ Event::ServerError(_)) => warn!(stream = %stream, %event, "NATS server error"),
                Some(event) => debug!(%event, "NATS client event"),
                None => events_open = false,
            },
            reply = replies.next() => match reply {
                Some(reply) => {
                    let Some(n) = reply
                        .subject
                        .strip_prefix(reply_prefix.as_str())
                        .and_then(|n| n.parse::<u64>().ok())
                    else {
                        continue;
                    };
                    let ack = waiting
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .acks
                        .remove(&n);
                    // None: failed already (timed out or connection lost).
                    if let Some(ack) = ack {
                        let _ = ack.send(reply);
                    }
                }
                None => {
                    lost("the PubAck subscription ended".into());
                    break;
                }
            },
        }
    }
}

impl NatsExchange {
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

    /// What a reply says of its record: stored (or a duplicate of a stored one), refused for
    /// good, or failed for now.
    fn outcome(&self, reply: &Message) -> Result<(), (FailureKind, String)> {
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
                if ack.duplicate && !self.saw_duplicate.swap(true, Ordering::Relaxed) {
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
}

impl Exchange for NatsExchange {
    type Request = Outgoing;
    type Reply = Reply;

    fn name(&self) -> &'static str {
        super::SINK
    }

    fn reply_name(&self) -> &'static str {
        "PubAck"
    }

    /// `dedup_key` becomes the `Nats-Msg-Id` header: JetStream drops a message whose id it
    /// stored within the stream's duplicate window, and acks it as a duplicate.
    fn encode(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
    ) -> Result<Outgoing, String> {
        let (headers, payload) = self.message(record, extra, dedup_key)?;
        Ok(Outgoing {
            subject: record.destination.to_string(),
            headers,
            payload,
        })
    }

    /// Publishes one record (hands it to the connection), asking for its PubAck on a reply
    /// subject of this sink's subscription.
    async fn send(&self, out: Outgoing) -> Result<ReplyFuture<Reply>, String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (ack_tx, ack) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(cause) = &waiting.lost {
                return Err(cause.clone());
            }
            waiting.acks.insert(n, ack_tx);
        }
        let mut reply = String::with_capacity(self.reply_prefix.len() + 20);
        reply.push_str(&self.reply_prefix);
        push_decimal(&mut reply, n.into());
        let publish = self
            .client
            .publish_with_reply_and_headers(out.subject, reply, out.headers, out.payload);
        let mut publish = std::pin::pin!(publish);
        // The client's command queue has room unless the connection is stuck: then the wait is
        // bounded, like an ack. The timer only for that case (a timeout on every publish cost 4 %
        // of the relay's instructions draining; docs/benchmarks.md).
        let sent = match futures_util::poll!(publish.as_mut()) {
            std::task::Poll::Ready(sent) => sent.map_err(|e| e.to_string()),
            std::task::Poll::Pending => match tokio::time::timeout(self.ack_timeout, publish).await {
                Ok(sent) => sent.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "the connection took no message for the ack timeout ({} ms)",
                    self.ack_timeout.as_millis()
                )),
            },
        };
        if let Err(e) = sent {
            self.waiting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .acks
                .remove(&n);
            return Err(format!("publish failed: {e}"));
        }
        let waiting = Arc::clone(&self.waiting);
        Ok(Box::pin(async move {
            ack.await.map_err(|_| {
                waiting
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .lost
                    .clone()
                    .unwrap_or_else(|| "the NATS publisher has stopped (connection lost)".into())
            })
        }))
    }

    fn classify(&self, reply: Reply) -> Outcome {
        match reply
            .map_err(|cause| (FailureKind::Transient, cause))
            .and_then(|m| self.outcome(&m))
        {
            Ok(()) => Outcome::Acknowledged,
            Err((FailureKind::Refused, cause)) => Outcome::Refused(cause),
            Err((FailureKind::Transient, cause)) => Outcome::Transient(cause),
        }
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
