//! The examples run against the real pipeline: `place_order` (examples/support/orders.rs)
//! writes orders, the relay publishes them, and the idempotent consumer
//! (examples/support/loyalty.rs) awards loyalty points exactly once — even when every event is
//! delivered again — and each order is one trace: the shop's `place order` span, the relay's
//! `send` span (OTLP, to the harness's receiver), the consumer's `process` span.

#[path = "../../examples/support/loyalty.rs"]
mod loyalty;
#[path = "../../examples/support/orders.rs"]
mod orders;
#[path = "../../examples/support/telemetry.rs"]
mod telemetry;

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry::trace::{SpanKind, TraceContextExt};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracer, SpanData};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio_postgres::Client;

use crate::harness::otlp::{hex, string_attr, Receiver};
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
async fn consume(kafka: &StreamConsumer, client: &mut Client, tracer: &SdkTracer, expected: u64) -> loyalty::RunStats {
    let stop = StopWhen {
        max_records: Some(expected),
        idle: Some(Duration::from_secs(60)),
    };
    tokio::time::timeout(
        Duration::from_secs(120),
        loyalty::run(kafka, client, tracer, "loyalty", stop),
    )
    .await
    .expect("consumer run bounded")
    .expect("consumer run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_flow_through_the_relay_to_an_idempotent_consumer_exactly_once() {
    let pg = shared_cluster().await;
    // A real broker of its own: the example consumer joins a real consumer group (rebalance,
    // committed offsets) on the fixed topic `order.placed`, which no namespace prefix renames.
    let Some(kafka) = KafkaCluster::start(ClusterSpec::single()).await else {
        return;
    };
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

    // The orders carry their span's traceparent; the relay's span continues it, and its header
    // names the relay's span for the consumer.
    let receiver = Receiver::start().await;
    let config = RelayConfig::new(&pg.url(&shop), &kafka.bootstrap_servers())
        .set("outbox", "trace_column", "traceparent")
        .set("tracing", "otlp_endpoint", receiver.endpoint.clone())
        .set("tracing", "scheduled_delay_ms", 100i64);
    let shop_spans = InMemorySpanExporter::default();
    let shop_telemetry = telemetry::Telemetry::with_exporter("shop", shop_spans.clone());
    let loyalty_spans = InMemorySpanExporter::default();
    let loyalty_telemetry = telemetry::Telemetry::with_exporter("loyalty", loyalty_spans.clone());
    let out = run_cmd(&["setup"], &config).await;
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    let _relay = RelayProcess::run(&config);

    let customers: Vec<String> = (0..3).map(|_| new_uuid()).collect();
    let mut expected_points: BTreeMap<String, i64> = BTreeMap::new();
    let orders_placed = 30;
    let mut placed = Vec::new();
    for i in 0..orders_placed {
        let customer = &customers[i % customers.len()];
        let total_cents = 1_050 + 333 * i as i64;
        placed.push(
            orders::place_order(
                &mut shop_client,
                &shop_telemetry.tracer,
                &new_uuid(),
                customer,
                total_cents,
            )
            .await
            .expect("place order"),
        );
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
    let stats = consume(
        &first,
        &mut consumer_db,
        &loyalty_telemetry.tracer,
        orders_placed as u64,
    )
    .await;
    assert_eq!(
        stats,
        loyalty::RunStats {
            applied: orders_placed as u64,
            duplicates: 0
        }
    );
    assert_eq!(points(&consumer_db).await, expected_points);
    drop(first);
    one_trace_per_order(&placed, &shop_spans, &receiver, &loyalty_spans).await;

    // Redelivery of everything (a new group starts from the beginning, as after a lost offset
    // commit or a relay replay): all duplicates, the side effect does not happen again.
    let replay = subscribed(&kafka.bootstrap_servers(), "loyalty-replay");
    let stats = consume(
        &replay,
        &mut consumer_db,
        &loyalty_telemetry.tracer,
        orders_placed as u64,
    )
    .await;
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
    let stats = loyalty::run(&restarted, &mut consumer_db, &loyalty_telemetry.tracer, "loyalty", stop)
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

    // A record's headers name the consumer span's parent; no or a bad traceparent: a new trace.
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cx = telemetry::remote_parent(Some(parent.as_bytes()), None);
    let remote = cx.span().span_context().clone();
    assert!(remote.is_remote() && remote.is_sampled());
    assert_eq!(
        (remote.trace_id().to_string(), remote.span_id().to_string()),
        (parent[3..35].to_owned(), parent[36..52].to_owned())
    );
    for bad in ["ff-zz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"] {
        assert!(!telemetry::remote_parent(Some(bad.as_bytes()), None)
            .span()
            .span_context()
            .is_valid());
    }
    assert_eq!(points(&client).await.get(&customer), Some(&(2 * 123)));

    let bad = serde_json::json!({ "order_id": "x" });
    let err = loyalty::handle_order_placed(&mut client, "loyalty", "43", &bad)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no customer_id"), "{err}");
}

/// The examples' OTLP export, as `OTEL_EXPORTER_OTLP_ENDPOINT` sets it up: the shop's spans
/// reach a collector (batched on the exporter's own thread) by the time it shuts down, with
/// the service's name and the ids the outbox rows carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_export_their_spans_over_otlp() {
    let pg = shared_cluster().await;
    let shop = unique_name("shopotlp");
    pg.create_database(&shop).await;
    let mut client = pg.client(&shop).await;
    client.batch_execute(orders::SCHEMA).await.expect("shop schema");
    let receiver = Receiver::start().await;
    let telemetry = telemetry::Telemetry::otlp("shop", Some(&receiver.endpoint)).expect("exporter");
    let mut placed = Vec::new();
    for _ in 0..3 {
        placed.push(
            orders::place_order(&mut client, &telemetry.tracer, &new_uuid(), &new_uuid(), 1_000)
                .await
                .expect("place order"),
        );
    }
    // Shutting down blocks until the last batch went out: off the test's runtime threads.
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .expect("shutdown");
    let spans = receiver.spans();
    assert_eq!(spans.len(), placed.len(), "{spans:#?}");
    for order in &placed {
        let traceparent = order.traceparent.as_deref().expect("a traceparent");
        let span = spans
            .iter()
            .find(|e| traceparent.contains(&hex(&e.span.span_id)))
            .unwrap_or_else(|| panic!("a span named by {traceparent}: {spans:#?}"));
        assert_eq!(span.service.as_deref(), Some("shop"));
        assert_eq!(span.span.name, "place order");
        assert_eq!(
            traceparent,
            format!("00-{}-{}-01", hex(&span.span.trace_id), hex(&span.span.span_id))
        );
        assert_eq!(
            string_attr(&span.span.attributes, "outbox.event_id").as_deref(),
            Some(order.event_id.to_string().as_str())
        );
    }
}

/// The attribute `key` of a span from the SDK, as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(s) => s.to_string(),
            other => other.to_string(),
        })
}

