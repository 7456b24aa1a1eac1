//! The Amazon SNS sink end to end through `outbox-relay run` against moto in server mode
//! (docs/sink-sns.md; `tests/it/harness/moto_sns.rs`): each routed topic has an SQS queue of
//! the same name subscribed with raw message delivery, read back once everything arrived
//! (`Moto::collect`). Routing over several FIFO topics with keys, attributes and per-aggregate
//! order; standard topics (the start warning, exactly-once refused); SIGKILLs under load;
//! exactly-once across 10 SIGKILLs through FIFO deduplication; moto frozen for 30 s (short
//! backoff and shipped defaults); bad events under each `relay.on_bad_event`.
//!
//! moto's FIFO queues slow down as they fill (sink_sqs.rs), so the workloads are a few hundred
//! events and the waits generous: the relay is not the bottleneck.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::moto::{
    aws_run as run, aws_run_streaming as run_streaming, check_all, fast_restarts, Moto, AWS_ENV,
};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// `config` publishing to SNS on `moto`, FIFO topics when `fifo`.
fn to_sns(config: RelayConfig, moto: &Moto, fifo: bool) -> RelayConfig {
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push(("fifo", if fifo { "true" } else { "false" }));
    config.sink("sns", &pairs)
}

/// Schema B (routed by `aggregate_type` = `order`) into the FIFO topic `<prefix>-order.fifo`.
async fn fifo_b(moto: &Moto, prefix: &str) -> (String, RelayConfig, String) {
    let topic = format!("{prefix}-order.fifo");
    moto.create_topic_with_queue(&topic).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_sns(config, moto, true).route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}.fifo"));
    (db, config, topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_over_several_fifo_topics_lands_routed_keyed_grouped_and_in_order() {
    let Some(moto) = Moto::start("a_workload_over_several_fifo_topics_lands_routed_keyed_grouped_and_in_order").await
    else {
        return;
    };
    let prefix = unique_name("sns_e2e");
    // Schema A routes by `type` (order.placed, …): one FIFO topic per event type.
    let topic_of = |t: &str| format!("{prefix}-{}.fifo", t.trim_start_matches("order."));
    let topics: Vec<String> = EVENT_TYPES.iter().map(|t| topic_of(t)).collect();
    for t in &topics {
        moto.create_topic_with_queue(t).await;
    }
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    // Shipped defaults but for the sink and the route.
    let config = to_sns(config, &moto, true).route(
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
            &topics,
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let elapsed = started.elapsed();
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| topic_of(&e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
    for topic in &topics {
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in records.iter().filter(|r| &r.topic == topic) {
            got.entry(r.key_str().unwrap().to_owned()).or_default().push(id_of(r));
            // The aggregate key is the message group; the event id deduplicates (at-least-once).
            assert_eq!(r.header("sqs:MessageGroupId"), r.key.as_deref(), "{r:?}");
            assert_eq!(r.header("sqs:MessageDeduplicationId"), r.header("id"), "{r:?}");
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| &topic_of(&e.event_type) == topic)
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{topic} {agg}");
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
    assert!(!log.contains("do not keep order"), "FIFO topics do not warn:\n{log}");
    eprintln!(
        "SNS FIFO workload: {} events over {} topics, 0 lost, 0 duplicates, drained within {elapsed:?}",
        all.len(),
        topics.len()
    );
}

/// Standard topics: delivered (order is not SNS's to keep), with the start warning;
/// exactly-once refused at start with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_topics_warn_at_start_and_refuse_exactly_once() {
    let Some(moto) = Moto::start("standard_topics_warn_at_start_and_refuse_exactly_once").await else {
        return;
    };
    let prefix = unique_name("sns_std");
    let topic = format!("{prefix}-order");
    moto.create_topic_with_queue(&topic).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_sns(config, &moto, false).route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let mut refused = run(&fast_restarts(config.clone()).set("relay", "delivery", "exactly-once"));
    let status = refused.wait_exit(Duration::from_secs(30)).await;
    let log = refused.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    assert!(
        log.contains("standard SNS topics do not deduplicate") && log.contains("fifo = true"),
        "{log}"
    );
    let relay = run_streaming(&config).await;
    let log = relay.log_text();
    assert!(
        log.contains("WARN") && log.contains("standard SNS topics do not keep order"),
        "{log}"
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::B, 200, 10, 2),
    )
    .await;
    let records = moto
        .collect(
            std::slice::from_ref(&topic),
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    assert_eq!(check_delivered(&all, &records, |_| topic.clone()), 0);
    assert!(records.iter().all(|r| r.header("sqs:MessageGroupId").is_none()));
    eprintln!("standard topic: {} events, 0 lost, 0 duplicates", all.len());
}

/// At-least-once: the relay SIGKILLed under load, restarted each time; nothing lost, first
/// deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_nothing() {
    let Some(moto) = Moto::start("sns sigkill_under_load_loses_nothing").await else {
        return;
    };
    let prefix = unique_name("sns_kill");
    let (db, config, topic) = fifo_b(&moto, &prefix).await;
    let config = fast_restarts(config).max_in_flight(50);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 100, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, kills, (300, 1500), || run(&config)).await;
    let relay = run(&config);
    let records = moto
        .collect(
            std::slice::from_ref(&topic),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(2),
            || relay.log_text(),
        )
        .await;
    check_all(
        &committed,
        &records,
        &topic,
        &format!("SNS, {kills} SIGKILLs, at-least-once"),
    );
}

/// Exactly-once: 10 SIGKILLs under load (and, with failpoints, a crash between an
/// acknowledgement and its confirmation), each event in the subscribed FIFO queue exactly
/// once — the FIFO deduplication drops the replays, whose deduplication id is their source
/// position.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_10_sigkills_has_no_duplicate() {
    let Some(moto) = Moto::start("sns exactly_once_across_10_sigkills_has_no_duplicate").await else {
        return;
    };
    let prefix = unique_name("sns_eo");
    let (db, config, topic) = fifo_b(&moto, &prefix).await;
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
            std::slice::from_ref(&topic),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(3),
            || relay.log_text(),
        )
        .await;
    let dups = check_all(&committed, &records, &topic, "SNS, exactly-once, 10 SIGKILLs");
    assert_eq!(dups, 0, "duplicates in exactly-once mode; log:\n{}", relay.log_text());
    for r in &records {
        let dedup = String::from_utf8_lossy(r.header("sqs:MessageDeduplicationId").expect("dedup id")).into_owned();
        let lsn = String::from_utf8_lossy(r.header("outbox-relay-commit-lsn").expect("position")).into_owned();
        assert!(
            dedup.contains(&lsn),
            "the deduplication id is the source position: {dedup} / {lsn}"
        );
    }
}

