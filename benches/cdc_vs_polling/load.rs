//! The open-loop load generator: producer transactions as in the seeds — an `orders` row and an
//! `events_outbox` row committed together — at a fixed arrival rate, or as fast as the
//! connections go (`rate: None`).
//!
//! Open loop: transaction `i` is due at `start + i / rate` no matter how long earlier ones took,
//! so a slow relay or database cannot slow the offered load down (connection `k` runs the
//! transactions `i ≡ k (mod connections)`; one that falls behind runs its due transactions back to
//! back). Each transaction is one round trip (a multi-statement simple query). The generator
//! records the moment `COMMIT` returned for every event id: the start of the commit-to-Kafka
//! latencies the benchmark reports.
//!
//! The producers' connections ([`Producers`]) live for the whole run and are named
//! [`APPLICATION_NAME`], so the server CPU of the producers' own sessions can be told apart from
//! everything else the server does (the relay's share among it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use tokio_postgres::{Client, SimpleQueryMessage};

/// `application_name` of the producers' sessions.
pub const APPLICATION_NAME: &str = "bench_producer";

/// The producers' connections, one per concurrent transaction stream.
pub struct Producers(Vec<Arc<Client>>);

impl Producers {
    /// `url` must not carry query parameters; the application name is added.
    pub async fn connect(url: &str, connections: usize) -> Result<Producers> {
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections {
            clients.push(Arc::new(
                super::pg::connect(&format!("{url}?application_name={APPLICATION_NAME}")).await?,
            ));
        }
        Ok(Producers(clients))
    }
}

#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Events per second; `None`: closed loop, as fast as possible.
    pub rate: Option<f64>,
    /// Outbox rows (and order rows) per transaction: 1 as in the seeds, more for batched mode.
    pub events_per_txn: usize,
    pub duration: Duration,
    /// The `type` value, i.e. the topic the relays route to.
    pub event_type: String,
    /// `Some(share)`: every row gets a random valid W3C `traceparent`, sampled (flag `01`) in
    /// `share` of the rows and not (`00`) in the others — the producing service's own head
    /// sampling, which the relay follows (the tracing rows); `None`: NULL.
    pub traceparent: Option<f64>,
}

/// Event id and the instant its transaction's COMMIT returned.
pub type Commit = (i64, Instant);

pub struct LoadResult {
    pub commits: Vec<Commit>,
    pub started: Instant,
    pub finished: Instant,
}

impl LoadResult {
    pub fn events_per_second(&self) -> f64 {
        self.commits.len() as f64 / self.finished.duration_since(self.started).as_secs_f64().max(1e-9)
    }
}

pub async fn run(producers: &Producers, spec: &LoadSpec, progress: &ProgressBar) -> Result<LoadResult> {
    let started = Instant::now() + Duration::from_millis(50);
    let end = started + spec.duration;
    let connections = producers.0.len();
    let mut tasks = Vec::new();
    for (k, client) in producers.0.iter().enumerate() {
        let client = Arc::clone(client);
        let spec = spec.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut commits = Vec::new();
            let mut i = k as u64;
            let mut seq = 0u64;
            loop {
                if let Some(rate) = spec.rate {
                    let due = started + Duration::from_secs_f64(i as f64 * spec.events_per_txn as f64 / rate);
                    if due >= end {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                } else if Instant::now() >= end {
                    break;
                }
                let sql = transaction_sql(&spec.event_type, spec.events_per_txn, seq, spec.traceparent);
                let messages = client.simple_query(&sql).await.context("producer transaction")?;
                let committed = Instant::now();
                for m in messages {
                    if let SimpleQueryMessage::Row(row) = m {
                        let id: i64 = row.get(0).context("RETURNING id")?.parse()?;
                        commits.push((id, committed));
                    }
                }
                progress.inc(spec.events_per_txn as u64);
                i += connections as u64;
                seq += 1;
            }
            anyhow::Ok(commits)
        }));
    }
    let mut commits = Vec::new();
    for t in tasks {
        commits.extend(t.await??);
    }
    Ok(LoadResult {
        commits,
        started,
        finished: Instant::now(),
    })
}

/// A random valid W3C `traceparent`: version 00, a random trace id and parent id (UUID v4
/// bits: never all zero), sampled with probability `sampled_share`.
fn traceparent(sampled_share: f64) -> String {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let parent_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let draw = uuid::Uuid::new_v4().as_u128() as f64 / u128::MAX as f64;
    let flags = if draw < sampled_share { "01" } else { "00" };
    format!("00-{trace_id}-{parent_id}-{flags}")
}

/// One producer transaction: `n` orders and `n` outbox events (the outbox ids returned), each
/// with a fresh `traceparent` when `with_trace` says how many are sampled.
fn transaction_sql(event_type: &str, n: usize, seq: u64, with_trace: Option<f64>) -> String {
    let mut orders = Vec::with_capacity(n);
    let mut events = Vec::with_capacity(n);
    for j in 0..n {
        let order = uuid::Uuid::new_v4();
        let customer = uuid::Uuid::new_v4();
        let total = 1_000 + (seq * 7 + j as u64) % 90_000;
        orders.push(format!("('{order}', '{customer}', {total}, 'placed')"));
        let payload = serde_json::json!({
            "order_id": order.to_string(),
            "customer_id": customer.to_string(),
            "total_cents": total,
            "currency": "EUR",
            "items": [{"sku": format!("sku-{}", total % 977), "qty": 1 + total % 3}],
        });
        if let Some(share) = with_trace {
            events.push(format!(
                "('{order}', '{event_type}', '{payload}', '{}')",
                traceparent(share)
            ));
        } else {
            events.push(format!("('{order}', '{event_type}', '{payload}')"));
        }
    }
    format!(
        "BEGIN; INSERT INTO orders (id, customer_id, total_cents, status) VALUES {}; \
         INSERT INTO events_outbox (aggregate_id, type, payload{}) VALUES {} RETURNING id; COMMIT",
        orders.join(", "),
        if with_trace.is_some() { ", traceparent" } else { "" },
        events.join(", ")
    )
}
