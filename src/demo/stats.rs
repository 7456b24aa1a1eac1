//! What the demo measures, the live progress line, and the closing summary.
//!
//! Latency is shown in the parts a reader can attribute, all measured in this process (so the
//! clocks agree):
//! - **order placed → consumed**, end to end: the producer stamps the wall-clock time into each
//!   payload before its `BEGIN`, the consumer subtracts it from the time it reads the record;
//! - **order placed → committed**: the producer's own transaction (`BEGIN`, the order's
//!   `INSERT`, the outbox `INSERT`, `COMMIT`: four round trips to PostgreSQL), which any outbox
//!   pays whatever relays it;
//! - **committed → consumed**: from the moment `COMMIT` returned to the producer to the consumer
//!   reading the record: the walsender's wake-up, the relay, the broker and the consumer's fetch;
//! - **commit → acknowledged**: the relay's own window, as it serves it at `GET /latency`
//!   (`ops::latency`): from the commit timestamp in the WAL to the broker's acknowledgement.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;

use crate::ops::latency::LatencySummary;
use crate::sink::demo::Tally;

/// Counters shared by the producer tasks, the consumer thread and the progress printer.
pub(crate) struct Stats {
    pub(crate) produced: AtomicU64,
    /// Records in the demo's stream since the demo started, as the broker reports them (NATS:
    /// the run's stream; Redis: the run's stream key; Kafka and RabbitMQ: nothing, the relay's own
    /// count of acknowledgements stands for it). Shown as at least the events the relay saw
    /// acknowledged and the records consumed.
    pub(crate) published: AtomicU64,
    pub(crate) consumed_records: AtomicU64,
    consumed_ids: Mutex<HashSet<i64>>,
    /// Order placed → consumed.
    latency_us: Mutex<Histogram<u64>>,
    /// Order placed → committed (the producer's transaction).
    transaction_us: Mutex<Histogram<u64>>,
    /// Committed → consumed.
    after_commit_us: Mutex<Histogram<u64>>,
    /// When `COMMIT` returned, per outbox event id (µs since the epoch), until it is consumed.
    committed_at_us: Mutex<HashMap<i64, i64>>,
}

fn new_histogram() -> Mutex<Histogram<u64>> {
    // 1 µs .. 1 h, 3 significant digits.
    Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"))
}

fn record(h: &Mutex<Histogram<u64>>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).clamp(1, 3_600_000_000);
    let _ = h.lock().unwrap_or_else(|e| e.into_inner()).record(us);
}

/// p50 / p99 / max of a histogram, in ms (`None` while empty).
fn quantiles(h: &Mutex<Histogram<u64>>) -> Quantiles {
    let h = h.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1000.0);
    Quantiles {
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: (!h.is_empty()).then(|| h.max() as f64 / 1000.0),
    }
}

/// p50 / p99 / max in ms.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Quantiles {
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
}

