//! What is Redis's own, end to end through `outbox-relay run` (docs/sink-redis.md): `rediss://`
//! URLs (TLS, the certificate checked). Routing, keys, fields and order, SIGKILLs, exactly-once
//! across SIGKILLs (with the shipped defaults too), the broker stopped 30 s and restarted, bad
//! events under each `relay.on_bad_event` and two relays on one stream are the conformance
//! suite's (`tests/it/conformance.rs`, `harness/conformance/redis.rs`).
//!
//! The test runs a `redis-server` of its own with TLS (`harness/redis.rs`); the shared Redis on
//! 127.0.0.1:6379 is never stopped.

use std::time::Duration;

use crate::harness::redis::{read_streams_until, PrivateRedis};
use crate::harness::workload::{Committed, ExpectedEvent, OutboxSchema, Workload};
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

/// Every committed event at least once (key, payload, stream), first deliveries in commit
/// order per aggregate; returns the duplicates.
fn check_all(committed: &Committed, records: &[Received], stream: &str, what: &str) -> usize {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, records, |_| stream.to_owned());
    check_order(committed, records);
    eprintln!("{what}: {} events, 0 lost, {dups} duplicates", all.len());
    dups
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
