//! The `[retention]` section: how long published outbox rows are kept, and how they are removed.
//!
//! Off unless the section is present. Durations are written like `"7d"`, `"90s"` or `"1h30m"`
//! ([`parse_duration`]); numbers may be numeric strings so `OUTBOX_RELAY__RETENTION__*`
//! environment overrides work. Invariant: whatever is configured here, retention only ever
//! removes rows that were published (`src/retention/`, docs/reliability.md); these settings only
//! say how old a published row must be and how gently it is removed.

use std::time::Duration;

use serde::Deserialize;

use crate::config::ident::Ident;
use crate::config::{named, ConfigError};

/// The table in the outbox table's schema where retention records what it last removed, one row
/// per outbox table; `status` reads it. Named here because both `retention` and `control` need
/// it and neither may import the other.
pub(crate) const RECORD_TABLE: &str = "outbox_relay_retention";

/// Most rows one delete statement removes (one short transaction each).
pub(crate) const MAX_BATCH_SIZE: u64 = 100_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionSection {
    pub(crate) mode: String,
    pub(crate) keep: String,
    #[serde(default = "default_interval")]
    pub(crate) interval: String,
    #[serde(
        default = "default_batch_size",
        deserialize_with = "crate::config::number_or_numeric_string"
    )]
    pub(crate) batch_size: u64,
    #[serde(default = "default_lock_timeout")]
    pub(crate) lock_timeout: String,
    #[serde(default = "default_statement_timeout")]
    pub(crate) statement_timeout: String,
    /// The creation-time column rows are aged by (and partitioned by); unset: the outbox's
    /// `timestamp_column`, else `created_at`.
    pub(crate) timestamp_column: Option<String>,
    #[serde(default = "default_partition_width")]
    pub(crate) partition_width: String,
    #[serde(
        default = "default_partitions_ahead",
        deserialize_with = "crate::config::number_or_numeric_string"
    )]
    pub(crate) partitions_ahead: u64,
}

fn default_interval() -> String {
    "1m".into()
}
/// Small enough that the walsender decodes one batch's delete WAL in milliseconds (the stream
/// waits behind it: docs/benchmarks.md, "Retention").
fn default_batch_size() -> u64 {
    1_000
}
fn default_lock_timeout() -> String {
    "1s".into()
}
fn default_statement_timeout() -> String {
    "30s".into()
}
fn default_partition_width() -> String {
    "1d".into()
}
fn default_partitions_ahead() -> u64 {
    3
}

/// How rows leave the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionMode {
    /// `DELETE` in batches of `batch_size`.
    Delete,
    /// The outbox is partitioned by range of the timestamp column: partitions are created ahead
    /// and whole partitions are detached and dropped.
    Partitions,
}

impl RetentionMode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RetentionMode::Delete => "delete",
            RetentionMode::Partitions => "partitions",
        }
    }
}

/// Validated `[retention]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    pub(crate) mode: RetentionMode,
    /// A published row is removed once it is older than this.
    pub(crate) keep: Duration,
    /// How often retention runs.
    pub(crate) interval: Duration,
    /// Rows per delete statement.
    pub(crate) batch_size: usize,
    /// `lock_timeout` of retention's own connection: it gives up rather than queue behind writers.
    pub(crate) lock_timeout: Duration,
    /// `statement_timeout` of retention's own connection.
    pub(crate) statement_timeout: Duration,
    /// Explicit `retention.timestamp_column`; the column rows are aged by is
    /// `Settings::created_at_column` (this, else `outbox.timestamp_column`, else `created_at`).
    pub(crate) timestamp_column: Option<Ident>,
    /// Partitions mode: the range one partition covers (aligned to the Unix epoch, UTC).
    pub(crate) partition_width: Duration,
    /// Partitions mode: partitions kept created beyond the one holding now.
    pub(crate) partitions_ahead: u32,
}

