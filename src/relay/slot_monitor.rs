//! Periodic slot health: one task per process, active or standby, every
//! `relay.slot_check_interval_ms`.
//!
//! It reads `pg_replication_slots` over its own control connection (so a slow catalog query never
//! delays the event loop's status updates), exports the retained WAL as a gauge, feeds `/readyz`,
//! warns when the slot keeps more WAL than `relay.retained_wal_warn_bytes` or is about to be
//! invalidated, and publishes a [`SlotVerdict`] on a watch channel. The streaming session ends on
//! a fatal verdict (slot lost or gone); a standby learns the same at its next attempt.
//!
//! Check failures (server down, connection lost) are not fatal: they are logged once per streak
//! and make the standby not ready; the session's own connection decides about reconnecting.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_postgres::Client;
use tracing::{error, info, warn};

use super::error::{InternalError, RelayError};
use super::slot::{read_slot, SlotRow};
use crate::config::Settings;
use crate::ops::health::RelayHealth;
use crate::ops::metrics;
use crate::ops::units::human_bytes;
use crate::postgres::client as pg_client;
use crate::postgres::lsn::Lsn;

/// While a warning condition lasts, it is repeated this often (not at every check).
const WARN_REPEAT: Duration = Duration::from_secs(300);

/// What the last check found.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum SlotVerdict {
    /// Not checked yet, or the last check failed.
    #[default]
    Unknown,
    Healthy,
    Missing,
    Lost {
        confirmed: Lsn,
        cause: String,
    },
}

impl SlotVerdict {
    /// The fatal error this verdict means for a streaming session, if any.
    pub(crate) fn fatal(&self, slot: &str) -> Option<RelayError> {
        match self {
            SlotVerdict::Missing => Some(RelayError::SlotMissing { slot: slot.to_owned() }),
            SlotVerdict::Lost { confirmed, cause } => Some(RelayError::SlotLost {
                slot: slot.to_owned(),
                confirmed: *confirmed,
                cause: cause.clone(),
            }),
            SlotVerdict::Unknown | SlotVerdict::Healthy => None,
        }
    }
}

/// One check's findings: the verdict and the warnings worth logging.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assessment {
    pub(crate) verdict: SlotVerdict,
    pub(crate) warnings: Vec<String>,
}

/// Pure: what a slot row means, given the retained-WAL warning threshold.
pub(crate) fn assess(row: Option<&SlotRow>, retained_warn_bytes: Option<u64>) -> Assessment {
    let Some(row) = row else {
        return Assessment {
            verdict: SlotVerdict::Missing,
            warnings: Vec::new(),
        };
    };
    if let Some(cause) = row.invalidated() {
        let confirmed = row.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
        return Assessment {
            verdict: SlotVerdict::Lost { confirmed, cause },
            warnings: Vec::new(),
        };
    }
    let mut warnings = Vec::new();
    if let (Some(retained), Some(limit)) = (row.retained_wal_bytes, retained_warn_bytes) {
        if retained >= 0 && retained as u64 >= limit {
            warnings.push(format!(
                "the slot retains {} of WAL (relay.retained_wal_warn_bytes = {}): the relay is behind or stuck, \
                 and the server's disk fills until it catches up",
                human_bytes(retained),
                human_bytes(limit as i64)
            ));
        }
    }
    if row.wal_status.as_deref() == Some("unreserved") {
        let safe = row.safe_wal_size.map_or_else(|| "unknown".to_owned(), human_bytes);
        warnings.push(format!(
            "wal_status = unreserved: the slot is past max_slot_wal_keep_size and will be invalidated at the next \
             checkpoint unless the relay catches up (safe_wal_size {safe})"
        ));
    }
    Assessment {
        verdict: SlotVerdict::Healthy,
        warnings,
    }
}

/// The monitor task; dropping it stops the checks.
pub(crate) struct SlotMonitor(JoinHandle<()>);

impl Drop for SlotMonitor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn spawn(settings: &Settings, health: Arc<RelayHealth>) -> (SlotMonitor, watch::Receiver<SlotVerdict>) {
    let (tx, rx) = watch::channel(SlotVerdict::Unknown);
    let settings = settings.clone();
    let task = tokio::spawn(async move {
        let mut monitor = Monitor {
            settings,
            health,
            tx,
            client: None,
            failing: false,
            last_warned: None,
        };
        let mut tick = tokio::time::interval(monitor.settings.relay.slot_check_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            monitor.check().await;
        }
    });
    (SlotMonitor(task), rx)
}

struct Monitor {
    settings: Settings,
    health: Arc<RelayHealth>,
    tx: watch::Sender<SlotVerdict>,
    client: Option<Client>,
    failing: bool,
    last_warned: Option<Instant>,
}

