//! The Google Cloud Pub/Sub sink end to end through `outbox-relay run` against Google's Pub/Sub
//! emulator (docs/sink-pubsub.md): routing, ordering keys and attributes of a workload (topics
//! made by `setup`), per-aggregate order through subscriptions with message ordering on,
//! SIGKILLs under load, the emulator unreachable for 30 s and the emulator killed for 30 s and
//! started again, and bad events (oversized, too many attributes) under `relay.on_bad_event`.
//!
//! Each test runs an emulator of its own on a free loopback port (`harness/pubsub.rs`), the
//! relay pointed at it by `PUBSUB_EMULATOR_HOST`, as Google's clients are. Without the emulator
//! the tests SKIP loudly.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::RwLock;
use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::net_fault::{Mode, Proxy};
use crate::harness::pubsub::{PubSubEmulator, Puller, PROJECT};
use crate::harness::relay_process::run_cmd_with;
use crate::harness::workload::{Committed, ExpectedEvent, OutboxSchema, Workload, EVENT_TYPES};
use crate::harness::*;

/// A relay config publishing to Pub/Sub, every event to the topic `<prefix>.<routed value>`.
fn to_pubsub(config: RelayConfig, prefix: &str) -> RelayConfig {
    config
        .sink("pubsub", &[("project", PROJECT)])
        .route("(?<routedByValue>.*)", &format!("{prefix}.${{routedByValue}}"))
}

fn fast_restarts(config: RelayConfig) -> RelayConfig {
    config
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500)
}

fn emulator_env(host: &str) -> [(&'static str, String); 1] {
    [("PUBSUB_EMULATOR_HOST", host.to_owned())]
}

/// `run` with `PUBSUB_EMULATOR_HOST` = `host`.
fn run(config: &RelayConfig, host: &str) -> RelayProcess {
    let env = emulator_env(host);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    RelayProcess::run_with(config, &[], &env)
}

async fn run_streaming(config: &RelayConfig, host: &str) -> RelayProcess {
    let relay = run(config, host);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    relay
}

/// Every committed event at least once (key, payload, topic), first deliveries in commit order
/// per aggregate; returns the duplicates.
fn check_all(committed: &Committed, records: &[Received], topic: &str, what: &str) -> usize {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, records, |_| topic.to_owned());
    check_order(committed, records);
    eprintln!("{what}: {} events, 0 lost, {dups} duplicates", all.len());
    dups
}

fn shared(e: PubSubEmulator) -> Arc<RwLock<PubSubEmulator>> {
    Arc::new(RwLock::new(e))
}

