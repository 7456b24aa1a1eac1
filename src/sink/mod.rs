//! Sinks: the brokers outbox events go to, behind one publish interface.
//!
//! The domain builds a [`SinkRecord`] — destination (the routed name: a Kafka topic, a NATS
//! subject, …), key, value bytes, the event `id`, headers, timestamp — and checks it against the
//! sink's [`SinkLimits`] (its name rule and largest message). A pipeline (the relay, `poll`,
//! `setup --backfill`) hands records to a [`Sink`] with a tag of its own and gets exactly one
//! [`Completion`] back per record it handed over, on the channel [`create`] returned: delivered,
//! or a [`SinkFailure`] whose [`FailureKind`] says what the caller does — the record is refused
//! for what it is (a bad event), the broker or network failed (replay), or an operator must act.
//! Each adapter maps its broker's errors onto those kinds inside its own folder.
//!
//! Invariants every adapter keeps:
//! * **Delivered means stored**: a completion is `Ok` only once the broker acknowledged the
//!   record as durably as it can (Kafka `acks=all`).
//! * **Order**: records of one key reach the broker in the order they were handed over, and
//!   nothing handed over after a record that failed is stored ahead of it — so a replay keeps
//!   each aggregate's first deliveries in commit order. After a refusal the broker reported
//!   later, the key stays fenced ([`fence::KeyFence`]) until the caller calls [`Sink::release`].
//! * **A full queue is backpressure**: an adapter whose client refuses a record because its
//!   local queue is full answers [`FailureKind::Full`] from [`Sink::send`] (nothing queued), never
//!   a failure; every caller waits for room and hands the same record over again.
//! * **Nothing after abandon**: [`Sink::abandon`] drops what is still queued and waits (bounded)
//!   for what is on the wire; a new sink replays.
//!
//! Each kind of sink is a [`plugin::SinkPlugin`] in its own folder, listed once in
//! [`registry`]; this module's functions ([`limits`], [`prepare`], [`probe`], [`exactly_once`],
//! [`create`], …) answer for whichever sink is configured, through the registry, without naming
//! any. A request/response sink runs on the shared [`driver`]: it supplies a
//! [`driver::Protocol`] and one of two transports, a reply future per request (RabbitMQ, the
//! webhook, Pub/Sub, the AWS sinks) or replies read from one connection's stream (NATS, Redis:
//! on per-request futures NATS drained 35-40 % slower). What a sink can do for exactly-once
//! delivery is a value it declares ([`exactly_once`]); a sink is never told the delivery mode.
//!
//! Adding a sink: a folder `src/sink/<name>/` with the plugin and its section `[<name>]`
//! (`config.rs`), and one line in the registry (docs/architecture.md, "Adding a sink").

pub(crate) mod aws;
pub(crate) mod batch;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod driver;
pub(crate) mod exactly_once;
pub(crate) mod fence;
pub(crate) mod kafka;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod nats;
pub(crate) mod plugin;
pub(crate) mod pubsub;
pub(crate) mod rabbitmq;
pub(crate) mod redis;
pub(crate) mod refusal;
pub(crate) mod registry;
pub(crate) mod requests;
pub(crate) mod webhook;

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::Settings;
pub use exactly_once::ReadBackError;
pub(crate) use exactly_once::{
    tail_since, ClientQueueExpiry, ExactlyOnce, HeaderGet, ReadBackReader, ReadBackSource, Sealer, Seen, Tail,
    Transactional,
};
use plugin::{ClientLogTarget, SinkContext, SinkPlugin};
pub use refusal::StartRefusal;
use registry::Visit;

/// One extra header of a record: name and value (`None`: a null header).
pub(crate) type RecordHeader<'a> = (Cow<'a, str>, Option<Cow<'a, [u8]>>);