impl Monitor {
    async fn check(&mut self) {
        let limit = self.settings.relay.connect_timeout;
        let row = match tokio::time::timeout(limit, self.read()).await {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => return self.failed(e.to_string()),
            Err(_) => return self.failed(format!("no answer within {limit:?}")),
        };
        if std::mem::take(&mut self.failing) {
            info!("slot checks work again");
        }
        if let Some(bytes) = row.as_ref().and_then(|r| r.retained_wal_bytes) {
            ::metrics::gauge!(metrics::SLOT_RETAINED_WAL_BYTES).set(bytes as f64);
            self.health.set_retained_wal_bytes(bytes);
        }
        if let Some(ready) = self.failover_ready().await {
            ::metrics::gauge!(metrics::SLOT_FAILOVER_READY).set(if ready { 1.0 } else { 0.0 });
        }
        let found = assess(row.as_ref(), self.settings.relay.retained_wal_warn_bytes);
        self.warn(&found.warnings);
        let slot = self.settings.postgres.slot.as_str();
        match found.verdict.fatal(slot) {
            Some(fatal) => {
                error!(slot, "{fatal}");
                self.health.set_slot_check(Err(fatal.to_string()));
            }
            None => self.health.set_slot_check(Ok(())),
        }
        self.tx
            .send_if_modified(|v| std::mem::replace(v, found.verdict.clone()) != found.verdict);
    }

    async fn read(&mut self) -> Result<Option<SlotRow>, RelayError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let timeout = self.settings.relay.connect_timeout;
            self.client = Some(pg_client::connect(&self.settings.postgres, timeout).await?);
        }
        let client = self.client.as_ref().ok_or(InternalError::NoControlConnection)?;
        read_slot(client, self.settings.postgres.slot.as_str()).await
    }

    /// Whether the slot would survive a promotion, as far as the primary can tell: a failover
    /// slot (17+), `synchronized_standby_slots` set, and every slot it names streaming. `None`
    /// when the question failed (the slot check reports connection trouble) or has no answer:
    /// before 17 there are no failover slots, and a gauge stuck at 0 there would only keep the
    /// not-failover-ready alert firing forever, so the gauge is not exported at all.
    async fn failover_ready(&self) -> Option<bool> {
        let client = self.client.as_ref()?;
        let slot = self.settings.postgres.slot.as_str();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&slot];
        let ready = client.query_one(
            "SELECT CASE WHEN current_setting('server_version_num')::int < 170000 THEN NULL ELSE
                COALESCE((SELECT (to_jsonb(s) ->> 'failover')::bool FROM pg_replication_slots s
                          WHERE s.slot_name = $1), false)
                AND COALESCE(current_setting('synchronized_standby_slots', true), '') <> ''
                AND NOT EXISTS (
                    SELECT 1 FROM unnest(string_to_array(
                        replace(current_setting('synchronized_standby_slots', true), ' ', ''), ',')) AS n(name)
                    WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots p
                                      WHERE p.slot_name = n.name AND p.active)) END",
            &params,
        );
        let limit = self.settings.relay.connect_timeout;
        match tokio::time::timeout(limit, ready).await {
            Ok(Ok(row)) => row.get(0),
            _ => None,
        }
    }

    fn failed(&mut self, error: String) {
        self.client = None;
        if !std::mem::replace(&mut self.failing, true) {
            warn!(slot = %self.settings.postgres.slot, error, "cannot check the slot's health; retrying every interval");
        }
        self.health
            .set_slot_check(Err(format!("cannot read pg_replication_slots: {error}")));
        self.tx
            .send_if_modified(|v| std::mem::replace(v, SlotVerdict::Unknown) != SlotVerdict::Unknown);
    }

    fn warn(&mut self, warnings: &[String]) {
        if warnings.is_empty() {
            self.last_warned = None;
            return;
        }
        if self.last_warned.is_some_and(|t| t.elapsed() < WARN_REPEAT) {
            return;
        }
        self.last_warned = Some(Instant::now());
        for w in warnings {
            warn!(slot = %self.settings.postgres.slot, "{w}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> SlotRow {
        SlotRow {
            retained_wal_bytes: Some(4096),
            ..SlotRow::healthy(Lsn(0x5000))
        }
    }

    #[test]
    fn healthy_slot_below_the_threshold_is_quiet() {
        assert_eq!(
            assess(Some(&row()), Some(1 << 20)),
            Assessment {
                verdict: SlotVerdict::Healthy,
                warnings: vec![]
            }
        );
    }

    #[test]
    fn retained_wal_above_the_threshold_warns_in_human_units() {
        let big = SlotRow {
            retained_wal_bytes: Some(3 << 30),
            ..row()
        };
        let a = assess(Some(&big), Some(1 << 30));
        assert_eq!(a.verdict, SlotVerdict::Healthy);
        assert_eq!(a.warnings.len(), 1);
        assert!(
            a.warnings[0].contains("3.0 GiB") && a.warnings[0].contains("1.0 GiB"),
            "{:?}",
            a.warnings
        );
        assert!(
            assess(Some(&big), None).warnings.is_empty(),
            "threshold 0 disables the warning"
        );
    }

    #[test]
    fn unreserved_warns_and_lost_or_missing_are_fatal() {
        let unreserved = SlotRow {
            wal_status: Some("unreserved".into()),
            safe_wal_size: Some(-1024),
            ..row()
        };
        assert!(assess(Some(&unreserved), None).warnings[0].contains("next checkpoint"));
        let lost = assess(
            Some(&SlotRow {
                wal_status: Some("lost".into()),
                ..row()
            }),
            None,
        );
        let fatal = lost.verdict.fatal("s").expect("lost is fatal");
        assert!(fatal.to_string().contains("0/5000"), "{fatal}");
        assert!(matches!(
            assess(None, None).verdict.fatal("s"),
            Some(RelayError::SlotMissing { .. })
        ));
        assert!(SlotVerdict::Unknown.fatal("s").is_none());
    }
}
