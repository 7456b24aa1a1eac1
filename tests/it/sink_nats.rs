//! End to end with the NATS JetStream sink: real PostgreSQL → `outbox-relay run` (a child
//! process, `[sink] kind = "nats"`) → NATS (the shared server at 127.0.0.1:4222, or a server of
//! the test's own where the test stops it) → the stream read back by sequence.
//!
//! Every test has its own stream and subject prefix; every wait is bounded.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::nats::{NatsServer, NatsStream, SHARED_NATS};
use crate::harness::process::send_signal;
use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// A database (schema A, `setup` done) and a relay config publishing to `stream`: subject
/// `<prefix>.<first token of type>` (`order.placed` → `<prefix>.order`).
async fn nats_db(stream: &NatsStream) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared_on(shared_cluster().await, "nats", OutboxSchema::A, "127.0.0.1:1").await;
    let config = config
        .sink("nats", &stream.section())
        .route(PREFIX_REGEX, &format!("{}.${{routedByValue}}", stream.prefix));
    (db, client, config)
}

fn subject_of(stream: &NatsStream) -> impl Fn(&ExpectedEvent) -> String + '_ {
    move |_| format!("{}.order", stream.prefix)
}

fn all(committed: &Committed) -> Vec<ExpectedEvent> {
    committed.all().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_workload_lands_routed_keyed_with_headers_in_order() {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (db, _client, config) = nats_db(&stream).await;
    let relay = RelayProcess::run(&config);
    let url = shared_cluster().await.url(&db);
    let started = Instant::now();
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 5_000, 50, 4)).await;
    let expected = all(&committed);
    let records = stream.collect(expected.len(), Duration::from_secs(120)).await;
    eprintln!(
        "nats workload: {} events, {} received in {:?}",
        expected.len(),
        records.len(),
        started.elapsed()
    );
    let dups = check_delivered(&expected, &records, subject_of(&stream));
    assert_eq!(dups, 0, "a clean run delivers exactly once");
    check_order(&committed, &records);
    assert!(
        records
            .iter()
            .all(|r| r.timestamp_ms.is_some_and(|t| t > 1_600_000_000_000)),
        "created_at → timestamp header"
    );
    assert!(relay.sigterm());
    stream.delete().await;
}

