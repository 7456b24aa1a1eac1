//! The conformance suite: one set of scenarios, run for every sink through its
//! [`SinkHarness`] (`tests/it/harness/conformance/`), one test per scenario and sink
//! (`conformance::<sink>::<scenario>`), so a failure names both.
//!
//! | scenario | what it proves | sinks |
//! |---|---|---|
//! | `workload` | a workload routed over four destinations: every event once, key, payload, destination, per-aggregate order, the sink's own fields; a clean SIGTERM | all |
//! | `kill_9_under_load` | 5 SIGKILLs under load (20 long): 0 lost, first deliveries in order, duplicates within kills × `max_in_flight` | all |
//! | `server_away_30_seconds` | the server away 30 s under load (frozen, stopped, cut or not listening: the harness says which), with a short backoff, with the shipped defaults and (where it can) exactly-once, all at once (on one server, or one each against moto): 0 lost, nothing confirmed past the outage, the relay keeps running and says so in its log | all |
//! | `bad_events_fail` / `_skip` / `_dead_letter` | each bad kind of the sink under each `relay.on_bad_event` | all |
//! | `exactly_once_kills` | SIGKILLs under load and a crash between an acknowledgement and its confirmation (failpoints): 0 duplicates, the source position on every record | sinks with exactly-once |
//! | `exactly_once_kills_with_shipped_defaults` | 5 SIGKILLs, every default: 0 duplicates | sinks with exactly-once |
//! | `exactly_once_refused_at_start` | `run` and `setup --check` refuse exactly-once with the reason, nothing published | sinks (or configurations) without it |
//! | `two_relays_one_destination` | two relays on two databases writing one destination: each database's events, in order (exactly-once with SIGKILLs where the sink can, 0 duplicates) | all |
//!
//! What is a sink's own (its broker's special behaviour, its own settings) stays in
//! `sink_<name>.rs`; Kafka's core crash, failpoint and bad-row suites stay in `failures.rs` and
//! `exactly_once.rs`. The 30 s outages run their arms concurrently, and the bad-event kinds under
//! `fail` concurrently, to keep the suite's time down; `OUTBOX_RELAY_LONG_TESTS=1` runs the long
//! variants (more kills).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio_postgres::Client;

use crate::harness::conformance::{
    kafka::Kafka, kinesis::Kinesis, nats::Nats, pubsub::PubSub, rabbitmq::RabbitMq, redis::Redis, sns::Sns, sqs::Sqs,
    webhook::Webhook, BadKind, BadRow, Policy, Server, SinkHarness, Variant, BAD_ROUTE,
};
use crate::harness::fault_support::*;
use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// Bound on every read-back (moto, on a loaded machine, is the slowest).
const READ: Duration = Duration::from_secs(240);

/// The scenarios of one sink, as tests `conformance::<sink>::<scenario>`. Flags: `exactly_once`
/// (the sink delivers exactly once), `refuses_exactly_once` (the sink, or a configuration of it,
/// cannot), `two_writers` (two relays may write one destination).
macro_rules! conformance {
    ($sink:ident: $harness:ty $(, $flag:ident)*) => {
        mod $sink {
            use super::*;

            /// The flags below and the harness's capabilities agree.
            #[test]
            fn matrix() {
                let flags: &[&str] = &[$(stringify!($flag)),*];
                let caps = <$harness>::capabilities();
                assert_eq!(caps.exactly_once.is_some(), flags.contains(&"exactly_once"), "exactly_once");
                assert_eq!(caps.two_writers, flags.contains(&"two_writers"), "two_writers");
            }

            conformance!(@test $harness, workload);
            conformance!(@test $harness, kill_9_under_load);
            conformance!(@test $harness, server_away_30_seconds);
            conformance!(@test $harness, bad_events_fail);
            conformance!(@test $harness, bad_events_skip);
            conformance!(@test $harness, bad_events_dead_letter);
            $(conformance!(@$flag $harness);)*
        }
    };
    (@exactly_once $harness:ty) => {
        conformance!(@test $harness, exactly_once_kills);
        conformance!(@test $harness, exactly_once_kills_with_shipped_defaults);
    };
    (@refuses_exactly_once $harness:ty) => {
        conformance!(@test $harness, exactly_once_refused_at_start);
    };
    (@two_writers $harness:ty) => {
        conformance!(@test $harness, two_relays_one_destination);
    };
    (@test $harness:ty, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            super::$scenario::<$harness>(concat!(module_path!(), "::", stringify!($scenario))).await
        }
    };
}

