//! Failure and bad-input suite: crashes at random moments and at failpoints, broker faults, and
//! hostile rows under every `relay.on_bad_event` policy — on a real Apache Kafka broker, except
//! where the fault is one only librdkafka's mock cluster injects (produce errors of a chosen
//! code, broker round-trip times): those tests say so.
//!
//! The promise under test: no crash, outage or bad row loses an event, first deliveries per
//! aggregate follow commit order, and the confirmed LSN never passes an event Kafka has not
//! acknowledged. `OUTBOX_RELAY_LONG_TESTS=1` runs the long variants (docs/reliability.md).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

// ------------------------------------------------------------------------------------------
// Crash points
// ------------------------------------------------------------------------------------------

/// `relay.delivery` for the crash suites: both modes run them; exactly-once must show no
/// duplicate at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AtLeastOnce,
    ExactlyOnce,
}

impl Mode {
    pub fn apply(self, config: RelayConfig) -> RelayConfig {
        match self {
            Mode::AtLeastOnce => config,
            Mode::ExactlyOnce => config.set("relay", "delivery", "exactly-once"),
        }
    }

    /// Asserts the duplicates are within what the mode promises.
    pub fn check_duplicates(self, dups: usize, bound: usize, what: &str) {
        match self {
            Mode::AtLeastOnce => assert!(
                dups <= bound,
                "{what}: {dups} duplicates exceed the in-flight bound {bound}"
            ),
            Mode::ExactlyOnce => assert_eq!(dups, 0, "{what}: duplicates in exactly-once mode"),
        }
    }
}

/// Continuous load; the relay is SIGKILLed at random moments (≥ 10, long: ≥ 50) and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_at_random_moments_under_load_loses_nothing() {
    sigkill_suite(Mode::AtLeastOnce).await;
}

/// The same in exactly-once mode: not one duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_at_random_moments_under_load_exactly_once() {
    sigkill_suite(Mode::ExactlyOnce).await;
}

async fn sigkill_suite(mode: Mode) {
    let kills_wanted: usize = if long_tests() { 50 } else { 10 };
    let max_in_flight = 20;
    let Some(kafka) = shared_kafka().await else { return };
    let (db, _client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = mode
        .apply(config)
        .route(PREFIX_REGEX, "${routedByValue}")
        .max_in_flight(max_in_flight)
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, kills_wanted * 250, 40, 4);
    w.pause = Duration::from_millis(10);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    let mut kills = 0;
    let mut skipped = 0;
    while kills < kills_wanted {
        let relay = RelayProcess::run(&config);
        // Anywhere from before the replication connection exists to well into streaming.
        tokio::time::sleep(Duration::from_millis(100 + random_below(1400))).await;
        assert!(
            relay.sigkill(),
            "the relay exited on its own; log:\n{}",
            relay.log_text()
        );
        skipped += skipped_in_log(&relay.log_text());
        kills += 1;
    }
    eprintln!("crash points ({mode:?}): {skipped} events skipped as already in Kafka");
    let committed = load.await.expect("workload");
    let _relay = RelayProcess::run(&config);
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    let bound = kills * max_in_flight as usize;
    eprintln!(
        "crash points ({mode:?}): {kills} SIGKILLs, {} events, {dups} duplicates (bound {bound})",
        all.len()
    );
    mode.check_duplicates(dups, bound, &format!("{kills} SIGKILLs"));
}

/// Crashes at the failpoints: between "Kafka acknowledged" and "status update sent", and in the
/// producer restart path (a failed session's producer purged, its requests maybe on the wire).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_at_failpoints_lose_nothing() {
    failpoint_suite(Mode::AtLeastOnce).await;
}

/// The failpoint crashes in exactly-once mode: not one duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_at_failpoints_exactly_once() {
    failpoint_suite(Mode::ExactlyOnce).await;
}

async fn failpoint_suite(mode: Mode) {
    if !cfg!(feature = "failpoints") {
        crate::harness::needs::missing(crate::harness::needs::FAILPOINTS, "", "");
        return;
    }
    let crashes_wanted: usize = if long_tests() { 30 } else { 6 };
    let max_in_flight = 20;
    // Part 2 kills the broker: a cluster of this test's own.
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single()).await else {
        return;
    };
    let kafka = cluster.own_ns();
    let (db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = mode
        .apply(config)
        .route(PREFIX_REGEX, "${routedByValue}")
        .max_in_flight(max_in_flight)
        .kafka("message.timeout.ms", "1000")
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, crashes_wanted * 300, 30, 4);
    w.pause = Duration::from_millis(5);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    // 1. Acknowledged, not yet confirmed.
    let mut crashes = 0;
    let mut skipped = 0;
    // Every session start replays from the last confirmed LSN: a crash does, and so does a
    // session the relay ends itself (a delivery that timed out under load after the 1 s
    // `message.timeout.ms` this suite sets). Each replay may repeat at most the in-flight window.
    let mut sessions = 0;
    let started = Instant::now();
    while crashes < crashes_wanted {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "only {crashes} failpoint crashes in 120 s"
        );
        let mut relay = RelayProcess::run_with(&config, &[], &[("FAILPOINTS", "relay::acked_before_status=3%return")]);
        let status = relay.wait_exit(Duration::from_secs(20)).await;
        let log = relay.log_text();
        skipped += skipped_in_log(&log);
        sessions += sessions_in_log(&log);
        match status {
            Some(s) => {
                assert!(
                    !s.success() && log.contains("failpoint relay::acked_before_status"),
                    "{s:?}; log:\n{log}"
                );
                crashes += 1;
            }
            // Load over before the failpoint fired: nothing acknowledged any more.
            None if load.is_finished() => break,
            None => panic!("no crash in 20 s under load; log:\n{log}"),
        }
    }
    let committed = load.await.expect("workload");

    // 2. The producer restart path: a delivery failure ends the session; the relay dies while
    // abandoning the failed producer.
    let mut relay = RelayProcess::run_with(&config, &[], &[("FAILPOINTS", "publisher::abandon=return")]);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    cluster.kill(1);
    let mut client = client;
    let agg = new_uuid();
    let tx = client.transaction().await.unwrap();
    let mut outage = Vec::new();
    for seq in 0..5 {
        outage.push(insert_event(&tx, OutboxSchema::A, &agg, seq).await);
    }
    tx.commit().await.unwrap();
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert!(
        status.is_some_and(|s| !s.success()) && log.contains("failpoint publisher::abandon"),
        "{status:?}; log:\n{log}"
    );
    crashes += 1;
    sessions += sessions_in_log(&log);
    cluster.restart(1).await;

    let relay = RelayProcess::run(&config);
    let mut committed = committed;
    committed.by_aggregate.insert(agg, outage);
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    sessions += sessions_in_log(&relay.log_text());
    let bound = sessions * max_in_flight as usize;
    eprintln!(
        "failpoints ({mode:?}): {crashes} crashes, {sessions} sessions, {} events, {dups} duplicates (bound {bound})",
        all.len()
    );
    mode.check_duplicates(dups, bound, &format!("{crashes} failpoint crashes"));
    skipped += skipped_in_log(&relay.log_text());
    eprintln!("failpoints ({mode:?}): {skipped} events skipped as already in Kafka");
    if mode == Mode::ExactlyOnce {
        // Crashing between Kafka's acknowledgement and the status update leaves acknowledged
        // events to replay: the check must have skipped some, or the test proves nothing.
        assert!(skipped > 0, "no replayed event was skipped");
    }
}

