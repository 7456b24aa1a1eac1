//! Reading the relay's slot: before streaming, right after `START_REPLICATION`, periodically
//! (the slot monitor), and when a standby decides whether to take over.
//!
//! The row and the query are the adapter's ([`crate::postgres::slot`]), the same `status`, `setup`
//! and `teardown` use; what the relay decides from them lives here.
//!
//! Invariants:
//! * **A slot is never created or recreated here.** Missing → [`RelayError::SlotMissing`];
//!   invalidated → [`RelayError::SlotLost`]. Both are fatal: a fresh slot would start at the
//!   current WAL position and the events in the lost stretch would vanish without a trace.
//! * **The server never skips WAL behind the relay's back.** `START_REPLICATION` from a position
//!   older than the slot's `confirmed_flush_lsn` silently starts at the latter. Right after
//!   streaming starts (when no one else can move the slot any more) [`verify_start`] re-reads
//!   the slot; if it moved past the position this session asked for, something else consumed
//!   that WAL and the relay refuses to continue ([`RelayError::SlotAdvanced`]).
//! * **Only a stale walsender is ever terminated**, and only when the operator opted in
//!   (`takeover_after_ms`) or when it is this process's own previous walsender. The staleness
//!   test and the termination are one SQL statement, so a holder that just recovered is spared,
//!   and a holder whose replies this role cannot see (no `pg_read_all_stats`) is never stale.

use std::time::Duration;

use tokio_postgres::Client;

use super::error::RelayError;
use crate::postgres::lsn::Lsn;
use crate::postgres::slot::silent_seconds_sql;
pub(crate) use crate::postgres::slot::{SlotHolder, SlotRow};

/// The slot's row, or `None` if this database has no slot of that name (the one shared query,
/// [`crate::postgres::slot`], so `run` and `status` always agree).
pub(crate) async fn read_slot(client: &Client, slot: &str) -> Result<Option<SlotRow>, RelayError> {
    Ok(crate::postgres::slot::read_slot(client, slot).await?)
}

/// What a session may start from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartPoint {
    pub(crate) confirmed_flush: Lsn,
}

/// Decides whether streaming may start from this slot: the checks that are fatal (missing,
/// wrong kind, invalidated) and the one that means "stand by" (another process holds it).
pub(crate) fn check_for_start(slot: &str, row: Option<SlotRow>) -> Result<StartPoint, RelayError> {
    let Some(row) = row else {
        return Err(RelayError::SlotMissing { slot: slot.to_owned() });
    };
    if row.slot_type != "logical" {
        return Err(RelayError::PhysicalSlot { slot: slot.to_owned() });
    }
    // Another plugin's slot — Debezium's made with plugin.name = decoderbufs, say — sends frames
    // pgoutput's decoder cannot read; refusing before streaming says why instead of failing on
    // the first undecodable message.
    if row.plugin.as_deref() != Some("pgoutput") {
        return Err(RelayError::WrongSlotPlugin {
            slot: slot.to_owned(),
            plugin: row.plugin.unwrap_or_default(),
        });
    }
    let confirmed_flush = row.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
    if let Some(cause) = row.invalidated() {
        return Err(RelayError::SlotLost {
            slot: slot.to_owned(),
            confirmed: confirmed_flush,
            cause,
        });
    }
    if let Some(holder) = row.holder {
        return Err(RelayError::SlotBusy {
            slot: slot.to_owned(),
            holder,
        });
    }
    Ok(StartPoint { confirmed_flush })
}

/// After `START_REPLICATION` from `requested`: the slot must not have moved past it (see the
/// module docs). `requested` zero means "wherever the slot is" and is not checked.
pub(crate) fn check_started(slot: &str, requested: Lsn, row: Option<&SlotRow>) -> Result<(), RelayError> {
    let confirmed = row.and_then(|r| r.confirmed_flush_lsn).unwrap_or(Lsn::ZERO);
    if !requested.is_zero() && confirmed > requested {
        return Err(RelayError::SlotAdvanced {
            slot: slot.to_owned(),
            requested,
            confirmed,
        });
    }
    Ok(())
}

/// Re-reads the slot right after streaming started and applies [`check_started`].
pub(crate) async fn verify_start(client: &Client, slot: &str, requested: Lsn) -> Result<(), RelayError> {
    let row = read_slot(client, slot).await?;
    check_started(slot, requested, row.as_ref())
}

