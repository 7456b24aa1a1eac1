//! The Amazon Kinesis Data Streams sink end to end through `outbox-relay run` against moto in
//! server mode (docs/sink-kinesis.md; `tests/it/harness/moto_kinesis.rs`): a workload routed
//! over several multi-shard streams (keys, envelope, per-aggregate order within a shard,
//! exactly-once refused at start); `setup` creating `[kinesis] streams` and the payload format
//! with records near the 1 MiB limit (batches bounded by 5 MiB); SIGKILLs under load; moto frozen
//! for 30 s (short backoff, and the shipped defaults); bad events (too large, a stream that does
//! not exist) under each `relay.on_bad_event`.
//!
//! Each test runs a moto of its own (skipping loudly where moto is not installed). Kinesis
//! streams are logs: reading them back consumes nothing, so the tests read whenever they like.
//! moto never fails a record on its own (no shard throughput limits): the per-record mapping
//! is tested on constructed answers in `src/sink/aws/kinesis/exchange.rs`.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::moto::{
    aws_run as run_relay, aws_run_streaming as run_relay_streaming, fast_restarts, Moto, AWS_ENV,
};
use crate::harness::relay_process::run_cmd_with;
use crate::harness::workload::{Committed, ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// `config` publishing to Kinesis on `moto`, with `extra` `[kinesis]` keys.
fn to_kinesis(config: RelayConfig, moto: &Moto, extra: &[(&str, &str)]) -> RelayConfig {
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.extend_from_slice(extra);
    config.sink("kinesis", &pairs)
}

/// Schema B (routed by `aggregate_type` = `order`) into the 2-shard stream `<prefix>-order`.
async fn order_stream(moto: &Moto, prefix: &str) -> (String, RelayConfig, String) {
    let stream = format!("{prefix}-order");
    moto.create_stream(&stream, 2).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = to_kinesis(config, moto, &[]).route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    (db, config, stream)
}

/// Every record of an aggregate in one shard under its partition key (the aggregate id).
fn check_shards(records: &[Received]) {
    let mut shard_of: BTreeMap<(String, String), String> = BTreeMap::new();
    for r in records {
        let key = r.key_str().expect("key").to_owned();
        assert_eq!(r.header("kinesis:PartitionKey"), Some(key.as_bytes()), "{r:?}");
        let shard = String::from_utf8_lossy(r.header("kinesis:ShardId").unwrap()).into_owned();
        let prev = shard_of.entry((r.topic.clone(), key)).or_insert_with(|| shard.clone());
        assert_eq!(*prev, shard, "an aggregate's records in one shard: {r:?}");
    }
}

/// Every committed event at least once in `stream` (key, payload), first deliveries in commit
/// order per aggregate, each aggregate in one shard; returns the duplicates.
fn check_all(committed: &Committed, records: &[Received], stream: &str, what: &str) -> usize {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, records, |_| stream.to_owned());
    check_order(committed, records);
    check_shards(records);
    eprintln!("{what}: {} events, 0 lost, {dups} duplicates", all.len());
    dups
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_lands_routed_keyed_and_in_order_within_each_shard() {
    let Some(moto) = Moto::start("a_workload_lands_routed_keyed_and_in_order_within_each_shard").await else {
        return;
    };
    let prefix = unique_name("kin_e2e");
    // Schema A routes by `type` (order.placed, …): one stream of 3 shards per event type.
    let stream_of = |t: &str| format!("{prefix}-{}", t.trim_start_matches("order."));
    let streams: Vec<String> = EVENT_TYPES.iter().map(|t| stream_of(t)).collect();
    for s in &streams {
        moto.create_stream(s, 3).await;
    }
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    // Shipped defaults but for the sink and the route.
    let config = to_kinesis(config, &moto, &[]).route(
        r"^order\.(?<routedByValue>.*)$",
        &format!("{prefix}-${{routedByValue}}"),
    );
    // Kinesis does not deduplicate: exactly-once is refused at start, with the reason.
    let mut refused = run_relay(&fast_restarts(config.clone()).set("relay", "delivery", "exactly-once"));
    let status = refused.wait_exit(Duration::from_secs(30)).await;
    let log = refused.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    assert!(
        log.contains("Kinesis Data Streams has no deduplication") && log.contains("at-least-once"),
        "{log}"
    );
    let relay = run_relay_streaming(&config).await;
    let started = Instant::now();
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, 800, 40, 4),
    )
    .await;
    let records = moto
        .read_streams(
            &streams,
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let elapsed = started.elapsed();
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| stream_of(&e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
    check_shards(&records);
    for stream in &streams {
        // Per shard, each aggregate's events in commit order (the shard is Kinesis's order).
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in records.iter().filter(|r| &r.topic == stream) {
            got.entry(r.key_str().unwrap().to_owned()).or_default().push(id_of(r));
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| &stream_of(&e.event_type) == stream)
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{stream} {agg}");
        }
    }
    let shards: HashSet<(&str, i32)> = records.iter().map(|r| (r.topic.as_str(), r.partition)).collect();
    assert!(
        shards.len() > streams.len(),
        "40 aggregates spread over the shards: {shards:?}"
    );
    let names: Vec<&str> = records[0]
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("kinesis:"))
        .collect();
    assert_eq!(
        names,
        ["id"],
        "the envelope: id, no headers configured: {:?}",
        records[0]
    );
    eprintln!(
        "workload: {} events in {} streams ({} shards used), 0 lost, 0 duplicates, drained within {elapsed:?}",
        all.len(),
        streams.len(),
        shards.len()
    );
}

