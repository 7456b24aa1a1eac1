//! The examples run against the real pipeline: `place_order` (examples/support/orders.rs)
//! writes orders, the relay publishes them, and the idempotent consumer
//! (examples/support/loyalty.rs) awards loyalty points exactly once — even when every event is
//! delivered again.

#[path = "../../examples/support/loyalty.rs"]
mod loyalty;
#[path = "../../examples/support/orders.rs"]
mod orders;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio_postgres::Client;

use crate::harness::workload::new_uuid;
use crate::harness::*;
use loyalty::{Handled, StopWhen};

fn subscribed(bootstrap: &str, group: &str) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[orders::ORDER_PLACED]).expect("subscribe");
    consumer
}

async fn points(client: &Client) -> BTreeMap<String, i64> {
    client
        .query("SELECT customer_id::text, points FROM loyalty_points", &[])
        .await
        .expect("points")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Runs the example consumer until `expected` records were handled (bounded).
async fn consume(kafka: &StreamConsumer, client: &mut Client, expected: u64) -> loyalty::RunStats {
    let stop = StopWhen {
        max_records: Some(expected),
        idle: Some(Duration::from_secs(60)),
    };
    tokio::time::timeout(Duration::from_secs(120), loyalty::run(kafka, client, "loyalty", stop))
        .await
        .expect("consumer run bounded")
        .expect("consumer run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_flow_through_the_relay_to_an_idempotent_consumer_exactly_once() {
    let pg = shared_cluster().await;
    let kafka = MockKafka::new(1);
    let shop = unique_name("shop");
    let loyalty_db = unique_name("loyalty");
    pg.create_database(&shop).await;
    pg.create_database(&loyalty_db).await;
    let mut shop_client = pg.client(&shop).await;
    shop_client.batch_execute(orders::SCHEMA).await.expect("shop schema");
    let mut consumer_db = pg.client(&loyalty_db).await;
    consumer_db
        .batch_execute(loyalty::SCHEMA)
        .await
        .expect("loyalty schema");

    // The orders carry their request's traceparent; the relay forwards it to the consumer.
    let config =
        RelayConfig::new(&pg.url(&shop), &kafka.bootstrap_servers()).set("outbox", "trace_column", "traceparent");
    let out = run_cmd(&["setup"], &config).await;
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    let _relay = RelayProcess::run(&config);

    let customers: Vec<String> = (0..3).map(|_| new_uuid()).collect();
    let mut expected_points: BTreeMap<String, i64> = BTreeMap::new();
    let orders_placed = 30;
    for i in 0..orders_placed {
        let customer = &customers[i % customers.len()];
        let total_cents = 1_050 + 333 * i as i64;
        orders::place_order(
            &mut shop_client,
            &new_uuid(),
            customer,
            total_cents,
            &orders::new_traceparent(),
        )
        .await
        .expect("place order");
        *expected_points.entry(customer.clone()).or_default() += loyalty::points_for(total_cents);
    }
    let outbox_rows: i64 = shop_client
        .query_one("SELECT count(*) FROM events_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        outbox_rows, orders_placed as i64,
        "one outbox row per order, same transaction"
    );

    // First delivery: every event applied once; offsets committed after each DB commit.
    let first = subscribed(&kafka.bootstrap_servers(), "loyalty");
    let stats = consume(&first, &mut consumer_db, orders_placed as u64).await;
    assert_eq!(
        stats,
        loyalty::RunStats {
            applied: orders_placed as u64,
            duplicates: 0
        }
    );
    assert_eq!(points(&consumer_db).await, expected_points);
    drop(first);

    // Redelivery of everything (a new group starts from the beginning, as after a lost offset
    // commit or a relay replay): all duplicates, the side effect does not happen again.
    let replay = subscribed(&kafka.bootstrap_servers(), "loyalty-replay");
    let stats = consume(&replay, &mut consumer_db, orders_placed as u64).await;
    assert_eq!(
        stats,
        loyalty::RunStats {
            applied: 0,
            duplicates: orders_placed as u64
        }
    );
    assert_eq!(points(&consumer_db).await, expected_points);
    let processed: i64 = consumer_db
        .query_one("SELECT count(*) FROM processed_events WHERE consumer = 'loyalty'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(processed, orders_placed as i64);

    // The committed offsets of the first group cover everything: a restart finds nothing new.
    let restarted = subscribed(&kafka.bootstrap_servers(), "loyalty");
    let stop = StopWhen {
        max_records: None,
        idle: Some(Duration::from_secs(6)),
    };
    let stats = loyalty::run(&restarted, &mut consumer_db, "loyalty", stop)
        .await
        .expect("restart run");
    assert_eq!(stats.handled(), 0, "offsets were committed after each event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_applies_an_event_once_per_consumer() {
    let pg = shared_cluster().await;
    let db = unique_name("loyalty");
    pg.create_database(&db).await;
    let mut client = pg.client(&db).await;
    client.batch_execute(loyalty::SCHEMA).await.expect("schema");
    let customer = new_uuid();
    let payload = serde_json::json!({ "order_id": new_uuid(), "customer_id": customer, "total_cents": 12_345 });

    let mut handle = async |consumer: &str| {
        loyalty::handle_order_placed(&mut client, consumer, "42", &payload)
            .await
            .expect("handle")
    };
    assert_eq!(handle("loyalty").await, Handled::Applied);
    assert_eq!(handle("loyalty").await, Handled::Duplicate);
    // Deduplication is per consumer: another consumer of the same event does its own work.
    assert_eq!(handle("audit").await, Handled::Applied);

    // The consumer's span continues the record's trace: same trace id, its own span id.
    let parent = orders::new_traceparent();
    let (child, parent_id) = loyalty::continue_trace(parent.as_bytes()).expect("a valid traceparent");
    assert_eq!(
        (&child[..36], &child[52..]),
        (&parent[..36], &parent[52..]),
        "{parent} → {child}"
    );
    assert_eq!(parent_id, parent[36..52]);
    assert_ne!(child[36..52], parent[36..52]);
    assert!(loyalty::continue_trace(b"ff-zz").is_none());
    assert!(loyalty::continue_trace(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    assert_eq!(points(&client).await.get(&customer), Some(&(2 * 123)));

    let bad = serde_json::json!({ "order_id": "x" });
    let err = loyalty::handle_order_placed(&mut client, "loyalty", "43", &bad)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no customer_id"), "{err}");
}