conformance!(kafka: Kafka, exactly_once, two_writers);
conformance!(nats: Nats, exactly_once, two_writers);
conformance!(redis: Redis, exactly_once, two_writers);
conformance!(sqs: Sqs, exactly_once, refuses_exactly_once, two_writers);
conformance!(sns: Sns, exactly_once, refuses_exactly_once, two_writers);
conformance!(rabbitmq: RabbitMq, refuses_exactly_once, two_writers);
conformance!(webhook: Webhook, refuses_exactly_once, two_writers);
conformance!(pubsub: PubSub, refuses_exactly_once, two_writers);
conformance!(kinesis: Kinesis, refuses_exactly_once, two_writers);

// ---- Shared steps ----

fn fast_restarts(config: RelayConfig) -> RelayConfig {
    config
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500)
}

/// `config` as `variant` runs it.
fn apply<S: SinkHarness>(sink: &S, config: RelayConfig, variant: Variant) -> RelayConfig {
    match variant {
        Variant::ShippedDefaults => config,
        Variant::ShortBackoff => sink.short_timeouts(fast_restarts(config).max_in_flight(50)),
        Variant::ExactlyOnce => {
            sink.short_timeouts(fast_restarts(config).max_in_flight(50))
                .set("relay", "delivery", "exactly-once")
        }
    }
}

/// [`SinkHarness::run`], once streaming started.
async fn run_streaming<S: SinkHarness>(sink: &S, config: &RelayConfig) -> RelayProcess {
    let relay = sink.run(config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(60)).await,
        "{}: the relay did not start streaming:\n{}",
        S::NAME,
        relay.log_text()
    );
    relay
}

/// A schema-B database (every event routed by `aggregate_type` = `order`) publishing to `sink`'s
/// destination `name`.
async fn order_db<S: SinkHarness>(sink: &S, name: &str) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = sink.configure(config, "(?<routedByValue>.*)", name);
    (db, client, config)
}

/// Every committed event at least once in `destination` (key, payload), first deliveries in
/// commit order per aggregate, and the sink's own record checks; returns the duplicates.
fn check_all<S: SinkHarness>(
    sink: &S,
    committed: &Committed,
    records: &[Received],
    destination: &str,
    what: &str,
) -> usize {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, records, |_| destination.to_owned());
    check_order(committed, records);
    sink.check_records(records);
    eprintln!("{} {what}: {} events, 0 lost, {dups} duplicates", S::NAME, all.len());
    dups
}

/// Exactly once: [`check_all`] with 0 duplicates (where the copies of a duplicated event are,
/// printed first), the source position on every record, and the sink's own checks.
fn check_exactly_once<S: SinkHarness>(
    sink: &S,
    committed: &Committed,
    records: &[Received],
    destination: &str,
    logs: &[String],
    what: &str,
) {
    let mut by_id: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    for r in records {
        by_id.entry(id_of(r)).or_default().push(r);
    }
    for (id, copies) in by_id.iter().filter(|(_, c)| c.len() > 1).take(10) {
        let h = |r: &Received, n: &str| {
            r.header(n)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        let at: Vec<String> = copies
            .iter()
            .map(|r| {
                format!(
                    "p{}@{} {}#{}",
                    r.partition,
                    r.offset,
                    h(r, "outbox-relay-commit-lsn"),
                    h(r, "outbox-relay-index")
                )
            })
            .collect();
        eprintln!("  duplicate {id}: {}", at.join(", "));
    }
    let dups = check_all(sink, committed, records, destination, what);
    assert_eq!(dups, 0, "{} {what}: duplicates in exactly-once mode", S::NAME);
    for r in records {
        for h in ["outbox-relay-source", "outbox-relay-commit-lsn", "outbox-relay-index"] {
            assert!(r.header(h).is_some(), "{} {what}: {h} on every record: {r:?}", S::NAME);
        }
    }
    sink.check_exactly_once(records, logs);
}

/// Reads `name` until it holds `committed`, then once more after 2 s (whatever arrives late
/// still arrives: a duplicate must be counted), and returns the longer read.
async fn read_settled<S: SinkHarness>(sink: &S, name: &str, want: usize) -> Vec<Received> {
    let first = sink.read(&[name], want, READ).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = sink.read(&[name], want, Duration::from_secs(10)).await;
    if again.len() >= first.len() {
        again
    } else {
        first
    }
}

fn merge(into: &mut Committed, more: Committed) {
    for (agg, events) in more.by_aggregate {
        into.by_aggregate.entry(agg).or_default().extend(events);
    }
}

// ---- The scenarios ----

/// A schema-A workload routed by event type (`order.placed` → destination `placed`, …) with the
/// shipped defaults but the sink and the route: every event once, at its destination, with its
/// key and payload, each aggregate's events of a destination in commit order; the timestamp
/// where the sink carries one; the sink's own fields; a SIGTERM ends the relay with exit 0.
async fn workload<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    let caps = S::capabilities();
    let names: Vec<&str> = EVENT_TYPES.iter().map(|t| t.trim_start_matches("order.")).collect();
    sink.create(&names).await;
    let name_of = |event_type: &str| sink.destination(event_type.trim_start_matches("order."));
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = sink.configure(config, r"^order\.(?<routedByValue>.*)$", "${routedByValue}");
    let mut relay = run_streaming(&sink, &config).await;
    let started = Instant::now();
    let (events, aggregates) = caps.workload;
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, events, aggregates, 4),
    )
    .await;
    let records = sink.read(&names, committed.len(), READ).await;
    let elapsed = started.elapsed();
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| name_of(&e.event_type));
    assert_eq!(dups, 0, "{}: a clean run delivers exactly once", S::NAME);
    for name in &names {
        let destination = sink.destination(name);
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in records.iter().filter(|r| r.topic == destination) {
            got.entry(r.key_str().expect("key").to_owned())
                .or_default()
                .push(id_of(r));
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| name_of(&e.event_type) == destination)
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{destination} {agg}");
        }
    }
    if caps.timestamps {
        assert!(
            records
                .iter()
                .all(|r| r.timestamp_ms.is_some_and(|t| t > 1_600_000_000_000)),
            "{}: created_at → the record's timestamp",
            S::NAME
        );
    }
    sink.check_records(&records);
    sink.check_workload(&records, &relay.log_text());
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay exits after SIGTERM");
    assert!(status.success(), "{}: {status:?}\n{}", S::NAME, relay.log_text());
    eprintln!(
        "{} workload: {} events over {} destinations, 0 lost, 0 duplicates, read back within {elapsed:?}",
        S::NAME,
        all.len(),
        names.len()
    );
    sink.finish().await;
}

