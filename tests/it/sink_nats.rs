//! What is NATS JetStream's own, end to end (`[sink] kind = "nats"`): `[nats] max_payload` set
//! above the server's, refused on sight from the server's real limit. Routing, keys, headers and
//! order, kill -9 under load, exactly-once across SIGKILLs, the broker stopped 30 s, bad events
//! under each `relay.on_bad_event` and two relays on one stream are the conformance suite's
//! (`tests/it/conformance.rs`, `harness/conformance/nats.rs`).
//!
//! The test has its own stream on the shared server at 127.0.0.1:4222; every wait is bounded.

use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::nats::{NatsStream, SHARED_NATS};
use crate::harness::workload::{new_uuid, OutboxSchema};
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