/// Streaming sessions a relay log shows: each started from the last confirmed LSN.
fn sessions_in_log(log: &str) -> usize {
    log.lines().filter(|l| l.contains("streaming started")).count()
}

/// Events the relay's logs say it skipped as already in Kafka (exactly-once).
fn skipped_in_log(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("replay window checked"))
        .filter_map(|l| l.split("skipped_already_in_sink=").nth(1))
        .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
        .sum()
}

// ------------------------------------------------------------------------------------------
// Broker faults (mock cluster)
// ------------------------------------------------------------------------------------------

/// Commits `count` events of one new aggregate in one transaction.
async fn commit_batch(client: &mut Client, count: u64) -> (Vec<ExpectedEvent>, CommitPoint) {
    let agg = new_uuid();
    let tx = client.transaction().await.unwrap();
    let probe = TxnProbe::start(&tx).await;
    let mut events = Vec::new();
    for seq in 0..count {
        events.push(insert_event(&tx, OutboxSchema::A, &agg, seq).await);
    }
    tx.commit().await.unwrap();
    (events, probe.finish(client).await)
}

/// A relay streaming `prepared` schema A through `kafka`, warmed up (one event delivered and
/// confirmed, so producer id and metadata exist before a fault starts).
async fn warm_relay(
    kafka: &KafkaNs,
    tune: impl FnOnce(RelayConfig) -> RelayConfig,
) -> (Client, RelayConfig, RelayProcess) {
    let (db, _, config) = prepared_ns(OutboxSchema::A, kafka).await;
    let mut client = shared_cluster().await.client(&db).await;
    install_walinspect(&client).await;
    let config = tune(
        config
            .route(PREFIX_REGEX, "${routedByValue}")
            .set("relay", "reconnect_backoff_initial_ms", 200)
            .set("relay", "reconnect_backoff_max_ms", 1000),
    );
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let (warm, point) = commit_batch(&mut client, 1).await;
    let records = kafka.collect(&["order"], 1, Duration::from_secs(30)).await;
    check_delivered(&warm, &records, |_| "order".to_owned());
    assert!(
        confirmed_reaches(&client, &config.slot, point.end_lsn, Duration::from_secs(15)).await,
        "{}",
        relay.log_text()
    );
    (client, config, relay)
}

/// Waits for every one of `events` on topic `order` (other records there are ignored), checks
/// none is missing and each aggregate's order, and that the slot confirms `point`; returns how
/// many arrived more than once.
async fn delivered_in_order_and_confirmed(
    kafka: &KafkaNs,
    client: &Client,
    slot: &str,
    events: &[ExpectedEvent],
    point: &CommitPoint,
) -> usize {
    let records = kafka
        .collect(&["order"], events.len() + 1, Duration::from_secs(60))
        .await;
    let records: Vec<Received> = records
        .into_iter()
        .filter(|r| events.iter().any(|e| e.id == id_of(r)))
        .collect();
    let dups = check_delivered(events, &records, |_| "order".to_owned());
    let (_, committed) = expect_all(&[events]);
    check_order(&committed, &records);
    assert!(confirmed_reaches(client, slot, point.end_lsn, Duration::from_secs(30)).await);
    dups
}

