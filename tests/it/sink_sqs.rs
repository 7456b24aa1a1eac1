//! The Amazon SQS sink end to end through `outbox-relay run` against moto in server mode
//! (docs/sink-sqs.md; `tests/it/harness/moto.rs`): routing, keys, attributes and per-aggregate
//! order of a workload into FIFO queues; standard queues (the start warning, exactly-once
//! refused); SIGKILLs under load; exactly-once across 10 SIGKILLs through FIFO deduplication;
//! moto frozen for 30 s; bad events (too large for the relay, too large for the queue, too many
//! attributes, a queue that does not exist) under each `relay.on_bad_event`.
//!
//! Each test runs a moto of its own (skipping loudly where moto is not installed): moto keeps
//! its state in memory and deduplicates only against messages still queued, so the queues are
//! read once everything arrived (`Moto::collect`), never while the relay may still send. moto's
//! FIFO queues slow down as they fill (each stored message is compared with every queued one in
//! Python: ~10 ms per message in a small queue, ~100 ms at 1,000), which is why the workloads
//! here are a few hundred events, and the waits generous (a loaded CI machine slows moto
//! further): the relay is not the bottleneck (docs/sink-sqs.md).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::moto::{
    aws_run as run, aws_run_streaming as run_streaming, check_all, fast_restarts, Moto, AWS_ENV,
};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// `config` publishing to SQS on `moto`, FIFO queues when `fifo`.
fn to_sqs(config: RelayConfig, moto: &Moto, fifo: bool) -> RelayConfig {
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push(("fifo", if fifo { "true" } else { "false" }));
    config.sink("sqs", &pairs)
}

/// Schema B (routed by `aggregate_type` = `order`) into the FIFO queue `<prefix>-order.fifo`.
async fn fifo_b(moto: &Moto, prefix: &str) -> (String, RelayConfig, String) {
    let queue = format!("{prefix}-order.fifo");
    moto.create_queue(&queue).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_sqs(config, moto, true).route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}.fifo"));
    (db, config, queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fifo_workload_lands_routed_keyed_grouped_and_in_order() {
    let Some(moto) = Moto::start("a_fifo_workload_lands_routed_keyed_grouped_and_in_order").await else {
        return;
    };
    let prefix = unique_name("sqs_e2e");
    // Schema A routes by `type` (order.placed, …): one FIFO queue per event type.
    let queue_of = |t: &str| format!("{prefix}-{}.fifo", t.trim_start_matches("order."));
    let queues: Vec<String> = EVENT_TYPES.iter().map(|t| queue_of(t)).collect();
    for q in &queues {
        moto.create_queue(q).await;
    }
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    // Shipped defaults but for the sink and the route.
    let config = to_sqs(config, &moto, true).route(
        r"^order\.(?<routedByValue>.*)$",
        &format!("{prefix}-${{routedByValue}}.fifo"),
    );
    let relay = run_streaming(&config).await;
    let started = Instant::now();
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, 400, 20, 4),
    )
    .await;
    let records = moto
        .collect(
            &queues,
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let elapsed = started.elapsed();
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| queue_of(&e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
    for queue in &queues {
        let in_queue: Vec<&Received> = records.iter().filter(|r| &r.topic == queue).collect();
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &in_queue {
            got.entry(r.key_str().unwrap().to_owned()).or_default().push(id_of(r));
            // The aggregate key is the message group; the event id deduplicates (at-least-once).
            assert_eq!(r.header("sqs:MessageGroupId"), r.key.as_deref(), "{r:?}");
            assert_eq!(r.header("sqs:MessageDeduplicationId"), r.header("id"), "{r:?}");
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| &queue_of(&e.event_type) == queue)
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{queue} {agg}");
        }
    }
    let names: Vec<&str> = records[0]
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("sqs:"))
        .collect();
    assert_eq!(names, ["id", "key"], "{:?}", records[0]);
    let log = relay.log_text();
    assert!(!log.contains("do not keep order"), "FIFO queues do not warn:\n{log}");
    eprintln!(
        "FIFO workload: {} events in {} queues, 0 lost, 0 duplicates, drained within {elapsed:?}",
        all.len(),
        queues.len()
    );
}

