//! The Redis Streams sink end to end through `outbox-relay run` (docs/sink-redis.md): routing,
//! keys, fields and order of a workload; SIGKILLs under load; the broker stopped 30 s and
//! restarted; bad events under each `relay.on_bad_event`; exactly-once across SIGKILLs; two
//! relays on two databases writing one stream.
//!
//! The shared Redis on 127.0.0.1:6379 is never stopped: each test writes streams named after a
//! unique prefix (through `[route]`) and deletes them at the end; the restart test runs a
//! `redis-server` of its own with AOF on (`appendfsync always`), so what is measured is the
//! relay, not Redis' lack of persistence.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::redis::{connect, delete, read_stream, read_streams_until, PrivateRedis, SHARED_REDIS};
use crate::harness::workload::{Committed, ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// A relay config for `config`'s database (schema B, routed by `aggregate_type` = `order`)
/// publishing to Redis at `url`, every event to the stream `<prefix>.order`.
fn to_redis(config: RelayConfig, url: &str, prefix: &str) -> RelayConfig {
    config
        .sink("redis", &[("url", url)])
        .route("(?<routedByValue>.*)", &format!("{prefix}.${{routedByValue}}"))
}

fn fast_restarts(config: RelayConfig) -> RelayConfig {
    config
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500)
}

fn exactly_once(config: RelayConfig) -> RelayConfig {
    fast_restarts(config).set("relay", "delivery", "exactly-once")
}

/// Every committed event at least once (key, payload, stream), first deliveries in commit
/// order per aggregate; returns the duplicates.
fn check_all(committed: &Committed, records: &[Received], stream: &str, what: &str) -> usize {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, records, |_| stream.to_owned());
    check_order(committed, records);
    eprintln!("{what}: {} events, 0 lost, {dups} duplicates", all.len());
    dups
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_lands_routed_keyed_with_every_field_in_order() {
    let prefix = unique_name("redis_e2e");
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    // Shipped defaults but for the sink and the route: every event type to a stream of its own.
    let config = config
        .sink("redis", &[("url", SHARED_REDIS)])
        .route("(?<routedByValue>.*)", &format!("{prefix}.${{routedByValue}}"));
    let streams: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{prefix}.{t}")).collect();
    let _relay = RelayProcess::run_streaming(&config).await;
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, 400, 20, 4),
    )
    .await;
    let records = read_streams_until(SHARED_REDIS, &streams, committed.len(), Duration::from_secs(60)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| format!("{prefix}.{}", e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
    // Per stream, each aggregate's events of that type in commit order.
    for stream in &streams {
        let in_stream: Vec<&Received> = records.iter().filter(|r| &r.topic == stream).collect();
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &in_stream {
            got.entry(r.key_str().unwrap().to_owned()).or_default().push(id_of(r));
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| stream.ends_with(&e.event_type))
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{stream} {agg}");
        }
    }
    // The fields, in the documented order.
    let r = &records[0];
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["id", "key", "timestamp", "payload"], "{r:?}");
    let ts = r.timestamp_ms.expect("created_at as the timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - ts).abs() < 600_000, "timestamp {ts} is the row's created_at");
    eprintln!(
        "workload: {} events in {} streams, 0 lost, 0 duplicates",
        all.len(),
        streams.len()
    );
    delete(SHARED_REDIS, &streams).await;
}

/// At-least-once: the relay SIGKILLed under load, restarted each time; nothing lost, first
/// deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_nothing() {
    let prefix = unique_name("redis_kill");
    let stream = format!("{prefix}.order");
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = fast_restarts(to_redis(config, SHARED_REDIS, &prefix)).max_in_flight(50);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 200, 30, 4);
    w.pause = Duration::from_millis(10);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    let started = Instant::now();
    for _ in 0..kills {
        let relay = RelayProcess::run(&config);
        tokio::time::sleep(Duration::from_millis(300 + random_below(1500))).await;
        assert!(relay.sigkill(), "{}", relay.log_text());
    }
    let committed = load.await.expect("workload");
    let _relay = RelayProcess::run(&config);
    let records = read_streams_until(
        SHARED_REDIS,
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(90),
    )
    .await;
    check_all(&committed, &records, &stream, &format!("{kills} SIGKILLs"));
    eprintln!("sigkill test took {:?}", started.elapsed());
    delete(SHARED_REDIS, &[stream]).await;
}

