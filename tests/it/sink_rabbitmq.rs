//! What is RabbitMQ's own, end to end (`[sink] kind = "rabbitmq"`): a node of the test's own
//! stopped 30 s and started again (persistent messages in a durable queue survive it), and a
//! wrong password said once in the relay's words. Routing, keys, headers and order, kill -9
//! under load, the broker cut off for 30 s, bad events under each `relay.on_bad_event`, the
//! exactly-once refusal and two relays on one exchange are the conformance suite's
//! (`tests/it/conformance.rs`, `harness/conformance/rabbitmq.rs`).

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::rabbitmq::{PrivateRabbit, RabbitFixture};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// A database with schema A and `setup` done, and a config publishing to `fixture`'s exchange
/// through `url`. Routing key = the event type (`order.placed`, …).
async fn rabbit_db(fixture: &RabbitFixture, url: &str) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared_on(shared_cluster().await, "rmq", OutboxSchema::A, "127.0.0.1:1").await;
    let config = config.sink("rabbitmq", &[("url", url), ("exchange", &fixture.exchange)]);
    (db, client, config)
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
