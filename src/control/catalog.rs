//! Catalog reads shared by preflight, setup, status and teardown.
//!
//! Publication rows are fetched as `to_jsonb(row)::text`, so one query works on every supported
//! server version: a column that version lacks (`pubtruncate` before 11) simply comes back absent
//! instead of failing the query. Slots are read with the adapter's one slot query
//! ([`crate::postgres::slot`]), the same the relay uses.

use serde::Deserialize;
use tokio_postgres::{Client, Row};

use super::ControlError;
use crate::config::ident::{Ident, TableName};
use crate::postgres::lsn::Lsn;

/// Server facts every command needs.
#[derive(Debug, Clone)]
pub(crate) struct ServerInfo {
    pub(crate) version_num: i32,
    /// The version without the distribution suffix, e.g. `15.20`.
    pub(crate) version: String,
    pub(crate) wal_level: String,
    pub(crate) in_recovery: bool,
    pub(crate) database: String,
    pub(crate) role: String,
}

/// Whether `table` has the live column `column` (e.g. the creation-time column a time
/// selection reads, which need not be a mapped one).
pub(crate) async fn has_column(client: &Client, table: &TableName, column: &Ident) -> Result<bool, ControlError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attname = $2 \
                              AND a.attnum > 0 AND NOT a.attisdropped)",
            &[&table.quoted(), &column.as_str()],
        )
        .await
        .map_err(ControlError::query(format!("reading the columns of {table}")))?;
    Ok(row.get(0))
}

/// Why a selection by time (`what`, e.g. "--since") cannot run on `table`: it lacks the
/// creation-time column (`Settings::created_at_column`); `instead` is the selection by id.
pub(crate) fn no_creation_column(
    settings: &crate::config::Settings,
    table: &TableName,
    what: &str,
    instead: &str,
) -> String {
    let (column, chosen_by) = settings.created_at_column();
    format!(
        "{what} selects rows by their creation time, read from column {column} ({chosen_by}), but {table} has no \
         such column. Set retention.timestamp_column (or outbox.timestamp_column) to the column holding each row's \
         creation time, or {instead}"
    )
}

/// Rows deleted from `table` (over its partitions) since its statistics were last reset, as the
/// cumulative statistics count them (`n_tup_del`; a dropped partition's rows are not counted).
pub(crate) async fn deleted_rows(client: &Client, table: &TableName) -> Result<i64, ControlError> {
    let row = client
        .query_one(
            "SELECT COALESCE(sum(s.n_tup_del), 0)::int8 FROM pg_stat_all_tables s \
              WHERE s.relid = to_regclass($1) \
                 OR s.relid IN (SELECT t.relid FROM pg_partition_tree(to_regclass($1)) t)",
            &[&table.quoted()],
        )
        .await
        .map_err(ControlError::query(format!("reading the statistics of {table}")))?;
    Ok(row.get(0))
}

/// The one row `sql` (without parameters) returns; `doing` names the query in its error.
pub(crate) async fn one_row(client: &Client, sql: &str, doing: &'static str) -> Result<Row, ControlError> {
    client.query_one(sql, &[]).await.map_err(ControlError::query(doing))
}

pub(crate) async fn server_info(client: &Client) -> Result<ServerInfo, ControlError> {
    let row = one_row(
        client,
        "SELECT current_setting('server_version_num')::int4, current_setting('server_version'), \
                    current_setting('wal_level'), pg_is_in_recovery(), current_database()::text, current_user::text",
        "reading the server version and settings",
    )
    .await?;
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

pub(crate) use crate::postgres::slot::{SlotLookup, SlotRow};

/// The current WAL position: the insert position on a primary, the replay position on a standby.
const CURRENT_LSN: &str = "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END";

/// The slot named `name`, through the one slot query the relay uses too
/// ([`crate::postgres::slot`]): `status` and `run` never disagree about whether it exists.
pub(crate) async fn slot_lookup(client: &Client, name: &str) -> Result<SlotLookup, ControlError> {
    crate::postgres::slot::lookup_slot(client, name)
        .await
        .map_err(|e| match e {
            crate::postgres::slot::SlotQueryError::Query { source, .. } => {
                ControlError::query(format!("reading replication slot {name}"))(source)
            }
            e @ crate::postgres::slot::SlotQueryError::Row { .. } => ControlError::Unexpected(e.to_string()),
        })
}

/// The slot of this database named `name`, if any.
pub(crate) async fn slot(client: &Client, name: &str) -> Result<Option<SlotRow>, ControlError> {
    Ok(slot_lookup(client, name).await?.here())
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
    pub(crate) puballtables: bool,
    pub(crate) pubinsert: bool,
    pub(crate) pubupdate: bool,
    pub(crate) pubdelete: bool,
    #[serde(default)]
    pub(crate) pubtruncate: bool,
    #[serde(default)]
    pub(crate) pubviaroot: bool,
    #[serde(skip)]
    pub(crate) oid: u32,
    #[serde(skip)]
    pub(crate) owner: String,
    /// The connected role is the owner itself (not merely a superuser who could act as one).
    #[serde(skip)]
    pub(crate) owned_by_current_role: bool,
}

impl PublicationRow {
    /// The published actions in PostgreSQL's order, as `publish = '…'` spells them.
    pub(crate) fn actions(&self) -> Vec<String> {
        crate::postgres::publication::PublicationScope::actions_of(
            self.pubinsert,
            self.pubupdate,
            self.pubdelete,
            self.pubtruncate,
        )
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

/// An outbox table as the catalogs know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFacts {
    pub(crate) name: TableName,
    pub(crate) oid: u32,
    pub(crate) owner: String,
    pub(crate) partitioned: bool,
}
