//! End-to-end with the RabbitMQ sink: real PostgreSQL → `outbox-relay run` → RabbitMQ
//! (127.0.0.1:5672) → a queue bound to the test's own exchange. Each test declares a unique
//! durable topic exchange and queue and deletes them at the end. The broker outage is a TCP proxy
//! that cuts every connection for 30 s (the shared broker is never stopped).

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::rabbitmq::{AmqpProxy, PrivateRabbit, RabbitFixture, RABBITMQ_ADDR, RABBITMQ_URL};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// A database with schema A and `setup` done, and a config publishing to `fixture`'s exchange
/// through `url`. Routing key = the event type (`order.placed`, …).
async fn rabbit_db(fixture: &RabbitFixture, url: &str) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared_on(shared_cluster().await, "rmq", OutboxSchema::A, "127.0.0.1:1").await;
    let config = config.sink("rabbitmq", &[("url", url), ("exchange", &fixture.exchange)]);
    (db, client, config)
}

fn id_of(r: &Received) -> String {
    String::from_utf8_lossy(r.header("id").expect("id header")).into_owned()
}

/// The ids in arrival order, each at its first arrival. A record of the bad event's aggregate
/// handed over before the relay saw the refusal may be stored and then replayed (at least
/// once: a duplicate, after its first delivery).
fn firsts<'a>(records: impl Iterator<Item = &'a Received>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    records.map(id_of).filter(|id| seen.insert(id.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_workload_arrives_routed_with_keys_headers_and_order() {
    let fx = RabbitFixture::new(&["#"]).await;
    let (db, _client, config) = rabbit_db(&fx, RABBITMQ_URL).await;
    // Shipped defaults everywhere but the sink section.
    let mut relay = RelayProcess::run_streaming(&config).await;
    let started = Instant::now();
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::A, 2_000, 40, 4),
    )
    .await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = fx.collect(all.len(), Duration::from_secs(120)).await;
    eprintln!(
        "rabbitmq workload: {} events committed, {} received in {:?}",
        all.len(),
        records.len(),
        started.elapsed()
    );
    let dups = check_delivered(&all, &records, |e| e.event_type.clone());
    assert_eq!(dups, 0, "a clean run delivers exactly once");
    check_order(&committed, &records);
    for r in &records {
        assert_eq!(r.header("message_id"), r.header("id"), "message_id = event id");
        assert_eq!(r.header("delivery_mode"), Some(&b"2"[..]), "persistent");
        assert!(
            r.timestamp_ms.is_some_and(|t| t > 1_600_000_000_000),
            "created_at → timestamp"
        );
    }
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", relay.log_text());
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_kill_9_under_load_loses_nothing() {
    let fx = RabbitFixture::new(&["#"]).await;
    let (db, _client, config) = rabbit_db(&fx, RABBITMQ_URL).await;
    let config =
        config
            .set("relay", "reconnect_backoff_initial_ms", 100)
            .set("relay", "reconnect_backoff_max_ms", 1000);
    let relay = RelayProcess::run_streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, 3_000, 30, 4);
    w.pause = Duration::from_millis(2);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    // Kill once some events went through, with the rest still being written.
    let early = fx.collect(300, Duration::from_secs(60)).await;
    assert!(early.len() >= 300, "only {} arrived before the kill", early.len());
    assert!(relay.sigkill());
    drop(relay);
    let mut relay = RelayProcess::run_streaming(&config).await;
    let committed = tokio::time::timeout(Duration::from_secs(120), load)
        .await
        .expect("workload in time")
        .unwrap();
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = fx.collect(all.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&all, &records, |e| e.event_type.clone());
    check_order(&committed, &records);
    eprintln!(
        "rabbitmq kill -9: {} committed, {} received, 0 lost, {dups} duplicates",
        all.len(),
        records.len()
    );
    assert!(relay.sigterm());
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_broker_outage_of_30s_loses_nothing_and_streaming_resumes() {
    let fx = RabbitFixture::new(&["#"]).await;
    let proxy = AmqpProxy::start(RABBITMQ_ADDR).await;
    let (db, _client, config) = rabbit_db(&fx, &proxy.url()).await;
    // Shipped defaults (reconnect backoff 500 ms doubling to 30 s).
    let mut relay = RelayProcess::run_streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let before = run_workload(&url, &Workload::new(OutboxSchema::A, 500, 10, 2)).await;
    let n_before = before.len();
    assert!(fx.collect(n_before, Duration::from_secs(60)).await.len() >= n_before);

    // The outage: every connection dropped, new ones closed at once, for 30 s, while events
    // keep being committed.
    proxy.cut();
    let cut_at = Instant::now();
    let mut w = Workload::new(OutboxSchema::A, 500, 10, 2);
    w.pause = Duration::from_millis(40);
    let during = run_workload(&url, &w).await;
    let sent_while_down = fx.collect(usize::MAX, Duration::from_millis(200)).await.len() - n_before;
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(cut_at.elapsed())).await;
    proxy.restore();
    let restored = Instant::now();

    let after = run_workload(&url, &Workload::new(OutboxSchema::A, 200, 10, 2)).await;
    let mut committed = before;
    for part in [during, after] {
        for (agg, events) in part.by_aggregate {
            committed.by_aggregate.entry(agg).or_default().extend(events);
        }
    }
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    // Backoff may be at its 30 s ceiling when the broker comes back.
    let records = fx.collect(all.len(), Duration::from_secs(90)).await;
    let resumed_after = restored.elapsed();
    let dups = check_delivered(&all, &records, |e| e.event_type.clone());
    check_order(&committed, &records);
    eprintln!(
        "rabbitmq outage: {} committed, {} received ({sent_while_down} during the outage), 0 lost, {dups} \
         duplicates, all delivered {resumed_after:?} after the broker came back",
        all.len(),
        records.len()
    );
    assert_eq!(sent_while_down, 0, "nothing can arrive through a cut proxy");
    assert!(
        relay.try_exit_status().is_none(),
        "the relay keeps running through an outage"
    );
    assert!(relay.sigterm());
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
    drop(proxy);
    fx.clean().await;
}

