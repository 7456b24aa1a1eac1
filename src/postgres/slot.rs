//! The one query and the one row type for a replication slot, shared by `run` (the relay's slot
//! checks, the slot monitor, the standby) and the control plane (preflight, `setup`, `status`,
//! `teardown`).
//!
//! Invariant: **everyone asks the same question, so everyone gets the same answer.** A slot
//! "exists" for the relay only if it is a slot of the *current* database (`database =
//! current_database()`) or a physical slot (no database; cluster-wide, reported so callers can
//! refuse it by its kind). Slot names are cluster-wide, though: a logical slot of the same name in
//! another database is not this database's slot — [`read_slot`] says it is missing — but the
//! same query reports which database holds it ([`SlotLookup::InOtherDatabase`]), so `setup`,
//! which could not create a slot of that name, can say why.
//!
//! Rows are fetched as `to_jsonb(row)::text`, so one query works on every supported server
//! version: a column that version lacks (`wal_status` before 13, `invalidation_reason` before
//! 17) comes back absent instead of failing the query.
//!
//! How long the slot's holder has been silent is measured here once, by [`silent_seconds_sql`],
//! for the standby's takeover, the exactly-once takeover fence and `status` alike. Invariant:
//! **a silence the server hides is unknown, never guessed.** `pg_stat_replication` shows a
//! walsender's `reply_time` only to a role with the privileges of `pg_read_all_stats`
//! (`crate::postgres::role`); to others the row has a NULL `state` and no replies at all — the
//! walsender's `backend_start`, which a role still sees for its own backends, says nothing about
//! whether the holder replies, so it is never read as its silence.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use tokio_postgres::Client;

use crate::postgres::failure::describe_pg;
use crate::postgres::lsn::Lsn;

/// One row of `pg_replication_slots` for a slot of this database, with WAL distances computed
/// by the server and what it knows about the process streaming from it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SlotRow {
    /// `logical` or `physical`.
    pub(crate) slot_type: String,
    pub(crate) plugin: Option<String>,
    /// `None` for a physical slot.
    pub(crate) database: Option<String>,
    pub(crate) active: bool,
    pub(crate) active_pid: Option<i32>,
    pub(crate) restart_lsn: Option<Lsn>,
    pub(crate) confirmed_flush_lsn: Option<Lsn>,
    /// PostgreSQL 13+: `reserved | extended | unreserved | lost`.
    pub(crate) wal_status: Option<String>,
    /// PostgreSQL 13+: bytes that can still be written before the slot is in danger of
    /// invalidation (`None`: unlimited or unknown).
    pub(crate) safe_wal_size: Option<i64>,
    /// PostgreSQL 17+: why the slot was invalidated.
    pub(crate) invalidation_reason: Option<String>,
    /// PostgreSQL 16+: the slot was invalidated by a recovery conflict (on a standby, rows or
    /// catalog it needed were removed by the primary); 16 has no `invalidation_reason` to say so.
    pub(crate) conflicting: Option<bool>,
    /// PostgreSQL 17+: a failover slot, synchronized to standbys with `sync_replication_slots`
    /// (`None` before 17).
    pub(crate) failover: Option<bool>,
    /// PostgreSQL 17+: this server's copy is synchronized from a primary (true on a standby:
    /// it cannot be streamed from until that standby is promoted).
    pub(crate) synced: Option<bool>,
    /// Current WAL position minus `restart_lsn`: what the server keeps for the slot.
    pub(crate) retained_wal_bytes: Option<i64>,
    /// Current WAL position minus `confirmed_flush_lsn`: not yet confirmed by the relay.
    pub(crate) lag_bytes: Option<i64>,
    /// The walsender streaming from the slot, if any.
    pub(crate) holder: Option<SlotHolder>,
}

#[cfg(test)]
impl SlotRow {
    /// A test's usable slot: logical, pgoutput, `reserved` WAL, confirmed at `confirmed`; a test
    /// sets what it is about over it.
    pub(crate) fn healthy(confirmed: Lsn) -> SlotRow {
        SlotRow {
            slot_type: "logical".into(),
            plugin: Some("pgoutput".into()),
            confirmed_flush_lsn: Some(confirmed),
            wal_status: Some("reserved".into()),
            ..SlotRow::default()
        }
    }
}

