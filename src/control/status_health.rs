//! The verdict of `status`: ok / warn / critical, each finding as one sentence that says what
//! to do.
//!
//! Thresholds (also printed in `status --json` under `health.thresholds`):
//!
//! | finding | warn | critical |
//! |---|---|---|
//! | replication lag (walsender `flush_lag`) | ≥ `http.ready_max_lag_seconds` (60) | ≥ 10 × that |
//! | retained WAL (current LSN − `restart_lsn`) | ≥ `relay.retained_wal_warn_bytes` (1 GiB) | ≥ 4 × that |
//! | room before `max_slot_wal_keep_size` (`safe_wal_size`) | — | < 20 % of the slot's WAL budget |
//! | `wal_status` | `extended` | `unreserved` (invalidated at the next checkpoint), `lost` |
//! | slot | not active (no relay streaming) | missing, invalidated, not pgoutput |
//! | publication / server | — | publication missing or without the outbox table, `wal_level` ≠ logical |
//!
//! The lag in seconds is PostgreSQL's own measurement for the walsender streaming from the slot:
//! the time from WAL being written to the relay confirming it, i.e. including Kafka's
//! acknowledgement. PostgreSQL shows it only while there is recent traffic (`null` otherwise).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{human_bytes, ControlError};
use crate::postgres::slot::{hidden_from_sql, silent_seconds_sql, Silence};

/// Critical lag is this many times the warn (readiness) threshold.
pub(crate) const LAG_CRITICAL_FACTOR: u64 = 10;
/// Critical retained WAL is this many times the warn threshold.
pub(crate) const RETAINED_CRITICAL_FACTOR: u64 = 4;
/// Critical when less than this share of the slot's WAL budget (`max_slot_wal_keep_size`) is left.
pub(crate) const SAFE_WAL_CRITICAL_RATIO: f64 = 0.2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    Ok,
    Warn,
    Critical,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "OK",
            Verdict::Warn => "WARN",
            Verdict::Critical => "CRITICAL",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Thresholds {
    pub(crate) lag_warn_seconds: u64,
    pub(crate) lag_critical_seconds: u64,
    /// `null` when `relay.retained_wal_warn_bytes = 0` (retained WAL never warns).
    pub(crate) retained_wal_warn_bytes: Option<u64>,
    pub(crate) retained_wal_critical_bytes: Option<u64>,
    pub(crate) safe_wal_critical_ratio: f64,
}

impl Thresholds {
    pub(crate) fn new(ready_max_lag: Duration, retained_wal_warn_bytes: Option<u64>) -> Thresholds {
        let lag = ready_max_lag.as_secs().max(1);
        Thresholds {
            lag_warn_seconds: lag,
            lag_critical_seconds: lag.saturating_mul(LAG_CRITICAL_FACTOR),
            retained_wal_warn_bytes,
            retained_wal_critical_bytes: retained_wal_warn_bytes.map(|b| b.saturating_mul(RETAINED_CRITICAL_FACTOR)),
            safe_wal_critical_ratio: SAFE_WAL_CRITICAL_RATIO,
        }
    }
}

/// The `health` object of the status report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthStatus {
    pub(crate) verdict: Verdict,
    /// One sentence per finding, most severe first; empty when the verdict is ok.
    pub(crate) reasons: Vec<String>,
    /// Seconds from WAL written to confirmed by the relay (`pg_stat_replication.flush_lag` of the
    /// walsender streaming from the slot); `null` when none streams or there was no recent traffic.
    pub(crate) lag_seconds: Option<f64>,
    /// Seconds since the streaming relay's last status update; `null` when none streams or
    /// the server hides it ([`Self::details_hidden`]).
    pub(crate) last_status_update_seconds: Option<f64>,
    /// Why `lag_seconds` and `last_status_update_seconds` are unknown although a relay streams:
    /// the role cannot see the walsender's replies, and the statement that lets it; `null`
    /// otherwise.
    #[serde(default)]
    pub(crate) details_hidden: Option<String>,
    pub(crate) thresholds: Thresholds,
}

/// What the walsender streaming from the slot reports (`pg_stat_replication`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WalsenderLag {
    pub(crate) flush_lag_seconds: Option<f64>,
    /// Since its client's last status update: `Hidden` when this role may not see it.
    pub(crate) last_reply: Silence,
}

impl WalsenderLag {
    fn last_reply_seconds(&self) -> Option<f64> {
        match &self.last_reply {
            Silence::For(d) => Some(d.as_secs_f64()),
            Silence::Hidden { .. } | Silence::Unknown => None,
        }
    }

