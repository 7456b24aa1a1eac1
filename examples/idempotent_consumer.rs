//! Example idempotent consumer: awards loyalty points for `order.placed` events exactly once,
//! however often Kafka delivers them (see `support/loyalty.rs` for how).
//!
//! ```sh
//! cargo run --example idempotent_consumer -- --database-url postgres://postgres@127.0.0.1:5432/loyalty \
//!     --bootstrap 127.0.0.1:9092 --create-schema
//! ```
//!
//! Each record is handled in a CONSUMER span continuing the record's `traceparent`; set
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (e.g. `http://127.0.0.1:4318`) to export the spans over OTLP/HTTP.

#[path = "support/loyalty.rs"]
mod loyalty;
#[path = "support/telemetry.rs"]
mod telemetry;

use std::time::Duration;

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};

#[derive(Debug, Parser)]
#[command(about = "Consumes order.placed and awards loyalty points exactly once per event")]
struct Args {
    /// The consumer's own database (processed_events, loyalty_points).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long, default_value = "order.placed")]
    topic: String,
    /// Kafka consumer group (offsets are committed per group).
    #[arg(long, default_value = "loyalty")]
    group: String,
    /// This consumer's name in processed_events (dedup is per consumer).
    #[arg(long, default_value = "loyalty")]
    consumer_name: String,
    /// Create processed_events and loyalty_points if missing.
    #[arg(long)]
    create_schema: bool,
    /// Exit after this many seconds without a record (default: run until killed).
    #[arg(long)]
    idle_exit_secs: Option<u64>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let telemetry = telemetry::Telemetry::from_env("loyalty")?;
    let (mut client, connection) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection lost: {e}");
        }
    });
    if args.create_schema {
        client.batch_execute(loyalty::SCHEMA).await?;
    }
    let kafka: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        // Offsets are committed by hand, after the database transaction.
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    kafka.subscribe(&[&args.topic])?;
    eprintln!(
        "consuming {} as group {} (consumer {})",
        args.topic, args.group, args.consumer_name
    );
    let stop = loyalty::StopWhen {
        max_records: None,
        idle: args.idle_exit_secs.map(Duration::from_secs),
    };
    let stats = loyalty::run(&kafka, &mut client, &telemetry.tracer, &args.consumer_name, stop).await?;
    eprintln!(
        "applied {} events, skipped {} duplicates",
        stats.applied, stats.duplicates
    );
    telemetry.shutdown();
    Ok(())
}