/// At least once: the relay SIGKILLed 5 times (20 long) under load, at random moments from
/// before streaming to well into it, restarted each time: nothing lost, first deliveries in
/// order, duplicates within what the kills can have left unconfirmed (kills × `max_in_flight`:
/// the relay confirms as soon as acknowledgements move the watermark).
async fn kill_9_under_load<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    let max_in_flight = 50;
    sink.create(&["order"]).await;
    let (db, _client, config) = order_db(&sink, "order").await;
    let config = fast_restarts(config).max_in_flight(max_in_flight);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * S::capabilities().per_kill, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, kills, (300, 1500), || sink.run(&config)).await;
    let _relay = sink.run(&config);
    let records = sink.read(&["order"], committed.len(), READ).await;
    let what = format!("{kills} SIGKILLs, at-least-once");
    let dups = check_all(&sink, &committed, &records, &sink.destination("order"), &what);
    let bound = kills * max_in_flight as usize;
    assert!(
        dups <= bound,
        "{} {what}: {dups} duplicates exceed the in-flight bound {bound}",
        S::NAME
    );
    sink.finish().await;
}

/// One arm of [`server_away_30_seconds`]: a database, its relay and its load.
struct Arm {
    variant: Variant,
    /// Which of the test's servers it publishes to.
    sink: usize,
    name: String,
    url: String,
    client: Client,
    slot: String,
    relay: RelayProcess,
    load: tokio::task::JoinHandle<Committed>,
}

