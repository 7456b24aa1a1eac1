//! When streaming retention may remove anything: the replication slot's verdict.
//!
//! Invariant: rows are removed only once the slot's `confirmed_flush_lsn` passed the WAL
//! position read after they became visible, so everything that makes that position meaningless
//! closes the gate: no slot of that name in this database (dropped, never created, or a
//! failover without it), an invalidated slot (`wal_status = lost`, `invalidation_reason`), or a
//! slot no walsender holds (no relay streams, so nothing is being published). While the gate is
//! closed nothing is removed, and a partition detached and waiting is attached again.

use tokio_postgres::Client;

use crate::config::Settings;
use crate::postgres::lsn::Lsn;
use crate::postgres::slot::{read_slot, SlotRow};
use crate::retention::RetentionError;

/// The slot's verdict for retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Everything committed before this position was published.
    Open(Lsn),
    /// Nothing may be removed, and why (one sentence for the log).
    Closed(String),
}

/// Reads the slot (the same query as every other slot check, `src/postgres/slot.rs`).
pub(crate) async fn read(client: &Client, settings: &Settings) -> Result<Gate, RetentionError> {
    let slot = settings.postgres.slot.as_str();
    Ok(verdict(slot, read_slot(client, slot).await?.as_ref()))
}

/// The gate for the slot named `slot`, as `row` shows it (`None`: missing).
pub(crate) fn verdict(slot: &str, row: Option<&SlotRow>) -> Gate {
    let Some(row) = row else {
        return Gate::Closed(format!(
            "replication slot {slot:?} does not exist in this database: nothing tells which rows were published, \
             so none is removed until the slot is back (docs/operations.md, \"Slot missing\")"
        ));
    };
    if let Some(why) = row.invalidated() {
        return Gate::Closed(format!(
            "replication slot {slot:?} is invalidated ({why}): rows committed after its last confirmed position may \
             never have been published and may be needed to recover, so none is removed (docs/operations.md, \
             \"Slot invalidated\")"
        ));
    }
    if !row.active {
        return Gate::Closed(format!(
            "replication slot {slot:?} is held by no relay: nothing is being published, so nothing is removed until \
             a relay streams again"
        ));
    }
    match row.confirmed_flush_lsn {
        Some(lsn) => Gate::Open(lsn),
        None => Gate::Closed(format!("replication slot {slot:?} has no confirmed position yet")),
    }
}

#[cfg(test)]
mod tests {
    use super::{verdict, Gate};
    use crate::postgres::lsn::Lsn;
    use crate::postgres::slot::SlotRow;

    #[test]
    fn retention_gate_closes_for_a_missing_invalidated_or_unheld_slot() {
        let healthy = SlotRow {
            active: true,
            ..SlotRow::healthy(Lsn(0x1000))
        };
        assert_eq!(verdict("s", Some(&healthy)), Gate::Open(Lsn(0x1000)));
        let closed = |row: Option<&SlotRow>| match verdict("s", row) {
            Gate::Closed(why) => why,
            Gate::Open(lsn) => panic!("open at {lsn}"),
        };
        assert!(closed(None).contains("does not exist"));
        let lost = SlotRow {
            wal_status: Some("lost".into()),
            ..healthy.clone()
        };
        assert!(closed(Some(&lost)).contains("invalidated (wal_status = lost"));
        let pg17 = SlotRow {
            invalidation_reason: Some("rows_removed".into()),
            ..healthy.clone()
        };
        assert!(closed(Some(&pg17)).contains("invalidation_reason = rows_removed"));
        let idle = SlotRow {
            active: false,
            ..healthy.clone()
        };
        assert!(closed(Some(&idle)).contains("held by no relay"));
        let fresh = SlotRow {
            confirmed_flush_lsn: None,
            ..healthy
        };
        assert!(closed(Some(&fresh)).contains("no confirmed position"));
    }
}