/// One record for a sink, borrowed from whatever the caller keeps (the sink copies what it
/// needs before [`Sink::send`] returns).
///
/// Not every record is an event: a dead letter is a record made from an event's raw form.
/// Events become records only through `crate::outbox::event::OutboxEvent::record`, dead letters
/// through `crate::outbox::bad_event::RawEvent::dead_letter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SinkRecord<'a> {
    /// The routed name: the topic, subject, routing key or stream the broker stores it under.
    pub(crate) destination: Cow<'a, str>,
    pub(crate) key: Cow<'a, [u8]>,
    /// `None`: a null value (a Kafka tombstone).
    pub(crate) value: Option<Cow<'a, [u8]>>,
    /// Sent as the first header, `id` (consumers deduplicate on it).
    pub(crate) event_id: &'a [u8],
    pub(crate) timestamp_ms: Option<i64>,
    /// Sent after `id`, in this order.
    pub(crate) headers: Cow<'a, [RecordHeader<'a>]>,
    /// A partition chosen by the caller (`[debezium]` partition placement), for a sink with
    /// partitions: `None` lets the sink choose.
    pub(crate) partition: Option<i32>,
}

/// One header as every adapter writes it: a name and a value (`None`: a null value, which a
/// broker without nulls writes as empty).
pub(crate) type HeaderRef<'h> = (&'h str, Option<&'h [u8]>);

impl<'a> SinkRecord<'a> {
    /// The headers a sink writes after its own fixed ones, in order: the record's own, then the
    /// caller's `extra` ones (exactly-once's source position). One iterator for every adapter,
    /// so no sink writes them in another order or forgets the extra ones.
    pub(crate) fn headers_with<'h>(
        &'h self,
        extra: &'h [(&'h str, &'h [u8])],
    ) -> impl Iterator<Item = HeaderRef<'h>> + 'h {
        self.headers
            .iter()
            .map(|(name, value)| (&**name, value.as_deref()))
            .chain(extra.iter().map(|&(name, value)| (name, Some(value))))
    }

    /// What this record costs against the in-flight byte budget.
    pub(crate) fn size(&self) -> usize {
        self.key.len()
            + self.value.as_ref().map_or(0, |p| p.len())
            + self.event_id.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
                .sum::<usize>()
    }
}

/// What a sink is handed for one record: the record, the caller's `extra` headers (they follow
/// the record's own: the caller's source position, where its delivery guarantee writes one) and
/// `dedup_key`, which, when the caller gives one, names the record's source position uniquely
/// (a sink whose broker deduplicates, [`ExactlyOnce::BrokerDeduplicates`], gives it to the
/// broker; the others ignore it). One value from the caller through [`Sink::send`] to the
/// adapter's encoder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handover<'a, 'r> {
    pub(crate) record: &'a SinkRecord<'r>,
    pub(crate) extra: &'a [(&'a str, &'a [u8])],
    pub(crate) dedup_key: Option<&'a str>,
}

impl<'a, 'r> Handover<'a, 'r> {
    /// `record` alone: no extra headers, no deduplication key.
    pub(crate) fn of(record: &'a SinkRecord<'r>) -> Self {
        Handover {
            record,
            extra: &[],
            dedup_key: None,
        }
    }

    /// With the caller's `extra` headers, written after the record's own.
    pub(crate) fn with_extra(self, extra: &'a [(&'a str, &'a [u8])]) -> Self {
        Handover { extra, ..self }
    }

    /// With the caller's deduplication key (`None`: none).
    pub(crate) fn with_dedup_key(self, dedup_key: Option<&'a str>) -> Self {
        Handover { dedup_key, ..self }
    }
}

/// What a sink accepts, known from the configuration before anything is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SinkLimits {
    /// The destination name rule: `Err` says what is wrong with the name.
    pub(crate) check_name: fn(&str) -> Result<(), String>,
    /// The largest message the sink sends (value, key and headers as the broker counts them).
    pub(crate) max_message_bytes: usize,
}