/// The server taken away for 30 s under load ([`SinkHarness::take_down`]: frozen, stopped, cut
/// or not listening) and brought back, with the relay in each [`Variant`] at once (a database
/// and destination each, on one server, or one each where the harness asks for it:
/// `Capabilities::server_per_arm`): an event committed during the outage is not confirmed before the
/// server is back, the relay keeps running and its log shows the outage, every event committed
/// before, during and after arrives in order (exactly-once: once).
async fn server_away_30_seconds<S: SinkHarness>(test: &str) {
    let caps = S::capabilities();
    let mut variants = vec![Variant::ShortBackoff, Variant::ShippedDefaults];
    if caps.exactly_once.is_some() {
        variants.push(Variant::ExactlyOnce);
    }
    // One server for every arm, or one each where one would be the bottleneck.
    let servers = if caps.server_per_arm { variants.len() } else { 1 };
    let mut sinks: Vec<S> = Vec::new();
    for _ in 0..servers {
        let Some(sink) = S::start(test, Server::Own).await else {
            return;
        };
        sinks.push(sink);
    }
    let mut arms = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let sink = &sinks[i.min(servers - 1)];
        let name = format!("order_{}", variant.suffix());
        sink.create(&[&name]).await;
        let (db, client, config) = order_db(sink, &format!("${{routedByValue}}_{}", variant.suffix())).await;
        let config = apply(sink, config, *variant);
        let relay = run_streaming(sink, &config).await;
        let url = shared_cluster().await.url(&db);
        let mut w = Workload::new(OutboxSchema::B, 4 * caps.per_kill, 30, 4);
        w.pause = Duration::from_millis(50);
        let load_url = url.clone();
        let load = tokio::spawn(async move { run_workload(&load_url, &w).await });
        arms.push(Arm {
            variant: *variant,
            sink: i.min(servers - 1),
            name,
            url,
            client,
            slot: config.slot.clone(),
            relay,
            load,
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let away = Instant::now();
    for sink in &mut sinks {
        sink.take_down().await;
    }
    // An event committed during the outage, in each arm: its transaction stays unconfirmed
    // until the server is back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = join_all(arms.iter().map(|arm| async move {
        let mut c = shared_cluster().await.client(&db_of(&arm.url)).await;
        let tx = c.transaction().await.unwrap();
        let probe = TxnProbe::start(&tx).await;
        let ev = insert_event(&tx, OutboxSchema::B, &new_uuid(), 0).await;
        tx.commit().await.unwrap();
        let point = probe.finish(&c).await;
        let what = format!("{} away ({})", S::NAME, arm.variant.label());
        assert_never_confirmed_past(&arm.client, &arm.slot, point.end_lsn, Duration::from_secs(20), &what).await;
        ev
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(away.elapsed())).await;
    for sink in &mut sinks {
        sink.bring_back().await;
    }
    let back = Instant::now();
    let sinks = &sinks;
    let checks = arms.into_iter().zip(held).map(|(arm, held)| async move {
        let Arm {
            variant,
            sink,
            name,
            url,
            relay,
            load,
            ..
        } = arm;
        let sink = &sinks[sink];
        let mut committed = load.await.expect("workload");
        let later = run_workload(&url, &Workload::new(OutboxSchema::B, caps.per_kill / 2, 10, 2)).await;
        merge(&mut committed, later);
        committed
            .by_aggregate
            .entry(held.aggregate_id.clone())
            .or_default()
            .push(held);
        let records = if variant == Variant::ExactlyOnce {
            read_settled(sink, &name, committed.len()).await
        } else {
            sink.read(&[&name], committed.len(), READ).await
        };
        let what = format!(
            "away 30 s ({}), caught up {:?} after it was back",
            variant.label(),
            back.elapsed()
        );
        let log = relay.log_text();
        if variant == Variant::ExactlyOnce {
            check_exactly_once(
                sink,
                &committed,
                &records,
                &sink.destination(&name),
                std::slice::from_ref(&log),
                &what,
            );
        } else {
            check_all(sink, &committed, &records, &sink.destination(&name), &what);
        }
        sink.check_outage_log(&log, variant);
        let mut relay = relay;
        assert!(
            relay.try_exit_status().is_none(),
            "{} {what}: the relay keeps running through an outage:\n{log}",
            S::NAME
        );
    });
    join_all(checks).await;
}

/// The database name in a `postgres://…/db` URL.
fn db_of(url: &str) -> String {
    url.rsplit('/')
        .next()
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default()
        .to_owned()
}

// ---- Bad events ----

/// One bad-event setup: a sink namespace, a schema-A database with the sink's header columns,
/// and the relay config under `policy`.
struct BadSetup<S> {
    sink: S,
    client: Client,
    config: RelayConfig,
    /// The one aggregate of every event: the good events after a bad one wait for the relay's
    /// decision about it (the key is fenced), so the good ones arrive in commit order.
    aggregate: String,
    columns: usize,
}

/// A committed row and where its transaction ends.
struct Written {
    id: String,
    point: CommitPoint,
}

async fn bad_setup<S: SinkHarness>(test: &str, policy: Policy) -> Option<BadSetup<S>> {
    let sink = S::start(test, Server::Shared).await?;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let columns = sink.header_columns();
    if columns > 0 {
        let add: Vec<String> = (0..columns).map(|i| format!("ADD COLUMN h{i} text")).collect();
        client
            .batch_execute(&format!("ALTER TABLE events_outbox {}", add.join(", ")))
            .await
            .unwrap();
    }
    let mut config = fast_restarts(sink.configure(config, BAD_ROUTE, "${routedByValue}")).set(
        "relay",
        "on_bad_event",
        policy.as_str(),
    );
    for i in 0..columns {
        config = config.header_column(&format!("h{i}"), &format!("h{i}"));
    }
    if policy == Policy::DeadLetter {
        config = config.set("relay", "dead_letter_topic", sink.destination("dead"));
    }
    let config = sink.prepare_bad(&client, config, policy).await;
    let mut names = vec!["good"];
    if policy == Policy::DeadLetter {
        names.push("dead");
    }
    sink.create(&names).await;
    Some(BadSetup {
        sink,
        client,
        config,
        aggregate: new_uuid(),
        columns,
    })
}

impl<S: SinkHarness> BadSetup<S> {
    /// Commits one row of the aggregate: routed by `route`, `payload`, every header column set
    /// or none.
    async fn insert(&self, route: &str, payload: &str, headers: bool) -> Written {
        let cols: String = (0..self.columns).map(|i| format!(", h{i}")).collect();
        let vals: String = (0..self.columns).map(|_| ", $4").collect();
        let h = headers.then_some("v");
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&self.aggregate, &route, &payload];
        if self.columns > 0 {
            params.push(&h);
        }
        let mut client = shared_cluster().await.client(&db_of(&self.config.postgres_url)).await;
        let tx = client.transaction().await.unwrap();
        let probe = TxnProbe::start(&tx).await;
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO events_outbox (aggregate_id, type, payload{cols})
                     VALUES ($1::text::uuid, $2, $3::text::jsonb{vals}) RETURNING id::text"
                ),
                &params,
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        Written {
            id: row.get(0),
            point: probe.finish(&client).await,
        }
    }

    async fn good(&self, n: usize) -> Written {
        self.insert("good", &format!("{{\"n\": {n}}}"), false).await
    }

    async fn bad(&self, kind: &BadKind) -> Written {
        match &kind.row {
            BadRow::Payload(n) => {
                self.insert("good", &format!("{{\"blob\": \"{}\"}}", "x".repeat(*n)), false)
                    .await
            }
            BadRow::Route(route) => self.insert(route, "{}", false).await,
            BadRow::AllHeaders => self.insert("good", "{}", true).await,
            BadRow::Marked(marker) => self.insert("good", &format!("{{\"n\": \"{marker}\"}}"), false).await,
        }
    }

    /// good 0, then each of `kinds` followed by good 1, 2, …
    async fn goods_around(&self, kinds: &[BadKind]) -> (Vec<Written>, Vec<Written>) {
        let mut goods = vec![self.good(0).await];
        let mut bads = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            bads.push(self.bad(kind).await);
            goods.push(self.good(i + 1).await);
        }
        (goods, bads)
    }

    /// The first deliveries of `name` once `n` distinct events arrived there (or the read timed out).
    async fn firsts(&self, name: &str, n: usize, timeout: Duration) -> Vec<String> {
        let records = self.sink.read(&[name], n, timeout).await;
        let mut seen = HashSet::new();
        records.iter().map(id_of).filter(|id| seen.insert(id.clone())).collect()
    }
}