/// `setup` creates `[kinesis] streams` (on-demand) and says so; with `format = "payload"` a
/// record's data is the payload alone, and events near the 1 MiB limit go out in calls that
/// stay under Kinesis's 5 MiB per `PutRecords` (moto refuses a larger call).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_creates_the_streams_and_large_payloads_go_alone() {
    let Some(moto) = Moto::start("setup_creates_the_streams_and_large_payloads_go_alone").await else {
        return;
    };
    let prefix = unique_name("kin_setup");
    let stream = format!("{prefix}-big");
    let (db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = to_kinesis(config, &moto, &[("format", "payload")])
        .set("kinesis", "streams", vec![stream.clone()])
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let out = run_cmd_with(&["setup"], &config, &AWS_ENV, Duration::from_secs(120)).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("Kinesis stream {stream} created (on-demand): ACTIVE")),
        "{said}"
    );
    let again = run_cmd_with(&["setup"], &config, &AWS_ENV, Duration::from_secs(120)).await;
    let said = String::from_utf8_lossy(&again.stdout).into_owned() + &String::from_utf8_lossy(&again.stderr);
    assert!(
        again.status.success() && said.contains(&format!("Kinesis stream {stream} exists")),
        "{said}"
    );
    let relay = run_relay_streaming(&config).await;
    // 12 events of ~900 KB, each of its own aggregate, committed at once: 10.8 MB that no single
    // call may carry.
    let mut want = BTreeMap::new();
    client.simple_query("BEGIN").await.unwrap();
    for i in 0..12 {
        let payload = format!("{{\"n\": {i}, \"blob\": \"{}\"}}", "x".repeat(900_000));
        let row = client
            .query_one(
                "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'big', \
                 $1::text::jsonb) RETURNING aggregate_id::text, payload::text",
                &[&payload],
            )
            .await
            .unwrap();
        want.insert(row.get::<_, String>(0), row.get::<_, String>(1));
    }
    client.simple_query("COMMIT").await.unwrap();
    let records = moto
        .read_streams(
            std::slice::from_ref(&stream),
            want.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    assert_eq!(records.len(), want.len(), "each once");
    for r in &records {
        let key = r.key_str().expect("the partition key").to_owned();
        assert_eq!(
            r.payload_str(),
            want.get(&key).map(String::as_str),
            "the data is the payload alone"
        );
        assert!(r.header("id").is_none(), "no envelope");
    }
    let _ = db;
}