/// What a failed record means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The broker (or the client, locally) refused the record for what it *is* — its size,
    /// name, shape — so sending it again can never succeed: `relay.on_bad_event` decides. A
    /// refusal in a completion may have been of a whole batch the record was in (Kafka), so the
    /// relay sends it again alone before calling it bad (`relay/quarantine.rs`).
    Refused,
    /// The broker, the network or the client failed: a new session replays.
    Transient,
    /// Only in a [`Refusal`]: the sink cannot take the record yet — its own local queue is full
    /// (Kafka: librdkafka's `queue.buffering.max.messages` / `.kbytes`), or it is still
    /// learning what the destination takes (Kafka: the topic's `max.message.bytes`, at the
    /// topic's first record). Backpressure, not a failure: nothing was queued, and the caller
    /// hands the same record over again — after a completion, or after a short pause — sending
    /// nothing else meanwhile (order).
    Full,
}

/// A record the sink could not deliver: what failed, and what it means ([`FailureKind`]).
#[derive(Debug, Clone)]
pub struct SinkFailure {
    pub(crate) kind: FailureKind,
    pub(crate) destination: String,
    /// The partition the client had chosen, for a sink with partitions.
    pub(crate) partition: Option<i32>,
    pub(crate) event_id: Option<String>,
    /// The broker's or client's own words.
    pub(crate) cause: String,
}

impl SinkFailure {
    pub(crate) fn is_refusal(&self) -> bool {
        self.kind == FailureKind::Refused
    }

    /// The sink's queue was full ([`FailureKind::Full`]): wait and hand the record over again.
    pub(crate) fn is_full(&self) -> bool {
        self.kind == FailureKind::Full
    }
}

impl std::fmt::Display for SinkFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "event id={} to {:?}{} failed: {}",
            self.event_id.as_deref().unwrap_or("?"),
            self.destination,
            self.partition.map(|p| format!(" partition {p}")).unwrap_or_default(),
            self.cause
        )
    }
}

impl std::error::Error for SinkFailure {}

/// The outcome of one record, with the tag it was sent with.
#[derive(Debug)]
pub(crate) struct Completion<Tag> {
    pub(crate) tag: Box<Tag>,
    pub(crate) outcome: Result<(), SinkFailure>,
}

/// A record [`Sink::send`] did not take (nothing was queued; no completion will follow).
#[derive(Debug)]
pub(crate) struct Refusal<Tag> {
    pub(crate) tag: Box<Tag>,
    pub(crate) failure: SinkFailure,
}

impl SinkFailure {
    /// `record` failed: its destination and event id, with `kind` and `cause`.
    pub(crate) fn of(record: &SinkRecord<'_>, kind: FailureKind, cause: String) -> SinkFailure {
        SinkFailure {
            kind,
            destination: record.destination.to_string(),
            partition: record.partition,
            event_id: Some(String::from_utf8_lossy(record.event_id).into_owned()),
            cause,
        }
    }
}

impl<Tag> Refusal<Tag> {
    /// `send` did not take `record` (the one constructor every sink uses).
    pub(crate) fn of(record: &SinkRecord<'_>, tag: Box<Tag>, kind: FailureKind, cause: String) -> Refusal<Tag> {
        Refusal {
            tag,
            failure: SinkFailure::of(record, kind, cause),
        }
    }

    /// A request that is no record (a seal) was not taken: transient, for `cause`.
    pub(crate) fn transient(tag: Box<Tag>, cause: String) -> Refusal<Tag> {
        Refusal {
            tag,
            failure: SinkFailure {
                kind: FailureKind::Transient,
                destination: String::new(),
                partition: None,
                event_id: None,
                cause,
            },
        }
    }
}

/// The completions of one sink, one per record it took.
pub(crate) type Completions<Tag> = mpsc::UnboundedReceiver<Completion<Tag>>;

/// A new sink and the channel its completions arrive on.
pub(crate) type SinkWithCompletions<Tag> = (Box<dyn Sink<Tag>>, Completions<Tag>);

/// A sink made, or why not: what every plugin's `create` answers.
pub(crate) type Created<Tag> = Result<SinkWithCompletions<Tag>, SinkError>;

/// What the caller's tag on each record must be: it travels with the record to its
/// completion, across the sink's threads and tasks.
pub(crate) trait SinkTag: Send + Sync + 'static {}

