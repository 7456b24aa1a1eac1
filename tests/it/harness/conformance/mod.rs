//! The conformance suite's side of every sink: one [`SinkHarness`] per sink (a file here each),
//! which `tests/it/conformance.rs` runs its scenarios through — the workload, kill -9 under
//! load, exactly-once across kills, the server taken away for 30 s, bad events under each
//! `relay.on_bad_event`, what the sink refuses at start, two relays writing one destination.
//!
//! A harness answers what differs per broker and nothing else: where its server is and how to
//! take it away, what its section of the relay's config is, how a destination is named, made
//! and read back (as [`Received`] records: topic = the destination's real name, key, payload,
//! headers = whatever the sink carries, `id` first), what it can promise (exactly-once or not,
//! and how) and what it refuses (its bad events, with the words the relay says them in). A new
//! sink implements this trait and one line of `conformance.rs`, and runs the whole matrix.
//!
//! Destinations have logical names (`order`, `good`, `dead`, `placed`); [`SinkHarness::destination`]
//! gives the real one (a queue `<prefix>-good.fifo`, a stream `<prefix>.good`, a topic of the
//! test's Kafka namespace), which is also what a record's `topic` reads and what
//! `relay.dead_letter_topic` takes. Every wait is bounded.

use std::time::Duration;

use tokio_postgres::Client;

use super::consumer::Received;
use super::relay_process::{RelayConfig, RelayProcess};

pub mod kafka;
pub mod kinesis;
pub mod nats;
pub mod pubsub;
pub mod rabbitmq;
pub mod redis;
pub mod sns;
pub mod sqs;
pub mod webhook;

/// Where the relay may reach the sink: a server shared with other tests, or one the test takes
/// away ([`SinkHarness::take_down`]) without touching anyone else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// Any server (the shared broker where there is one).
    Shared,
    /// A server (or a path to it: a proxy) of the test's own, which it may take down.
    Own,
}

/// How the relay runs in one arm of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Reconnect backoff 100–500 ms, 50 events in flight, the sink's short timeouts
    /// ([`SinkHarness::short_timeouts`]).
    ShortBackoff,
    /// Every `[relay]` and sink default.
    ShippedDefaults,
    /// [`Variant::ShortBackoff`] in `relay.delivery = "exactly-once"`.
    ExactlyOnce,
}

impl Variant {
    pub fn label(self) -> &'static str {
        match self {
            Variant::ShortBackoff => "backoff 100-500 ms, 50 in flight, short sink timeouts",
            Variant::ShippedDefaults => "shipped defaults",
            Variant::ExactlyOnce => "exactly-once, backoff 100-500 ms, 50 in flight, short sink timeouts",
        }
    }

    /// A destination name of its own, so the arms of one scenario share a server, not a destination.
    pub fn suffix(self) -> &'static str {
        match self {
            Variant::ShortBackoff => "short",
            Variant::ShippedDefaults => "shipped",
            Variant::ExactlyOnce => "once",
        }
    }
}

/// How a sink delivers exactly once (`relay.delivery = "exactly-once"`).
#[derive(Debug, Clone, Copy)]
pub struct ExactlyOnce {
    /// How, in a few words (for the report lines).
    pub how: &'static str,
    /// SIGKILLs in the exactly-once kill scenario (`OUTBOX_RELAY_LONG_TESTS=1`: `long_kills`).
    pub kills: usize,
    pub long_kills: usize,
    /// Events committed per kill there.
    pub per_kill: usize,
}

/// What a sink can do, as the scenarios need to know it.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    /// `None`: the relay refuses exactly-once with this sink (see
    /// [`SinkHarness::exactly_once_refusal`]).
    pub exactly_once: Option<ExactlyOnce>,
    /// The row's `created_at` reaches the record as its timestamp.
    pub timestamps: bool,
    /// The workload scenario's events and aggregates.
    pub workload: (usize, usize),
    /// Events committed per relay kill, and the unit of the other scenarios' loads (moto's FIFO
    /// queues and shards slow down as they fill: its sinks take fewer).
    pub per_kill: usize,
    /// Two relays may write one destination at once (not against moto's Kinesis, which loses
    /// records when two `PutRecords` calls reach one shard at once: docs/sink-kinesis.md).
    pub two_writers: bool,
    /// The outage scenario gives each of its arms a server of its own (moto is one Python
    /// process, slower as its queues fill: three relays' catch-up on one would be the test's
    /// bottleneck).
    pub server_per_arm: bool,
}