/// The replayed records a relay's log says Redis dropped as duplicates.
fn duplicates_dropped(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("Redis dropped replayed records"))
        .filter_map(|l| {
            l.split("duplicates=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

/// Exactly-once: 20 SIGKILLs under load, each event in the stream exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_20_sigkills_has_no_duplicate() {
    let prefix = unique_name("redis_eo");
    let stream = format!("{prefix}.order");
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = exactly_once(to_redis(config, SHARED_REDIS, &prefix)).max_in_flight(50);
    let kills = 20;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 100, 30, 4);
    w.pause = Duration::from_millis(10);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    let mut dropped_by_redis = 0usize;
    for _ in 0..kills {
        let relay = RelayProcess::run(&config);
        tokio::time::sleep(Duration::from_millis(300 + random_below(1000))).await;
        assert!(relay.sigkill(), "{}", relay.log_text());
        dropped_by_redis += duplicates_dropped(&relay.log_text());
    }
    let mut committed = load.await.expect("workload");
    // Whether a SIGKILL lands between an acknowledgement and its confirmation is luck (the relay
    // confirms as soon as acknowledgements complete transactions). A relay stopped by the
    // failpoint right there leaves acknowledged events to replay, which the dedup sets must drop.
    if cfg!(feature = "failpoints") {
        let mut w = Workload::new(OutboxSchema::B, 300, 30, 2);
        w.pause = Duration::from_millis(5);
        let load = tokio::spawn(async move { run_workload(&url, &w).await });
        let mut crashed = RelayProcess::run_with(&config, &[], &[("FAILPOINTS", "relay::acked_before_status=return")]);
        let status = crashed.wait_exit(Duration::from_secs(60)).await;
        assert!(
            status.is_some_and(|s| !s.success()) && crashed.log_text().contains("failpoint relay::acked_before_status"),
            "the failpoint did not stop the relay; log:\n{}",
            crashed.log_text()
        );
        for (agg, events) in load.await.expect("workload").by_aggregate {
            committed.by_aggregate.entry(agg).or_default().extend(events);
        }
    }
    let relay = RelayProcess::run(&config);
    let records = read_streams_until(
        SHARED_REDIS,
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(90),
    )
    .await;
    // Nothing more arrives once everything did.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = read_stream(SHARED_REDIS, &stream).await.max_by_len(records);
    let dups = check_all(&committed, &records, &stream, "exactly-once, 20 SIGKILLs");
    assert_eq!(dups, 0, "duplicates in exactly-once mode; log:\n{}", relay.log_text());
    dropped_by_redis += duplicates_dropped(&relay.log_text());
    eprintln!("replayed records Redis' dedup sets dropped: {dropped_by_redis}");
    assert!(
        dropped_by_redis > 0 || !cfg!(feature = "failpoints"),
        "the failpoint crash should have made replays for the dedup sets to drop"
    );
    for r in &records {
        for h in ["outbox-relay-source", "outbox-relay-commit-lsn", "outbox-relay-index"] {
            assert!(r.header(h).is_some(), "{h} on every entry");
        }
    }
    delete(SHARED_REDIS, &[stream]).await;
}

/// The broker stopped for 30 s under load and started again (AOF on, so what it had acknowledged
/// survives): nothing lost, and streaming resumes — events committed after the restart arrive.
/// `shipped`: every `[relay]` and `[redis]` default (reconnect backoff up to 30 s, 10,000 in
/// flight) instead of the shortened ones.
async fn broker_down_30_seconds(exactly: bool, shipped: bool) {
    let mut server = PrivateRedis::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let prefix = unique_name("redis_down");
    let stream = format!("{prefix}.order");
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let mut config = to_redis(config, &server.url(), &prefix);
    if exactly {
        config = config.set("relay", "delivery", "exactly-once");
    }
    if !shipped {
        config = fast_restarts(config).max_in_flight(50);
    }
    let relay = RelayProcess::run_streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 600, 30, 4);
    w.pause = Duration::from_millis(50);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = read_stream(&server.url(), &stream).await.len();
    server.stop();
    tokio::time::sleep(Duration::from_secs(30)).await;
    server.restart();
    let restarted = Instant::now();
    let after_restart = read_stream(&server.url(), &stream).await.len();
    assert!(
        after_restart >= before,
        "AOF kept what Redis acknowledged ({before} → {after_restart})"
    );
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 100, 10, 2)).await;
    committed.by_aggregate.extend(later.by_aggregate);
    let records = read_streams_until(
        &server.url(),
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(120),
    )
    .await;
    let caught_up = restarted.elapsed();
    let log = relay.log_text();
    assert!(log.contains("Redis"), "the outage should show in the log:\n{log}");
    let what = format!(
        "Redis down 30 s ({}, {}), {before} entries before the stop, caught up {caught_up:?} after the restart",
        if exactly { "exactly-once" } else { "at-least-once" },
        if shipped {
            "shipped defaults"
        } else {
            "backoff 100-500 ms, 50 in flight"
        }
    );
    let dups = check_all(&committed, &records, &stream, &what);
    if exactly {
        assert_eq!(dups, 0, "{what}: duplicates");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_30_seconds_loses_nothing() {
    broker_down_30_seconds(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_30_seconds_exactly_once_publishes_each_event_once() {
    broker_down_30_seconds(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_30_seconds_with_shipped_defaults_loses_nothing() {
    broker_down_30_seconds(false, true).await;
}

/// Exactly-once SIGKILLs with every `[relay]` and `[redis]` default.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_sigkills_with_shipped_defaults_have_no_duplicate() {
    let prefix = unique_name("redis_eo_defaults");
    let stream = format!("{prefix}.order");
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_redis(config, SHARED_REDIS, &prefix).set("relay", "delivery", "exactly-once");
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 1000, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, 5, (500, 1000), || RelayProcess::run(&config)).await;
    let _relay = RelayProcess::run(&config);
    let records = read_streams_until(
        SHARED_REDIS,
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(90),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = read_stream(SHARED_REDIS, &stream).await.max_by_len(records);
    let dups = check_all(
        &committed,
        &records,
        &stream,
        "exactly-once, 5 SIGKILLs, shipped defaults",
    );
    assert_eq!(dups, 0);
    delete(SHARED_REDIS, &[stream]).await;
}

trait Longer {
    fn max_by_len(self, other: Self) -> Self;
}

impl Longer for Vec<Received> {
    fn max_by_len(self, other: Self) -> Self {
        if self.len() >= other.len() {
            self
        } else {
            other
        }
    }
}

/// `rediss://`: TLS with the server's certificate checked against the system's roots, which
/// `SSL_CERT_FILE` points at the test CA here; without it the relay refuses the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rediss_urls_use_tls_and_check_the_certificate() {
    let (server, tls_port) = PrivateRedis::start_tls();
    let prefix = unique_name("redis_tls");
    let stream = format!("{prefix}.order");
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = fast_restarts(to_redis(config, &format!("rediss://127.0.0.1:{tls_port}"), &prefix));
    // An untrusted certificate is the operator's to fix: the relay stops and says so.
    let mut untrusted = RelayProcess::run(&config);
    let status = untrusted.wait_exit(Duration::from_secs(30)).await;
    let log = untrusted.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    assert!(log.contains("UnknownIssuer") && log.contains("SSL_CERT_FILE"), "{log}");
    drop(untrusted);
    let ca = server.ca_path();
    let relay = RelayProcess::run_with(&config, &[], &[("SSL_CERT_FILE", ca.to_str().unwrap())]);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::B, 50, 5, 2),
    )
    .await;
    let records = read_streams_until(
        &server.url(),
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(30),
    )
    .await;
    let dups = check_all(&committed, &records, &stream, "rediss://");
    assert_eq!(dups, 0);
}

/// Two relays on two databases, exactly-once, writing one stream: their dedup keys differ by
/// source, so neither takes the other's events for duplicates; SIGKILLs on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_on_two_databases_writing_one_stream_lose_nothing() {
    let prefix = unique_name("redis_two");
    let stream = format!("{prefix}.order");
    let mut configs = Vec::new();
    let mut loads = Vec::new();
    for _ in 0..2 {
        let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
        configs.push(exactly_once(to_redis(config, SHARED_REDIS, &prefix)).max_in_flight(50));
        let url = shared_cluster().await.url(&db);
        let mut w = Workload::new(OutboxSchema::B, 500, 20, 2);
        w.pause = Duration::from_millis(10);
        loads.push(tokio::spawn(async move { run_workload(&url, &w).await }));
    }
    for _ in 0..3 {
        let relays: Vec<RelayProcess> = configs.iter().map(RelayProcess::run).collect();
        tokio::time::sleep(Duration::from_millis(500 + random_below(1000))).await;
        for r in &relays {
            assert!(r.sigkill(), "{}", r.log_text());
        }
    }
    let mut committed = Committed::default();
    for load in loads {
        committed
            .by_aggregate
            .extend(load.await.expect("workload").by_aggregate);
    }
    let _relays: Vec<RelayProcess> = configs.iter().map(RelayProcess::run).collect();
    let records = read_streams_until(
        SHARED_REDIS,
        std::slice::from_ref(&stream),
        committed.len(),
        Duration::from_secs(90),
    )
    .await;
    let dups = check_all(&committed, &records, &stream, "two relays, one stream, 3 SIGKILLs each");
    assert_eq!(dups, 0);
    delete(SHARED_REDIS, &[stream]).await;
}