fn expect_all(batches: &[&[ExpectedEvent]]) -> (Vec<ExpectedEvent>, Committed) {
    let mut committed = Committed::default();
    for b in batches {
        for e in b.iter() {
            committed
                .by_aggregate
                .entry(e.aggregate_id.clone())
                .or_default()
                .push(e.clone());
        }
    }
    (committed.all().cloned().collect(), committed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_brokers_down_for_30_seconds() {
    brokers_down_suite(Mode::AtLeastOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_brokers_down_for_30_seconds_exactly_once() {
    brokers_down_suite(Mode::ExactlyOnce).await;
}

async fn brokers_down_suite(mode: Mode) {
    // The broker is killed (kill -9) for 30 s and started again: a cluster of this test's own.
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single()).await else {
        return;
    };
    let kafka = cluster.own_ns();
    // Short message timeout: sessions fail and replay during the outage (the restart path).
    let (mut client, config, relay) = warm_relay(&kafka, |c| {
        mode.apply(c).max_in_flight(50).kafka("message.timeout.ms", "5000")
    })
    .await;
    let warm = kafka.collect(&["order"], 1, Duration::from_secs(5)).await;

    cluster.kill(1);
    let outage = Instant::now();
    let (first, first_point) = commit_batch(&mut client, 5).await;
    let (second, _) = commit_batch(&mut client, 5).await;
    let remaining = Duration::from_secs(30).saturating_sub(outage.elapsed());
    assert_never_confirmed_past(&client, &config.slot, first_point.end_lsn, remaining, "brokers down").await;
    let (third, last_point) = commit_batch(&mut client, 5).await;
    cluster.restart(1).await;

    let (all, committed) = expect_all(&[&first, &second, &third]);
    let records = kafka
        .collect(&["order"], all.len() + warm.len(), Duration::from_secs(60))
        .await;
    let records: Vec<Received> = records
        .into_iter()
        .filter(|r| !warm.iter().any(|w| id_of(w) == id_of(r)))
        .collect();
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    eprintln!("brokers down 30 s ({mode:?}): {} events, {dups} duplicates", all.len());
    mode.check_duplicates(dups, 50 * 10, "brokers down 30 s");
    assert!(
        confirmed_reaches(&client, &config.slot, last_point.end_lsn, Duration::from_secs(30)).await,
        "never confirmed after the outage; log:\n{}",
        relay.log_text()
    );
    assert!(
        relay.log_text().contains("Kafka delivery failed"),
        "the outage should have failed deliveries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retriable_produce_errors_are_retried_without_loss_or_duplicates() {
    // Mock cluster: produce errors injected by the mock alone.
    let mock = MockKafka::new(1);
    mock.create_topic("order", 1);
    let kafka = KafkaNs::plain(&mock.bootstrap_servers());
    let (mut client, config, relay) = warm_relay(&kafka, |c| {
        c.kafka("retry.backoff.ms", "100").kafka("retry.backoff.max.ms", "200")
    })
    .await;
    // Each refused attempt takes at least the round trip, so 20 errors keep the events
    // unacknowledged for well over the 2 s polled below.
    mock.set_round_trip_time(Duration::from_millis(300));
    let errors: Vec<RDKafkaRespErr> = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION
            } else {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS
            }
        })
        .collect();
    mock.with_cluster(move |c| c.request_errors(RDKafkaApiKey::Produce, &errors));
    let (events, point) = commit_batch(&mut client, 5).await;
    assert_never_confirmed_past(
        &client,
        &config.slot,
        point.end_lsn,
        Duration::from_secs(2),
        "retriable errors",
    )
    .await;
    mock.set_round_trip_time(Duration::ZERO);

    let dups = delivered_in_order_and_confirmed(&kafka, &client, &config.slot, &events, &point).await;
    assert_eq!(dups, 0, "the idempotent producer's retries must not duplicate");
    assert!(
        !relay.log_text().contains("reconnecting"),
        "retriable errors must not end the session:\n{}",
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_retriable_broker_error_replays_without_loss() {
    non_retriable_suite(Mode::AtLeastOnce).await;
}

/// The producer restart after failed deliveries, in exactly-once mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_retriable_broker_error_replays_exactly_once() {
    non_retriable_suite(Mode::ExactlyOnce).await;
}

async fn non_retriable_suite(mode: Mode) {
    // Mock cluster: produce errors injected by the mock alone.
    let mock = MockKafka::new(1);
    mock.create_topic("order", 1);
    let kafka = KafkaNs::plain(&mock.bootstrap_servers());
    let (mut client, config, relay) = warm_relay(&kafka, |c| mode.apply(c)).await;
    // TOPIC_AUTHORIZATION_FAILED is permanent for librdkafka, but it is the cluster's verdict on
    // the relay's credentials, not on the record: the relay replays (with backoff) until it passes.
    mock.set_round_trip_time(Duration::from_millis(400));
    mock.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 3],
        )
    });
    let (events, point) = commit_batch(&mut client, 5).await;
    assert_never_confirmed_past(
        &client,
        &config.slot,
        point.end_lsn,
        Duration::from_millis(1200),
        "authorization",
    )
    .await;
    mock.set_round_trip_time(Duration::ZERO);

    let dups = delivered_in_order_and_confirmed(&kafka, &client, &config.slot, &events, &point).await;
    eprintln!("producer restarts ({mode:?}): {dups} duplicates");
    mode.check_duplicates(dups, 5, "producer restarts after failed deliveries");
    let log = relay.log_text();
    assert!(log.contains("reconnecting") && log.contains("uthorization"), "{log}");
    assert!(
        !log.contains("bad outbox event"),
        "an authorization failure is not a bad event:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_second_round_trips() {
    // Mock cluster: the fault is the broker's round-trip time, injected by the mock alone.
    let mock = MockKafka::new(3);
    let kafka = KafkaNs::plain(&mock.bootstrap_servers());
    let (mut client, config, relay) = warm_relay(&kafka, |c| c.max_in_flight(100)).await;
    mock.set_round_trip_time(Duration::from_secs(2));
    let (first, first_point) = commit_batch(&mut client, 5).await;
    // No acknowledgement can come back before one round trip.
    assert_never_confirmed_past(
        &client,
        &config.slot,
        first_point.end_lsn,
        Duration::from_millis(1500),
        "2 s RTT",
    )
    .await;
    let url = shared_cluster().await.url(&client_db(&client).await);
    let load = run_workload(&url, &Workload::new(OutboxSchema::A, 200, 10, 4)).await;
    let (last, last_point) = commit_batch(&mut client, 1).await;
    // Everything is delivered while the round trips are still 2 s (the consumer below could
    // not even fetch metadata within its timeouts at that latency).
    assert!(
        confirmed_reaches(&client, &config.slot, last_point.end_lsn, Duration::from_secs(60)).await,
        "not confirmed within 60 s at 2 s round trips; log:\n{}",
        relay.log_text()
    );
    mock.set_round_trip_time(Duration::ZERO);
    let mut committed = load;
    let (_, extra) = expect_all(&[&first, &last]);
    committed.by_aggregate.extend(extra.by_aggregate);
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = kafka.collect(&["order"], all.len() + 1, Duration::from_secs(60)).await;
    let records: Vec<Received> = records
        .into_iter()
        .filter(|r| all.iter().any(|e| e.id == id_of(r)))
        .collect();
    check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    let log = relay.log_text();
    assert_eq!(
        log.matches("streaming started").count(),
        1,
        "slow acks must not cost the walsender:\n{log}"
    );
}

async fn client_db(client: &Client) -> String {
    client
        .query_one("SELECT current_database()::text", &[])
        .await
        .unwrap()
        .get(0)
}

// ------------------------------------------------------------------------------------------
// Bad rows
// ------------------------------------------------------------------------------------------

const BAD_TABLE: &str = "
CREATE TABLE bad_outbox (
    id bigserial PRIMARY KEY,
    aggregate_id text,
    type text,
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);";
const MESSAGE_PREFIX: &str = "outbox";
const DEAD_LETTERS: &str = "outbox.dead-letters";
/// The producer's message.max.bytes in these tests; the too-large row is over it.
const MAX_MESSAGE: usize = 100_000;
const GOOD_KEY: &str = "agg-1";

