//! The producer side of the example shop: `place_order` from the outbox seed article.
//!
//! The order row and its `order.placed` outbox row are written in ONE transaction, so they
//! commit together or not at all — the whole point of the outbox pattern. Nothing here talks to
//! Kafka: outbox-relay publishes the outbox row once PostgreSQL committed it.
//!
//! Tracing: the outbox row carries the W3C `traceparent` of the request that placed the order
//! (column `traceparent`; map it with `[outbox] trace_column = "traceparent"`), so the trace goes
//! on through the relay (its `send` span with `[tracing]`) to the consumer. A real service takes
//! it from its OpenTelemetry span (the W3C propagator's `traceparent`); the example makes one up
//! per request with [`new_traceparent`].
//!
//! Shared by `examples/place_order.rs` and the integration tests (`#[path]`-included there).

use tokio_postgres::{Client, Error};

/// The business table and the outbox table (the first seed's schema A).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id           uuid PRIMARY KEY,
    customer_id  uuid NOT NULL,
    total_cents  bigint NOT NULL,
    status       text NOT NULL
);
CREATE TABLE IF NOT EXISTS events_outbox (
    id            bigserial PRIMARY KEY,
    aggregate_id  uuid        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz
);
-- The request's W3C trace context (outbox.trace_column), also on a table made before it existed.
ALTER TABLE events_outbox ADD COLUMN IF NOT EXISTS traceparent text;
";

/// The event type; with the relay's default routing it is also the topic.
pub const ORDER_PLACED: &str = "order.placed";

/// A W3C `traceparent` for a new request's span: version 00, a random 16-byte trace id, a
/// random 8-byte span id, sampled. (With the OpenTelemetry SDK: the current span's context,
/// injected with `TraceContextPropagator`.)
pub fn new_traceparent() -> String {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let span_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace_id}-{span_id}-01")
}

/// Places an order: the order row and the outbox event commit atomically. Returns the event id.
/// `traceparent`: the request's span (written to the outbox row, so the trace continues).
///
/// The payload is serialized here, at write time, and carries everything a consumer needs
/// (order, customer, amount), so nobody has to call back into this service to enrich it.
pub async fn place_order(
    client: &mut Client,
    order_id: &str,
    customer_id: &str,
    total_cents: i64,
    traceparent: &str,
) -> Result<i64, Error> {
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, customer_id, total_cents, status)
         VALUES ($1::text::uuid, $2::text::uuid, $3, 'placed')",
        &[&order_id, &customer_id, &total_cents],
    )
    .await?;
    let payload = serde_json::json!({
        "order_id": order_id,
        "customer_id": customer_id,
        "total_cents": total_cents,
    })
    .to_string();
    let event = tx
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload, traceparent)
             VALUES ($1::text::uuid, $2, $3::text::jsonb, $4)
             RETURNING id",
            &[&order_id, &ORDER_PLACED, &payload, &traceparent],
        )
        .await?;
    tx.commit().await?;
    Ok(event.get(0))
}
