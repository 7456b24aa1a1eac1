//! Backpressure against a real broker (issue 44, point 2): a single transaction larger than
//! the producer's local queue is delivered exactly once per event, in one session — a full
//! queue makes the relay wait, it never ends the session and replays the transaction whole.
//! The issue's own case runs too: shipped defaults, 200,000 rows (about 20 s).

use std::collections::HashMap;
use std::time::Duration;

use crate::harness::scrape::{with_http, Metrics};
use crate::harness::*;

/// One `INSERT … SELECT generate_series` of `events` rows over 8 aggregates, into a topic of
/// one partition (produce batches, and so delivery reports, are then as large as they get),
/// with `tune` applied to the config; checks every event arrived once, in order per aggregate,
/// in the relay's first and only session.
async fn one_large_transaction(events: i64, tune: impl FnOnce(RelayConfig) -> RelayConfig) {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    kafka.create_topic("order", 1).await;
    let (config, addr) = with_http(&tune(config.route(PREFIX_REGEX, "${routedByValue}")));
    let relay = RelayProcess::run_streaming(&config).await;
    let aggregates: Vec<String> = (0..8).map(|_| workload::new_uuid()).collect();
    let row = client
        .query_one(
            "WITH ins AS (
                INSERT INTO events_outbox (aggregate_id, type, payload)
                SELECT ($1::text[])[(1 + g % 8)::int]::uuid, 'order.placed',
                       jsonb_build_object('seq', g, 'pad', repeat('x', 64))
                  FROM generate_series(0, $2::bigint - 1) g
                RETURNING id)
             SELECT min(id), max(id) FROM ins",
            &[&aggregates, &events],
        )
        .await
        .expect("one large transaction");
    let (first, last): (i64, i64) = (row.get(0), row.get(1));
    let records = kafka
        .collect(&["order"], events as usize, Duration::from_secs(300))
        .await;
    let log = relay.log_text();
    let mut last_by_key: HashMap<String, i64> = HashMap::new();
    for r in &records {
        let id: i64 = String::from_utf8_lossy(r.header("id").expect("id header"))
            .parse()
            .expect("numeric id");
        assert!((first..=last).contains(&id), "id {id} is not of the transaction");
        let prev = last_by_key.insert(r.key_str().expect("key").to_owned(), id);
        assert!(
            prev.is_none_or(|p| p < id),
            "aggregate {:?}: {id} after {prev:?} (a replay)",
            r.key_str()
        );
    }
    assert_eq!(
        records.len() as i64,
        events,
        "each of the {events} events exactly once; the relay's log:\n{}",
        log_tail(&log)
    );
    assert!(
        !log.contains("Queue full") && !log.contains("replaying from the last confirmed LSN"),
        "the full queue ended the session:\n{}",
        log_tail(&log)
    );
    assert_eq!(
        log.matches("streaming started").count(),
        1,
        "one session, no restart:\n{}",
        log_tail(&log)
    );
    let metrics = Metrics::scrape(&addr).await.expect("/metrics");
    assert_eq!(
        metrics.sum("outbox_relay_reconnects_total"),
        0.0,
        "no session restarted"
    );
    assert_eq!(
        metrics.sum("outbox_relay_events_failed_total"),
        0.0,
        "no delivery failed"
    );
    assert_eq!(
        metrics.sum("outbox_relay_events_received_total"),
        events as f64,
        "each event handed over once (a full queue counts nothing)"
    );
    assert_eq!(
        metrics.sum("outbox_relay_events_published_total"),
        events as f64,
        "each event acknowledged once"
    );
}

fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A producer queue just above the in-flight budget, as a user may size it: before the fix
/// the records of a delivery report still counted against it while the relay sent more, the
/// producer answered `QueueFull`, and the session replayed the transaction. Now the relay waits
/// for room.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_larger_than_the_producer_queue_is_delivered_once_without_a_replay() {
    one_large_transaction(30_000, |c| {
        c.max_in_flight(1_000).kafka("queue.buffering.max.messages", "1001")
    })
    .await;
}

/// The case as found: shipped defaults (`relay.max_in_flight` 10,000, librdkafka's own
/// batching, the queue the relay sizes) and 200,000 rows in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_thousand_rows_with_the_shipped_defaults_are_delivered_once() {
    one_large_transaction(200_000, |c| c).await;
}