/// Every kind of bad event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadCase {
    NullRoute,
    NullKey,
    NullPayload,
    InvalidTopic,
    TooLarge,
    MalformedMessage,
}

const ALL_CASES: [BadCase; 6] = [
    BadCase::NullRoute,
    BadCase::NullKey,
    BadCase::NullPayload,
    BadCase::InvalidTopic,
    BadCase::TooLarge,
    BadCase::MalformedMessage,
];

impl BadCase {
    /// Text the relay's error/log/dead-letter header must contain.
    fn cause_fragment(self) -> &'static str {
        match self {
            BadCase::NullRoute => "\"type\" (route-by value) is NULL",
            BadCase::NullKey => "\"aggregate_id\" (message key) is NULL",
            BadCase::NullPayload => "\"payload\" (payload) is NULL",
            BadCase::InvalidTopic => "contains ' '",
            BadCase::TooLarge => "Kafka refused the record",
            BadCase::MalformedMessage => "field \"payload\" is missing or null",
        }
    }

    fn metric_cause(self) -> &'static str {
        match self {
            BadCase::NullRoute | BadCase::NullKey | BadCase::NullPayload => "null_column",
            BadCase::InvalidTopic => "invalid_topic",
            BadCase::TooLarge => "kafka_rejected",
            BadCase::MalformedMessage => "bad_message",
        }
    }
}

/// A committed row or message.
#[derive(Debug, Clone)]
struct Written {
    id: String,
    payload: Option<String>,
    /// The message content, for message events.
    content: Option<String>,
    point: CommitPoint,
}

/// A database with `bad_outbox`, pg_walinspect, and a relay config for it (setup done).
async fn bad_rows_db(kafka: &KafkaNs, policy: &str) -> (Client, RelayConfig) {
    bad_rows_db_in(kafka, policy, BadRowMode::AtLeastOnce).await
}

/// How the relay delivers in a bad-row scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadRowMode {
    /// The shipped default.
    AtLeastOnce,
    /// `relay.delivery = "exactly-once"` through Kafka transactions: a refused record poisons
    /// the whole Kafka transaction it is in, so the policy must not be applied inside it.
    KafkaTransactions,
}

impl BadRowMode {
    /// The mode `config` was made for by [`bad_rows_db_in`].
    fn of(config: &RelayConfig) -> BadRowMode {
        if config.kafka.contains_key("transactional.id") {
            BadRowMode::KafkaTransactions
        } else {
            BadRowMode::AtLeastOnce
        }
    }
}

async fn bad_rows_db_in(kafka: &KafkaNs, policy: &str, mode: BadRowMode) -> (Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("bad");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(BAD_TABLE).await.unwrap();
    install_walinspect(&client).await;
    let mut config = RelayConfig::new(&pg.url(&db), &kafka.bootstrap_servers())
        .on_kafka(kafka)
        .route(PREFIX_REGEX, "${routedByValue}")
        .kafka("message.max.bytes", &MAX_MESSAGE.to_string())
        .set("outbox", "message_prefix", MESSAGE_PREFIX)
        .set("relay", "on_bad_event", policy)
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    config.table = "public.bad_outbox".into();
    if mode == BadRowMode::KafkaTransactions {
        config = config
            .set("relay", "delivery", "exactly-once")
            .set("kafka", "exactly_once", "transactions")
            .set("kafka", "checkpoint_topic", kafka.topic("checkpoints"))
            .kafka("transactional.id", &unique_name("txn"));
    }
    if policy == "dead-letter" {
        config = config.set("relay", "dead_letter_topic", kafka.topic(DEAD_LETTERS));
    }
    setup(&config).await;
    (client, config)
}

async fn insert_row(client: &mut Client, key: Option<&str>, ty: Option<&str>, payload: Option<&str>) -> Written {
    let tx = client.transaction().await.unwrap();
    let probe = TxnProbe::start(&tx).await;
    let row = tx
        .query_one(
            "INSERT INTO bad_outbox (aggregate_id, type, payload) VALUES ($1, $2, $3::text::jsonb)
             RETURNING id::text, payload::text",
            &[&key, &ty, &payload],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    Written {
        id: row.get(0),
        payload: row.get(1),
        content: None,
        point: probe.finish(client).await,
    }
}

async fn good(client: &mut Client, n: u32) -> Written {
    insert_row(
        client,
        Some(GOOD_KEY),
        Some("order.placed"),
        Some(&format!("{{\"n\": {n}, \"note\": \"ok ✓\"}}")),
    )
    .await
}

async fn bad(client: &mut Client, case: BadCase) -> Written {
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(MAX_MESSAGE + 50_000));
    match case {
        BadCase::NullRoute => insert_row(client, Some(GOOD_KEY), None, Some("{}")).await,
        BadCase::NullKey => insert_row(client, None, Some("order.placed"), Some("{}")).await,
        BadCase::NullPayload => insert_row(client, Some(GOOD_KEY), Some("order.placed"), None).await,
        BadCase::InvalidTopic => insert_row(client, Some(GOOD_KEY), Some("bad topic!"), Some("{}")).await,
        BadCase::TooLarge => insert_row(client, Some(GOOD_KEY), Some("order.placed"), Some(&big)).await,
        BadCase::MalformedMessage => {
            let id = format!("msg-{}", new_uuid());
            let content = format!(r#"{{"id": "{id}", "type": "order.placed", "aggregate_id": "{GOOD_KEY}"}}"#);
            let tx = client.transaction().await.unwrap();
            let probe = TxnProbe::start(&tx).await;
            emit_message(&tx, true, MESSAGE_PREFIX, &content).await;
            tx.commit().await.unwrap();
            Written {
                id,
                payload: None,
                content: Some(content),
                point: probe.finish(client).await,
            }
        }
    }
}

fn check_goods(goods: &[Written], records: &[Received]) {
    let ids: Vec<String> = records.iter().filter(|r| r.topic == "order").map(id_of).collect();
    let expected: Vec<String> = goods.iter().map(|g| g.id.clone()).collect();
    assert_eq!(
        ids, expected,
        "good events around the bad ones, once each, in commit order"
    );
    for (r, g) in records.iter().filter(|r| r.topic == "order").zip(goods) {
        assert_eq!(r.payload_str(), g.payload.as_deref(), "payload of {}", g.id);
        assert_eq!(r.key_str(), Some(GOOD_KEY));
    }
}

/// At least once, the first delivery of each event; exactly once, every record (a duplicate
/// then fails [`check_goods`]).
fn first_deliveries(mode: BadRowMode, records: Vec<Received>) -> Vec<Received> {
    if mode != BadRowMode::AtLeastOnce {
        return records;
    }
    let mut seen = HashSet::new();
    records
        .into_iter()
        .filter(|r| seen.insert((r.topic.clone(), id_of(r))))
        .collect()
}

async fn fail_case(case: BadCase) {
    let Some(kafka) = shared_kafka().await else { return };
    let (mut client, config) = bad_rows_db(&kafka, "fail").await;
    let mut relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let before = good(&mut client, 1).await;
    let bad = bad(&mut client, case).await;
    let after = good(&mut client, 2).await;
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{case:?}: the relay must stop with exit 1; log:\n{log}"
    );
    for needle in [
        format!("id={}", bad.id),
        format!("committed at {}", format_lsn(bad.point.commit_lsn)),
    ] {
        assert!(
            log.contains(&needle),
            "{case:?}: the error must name {needle:?}; log:\n{log}"
        );
    }
    assert!(
        log.contains(case.cause_fragment()),
        "{case:?}: the error must name the cause; log:\n{log}"
    );
    let confirmed = confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0);
    assert!(
        confirmed >= before.point.end_lsn && confirmed < bad.point.end_lsn,
        "{case:?}: confirmed {} must cover the event before ({}) and nothing of the bad one's transaction ({})",
        format_lsn(confirmed),
        format_lsn(before.point.end_lsn),
        format_lsn(bad.point.end_lsn)
    );
    let records = kafka.collect(&["order"], 2, Duration::from_secs(3)).await;
    check_goods(&[before], &records);
    assert!(
        !records.iter().any(|r| id_of(r) == after.id),
        "{case:?}: nothing after the bad event is published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_under_fail_stop_naming_id_lsn_and_cause() {
    let cases: Vec<_> = ALL_CASES.iter().map(|c| tokio::spawn(fail_case(*c))).collect();
    for (case, task) in ALL_CASES.iter().zip(cases) {
        if let Err(e) = task.await {
            panic!("{case:?}: {e}");
        }
    }
}