/// How a row is bad for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRow {
    /// A payload `{"blob": "xxx…"}` with this many `x`.
    Payload(usize),
    /// Routed by this value: the conformance route ([`BAD_ROUTE`]) takes a value of lowercase
    /// letters, `_` and spaces to the destination of that name; any other value is the
    /// destination's name verbatim (`elsewhere.x`, a name with a control character).
    Route(String),
    /// Every header column set ([`SinkHarness::header_columns`] of them).
    AllHeaders,
    /// The payload carries this marker (the webhook receiver refuses marked bodies).
    Marked(&'static str),
}

/// One kind of bad event of a sink.
#[derive(Debug, Clone)]
pub struct BadKind {
    pub name: &'static str,
    pub row: BadRow,
    /// What the relay's error (the log line, a dead letter's `outbox-relay-error`) says.
    pub cause: &'static str,
    /// Its raw row fits a dead letter on this sink.
    pub dead_letter: bool,
    /// Tested under `fail` (where it does not race another refusal to stop the relay).
    pub under_fail: bool,
    /// Refused before a later event of its aggregate goes out (on sight, or by a sink that has
    /// one event per key on the wire): under `fail` nothing after it is published. A refusal
    /// the broker answers later may be overtaken by the next event (at least once: published,
    /// then replayed).
    pub nothing_after: bool,
    /// Refused by the relay before anything is sent (implies `nothing_after`): no session
    /// ends over it, so under `skip` and `dead-letter` nothing is replayed (the good events
    /// arrive once each) and dead letters of such kinds come in commit order.
    pub on_sight: bool,
}

impl BadKind {
    pub fn new(name: &'static str, row: BadRow, cause: &'static str) -> BadKind {
        BadKind {
            name,
            row,
            cause,
            dead_letter: true,
            under_fail: true,
            nothing_after: false,
            on_sight: false,
        }
    }

    /// See [`BadKind::on_sight`].
    pub fn on_sight(mut self) -> BadKind {
        self.on_sight = true;
        self.nothing_after = true;
        self
    }

    /// See [`BadKind::nothing_after`].
    pub fn nothing_after(mut self) -> BadKind {
        self.nothing_after = true;
        self
    }

    /// Its raw row does not fit a dead letter either: not dead-lettered in the scenario.
    pub fn no_dead_letter(mut self) -> BadKind {
        self.dead_letter = false;
        self
    }

    /// Not run under `fail`.
    pub fn not_under_fail(mut self) -> BadKind {
        self.under_fail = false;
        self
    }
}

/// The `relay.on_bad_event` policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Fail,
    Skip,
    DeadLetter,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fail => "fail",
            Policy::Skip => "skip",
            Policy::DeadLetter => "dead-letter",
        }
    }
}

/// The route regex of the bad-event scenarios (see [`BadRow::Route`]).
pub const BAD_ROUTE: &str = "^(?<routedByValue>[a-z][a-z_ ]*)$";

/// A sink as the conformance suite drives it. Only what differs per sink is here; the
/// scenarios (`tests/it/conformance.rs`) do the rest the same way for every sink.
#[allow(async_fn_in_trait)]
pub trait SinkHarness: Sized {
    /// The sink's name in messages ("SQS").
    const NAME: &'static str;

    /// What it can do.
    fn capabilities() -> Capabilities;

    /// A namespace of the test's own on the sink's server (`server`: may it be shared). `None`
    /// where the server is not installed, after [`super::needs::missing`] (a failure under CI).
    async fn start(test: &str, server: Server) -> Option<Self>;

    /// Makes destinations `names` exist where the sink needs them made (queues, topics,
    /// streams, bindings, subscriptions read back from now on); idempotent.
    async fn create(&self, names: &[&str]);

    /// The real name of destination `name` (module docs).
    fn destination(&self, name: &str) -> String;

    /// `config` publishing to this sink: its section, and `[route]` taking a route value that
    /// matches `regex` to the destination named `name` (with `${routedByValue}` replaced).
    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig;

