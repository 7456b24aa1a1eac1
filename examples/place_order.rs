//! Example producer: places orders the transactional-outbox way (order row + outbox row in one
//! transaction), for outbox-relay to publish.
//!
//! ```sh
//! cargo run --example place_order -- --database-url postgres://postgres@127.0.0.1:5432/shop \
//!     --create-schema --count 100 --rate 10
//! ```
//!
//! Each order is placed in an OpenTelemetry span (`place order`) whose `traceparent` the outbox
//! row carries; with `[outbox] trace_column = "traceparent"` (and `[tracing]` for the relay's
//! own span) the consumer example continues that trace. Set `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (e.g. `http://127.0.0.1:4318`) to export the spans over OTLP/HTTP.

#[path = "support/orders.rs"]
mod orders;
#[path = "support/telemetry.rs"]
mod telemetry;

use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Places orders: an order row and an order.placed outbox row per transaction")]
struct Args {
    /// The shop's database.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Create the orders and events_outbox tables if missing.
    #[arg(long)]
    create_schema: bool,
    /// How many orders (0: until Ctrl-C).
    #[arg(long, default_value_t = 10)]
    count: u64,
    /// Orders per second.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// Orders are spread over this many customers (so loyalty points add up).
    #[arg(long, default_value_t = 10)]
    customers: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let telemetry = telemetry::Telemetry::from_env("shop")?;
    let (mut client, connection) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection lost: {e}");
        }
    });
    if args.create_schema {
        client.batch_execute(orders::SCHEMA).await?;
    }
    let customers: Vec<String> = (0..args.customers.max(1))
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate.max(0.001)));
    let mut placed: u64 = 0;
    while args.count == 0 || placed < args.count {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let order_id = uuid::Uuid::new_v4().to_string();
        let customer = &customers[placed as usize % customers.len()];
        let total_cents = 1_000 + (placed as i64 * 737) % 9_000;
        let order = orders::place_order(&mut client, &telemetry.tracer, &order_id, customer, total_cents).await?;
        println!(
            "placed order {order_id} for customer {customer}: {total_cents} cents (outbox event {}, \
             traceparent {})",
            order.event_id,
            order.traceparent.as_deref().unwrap_or("-")
        );
        placed += 1;
    }
    eprintln!("placed {placed} orders");
    telemetry.shutdown();
    Ok(())
}