// ---- Bad events ----

/// How an event can be bad for Redis.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    /// The routed stream key holds a string: Redis answers WRONGTYPE.
    WrongType,
    /// Larger than `[redis] max_message_bytes`: refused on sight.
    TooLarge,
    /// The routed name breaks the stream-key rule (a control character).
    InvalidName,
}

const MAX_MESSAGE: usize = 4096;

struct BadSetup {
    client: Client,
    config: RelayConfig,
    prefix: String,
}

async fn bad_setup(policy: &str) -> BadSetup {
    let prefix = unique_name("redis_bad");
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let mut config = fast_restarts(
        config
            .sink(
                "redis",
                &[("url", SHARED_REDIS), ("max_message_bytes", &MAX_MESSAGE.to_string())],
            )
            .route("(?<routedByValue>.*)", &format!("{prefix}.${{routedByValue}}")),
    )
    .set("relay", "on_bad_event", policy);
    if policy == "dead-letter" {
        config = config.set("relay", "dead_letter_topic", format!("{prefix}.dead").as_str());
    }
    // The stream key `wrong` routes to holds a string.
    let mut c = connect(SHARED_REDIS).await;
    let _: () = ::redis::cmd("SET")
        .arg(format!("{prefix}.wrong"))
        .arg("not a stream")
        .query_async(&mut c)
        .await
        .unwrap();
    BadSetup { client, config, prefix }
}