impl SlotRow {
    /// Why the slot can no longer be used, if it cannot: an explicit `invalidation_reason`
    /// (17+), or `wal_status = 'lost'` (13+).
    pub(crate) fn invalidated(&self) -> Option<String> {
        if let Some(reason) = &self.invalidation_reason {
            return Some(format!("invalidation_reason = {reason}"));
        }
        if self.conflicting == Some(true) {
            return Some(
                "conflicting = true: invalidated by a recovery conflict (the primary removed rows or catalog \
                 entries it needed)"
                    .into(),
            );
        }
        (self.wal_status.as_deref() == Some("lost"))
            .then(|| "wal_status = lost: WAL it needed was removed after exceeding max_slot_wal_keep_size".into())
    }

    /// Another session is inside `pg_create_logical_replication_slot`: the slot is already
    /// listed (held by that session) but its plugin is not recorded yet.
    pub(crate) fn being_created(&self) -> bool {
        self.slot_type == "logical" && self.active && self.plugin.as_deref().unwrap_or_default().is_empty()
    }
}

/// The process holding the slot, as `pg_stat_replication` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotHolder {
    /// The walsender's backend pid (`pg_replication_slots.active_pid`).
    pub(crate) pid: Option<i32>,
    pub(crate) application_name: Option<String>,
    /// `client_addr:client_port` of the holder's connection.
    pub(crate) client: Option<String>,
    /// How long the holder has sent no standby status update, as far as this role can see.
    pub(crate) silence: Silence,
}

impl SlotHolder {
    pub(crate) fn from_pid(pid: Option<i32>) -> SlotHolder {
        SlotHolder {
            pid,
            ..SlotHolder::default()
        }
    }

    /// Time since the holder's last status update, when this role can know it.
    pub(crate) fn silent_for(&self) -> Option<Duration> {
        match self.silence {
            Silence::For(d) => Some(d),
            Silence::Hidden { .. } | Silence::Unknown => None,
        }
    }
}

/// What this role can know of how long a walsender's client has been silent.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Silence {
    /// Since its last standby status update (since it connected, if it never sent one).
    For(Duration),
    /// `pg_stat_replication` hides the walsender's details from `role` (it lacks the privileges
    /// of `pg_read_all_stats`): the holder may be replying this very moment.
    Hidden { role: String },
    /// Not known for another reason (no `pg_stat_replication` row: the walsender went away
    /// between the reads, or a holder seen only in the server's refusal).
    #[default]
    Unknown,
}

impl Silence {
    /// From the slot query's columns: the seconds (NULL when not visible) and, when the
    /// walsender's details are hidden, the role they are hidden from.
    pub(crate) fn from_columns(seconds: Option<f64>, hidden_from: Option<String>) -> Silence {
        if let Some(role) = hidden_from {
            return Silence::Hidden { role };
        }
        seconds
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Silence::Unknown, |s| Silence::For(Duration::from_secs_f64(s)))
    }
}

impl fmt::Display for Silence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Silence::For(d) => write!(f, "{:.1} s ago", d.as_secs_f64()),
            Silence::Hidden { role } => write!(
                f,
                "unknown (pg_stat_replication hides the walsender's replies from role {role}: {})",
                crate::postgres::role::stats_grant(role)
            ),
            Silence::Unknown => f.write_str("unknown"),
        }
    }
}

/// `pg_stat_replication r`'s silence in seconds as an SQL expression: since `reply_time` (since
/// `backend_start` for a walsender that never got a reply), NULL when the row's details are
/// hidden from this role (`r.state IS NULL`: see the module docs). `reply_time` is read through
/// `to_jsonb` because servers before 12 lack the column.
macro_rules! silent_seconds_sql {
    () => {
        "CASE WHEN r.state IS NOT NULL THEN EXTRACT(EPOCH FROM clock_timestamp() \
           - COALESCE((to_jsonb(r) ->> 'reply_time')::timestamptz, r.backend_start))::float8 END"
    };
}
pub(crate) use silent_seconds_sql;