/// moto frozen (SIGSTOP) for 30 s under load and thawed: the relay's calls time out and are
/// retried; nothing lost, and events committed after the thaw arrive. `shipped`: every
/// `[relay]` and `[sns]` default instead of the shortened ones.
async fn moto_frozen_30_seconds(test: &str, shipped: bool) {
    let Some(moto) = Moto::start(test).await else {
        return;
    };
    let prefix = unique_name("sns_down");
    let (db, mut config, topic) = fifo_b(&moto, &prefix).await;
    if !shipped {
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
    let before = moto.count(&topic).await;
    moto.freeze();
    tokio::time::sleep(Duration::from_secs(30)).await;
    moto.thaw();
    let thawed = Instant::now();
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 50, 10, 2)).await;
    committed.by_aggregate.extend(later.by_aggregate);
    let records = moto
        .collect(
            std::slice::from_ref(&topic),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(3),
            || relay.log_text(),
        )
        .await;
    let caught_up = thawed.elapsed();
    let log = relay.log_text();
    // The relay's outage summary, always. The batcher's `SNS did not store a batch; retrying`
    // appears only when a call failed past the SDK's own attempts (3 of `timeout_ms` each):
    // with the 30 s freeze, the third attempt is often the one moto answers after the thaw.
    assert!(
        log.contains("has acknowledged nothing for") && log.contains("acknowledges again"),
        "the outage should show in the log:\n{log}"
    );
    let what = format!(
        "SNS: moto frozen 30 s ({}), {before} messages before, caught up {caught_up:?} after the thaw",
        if shipped {
            "shipped defaults"
        } else {
            "backoff 100-500 ms, 50 in flight"
        }
    );
    check_all(&committed, &records, &topic, &what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_with_short_backoff_loses_nothing() {
    moto_frozen_30_seconds("sns moto_frozen_30_seconds_with_short_backoff_loses_nothing", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_with_shipped_defaults_loses_nothing() {
    moto_frozen_30_seconds("sns moto_frozen_30_seconds_with_shipped_defaults_loses_nothing", true).await;
}

// ---- Bad events ----

/// How an event can be bad for SNS.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    /// Over 256 KiB (SNS's limit, `[sns] max_message_bytes`): refused before sending.
    TooLarge,
    /// Nine header columns set: 11 message attributes with `id` and `key`.
    TooManyAttributes,
    /// Routed to a topic that does not exist.
    NoTopic,
}

const ALL_BAD: [Bad; 3] = [Bad::TooLarge, Bad::TooManyAttributes, Bad::NoTopic];

fn cause_of(bad: Bad) -> &'static str {
    match bad {
        Bad::TooLarge => "max_message_bytes",
        Bad::TooManyAttributes => "at most 10",
        Bad::NoTopic => "does not exist",
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
    let prefix = unique_name("sns_bad");
    moto.create_topic_with_queue(&format!("{prefix}-good.fifo")).await;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let mut config = fast_restarts(to_sns(config, &moto, true))
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}.fifo"))
        .set("relay", "on_bad_event", policy);
    // Nine nullable header columns: only a row with all nine set has too many attributes.
    for i in 0..HEADER_COLUMNS {
        client
            .batch_execute(&format!("ALTER TABLE events_outbox ADD COLUMN h{i} text"))
            .await
            .unwrap();
        config = config.header_column(&format!("h{i}"), &format!("h{i}"));
    }
    if policy == "dead-letter" {
        let dead = format!("{prefix}-dead.fifo");
        moto.create_topic_with_queue(&dead).await;
        config = config.set("relay", "dead_letter_topic", dead.as_str());
    }
    Some(BadSetup {
        moto,
        client,
        config,
        prefix,
    })
}

/// One aggregate for every event: the good events after a bad one wait for the relay's
/// decision about it (the key is fenced), so the good ones must arrive in commit order.
const AGGREGATE: &str = "6c1d0b5e-8a2f-4e37-b1c9-3d4e5f607182";

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
    match bad {
        Bad::TooLarge => {
            insert(
                client,
                "good",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(300_000)),
                false,
            )
            .await
        }
        Bad::TooManyAttributes => insert(client, "good", "{}", true).await,
        Bad::NoTopic => insert(client, "missing", "{}", false).await,
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

/// The good topic's first deliveries, once `n` distinct arrived (or 60 s passed).
async fn good_ids(setup: &BadSetup, n: usize) -> Vec<String> {
    let queue = format!("{}-good.fifo", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(60);
    while setup.moto.count(&queue).await < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids: Vec<String> = setup.moto.drain(&queue).await.iter().map(id_of).collect();
    let mut seen = HashSet::new();
    ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect()
}

/// `fail`: the relay stops naming the event and the cause, for each kind of bad event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_fail_the_relay_naming_the_event_and_the_cause() {
    for bad in ALL_BAD {
        let Some(setup) = bad_setup("sns bad_events_fail_the_relay_naming_the_event_and_the_cause", "fail").await
        else {
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
        assert!(!ids.contains(&bad_ids[0]), "{bad:?} was not published");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_skipped_and_the_good_ones_arrive_in_order() {
    let Some(setup) = bad_setup("sns bad_events_skipped_and_the_good_ones_arrive_in_order", "skip").await else {
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
async fn bad_events_dead_lettered_to_a_topic() {
    let Some(setup) = bad_setup("sns bad_events_dead_lettered_to_a_topic", "dead-letter").await else {
        return;
    };
    let _relay = run_streaming(&setup.config).await;
    let (goods, bad_ids) = goods_around(&setup, &ALL_BAD).await;
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
    for (id, bad) in bad_ids.iter().zip(ALL_BAD) {
        for r in dead.iter().filter(|r| &id_of(r) == id) {
            let error = String::from_utf8_lossy(r.header("outbox-relay-error").expect("error attribute")).into_owned();
            assert!(error.contains(cause_of(bad)), "{bad:?}: {error}");
        }
    }
}