async fn insert(client: &Client, ty: &str, payload: &str) -> String {
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), $1, $2::text::jsonb)
             RETURNING id::text",
            &[&ty, &payload],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn insert_bad(client: &Client, bad: Bad) -> String {
    match bad {
        Bad::WrongType => insert(client, "wrong", "{}").await,
        Bad::TooLarge => {
            insert(
                client,
                "good",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(MAX_MESSAGE * 2)),
            )
            .await
        }
        Bad::InvalidName => insert(client, "bad\u{7}name", "{}").await,
    }
}

fn cause_of(bad: Bad) -> &'static str {
    match bad {
        Bad::WrongType => "WRONGTYPE",
        Bad::TooLarge => "larger",
        Bad::InvalidName => "control characters",
    }
}

async fn goods_around(setup: &BadSetup, bads: &[Bad]) -> (Vec<String>, Vec<String>) {
    let mut goods = vec![insert(&setup.client, "good", "{\"n\": 0}").await];
    let mut bad_ids = Vec::new();
    for (i, bad) in bads.iter().enumerate() {
        bad_ids.push(insert_bad(&setup.client, *bad).await);
        goods.push(insert(&setup.client, "good", &format!("{{\"n\": {}}}", i + 1)).await);
    }
    (goods, bad_ids)
}