/// `pg_stat_replication r`'s details are hidden from this role: the role's name, else NULL.
macro_rules! hidden_from_sql {
    () => {
        "CASE WHEN r.pid IS NOT NULL AND r.state IS NULL THEN current_user::text END"
    };
}
pub(crate) use hidden_from_sql;

impl fmt::Display for SlotHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "walsender pid {pid}")?,
            None => f.write_str("another process")?,
        }
        if let Some(app) = self.application_name.as_deref().filter(|a| !a.is_empty()) {
            write!(f, " ({app}")?;
            if let Some(client) = &self.client {
                write!(f, " at {client}")?;
            }
            f.write_str(")")?;
        } else if let Some(client) = &self.client {
            write!(f, " (client {client})")?;
        }
        match &self.silence {
            Silence::Unknown => {}
            known => write!(f, ", last status update {known}")?,
        }
        Ok(())
    }
}

/// What the slot query found under a name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SlotLookup {
    /// A slot of this database (or a physical slot).
    Found(Box<SlotRow>),
    /// No slot of this database has the name, but a logical slot of another database does.
    InOtherDatabase {
        database: String,
    },
    Missing,
}

impl SlotLookup {
    /// The slot of this database, if there is one.
    pub(crate) fn here(self) -> Option<SlotRow> {
        match self {
            SlotLookup::Found(row) => Some(*row),
            SlotLookup::InOtherDatabase { .. } | SlotLookup::Missing => None,
        }
    }
}

/// The slot query failed, or returned a row this code cannot read.
#[derive(Debug, thiserror::Error)]
pub enum SlotQueryError {
    #[error("reading replication slot {slot} failed: {}", describe_pg(.source))]
    Query {
        slot: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("unexpected pg_replication_slots row {json}: {source}")]
    Row {
        json: String,
        #[source]
        source: serde_json::Error,
    },
}

impl SlotQueryError {
    /// The server's error, when the query itself failed.
    pub(crate) fn postgres(&self) -> Option<&tokio_postgres::Error> {
        match self {
            SlotQueryError::Query { source, .. } => Some(source),
            SlotQueryError::Row { .. } => None,
        }
    }
}

#[derive(Deserialize)]
struct SlotJson {
    slot_type: String,
    plugin: Option<String>,
    database: Option<String>,
    #[serde(default)]
    active: bool,
    active_pid: Option<i32>,
    restart_lsn: Option<String>,
    confirmed_flush_lsn: Option<String>,
    wal_status: Option<String>,
    safe_wal_size: Option<i64>,
    invalidation_reason: Option<String>,
    conflicting: Option<bool>,
    failover: Option<bool>,
    synced: Option<bool>,
}

/// The only query of `pg_replication_slots` for one slot. Column 0 is the row (as JSON) only
/// when the slot belongs to this database or is physical; column 1 is the slot's database
/// either way.
const SLOT_QUERY: &str = concat!(
    "
SELECT CASE WHEN s.database IS NULL OR s.database = current_database() THEN to_jsonb(s)::text END,
       s.database::text,
       pg_wal_lsn_diff(w.lsn, s.restart_lsn)::int8,
       pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::int8,
       ",
    silent_seconds_sql!(),
    ",
       r.application_name::text,
       host(r.client_addr) || COALESCE(':' || r.client_port::text, ''),
       ",
    hidden_from_sql!(),
    "
  FROM pg_replication_slots s
  CROSS JOIN (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                          ELSE pg_current_wal_lsn() END AS lsn) w
  LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
 WHERE s.slot_name = $1"
);