impl fmt::Display for Quantiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>9} {:>9} {:>9}",
            ms(self.p50_ms),
            ms(self.p99_ms),
            ms(self.max_ms)
        )
    }
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            produced: AtomicU64::new(0),
            published: AtomicU64::new(0),
            consumed_records: AtomicU64::new(0),
            consumed_ids: Mutex::new(HashSet::new()),
            latency_us: new_histogram(),
            transaction_us: new_histogram(),
            after_commit_us: new_histogram(),
            committed_at_us: Mutex::new(HashMap::new()),
        }
    }

    /// The producer's transaction for outbox event `event_id` committed at `committed_at_us`
    /// (µs since the epoch), `took` after the order was placed.
    pub(crate) fn committed(&self, event_id: i64, committed_at_us: i64, took: Duration) {
        record(&self.transaction_us, took);
        self.committed_at_us
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(event_id, committed_at_us);
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
            record(&self.latency_us, latency);
            let committed = self
                .committed_at_us
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&event_id);
            // None: read before its producer saw `COMMIT` return (the relay was faster than the
            // reply), or produced by an earlier run; no sample rather than a made-up one.
            if let Some(at) = committed {
                let now_us = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64);
                record(
                    &self.after_commit_us,
                    Duration::from_micros((now_us - at).max(0) as u64),
                );
            }
        }
    }

    /// Distinct events consumed.
    pub(crate) fn consumed_distinct(&self) -> u64 {
        self.consumed_ids.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    /// The numbers now, with the relay's own commit-to-acknowledgement window (`relay`: the
    /// process-wide one the relay records every acknowledgement into).
    pub(crate) fn snapshot(&self, elapsed: Duration, relay: &LatencySummary) -> Snapshot {
        let consumed_records = self.consumed_records.load(Ordering::Relaxed);
        let consumed = self.consumed_distinct();
        let end_to_end = quantiles(&self.latency_us);
        Snapshot {
            elapsed,
            produced: self.produced.load(Ordering::Relaxed),
            // The broker's count is refreshed now and then, and the relay counts an
            // acknowledgement once its batch of reports is handled, so either can trail what the
            // consumer already read; every record read was published, so the line never shows
            // fewer published than consumed.
            published: self
                .published
                .load(Ordering::Relaxed)
                .max(relay.count)
                .max(consumed_records),
            consumed,
            duplicates: consumed_records.saturating_sub(consumed),
            p50_ms: end_to_end.p50_ms,
            p99_ms: end_to_end.p99_ms,
            max_ms: end_to_end.max_ms,
            transaction: quantiles(&self.transaction_us),
            after_commit: quantiles(&self.after_commit_us),
            relay: Quantiles {
                p50_ms: relay.p50_ms,
                p99_ms: relay.p99_ms,
                max_ms: relay.max_ms,
            },
        }
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

/// What a sink's demo consumer counts into (`crate::sink::demo::Tally`): this run's [`Stats`].
pub(crate) struct RunTally {
    pub(crate) stats: Arc<Stats>,
    pub(crate) run_id: String,
}

impl Tally for RunTally {
    /// Counted when it carries an event id and a payload of this run (`run`), with its latency
    /// from the payload's `placed_at_us`.
    fn record(&self, id: Option<i64>, payload: Option<&[u8]>) -> bool {
        let payload: Option<serde_json::Value> = payload.and_then(|p| serde_json::from_slice(p).ok());
        let (Some(id), Some(payload)) = (id, payload) else {
            return false;
        };
        if payload.get("run").and_then(|r| r.as_str()) != Some(self.run_id.as_str()) {
            return false;
        }
        let placed_at_us = payload
            .get("placed_at_us")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0);
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        self.stats
            .consumed(id, Duration::from_micros((now_us - placed_at_us).max(0) as u64));
        true
    }

    fn published(&self, n: u64) {
        self.stats.published.store(n, Ordering::Relaxed);
    }

    fn published_one(&self) {
        self.stats.published.fetch_add(1, Ordering::Relaxed);
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
    /// Order placed → consumed.
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
    /// Order placed → committed: the producer's own transaction.
    pub(crate) transaction: Quantiles,
    /// Committed → consumed.
    pub(crate) after_commit: Quantiles,
    /// Commit → acknowledged, as the relay measures it.
    pub(crate) relay: Quantiles,
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
            "[{:>5.1}s] produced {} ({:.0}/s) | published {} | consumed {} | lag {} | relay commit->ack p50 {} p99 {} | placed->consumed p50 {} p99 {}",
            self.elapsed.as_secs_f64(),
            self.produced,
            self.produced as f64 / secs,
            self.published,
            self.consumed,
            self.lag(),
            ms(self.relay.p50_ms),
            ms(self.relay.p99_ms),
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
    /// The sink's server, as the summary names it (each sink's demo half says: "the embedded
    /// Kafka (…)", "NATS JetStream … (stream …)").
    pub(crate) sink: String,
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
            n.published, self.topic, self.sink
        )?;
        writeln!(
            f,
            "  consumed        {} distinct events, {} duplicates, {} missing",
            n.consumed,
            n.duplicates,
            n.produced.saturating_sub(n.consumed)
        )?;
        let end_to_end = Quantiles {
            p50_ms: n.p50_ms,
            p99_ms: n.p99_ms,
            max_ms: n.max_ms,
        };
        writeln!(f, "  latency                               p50       p99       max")?;
        writeln!(
            f,
            "    order placed -> consumed     {end_to_end}   end to end: the three parts below"
        )?;
        writeln!(
            f,
            "    order placed -> committed    {}   the producer's own transaction (BEGIN, 2 INSERTs, COMMIT: 4 round trips)",
            n.transaction
        )?;
        writeln!(
            f,
            "    committed -> consumed        {}   walsender wake-up, relay, broker, and the consumer's fetch",
            n.after_commit
        )?;
        writeln!(
            f,
            "    commit -> acknowledged       {}   the relay's part: WAL commit time to the broker's ack (GET /latency)",
            n.relay
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
        let snap = s.snapshot(Duration::from_secs(1), &LatencySummary::default());
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
        assert_eq!(
            s.snapshot(Duration::from_secs(1), &LatencySummary::default()).published,
            3
        );
        s.published.store(5, Ordering::Relaxed);
        assert_eq!(
            s.snapshot(Duration::from_secs(1), &LatencySummary::default()).published,
            5
        );
        // The relay's own count of acknowledgements counts as published too.
        let relay = LatencySummary {
            count: 7,
            ..LatencySummary::default()
        };
        assert_eq!(s.snapshot(Duration::from_secs(1), &relay).published, 7);
    }

    #[test]
    fn the_latency_is_shown_in_its_parts() {
        let s = Stats::new();
        s.produced.store(1, Ordering::Relaxed);
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
        // Committed 3 ms ago, 2 ms after the order was placed.
        s.committed(1, now_us - 3_000, Duration::from_millis(2));
        s.consumed(1, Duration::from_millis(5));
        // An event whose commit the producer never saw return: no committed -> consumed sample.
        s.consumed(2, Duration::from_millis(9));
        let relay = LatencySummary {
            count: 2,
            p50_ms: Some(0.8),
            p99_ms: Some(1.5),
            max_ms: Some(1.6),
            ..LatencySummary::default()
        };
        let snap = s.snapshot(Duration::from_secs(1), &relay);
        let t = snap.transaction.p50_ms.unwrap();
        assert!((1.99..2.01).contains(&t), "{t}");
        let after = snap.after_commit.max_ms.unwrap();
        assert!((2.9..50.0).contains(&after), "{after}");
        assert_eq!(snap.after_commit.p50_ms, snap.after_commit.max_ms, "one sample only");
        assert_eq!(snap.relay.p99_ms, Some(1.5));
        assert!(
            snap.to_string().contains("relay commit->ack p50 0.8 ms p99 1.5 ms"),
            "{snap}"
        );
        let summary = Summary {
            numbers: snap,
            rate: 1,
            topic: "order.placed".into(),
            sink: "embedded".into(),
            slot: "demo".into(),
            confirmed_lsn: None,
            interrupted: false,
            cleanup: vec![],
        };
        let text = summary.to_string();
        for part in [
            "order placed -> consumed",
            "order placed -> committed",
            "committed -> consumed",
            "commit -> acknowledged",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn summary_says_whether_everything_arrived() {
        let s = Stats::new();
        s.produced.store(2, Ordering::Relaxed);
        s.consumed(1, Duration::from_millis(1));
        let mut summary = Summary {
            numbers: s.snapshot(Duration::from_secs(2), &LatencySummary::default()),
            rate: 1,
            topic: "order.placed".into(),
            sink: "embedded".into(),
            slot: "demo".into(),
            confirmed_lsn: Some("0/16B3748".into()),
            interrupted: false,
            cleanup: vec!["PostgreSQL stopped".into()],
        };
        assert!(!summary.all_consumed());
        assert!(summary.to_string().contains("INCOMPLETE: 1 produced events"));
        s.consumed(2, Duration::from_millis(1));
        summary.numbers = s.snapshot(Duration::from_secs(2), &LatencySummary::default());
        assert!(summary.to_string().contains("OK: all 2 produced events were consumed"));
    }
}
