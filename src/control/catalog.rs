//! Catalog reads shared by preflight, setup, status and teardown.
//!
//! Slot and publication rows are fetched as `to_jsonb(row)::text`, so one query works on every
//! supported server version: a column that version lacks (`wal_status` before 13,
//! `invalidation_reason` before 17, `pubtruncate` before 11) simply comes back absent instead of
//! failing the query.

use serde::Deserialize;
use tokio_postgres::Client;

use super::ControlError;
use crate::postgres::lsn::Lsn;

/// Server facts every command needs.
#[derive(Debug, Clone)]
pub(crate) struct ServerInfo {
    pub version_num: i32,
    /// The version without the distribution suffix, e.g. `15.20`.
    pub version: String,
    pub wal_level: String,
    pub in_recovery: bool,
    pub database: String,
    pub role: String,
}

pub(crate) async fn server_info(client: &Client) -> Result<ServerInfo, ControlError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int4, current_setting('server_version'), \
                    current_setting('wal_level'), pg_is_in_recovery(), current_database()::text, current_user::text",
            &[],
        )
        .await
        .map_err(ControlError::query("reading the server version and settings"))?;
    let full: String = row.get(1);
    Ok(ServerInfo {
        version_num: row.get(0),
        version: full.split_whitespace().next().unwrap_or_default().to_owned(),
        wal_level: row.get(2),
        in_recovery: row.get(3),
        database: row.get(4),
        role: row.get(5),
    })
}

/// One row of `pg_replication_slots`, plus WAL distances computed by the server.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SlotRow {
    pub slot_type: String,
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub restart_lsn: Option<String>,
    pub confirmed_flush_lsn: Option<String>,
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
    pub invalidation_reason: Option<String>,
    /// WAL between `restart_lsn` and the current position: what the slot keeps on disk.
    #[serde(skip)]
    pub retained_wal_bytes: Option<i64>,
    /// WAL between `confirmed_flush_lsn` and the current position: not yet confirmed by the relay.
    #[serde(skip)]
    pub lag_bytes: Option<i64>,
}

impl SlotRow {
    pub fn restart(&self) -> Option<Lsn> {
        self.restart_lsn.as_deref().and_then(|s| s.parse().ok())
    }

    pub fn confirmed_flush(&self) -> Option<Lsn> {
        self.confirmed_flush_lsn.as_deref().and_then(|s| s.parse().ok())
    }

    /// Another session is inside `pg_create_logical_replication_slot`: the slot is already
    /// listed (held by that session) but its plugin is not recorded yet.
    pub fn being_created(&self) -> bool {
        self.slot_type == "logical" && self.active && self.plugin.as_deref().unwrap_or_default().is_empty()
    }

    /// Why the slot can no longer be used, if it cannot: `wal_status = 'lost'` (13+), or an
    /// explicit `invalidation_reason` (17+).
    pub fn invalidated(&self) -> Option<String> {
        if let Some(reason) = &self.invalidation_reason {
            return Some(reason.clone());
        }
        (self.wal_status.as_deref() == Some("lost")).then(|| "wal_status = lost".to_owned())
    }
}

/// The current WAL position: the insert position on a primary, the replay position on a standby.
const CURRENT_LSN: &str = "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END";

pub(crate) async fn slot(client: &Client, name: &str) -> Result<Option<SlotRow>, ControlError> {
    let sql = format!(
        "SELECT to_jsonb(s)::text, pg_wal_lsn_diff(w.lsn, s.restart_lsn)::int8, \
                pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::int8 \
         FROM pg_replication_slots s, (SELECT {CURRENT_LSN} AS lsn) w WHERE s.slot_name = $1"
    );
    let Some(row) = client
        .query_opt(&sql, &[&name])
        .await
        .map_err(ControlError::query(format!("reading replication slot {name}")))?
    else {
        return Ok(None);
    };
    let json: String = row.get(0);
    let mut slot: SlotRow = serde_json::from_str(&json)
        .map_err(|e| ControlError::Unexpected(format!("pg_replication_slots row {json}: {e}")))?;
    slot.retained_wal_bytes = row.get(1);
    slot.lag_bytes = row.get(2);
    Ok(Some(slot))
}

pub(crate) async fn current_wal_lsn(client: &Client) -> Result<Option<Lsn>, ControlError> {
    let row = client
        .query_one(&format!("SELECT ({CURRENT_LSN})::text"), &[])
        .await
        .map_err(ControlError::query("reading the current WAL position"))?;
    let text: Option<String> = row.get(0);
    Ok(text.and_then(|t| t.parse().ok()))
}

/// One row of `pg_publication`, plus ownership.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PublicationRow {
    pub puballtables: bool,
    pub pubinsert: bool,
    pub pubupdate: bool,
    pub pubdelete: bool,
    #[serde(default)]
    pub pubtruncate: bool,
    #[serde(default)]
    pub pubviaroot: bool,
    #[serde(skip)]
    pub oid: u32,
    #[serde(skip)]
    pub owner: String,
    /// The connected role is the owner itself (not merely a superuser who could act as one).
    #[serde(skip)]
    pub owned_by_current_role: bool,
}

impl PublicationRow {
    /// The published actions in PostgreSQL's order, as `publish = '…'` spells them.
    pub fn actions(&self) -> Vec<String> {
        [
            (self.pubinsert, "insert"),
            (self.pubupdate, "update"),
            (self.pubdelete, "delete"),
            (self.pubtruncate, "truncate"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| (*name).to_owned())
        .collect()
    }
}

pub(crate) async fn publication(client: &Client, name: &str) -> Result<Option<PublicationRow>, ControlError> {
    let Some(row) = client
        .query_opt(
            "SELECT to_jsonb(p)::text, p.oid, pg_get_userbyid(p.pubowner)::text, \
                    p.pubowner = (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user) \
             FROM pg_publication p WHERE p.pubname = $1",
            &[&name],
        )
        .await
        .map_err(ControlError::query(format!("reading publication {name}")))?
    else {
        return Ok(None);
    };
    let json: String = row.get(0);
    let mut publication: PublicationRow =
        serde_json::from_str(&json).map_err(|e| ControlError::Unexpected(format!("pg_publication row {json}: {e}")))?;
    publication.oid = row.get(1);
    publication.owner = row.get(2);
    publication.owned_by_current_role = row.get(3);
    Ok(Some(publication))
}

/// `(schema, table)` of every table the publication publishes, as `pg_publication_tables` lists them.
pub(crate) async fn publication_tables(client: &Client, name: &str) -> Result<Vec<(String, String)>, ControlError> {
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2",
            &[&name],
        )
        .await
        .map_err(ControlError::query(format!("listing the tables of publication {name}")))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