    /// The sentence for [`HealthStatus::details_hidden`].
    fn hidden(&self) -> Option<String> {
        match &self.last_reply {
            Silence::Hidden { role } => Some(format!(
                "role {role} cannot see the walsender's replies (pg_stat_replication.reply_time and flush_lag need \
                 the privileges of pg_read_all_stats): {}",
                crate::postgres::role::stats_grant(role)
            )),
            Silence::For(_) | Silence::Unknown => None,
        }
    }
}

pub(crate) async fn walsender_lag(client: &Client, pid: i32) -> Result<WalsenderLag, ControlError> {
    let row = client
        .query_opt(
            concat!(
                "SELECT EXTRACT(EPOCH FROM r.flush_lag)::float8, ",
                silent_seconds_sql!(),
                ", ",
                hidden_from_sql!(),
                " FROM pg_stat_replication r WHERE r.pid = $1"
            ),
            &[&pid],
        )
        .await
        .map_err(ControlError::query("reading pg_stat_replication"))?;
    Ok(row.map_or_else(WalsenderLag::default, |r| WalsenderLag {
        flush_lag_seconds: r.get(0),
        last_reply: Silence::from_columns(r.get(1), r.get(2)),
    }))
}

/// The facts the verdict is made of (a flat view of the status report).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Facts {
    pub(crate) slot_name: String,
    pub(crate) slot_exists: bool,
    pub(crate) slot_usable_plugin: bool,
    pub(crate) slot_active: bool,
    pub(crate) wal_status: Option<String>,
    pub(crate) retained_wal_bytes: Option<i64>,
    pub(crate) safe_wal_size: Option<i64>,
    pub(crate) wal_level_logical: bool,
    pub(crate) publication_ok: bool,
    pub(crate) lag: WalsenderLag,
    /// `[filter]` and the publication's row filter differ (`row_filter::verdict`'s sentence).
    pub(crate) filter_warning: Option<String>,
}

/// Pure: the verdict and its reasons.
pub(crate) fn assess(facts: &Facts, thresholds: Thresholds) -> HealthStatus {
    let mut found: Vec<(Verdict, String)> = Vec::new();
    let mut add = |v: Verdict, reason: String| found.push((v, reason));
    let slot = &facts.slot_name;
    if !facts.wal_level_logical {
        add(
            Verdict::Critical,
            "wal_level is not logical: set it in postgresql.conf and restart the server".into(),
        );
    }
    if !facts.publication_ok {
        add(
            Verdict::Critical,
            "the publication is missing or does not include every outbox table: new events are not captured; run \
             `outbox-relay setup`"
                .into(),
        );
    }
    if let Some(warning) = &facts.filter_warning {
        add(Verdict::Warn, warning.clone());
    }
    if !facts.slot_exists {
        add(
            Verdict::Critical,
            format!(
                "slot {slot} does not exist: run `outbox-relay setup`; if it existed before, it was dropped and \
                 events may be lost (docs/operations.md)"
            ),
        );
    } else if !facts.slot_usable_plugin {
        add(
            Verdict::Critical,
            format!("slot {slot} is not a pgoutput logical slot: the relay cannot use it"),
        );
    }
    match facts.wal_status.as_deref() {
        Some("lost") => add(
            Verdict::Critical,
            format!(
                "slot {slot} is invalidated (wal_status = lost): undelivered events may be lost; follow \"Slot \
                 invalidated\" in docs/operations.md"
            ),
        ),
        Some("unreserved") => add(
            Verdict::Critical,
            format!(
                "slot {slot} is past max_slot_wal_keep_size (wal_status = unreserved): it is invalidated at the next \
                 checkpoint unless the relay catches up"
            ),
        ),
        Some("extended") => add(
            Verdict::Warn,
            format!("slot {slot} keeps WAL beyond max_wal_size (wal_status = extended)"),
        ),
        _ => {}
    }
    if let (Some(safe), Some(retained)) = (facts.safe_wal_size, facts.retained_wal_bytes) {
        let budget = safe.saturating_add(retained).max(1) as f64;
        if facts.wal_status.as_deref() != Some("lost") && (safe as f64) < budget * thresholds.safe_wal_critical_ratio {
            add(
                Verdict::Critical,
                format!(
                    "only {} of WAL left before max_slot_wal_keep_size invalidates slot {slot}",
                    human_bytes(safe.max(0))
                ),
            );
        }
    }
    if let (Some(retained), Some(warn)) = (facts.retained_wal_bytes, thresholds.retained_wal_warn_bytes) {
        let critical = thresholds.retained_wal_critical_bytes.unwrap_or(u64::MAX);
        let retained_u = retained.max(0) as u64;
        let level = if retained_u >= critical {
            Some((Verdict::Critical, critical))
        } else if retained_u >= warn {
            Some((Verdict::Warn, warn))
        } else {
            None
        };
        if let Some((v, limit)) = level {
            add(
                v,
                format!(
                    "slot {slot} retains {} of WAL (threshold {}): the relay is behind or stopped, and the server's \
                     disk fills until it catches up",
                    human_bytes(retained),
                    human_bytes(limit as i64)
                ),
            );
        }
    }
    if let Some(lag) = facts.lag.flush_lag_seconds {
        let level = if lag >= thresholds.lag_critical_seconds as f64 {
            Some((Verdict::Critical, thresholds.lag_critical_seconds))
        } else if lag >= thresholds.lag_warn_seconds as f64 {
            Some((Verdict::Warn, thresholds.lag_warn_seconds))
        } else {
            None
        };
        if let Some((v, limit)) = level {
            add(
                v,
                format!(
                    "the relay is {} behind (threshold {})",
                    human_seconds(lag),
                    human_seconds(limit as f64)
                ),
            );
        }
    }
    if facts.slot_exists && facts.wal_status.as_deref() != Some("lost") && !facts.slot_active {
        add(
            Verdict::Warn,
            format!("no relay is streaming from slot {slot}: events wait and WAL accumulates until one runs"),
        );
    }
    found.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
    HealthStatus {
        verdict: found.first().map_or(Verdict::Ok, |(v, _)| *v),
        reasons: found.into_iter().map(|(_, r)| r).collect(),
        lag_seconds: facts.lag.flush_lag_seconds,
        last_status_update_seconds: facts.lag.last_reply_seconds(),
        details_hidden: facts.lag.hidden(),
        thresholds,
    }
}

