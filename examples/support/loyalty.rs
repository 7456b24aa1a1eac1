//! The consumer side of the example shop: an idempotent consumer of `order.placed` that awards
//! loyalty points, as the seed articles describe.
//!
//! Delivery is at-least-once (the relay republishes after a crash or a Kafka failure, and
//! consumer-group rebalances redeliver), so the consumer makes it look exactly-once:
//! * the dedup row `processed_events (consumer, event_id)` and the side effect (the points
//!   upsert) are written in ONE transaction — a crash between them cannot leave the event marked
//!   processed without its points, or the other way round;
//! * an event whose dedup row already exists is skipped;
//! * the Kafka offset is committed only AFTER that transaction committed, so a crash in between
//!   means a redelivery, which the dedup row absorbs.
//!
//! The event id comes from the record's `id` header, which outbox-relay sets from the outbox
//! row's id. Shared by `examples/idempotent_consumer.rs` and the integration tests.
//!
//! Tracing: each record is handled in an OpenTelemetry CONSUMER span, `process <topic>`, whose
//! parent is the record's W3C `traceparent` header (the relay's `send` span with `[tracing]`,
//! else the producing request's), read with the SDK's propagator: one trace from the order's
//! request to the points awarded. A record without a valid `traceparent` starts a new trace.

use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SdkTracer;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_postgres::Client;

/// The consumer's own tables (in the consumer's database).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS processed_events (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE IF NOT EXISTS loyalty_points (
    customer_id uuid PRIMARY KEY,
    points      bigint NOT NULL
);
";

/// What handling one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// First time: points awarded.
    Applied,
    /// Seen before by this consumer: skipped, nothing changed.
    Duplicate,
}

#[derive(Debug)]
pub enum ConsumeError {
    /// A record without an `id` header or with a payload that is not an `order.placed` event.
    BadRecord(String),
    Db(tokio_postgres::Error),
    Kafka(rdkafka::error::KafkaError),
}

impl std::fmt::Display for ConsumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConsumeError::BadRecord(m) => write!(f, "bad record: {m}"),
            ConsumeError::Db(e) => write!(f, "database: {e}"),
            ConsumeError::Kafka(e) => write!(f, "kafka: {e}"),
        }
    }
}

impl std::error::Error for ConsumeError {}

/// Points for an order: one per whole currency unit.
pub fn points_for(total_cents: i64) -> i64 {
    total_cents / 100
}

/// Applies one `order.placed` event exactly once per `consumer`: dedup row and side effect in
/// one transaction.
pub async fn handle_order_placed(
    client: &mut Client,
    consumer: &str,
    event_id: &str,
    payload: &serde_json::Value,
) -> Result<Handled, ConsumeError> {
    let customer_id = payload
        .get("customer_id")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ConsumeError::BadRecord(format!("event {event_id}: payload has no customer_id")))?;
    let total_cents = payload
        .get("total_cents")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| ConsumeError::BadRecord(format!("event {event_id}: payload has no total_cents")))?;
    let tx = client.transaction().await.map_err(ConsumeError::Db)?;
    // ON CONFLICT DO NOTHING instead of catching the unique violation: a failed statement would
    // abort the transaction, this just reports zero rows.
    let first_time = tx
        .execute(
            "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&consumer, &event_id],
        )
        .await
        .map_err(ConsumeError::Db)?;
    if first_time == 0 {
        // Already processed; nothing to do (the transaction changed nothing).
        tx.rollback().await.map_err(ConsumeError::Db)?;
        return Ok(Handled::Duplicate);
    }
    // The side effect is an upsert, idempotent at the data layer too.
    tx.execute(
        "INSERT INTO loyalty_points (customer_id, points) VALUES ($1::text::uuid, $2)
         ON CONFLICT (customer_id) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points",
        &[&customer_id, &points_for(total_cents)],
    )
    .await
    .map_err(ConsumeError::Db)?;
    tx.commit().await.map_err(ConsumeError::Db)?;
    Ok(Handled::Applied)
}

/// What one consumer run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunStats {
    pub applied: u64,
    pub duplicates: u64,
}

impl RunStats {
    pub fn handled(&self) -> u64 {
        self.applied + self.duplicates
    }
}