const DEAD_LETTERS: &str = "outbox.dead-letters";

async fn insert(client: &Client, ty: &str, n: u32) -> String {
    client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload)
             VALUES ('6d1e3c52-2f4c-4a8e-9a51-3f1f1d2d0c11', $1, $2::text::jsonb) RETURNING id::text",
            &[&ty, &format!("{{\"n\": {n}}}")],
        )
        .await
        .unwrap()
        .get(0)
}

/// An unroutable routing key (no queue bound for it) and one over 255 bytes.
fn bad_types() -> Vec<String> {
    vec!["nobody.listens".into(), format!("order.{}", "x".repeat(300))]
}

/// good, then each of `bad_types` followed by a good one, all of one aggregate.
async fn bad_event_case(policy: &str, bad_types: &[String]) -> (RabbitFixture, RelayProcess, Vec<String>, Vec<String>) {
    let fx = RabbitFixture::new(&["order.#", DEAD_LETTERS]).await;
    let (_db, client, mut config) = rabbit_db(&fx, RABBITMQ_URL).await;
    config = config
        .set("relay", "on_bad_event", policy)
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    if policy == "dead-letter" {
        config = config.set("relay", "dead_letter_topic", DEAD_LETTERS);
    }
    let relay = RelayProcess::run_streaming(&config).await;
    let mut goods = vec![insert(&client, "order.placed", 0).await];
    let mut bads = Vec::new();
    for (i, ty) in bad_types.iter().enumerate() {
        bads.push(insert(&client, ty, 2 * i as u32 + 1).await);
        goods.push(insert(&client, "order.paid", 2 * i as u32 + 2).await);
    }
    (fx, relay, goods, bads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_bad_events_are_skipped_under_skip() {
    let (fx, mut relay, goods, _bads) = bad_event_case("skip", &bad_types()).await;
    let records = fx.collect(goods.len(), Duration::from_secs(60)).await;
    assert_eq!(
        firsts(records.iter()),
        goods,
        "the good events in order; no bad one\n{}",
        relay.log_text()
    );
    assert!(relay.log_text().contains("unroutable"), "{}", relay.log_text());
    assert!(relay.sigterm());
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_bad_events_go_to_the_dead_letter_routing_key() {
    let (fx, mut relay, goods, bads) = bad_event_case("dead-letter", &bad_types()).await;
    let records = fx.collect(goods.len() + bads.len(), Duration::from_secs(60)).await;
    let good_ids: Vec<String> = records.iter().filter(|r| r.topic != DEAD_LETTERS).map(id_of).collect();
    assert_eq!(good_ids, goods, "{}", relay.log_text());
    let mut dead = firsts(records.iter().filter(|r| r.topic == DEAD_LETTERS));
    dead.sort();
    let mut expected = bads.clone();
    expected.sort();
    assert_eq!(dead, expected, "a dead letter for each bad event\n{}", relay.log_text());
    assert!(relay.sigterm());
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_bad_events_stop_the_relay_under_fail() {
    for (ty, cause) in bad_types().into_iter().zip(["unroutable", "at most 255"]) {
        fail_case(ty, cause).await;
    }
}

async fn fail_case(bad_type: String, cause: &str) {
    let (fx, mut relay, goods, bads) = bad_event_case("fail", &[bad_type]).await;
    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains(cause) && log.contains(&format!("id={}", bads[0])), "{log}");
    let records = fx.collect(1, Duration::from_secs(3)).await;
    let ids: Vec<String> = records.iter().map(id_of).collect();
    assert_eq!(ids, goods[..1].to_vec(), "nothing after the bad event");
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_exactly_once_is_refused_at_start_with_the_reason() {
    let fx = RabbitFixture::new(&["#"]).await;
    let (_db, _client, config) = rabbit_db(&fx, RABBITMQ_URL).await;
    let config = config.set("relay", "delivery", "exactly-once");
    let mut relay = RelayProcess::run(&config);
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay refuses to start");
    let log = relay.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("deduplication") && log.contains("at-least-once"), "{log}");
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_two_relays_on_two_databases_share_one_exchange() {
    let fx = RabbitFixture::new(&["#"]).await;
    let (db1, _c1, config1) = rabbit_db(&fx, RABBITMQ_URL).await;
    let (db2, _c2, config2) = rabbit_db(&fx, RABBITMQ_URL).await;
    let mut r1 = RelayProcess::run_streaming(&config1).await;
    let mut r2 = RelayProcess::run_streaming(&config2).await;
    let pg = shared_cluster().await;
    let (u1, u2) = (pg.url(&db1), pg.url(&db2));
    let w = Workload::new(OutboxSchema::A, 1_000, 20, 2);
    let (a, b) = tokio::join!(run_workload(&u1, &w), run_workload(&u2, &w));
    let total = a.len() + b.len();
    assert_eq!(total, 2_000);
    let records = fx.collect(total, Duration::from_secs(120)).await;
    // Event ids are per database (bigserial): check each relay's records on their own, told
    // apart by their aggregate keys (uuids).
    let mut dups = 0;
    for committed in [&a, &b] {
        let mine: Vec<Received> = records
            .iter()
            .filter(|r| r.key_str().is_some_and(|k| committed.by_aggregate.contains_key(k)))
            .cloned()
            .collect();
        let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
        dups += check_delivered(&all, &mine, |e| e.event_type.clone());
        check_order(committed, &mine);
    }
    assert_eq!(records.len(), total + dups, "nothing but the two databases' events");
    eprintln!(
        "rabbitmq two relays: {total} committed, {} received, 0 lost, {dups} duplicates",
        records.len()
    );
    for r in [&mut r1, &mut r2] {
        assert!(r.sigterm());
        let _ = r.wait_exit(Duration::from_secs(30)).await;
    }
    fx.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_broker_stopped_30s_and_restarted_loses_nothing() {
    // A node of this test's own: stopping the shared broker would break the other tests.
    let Some(mut node) = PrivateRabbit::start().await else {
        return;
    };
    let url = node.url();
    let mut fx = RabbitFixture::new_at(&url, &["#"]).await;
    let (db, _client, config) = rabbit_db(&fx, &url).await;
    // Shorter backoff than shipped (the proxy outage test runs the defaults).
    let config =
        config
            .set("relay", "reconnect_backoff_initial_ms", 200)
            .set("relay", "reconnect_backoff_max_ms", 2000);
    let mut relay = RelayProcess::run_streaming(&config).await;
    let pg = shared_cluster().await.url(&db);
    let before = run_workload(&pg, &Workload::new(OutboxSchema::A, 500, 10, 2)).await;
    // Left in the queue across the restart: persistent messages in a durable queue survive it.
    assert!(
        wait_until(Duration::from_secs(60), Duration::from_millis(200), || async {
            fx.count().await >= 500
        })
        .await,
        "{}",
        relay.log_text()
    );
    node.stop().await;
    let stopped = Instant::now();
    let mut w = Workload::new(OutboxSchema::A, 300, 10, 2);
    w.pause = Duration::from_millis(40);
    let during = run_workload(&pg, &w).await;
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(stopped.elapsed())).await;
    node.boot().await;
    let restarted = Instant::now();
    fx.reconnect(&url).await;
    let after = run_workload(&pg, &Workload::new(OutboxSchema::A, 200, 10, 2)).await;
    let mut committed = before;
    for part in [during, after] {
        for (agg, events) in part.by_aggregate {
            committed.by_aggregate.entry(agg).or_default().extend(events);
        }
    }
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = fx.collect(all.len(), Duration::from_secs(90)).await;
    let delivered_after = restarted.elapsed();
    let dups = check_delivered(&all, &records, |e| e.event_type.clone());
    check_order(&committed, &records);
    eprintln!(
        "rabbitmq broker restart: {} committed, {} received, 0 lost, {dups} duplicates, all delivered {:?} after \
         the broker restarted",
        all.len(),
        records.len(),
        delivered_after
    );
    assert!(
        relay.try_exit_status().is_none(),
        "the relay keeps running through an outage"
    );
    assert!(relay.sigterm());
    let _ = relay.wait_exit(Duration::from_secs(30)).await;
    fx.clean().await;
    node.stop().await;
}

/// Issue 36, point 3: a wrong password reaches the operator once, in the relay's words — lapin's
/// own `io_loop: Connection closed …` and `Connection error …` lines are DEBUG now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_wrong_password_is_said_once_in_the_relays_words() {
    let fx = RabbitFixture::new(&["#"]).await;
    let wrong = "amqp://guest:not-the-password@127.0.0.1:5672/%2f";
    let (_db, _client, config) = rabbit_db(&fx, wrong).await;
    for args in [&["setup"][..], &["setup", "--check"], &["run"]] {
        let out = run_cmd(args, &config).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("refused the login") && stderr.contains("check the user and password in rabbitmq.url"),
            "{args:?} did not say what to fix:\n{stderr}"
        );
        for client_line in ["io_loop", "Connection error", "Connection closed"] {
            assert!(
                !stderr.contains(client_line),
                "{args:?}: lapin's {client_line:?} line reached the operator:\n{stderr}"
            );
        }
        assert!(
            !stderr.contains("not-the-password"),
            "{args:?}: the password was printed:\n{stderr}"
        );
    }
    fx.clean().await;
}