fn ids(written: &[Written]) -> Vec<String> {
    written.iter().map(|w| w.id.clone()).collect()
}

/// `fail`, for each bad kind of the sink (each with a namespace and a relay of its own, all at
/// once): the relay exits 1 naming the event and the cause; the slot confirms the good event
/// before it and nothing of the bad one's transaction; the bad one is not published, and where
/// the kind is refused before a later event goes out ([`BadKind::nothing_after`]), nothing
/// after it either.
async fn bad_events_fail<S: SinkHarness>(test: &str) {
    let kinds: Vec<BadKind> = S::bad_kinds().into_iter().filter(|k| k.under_fail).collect();
    let cases = kinds.iter().map(|kind| async move {
        let Some(setup) = bad_setup::<S>(test, Policy::Fail).await else {
            return;
        };
        let mut relay = run_streaming(&setup.sink, &setup.config).await;
        let before = setup.good(0).await;
        let bad = setup.bad(kind).await;
        let _after = setup.good(1).await;
        let status = relay.wait_exit(Duration::from_secs(90)).await;
        let log = relay.log_text();
        let what = format!("{} {}", S::NAME, kind.name);
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{what}: exit 1; log:\n{log}");
        assert!(
            log.contains(&format!("id={}", bad.id)),
            "{what}: names the event; log:\n{log}"
        );
        assert!(
            log.contains(kind.cause),
            "{what}: names the cause {:?}; log:\n{log}",
            kind.cause
        );
        let confirmed = confirmed_flush_lsn(&setup.client, &setup.config.slot)
            .await
            .unwrap_or(0);
        assert!(
            confirmed >= before.point.end_lsn && confirmed < bad.point.end_lsn,
            "{what}: confirmed {} must cover the event before ({}) and nothing of the bad one's transaction ({})",
            format_lsn(confirmed),
            format_lsn(before.point.end_lsn),
            format_lsn(bad.point.end_lsn)
        );
        let firsts = setup.firsts("good", 1, Duration::from_secs(60)).await;
        if kind.nothing_after {
            assert_eq!(
                firsts,
                vec![before.id.clone()],
                "{what}: the event before, and nothing after the bad one"
            );
        } else {
            assert_eq!(firsts.first(), Some(&before.id), "{what}: the event before first");
            assert!(
                !firsts.contains(&bad.id),
                "{what}: the bad event is not published: {firsts:?}"
            );
        }
        setup.sink.finish().await;
    });
    join_all(cases).await;
}