/// When a consumer run ends.
#[derive(Debug, Clone, Copy)]
pub struct StopWhen {
    /// After this many records (None: no limit).
    pub max_records: Option<u64>,
    /// After no record arrived for this long (None: never).
    pub idle: Option<Duration>,
}

/// Consumes until `stop`: handle each record, then commit its offset (only after the database
/// transaction committed). `consumer` must be subscribed with `enable.auto.commit=false`.
pub async fn run(
    kafka: &StreamConsumer,
    client: &mut Client,
    tracer: &SdkTracer,
    consumer_name: &str,
    stop: StopWhen,
) -> Result<RunStats, ConsumeError> {
    let mut stats = RunStats::default();
    let mut last_record = Instant::now();
    loop {
        if stop.max_records.is_some_and(|max| stats.handled() >= max) {
            return Ok(stats);
        }
        let wait = match stop.idle {
            Some(idle) => match idle.checked_sub(last_record.elapsed()) {
                Some(left) => left,
                None => return Ok(stats),
            },
            None => Duration::from_secs(3600),
        };
        let message = match tokio::time::timeout(wait, kafka.recv()).await {
            Err(_) => continue,
            // E.g. the topic does not exist yet, or a broker restarts: librdkafka recovers by itself.
            Ok(Err(e)) => {
                eprintln!("kafka: {e} (retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Ok(Ok(m)) => m,
        };
        last_record = Instant::now();
        match handle_record(client, tracer, consumer_name, &message).await? {
            Handled::Applied => stats.applied += 1,
            Handled::Duplicate => stats.duplicates += 1,
        }
        kafka
            .commit_message(&message, CommitMode::Sync)
            .map_err(ConsumeError::Kafka)?;
    }
}

/// A header's value (the first of that name).
fn header<'a>(message: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a [u8]> {
    message
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
}

/// Handles one record in a CONSUMER span continuing the record's trace (OpenTelemetry's
/// messaging conventions: `process <destination>`, system, operation, destination, message id).
async fn handle_record(
    client: &mut Client,
    tracer: &SdkTracer,
    consumer: &str,
    message: &BorrowedMessage<'_>,
) -> Result<Handled, ConsumeError> {
    let parent = super::telemetry::remote_parent(header(message, "traceparent"), header(message, "tracestate"));
    let topic = message.topic().to_owned();
    let span = tracer
        .span_builder(format!("process {topic}"))
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", topic),
            KeyValue::new("messaging.destination.partition.id", message.partition().to_string()),
            KeyValue::new("messaging.kafka.offset", message.offset()),
            // The dedup name (processed_events.consumer), not necessarily the Kafka group.
            KeyValue::new("loyalty.consumer", consumer.to_owned()),
        ])
        .start_with_context(tracer, &parent);
    let cx = parent.with_span(span);
    let handled = handle_traced(client, consumer, message, &cx).await;
    match &handled {
        Ok(h) => cx
            .span()
            .set_attribute(KeyValue::new("loyalty.handled", format!("{h:?}"))),
        Err(e) => cx.span().set_status(Status::error(e.to_string())),
    }
    cx.span().end();
    handled
}

async fn handle_traced(
    client: &mut Client,
    consumer: &str,
    message: &BorrowedMessage<'_>,
    cx: &opentelemetry::Context,
) -> Result<Handled, ConsumeError> {
    let event_id = header(message, "id")
        .and_then(|v| std::str::from_utf8(v).ok())
        .ok_or_else(|| ConsumeError::BadRecord(format!("offset {} has no id header", message.offset())))?
        .to_owned();
    let payload: serde_json::Value = message
        .payload()
        .and_then(|p| serde_json::from_slice(p).ok())
        .ok_or_else(|| ConsumeError::BadRecord(format!("event {event_id}: payload is not JSON")))?;
    cx.span()
        .set_attribute(KeyValue::new("messaging.message.id", event_id.clone()));
    let sc = cx.span().span_context().clone();
    println!("event {event_id}: trace {} span {}", sc.trace_id(), sc.span_id());
    handle_order_placed(client, consumer, &event_id, &payload).await
}