/// Schema B (routed by `aggregate_type` = `order`) into `<prefix>.order`, with its topic and an
/// ordered subscription made and pulled continuously.
async fn order_topic(emulator: &Arc<RwLock<PubSubEmulator>>, prefix: &str) -> (String, Puller) {
    let topic = format!("{prefix}.order");
    let e = emulator.read().await;
    e.create_topic(&topic).await;
    let sub = e.subscribe(&topic).await;
    drop(e);
    let puller = Puller::start(Arc::clone(emulator), vec![(sub, topic.clone())]);
    (topic, puller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_lands_routed_keyed_with_attributes_in_order() {
    let Some(emulator) = PubSubEmulator::start("a_workload_lands_routed_keyed_with_attributes_in_order").await else {
        return;
    };
    let prefix = unique_name("pubsub_e2e");
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let topics: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{prefix}.{t}")).collect();
    // Shipped defaults but for the sink and the route: every event type to a topic of its own,
    // which `setup` creates from [pubsub] topics.
    let config = to_pubsub(config, &prefix).set(
        "pubsub",
        "topics",
        toml::Value::Array(topics.iter().cloned().map(toml::Value::String).collect()),
    );
    let env = emulator_env(&emulator.host());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // `status` before `setup`: the emulator answers, the topics are missing, and it says the fix.
    let status = run_cmd_with(&["status"], &config, &env, Duration::from_secs(120)).await;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        said.contains("do not exist") && said.contains("outbox-relay setup"),
        "{said}"
    );
    let out = run_cmd_with(&["setup"], &config, &env, Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "setup: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for t in &topics {
        assert!(emulator.topic_exists(t).await, "setup created {t}: {stdout}");
        assert!(stdout.contains(&format!("topics/{t} created")), "{stdout}");
    }
    // Again: the topics exist now, and setup says so.
    let again = run_cmd_with(&["setup"], &config, &env, Duration::from_secs(120)).await;
    assert!(again.status.success() && String::from_utf8_lossy(&again.stdout).contains("exists"));
    let status = run_cmd_with(&["status"], &config, &env, Duration::from_secs(120)).await;
    let said = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.status.success() && said.contains("Pub/Sub emulator") && said.contains("4 topic(s) checked"),
        "{said}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let emulator = shared(emulator);
    let mut subs = Vec::new();
    for t in &topics {
        subs.push((emulator.read().await.subscribe(t).await, t.clone()));
    }
    let puller = Puller::start(Arc::clone(&emulator), subs);
    let host = emulator.read().await.host();
    let relay = run_streaming(&config, &host).await;
    assert!(
        relay.log_text().contains("Pub/Sub emulator"),
        "the emulator is named at start: {}",
        relay.log_text()
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, 400, 20, 4),
    )
    .await;
    let records = puller.wait_for(committed.len(), Duration::from_secs(90)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| format!("{prefix}.{}", e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
    // Per topic, each aggregate's events of that type in commit order (ordering keys, and a
    // subscription with message ordering on).
    for topic in &topics {
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in records.iter().filter(|r| &r.topic == topic) {
            got.entry(r.key_str().unwrap().to_owned()).or_default().push(id_of(r));
        }
        for (agg, events) in &committed.by_aggregate {
            let want: Vec<String> = events
                .iter()
                .filter(|e| topic.ends_with(&e.event_type))
                .map(|e| e.id.clone())
                .collect();
            assert_eq!(got.get(agg).cloned().unwrap_or_default(), want, "{topic} {agg}");
        }
    }
    // The attributes: the event id and the aggregate key, nothing else without header columns.
    let names: Vec<&str> = records[0].headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["id", "key"], "{:?}", records[0]);
    eprintln!(
        "workload: {} events in {} topics, 0 lost, 0 duplicates",
        all.len(),
        topics.len()
    );
}

/// At-least-once: the relay SIGKILLed under load, restarted each time; nothing lost, first
/// deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_nothing() {
    let Some(emulator) = PubSubEmulator::start("sigkill_under_load_loses_nothing").await else {
        return;
    };
    let emulator = shared(emulator);
    let prefix = unique_name("pubsub_kill");
    let (topic, puller) = order_topic(&emulator, &prefix).await;
    let host = emulator.read().await.host();
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = fast_restarts(to_pubsub(config, &prefix)).max_in_flight(50);
    let kills: usize = if long_tests() { 20 } else { 5 };
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, kills * 200, 30, 4);
    w.pause = Duration::from_millis(10);
    let committed = sigkills_under_load(&url, w, kills, (500, 1500), || run(&config, &host)).await;
    let _relay = run(&config, &host);
    let records = puller.wait_for(committed.len(), Duration::from_secs(120)).await;
    check_all(&committed, &records, &topic, &format!("{kills} SIGKILLs"));
}

