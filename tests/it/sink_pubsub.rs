//! What is Pub/Sub's own, end to end through `outbox-relay run` against Google's Pub/Sub
//! emulator (docs/sink-pubsub.md): `status` and `setup` with `[pubsub] topics` (topics made,
//! found again, named), a routed topic that does not exist holding the position until it is
//! made, and the emulator killed for 30 s and started again (it loses what it held). Routing,
//! ordering keys and attributes, SIGKILLs, the emulator unreachable for 30 s, bad events under
//! each `relay.on_bad_event` and the exactly-once refusal are the conformance suite's
//! (`tests/it/conformance.rs`, `harness/conformance/pubsub.rs`).
//!
//! Each test runs an emulator of its own on a free loopback port (`harness/pubsub.rs`), the
//! relay pointed at it by `PUBSUB_EMULATOR_HOST`, as Google's clients are.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::RwLock;

use crate::harness::fault_support::*;
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

/// `status` before `setup` says the topics are missing and the fix; `setup` creates `[pubsub]
/// topics` and says so, and finds them the second time; `status` then checks them; the relay
/// names the emulator at start and publishes through the topics `setup` made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_creates_the_topics_and_status_checks_them() {
    let Some(emulator) = PubSubEmulator::start("setup_creates_the_topics_and_status_checks_them").await else {
        return;
    };
    let prefix = unique_name("pubsub_setup");
    let (db, _client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let topics: Vec<String> = EVENT_TYPES.iter().map(|t| format!("{prefix}.{t}")).collect();
    // Every event type to a topic of its own, which `setup` creates from [pubsub] topics.
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
        &Workload::new(OutboxSchema::A, 40, 10, 2),
    )
    .await;
    let records = puller.wait_for(committed.len(), Duration::from_secs(90)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |e| format!("{prefix}.{}", e.event_type));
    assert_eq!(dups, 0, "no failure, no duplicate");
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

/// The emulator process SIGKILLed, started again 30 s later on the same port with its topic and
/// subscription recreated. It keeps messages in memory only, so what it had acknowledged and the
/// test had not pulled yet is gone with it; everything committed after the kill must arrive, and
/// what arrives keeps each aggregate's order. (The emulator unreachable for 30 s, which loses
/// nothing, is the conformance suite's `server_away_30_seconds`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_killed_30_seconds_resumes_with_every_later_event() {
    let Some(emulator) = PubSubEmulator::start("emulator_killed_30_seconds_resumes_with_every_later_event").await
    else {
        return;
    };
    let emulator = shared(emulator);
    let prefix = unique_name("pubsub_down");
    let (_topic, puller) = order_topic(&emulator, &prefix).await;
    let host = emulator.read().await.host();
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let config = fast_restarts(to_pubsub(config, &prefix)).max_in_flight(50);
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
    emulator.write().await.kill();
    tokio::time::sleep(Duration::from_secs(30)).await;
    emulator.write().await.restart().await;
    let mut committed = load.await.expect("workload");
    let later = run_workload(&url, &Workload::new(OutboxSchema::B, 100, 10, 2)).await;
    let what = format!(
        "Pub/Sub emulator killed and restarted after 30 s (backoff 100-500 ms, 50 in flight), {before} messages \
         before, {:?} outage",
        stopped_at.elapsed()
    );
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
    let log = relay.log_text();
    assert!(log.contains("Pub/Sub"), "the outage should show in the log:\n{log}");
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