/// At-least-once: the relay SIGKILLed under load, restarted each time; nothing lost, first
/// deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_nothing() {
    let Some(moto) = Moto::start("kinesis_sigkill_under_load_loses_nothing").await else {
        return;
    };
    let prefix = unique_name("kin_kill");
    let (db, config, stream) = order_stream(&moto, &prefix).await;
    let config = fast_restarts(config).max_in_flight(50);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 150, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, kills, (300, 1500), || run_relay(&config)).await;
    let relay = run_relay(&config);
    let records = moto
        .read_streams(
            std::slice::from_ref(&stream),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(2),
            || relay.log_text(),
        )
        .await;
    check_all(
        &committed,
        &records,
        &stream,
        &format!("{kills} SIGKILLs, at-least-once"),
    );
}

/// moto frozen (SIGSTOP) for 30 s under load and thawed: the relay's calls time out and are
/// retried; nothing lost, and events committed after the thaw arrive. `shipped`: every
/// `[relay]` and `[kinesis]` default instead of the shortened ones.
async fn moto_frozen_30_seconds(test: &str, shipped: bool) {
    let Some(moto) = Moto::start(test).await else {
        return;
    };
    let prefix = unique_name("kin_down");
    let (db, mut config, stream) = order_stream(&moto, &prefix).await;
    if !shipped {
        config = fast_restarts(config)
            .max_in_flight(50)
            .set("kinesis", "timeout_ms", 2000);
    }
    let relay = run_relay_streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 600, 30, 4);
    w.pause = Duration::from_millis(50);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = moto.stream_count(std::slice::from_ref(&stream)).await;
    moto.freeze();
    tokio::time::sleep(Duration::from_secs(30)).await;
    moto.thaw();
    let thawed = Instant::now();
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 50, 10, 2)).await;
    committed.by_aggregate.extend(later.by_aggregate);
    let records = moto
        .read_streams(
            std::slice::from_ref(&stream),
            committed.len(),
            Duration::from_secs(240),
            Duration::from_secs(3),
            || relay.log_text(),
        )
        .await;
    let caught_up = thawed.elapsed();
    let log = relay.log_text();
    // The relay's outage summary always; the batcher's retry line when an attempt failed past
    // the SDK's own retries (with the shipped 10 s attempts, the third attempt may be the one
    // moto answers after the thaw).
    assert!(
        log.contains("has acknowledged nothing for")
            && (shipped || log.contains("Kinesis did not store a batch; retrying")),
        "the outage should show in the log:\n{log}"
    );
    let what = format!(
        "moto frozen 30 s ({}), {before} records before, caught up {caught_up:?} after the thaw",
        if shipped {
            "shipped defaults"
        } else {
            "backoff 100-500 ms, 50 in flight, 2 s attempts"
        }
    );
    check_all(&committed, &records, &stream, &what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_with_a_short_backoff_loses_nothing() {
    moto_frozen_30_seconds(
        "kinesis_moto_frozen_30_seconds_with_a_short_backoff_loses_nothing",
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moto_frozen_30_seconds_with_shipped_defaults_loses_nothing() {
    moto_frozen_30_seconds(
        "kinesis_moto_frozen_30_seconds_with_shipped_defaults_loses_nothing",
        true,
    )
    .await;
}

// ---- Bad events ----

/// How an event can be bad for Kinesis (records have no attributes: only size and the stream).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    /// 1.1 MB: over Kinesis's 1 MiB per record (data and partition key), refused before sending.
    TooLarge,
    /// Routed to a stream that does not exist: Kinesis answers `ResourceNotFoundException`.
    NoStream,
}

const ALL_BAD: [Bad; 2] = [Bad::TooLarge, Bad::NoStream];

fn cause_of(bad: Bad) -> &'static str {
    match bad {
        Bad::TooLarge => "max_record_bytes",
        Bad::NoStream => "does not exist",
    }
}

struct BadSetup {
    moto: Moto,
    client: Client,
    config: RelayConfig,
    prefix: String,
}

async fn bad_setup(test: &str, policy: &str) -> Option<BadSetup> {
    let moto = Moto::start(test).await?;
    let prefix = unique_name("kin_bad");
    moto.create_stream(&format!("{prefix}-good"), 1).await;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let mut config = fast_restarts(to_kinesis(config, &moto, &[]))
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"))
        .set("relay", "on_bad_event", policy);
    if policy == "dead-letter" {
        let dead = format!("{prefix}-dead");
        moto.create_stream(&dead, 1).await;
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
const AGGREGATE: &str = "5d0c3f7e-8a41-4b2e-9f6d-1c2b3a4d5e6f";

async fn insert(client: &Client, ty: &str, payload: &str) -> String {
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($3::text::uuid, $1, $2::text::jsonb)
             RETURNING id::text",
            &[&ty, &payload, &AGGREGATE],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn insert_bad(client: &Client, bad: Bad) -> String {
    match bad {
        Bad::TooLarge => insert(client, "good", &format!("{{\"blob\": \"{}\"}}", "x".repeat(1_100_000))).await,
        Bad::NoStream => insert(client, "missing", "{}").await,
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

/// The good stream's first deliveries, once `n` distinct arrived (or 60 s passed).
async fn good_ids(setup: &BadSetup, n: usize) -> Vec<String> {
    let stream = format!("{}-good", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(60);
    while setup.moto.stream_count(std::slice::from_ref(&stream)).await < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ids: Vec<String> = setup.moto.read_stream(&stream).await.iter().map(id_of).collect();
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
    let mut relay = run_relay_streaming(&setup.config).await;
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
    fail_case("kinesis_bad_event_fail_too_large", Bad::TooLarge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_no_stream() {
    fail_case("kinesis_bad_event_fail_no_stream", Bad::NoStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_skipped_and_the_good_ones_arrive_in_order() {
    let Some(setup) = bad_setup("kinesis_bad_events_skipped_and_the_good_ones_arrive_in_order", "skip").await else {
        return;
    };
    let _relay = run_relay_streaming(&setup.config).await;
    let (goods, _bad) = goods_around(&setup, &ALL_BAD).await;
    let ids = good_ids(&setup, goods.len()).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_dead_lettered_to_a_stream() {
    let Some(setup) = bad_setup("kinesis_bad_events_dead_lettered_to_a_stream", "dead-letter").await else {
        return;
    };
    let _relay = run_relay_streaming(&setup.config).await;
    let (goods, bad_ids) = goods_around(&setup, &ALL_BAD).await;
    let ids = good_ids(&setup, goods.len()).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let dead_stream = format!("{}-dead", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(30);
    while setup.moto.stream_count(std::slice::from_ref(&dead_stream)).await < bad_ids.len() && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dead = setup.moto.read_stream(&dead_stream).await;
    let distinct: HashSet<String> = dead.iter().map(id_of).collect();
    assert_eq!(
        distinct,
        bad_ids.iter().cloned().collect::<HashSet<_>>(),
        "a dead letter per bad event"
    );
    for (id, bad) in bad_ids.iter().zip(ALL_BAD) {
        for r in dead.iter().filter(|r| &id_of(r) == id) {
            let error = String::from_utf8_lossy(r.header("outbox-relay-error").expect("error header")).into_owned();
            assert!(error.contains(cause_of(bad)), "{bad:?}: {error}");
            if bad == Bad::TooLarge {
                assert!(
                    r.header("outbox-relay-truncated-from").is_some()
                        && r.payload.as_ref().is_some_and(|p| p.len() < 1024 * 1024),
                    "the raw row cut to fit a record: {:?}",
                    r.headers
                );
            }
        }
    }
    eprintln!("dead letters: {} bad events, {} records", bad_ids.len(), dead.len());
}