/// Terminates the walsender `pid` if it still holds `slot` and has been silent for at least
/// `min_silence` (`None`: no silence required — only for this process's own old walsender).
/// A silence this role cannot see is never long enough. Returns whether a backend was
/// terminated.
pub(crate) async fn terminate_holder(
    client: &Client,
    slot: &str,
    pid: i32,
    min_silence: Option<Duration>,
) -> Result<bool, RelayError> {
    let min_secs = min_silence.map(|d| d.as_secs_f64());
    let row = client
        .query_opt(
            concat!(
                "SELECT pg_terminate_backend(s.active_pid)
                   FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
                  WHERE s.slot_name = $1 AND s.active_pid = $2
                    AND ($3::float8 IS NULL OR ",
                silent_seconds_sql!(),
                " >= $3::float8)"
            ),
            &[&slot, &pid, &min_secs],
        )
        .await?;
    Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `msg` names every one of `needles`.
    fn assert_names(msg: &str, needles: &[&str]) {
        for needle in needles {
            assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        }
    }

    fn row() -> SlotRow {
        SlotRow {
            restart_lsn: Some(Lsn(0x800)),
            ..SlotRow::healthy(Lsn(0x1000))
        }
    }

    #[test]
    fn a_free_healthy_slot_starts_at_its_confirmed_position() {
        assert_eq!(
            check_for_start("s", Some(row())).unwrap(),
            StartPoint {
                confirmed_flush: Lsn(0x1000)
            }
        );
    }

    #[test]
    fn missing_and_lost_slots_are_fatal_with_recovery_steps() {
        let missing = check_for_start("s", None).unwrap_err();
        assert!(matches!(missing, RelayError::SlotMissing { .. }) && !missing.is_transient());
        let lost = check_for_start(
            "s",
            Some(SlotRow {
                wal_status: Some("lost".into()),
                ..row()
            }),
        )
        .unwrap_err();
        assert!(!lost.is_transient());
        let msg = lost.to_string();
        assert_names(
            &msg,
            &[
                "invalidated",
                "wal_status = lost",
                "0/1000",
                "teardown",
                "setup",
                "never recreates",
            ],
        );
        let pg17 = SlotRow {
            invalidation_reason: Some("wal_removed".into()),
            ..row()
        };
        assert!(check_for_start("s", Some(pg17))
            .unwrap_err()
            .to_string()
            .contains("wal_removed"));
    }

    #[test]
    fn a_slot_of_another_plugin_is_fatal_and_names_the_plugin_and_the_way_out() {
        let decoderbufs = SlotRow {
            plugin: Some("decoderbufs".into()),
            ..row()
        };
        let err = check_for_start("debezium", Some(decoderbufs)).unwrap_err();
        assert!(
            matches!(err, RelayError::WrongSlotPlugin { .. }) && !err.is_transient(),
            "{err}"
        );
        let msg = err.to_string();
        assert_names(
            &msg,
            &[
                "uses output plugin decoderbufs",
                "needs pgoutput",
                "postgres.slot",
                "outbox-relay setup",
                "docs/migrating-from-debezium.md",
                "pg_drop_replication_slot('debezium')",
            ],
        );
        let physical = SlotRow {
            slot_type: "physical".into(),
            plugin: None,
            ..row()
        };
        let err = check_for_start("s", Some(physical)).unwrap_err();
        assert!(
            matches!(err, RelayError::PhysicalSlot { .. }) && !err.is_transient(),
            "{err}"
        );
    }

    #[test]
    fn a_held_slot_means_standing_by_and_names_the_holder() {
        let holder = SlotHolder {
            pid: Some(4242),
            application_name: Some("outbox-relay".into()),
            client: Some("10.0.0.7:51234".into()),
            silence: crate::postgres::slot::Silence::For(Duration::from_millis(1500)),
        };
        let err = check_for_start(
            "s",
            Some(SlotRow {
                holder: Some(holder.clone()),
                ..row()
            }),
        )
        .unwrap_err();
        assert!(err.is_transient() && err.is_slot_busy());
        assert_eq!(err.slot_holder(), Some(holder));
        assert!(
            err.to_string()
                .contains("walsender pid 4242 (outbox-relay at 10.0.0.7:51234), last status update 1.5 s ago"),
            "{err}"
        );
    }

    #[test]
    fn a_slot_moved_past_the_requested_start_is_refused() {
        let moved = SlotRow {
            confirmed_flush_lsn: Some(Lsn(0x2000)),
            ..row()
        };
        let err = check_started("s", Lsn(0x1000), Some(&moved)).unwrap_err();
        assert!(
            matches!(err, RelayError::SlotAdvanced { .. }) && !err.is_transient(),
            "{err}"
        );
        assert!(err.to_string().contains("0/1000") && err.to_string().contains("0/2000"));
        assert!(check_started("s", Lsn(0x1000), Some(&row())).is_ok());
        assert!(
            check_started("s", Lsn(0x3000), Some(&moved)).is_ok(),
            "behind the request is fine"
        );
        assert!(check_started("s", Lsn::ZERO, Some(&moved)).is_ok());
    }
}