/// Writes `n` transactions from 4 tasks, spread over about `spread`.
fn background_workload(url: String, n: usize, spread: Duration) -> tokio::task::JoinHandle<Committed> {
    let mut w = Workload::new(OutboxSchema::A, n, 40, 4);
    w.pause = spread / (n as u32 / 4).max(1);
    tokio::spawn(async move { run_workload(&url, &w).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_kill_9_under_load_loses_nothing() {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (db, _client, config) = nats_db(&stream).await;
    let config = config
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    let url = shared_cluster().await.url(&db);
    let writer = background_workload(url, 4_000, Duration::from_secs(8));
    let mut kills = 0;
    while !writer.is_finished() && kills < 5 {
        let mut relay = RelayProcess::run(&config);
        assert!(
            relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
            "{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert!(relay.sigkill());
        relay
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("killed relay exits");
        kills += 1;
    }
    let committed = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("workload in time")
        .unwrap();
    let relay = RelayProcess::run(&config);
    let expected = all(&committed);
    let records = stream.collect(expected.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&expected, &records, subject_of(&stream));
    check_order(&committed, &records);
    eprintln!(
        "nats kill -9: {} events, {kills} SIGKILLs, 0 lost, {dups} duplicates",
        expected.len()
    );
    assert!(relay.sigterm());
    stream.delete().await;
}

/// The broker stopped for ~30 s under load and started again: nothing lost, streaming goes
/// on. The relay runs with shipped defaults (backoff up to 30 s, ack timeout 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_broker_down_30s_loses_nothing_and_resumes() {
    let mut server = NatsServer::start().await;
    let stream = NatsStream::create(&server.url()).await;
    let (db, _client, config) = nats_db(&stream).await;
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let url = shared_cluster().await.url(&db);
    let writer = background_workload(url.clone(), 3_000, Duration::from_secs(40));
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A graceful stop (SIGTERM): a SIGKILLed nats-server may lose what it acknowledged but
    // had not written out yet (docs/sink-nats.md, "Guarantees").
    let pid = server.pid().expect("running");
    assert!(send_signal(pid, "TERM"));
    server.wait_stopped(Duration::from_secs(15)).await;
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    server.restart().await;
    eprintln!("nats outage: broker down {:?}", down.elapsed());
    let committed = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("workload in time")
        .unwrap();
    let expected = all(&committed);
    let started = Instant::now();
    let records = stream.collect(expected.len(), Duration::from_secs(180)).await;
    let dups = check_delivered(&expected, &records, subject_of(&stream));
    check_order(&committed, &records);
    eprintln!(
        "nats outage: {} events, 0 lost, {dups} duplicates, all in the stream {:?} after the workload ended",
        expected.len(),
        started.elapsed()
    );
    let log = relay.log_text();
    assert!(
        log.contains("connection to NATS lost") || log.contains("cannot reach") || log.contains("cannot connect"),
        "the outage reached the relay:\n{log}"
    );
    // Streaming goes on: one more event arrives.
    let client = shared_cluster().await.client(&db).await;
    let more = insert_event(&client, OutboxSchema::A, &new_uuid(), 0).await;
    let records = stream.collect(records.len() + 1, Duration::from_secs(60)).await;
    assert!(records.iter().any(|r| r.header("id") == Some(more.id.as_bytes())));
    assert!(relay.sigterm());
}

/// Inserts one row into events_outbox with the given type and payload; returns its id.
async fn insert_raw(client: &Client, ty: &str, payload: &str) -> String {
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($1::text::uuid, $2, $3::text::jsonb)
             RETURNING id::text",
            &[&new_uuid(), &ty, &payload],
        )
        .await
        .unwrap();
    row.get(0)
}

/// Good, then the three bad causes (a subject NATS refuses, a subject no subject of the stream
/// covers, too large), then good again; route: the type up to its last dot.
async fn bad_events_case(policy: &str) {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (_db, client, config) = nats_db(&stream).await;
    let p = &stream.prefix;
    let mut config = config
        .route(r"^(?<routedByValue>.+)\.[^.]+$", "${routedByValue}")
        .set("relay", "on_bad_event", policy)
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    if policy == "dead-letter" {
        config = config.set("relay", "dead_letter_topic", format!("{p}.dlq").as_str());
    }
    let mut relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let good = format!("{p}.order.placed");
    let first = insert_raw(&client, &good, "{\"n\": 1}").await;
    let bad_subject = insert_raw(&client, &format!("{p}.bad subject.x"), "{}").await;
    let uncovered = insert_raw(&client, "elsewhere.order.x", "{}").await;
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(1024 * 1024 + 10));
    let too_large = insert_raw(&client, &good, &big).await;
    let last = insert_raw(&client, &good, "{\"n\": 2}").await;
    let bads = [bad_subject, uncovered, too_large];
    let ids = |records: &[Received], subject: &str| -> Vec<String> {
        records
            .iter()
            .filter(|r| r.topic == subject)
            .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
            .collect()
    };
    let order = format!("{p}.order");
    match policy {
        "fail" => {
            let status = relay.wait_exit(Duration::from_secs(60)).await;
            let log = relay.log_text();
            assert_eq!(status.and_then(|s| s.code()), Some(1), "log:\n{log}");
            assert!(log.contains(&format!("id={}", bads[0])), "log:\n{log}");
            let records = stream.collect(1, Duration::from_secs(10)).await;
            assert_eq!(ids(&records, &order), vec![first], "nothing after the bad event");
        }
        "skip" => {
            let records = stream.collect(2, Duration::from_secs(60)).await;
            assert_eq!(ids(&records, &order), vec![first, last]);
            assert_eq!(records.len(), 2, "bad events are not published");
        }
        _ => {
            let records = stream.collect(5, Duration::from_secs(60)).await;
            assert_eq!(ids(&records, &order), vec![first, last]);
            let dead = ids(&records, &format!("{p}.dlq"));
            assert_eq!(dead, bads.to_vec(), "each bad event dead-lettered, in commit order");
            let log = relay.log_text();
            assert!(
                log.contains("covers"),
                "the uncovered subject's cause is logged:\n{log}"
            );
        }
    }
    if policy != "fail" {
        assert!(relay.sigterm());
    }
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_bad_events_fail() {
    bad_events_case("fail").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_bad_events_skip() {
    bad_events_case("skip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_bad_events_dead_letter() {
    bad_events_case("dead-letter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_exactly_once_20_sigkills_no_duplicates() {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (db, _client, config) = nats_db(&stream).await;
    let config = config
        .set("relay", "delivery", "exactly-once")
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    let url = shared_cluster().await.url(&db);
    let writer = background_workload(url, 4_000, Duration::from_secs(40));
    let started = Instant::now();
    let mut deduplicated = 0;
    for kill in 0..20u64 {
        let mut relay = RelayProcess::run(&config);
        assert!(
            relay.wait_for_log("streaming started", Duration::from_secs(60)).await,
            "kill {kill}: {}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300 + (kill * 137) % 700)).await;
        assert!(relay.sigkill());
        relay
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("killed relay exits");
        deduplicated += usize::from(relay.log_text().contains("as a duplicate"));
    }
    let committed = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("workload in time")
        .unwrap();
    let relay = RelayProcess::run(&config);
    let expected = all(&committed);
    let records = stream.collect(expected.len(), Duration::from_secs(120)).await;
    // Whatever arrives late still arrives: give stragglers a moment before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = if stream.messages().await as usize > records.len() {
        stream.read_all().await
    } else {
        records
    };
    let dups = check_delivered(&expected, &records, subject_of(&stream));
    check_order(&committed, &records);
    eprintln!(
        "nats exactly-once: {} events, 20 SIGKILLs, {} messages, 0 lost, {dups} duplicates, {:?}",
        expected.len(),
        records.len(),
        started.elapsed()
    );
    let final_dedup = usize::from(relay.log_text().contains("as a duplicate"));
    eprintln!(
        "nats exactly-once: {} of 21 sessions had JetStream drop a replayed duplicate",
        deduplicated + final_dedup
    );
    assert_eq!(dups, 0, "exactly-once: no duplicates");
    assert!(relay.sigterm());
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_two_relays_two_databases_one_stream() {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (db1, _c1, config1) = nats_db(&stream).await;
    let (db2, _c2, config2) = nats_db(&stream).await;
    let relay1 = RelayProcess::run(&config1);
    let relay2 = RelayProcess::run(&config2);
    let pg = shared_cluster().await;
    let (url1, url2) = (pg.url(&db1), pg.url(&db2));
    let w = Workload::new(OutboxSchema::A, 2_000, 20, 2);
    let (w1, w2) = tokio::join!(run_workload(&url1, &w), run_workload(&url2, &w));
    let records = stream.collect(4_000, Duration::from_secs(120)).await;
    // Both databases number their events from 1: tell them apart by aggregate (uuid).
    for committed in [&w1, &w2] {
        let mine: Vec<Received> = records
            .iter()
            .filter(|r| r.key_str().is_some_and(|k| committed.by_aggregate.contains_key(k)))
            .cloned()
            .collect();
        let dups = check_delivered(&all(committed), &mine, subject_of(&stream));
        assert_eq!(dups, 0);
        check_order(committed, &mine);
    }
    assert_eq!(records.len(), 4_000);
    assert!(relay1.sigterm() && relay2.sigterm());
    stream.delete().await;
}

/// `[nats] max_payload` set above the server's (1 MiB): the event passes the relay's own size
/// check, and the sink refuses it on sight from the server's real `max_payload` (the relay
/// would otherwise lose its connection: a server closes it on an oversized message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_event_over_the_servers_max_payload_is_refused_on_sight() {
    let stream = NatsStream::create(SHARED_NATS).await;
    let (_db, client, config) = nats_db(&stream).await;
    let config = config
        .set("nats", "max_payload", "4194304")
        .set("relay", "on_bad_event", "skip");
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let first = insert_raw(&client, "order.placed", "{\"n\": 1}").await;
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(1024 * 1024 + 10));
    let too_large = insert_raw(&client, "order.placed", &big).await;
    let last = insert_raw(&client, "order.placed", "{\"n\": 2}").await;
    let records = stream.collect(2, Duration::from_secs(60)).await;
    let ids: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
        .collect();
    assert_eq!(ids, vec![first, last]);
    let log = relay.log_text();
    assert!(
        log.contains(&format!("id={too_large}")) && log.contains("max_payload"),
        "the refusal names the event and the cause:\n{log}"
    );
    assert!(log.contains("larger than the server's"), "the start warning:\n{log}");
    assert!(relay.sigterm());
    stream.delete().await;
}