/// `skip`: every bad kind between good events of one aggregate; the good ones arrive, first
/// deliveries in commit order (once each where every kind is refused on sight), no bad one; each skip is a WARN line naming the event; the slot
/// confirms the last good event.
async fn bad_events_skip<S: SinkHarness>(test: &str) {
    let Some(setup) = bad_setup::<S>(test, Policy::Skip).await else {
        return;
    };
    let kinds = S::bad_kinds();
    let relay = run_streaming(&setup.sink, &setup.config).await;
    let (goods, bads) = setup.goods_around(&kinds).await;
    let firsts = setup.firsts("good", goods.len(), Duration::from_secs(90)).await;
    assert_eq!(
        firsts,
        ids(&goods),
        "{}: every good event, first deliveries in commit order, no bad one\n{}",
        S::NAME,
        relay.log_text()
    );
    let last = goods.last().unwrap().point.end_lsn;
    assert!(
        confirmed_reaches(&setup.client, &setup.config.slot, last, Duration::from_secs(30)).await,
        "{}: the slot confirms past the skipped events\n{}",
        S::NAME,
        relay.log_text()
    );
    if kinds.iter().all(|k| k.on_sight) {
        // Nothing was refused after it went out: no session ended, nothing was replayed.
        let all = setup.sink.read(&["good"], goods.len(), Duration::from_secs(5)).await;
        assert_eq!(
            all.len(),
            goods.len(),
            "{}: the good events once each: {all:?}",
            S::NAME
        );
    }
    let log = relay.log_text();
    for (kind, bad) in kinds.iter().zip(&bads) {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("skipped a bad outbox event")
                && l.contains(&format!("id={} ", bad.id))),
            "{} {}: no WARN line for the skipped event {}; log:\n{log}",
            S::NAME,
            kind.name,
            bad.id
        );
    }
    setup.sink.check_skipped(&log).await;
    setup.sink.finish().await;
}

/// `dead-letter`: every bad kind whose raw row fits a dead letter, between good events of one
/// aggregate; the good ones arrive in commit order; a dead letter per bad event (once each and
/// in commit order where every kind is refused on sight: [`BadKind::on_sight`]), its error
/// naming the cause.
async fn bad_events_dead_letter<S: SinkHarness>(test: &str) {
    let Some(setup) = bad_setup::<S>(test, Policy::DeadLetter).await else {
        return;
    };
    let kinds: Vec<BadKind> = S::bad_kinds().into_iter().filter(|k| k.dead_letter).collect();
    let relay = run_streaming(&setup.sink, &setup.config).await;
    let (goods, bads) = setup.goods_around(&kinds).await;
    let firsts = setup.firsts("good", goods.len(), Duration::from_secs(90)).await;
    assert_eq!(
        firsts,
        ids(&goods),
        "{}: every good event, first deliveries in commit order, no bad one\n{}",
        S::NAME,
        relay.log_text()
    );
    let dead = setup.sink.read(&["dead"], bads.len(), Duration::from_secs(60)).await;
    let mut seen = HashSet::new();
    let letters: Vec<String> = dead.iter().map(id_of).filter(|id| seen.insert(id.clone())).collect();
    // A dead letter made on sight can come before that of an earlier event the broker refused
    // (its refusal ends the session; the replay repeats what followed): in commit order, and
    // once each, only where every kind is refused on sight.
    if kinds.iter().all(|k| k.on_sight) {
        assert_eq!(
            dead.len(),
            letters.len(),
            "{}: each dead letter once: {dead:?}",
            S::NAME
        );
        assert_eq!(
            letters,
            ids(&bads),
            "{}: a dead letter per bad event, in commit order\n{}",
            S::NAME,
            relay.log_text()
        );
    } else {
        let mut sorted = letters.clone();
        sorted.sort();
        let mut want = ids(&bads);
        want.sort();
        assert_eq!(
            sorted,
            want,
            "{}: a dead letter per bad event\n{}",
            S::NAME,
            relay.log_text()
        );
    }
    let log = relay.log_text();
    for (kind, bad) in kinds.iter().zip(&bads) {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("dead-lettering a bad outbox event")
                && l.contains(&format!("id={} ", bad.id))
                && l.contains(kind.cause)),
            "{} {}: no WARN line naming the dead-lettered event {} and the cause {:?}; log:\n{log}",
            S::NAME,
            kind.name,
            bad.id,
            kind.cause
        );
        for letter in dead.iter().filter(|r| id_of(r) == bad.id) {
            let error =
                String::from_utf8_lossy(letter.header("outbox-relay-error").expect("the error header")).into_owned();
            // In any case: a broker's refusal may be worded in its own capitals (MESSAGE_TOO_LARGE).
            assert!(
                error.to_lowercase().contains(&kind.cause.to_lowercase()),
                "{} {}: {error}",
                S::NAME,
                kind.name
            );
            setup.sink.check_dead_letter(letter, kind);
        }
    }
    eprintln!(
        "{} dead letters: {} bad events, {} records ({} repeated by a replay)",
        S::NAME,
        bads.len(),
        dead.len(),
        dead.len() - letters.len()
    );
    setup.sink.finish().await;
}