impl RetentionSection {
    pub(crate) fn validate(self) -> Result<RetentionSettings, ConfigError> {
        let mode = match self.mode.as_str() {
            "delete" => RetentionMode::Delete,
            "partitions" => RetentionMode::Partitions,
            other => {
                return Err(ConfigError::Invalid {
                    key: "retention.mode",
                    message: format!(
                    "is {other:?}; it must be \"delete\" (rows in batches) or \"partitions\" (an outbox partitioned \
                         by range of its timestamp column); remove the [retention] section to keep every row"
                ),
                })
            }
        };
        let keep = duration(
            "retention.keep",
            &self.keep,
            Duration::from_secs(1),
            Duration::from_secs(3650 * 86_400),
        )?;
        let interval = duration(
            "retention.interval",
            &self.interval,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(ConfigError::Invalid {
                key: "retention.batch_size",
                message: format!("is {}; it must be between 1 and {MAX_BATCH_SIZE}", self.batch_size),
            });
        }
        let lock_timeout = duration(
            "retention.lock_timeout",
            &self.lock_timeout,
            Duration::from_millis(1),
            Duration::from_secs(600),
        )?;
        let statement_timeout = duration(
            "retention.statement_timeout",
            &self.statement_timeout,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )?;
        if lock_timeout > statement_timeout {
            return Err(ConfigError::Invalid {
                key: "retention.lock_timeout",
                message: format!(
                    "({}) is longer than retention.statement_timeout ({}): the statement would be cancelled first. \
                     Lower lock_timeout or raise statement_timeout",
                    self.lock_timeout, self.statement_timeout
                ),
            });
        }
        let timestamp_column = self
            .timestamp_column
            .as_deref()
            .map(|c| Ident::parse("retention.timestamp_column", c).map_err(named("retention.timestamp_column")))
            .transpose()?;
        let partition_width = duration(
            "retention.partition_width",
            &self.partition_width,
            Duration::from_secs(1),
            Duration::from_secs(366 * 86_400),
        )?;
        if partition_width.subsec_nanos() != 0 {
            return Err(ConfigError::Invalid {
                key: "retention.partition_width",
                message: format!("is {:?}; it must be a whole number of seconds", self.partition_width),
            });
        }
        if self.partitions_ahead == 0 || self.partitions_ahead > 1000 {
            return Err(ConfigError::Invalid {
                key: "retention.partitions_ahead",
                message: format!(
                    "is {}; it must be between 1 and 1000 (inserts fail once no partition covers their time)",
                    self.partitions_ahead
                ),
            });
        }
        if mode == RetentionMode::Partitions && keep < partition_width {
            return Err(ConfigError::Invalid {
                key: "retention.keep",
                message: format!(
                    "({}) is shorter than retention.partition_width ({}): a partition is only dropped once its whole \
                     range is older than keep, so keep at least one partition width",
                    self.keep, self.partition_width
                ),
            });
        }
        Ok(RetentionSettings {
            mode,
            keep,
            interval,
            batch_size: self.batch_size as usize,
            lock_timeout,
            statement_timeout,
            timestamp_column,
            partition_width,
            partitions_ahead: self.partitions_ahead as u32,
        })
    }
}

/// [`parse_duration`] for `key`, within `min ..= max`.
fn duration(key: &'static str, text: &str, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
    let d = parse_duration(text).map_err(|message| ConfigError::Invalid { key, message })?;
    if d < min || d > max {
        return Err(ConfigError::Invalid {
            key,
            message: format!("is {text:?}; it must be between {} and {}", show(min), show(max)),
        });
    }
    Ok(d)
}