/// G0, bad1, G1, bad2, … — plus a non-transactional message with the prefix (ignored).
async fn write_every_bad_case(client: &mut Client) -> (Vec<Written>, Vec<(BadCase, Written)>) {
    let mut goods = vec![good(client, 0).await];
    let mut bads = Vec::new();
    for (i, case) in ALL_CASES.iter().enumerate() {
        bads.push((*case, bad(client, *case).await));
        goods.push(good(client, i as u32 + 1).await);
    }
    emit_message(
        &*client,
        false,
        MESSAGE_PREFIX,
        r#"{"id":"nontx","type":"order.placed","aggregate_id":"x","payload":1}"#,
    )
    .await;
    goods.push(good(client, 99).await);
    (goods, bads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_under_skip_are_logged_counted_and_passed() {
    let Some(kafka) = shared_kafka().await else { return };
    let (mut client, config) = bad_rows_db(&kafka, "skip").await;
    let listen = format!("127.0.0.1:{}", free_port());
    let config = config.set("http", "listen", listen.as_str());
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let (goods, bads) = write_every_bad_case(&mut client).await;
    let records = kafka.collect(&["order"], goods.len(), Duration::from_secs(60)).await;
    check_goods(&goods, &records);
    let last = goods.last().unwrap().point.end_lsn;
    assert!(
        confirmed_reaches(&client, &config.slot, last, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );

    let log = relay.log_text();
    for (case, w) in &bads {
        let line = log
            .lines()
            .find(|l| l.contains("skipped a bad outbox event") && l.contains(&format!("id={} ", w.id)))
            .unwrap_or_else(|| panic!("{case:?}: no WARN line for id {}; log:\n{log}", w.id));
        assert!(
            line.contains("WARN") && line.contains(&format_lsn(w.point.commit_lsn)),
            "{case:?}: {line}"
        );
        assert!(
            line.contains(case.cause_fragment()) || line.contains(&case.cause_fragment().replace('"', "\\\"")),
            "{case:?}: {line}"
        );
    }
    assert!(
        log.contains("ignored a non-transactional pg_logical_emit_message"),
        "{log}"
    );

    let metrics = http_get(&listen, "/metrics").await;
    for cause in ["null_column", "invalid_topic", "kafka_rejected", "bad_message"] {
        let expected = bads.iter().filter(|(c, _)| c.metric_cause() == cause).count() as f64;
        let got = metric_value(
            &metrics,
            "outbox_relay_bad_events_total",
            &[("policy", "skip"), ("cause", cause)],
        );
        assert_eq!(
            got,
            Some(expected),
            "outbox_relay_bad_events_total{{policy=skip,cause={cause}}}; metrics:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_events_under_dead_letter_are_published_raw_with_the_error() {
    let Some(kafka) = shared_kafka().await else { return };
    let (mut client, config) = bad_rows_db(&kafka, "dead-letter").await;
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let (goods, bads) = write_every_bad_case(&mut client).await;
    let records = kafka
        .collect(
            &["order", DEAD_LETTERS],
            goods.len() + bads.len(),
            Duration::from_secs(60),
        )
        .await;
    check_goods(&goods, &records);
    let last = goods.last().unwrap().point.end_lsn;
    assert!(
        confirmed_reaches(&client, &config.slot, last, Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );

    let letters: Vec<&Received> = records.iter().filter(|r| r.topic == DEAD_LETTERS).collect();
    assert_eq!(letters.len(), bads.len(), "one dead letter per bad event");
    for (case, w) in &bads {
        let letter = letters
            .iter()
            .find(|r| id_of(r) == w.id)
            .unwrap_or_else(|| panic!("{case:?}: no dead letter with id {}", w.id));
        let header = |name: &str| String::from_utf8_lossy(letter.header(name).unwrap_or_default()).into_owned();
        assert!(
            header("outbox-relay-error").contains(case.cause_fragment()),
            "{case:?}: {}",
            header("outbox-relay-error")
        );
        assert_eq!(header("outbox-relay-lsn"), format_lsn(w.point.commit_lsn), "{case:?}");
        let content = letter.payload_str().expect("dead letter payload is text");
        if *case == BadCase::MalformedMessage {
            assert_eq!(
                header("outbox-relay-source-table"),
                format!("pg_logical_emit_message:{MESSAGE_PREFIX}")
            );
            assert_eq!(Some(content), w.content.as_deref(), "the message content, unchanged");
            continue;
        }
        assert_eq!(
            header("outbox-relay-source-table"),
            r#""public"."bad_outbox""#,
            "{case:?}"
        );
        if *case == BadCase::TooLarge {
            assert!(
                letter.header("outbox-relay-truncated-from").is_some(),
                "oversized raw row cut to fit"
            );
            assert!(
                content.len() < MAX_MESSAGE && content.starts_with(&format!("{{\"id\":\"{}\"", w.id)),
                "{case:?}"
            );
            continue;
        }
        let row: serde_json::Value = serde_json::from_str(content).expect("the raw row is a JSON object");
        assert_eq!(row["id"], w.id.as_str(), "{case:?}: {row}");
        assert_eq!(row["payload"].as_str(), w.payload.as_deref(), "{case:?}: {row}");
        let nulls: Vec<&str> = ["aggregate_id", "type", "payload"]
            .into_iter()
            .filter(|c| row[*c].is_null())
            .collect();
        let expected_null: &[&str] = match case {
            BadCase::NullRoute => &["type"],
            BadCase::NullKey => &["aggregate_id"],
            BadCase::NullPayload => &["payload"],
            _ => &[],
        };
        assert_eq!(nulls, expected_null, "{case:?}: {row}");
        assert!(row["created_at"].is_string(), "every column is in the raw row: {row}");
    }
}

// ------------------------------------------------------------------------------------------
// Broker-side refusals: suspects are isolated before the policy applies
// ------------------------------------------------------------------------------------------

/// The broker refuses the bad event's produce request twice (the first time as it would refuse
/// a whole batch, the second time when the relay sends it alone): then the policy applies.
async fn broker_refusal(policy: &str) {
    // Mock cluster: the broker's refusal is injected, twice in a row, by the mock alone.
    let mock = MockKafka::new(1);
    mock.create_topic("order", 1);
    let kafka = KafkaNs::plain(&mock.bootstrap_servers());
    let (mut client, config, mut relay, before) = streaming_after_one_good(&kafka, policy, 1).await;
    mock.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 2],
        )
    });
    let bad = good(&mut client, 2).await;
    // Only after the verdict: an event written earlier could share the refused request and
    // take the second injected error in the suspect's place.
    let verdict = relay
        .wait_for_log("refused the suspect event again", Duration::from_secs(30))
        .await;
    assert!(verdict, "{}", relay.log_text());
    let after = good(&mut client, 3).await;
    refusal_outcome(
        policy,
        &mut relay,
        &client,
        &config,
        &kafka,
        [before, bad, after],
        "sending alone",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_refused_record_goes_through_every_policy() {
    for_every_policy(broker_refusal).await;
}

/// `bad_rows_db` under `policy` with its relay streaming and good event `n` delivered and
/// confirmed, so whatever the test injects next meets a warm producer.
async fn streaming_after_one_good(
    kafka: &KafkaNs,
    policy: &str,
    n: u32,
) -> (Client, RelayConfig, RelayProcess, Written) {
    streaming_after_one_good_in(kafka, policy, n, BadRowMode::AtLeastOnce).await
}

async fn streaming_after_one_good_in(
    kafka: &KafkaNs,
    policy: &str,
    n: u32,
    mode: BadRowMode,
) -> (Client, RelayConfig, RelayProcess, Written) {
    let (mut client, config) = bad_rows_db_in(kafka, policy, mode).await;
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let first = good(&mut client, n).await;
    kafka.collect(&["order"], 1, Duration::from_secs(30)).await;
    assert!(confirmed_reaches(&client, &config.slot, first.point.end_lsn, Duration::from_secs(15)).await);
    (client, config, relay, first)
}

/// `scenario` under each `relay.on_bad_event` policy, all at once; a failure names the policy.
async fn for_every_policy<F, Fut>(scenario: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = ["fail", "skip", "dead-letter"]
        .into_iter()
        .map(|p| (p, tokio::spawn(scenario(p))))
        .collect();
    for (policy, task) in tasks {
        if let Err(e) = task.await {
            panic!("policy {policy}: {e}");
        }
    }
}

/// What each policy must show once the broker refused `bad` for good (written between `before`
/// and `after`): `fail` exits 1 naming it and `fail_says`, confirming nothing of it; `skip`
/// goes on naming it; `dead-letter` publishes the raw row, the error in a header; both confirm
/// `after`. At least once, `after` may be published twice when it was written early enough to
/// be stored before the session that met the refusal ended (its replay publishes it again):
/// then only its first delivery is checked.
async fn refusal_outcome(
    policy: &str,
    relay: &mut RelayProcess,
    client: &Client,
    config: &RelayConfig,
    kafka: &KafkaNs,
    [before, bad, after]: [Written; 3],
    fail_says: &str,
) {
    let mode = BadRowMode::of(config);
    let topics = ["order", DEAD_LETTERS];
    match policy {
        "fail" => {
            let status = relay.wait_exit(Duration::from_secs(60)).await;
            let log = relay.log_text();
            assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
            assert!(
                log.contains(&format!("id={}", bad.id)) && log.contains(fail_says),
                "the error names the event and {fail_says:?}: {log}"
            );
            assert!(confirmed_flush_lsn(client, &config.slot).await.unwrap_or(0) < bad.point.end_lsn);
            let records = kafka.collect(&topics, 3, Duration::from_secs(3)).await;
            check_goods(&[before], &records);
        }
        "skip" => {
            let records = first_deliveries(mode, kafka.collect(&topics, 2, Duration::from_secs(60)).await);
            check_goods(&[before, after.clone()], &records);
            let log = relay.log_text();
            assert!(
                log.lines()
                    .any(|l| l.contains("skipped a bad outbox event") && l.contains(&format!("id={} ", bad.id))),
                "{log}"
            );
        }
        _ => {
            let records = first_deliveries(mode, kafka.collect(&topics, 3, Duration::from_secs(60)).await);
            check_goods(&[before, after.clone()], &records);
            let letter = records.iter().find(|r| r.topic == DEAD_LETTERS).expect("a dead letter");
            assert_eq!(id_of(letter), bad.id);
            // The dead-letter topic takes the raw row whole.
            let row: serde_json::Value = serde_json::from_slice(letter.payload.as_deref().unwrap()).unwrap();
            assert_eq!(row["payload"].as_str(), bad.payload.as_deref());
            let error = String::from_utf8_lossy(letter.header("outbox-relay-error").unwrap_or_default()).into_owned();
            // Both scenarios refuse the record for its size.
            assert!(
                error.to_lowercase().contains("too large"),
                "the dead letter says why: {error}"
            );
        }
    }
    if policy != "fail" {
        assert!(confirmed_reaches(client, &config.slot, after.point.end_lsn, Duration::from_secs(30)).await);
    }
}

/// The topic's own limit: topic `order` made with `max.message.bytes = 20000` (real clusters set
/// it per topic, below the client's `message.max.bytes`), and one event above it. The relay has
/// read the topic's limit and refuses the record before it is sent (the broker would answer
/// MESSAGE_TOO_LARGE only after the partition's next batch went out), and the policy applies:
/// `fail` stops naming the event with nothing after it published or confirmed, `skip` goes on,
/// `dead-letter` publishes the raw row (cut to fit) to the dead-letter topic. Failed 1 run in
/// about 10 before the local check (the event after it stored ahead of the refusal).
async fn topic_limit_refusal(policy: &str) {
    topic_limit_refusal_in(policy, BadRowMode::AtLeastOnce).await
}

async fn topic_limit_refusal_in_transactions(policy: &str) {
    topic_limit_refusal_in(policy, BadRowMode::KafkaTransactions).await
}

/// Topic `order`'s `max.message.bytes`, below the client's `message.max.bytes` (MAX_MESSAGE).
const TOPIC_LIMIT: usize = 20_000;

/// The shared Kafka with topic `order` made (one partition) with `max.message.bytes` =
/// [`TOPIC_LIMIT`].
async fn kafka_with_a_limited_order_topic() -> Option<KafkaNs> {
    kafka_with_an_order_topic(&[("max.message.bytes", &TOPIC_LIMIT.to_string())]).await
}

/// The shared Kafka with topic `order` made (one partition) with the topic configuration `configs`.
async fn kafka_with_an_order_topic(configs: &[(&str, &str)]) -> Option<KafkaNs> {
    let kafka = shared_kafka().await?;
    let cluster = crate::harness::kafka_real::shared_cluster()
        .await
        .expect("shared Kafka");
    cluster.create_topic_with(&kafka.topic("order"), 1, configs).await;
    Some(kafka)
}

async fn topic_limit_refusal_in(policy: &str, mode: BadRowMode) {
    let Some(kafka) = kafka_with_a_limited_order_topic().await else {
        return;
    };
    let (mut client, config, mut relay, before) = streaming_after_one_good_in(&kafka, policy, 1, mode).await;
    // Above the topic's limit, well below the client's (MAX_MESSAGE): only the topic's limit refuses it.
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(TOPIC_LIMIT + 5_000));
    let bad = insert_row(&mut client, Some(GOOD_KEY), Some("order.placed"), Some(&big)).await;
    let after = good(&mut client, 3).await;
    refusal_outcome(
        policy,
        &mut relay,
        &client,
        &config,
        &kafka,
        [before, bad, after],
        "too large",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn record_above_the_topics_max_message_bytes_goes_through_every_policy() {
    for_every_policy(topic_limit_refusal).await;
}

/// The relay's own size check (`sink/kafka/topic_limit.rs`) draws the line where the broker
/// does. Payloads one byte apart, from well under to just over topic `order`'s
/// `max.message.bytes`, under `skip` (with `batch.size` at the topic's limit, as the relay's
/// warning advises): every record the broker would refuse is refused before it is sent — no
/// suspect, nothing sent alone, events in commit order — and none it would take: the largest
/// delivered record, one byte longer, produced straight to the topic, is refused by the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relays_size_check_draws_the_line_where_the_broker_does() {
    const ROWS: usize = 400;
    let Some(kafka) = kafka_with_a_limited_order_topic().await else {
        return;
    };
    let limit = TOPIC_LIMIT.to_string();
    let (mut client, config) = bad_rows_db_in(&kafka, "skip", BadRowMode::AtLeastOnce).await;
    let config = config.kafka("batch.size", &limit);
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    // Payload `{"blob": "x…"}`: 12 bytes and n x's, n one apart across the limit.
    let first_n = (TOPIC_LIMIT - ROWS) as i32;
    client
        .execute(
            "INSERT INTO bad_outbox (aggregate_id, type, payload)
             SELECT $1, 'order.placed', jsonb_build_object('blob', repeat('x', n))
             FROM generate_series($2::int, $3::int) AS n ORDER BY n",
            &[&GOOD_KEY, &first_n, &(TOPIC_LIMIT as i32)],
        )
        .await
        .unwrap();
    let after = good(&mut client, 1).await;
    let log = || relay.log_text();
    assert!(
        confirmed_reaches(&client, &config.slot, after.point.end_lsn, Duration::from_secs(60)).await,
        "{}",
        log()
    );
    let records = kafka.collect(&["order"], 1, Duration::from_secs(30)).await;
    let blobs: Vec<usize> = records
        .iter()
        .filter_map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.payload.as_deref()?).ok()?;
            Some(v["blob"].as_str()?.len())
        })
        .collect();
    let skipped = log()
        .lines()
        .filter(|l| l.contains("skipped a bad outbox event") && l.contains("too large for topic"))
        .count();
    // Every row is delivered once or skipped, delivered ones in commit order, then the last good one.
    assert_eq!(blobs.len() + skipped, ROWS + 1, "{}", log());
    let expected: Vec<usize> = (first_n as usize..first_n as usize + blobs.len()).collect();
    assert_eq!(blobs, expected, "the rows under the line, in commit order");
    assert!(
        skipped > 0 && !blobs.is_empty(),
        "the line falls inside the rows: {}",
        log()
    );
    assert_eq!(records.last().map(id_of), Some(after.id.clone()));
    assert!(
        !log().contains("sending alone") && !log().contains("refused earlier"),
        "the broker refused what the relay let through:\n{}",
        log()
    );
    // The largest delivered record, one byte longer, straight to the broker: refused.
    let largest = records
        .iter()
        .rev()
        .find(|r| r.topic == "order" && id_of(r) != after.id)
        .expect("a row");
    // `{"blob": "x…x"}` with one more x before its closing `"}`.
    let mut payload = largest.payload.clone().expect("a payload");
    assert!(payload.ends_with(b"x\"}"), "{:?}", largest.payload_str());
    payload.insert(payload.len() - 2, b'x');
    let headers: Vec<(&str, &[u8])> = largest
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let refused = crate::harness::consumer::try_produce(
        &kafka.bootstrap_servers(),
        &kafka.topic("order"),
        largest.key.as_deref(),
        &payload,
        &headers,
    )
    .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("too large") || e.contains("TooLarge")),
        "the broker took a record one byte over what the relay sent: {refused:?}"
    );
    assert!(!log().contains("below the producer's batch limit"), "{}", log());
}