/// Standard queues: delivered (order is not SQS's to keep), with the start warning; exactly-once
/// refused at start with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_queues_warn_at_start_and_refuse_exactly_once() {
    let Some(moto) = Moto::start("standard_queues_warn_at_start_and_refuse_exactly_once").await else {
        return;
    };
    let prefix = unique_name("sqs_std");
    let queue = format!("{prefix}-order");
    moto.create_queue(&queue).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_sqs(config, &moto, false).route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let mut refused = run(&fast_restarts(config.clone()).set("relay", "delivery", "exactly-once"));
    let status = refused.wait_exit(Duration::from_secs(30)).await;
    let log = refused.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    assert!(
        log.contains("standard SQS queues do not deduplicate") && log.contains("fifo = true"),
        "{log}"
    );
    let relay = run_streaming(&config).await;
    let log = relay.log_text();
    assert!(
        log.contains("WARN") && log.contains("standard SQS queues do not keep order"),
        "{log}"
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::B, 200, 10, 2),
    )
    .await;
    let records = moto
        .collect(
            std::slice::from_ref(&queue),
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |_| queue.clone());
    assert_eq!(dups, 0);
    assert!(records.iter().all(|r| r.header("sqs:MessageGroupId").is_none()));
    eprintln!("standard queue: {} events, 0 lost, 0 duplicates", all.len());
}

/// At-least-once: the relay SIGKILLed under load, restarted each time; nothing lost, first
/// deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_nothing() {
    let Some(moto) = Moto::start("sigkill_under_load_loses_nothing").await else {
        return;
    };
    let prefix = unique_name("sqs_kill");
    let (db, config, queue) = fifo_b(&moto, &prefix).await;
    let config = fast_restarts(config).max_in_flight(50);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 100, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, kills, (300, 1500), || run(&config)).await;
    let relay = run(&config);
    let records = moto
        .collect(
            std::slice::from_ref(&queue),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(2),
            || relay.log_text(),
        )
        .await;
    check_all(
        &committed,
        &records,
        &queue,
        &format!("{kills} SIGKILLs, at-least-once"),
    );
}

/// Exactly-once: 10 SIGKILLs under load (and, with failpoints, a crash between an
/// acknowledgement and its confirmation), each event in the FIFO queue exactly once — SQS's
/// deduplication drops the replays, whose deduplication id is their source position.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_10_sigkills_has_no_duplicate() {
    let Some(moto) = Moto::start("exactly_once_across_10_sigkills_has_no_duplicate").await else {
        return;
    };
    let prefix = unique_name("sqs_eo");
    let (db, config, queue) = fifo_b(&moto, &prefix).await;
    let config = fast_restarts(config)
        .set("relay", "delivery", "exactly-once")
        .max_in_flight(50);
    let kills = 10;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 60, 30, 4);
    w.pause = Duration::from_millis(10);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    for _ in 0..kills {
        let relay = run(&config);
        tokio::time::sleep(Duration::from_millis(300 + random_below(1000))).await;
        assert!(relay.sigkill(), "{}", relay.log_text());
    }
    let mut committed = load.await.expect("workload");
    // Whether a SIGKILL lands between an acknowledgement and its confirmation is luck; the
    // failpoint stops a relay right there, leaving acknowledged events to replay.
    if cfg!(feature = "failpoints") {
        let mut w = Workload::new(OutboxSchema::B, 150, 30, 2);
        w.pause = Duration::from_millis(5);
        let load = tokio::spawn(async move { run_workload(&url, &w).await });
        let mut env = AWS_ENV.to_vec();
        env.push(("FAILPOINTS", "relay::acked_before_status=return"));
        let mut crashed = RelayProcess::run_with(&config, &[], &env);
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
    let relay = run(&config);
    let records = moto
        .collect(
            std::slice::from_ref(&queue),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(3),
            || relay.log_text(),
        )
        .await;
    let dups = check_all(&committed, &records, &queue, "exactly-once, 10 SIGKILLs");
    assert_eq!(dups, 0, "duplicates in exactly-once mode; log:\n{}", relay.log_text());
    for r in &records {
        for h in ["outbox-relay-source", "outbox-relay-commit-lsn", "outbox-relay-index"] {
            assert!(r.header(h).is_some(), "{h} on every message: {r:?}");
        }
        let dedup = String::from_utf8_lossy(r.header("sqs:MessageDeduplicationId").expect("dedup id")).into_owned();
        let lsn = String::from_utf8_lossy(r.header("outbox-relay-commit-lsn").unwrap()).into_owned();
        assert!(
            dedup.contains(&lsn),
            "the deduplication id is the source position: {dedup} / {lsn}"
        );
    }
}

