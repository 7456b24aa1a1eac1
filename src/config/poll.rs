//! The `[poll]` section: settings of the polling relayer (`outbox-relay poll`).
//!
//! Parsed like every other section (`deny_unknown_fields`, numbers may be numeric strings so
//! `OUTBOX_RELAY__POLL__*` environment overrides work) and validated into [`PollSettings`] by
//! [`crate::config::Settings::validate`]. The CDC relay ignores this section.

use std::time::Duration;

use serde::Deserialize;

use crate::config::ident::Ident;
use crate::config::ConfigError;

/// Most rows one claim may hold. A batch is one transaction holding row locks while Kafka
/// acknowledges every row, and the producer's local queue is sized for it.
pub(crate) const MAX_BATCH_SIZE: u64 = 100_000;
/// Most concurrent claimers; each holds a PostgreSQL connection and a Kafka producer.
pub(crate) const MAX_WORKERS: u64 = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct PollSection {
    #[serde(deserialize_with = "crate::config::number_or_numeric_string")]
    pub(crate) interval_ms: u64,
    #[serde(deserialize_with = "crate::config::number_or_numeric_string")]
    pub(crate) batch_size: u64,
    #[serde(deserialize_with = "crate::config::number_or_numeric_string")]
    pub(crate) workers: u64,
    pub(crate) dispatched_column: String,
    #[serde(deserialize_with = "crate::config::number_or_numeric_string")]
    pub(crate) watchdog_interval_ms: u64,
    #[serde(deserialize_with = "crate::config::number_or_numeric_string")]
    pub(crate) stuck_after_ms: u64,
}

impl Default for PollSection {
    fn default() -> Self {
        PollSection {
            interval_ms: 100,
            batch_size: 100,
            workers: 1,
            dispatched_column: "dispatched_at".into(),
            watchdog_interval_ms: 10_000,
            stuck_after_ms: 300_000,
        }
    }
}

/// Validated `[poll]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollSettings {
    /// How long a worker sleeps after a claim that found fewer rows than `batch_size`.
    pub(crate) interval: Duration,
    /// Rows per claim (`LIMIT`).
    pub(crate) batch_size: usize,
    /// Concurrent claimers (`FOR UPDATE SKIP LOCKED` keeps their batches disjoint).
    pub(crate) workers: usize,
    /// Set to `now()` once a row was published; `NULL` means pending.
    pub(crate) dispatched: Ident,
    /// How often the pending rows are counted and the oldest one's age read (the watchdog).
    pub(crate) watchdog_interval: Duration,
    /// A pending row older than this is stuck: the watchdog warns.
    pub(crate) stuck_after: Duration,
}

impl PollSection {
    pub(crate) fn validate(self) -> Result<PollSettings, ConfigError> {
        let in_range = |key: &'static str, v: u64, max: u64| {
            if v == 0 || v > max {
                Err(ConfigError::Invalid {
                    key,
                    message: format!("is {v}; it must be between 1 and {max}"),
                })
            } else {
                Ok(v)
            }
        };
        let interval_ms = in_range("poll.interval_ms", self.interval_ms, 3_600_000)?;
        let batch_size = in_range("poll.batch_size", self.batch_size, MAX_BATCH_SIZE)?;
        let workers = in_range("poll.workers", self.workers, MAX_WORKERS)?;
        let dispatched =
            Ident::parse("poll.dispatched_column", &self.dispatched_column).map_err(|source| ConfigError::Name {
                key: "poll.dispatched_column",
                source,
            })?;
        let watchdog_interval_ms = in_range("poll.watchdog_interval_ms", self.watchdog_interval_ms, 3_600_000)?;
        let stuck_after_ms = in_range("poll.stuck_after_ms", self.stuck_after_ms, 86_400_000)?;
        Ok(PollSettings {
            interval: Duration::from_millis(interval_ms),
            batch_size: batch_size as usize,
            workers: workers as usize,
            dispatched,
            watchdog_interval: Duration::from_millis(watchdog_interval_ms),
            stuck_after: Duration::from_millis(stuck_after_ms),
        })
    }
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use super::PollSettings;
    use crate::config::test_support::{load, refusal};

    /// The keys the tests below set: interval, batch size, workers, dispatched column.
    fn knobs(p: &PollSettings) -> (Duration, usize, usize, &str) {
        (p.interval, p.batch_size, p.workers, p.dispatched.as_str())
    }

    #[test]
    fn defaults_without_a_poll_section() {
        let p = load("", &[]).unwrap().poll;
        assert_eq!(knobs(&p), (Duration::from_millis(100), 100, 1, "dispatched_at"));
    }

    #[test]
    fn file_values_and_env_overrides() {
        let p = load(
            "[poll]\ninterval_ms = 10\nbatch_size = 500\ndispatched_column = \"processed_at\"\n",
            &[("OUTBOX_RELAY__POLL__WORKERS", "3")],
        )
        .unwrap()
        .poll;
        assert_eq!(knobs(&p), (Duration::from_millis(10), 500, 3, "processed_at"));
    }

    #[test]
    fn a_quoted_mixed_case_column_keeps_its_case() {
        let p = load("[poll]\ndispatched_column = '\"SentAt\"'\n", &[]).unwrap().poll;
        assert_eq!(p.dispatched.as_str(), "SentAt");
        assert_eq!(p.dispatched.quoted(), "\"SentAt\"");
    }

    #[test]
    fn out_of_range_and_unknown_keys_are_errors() {
        for (extra, key) in [
            ("[poll]\nbatch_size = 0\n", "poll.batch_size"),
            ("[poll]\nbatch_size = 100001\n", "poll.batch_size"),
            ("[poll]\nworkers = 0\n", "poll.workers"),
            ("[poll]\ninterval_ms = 0\n", "poll.interval_ms"),
        ] {
            let err = refusal(extra, &[]);
            assert!(err.contains(key) && err.contains("between 1 and"), "{extra}: {err}");
        }
        let err = refusal("[poll]\nbatchsize = 5\n", &[]);
        assert!(err.contains("batchsize"), "{err}");
    }

    #[test]
    fn dispatched_column_must_be_an_identifier() {
        let err = refusal("[poll]\ndispatched_column = \"sent at; drop table x\"\n", &[]);
        assert!(err.contains("poll.dispatched_column"), "{err}");
        assert!(err.contains("double-quoted"), "{err}");
    }
}