impl<T: Send + Sync + 'static> SinkTag for T {}

/// The sink could not be created, or its broker not prepared or checked.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{sink}: {cause}")]
pub struct SinkError {
    /// The broker's name for people: "Kafka", "NATS JetStream", …
    pub(crate) sink: &'static str,
    /// What failed and what to do about it.
    pub(crate) cause: String,
    /// The broker is unreachable or busy (retry with backoff), as opposed to a configuration or
    /// permission problem an operator must fix.
    pub(crate) transient: bool,
}

/// One publish interface for every broker. `send` never blocks: the sink queues the record
/// and reports its outcome later as a [`Completion`] — or, when its own queue has no room,
/// answers [`FailureKind::Full`] at once (backpressure: the caller waits and hands it over
/// again). An adapter whose queue is sized from the caller's budget ([`create`]'s
/// `max_in_flight`) answers `Full` only when its queue was configured smaller than that.
pub(crate) trait Sink<Tag>: Send + Sync {
    /// Hands over one record ([`Handover`]: with the caller's extra headers and deduplication key).
    fn send(&self, handover: Handover<'_, '_>, tag: Box<Tag>) -> Result<(), Refusal<Tag>>;

    /// Gives up on this sink: drops what is still queued and waits, at most `wait`, for what is
    /// on the wire, so a replay by the next sink cannot be overtaken by stragglers. Blocks.
    fn abandon(self: Box<Self>, wait: Duration);

    /// The caller has decided about a refused record of `key` (applied `relay.on_bad_event` to
    /// it): records of `key` handed over from now on are published again. Until then, after a
    /// refusal reported in a [`Completion`], the sink fails every later record of that key as
    /// [`FailureKind::Transient`] without publishing it ([`fence::KeyFence`]). A caller that
    /// gives up on the sink instead ([`Sink::abandon`]) needs no release.
    fn release(&self, key: &[u8]);

    /// The broker's or client's latest complaint about the connection (e.g. "all brokers are
    /// down"), for the outage summary (`relay/outage.rs`); `None` when it has none to offer.
    fn complaint(&self) -> Option<String> {
        None
    }

    /// The client's word that it has reached no broker yet — every address it was given
    /// refused or did not answer — in words that name the addresses, for the relay's first
    /// line about an unreachable sink (`relay/outage.rs`). `None` once a broker answered, and
    /// where the client cannot tell (a sink that connects in [`create`] fails its session
    /// instead, which is logged with its cause).
    fn unreachable(&self) -> Option<String> {
        None
    }

    /// The client's own word that waiting cannot help: the broker refused the credentials, its
    /// TLS certificate is not trusted, a bootstrap host does not resolve. The session then ends
    /// with this error (not transient: an operator must fix the configuration), nothing
    /// confirmed past what was acknowledged. `None` while the broker may still answer.
    fn verdict(&self) -> Option<SinkError> {
        None
    }
}

/// How long a caller that waits for room in a full sink ([`send_waiting`]) pauses between tries.
pub(crate) const ROOM_RETRY: Duration = Duration::from_millis(5);

/// Hands `handover` to `sink`, waiting while the sink's queue is full ([`FailureKind::Full`]:
/// backpressure, the client frees room as it serves its reports) and handing the same record
/// over again. For a caller that sends nothing else meanwhile (`poll`, `setup --backfill`); the
/// relay's stream cannot wait here, and pauses its event loop instead (`relay/stream.rs`).
/// `Err`: refused or failed, never `Full`.
pub(crate) async fn send_waiting<Tag>(
    sink: &dyn Sink<Tag>,
    handover: Handover<'_, '_>,
    mut tag: Box<Tag>,
) -> Result<(), Refusal<Tag>> {
    loop {
        match sink.send(handover, tag) {
            Err(refusal) if refusal.failure.is_full() => {
                tag = refusal.tag;
                tokio::time::sleep(ROOM_RETRY).await;
            }
            other => return other,
        }
    }
}