/// The good events' first deliveries (a refusal ends the session, and the replay that sends
/// the suspect alone repeats what followed it: at-least-once duplicates, counted).
async fn wait_goods(prefix: &str, goods: &[String]) -> Vec<String> {
    let stream = format!("{prefix}.good");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids: Vec<String> = read_stream(SHARED_REDIS, &stream).await.iter().map(id_of).collect();
        let mut seen = HashSet::new();
        let firsts: Vec<String> = ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect();
        if firsts.len() >= goods.len() || Instant::now() > deadline {
            eprintln!(
                "good events: {} sent, {} distinct arrived, {} duplicates",
                goods.len(),
                firsts.len(),
                ids.len() - firsts.len()
            );
            return firsts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn fail_case(bad: Bad) {
    let setup = bad_setup("fail").await;
    let mut relay = RelayProcess::run_streaming(&setup.config).await;
    let (_goods, bad_ids) = goods_around(&setup, &[bad]).await;
    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{bad:?}: exit 1; log:\n{log}");
    assert!(
        log.contains(&format!("id={}", bad_ids[0])),
        "{bad:?}: names the event; log:\n{log}"
    );
    assert!(log.contains(cause_of(bad)), "{bad:?}: names the cause; log:\n{log}");
    let ids: Vec<String> = read_stream(SHARED_REDIS, &format!("{}.good", setup.prefix))
        .await
        .iter()
        .map(id_of)
        .collect();
    assert!(!ids.contains(&bad_ids[0]));
    delete(
        SHARED_REDIS,
        &[format!("{}.good", setup.prefix), format!("{}.wrong", setup.prefix)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_wrongtype() {
    fail_case(Bad::WrongType).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_large() {
    fail_case(Bad::TooLarge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_bad_name() {
    fail_case(Bad::InvalidName).await;
}

const ALL_BAD: [Bad; 3] = [Bad::WrongType, Bad::TooLarge, Bad::InvalidName];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_skipped_and_the_good_ones_arrive_in_order() {
    let setup = bad_setup("skip").await;
    let _relay = RelayProcess::run_streaming(&setup.config).await;
    let (goods, _bad) = goods_around(&setup, &ALL_BAD).await;
    let ids = wait_goods(&setup.prefix, &goods).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let mut c = connect(SHARED_REDIS).await;
    let ty: String = ::redis::cmd("TYPE")
        .arg(format!("{}.wrong", setup.prefix))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ty, "string", "the bad event's key is left alone");
    delete(
        SHARED_REDIS,
        &[format!("{}.good", setup.prefix), format!("{}.wrong", setup.prefix)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_dead_lettered_to_a_stream() {
    let setup = bad_setup("dead-letter").await;
    let _relay = RelayProcess::run_streaming(&setup.config).await;
    let (goods, bad_ids) = goods_around(&setup, &ALL_BAD).await;
    let ids = wait_goods(&setup.prefix, &goods).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let dead_stream = format!("{}.dead", setup.prefix);
    // Every bad event dead-lettered with its cause. A refusal Redis replies (WRONGTYPE) ends the
    // session, and the replay repeats what followed it: a dead letter made on sight in the
    // first session (too large) can come before the WRONGTYPE one and arrive again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let dead = loop {
        let dead = read_stream(SHARED_REDIS, &dead_stream).await;
        let distinct: HashSet<String> = dead.iter().map(id_of).collect();
        if distinct.len() >= bad_ids.len() || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let distinct: HashSet<String> = dead.iter().map(id_of).collect();
    assert_eq!(
        distinct,
        bad_ids.iter().cloned().collect::<HashSet<_>>(),
        "a dead letter per bad event"
    );
    for (id, bad) in bad_ids.iter().zip(ALL_BAD) {
        for r in dead.iter().filter(|r| &id_of(r) == id) {
            let error = String::from_utf8_lossy(r.header("outbox-relay-error").expect("error field")).into_owned();
            assert!(error.contains(cause_of(bad)), "{bad:?}: {error}");
            assert_eq!(r.header("key").map(<[u8]>::len), Some(36), "the event's key");
        }
    }
    eprintln!(
        "dead letters: {} bad events, {} entries ({} repeated by the replay)",
        bad_ids.len(),
        dead.len(),
        dead.len() - distinct.len()
    );
    delete(
        SHARED_REDIS,
        &[
            format!("{}.good", setup.prefix),
            format!("{}.wrong", setup.prefix),
            dead_stream,
        ],
    )
    .await;
}