// ---- Exactly-once ----

/// Exactly-once: SIGKILLs under load (the sink's count), then (with failpoints) a relay stopped
/// between an acknowledgement and its confirmation, which leaves acknowledged events to replay:
/// each event exactly once, with its source position.
async fn exactly_once_kills<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    let eo = S::capabilities().exactly_once.expect("the sink delivers exactly once");
    sink.create(&["order"]).await;
    let (db, _client, config) = order_db(&sink, "order").await;
    let config = fast_restarts(config)
        .set("relay", "delivery", "exactly-once")
        .max_in_flight(50);
    let kills = if long_tests() { eo.long_kills } else { eo.kills };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * eo.per_kill, 30, 4);
    w.pause = Duration::from_millis(10);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    let mut logs = Vec::new();
    for _ in 0..kills {
        let relay = sink.run(&config);
        tokio::time::sleep(Duration::from_millis(300 + random_below(1000))).await;
        assert!(relay.sigkill(), "{}", relay.log_text());
        logs.push(relay.log_text());
    }
    let mut committed = load.await.expect("workload");
    // Whether a SIGKILL lands between an acknowledgement and its confirmation is luck (the relay
    // confirms as soon as acknowledgements complete transactions); the failpoint stops a relay
    // right there.
    if cfg!(feature = "failpoints") {
        let mut w = Workload::new(OutboxSchema::B, 3 * eo.per_kill, 30, 2);
        w.pause = Duration::from_millis(5);
        let load = tokio::spawn(async move { run_workload(&url, &w).await });
        let mut crashed = sink.run_with(&config, &[("FAILPOINTS", "relay::acked_before_status=return")]);
        let status = crashed.wait_exit(Duration::from_secs(60)).await;
        assert!(
            status.is_some_and(|s| !s.success()) && crashed.log_text().contains("failpoint relay::acked_before_status"),
            "{}: the failpoint did not stop the relay; log:\n{}",
            S::NAME,
            crashed.log_text()
        );
        logs.push(crashed.log_text());
        merge(&mut committed, load.await.expect("workload"));
    } else {
        crate::harness::needs::missing(
            crate::harness::needs::FAILPOINTS,
            test,
            "the crash between an acknowledgement and its confirmation",
        );
    }
    let what = format!("exactly-once ({}), {kills} SIGKILLs", eo.how);
    settle_exactly_once(sink, &config, &committed, logs, &what).await;
}

/// Exactly-once SIGKILLs with every `[relay]` and sink default: each event once.
async fn exactly_once_kills_with_shipped_defaults<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    let eo = S::capabilities().exactly_once.expect("the sink delivers exactly once");
    sink.create(&["order"]).await;
    let (db, _client, config) = order_db(&sink, "order").await;
    let config = config.set("relay", "delivery", "exactly-once");
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 10 * eo.per_kill, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, 5, (500, 1000), || sink.run(&config)).await;
    let what = format!("exactly-once ({}), 5 SIGKILLs, shipped defaults", eo.how);
    settle_exactly_once(sink, &config, &committed, Vec::new(), &what).await;
}

/// After the kills: one more relay runs until `order` holds every committed event, then each
/// event is checked delivered once ([`check_exactly_once`], with that relay's log added to
/// `logs`) and the sink is finished.
async fn settle_exactly_once<S: SinkHarness>(
    sink: S,
    config: &RelayConfig,
    committed: &Committed,
    mut logs: Vec<String>,
    what: &str,
) {
    let relay = sink.run(config);
    let records = read_settled(&sink, "order", committed.len()).await;
    logs.push(relay.log_text());
    check_exactly_once(&sink, committed, &records, &sink.destination("order"), &logs, what);
    sink.finish().await;
}