/// The boxed future of a sink operation.
type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The chosen sink's plugin did not answer: the section's kind is not registered (the test
/// in `registry.rs` keeps that from happening).
fn unregistered(settings: &Settings) -> SinkError {
    SinkError {
        sink: settings.sink.broker_name(),
        cause: format!(
            "[sink] kind = \"{}\" has no sink plugin in this build (src/sink/registry.rs)",
            settings.sink.label()
        ),
        transient: false,
    }
}

/// One question to the configured sink's plugin: `$body`, with `$plugin` (the plugin, type `P`)
/// and `$config` (its validated section) bound, as a [`Visit`] — a generic method, which a
/// closure cannot be. `None`: no plugin is registered for the configured kind.
macro_rules! ask_plugin {
    ($settings:expr, $output:ty, |$plugin:ident, $config:ident| $body:expr) => {{
        struct Ask;
        impl<'a> Visit<'a> for Ask {
            type Output = $output;
            #[allow(unused_variables)]
            fn visit<P: SinkPlugin>(self, $plugin: &'static P, $config: &'a P::Config) -> $output {
                $body
            }
        }
        registry::visit(&$settings.sink, Ask)
    }};
}

/// The configured sink's limits (the same whatever instance [`create`] makes).
pub(crate) fn limits(settings: &Settings) -> SinkLimits {
    ask_plugin!(settings, SinkLimits, |plugin, config| plugin.limits(config)).unwrap_or(SinkLimits {
        check_name: |_| Err("no sink plugin is registered for the configured kind".into()),
        max_message_bytes: 0,
    })
}

/// What `setup` does for the configured sink (create or check what it needs: a stream, an
/// exchange); one line per thing done or found, for the report.
pub(crate) async fn prepare(settings: &Settings) -> Result<Vec<String>, SinkError> {
    let pending = ask_plugin!(
        settings,
        Pending<'a, Result<Vec<String>, SinkError>>,
        |plugin, config| Box::pin(plugin.prepare(config))
    );
    pending.ok_or_else(|| unregistered(settings))?.await
}

/// What `status` says of the configured sink: reachable, and how it looks (`Err`: why not).
pub(crate) async fn probe(settings: &Settings) -> Result<String, SinkError> {
    let pending = ask_plugin!(settings, Pending<'a, Result<String, SinkError>>, |plugin, config| {
        Box::pin(plugin.probe(config))
    });
    pending.ok_or_else(|| unregistered(settings))?.await
}

/// What the configured sink can do for exactly-once delivery (its plugin's answer).
pub(crate) fn exactly_once(settings: &Settings) -> ExactlyOnce {
    ask_plugin!(settings, ExactlyOnce, |plugin, config| plugin.exactly_once(config)).unwrap_or(
        ExactlyOnce::Unsupported("no sink plugin is registered for the configured kind".into()),
    )
}

/// Whether a takeover under this configuration waits a fence timed from the previous holder's
/// status updates: exactly-once delivery by read-back through a client that queues records
/// (`relay/takeover.rs`).
pub(crate) fn takeover_fenced(settings: &Settings) -> bool {
    settings.relay.delivery == crate::config::relay::Delivery::ExactlyOnce
        && matches!(exactly_once(settings), ExactlyOnce::ReadBack(sink) if sink.queue_expiry().is_some())
}

/// What a trace says of the configured sink: OpenTelemetry's `messaging.system`, and the
/// attribute the record key goes in, if the conventions define one for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceNames {
    pub(crate) messaging_system: &'static str,
    pub(crate) key_attribute: Option<&'static str>,
}

/// [`TraceNames`] of the configured sink.
pub(crate) fn trace_names(settings: &Settings) -> TraceNames {
    let names = ask_plugin!(settings, TraceNames, |plugin, config| TraceNames {
        messaging_system: P::MESSAGING_SYSTEM,
        key_attribute: P::KEY_ATTRIBUTE,
    });
    names.unwrap_or(TraceNames {
        messaging_system: settings.sink.label(),
        key_attribute: None,
    })
}

