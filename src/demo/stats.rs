//! What the demo measures, the live progress line, and the closing summary.
//!
//! Latency is "order placed → consumed": the producer stamps the wall-clock time into each
//! payload when its transaction starts, the consumer subtracts it from the time it reads the
//! record. Both run in this process, so the clocks agree.

use std::collections::HashSet;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Counters shared by the producer tasks, the consumer thread and the progress printer.
pub(crate) struct Stats {
    pub(crate) produced: AtomicU64,
    /// Records in the demo topic since the demo started, as the broker reports them (Kafka: sum
    /// of partition high watermarks; NATS: the run's stream; Redis: the run's stream key;
    /// RabbitMQ: nothing, the queue drains as it is read). Shown as at least the records consumed.
    pub(crate) published: AtomicU64,
    pub(crate) consumed_records: AtomicU64,
    consumed_ids: Mutex<HashSet<i64>>,
    latency_us: Mutex<Histogram<u64>>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            produced: AtomicU64::new(0),
            published: AtomicU64::new(0),
            consumed_records: AtomicU64::new(0),
            consumed_ids: Mutex::new(HashSet::new()),
            // 1 µs .. 1 h, 3 significant digits.
            latency_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")),
        }
    }

    /// One record read by the consumer: its event id and its end-to-end latency.
    pub(crate) fn consumed(&self, event_id: i64, latency: Duration) {
        self.consumed_records.fetch_add(1, Ordering::Relaxed);
        let first = self
            .consumed_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(event_id);
        if first {
            let us = u64::try_from(latency.as_micros())
                .unwrap_or(u64::MAX)
                .clamp(1, 3_600_000_000);
            let _ = self.latency_us.lock().unwrap_or_else(|e| e.into_inner()).record(us);
        }
    }

    /// Distinct events consumed.
    pub(crate) fn consumed_distinct(&self) -> u64 {
        self.consumed_ids.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    pub(crate) fn snapshot(&self, elapsed: Duration) -> Snapshot {
        let h = self.latency_us.lock().unwrap_or_else(|e| e.into_inner());
        let ms = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0);
        let consumed_records = self.consumed_records.load(Ordering::Relaxed);
        let consumed = self.consumed_distinct();
        Snapshot {
            elapsed,
            produced: self.produced.load(Ordering::Relaxed),
            // The broker's count is refreshed now and then (Kafka: once a second), so it can trail
            // what the consumer already read; every record read was published, so the line never
            // shows fewer published than consumed.
            published: self.published.load(Ordering::Relaxed).max(consumed_records),
            consumed,
            duplicates: consumed_records.saturating_sub(consumed),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: (!h.is_empty()).then(|| h.max() as f64 / 1000.0),
        }
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

/// The numbers at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) elapsed: Duration,
    pub(crate) produced: u64,
    pub(crate) published: u64,
    pub(crate) consumed: u64,
    pub(crate) duplicates: u64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
}

impl Snapshot {
    /// Events produced but not consumed yet.
    pub(crate) fn lag(&self) -> u64 {
        self.produced.saturating_sub(self.consumed)
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"))
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(0.001);
        write!(
            f,
            "[{:>5.1}s] produced {} ({:.0}/s) | published {} | consumed {} | lag {} | p50 {} | p99 {}",
            self.elapsed.as_secs_f64(),
            self.produced,
            self.produced as f64 / secs,
            self.published,
            self.consumed,
            self.lag(),
            ms(self.p50_ms),
            ms(self.p99_ms)
        )?;
        if self.duplicates > 0 {
            write!(f, " | duplicates {}", self.duplicates)?;
        }
        Ok(())
    }
}

/// The live line on stderr: redrawn in place on a terminal, one line every few seconds
/// otherwise (logs, CI).
pub(crate) struct ProgressLine {
    terminal: bool,
    last_plain: Option<Instant>,
    drawn: bool,
}

impl ProgressLine {
    pub(crate) fn new() -> ProgressLine {
        ProgressLine {
            terminal: std::io::stderr().is_terminal(),
            last_plain: None,
            drawn: false,
        }
    }

    pub(crate) fn update(&mut self, snapshot: &Snapshot) {
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{snapshot}");
            self.drawn = true;
        } else if self.last_plain.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            let _ = writeln!(err, "{snapshot}");
            self.last_plain = Some(Instant::now());
        }
        let _ = err.flush();
    }

    /// Prints a message on its own line without garbling the live line.
    pub(crate) fn message(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        if self.drawn {
            let _ = write!(err, "\r\x1b[2K");
            self.drawn = false;
        }
        let _ = writeln!(err, "{text}");
    }

    /// Leaves the last drawn line in place and moves below it.
    pub(crate) fn finish(&mut self) {
        if self.drawn {
            let _ = writeln!(std::io::stderr());
            self.drawn = false;
        }
    }
}