/// A routed topic that does not exist (NOT_FOUND) holds the WAL position with the fix in the
/// log — the relay keeps running — and once the topic is created, everything arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_topic_holds_the_position_until_it_is_created() {
    let Some(emulator) = PubSubEmulator::start("a_missing_topic_holds_the_position_until_it_is_created").await else {
        return;
    };
    let emulator = shared(emulator);
    let prefix = unique_name("pubsub_missing");
    let topic = format!("{prefix}.order");
    let host = emulator.read().await.host();
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = fast_restarts(to_pubsub(config, &prefix)).set("pubsub", "retry_timeout_ms", 1000);
    let mut relay = run_streaming(&config, &host).await;
    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::B, 60, 6, 2)).await;
    assert!(
        relay.wait_for_log("does not exist", Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
    let log = relay.log_text();
    assert!(
        log.contains(&format!("projects/{PROJECT}/topics/{topic}"))
            && log.contains(&format!("gcloud pubsub topics create {topic} --project {PROJECT}")),
        "the topic and the fix are named:\n{log}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        relay.try_exit_status().is_none(),
        "a missing topic is not fatal:\n{log}"
    );
    // A Pub/Sub subscription receives only what is published after it exists, and the topic
    // must exist before it: the relay is frozen while both are made (after its last publish
    // was answered), or what it publishes in between reaches the topic and no subscription.
    assert!(relay.sigstop(), "SIGSTOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, puller) = order_topic(&emulator, &prefix).await;
    assert!(relay.sigcont(), "SIGCONT");
    let records = puller.wait_for(committed.len(), Duration::from_secs(90)).await;
    check_all(&committed, &records, &topic, "a topic created while the relay waited");
}

/// How the emulator is taken away for 30 s.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outage {
    /// The relay reaches it through a proxy that resets every connection for 30 s; the emulator
    /// keeps running (and keeps what it acknowledged): nothing may be lost.
    Unreachable,
    /// The emulator process SIGKILLed, started again 30 s later on the same port with its
    /// topic and subscription recreated. It keeps messages in memory only, so what it had
    /// acknowledged and the test had not pulled yet is gone with it; everything committed
    /// after the kill must arrive.
    Killed,
}

async fn emulator_down_30_seconds(outage: Outage, shipped: bool) {
    let name = format!("emulator_down_30_seconds({outage:?}, shipped: {shipped})");
    let Some(emulator) = PubSubEmulator::start(&name).await else {
        return;
    };
    let emulator = shared(emulator);
    let prefix = unique_name("pubsub_down");
    let (topic, puller) = order_topic(&emulator, &prefix).await;
    let target: SocketAddr = emulator.read().await.host().parse().unwrap();
    let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), Some(target)).await;
    let host = match outage {
        Outage::Unreachable => proxy.addr().to_string(),
        Outage::Killed => emulator.read().await.host(),
    };
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let mut config = to_pubsub(config, &prefix);
    if !shipped {
        config = fast_restarts(config).max_in_flight(50);
    }
    let relay = run_streaming(&config, &host).await;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::B, 600, 30, 4);
    w.pause = Duration::from_millis(50);
    let load = {
        let url = url.clone();
        tokio::spawn(async move { run_workload(&url, &w).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = puller.records().len();
    let stopped_at = Instant::now();
    match outage {
        Outage::Unreachable => proxy.set_mode(Mode::Reset),
        Outage::Killed => emulator.write().await.kill(),
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    match outage {
        Outage::Unreachable => proxy.set_mode(Mode::Pass),
        Outage::Killed => emulator.write().await.restart().await,
    }
    let restarted = Instant::now();
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 100, 10, 2)).await;
    let what = format!(
        "Pub/Sub emulator {} 30 s ({}), {before} messages before, {:?} outage",
        match outage {
            Outage::Unreachable => "unreachable",
            Outage::Killed => "killed and restarted after",
        },
        if shipped {
            "shipped defaults"
        } else {
            "backoff 100-500 ms, 50 in flight"
        },
        stopped_at.elapsed()
    );
    match outage {
        Outage::Unreachable => {
            committed.by_aggregate.extend(later.by_aggregate);
            let records = puller.wait_for(committed.len(), Duration::from_secs(180)).await;
            eprintln!(
                "caught up {:?} after the emulator was reachable again",
                restarted.elapsed()
            );
            check_all(&committed, &records, &topic, &what);
        }
        Outage::Killed => {
            // The emulator lost what it held and the test had not pulled; every event committed
            // after the restart must arrive, and what arrives keeps each aggregate's order.
            let later_ids: HashSet<String> = later.all().map(|e| e.id.clone()).collect();
            let deadline = Instant::now() + Duration::from_secs(180);
            let records = loop {
                let records = puller.records();
                let got: HashSet<String> = records.iter().map(id_of).collect();
                if later_ids.is_subset(&got) || Instant::now() > deadline {
                    break records;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            // Whatever else is still coming (replays of the first workload) settles first.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let records = puller.records().max_by_len(records);
            let got: HashSet<String> = records.iter().map(id_of).collect();
            let missing_later: Vec<&String> = later_ids.iter().filter(|id| !got.contains(*id)).collect();
            assert!(
                missing_later.is_empty(),
                "{what}: {} events committed after the restart never arrived, e.g. {:?}",
                missing_later.len(),
                missing_later.first()
            );
            committed.by_aggregate.extend(later.by_aggregate);
            let lost = committed.all().filter(|e| !got.contains(&e.id)).count();
            let by_key = ids_by_key(&records);
            for (agg, events) in &committed.by_aggregate {
                let mut seen = HashSet::new();
                let firsts: Vec<&String> = by_key
                    .get(agg)
                    .map(|ids| ids.iter().filter(|id| seen.insert(id.as_str())).collect())
                    .unwrap_or_default();
                let expected: Vec<&String> = events.iter().map(|e| &e.id).filter(|id| got.contains(*id)).collect();
                assert_eq!(firsts, expected, "{what}: aggregate {agg} out of commit order");
            }
            eprintln!(
                "{what}: {} events, {lost} lost with the emulator's memory (acknowledged to the relay before the \
                 kill, not pulled yet), every later one arrived",
                committed.len()
            );
            // The emulator can only lose what it acknowledged and the test had not pulled yet
            // (pulls run every 100 ms): a few hundred milliseconds of traffic, not the outage's.
            assert!(lost <= 200, "{what}: {lost} events missing");
        }
    }
    let log = relay.log_text();
    assert!(log.contains("Pub/Sub"), "the outage should show in the log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_unreachable_30_seconds_loses_nothing() {
    emulator_down_30_seconds(Outage::Unreachable, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_unreachable_30_seconds_with_shipped_defaults_loses_nothing() {
    emulator_down_30_seconds(Outage::Unreachable, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_killed_30_seconds_resumes_with_every_later_event() {
    emulator_down_30_seconds(Outage::Killed, false).await;
}

// ---- Bad events ----

/// How an event can be bad for Pub/Sub.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    /// A payload above Pub/Sub's 10 MB.
    TooLarge,
    /// 101 attributes: id, key and 99 header columns.
    TooManyAttributes,
}

/// Header columns added to the outbox table for [`Bad::TooManyAttributes`]: with `id` and
/// `key`, 101 attributes when all are set. The good rows leave them NULL, which the sink does
/// not send as attributes.
const EXTRA_HEADERS: usize = 99;

fn cause_of(bad: Bad) -> &'static str {
    match bad {
        Bad::TooLarge => "larger",
        Bad::TooManyAttributes => "at most 100 per message",
    }
}

struct BadSetup {
    emulator: Arc<RwLock<PubSubEmulator>>,
    /// Every event of a bad-event test is of this one aggregate: Pub/Sub orders per ordering
    /// key only, and one key also shows the key resumes once the relay decided about a bad one.
    aggregate: String,
    client: Client,
    config: RelayConfig,
    prefix: String,
    puller: Puller,
}

async fn bad_setup(test: &str, policy: &str, bad: Option<Bad>) -> Option<BadSetup> {
    let emulator = shared(PubSubEmulator::start(test).await?);
    let prefix = unique_name("pubsub_bad");
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let mut config = fast_restarts(to_pubsub(config, &prefix)).set("relay", "on_bad_event", policy);
    if bad == Some(Bad::TooManyAttributes) {
        let columns: Vec<String> = (0..EXTRA_HEADERS).map(|i| format!("ADD COLUMN h{i} text")).collect();
        client
            .batch_execute(&format!("ALTER TABLE events_outbox {}", columns.join(", ")))
            .await
            .unwrap();
        for i in 0..EXTRA_HEADERS {
            config = config.header_column(&format!("h{i}"), &format!("h{i}"));
        }
    }
    let good = format!("{prefix}.good");
    let dead = format!("{prefix}.dead");
    let e = emulator.read().await;
    e.create_topic(&good).await;
    let mut subs = vec![(e.subscribe(&good).await, good.clone())];
    if policy == "dead-letter" {
        config = config.set("relay", "dead_letter_topic", dead.as_str());
        e.create_topic(&dead).await;
        subs.push((e.subscribe(&dead).await, dead.clone()));
    }
    drop(e);
    let puller = Puller::start(Arc::clone(&emulator), subs);
    Some(BadSetup {
        emulator,
        aggregate: crate::harness::workload::new_uuid(),
        client,
        config,
        prefix,
        puller,
    })
}

async fn insert(client: &Client, aggregate: &str, ty: &str, payload: &str) -> String {
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($1::text::uuid, $2, $3::text::jsonb)
             RETURNING id::text",
            &[&aggregate, &ty, &payload],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn insert_bad(client: &Client, aggregate: &str, bad: Bad) -> String {
    match bad {
        Bad::TooLarge => {
            insert(
                client,
                aggregate,
                "good",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(10_500_000)),
            )
            .await
        }
        Bad::TooManyAttributes => {
            let cols: Vec<String> = (0..EXTRA_HEADERS).map(|i| format!("h{i}")).collect();
            let vals: Vec<String> = (0..EXTRA_HEADERS).map(|i| format!("'v{i}'")).collect();
            let row = client
                .query_one(
                    &format!(
                        "INSERT INTO events_outbox (aggregate_id, type, payload, {}) VALUES ($1::text::uuid, 'good', \
                         '{{}}', {}) RETURNING id::text",
                        cols.join(", "),
                        vals.join(", ")
                    ),
                    &[&aggregate],
                )
                .await
                .unwrap();
            row.get(0)
        }
    }
}

async fn goods_around(setup: &BadSetup, bads: &[Bad]) -> (Vec<String>, Vec<String>) {
    let agg = setup.aggregate.as_str();
    let mut goods = vec![insert(&setup.client, agg, "good", "{\"n\": 0}").await];
    let mut bad_ids = Vec::new();
    for (i, bad) in bads.iter().enumerate() {
        bad_ids.push(insert_bad(&setup.client, agg, *bad).await);
        goods.push(insert(&setup.client, agg, "good", &format!("{{\"n\": {}}}", i + 1)).await);
    }
    (goods, bad_ids)
}

/// The good events' first deliveries, in arrival order.
async fn wait_goods(setup: &BadSetup, goods: &[String]) -> Vec<String> {
    let topic = format!("{}.good", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ids: Vec<String> = setup
            .puller
            .records()
            .iter()
            .filter(|r| r.topic == topic)
            .map(id_of)
            .collect();
        let mut seen = HashSet::new();
        let firsts: Vec<String> = ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect();
        let has_all = goods.iter().all(|g| firsts.contains(g));
        if has_all || Instant::now() > deadline {
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

async fn fail_case(test: &str, bad: Bad) {
    let Some(setup) = bad_setup(test, "fail", Some(bad)).await else {
        return;
    };
    let host = setup.emulator.read().await.host();
    let mut relay = run_streaming(&setup.config, &host).await;
    let (_goods, bad_ids) = goods_around(&setup, &[bad]).await;
    let status = relay.wait_exit(Duration::from_secs(90)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{bad:?}: exit 1; log:\n{log}");
    assert!(
        log.contains(&format!("id={}", bad_ids[0])),
        "{bad:?}: names the event; log:\n{log}"
    );
    assert!(log.contains(cause_of(bad)), "{bad:?}: names the cause; log:\n{log}");
    let ids: Vec<String> = setup.puller.records().iter().map(id_of).collect();
    assert!(!ids.contains(&bad_ids[0]), "{bad:?} was not published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_large() {
    fail_case("bad_event_fail_too_large", Bad::TooLarge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_event_fail_too_many_attributes() {
    fail_case("bad_event_fail_too_many_attributes", Bad::TooManyAttributes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_skipped_and_the_good_ones_arrive_in_order() {
    let Some(setup) = bad_setup(
        "bad_events_skipped_and_the_good_ones_arrive_in_order",
        "skip",
        Some(Bad::TooManyAttributes),
    )
    .await
    else {
        return;
    };
    let host = setup.emulator.read().await.host();
    let _relay = run_streaming(&setup.config, &host).await;
    let (goods, bad_ids) = goods_around(&setup, &[Bad::TooLarge, Bad::TooManyAttributes]).await;
    let ids = wait_goods(&setup, &goods).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let all: HashSet<String> = setup.puller.records().iter().map(id_of).collect();
    for id in &bad_ids {
        assert!(!all.contains(id), "bad event {id} skipped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_dead_lettered_to_a_topic() {
    let Some(setup) = bad_setup(
        "bad_events_dead_lettered_to_a_topic",
        "dead-letter",
        Some(Bad::TooManyAttributes),
    )
    .await
    else {
        return;
    };
    let host = setup.emulator.read().await.host();
    let _relay = run_streaming(&setup.config, &host).await;
    let bads = [Bad::TooLarge, Bad::TooManyAttributes];
    let (goods, bad_ids) = goods_around(&setup, &bads).await;
    let ids = wait_goods(&setup, &goods).await;
    assert_eq!(
        ids, goods,
        "every good event, first deliveries in commit order, no bad one"
    );
    let dead_topic = format!("{}.dead", setup.prefix);
    let deadline = Instant::now() + Duration::from_secs(30);
    let dead = loop {
        let dead: Vec<Received> = setup
            .puller
            .records()
            .into_iter()
            .filter(|r| r.topic == dead_topic)
            .collect();
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
    for (id, bad) in bad_ids.iter().zip(bads) {
        for r in dead.iter().filter(|r| &id_of(r) == id) {
            let error = String::from_utf8_lossy(r.header("outbox-relay-error").expect("error attribute")).into_owned();
            assert!(error.contains(cause_of(bad)), "{bad:?}: {error}");
            assert_eq!(r.key_str().map(str::len), Some(36), "the event's key");
        }
    }
    eprintln!("dead letters: {} bad events, {} messages", bad_ids.len(), dead.len());
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
