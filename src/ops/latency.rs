//! Exact commit-to-acknowledgement latency: an HdrHistogram window served at `GET /latency`.
//!
//! The Prometheus histogram (`outbox_relay_commit_to_ack_seconds`) has fixed buckets: right for
//! dashboards and alerts, too coarse to tell a p99 of 4 ms from one of 9 ms. This window keeps
//! every sample at three significant digits (1 µs … 1 h; longer samples count as 1 h) since the
//! process started or since the last `GET /latency?reset=true`, which returns the window it
//! closes and opens a new one: what a benchmark or a canary check reads around a load.
//!
//! What a sample is: the streaming relay measures from the PostgreSQL commit timestamp of the
//! event's transaction (from the WAL, µs) to the moment the Kafka acknowledgement reached the
//! relay; the polling relayer from the row's timestamp column (`outbox.timestamp_column`, the
//! inserting transaction's `now()`, so a little *before* its commit) to the acknowledgement.
//! Both compare the database's clock with this host's; on one host they are the same clock.
//!
//! Hot path: an acknowledgement only pushes onto a [`LatencyBatch`]; the owner folds the batch
//! into the shared window once per batch of delivery reports (one uncontended lock).

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest recorded sample: one hour, in µs.
const MAX_US: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// The process-wide commit-to-ack window (both relay modes record into it).
pub(crate) fn commit_to_ack() -> &'static LatencyWindow {
    static WINDOW: OnceLock<LatencyWindow> = OnceLock::new();
    WINDOW.get_or_init(LatencyWindow::new)
}

pub(crate) struct LatencyWindow {
    inner: Mutex<Window>,
}

struct Window {
    histogram: Histogram<u64>,
    opened: Instant,
}

/// A window's percentiles, in milliseconds (`None` when it holds no sample).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub window_seconds: f64,
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl LatencyWindow {
    pub(crate) fn new() -> LatencyWindow {
        LatencyWindow {
            inner: Mutex::new(Window {
                histogram: new_histogram(),
                opened: Instant::now(),
            }),
        }
    }

    /// Folds `batch` into the window and empties it (keeping its capacity).
    pub(crate) fn absorb(&self, batch: &mut LatencyBatch) {
        if batch.samples_us.is_empty() {
            return;
        }
        // A poisoned lock only means another thread panicked mid-record; the counts are still
        // usable, and losing latency samples must never stop the relay.
        let mut w = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for &us in &batch.samples_us {
            w.histogram.saturating_record(us.clamp(1, MAX_US));
        }
        batch.samples_us.clear();
    }

    /// The window's percentiles; with `reset`, the window is closed and a new one opened.
    pub(crate) fn summary(&self, reset: bool) -> LatencySummary {
        let mut w = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = &w.histogram;
        let ms = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0);
        let summary = LatencySummary {
            window_seconds: w.opened.elapsed().as_secs_f64(),
            count: h.len(),
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: (!h.is_empty()).then(|| h.max() as f64 / 1000.0),
        };
        if reset {
            w.histogram.reset();
            w.opened = Instant::now();
        }
        summary
    }
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow::new()
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, SIGNIFICANT_DIGITS).expect("constant bounds inside hdrhistogram's range")
}

/// Samples collected between two folds into the shared window.
#[derive(Debug, Default)]
pub(crate) struct LatencyBatch {
    samples_us: Vec<u64>,
}

impl LatencyBatch {
    /// One acknowledgement at `now_unix_us` of an event whose clock started at `since_unix_us`
    /// (a clock disagreement that makes it negative counts as 0).
    pub(crate) fn record(&mut self, since_unix_us: i64, now_unix_us: i64) {
        let us = now_unix_us.saturating_sub(since_unix_us).max(0);
        self.samples_us.push(u64::try_from(us).unwrap_or(0));
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.samples_us.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_every_sample_and_reset_opens_a_new_window() {
        let window = LatencyWindow::new();
        let mut batch = LatencyBatch::default();
        // 1 ms … 100 ms in 1 ms steps: p50 ≈ 50 ms, p99 ≈ 99 ms, max 100 ms.
        for ms in 1..=100i64 {
            batch.record(0, ms * 1000);
        }
        window.absorb(&mut batch);
        assert!(batch.is_empty(), "absorb empties the batch");
        let s = window.summary(true);
        assert_eq!(s.count, 100);
        let close = |got: Option<f64>, want: f64| (got.unwrap() - want).abs() <= want * 0.002;
        assert!(close(s.p50_ms, 50.0), "{s:?}");
        assert!(close(s.p90_ms, 90.0), "{s:?}");
        assert!(close(s.p99_ms, 99.0), "{s:?}");
        assert!(close(s.max_ms, 100.0), "{s:?}");

        let empty = window.summary(false);
        assert_eq!(empty.count, 0, "reset cleared the window");
        assert_eq!(empty.p99_ms, None);
        assert_eq!(empty.max_ms, None);
    }

    #[test]
    fn clock_skew_and_huge_samples_are_clamped_not_lost() {
        let window = LatencyWindow::new();
        let mut batch = LatencyBatch::default();
        batch.record(5_000, 1_000); // the database clock ahead of ours
        batch.record(0, i64::MAX);
        window.absorb(&mut batch);
        let s = window.summary(false);
        assert_eq!(s.count, 2);
        assert!(s.p50_ms.unwrap() <= 0.002, "{s:?}");
        assert!(s.max_ms.unwrap() >= 3_599_000.0, "{s:?}");
    }
}