/// Every order is one trace: the shop's `place order` span (whose `traceparent` the outbox row
/// carried), the relay's PRODUCER span `send order.placed` its child, and the consumer's
/// CONSUMER span `process order.placed` the child of the relay's.
async fn one_trace_per_order(
    placed: &[orders::Placed],
    shop: &InMemorySpanExporter,
    relay: &Receiver,
    loyalty: &InMemorySpanExporter,
) {
    let produced = shop.get_finished_spans().expect("shop spans");
    let consumed = loyalty.get_finished_spans().expect("consumer spans");
    let sent = relay.wait_for(placed.len()).await;
    assert_eq!(produced.len(), placed.len(), "one shop span per order");
    assert_eq!(consumed.len(), placed.len(), "one consumer span per record");
    assert_eq!(sent.len(), placed.len(), "one relay span per event: {sent:#?}");
    for order in placed {
        let event_id = order.event_id.to_string();
        let request = produced
            .iter()
            .find(|s| attr(s, "outbox.event_id").as_deref() == Some(event_id.as_str()))
            .unwrap_or_else(|| panic!("the shop's span of event {event_id}"));
        let trace_id = request.span_context.trace_id().to_string();
        assert_eq!(request.name, "place order");
        assert_eq!(
            order.traceparent.as_deref(),
            Some(format!("00-{trace_id}-{}-01", request.span_context.span_id()).as_str()),
            "the outbox row carries the shop span's traceparent"
        );
        let send = &sent
            .iter()
            .find(|e| string_attr(&e.span.attributes, "messaging.message.id").as_deref() == Some(event_id.as_str()))
            .unwrap_or_else(|| panic!("the relay's span of event {event_id}"))
            .span;
        assert_eq!(send.name, format!("send {}", orders::ORDER_PLACED));
        assert_eq!(
            hex(&send.trace_id),
            trace_id,
            "event {event_id}: the relay's span in the order's trace"
        );
        assert_eq!(
            hex(&send.parent_span_id),
            request.span_context.span_id().to_string(),
            "event {event_id}: the relay's span is the shop span's child"
        );
        let process = consumed
            .iter()
            .find(|s| attr(s, "messaging.message.id").as_deref() == Some(event_id.as_str()))
            .unwrap_or_else(|| panic!("the consumer's span of event {event_id}"));
        assert_eq!(process.name, format!("process {}", orders::ORDER_PLACED));
        assert_eq!(process.span_kind, SpanKind::Consumer);
        assert_eq!(process.span_context.trace_id().to_string(), trace_id);
        assert_eq!(
            process.parent_span_id.to_string(),
            hex(&send.span_id),
            "event {event_id}: the consumer's span is the relay span's child"
        );
        assert_eq!(
            attr(process, "messaging.destination.name").as_deref(),
            Some(orders::ORDER_PLACED)
        );
    }
}