/// A refusal only the broker makes, dead-lettered on a real cluster: topic `order` takes
/// records stamped at most an hour before it stores them (`message.timestamp.before.max.ms`),
/// the relay stamps each record with its row's `created_at` (`outbox.timestamp_column`), and
/// one row is two days old. The broker refuses it (INVALID_TIMESTAMP), again when it is sent
/// alone, and its dead letter is the dead-letter topic's first record of that session's
/// producer, which waits for what the topic takes (`sink/kafka/topic_limit.rs`). The dead
/// letter goes out once and the stream goes on; before, that wait was taken for a failure, the
/// session replayed, and each new producer met the same wait: the relay never got past the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_only_the_broker_refuses_is_dead_lettered_once_on_a_real_cluster() {
    let Some(kafka) = kafka_with_an_order_topic(&[("message.timestamp.before.max.ms", "3600000")]).await else {
        return;
    };
    let (mut client, config) = bad_rows_db_in(&kafka, "dead-letter", BadRowMode::AtLeastOnce).await;
    let config = config.set("outbox", "timestamp_column", "created_at");
    let mut relay = RelayProcess::run_streaming(&config).await;
    let before = good(&mut client, 1).await;
    let old = client
        .query_one(
            "INSERT INTO bad_outbox (aggregate_id, type, payload, created_at)
             VALUES ($1, 'order.placed', '{\"n\": 2}', now() - interval '2 days') RETURNING id::text",
            &[&GOOD_KEY],
        )
        .await
        .unwrap();
    let old_id: String = old.get(0);
    let after = good(&mut client, 3).await;
    let log = |relay: &RelayProcess| relay.log_text();
    assert!(
        confirmed_reaches(&client, &config.slot, after.point.end_lsn, Duration::from_secs(60)).await,
        "the stream never got past the refused row:\n{}",
        log(&relay)
    );
    let records = first_deliveries(
        BadRowMode::AtLeastOnce,
        kafka
            .collect(&["order", DEAD_LETTERS], 3, Duration::from_secs(30))
            .await,
    );
    check_goods(&[before, after], &records);
    let letters: Vec<&Received> = records.iter().filter(|r| r.topic == DEAD_LETTERS).collect();
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(id_of(letters[0]), old_id);
    let error = String::from_utf8_lossy(letters[0].header("outbox-relay-error").unwrap_or_default()).into_owned();
    assert!(
        error.to_lowercase().contains("timestamp"),
        "the dead letter says why: {error}"
    );
    let text = log(&relay);
    assert!(!text.contains("no room"), "{text}");
    assert!(
        text.matches("streaming started").count() <= 2,
        "one replay (to send the suspect alone), no more:\n{text}"
    );
    relay.sigterm();
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
}

