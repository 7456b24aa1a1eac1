//! The demo's producer: `place_order` from the first seed article — an order row and an outbox
//! row in ONE transaction — at a steady target rate, from a few connections in parallel.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_postgres::{Client, NoTls};

use super::stats::Stats;
use super::DemoError;

/// The first seed's schema: the business table and the outbox table (with the polling-era
/// `dispatched_at` column, unused by the relay).
pub(crate) const SCHEMA: &str = "
CREATE TABLE orders (
    id           uuid PRIMARY KEY,
    customer_id  uuid NOT NULL,
    total_cents  bigint NOT NULL,
    status       text NOT NULL
);
CREATE TABLE events_outbox (
    id            bigserial PRIMARY KEY,
    aggregate_id  uuid        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz
);
";

/// The event type, and so (with the default routing) the topic.
pub(crate) const EVENT_TYPE: &str = "order.placed";

/// Rate one connection is asked to sustain at most; more connections share higher rates.
const RATE_PER_CONNECTION: u32 = 250;
const MAX_CONNECTIONS: u32 = 16;

/// Starts the producer connections; they stop when `stop` turns true.
pub(crate) async fn spawn(
    url: &str,
    rate: u32,
    run_id: &str,
    stats: Arc<Stats>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<Result<(), DemoError>>>, DemoError> {
    let connections = rate.div_ceil(RATE_PER_CONNECTION).clamp(1, MAX_CONNECTIONS);
    let period = Duration::from_secs_f64(f64::from(connections) / f64::from(rate.max(1)));
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let client = connect(url).await?;
        let (stats, mut stop, run_id) = (Arc::clone(&stats), stop.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut client = client;
            let mut tick = tokio::time::interval(period);
            // Behind schedule (a slow disk): produce less, never burst to catch up.
            tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            let mut n: u64 = 0;
            loop {
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tick.tick() => {}
                }
                if *stop.borrow() {
                    return Ok(());
                }
                let total_cents = 500 + (n * 7_919 + u64::from(worker) * 104_729) % 20_000;
                let placed = place_order(&mut client, &run_id, total_cents as i64).await?;
                stats.committed(placed.event_id, placed.committed_at_us, placed.took);
                stats.produced.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }
    Ok(tasks)
}

/// An order that committed: its outbox event's id, when `COMMIT` returned (µs since the epoch)
/// and how long the transaction took from the moment the order was placed.
pub(crate) struct Placed {
    pub(crate) event_id: i64,
    pub(crate) committed_at_us: i64,
    pub(crate) took: Duration,
}

fn now_unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// One business transaction: the order and its `order.placed` event commit together or not at all.
pub(crate) async fn place_order(client: &mut Client, run_id: &str, total_cents: i64) -> Result<Placed, DemoError> {
    let placed_at_us = now_unix_us();
    let tx = client.transaction().await.map_err(DemoError::postgres("BEGIN"))?;
    let order = tx
        .query_one(
            "INSERT INTO orders (id, customer_id, total_cents, status)
             VALUES (gen_random_uuid(), gen_random_uuid(), $1, 'placed')
             RETURNING id::text, customer_id::text",
            &[&total_cents],
        )
        .await
        .map_err(DemoError::postgres("inserting an order"))?;
    let (order_id, customer_id): (String, String) = (order.get(0), order.get(1));
    let event = tx
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload)
         VALUES ($1::text::uuid, $2, jsonb_build_object('order_id', $1::text, 'customer_id', $3::text,
                 'total_cents', $4::bigint, 'run', $5::text, 'placed_at_us', $6::bigint))
         RETURNING id",
            &[
                &order_id,
                &EVENT_TYPE,
                &customer_id,
                &total_cents,
                &run_id,
                &placed_at_us,
            ],
        )
        .await
        .map_err(DemoError::postgres("inserting the outbox event"))?;
    let event_id: i64 = event.get(0);
    tx.commit().await.map_err(DemoError::postgres("COMMIT"))?;
    let committed_at_us = now_unix_us();
    Ok(Placed {
        event_id,
        committed_at_us,
        took: Duration::from_micros((committed_at_us - placed_at_us).max(0) as u64),
    })
}

pub(crate) async fn connect(url: &str) -> Result<Client, DemoError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(DemoError::postgres("connecting"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