/// Where the sink (or a configuration of it) cannot deliver exactly once, `run` and
/// `setup --check` refuse `relay.delivery = "exactly-once"` before connecting to anything, with
/// the reason and the fix; nothing is published.
async fn exactly_once_refused_at_start<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    sink.create(&["order"]).await;
    let (_db, client, config) = order_db(&sink, "order").await;
    let config = fast_restarts(config).set("relay", "delivery", "exactly-once");
    let (refused, says) = sink
        .exactly_once_refusal(config)
        .expect("the sink refuses exactly-once in some configuration");
    insert_event(&client, OutboxSchema::B, &new_uuid(), 0).await;
    let mut relay = sink.run(&refused);
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "{}: refused at start; log:\n{log}",
        S::NAME
    );
    for needle in says.iter().chain(&["relay.delivery", "at-least-once"]) {
        assert!(
            log.contains(needle),
            "{}: the refusal says {needle:?}; log:\n{log}",
            S::NAME
        );
    }
    let env = sink.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let check = relay_process::run_cmd_with(&["setup", "--check"], &refused, &env, Duration::from_secs(60)).await;
    let said = String::from_utf8_lossy(&check.stderr).into_owned() + &String::from_utf8_lossy(&check.stdout);
    assert!(
        !check.status.success(),
        "{}: setup --check refuses it too: {said}",
        S::NAME
    );
    for needle in says {
        assert!(
            said.contains(needle),
            "{}: setup --check says {needle:?}: {said}",
            S::NAME
        );
    }
    let records = sink.read(&["order"], 1, Duration::from_secs(3)).await;
    assert!(records.is_empty(), "{}: nothing published: {records:?}", S::NAME);
    sink.finish().await;
}

// ---- Two relays ----

/// Two relays on two databases writing one destination. Exactly-once where the sink can: 6
/// SIGKILLs (30 long), one relay at a time, each restarted; their deduplication keys differ by
/// source, so neither takes the other's events for duplicates: two sources in the destination,
/// each event once. Elsewhere a clean run: each database's events once, nothing else.
async fn two_relays_one_destination<S: SinkHarness>(test: &str) {
    let Some(sink) = S::start(test, Server::Shared).await else {
        return;
    };
    let caps = S::capabilities();
    sink.create(&["order"]).await;
    let mut configs = Vec::new();
    let mut loads = Vec::new();
    for _ in 0..2 {
        let (db, _client, config) = order_db(&sink, "order").await;
        let config = match caps.exactly_once {
            Some(_) => fast_restarts(config)
                .set("relay", "delivery", "exactly-once")
                .max_in_flight(30),
            None => config,
        };
        configs.push(config);
        let url = shared_cluster().await.url(&db);
        let mut w = Workload::new(OutboxSchema::B, 3 * caps.per_kill, 30, 3);
        w.pause = Duration::from_millis(5);
        loads.push(tokio::spawn(async move { run_workload(&url, &w).await }));
    }
    let mut relays: Vec<RelayProcess> = configs.iter().map(|c| sink.run(c)).collect();
    let mut logs = Vec::new();
    let kills = match caps.exactly_once {
        Some(_) if long_tests() => 30,
        Some(_) => 6,
        None => 0,
    };
    for kill in 0..kills {
        tokio::time::sleep(Duration::from_millis(300 + random_below(1200))).await;
        let i = kill % 2;
        assert!(relays[i].sigkill(), "{}", relays[i].log_text());
        logs.push(relays[i].log_text());
        relays[i] = sink.run(&configs[i]);
    }
    let mut committed = Committed::default();
    for load in loads {
        merge(&mut committed, load.await.expect("workload"));
    }
    let records = read_settled(&sink, "order", committed.len()).await;
    logs.extend(relays.iter().map(RelayProcess::log_text));
    let destination = sink.destination("order");
    if caps.exactly_once.is_some() {
        let sources: HashSet<&[u8]> = records.iter().filter_map(|r| r.header("outbox-relay-source")).collect();
        assert_eq!(sources.len(), 2, "{}: two sources in one destination", S::NAME);
        let what = format!("two relays, one destination, {kills} SIGKILLs");
        check_exactly_once(&sink, &committed, &records, &destination, &logs, &what);
    } else {
        let dups = check_all(&sink, &committed, &records, &destination, "two relays, one destination");
        assert_eq!(dups, 0, "{}: a clean run delivers exactly once", S::NAME);
        assert_eq!(
            records.len(),
            committed.len(),
            "{}: nothing but the two databases' events",
            S::NAME
        );
    }
    sink.finish().await;
}
