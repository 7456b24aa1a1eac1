//! Failover slots (PostgreSQL 17+): whether the relay's slot is one, what preflight says about
//! the physical standbys that would take over, and `status`'s view of each standby's copy.
//!
//! A failover slot (`FAILOVER` at creation, or `ALTER_REPLICATION_SLOT … (FAILOVER true)`) is
//! copied to every physical standby running with `sync_replication_slots = on` (and
//! `hot_standby_feedback = on`, `primary_slot_name`, a `dbname` in `primary_conninfo`). After a
//! promotion the copy is the relay's slot on the new primary, at a position no later than the
//! one the relay confirmed on the old primary, so the relay resumes there and loses nothing.
//! The primary's `synchronized_standby_slots` makes that true: without it the relay may confirm
//! (and so has published) WAL a standby never received, and after promoting that standby those
//! transactions do not exist any more — their events are in Kafka, but not in the new primary.
//!
//! Invariant: **nothing here fails `setup` except an explicit `failover_slot = "on"` on a server
//! that cannot have one**; everything else is a note that says what to configure.

use tokio_postgres::Client;

use super::catalog::{self, ServerInfo};
use super::ControlError;
use crate::config::postgres::FailoverSlot;

/// The first server with failover slots.
pub(crate) const FAILOVER_VERSION_NUM: i32 = 170_000;

/// Whether the slot should be a failover slot on this server (see `postgres.failover_slot`).
pub(crate) fn wants_failover(mode: FailoverSlot, server: &ServerInfo) -> Result<bool, ControlError> {
    let supported = server.version_num >= FAILOVER_VERSION_NUM;
    match mode {
        FailoverSlot::Auto => Ok(supported),
        FailoverSlot::Off => Ok(false),
        FailoverSlot::On if supported => Ok(true),
        FailoverSlot::On => Err(ControlError::FailoverUnsupported {
            version: server.version.clone(),
        }),
    }
}

/// The physical replication this primary feeds: walsenders that are not logical, and
/// physical slots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Standbys {
    /// `application_name` of each connected physical walsender.
    pub(crate) connected: Vec<String>,
    pub(crate) physical_slots: Vec<String>,
    /// `synchronized_standby_slots` (17+; empty when unset or older).
    pub(crate) synchronized_standby_slots: Vec<String>,
}

pub(crate) async fn standbys(client: &Client, server: &ServerInfo) -> Result<Standbys, ControlError> {
    // Physical walsenders are the ones not connected to a database.
    let connected = text_column(
        client,
        "SELECT COALESCE(r.application_name, '')::text FROM pg_stat_replication r \
         JOIN pg_stat_activity a ON a.pid = r.pid WHERE a.datname IS NULL ORDER BY 1",
        "listing the connected standbys",
    )
    .await?;
    let physical_slots = text_column(
        client,
        "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical' ORDER BY 1",
        "listing the physical slots",
    )
    .await?;
    let synchronized_standby_slots = if server.version_num >= FAILOVER_VERSION_NUM {
        let row = catalog::one_row(
            client,
            "SELECT COALESCE(current_setting('synchronized_standby_slots', true), '')",
            "reading synchronized_standby_slots",
        )
        .await?;
        split_list(row.get(0))
    } else {
        Vec::new()
    };
    Ok(Standbys {
        connected,
        physical_slots,
        synchronized_standby_slots,
    })
}