/// A duration as the config writes it: `604800 s` as `7d`.
pub(crate) fn show(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms.is_multiple_of(86_400_000) => format!("{}d", ms / 86_400_000),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// A duration written as one or more `<whole number><unit>` parts, e.g. `"7d"`, `"90s"`,
/// `"1h30m"`, `"500ms"`; units `ms`, `s`, `m`, `h`, `d`, `w`. A bare number is refused: a unit
/// that had to be guessed is how a 7-second retention happens.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let hint = "write a whole number with a unit, e.g. \"7d\", \"12h\", \"90s\", \"1h30m\" or \"500ms\" \
                (units: ms, s, m, h, d, w)";
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("is empty; {hint}"));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("{text:?} is not a duration; {hint}"));
        }
        let number: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?} is too large; {hint}"))?;
        rest = &rest[digits..];
        let unit_len = rest.chars().take_while(char::is_ascii_alphabetic).count();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "" => return Err(format!("{text:?} has a number without a unit; {hint}")),
            other => return Err(format!("{text:?} has an unknown unit {other:?}; {hint}")),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v <= u64::MAX as u128)
            .ok_or_else(|| format!("{text:?} is too large; {hint}"))?;
    }
    Ok(Duration::from_millis(total as u64))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{parse_duration, RetentionMode};
    use crate::config::test_support::{load, refusal};

    #[test]
    fn retention_durations_parse_with_units() {
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5_400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration(" 2w ").unwrap(), Duration::from_secs(14 * 86_400));
        for bad in ["", "7", "7 days", "d7", "7x", "1.5h", "-1d", "99999999999999999999d"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("\"7d\""), "{bad:?}: {err}");
        }
    }

    #[test]
    fn retention_is_off_without_the_section_and_defaults_apply() {
        assert!(load("", &[]).unwrap().retention.is_none());
        let settings = load("[retention]\nmode = \"delete\"\nkeep = \"7d\"\n", &[]).unwrap();
        assert_eq!(settings.created_at_column().0.as_str(), "created_at");
        let r = settings.retention.unwrap();
        assert_eq!(r.mode, RetentionMode::Delete);
        assert_eq!(r.keep, Duration::from_secs(7 * 86_400));
        assert_eq!(r.interval, Duration::from_secs(60));
        assert_eq!(r.batch_size, 1_000);
        assert_eq!(r.lock_timeout, Duration::from_secs(1));
        assert_eq!(r.statement_timeout, Duration::from_secs(30));
        assert_eq!(r.partition_width, Duration::from_secs(86_400));
        assert_eq!(r.partitions_ahead, 3);
    }

    #[test]
    fn retention_env_overrides_apply() {
        let settings = load(
            "[retention]\nmode = \"partitions\"\nkeep = \"7d\"\n",
            &[
                ("OUTBOX_RELAY__RETENTION__BATCH_SIZE", "250"),
                ("OUTBOX_RELAY__RETENTION__KEEP", "30d"),
                ("OUTBOX_RELAY__RETENTION__TIMESTAMP_COLUMN", "inserted_at"),
            ],
        )
        .unwrap();
        assert_eq!(settings.created_at_column().0.as_str(), "inserted_at");
        let r = settings.retention.unwrap();
        assert_eq!(r.mode, RetentionMode::Partitions);
        assert_eq!(r.batch_size, 250);
        assert_eq!(r.keep, Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn retention_bad_values_are_refused_naming_the_key() {
        for (extra, key, says) in [
            ("mode = \"truncate\"\nkeep = \"7d\"\n", "retention.mode", "\"delete\""),
            ("mode = \"delete\"\n", "keep", "missing"),
            ("mode = \"delete\"\nkeep = \"7\"\n", "retention.keep", "without a unit"),
            ("mode = \"delete\"\nkeep = \"0s\"\n", "retention.keep", "between 1s"),
            (
                "mode = \"delete\"\nkeep = \"7d\"\ninterval = \"2d\"\n",
                "retention.interval",
                "between",
            ),
            (
                "mode = \"delete\"\nkeep = \"7d\"\nbatch_size = 0\n",
                "retention.batch_size",
                "between 1",
            ),
            (
                "mode = \"delete\"\nkeep = \"7d\"\nlock_timeout = \"1m\"\nstatement_timeout = \"10s\"\n",
                "retention.lock_timeout",
                "statement_timeout",
            ),
            (
                "mode = \"partitions\"\nkeep = \"1h\"\npartition_width = \"1d\"\n",
                "retention.keep",
                "partition_width",
            ),
            (
                "mode = \"partitions\"\nkeep = \"7d\"\npartitions_ahead = 0\n",
                "retention.partitions_ahead",
                "between",
            ),
            (
                "mode = \"delete\"\nkeep = \"7d\"\ntimestamp_column = \"a b\"\n",
                "retention.timestamp_column",
                "",
            ),
            (
                "mode = \"delete\"\nkeep = \"7d\"\nkeep_for = \"1d\"\n",
                "keep_for",
                "unknown field",
            ),
        ] {
            let err = refusal(&format!("[retention]\n{extra}"), &[]);
            assert!(err.contains(key) && err.contains(says), "{extra}: {err}");
        }
    }
}