/// The same refusal inside a Kafka transaction: refused before it is sent, it leaves the
/// transaction able to commit, and the policy applies in it (records read `read_committed`).
/// A refusal only the broker makes (`broker_refused_record_goes_through_every_policy`'s) is
/// condemned, its transaction aborted and replayed instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn record_above_the_topics_max_message_bytes_under_kafka_transactions_goes_through_every_policy() {
    for_every_policy(topic_limit_refusal_in_transactions).await;
}

/// One refusal of a whole batch: every event in it is a suspect, each is sent alone, each is
/// accepted — none is skipped although the policy is `skip`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn innocent_batch_mates_of_a_refused_batch_are_delivered() {
    // Mock cluster: one refusal of a whole batch, injected by the mock alone.
    let mock = MockKafka::new(1);
    mock.create_topic("order", 1);
    let kafka = KafkaNs::plain(&mock.bootstrap_servers());
    let (mut client, _config, relay, _warm) = streaming_after_one_good(&kafka, "skip", 0).await;
    mock.with_cluster(|c| {
        c.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD],
        )
    });
    let tx = client.transaction().await.unwrap();
    let mut batch = Vec::new();
    for n in 1..=5 {
        let row = tx
            .query_one(
                "INSERT INTO bad_outbox (aggregate_id, type, payload) VALUES ($1, 'order.placed', $2::text::jsonb)
                 RETURNING id::text, payload::text",
                &[&GOOD_KEY, &format!("{{\"n\": {n}}}")],
            )
            .await
            .unwrap();
        batch.push(Written {
            id: row.get(0),
            payload: row.get(1),
            content: None,
            point: CommitPoint {
                commit_lsn: 0,
                end_lsn: 0,
            },
        });
    }
    tx.commit().await.unwrap();
    let records = kafka.collect(&["order"], 6, Duration::from_secs(30)).await;
    let ids: HashSet<String> = records.iter().map(id_of).collect();
    for w in &batch {
        assert!(
            ids.contains(&w.id),
            "innocent event {} was lost; log:\n{}",
            w.id,
            relay.log_text()
        );
    }
    let log = relay.log_text();
    assert!(log.contains("accepted the suspect event on its own"), "{log}");
    assert!(
        !log.contains("skipped a bad outbox event"),
        "an innocent batch-mate was skipped:\n{log}"
    );
}