/// The one text column of every row `sql` returns; `doing` names the query in its error.
async fn text_column(client: &Client, sql: &str, doing: &'static str) -> Result<Vec<String>, ControlError> {
    let rows = client.query(sql, &[]).await.map_err(ControlError::query(doing))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Preflight's notes about failover, for the slot `slot` on `server`.
pub(crate) async fn notes(
    client: &Client,
    slot: &str,
    server: &ServerInfo,
    wants_failover: bool,
) -> Result<Vec<String>, ControlError> {
    let standbys = standbys(client, server).await?;
    Ok(notes_for(slot, server, wants_failover, &standbys))
}

fn notes_for(slot: &str, server: &ServerInfo, wants_failover: bool, standbys: &Standbys) -> Vec<String> {
    let mut notes = Vec::new();
    let has_standbys = !standbys.connected.is_empty() || !standbys.physical_slots.is_empty();
    let listed = |v: &[String]| if v.is_empty() { "none".to_owned() } else { v.join(", ") };
    if server.version_num < FAILOVER_VERSION_NUM {
        if has_standbys {
            notes.push(format!(
                "PostgreSQL {} has no failover slots (17+): physical standbys exist (connected: {}; physical slots: \
                 {}), but slot {slot} lives on this server only. After a failover the relay stops with \"slot does \
                 not exist\"; recover with `outbox-relay setup --backfill --since '<the last_confirmed_commit it \
                 logged, minus your longest transaction>'` (docs/operations.md, \"Failover on PostgreSQL 14-16\")",
                server.version,
                listed(&standbys.connected),
                listed(&standbys.physical_slots)
            ));
        }
        return notes;
    }
    if !wants_failover {
        notes.push(format!(
            "postgres.failover_slot = \"off\": slot {slot} is not synchronized to standbys and is lost when one is \
             promoted"
        ));
        return notes;
    }
    if !has_standbys {
        notes.push(format!(
            "slot {slot} is a failover slot, but no physical standby streams from this server: a standby keeps a copy \
             only with sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name set and a dbname in \
             its primary_conninfo"
        ));
        return notes;
    }
    let missing: Vec<&String> = standbys
        .physical_slots
        .iter()
        .filter(|s| !standbys.synchronized_standby_slots.contains(s))
        .collect();
    if standbys.synchronized_standby_slots.is_empty() {
        notes.push(format!(
            "WARNING: synchronized_standby_slots is empty, so the relay may confirm (and has then published) \
             transactions a standby has not received yet; promoting that standby loses them while their events are \
             already in Kafka, and its copy of slot {slot} may lag. Set it on this primary to the standbys' \
             physical slots: ALTER SYSTEM SET synchronized_standby_slots = '{}'; SELECT pg_reload_conf()",
            standbys.physical_slots.join(",")
        ));
    } else if !missing.is_empty() {
        let missing: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        notes.push(format!(
            "synchronized_standby_slots = '{}' does not name the physical slot(s) {}: a standby using one of them \
             may lack transactions the relay already published if it is promoted",
            standbys.synchronized_standby_slots.join(","),
            missing.join(", ")
        ));
    } else {
        notes.push(format!(
            "failover: slot {slot} is a failover slot; synchronized_standby_slots = '{}' (standbys connected: {})",
            standbys.synchronized_standby_slots.join(","),
            listed(&standbys.connected)
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version_num: i32) -> ServerInfo {
        ServerInfo {
            version_num,
            version: format!("{}.1", version_num / 10_000),
            wal_level: "logical".into(),
            in_recovery: false,
            database: "app".into(),
            role: "relay".into(),
        }
    }

    #[test]
    fn auto_means_on_from_17_and_on_is_refused_before() {
        assert!(!wants_failover(FailoverSlot::Auto, &server(160_004)).unwrap());
        assert!(wants_failover(FailoverSlot::Auto, &server(170_000)).unwrap());
        assert!(!wants_failover(FailoverSlot::Off, &server(180_000)).unwrap());
        assert!(wants_failover(FailoverSlot::On, &server(180_000)).unwrap());
        let err = wants_failover(FailoverSlot::On, &server(160_004)).unwrap_err();
        assert!(err.to_string().contains("17"), "{err}");
    }

    #[test]
    fn notes_say_what_a_promotion_would_lose() {
        let standby = Standbys {
            connected: vec!["standby1".into()],
            physical_slots: vec!["standby1".into()],
            synchronized_standby_slots: vec![],
        };
        let pg16 = notes_for("s", &server(160_004), false, &standby).join("\n");
        assert!(
            pg16.contains("no failover slots") && pg16.contains("--backfill --since"),
            "{pg16}"
        );
        assert!(notes_for("s", &server(160_004), false, &Standbys::default()).is_empty());
        let unsynced = notes_for("s", &server(170_000), true, &standby).join("\n");
        assert!(
            unsynced.contains("synchronized_standby_slots is empty") && unsynced.contains("'standby1'"),
            "{unsynced}"
        );
        let good = Standbys {
            synchronized_standby_slots: vec!["standby1".into()],
            ..standby.clone()
        };
        let ok = notes_for("s", &server(170_000), true, &good).join("\n");
        assert!(ok.contains("is a failover slot"), "{ok}");
        let alone = notes_for("s", &server(170_000), true, &Standbys::default()).join("\n");
        assert!(alone.contains("sync_replication_slots = on"), "{alone}");
        assert_eq!(split_list(" a, \"b\" ,"), vec!["a", "b"]);
    }
}