/// moto frozen (SIGSTOP) for 30 s under load and thawed: the relay's calls time out and are
/// retried; nothing lost, no replay needed, and events committed after the thaw arrive.
/// `shipped`: every `[relay]` and `[sqs]` default instead of the shortened ones.
async fn moto_frozen_30_seconds(test: &str, exactly: bool, shipped: bool) {
    let Some(moto) = Moto::start(test).await else {
        return;
    };
    let prefix = unique_name("sqs_down");
    let (db, mut config, queue) = fifo_b(&moto, &prefix).await;
    if exactly {
        config = config.set("relay", "delivery", "exactly-once");
    }
    if !shipped {
        // `[sqs] timeout_ms` keeps its default: moto's FIFO queue, slow as it fills and slower
        // under a loaded CI machine, can take seconds per call after the thaw, and a shorter
        // attempt timeout only makes the retries pile up on it.
        config = fast_restarts(config).max_in_flight(50);
    }
    let relay = run_streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 400, 30, 4);
    w.pause = Duration::from_millis(50);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = moto.count(&queue).await;
    moto.freeze();
    tokio::time::sleep(Duration::from_secs(30)).await;
    moto.thaw();
    let thawed = Instant::now();
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 50, 10, 2)).await;
    committed.by_aggregate.extend(later.by_aggregate);
    let records = moto
        .collect(
            std::slice::from_ref(&queue),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(3),
            || relay.log_text(),
        )
        .await;
    let caught_up = thawed.elapsed();
    let log = relay.log_text();
    // The relay's outage summary, always. The batcher's `SQS did not store a batch; retrying`
    // appears only when a call failed past the SDK's own attempts (3 of `timeout_ms` each):
    // with the 30 s freeze, the third attempt is often the one moto answers after the thaw.
    assert!(
        log.contains("has acknowledged nothing for") && log.contains("acknowledges again"),
        "the outage should show in the log:\n{log}"
    );
    let what = format!(
        "moto frozen 30 s ({}, {}), {before} messages before, caught up {caught_up:?} after the thaw",
        if exactly { "exactly-once" } else { "at-least-once" },
        if shipped {
            "shipped defaults"
        } else {
            "backoff 100-500 ms, 50 in flight"
        }
    );
    let dups = check_all(&committed, &records, &queue, &what);
    if exactly {
        assert_eq!(dups, 0, "{what}: duplicates");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_exactly_once_publishes_each_event_once() {
    moto_frozen_30_seconds(
        "moto_frozen_30_seconds_exactly_once_publishes_each_event_once",
        true,
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_with_shipped_defaults_loses_nothing() {
    moto_frozen_30_seconds(
        "moto_frozen_30_seconds_with_shipped_defaults_loses_nothing",
        false,
        true,
    )
    .await;
}

// ---- Bad events ----

/// How an event can be bad for SQS.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    /// Over `[sqs] max_message_bytes` (1 MiB, or the default 256 KiB): refused before sending.
    TooLarge,
    /// 300 KB: within `max_message_bytes` (1 MiB here) but over the queue's 256 KiB (moto's
    /// `MaximumMessageSize`): SQS refuses it.
    TooLargeForTheQueue,
    /// Nine header columns set: 11 message attributes with `id` and `key`.
    TooManyAttributes,
    /// Routed to a queue that does not exist.
    NoQueue,
}

const ALL_BAD: [Bad; 4] = [
    Bad::TooLarge,
    Bad::TooLargeForTheQueue,
    Bad::TooManyAttributes,
    Bad::NoQueue,
];

fn cause_of(bad: Bad) -> &'static str {
    match bad {
        Bad::TooLarge => "max_message_bytes",
        Bad::TooLargeForTheQueue => "SQS refused the message",
        Bad::TooManyAttributes => "SQS allows 10",
        Bad::NoQueue => "does not exist",
    }
}

struct BadSetup {
    moto: Moto,
    client: Client,
    config: RelayConfig,
    prefix: String,
}

const HEADER_COLUMNS: usize = 9;

async fn bad_setup(test: &str, policy: &str) -> Option<BadSetup> {
    let moto = Moto::start(test).await?;
    let prefix = unique_name("sqs_bad");
    moto.create_queue(&format!("{prefix}-good.fifo")).await;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let mut config = fast_restarts(to_sqs(config, &moto, true))
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}.fifo"))
        .set("relay", "on_bad_event", policy);
    if policy == "dead-letter" {
        // A dead letter carries the raw row, cut to the sink's largest message: with the
        // default (the queue's 256 KiB) it fits the queue.
    } else {
        config = config.set("sqs", "max_message_bytes", 1024 * 1024);
    }
    // Nine nullable header columns: NULL headers are left out, so only a row with all nine
    // set has too many attributes.
    for i in 0..HEADER_COLUMNS {
        client
            .batch_execute(&format!("ALTER TABLE events_outbox ADD COLUMN h{i} text"))
            .await
            .unwrap();
        config = config.header_column(&format!("h{i}"), &format!("h{i}"));
    }
    if policy == "dead-letter" {
        let dead = format!("{prefix}-dead.fifo");
        moto.create_queue(&dead).await;
        config = config.set("relay", "dead_letter_topic", dead.as_str());
    }
    Some(BadSetup {
        moto,
        client,
        config,
        prefix,
    })
}