impl Default for ProgressLine {
    fn default() -> Self {
        ProgressLine::new()
    }
}

/// What the demo prints at the end (stdout).
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub(crate) numbers: Snapshot,
    pub(crate) rate: u32,
    pub(crate) topic: String,
    /// The broker, as the summary names it ("the embedded Kafka (…)", "NATS JetStream stream … at …").
    pub(crate) kafka: String,
    pub(crate) slot: String,
    pub(crate) confirmed_lsn: Option<String>,
    pub(crate) interrupted: bool,
    pub(crate) cleanup: Vec<String>,
}

impl Summary {
    /// Every produced event reached the consumer.
    pub(crate) fn all_consumed(&self) -> bool {
        self.numbers.consumed >= self.numbers.produced
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = &self.numbers;
        let how = if self.interrupted {
            "interrupted (Ctrl-C)"
        } else {
            "completed"
        };
        writeln!(f, "outbox-relay demo summary ({how})")?;
        writeln!(
            f,
            "  ran             {:.1} s, target rate {}/s",
            n.elapsed.as_secs_f64(),
            self.rate
        )?;
        writeln!(
            f,
            "  produced        {} orders (an order row and an outbox row per transaction)",
            n.produced
        )?;
        writeln!(
            f,
            "  published       {} records to topic {} on {}",
            n.published, self.topic, self.kafka
        )?;
        writeln!(
            f,
            "  consumed        {} distinct events, {} duplicates, {} missing",
            n.consumed,
            n.duplicates,
            n.produced.saturating_sub(n.consumed)
        )?;
        writeln!(
            f,
            "  latency         p50 {}, p99 {}, max {} (order placed -> consumed)",
            ms(n.p50_ms),
            ms(n.p99_ms),
            ms(n.max_ms)
        )?;
        writeln!(
            f,
            "  slot            {} confirmed up to {}",
            self.slot,
            self.confirmed_lsn.as_deref().unwrap_or("?")
        )?;
        for line in &self.cleanup {
            writeln!(f, "  cleaned up      {line}")?;
        }
        if self.all_consumed() {
            write!(
                f,
                "  result          OK: all {} produced events were consumed",
                n.produced
            )
        } else {
            write!(
                f,
                "  result          INCOMPLETE: {} produced events were not consumed before the demo stopped",
                n.produced - n.consumed
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_count_records_beyond_the_first_per_event() {
        let s = Stats::new();
        s.produced.store(3, Ordering::Relaxed);
        s.consumed(1, Duration::from_millis(5));
        s.consumed(2, Duration::from_millis(10));
        s.consumed(2, Duration::from_millis(900));
        let snap = s.snapshot(Duration::from_secs(1));
        assert_eq!((snap.consumed, snap.duplicates, snap.lag()), (2, 1, 1));
        // The duplicate's latency is not a second sample.
        let max = snap.max_ms.unwrap();
        assert!((9.9..10.1).contains(&max), "{max}");
    }

    #[test]
    fn published_never_trails_consumed() {
        let s = Stats::new();
        s.produced.store(3, Ordering::Relaxed);
        s.published.store(1, Ordering::Relaxed);
        s.consumed(1, Duration::from_millis(1));
        s.consumed(2, Duration::from_millis(1));
        s.consumed(2, Duration::from_millis(1));
        assert_eq!(s.snapshot(Duration::from_secs(1)).published, 3);
        s.published.store(5, Ordering::Relaxed);
        assert_eq!(s.snapshot(Duration::from_secs(1)).published, 5);
    }

    #[test]
    fn summary_says_whether_everything_arrived() {
        let s = Stats::new();
        s.produced.store(2, Ordering::Relaxed);
        s.consumed(1, Duration::from_millis(1));
        let mut summary = Summary {
            numbers: s.snapshot(Duration::from_secs(2)),
            rate: 1,
            topic: "order.placed".into(),
            kafka: "embedded".into(),
            slot: "demo".into(),
            confirmed_lsn: Some("0/16B3748".into()),
            interrupted: false,
            cleanup: vec!["PostgreSQL stopped".into()],
        };
        assert!(!summary.all_consumed());
        assert!(summary.to_string().contains("INCOMPLETE: 1 produced events"));
        s.consumed(2, Duration::from_millis(1));
        summary.numbers = s.snapshot(Duration::from_secs(2));
        assert!(summary.to_string().contains("OK: all 2 produced events were consumed"));
    }
}