/// Seconds for people: `850 ms`, `12.3 s`, `5 min 3 s`, `2 h 5 min`.
pub(crate) fn human_seconds(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "unknown".into();
    }
    if seconds < 1.0 {
        return format!("{} ms", (seconds * 1000.0).round() as u64);
    }
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let whole = seconds.round() as u64;
    if whole < 3600 {
        return format!("{} min {} s", whole / 60, whole % 60);
    }
    format!("{} h {} min", whole / 3600, (whole % 3600) / 60)
}

impl HealthStatus {
    /// The human-readable block of `status`.
    pub(crate) fn render(&self, f: &mut String, lag_bytes: Option<i64>, retained: Option<i64>) -> fmt::Result {
        use fmt::Write as _;
        writeln!(f, "health: {}", self.verdict)?;
        let bytes = |b: Option<i64>| b.map_or_else(|| "unknown".to_owned(), human_bytes);
        let seconds = match (self.lag_seconds, &self.details_hidden) {
            (Some(s), _) => human_seconds(s),
            (None, Some(_)) => "time unknown (see below)".to_owned(),
            (None, None) => "no recent traffic".to_owned(),
        };
        writeln!(f, "  lag: {} of WAL, {seconds}", bytes(lag_bytes))?;
        let t = &self.thresholds;
        let limits = match (t.retained_wal_warn_bytes, t.retained_wal_critical_bytes) {
            (Some(w), Some(c)) => format!(
                " (warn at {}, critical at {})",
                human_bytes(w as i64),
                human_bytes(c as i64)
            ),
            _ => String::new(),
        };
        writeln!(f, "  retained WAL: {}{limits}", bytes(retained))?;
        if let Some(s) = self.last_status_update_seconds {
            writeln!(f, "  last status update from the relay: {} ago", human_seconds(s))?;
        } else if let Some(why) = &self.details_hidden {
            writeln!(f, "  last status update from the relay: unknown: {why}")?;
        }
        for r in &self.reasons {
            writeln!(f, "  - {r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Facts {
        Facts {
            slot_name: "outbox_relay".into(),
            slot_exists: true,
            slot_usable_plugin: true,
            slot_active: true,
            wal_status: Some("reserved".into()),
            retained_wal_bytes: Some(16 << 20),
            safe_wal_size: None,
            wal_level_logical: true,
            publication_ok: true,
            lag: WalsenderLag {
                flush_lag_seconds: Some(0.2),
                last_reply: Silence::For(Duration::from_millis(500)),
            },
            filter_warning: None,
        }
    }

    #[test]
    fn a_filter_mismatch_is_a_warning_with_its_sentence() {
        let facts = Facts {
            filter_warning: Some("the publication's row filter differs from [filter]".into()),
            ..healthy()
        };
        let health = assess(&facts, Thresholds::new(Duration::from_secs(30), None));
        assert_eq!(health.verdict, Verdict::Warn);
        assert!(
            health.reasons.iter().any(|r| r.contains("differs from [filter]")),
            "{:?}",
            health.reasons
        );
    }

    fn thresholds() -> Thresholds {
        Thresholds::new(Duration::from_secs(60), Some(1 << 30))
    }

    /// The verdict on [`healthy`] facts as `change` leaves them, under [`thresholds`].
    fn assessed(change: impl FnOnce(&mut Facts)) -> HealthStatus {
        let mut facts = healthy();
        change(&mut facts);
        assess(&facts, thresholds())
    }

    #[test]
    fn a_streaming_relay_with_little_wal_is_ok() {
        let h = assess(&healthy(), thresholds());
        assert_eq!(h.verdict, Verdict::Ok, "{:?}", h.reasons);
        assert!(h.reasons.is_empty());
    }

    #[test]
    fn retained_wal_warns_then_turns_critical() {
        let warn = assessed(|f| f.retained_wal_bytes = Some(2 << 30));
        assert_eq!(warn.verdict, Verdict::Warn);
        assert!(
            warn.reasons[0].contains("2.0 GiB") && warn.reasons[0].contains("1.0 GiB"),
            "{:?}",
            warn.reasons
        );
        let crit = assessed(|f| f.retained_wal_bytes = Some(5 << 30));
        assert_eq!(crit.verdict, Verdict::Critical);
        assert!(crit.reasons[0].contains("4.0 GiB"), "{:?}", crit.reasons);
    }

    #[test]
    fn lag_thresholds_follow_the_readiness_threshold() {
        let warn = assessed(|f| f.lag.flush_lag_seconds = Some(75.0));
        assert_eq!(warn.verdict, Verdict::Warn);
        assert!(warn.reasons[0].contains("1 min 15 s"), "{:?}", warn.reasons);
        let crit = assessed(|f| f.lag.flush_lag_seconds = Some(601.0));
        assert_eq!(crit.verdict, Verdict::Critical);
    }

    #[test]
    fn nearly_exhausted_or_lost_slots_are_critical_and_listed_first() {
        let near = Facts {
            safe_wal_size: Some(10 << 20),
            retained_wal_bytes: Some(90 << 20),
            slot_active: false,
            ..healthy()
        };
        let h = assess(&near, thresholds());
        assert_eq!(h.verdict, Verdict::Critical);
        assert!(h.reasons[0].contains("10.0 MiB of WAL left"), "{:?}", h.reasons);
        assert!(
            h.reasons.last().unwrap().contains("no relay is streaming"),
            "warnings after criticals"
        );
        let lost = assessed(|f| {
            f.wal_status = Some("lost".into());
            f.slot_active = false;
        });
        assert_eq!(lost.verdict, Verdict::Critical);
        assert_eq!(
            lost.reasons.len(),
            1,
            "a lost slot is not also 'not streaming': {:?}",
            lost.reasons
        );
        let missing = assessed(|f| {
            f.slot_exists = false;
            f.slot_active = false;
        });
        assert!(missing.reasons[0].contains("does not exist"));
    }

    #[test]
    fn an_idle_slot_without_a_relay_warns() {
        let h = assessed(|f| {
            f.slot_active = false;
            f.lag = WalsenderLag::default();
        });
        assert_eq!(h.verdict, Verdict::Warn);
        assert_eq!(h.lag_seconds, None);
    }

    #[test]
    fn seconds_read_like_a_person_would_say_them() {
        assert_eq!(human_seconds(0.25), "250 ms");
        assert_eq!(human_seconds(12.34), "12.3 s");
        assert_eq!(human_seconds(303.0), "5 min 3 s");
        assert_eq!(human_seconds(7500.0), "2 h 5 min");
        assert_eq!(human_seconds(f64::NAN), "unknown");
    }

    #[test]
    fn json_uses_lowercase_verdicts() {
        let h = assess(&healthy(), thresholds());
        let v = serde_json::to_value(&h).unwrap();
        assert_eq!(v["verdict"], "ok");
        assert_eq!(v["thresholds"]["lag_critical_seconds"], 600);
        assert_eq!(v["thresholds"]["retained_wal_critical_bytes"], 4u64 << 30);
    }
}