    /// What the relay's environment needs (credentials, the emulator's address).
    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// `outbox-relay run` with [`SinkHarness::env`].
    fn run(&self, config: &RelayConfig) -> RelayProcess {
        self.run_with(config, &[])
    }

    /// [`SinkHarness::run`] with more environment.
    fn run_with(&self, config: &RelayConfig, more: &[(&str, &str)]) -> RelayProcess {
        let env = self.env();
        let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(more);
        RelayProcess::run_with(config, &[], &all)
    }

    /// Every record of destinations `names` once `want` distinct events arrived there, or
    /// `timeout` passed (the checks then name what is missing), after a moment for stragglers;
    /// in the sink's order (per partition, shard, queue or stream). Reading twice returns what
    /// the first read returned and what arrived since.
    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received>;

    /// Takes the server away: it stops answering (each harness says how, and why that way).
    async fn take_down(&mut self);

    /// Brings it back after [`SinkHarness::take_down`].
    async fn bring_back(&mut self);

    /// The sink's own timeouts shortened, for [`Variant::ShortBackoff`].
    fn short_timeouts(&self, config: RelayConfig) -> RelayConfig {
        config
    }

    /// The relay's log after the server was away 30 s in `variant`: it must show the outage.
    fn check_outage_log(&self, log: &str, variant: Variant) {
        let _ = variant;
        assert!(
            log.contains("has acknowledged nothing for") && log.contains("acknowledges again"),
            "{}: the outage should show in the log:\n{log}",
            Self::NAME
        );
    }

    /// The sink's own checks of any records read back (Kinesis: an aggregate in one shard).
    fn check_records(&self, records: &[Received]) {
        let _ = records;
    }

    /// The sink's own checks of a clean workload's records (and the relay's log).
    fn check_workload(&self, records: &[Received], log: &str) {
        let _ = (records, log);
    }

    /// A config under which the relay refuses `relay.delivery = "exactly-once"` with this sink,
    /// and what its refusal says; `None` where every config of the sink takes it.
    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])>;

    /// The sink's own checks after an exactly-once scenario: `records` read back, the `logs` of
    /// every relay that ran.
    fn check_exactly_once(&self, records: &[Received], logs: &[String]) {
        let _ = (records, logs);
    }

    /// How an event can be bad for this sink.
    fn bad_kinds() -> Vec<BadKind>;

    /// Nullable header columns `h0…` the bad-event scenarios add (and map to headers `h0…`).
    fn header_columns(&self) -> usize {
        0
    }

    /// What the bad-event scenarios need beyond the route and the policy (limits lowered, a
    /// key that holds the wrong type, a receiver told to refuse marked bodies, destinations
    /// made specially); runs before [`SinkHarness::create`].
    async fn prepare_bad(&self, client: &Client, config: RelayConfig, policy: Policy) -> RelayConfig {
        let _ = (client, policy);
        config
    }

    /// The sink's own checks under `skip` once every good event arrived.
    async fn check_skipped(&self, log: &str) {
        let _ = log;
    }

    /// The sink's own checks of a dead letter of `kind`.
    fn check_dead_letter(&self, letter: &Received, kind: &BadKind) {
        let _ = (letter, kind);
    }

    /// Cleans up what a shared server keeps (streams, exchanges) at the end of a scenario.
    async fn finish(self) {}
}

/// How many distinct events (`id` headers) `records` hold.
pub fn distinct(records: &[Received]) -> usize {
    records
        .iter()
        .filter_map(|r| r.header("id"))
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// `records` of the destinations `names` (real names).
pub fn of(records: Vec<Received>, names: &[String]) -> Vec<Received> {
    records.into_iter().filter(|r| names.contains(&r.topic)).collect()
}

/// Polls `read` (every record so far) until `want` distinct events are there or `timeout`
/// passed; then, after `settle` (for stragglers: a duplicate must be seen), reads once more.
pub async fn poll<F, Fut>(want: usize, timeout: Duration, settle: Duration, mut read: F) -> Vec<Received>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<Received>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let got = read().await;
        if distinct(&got) >= want || std::time::Instant::now() >= deadline {
            if settle.is_zero() {
                return got;
            }
            tokio::time::sleep(settle).await;
            return read().await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