/// One aggregate for every event of a bad-event test: the good events after a bad one wait
/// for the relay's decision about it (the key is fenced), so the good ones must arrive in
/// commit order.
const AGGREGATE: &str = "2b7e1a8c-0d3f-4c55-9a61-5f7c2e9d8b14";

async fn insert(client: &Client, ty: &str, payload: &str, headers: bool) -> String {
    let h = headers.then_some("v");
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload, h0, h1, h2, h3, h4, h5, h6, h7, h8)
             VALUES ($4::text::uuid, $1, $2::text::jsonb, $3, $3, $3, $3, $3, $3, $3, $3, $3)
             RETURNING id::text",
            &[&ty, &payload, &h, &AGGREGATE],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn insert_bad(client: &Client, bad: Bad) -> String {
    let blob = |n: usize| format!("{{\"blob\": \"{}\"}}", "x".repeat(n));
    match bad {
        Bad::TooLarge => insert(client, "good", &blob(1_100_000), false).await,
        Bad::TooLargeForTheQueue => insert(client, "good", &blob(300_000), false).await,
        Bad::TooManyAttributes => insert(client, "good", "{}", true).await,
        Bad::NoQueue => insert(client, "missing", "{}", false).await,
    }
}

async fn goods_around(setup: &BadSetup, bads: &[Bad]) -> (Vec<String>, Vec<String>) {
    let mut goods = vec![insert(&setup.client, "good", "{\"n\": 0}", false).await];
    let mut bad_ids = Vec::new();
    for (i, bad) in bads.iter().enumerate() {
        bad_ids.push(insert_bad(&setup.client, *bad).await);
        goods.push(insert(&setup.client, "good", &format!("{{\"n\": {}}}", i + 1), false).await);
    }
    (goods, bad_ids)
}