/// Looks the slot up: this database's, another database's, or none.
pub(crate) async fn lookup_slot(client: &Client, slot: &str) -> Result<SlotLookup, SlotQueryError> {
    let row = client
        .query_opt(SLOT_QUERY, &[&slot])
        .await
        .map_err(|source| SlotQueryError::Query {
            slot: slot.to_owned(),
            source,
        })?;
    let Some(row) = row else {
        return Ok(SlotLookup::Missing);
    };
    let Some(json) = row.get::<_, Option<String>>(0) else {
        let database: Option<String> = row.get(1);
        return Ok(SlotLookup::InOtherDatabase {
            database: database.unwrap_or_default(),
        });
    };
    let raw: SlotJson = serde_json::from_str(&json).map_err(|source| SlotQueryError::Row { json, source })?;
    let lsn = |s: Option<String>| s.and_then(|s| s.parse::<Lsn>().ok());
    let holder = raw.active_pid.map(|pid| SlotHolder {
        pid: Some(pid),
        application_name: row.get(5),
        client: row.get(6),
        silence: Silence::from_columns(row.get(4), row.get(7)),
    });
    Ok(SlotLookup::Found(Box::new(SlotRow {
        slot_type: raw.slot_type,
        plugin: raw.plugin,
        database: raw.database,
        active: raw.active,
        active_pid: raw.active_pid,
        restart_lsn: lsn(raw.restart_lsn),
        confirmed_flush_lsn: lsn(raw.confirmed_flush_lsn),
        wal_status: raw.wal_status,
        safe_wal_size: raw.safe_wal_size,
        invalidation_reason: raw.invalidation_reason,
        conflicting: raw.conflicting,
        failover: raw.failover,
        synced: raw.synced,
        retained_wal_bytes: row.get(2),
        lag_bytes: row.get(3),
        holder,
    })))
}

/// The slot's row, or `None` if this database has no slot of that name.
pub(crate) async fn read_slot(client: &Client, slot: &str) -> Result<Option<SlotRow>, SlotQueryError> {
    Ok(lookup_slot(client, slot).await?.here())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalidation_names_the_cause() {
        let lost = SlotRow {
            wal_status: Some("lost".into()),
            ..SlotRow::default()
        };
        assert!(lost.invalidated().unwrap().contains("wal_status = lost"));
        let pg17 = SlotRow {
            invalidation_reason: Some("wal_removed".into()),
            ..lost
        };
        assert_eq!(pg17.invalidated().unwrap(), "invalidation_reason = wal_removed");
        let pg16_conflict = SlotRow {
            conflicting: Some(true),
            ..SlotRow::default()
        };
        assert!(pg16_conflict.invalidated().unwrap().contains("recovery conflict"));
        let healthy = SlotRow {
            conflicting: Some(false),
            ..SlotRow::default()
        };
        assert_eq!(healthy.invalidated(), None);
        assert_eq!(SlotRow::default().invalidated(), None);
    }

    #[test]
    fn a_hidden_silence_is_unknown_and_names_the_grant() {
        assert_eq!(
            Silence::from_columns(Some(1.5), None),
            Silence::For(Duration::from_millis(1500))
        );
        assert_eq!(Silence::from_columns(None, None), Silence::Unknown);
        assert_eq!(Silence::from_columns(Some(f64::NAN), None), Silence::Unknown);
        let hidden = SlotHolder {
            pid: Some(7),
            silence: Silence::from_columns(None, Some("relay".into())),
            ..SlotHolder::default()
        };
        assert_eq!(hidden.silent_for(), None);
        assert_eq!(
            hidden.to_string(),
            "walsender pid 7, last status update unknown (pg_stat_replication hides the walsender's replies from \
             role relay: GRANT pg_read_all_stats TO \"relay\";)"
        );
        assert_eq!(SlotHolder::from_pid(Some(7)).to_string(), "walsender pid 7");
    }

    #[test]
    fn only_this_database_counts_as_found() {
        assert_eq!(SlotLookup::Missing.here(), None);
        assert_eq!(
            SlotLookup::InOtherDatabase {
                database: "other".into()
            }
            .here(),
            None
        );
        assert!(SlotLookup::Found(Box::default()).here().is_some());
    }
}