/// The log targets of every registered sink's client library (whichever sink is configured:
/// the log filter is set before the configuration is read).
pub(crate) fn client_log_targets() -> Vec<ClientLogTarget> {
    struct Targets(Vec<ClientLogTarget>);
    impl registry::Each for Targets {
        fn each<P: SinkPlugin>(&mut self, _: &'static P) {
            self.0.extend_from_slice(P::LOG_TARGETS);
        }
    }
    let mut targets = Targets(Vec::new());
    registry::each(&mut targets);
    targets.0
}

/// Creates the configured sink (connecting, where the broker needs a connection) as `purpose`
/// asks; `max_in_flight` is the caller's budget, which the sink's own queue must never refuse.
/// Called inside a tokio runtime, whose tasks an adapter may use for its I/O.
pub(crate) async fn create<Tag: SinkTag>(settings: &Settings, max_in_flight: usize, purpose: Purpose) -> Created<Tag> {
    struct Create<Tag> {
        cx: SinkContext,
        purpose: Purpose,
        tag: std::marker::PhantomData<fn() -> Tag>,
    }
    impl<'a, Tag: SinkTag> Visit<'a> for Create<Tag> {
        type Output = Pending<'a, Created<Tag>>;
        fn visit<P: SinkPlugin>(self, plugin: &'static P, config: &'a P::Config) -> Self::Output {
            Box::pin(async move {
                match self.purpose {
                    Purpose::Plain => plugin.create(config, &self.cx).await,
                    Purpose::Deduplicating => plugin.create_deduplicating(config, &self.cx).await,
                    Purpose::ReadBack => plugin.create_read_back(config, &self.cx).await,
                }
            })
        }
    }
    let visitor = Create {
        cx: SinkContext::of(settings, max_in_flight),
        purpose,
        tag: std::marker::PhantomData,
    };
    registry::visit(&settings.sink, visitor)
        .ok_or_else(|| unregistered(settings))?
        .await
}

/// Which of a plugin's constructors [`create`] calls: what the caller will hand the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Records only ([`SinkPlugin::create`]).
    Plain,
    /// Records with deduplication keys, as the [`ExactlyOnce::BrokerDeduplicates`] answer
    /// promised ([`SinkPlugin::create_deduplicating`]).
    Deduplicating,
    /// Records whose replay the caller checks against the sink's own read-back source, as the
    /// [`ExactlyOnce::ReadBack`] answer promised (Kafka: a producer whose queued records expire
    /// in the time that source names; [`SinkPlugin::create_read_back`]).
    ReadBack,
}

/// The transactional sink of [`ExactlyOnce::Transactions`], which fences earlier producers of
/// its identity and reads the checkpoint before it returns: create it only once the caller is
/// the one that may write (a holder must never fence the one that holds the slot).
pub(crate) async fn create_transactional<Tag: Send + Sync + 'static>(
    settings: &Settings,
    max_in_flight: usize,
) -> Result<Transactional<Tag>, SinkError> {
    struct Create<Tag> {
        cx: SinkContext,
        tag: std::marker::PhantomData<fn() -> Tag>,
    }
    impl<'a, Tag: Send + Sync + 'static> Visit<'a> for Create<Tag> {
        type Output = Pending<'a, Result<Transactional<Tag>, SinkError>>;
        fn visit<P: SinkPlugin>(self, plugin: &'static P, config: &'a P::Config) -> Self::Output {
            Box::pin(async move { plugin.create_transactional(config, &self.cx).await })
        }
    }
    let visitor = Create {
        cx: SinkContext::of(settings, max_in_flight),
        tag: std::marker::PhantomData,
    };
    registry::visit(&settings.sink, visitor)
        .ok_or_else(|| unregistered(settings))?
        .await
}

/// A sink and its completions, boxed: what a plugin's `create` returns.
pub(crate) fn boxed<Tag, S: Sink<Tag> + 'static>(
    (sink, completions): (S, Completions<Tag>),
) -> SinkWithCompletions<Tag> {
    (Box::new(sink), completions)
}
