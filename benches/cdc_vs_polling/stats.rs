//! Latency statistics: exact percentiles from an HdrHistogram of per-event commit-to-consumer
//! latencies (the relay's own commit-to-ack window comes from its `/latency`, see `relay.rs`).

use std::collections::HashMap;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::consumer::Receipt;
use super::load::Commit;

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Commit-to-consumer latencies of the events in `commits`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    pub delivered: u64,
    pub missing: u64,
    pub duplicates: u64,
    /// Receipts earlier than the generator saw its COMMIT return (the relay was faster than the
    /// commit's reply); counted as 0 ms.
    pub before_commit_reply: u64,
    pub latency: Option<Percentiles>,
    /// First commit to last receipt.
    pub span_seconds: f64,
}

pub fn delivery(commits: &[Commit], receipts: &[Receipt]) -> Delivery {
    let mut first: HashMap<i64, Instant> = HashMap::with_capacity(receipts.len());
    let mut seen: HashMap<i64, u32> = HashMap::with_capacity(receipts.len());
    for (id, at) in receipts {
        first.entry(*id).or_insert(*at);
        *seen.entry(*id).or_default() += 1;
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds");
    let (mut missing, mut duplicates, mut early) = (0, 0, 0);
    let mut last_receipt: Option<Instant> = None;
    for (id, committed) in commits {
        let Some(received) = first.get(id) else {
            missing += 1;
            continue;
        };
        duplicates += u64::from(seen[id] - 1);
        last_receipt = Some(last_receipt.map_or(*received, |l| l.max(*received)));
        let micros = match received.checked_duration_since(*committed) {
            Some(d) => d.as_micros() as u64,
            None => {
                early += 1;
                0
            }
        };
        hist.saturating_record(micros.max(1));
    }
    let first_commit = commits.iter().map(|(_, c)| *c).min();
    let span = match (first_commit, last_receipt) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Delivery {
        delivered: hist.len(),
        missing,
        duplicates,
        before_commit_reply: early,
        latency: (!hist.is_empty()).then(|| Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            max: hist.max() as f64 / 1000.0,
        }),
        span_seconds: span,
    }
}