/// The good queue's first deliveries, once `n` distinct arrived (or 60 s passed).
async fn good_ids(setup: &BadSetup, n: usize) -> Vec<String> {
    let queue = format!("{}-good.fifo", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(60);
    while setup.moto.count(&queue).await < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids: Vec<String> = setup.moto.drain(&queue).await.iter().map(id_of).collect();
    let mut seen = HashSet::new();
    let firsts: Vec<String> = ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect();
    eprintln!(
        "good events: {} distinct arrived, {} duplicates",
        firsts.len(),
        ids.len() - firsts.len()
    );
    firsts
}

async fn fail_case(test: &str, bad: Bad) {
    let Some(setup) = bad_setup(test, "fail").await else {
        return;
    };
    let mut relay = run_streaming(&setup.config).await;
    let (_goods, bad_ids) = goods_around(&setup, &[bad]).await;
    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{bad:?}: exit 1; log:\n{log}");
    assert!(
        log.contains(&format!("id={}", bad_ids[0])),
        "{bad:?}: names the event; log:\n{log}"
    );
    assert!(log.contains(cause_of(bad)), "{bad:?}: names the cause; log:\n{log}");
    let ids = good_ids(&setup, 1).await;
    assert!(!ids.contains(&bad_ids[0]), "{bad:?} was not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_large() {
    fail_case("bad_event_fail_too_large", Bad::TooLarge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_large_for_the_queue() {
    fail_case("bad_event_fail_too_large_for_the_queue", Bad::TooLargeForTheQueue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_many_attributes() {
    fail_case("bad_event_fail_too_many_attributes", Bad::TooManyAttributes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_no_queue() {
    fail_case("bad_event_fail_no_queue", Bad::NoQueue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_skipped_and_the_good_ones_arrive_in_order() {
    let Some(setup) = bad_setup("bad_events_skipped_and_the_good_ones_arrive_in_order", "skip").await else {
        return;
    };
    let _relay = run_streaming(&setup.config).await;
    let (goods, _bad) = goods_around(&setup, &ALL_BAD).await;
    let ids = good_ids(&setup, goods.len()).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_dead_lettered_to_a_queue() {
    let Some(setup) = bad_setup("bad_events_dead_lettered_to_a_queue", "dead-letter").await else {
        return;
    };
    let _relay = run_streaming(&setup.config).await;
    // Not TooLargeForTheQueue: its raw row would not fit the queue as a dead letter either.
    let bads = [Bad::TooLarge, Bad::TooManyAttributes, Bad::NoQueue];
    let (goods, bad_ids) = goods_around(&setup, &bads).await;
    let ids = good_ids(&setup, goods.len()).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let dead_queue = format!("{}-dead.fifo", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(30);
    while setup.moto.count(&dead_queue).await < bad_ids.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dead = setup.moto.drain(&dead_queue).await;
    let distinct: HashSet<String> = dead.iter().map(id_of).collect();
    assert_eq!(
        distinct,
        bad_ids.iter().cloned().collect::<HashSet<_>>(),
        "a dead letter per bad event"
    );
    for (id, bad) in bad_ids.iter().zip(bads) {
        for r in dead.iter().filter(|r| &id_of(r) == id) {
            let error = String::from_utf8_lossy(r.header("outbox-relay-error").expect("error attribute")).into_owned();
            assert!(error.contains(cause_of(bad)), "{bad:?}: {error}");
        }
    }
    eprintln!("dead letters: {} bad events, {} messages", bad_ids.len(), dead.len());
}
