//! Publishing to JetStream on the shared driver (`sink/driver.rs`, a [`Protocol`] sink):
//! [`JetStream::encode`] checks a record on sight (subject, size against the server's
//! `max_payload`, header syntax) and turns it into a message; the driver publishes in hand-over
//! order on one connection ([`AckStream::write`]), each message with a reply subject of the
//! sink's own PubAck subscription (`<inbox>.<record number>`), and reads every PubAck from that
//! one subscription ([`AckStream::next`]) — no future, channel or lock per record. The driver
//! sends one completion per record in whatever order the acks come; a record without its
//! PubAck after `ack_timeout_ms` fails (one timer checks the oldest on the wire).
//!
//! Failures: a lost connection fails everything in flight and everything queued as
//! `Transient` (the connection is never re-established: the next sink connects anew). Any
//! transient failure of one record (ack timeout, 503 no responders, a stream error) stops the
//! sink from publishing anything more: later records fail `Transient` without being sent, so
//! nothing handed over after the failed one is stored ahead of it, except what was already on
//! the wire (docs/sink-nats.md, "Order").

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::response::Response;
use async_nats::{Client, Event, HeaderMap, Message, StatusCode, Subscriber};
use bytes::Bytes;
use futures_util::stream::StreamExt;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::config::{filter_covers, validate_subject, NatsSettings};
use super::{checked_stream, connect, context};
use crate::sink::driver::{self, Arrival, Connection, DriverOptions, DriverSink, Outcome, Protocol};
use crate::sink::{Completions, FailureKind, Handover, SinkError};

/// The header the record's key travels in (NATS messages have no key of their own).
pub(crate) const KEY_HEADER: &str = "key";
/// The header the record's timestamp travels in: milliseconds since the Unix epoch, as text.
pub(crate) const TIMESTAMP_HEADER: &str = "timestamp";
/// async-nats's default queue of a subscription, in messages.
const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 64 * 1024;
/// JetStream's deduplication header.
pub(crate) const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// The NATS sink: the driver running [`JetStream`] on an [`AckStream`].
pub(crate) type Publisher<Tag> = DriverSink<JetStream, Tag>;

/// A record ready to publish.
pub(crate) struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// What a record becomes and what a PubAck means, for one stream.
pub(crate) struct JetStream {
    /// The stream's subject filters: a subject outside them is refused on sight.
    subjects: Vec<String>,
    stream: String,
    /// The server's `max_payload` (headers and payload), from its INFO.
    max_payload: usize,
    /// Whether a duplicate PubAck was logged already (once per sink).
    saw_duplicate: AtomicBool,
}

impl<Tag: Send + Sync + 'static> DriverSink<JetStream, Tag> {
    /// Connects, checks the stream, and starts the driver on the current runtime.
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
        debug!(stream = %settings.stream, max_payload, url = %settings.url, "NATS publisher connected");
        let protocol = JetStream {
            subjects: info.config.subjects,
            stream: settings.stream.clone(),
            max_payload,
            saw_duplicate: AtomicBool::new(false),
        };
        let connection = AckStream {
            client,
            reply_prefix,
            replies,
            events,
            events_open: true,
            lost: false,
            ack_timeout: settings.requests.timeout,
            stream: settings.stream.clone(),
        };
        let ack_timeout = settings.requests.timeout;
        let options = DriverOptions {
            reply_timeout: Some(ack_timeout),
            // Like librdkafka's message.timeout.ms: a record that waited longer than an ack may
            // take was held by a frozen process a standby may have replaced; it is not sent late.
            max_queue_wait: Some(ack_timeout),
            // The caller's budget bounds what is on the wire (and sized the subscription);
            // dropped without abandon, wait as long as an ack may take.
            ..settings.requests.pipelined()
        };
        Ok(driver::start_on(Arc::new(protocol), connection, options))
    }
}

