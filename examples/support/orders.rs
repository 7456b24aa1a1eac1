//! The producer side of the example shop: `place_order` from the outbox seed article.
//!
//! The order row and its `order.placed` outbox row are written in ONE transaction, so they
//! commit together or not at all — the whole point of the outbox pattern. Nothing here talks to
//! Kafka: outbox-relay publishes the outbox row once PostgreSQL committed it.
//!
//! Tracing: `place_order` runs in an OpenTelemetry span of its own (`place order`, a child of
//! whatever span is current, e.g. the HTTP request's), and the outbox row carries that span's
//! W3C `traceparent`, as the SDK's propagator writes it (column `traceparent`; map it with
//! `[outbox] trace_column = "traceparent"`). The trace goes on through the relay (its `send`
//! span with `[tracing]`) to the consumer, whose span is a child of the record's `traceparent`.
//!
//! Shared by `examples/place_order.rs` and the integration tests (`#[path]`-included there).

use opentelemetry::context::FutureExt;
use opentelemetry::trace::{Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
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

/// An order placed: its outbox event's id and the `traceparent` written with it.
#[derive(Debug, Clone)]
pub struct Placed {
    pub event_id: i64,
    pub traceparent: Option<String>,
}

/// Places an order in a `place order` span of `tracer` (a child of the current context's span):
/// the order row and the outbox event, which carries the span's `traceparent`, commit
/// atomically.
///
/// The payload is serialized here, at write time, and carries everything a consumer needs
/// (order, customer, amount), so nobody has to call back into this service to enrich it.
pub async fn place_order(
    client: &mut Client,
    tracer: &SdkTracer,
    order_id: &str,
    customer_id: &str,
    total_cents: i64,
) -> Result<Placed, Error> {
    let span = tracer
        .span_builder("place order")
        .with_attributes([KeyValue::new("order.id", order_id.to_owned())])
        .start_with_context(tracer, &Context::current());
    let cx = Context::current_with_span(span);
    // What the SDK's W3C propagator writes for this span; in the outbox row it outlives the
    // request, so the relay and the consumer continue the trace.
    let traceparent = super::telemetry::traceparent(&cx);
    let placed = write_order(client, order_id, customer_id, total_cents, traceparent.as_deref())
        .with_context(cx.clone())
        .await;
    match &placed {
        Ok(event_id) => cx.span().set_attribute(KeyValue::new("outbox.event_id", *event_id)),
        Err(e) => cx.span().set_status(Status::error(e.to_string())),
    }
    cx.span().end();
    Ok(Placed {
        event_id: placed?,
        traceparent,
    })
}

/// The order row and its outbox row, in one transaction.
async fn write_order(
    client: &mut Client,
    order_id: &str,
    customer_id: &str,
    total_cents: i64,
    traceparent: Option<&str>,
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