impl JetStream {
    /// The record as a NATS message, or why it can never be published.
    fn message(&self, handover: Handover<'_, '_>) -> Result<Outgoing, String> {
        let record = handover.record;
        let subject = &*record.destination;
        validate_subject(subject, false).map_err(|m| format!("subject {subject:?} {m}"))?;
        if !self.subjects.iter().any(|f| filter_covers(f, subject)) {
            return Err(format!(
                "no subject of stream {:?} ({:?}) covers {subject:?}, so no stream would store it",
                self.stream, self.subjects
            ));
        }
        let mut pairs: Vec<(&str, &[u8])> = Vec::with_capacity(4 + record.headers.len() + handover.extra.len());
        pairs.push(("id", record.event_id));
        pairs.extend(
            record
                .headers_with(handover.extra)
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
        if let Some(id) = handover.dedup_key {
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
        Ok(Outgoing {
            subject: subject.to_owned(),
            headers,
            payload: Bytes::copy_from_slice(payload),
        })
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

impl Protocol for JetStream {
    type Request = Outgoing;
    type Reply = Message;

    const NAME: &'static str = super::SINK;

    /// `dedup_key` becomes the `Nats-Msg-Id` header: JetStream drops a message whose id it
    /// stored within the stream's duplicate window, and acks it as a duplicate.
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Outgoing, String> {
        self.message(handover)
    }

    fn classify(&self, reply: Message) -> Outcome {
        match self.outcome(&reply) {
            Ok(()) => Outcome::Acknowledged,
            Err((FailureKind::Refused, cause)) => Outcome::Refused(cause),
            // A reply is never `Full` (that is only `send`'s answer).
            Err((FailureKind::Transient | FailureKind::Full, cause)) => Outcome::Transient(cause),
        }
    }

    fn reply_name(&self) -> &'static str {
        "PubAck"
    }

    /// The connection closes by being dropped: abandon needs no time for it.
    fn close_margin(&self) -> std::time::Duration {
        std::time::Duration::from_millis(200)
    }
}

/// The sink's connection as the driver uses it: publishes with a reply subject of the PubAck
/// subscription, and reads that subscription and the client's events.
struct AckStream {
    client: Client,
    /// `<prefix>.` of every reply subject this sink asks for: the record's number follows.
    reply_prefix: String,
    replies: Subscriber,
    events: mpsc::UnboundedReceiver<Event>,
    events_open: bool,
    /// Said [`Arrival::Lost`] already: nothing more comes from this connection.
    lost: bool,
    ack_timeout: std::time::Duration,
    stream: String,
}

impl Connection for AckStream {
    type Request = Outgoing;
    type Reply = Message;

    /// Hands one message to the client, asking for its PubAck on reply subject `<prefix>.n`.
    async fn write(&mut self, n: u64, out: Outgoing) -> Result<(), String> {
        let mut reply = String::with_capacity(self.reply_prefix.len() + 20);
        reply.push_str(&self.reply_prefix);
        push_decimal(&mut reply, n.into());
        // The publish borrows the client: settled before anything else touches `self`.
        let sent = {
            let publish = self
                .client
                .publish_with_reply_and_headers(out.subject, reply, out.headers, out.payload);
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
        sent.map_err(|e| format!("publish failed: {e}"))
    }

    async fn next(&mut self) -> Arrival<Message> {
        if self.lost {
            return std::future::pending().await;
        }
        loop {
            tokio::select! {
                biased;
                event = self.events.recv(), if self.events_open => match event {
                    Some(Event::Disconnected | Event::Closed) | Some(Event::ClientError(_)) => {
                        // No ack can come any more on this connection: fail what is in flight.
                        self.lost = true;
                        let event = event.map(|e| e.to_string()).unwrap_or_default();
                        return Arrival::Lost(format!("connection to NATS lost ({event})"));
                    }
                    // The client dropped replies it could not queue: which acks are gone is
                    // unknown, so nothing in flight can be trusted to complete.
                    Some(event @ Event::SlowConsumer(_)) => {
                        self.lost = true;
                        return Arrival::Lost(format!("PubAcks dropped by the client ({event})"));
                    }
                    Some(event @ Event::ServerError(_)) => warn!(stream = %self.stream, %event, "NATS server error"),
                    Some(event) => debug!(%event, "NATS client event"),
                    None => self.events_open = false,
                },
                reply = self.replies.next() => match reply {
                    Some(reply) => {
                        let n = reply
                            .subject
                            .strip_prefix(self.reply_prefix.as_str())
                            .and_then(|n| n.parse::<u64>().ok());
                        if let Some(n) = n {
                            return Arrival::Reply(n, reply);
                        }
                    }
                    None => {
                        self.lost = true;
                        return Arrival::Lost("the PubAck subscription ended (connection closed)".into());
                    }
                },
            }
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
