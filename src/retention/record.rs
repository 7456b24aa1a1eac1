//! What retention last did, per outbox table, kept where `status` can read it from any host: a
//! small table [`RECORD_TABLE`] in the outbox table's schema, one row per outbox table.
//!
//! It also holds the partition detached and waiting to be dropped, so a restart between the
//! detach and the drop finishes the job (or attaches the partition again) instead of leaving a
//! stray table behind; and when `setup` created the slot without `--backfill`
//! ([`note_slot_created`]): rows older than that were never streamed by this slot, so its
//! confirmed position says nothing about them ([`slot_created_at`]). The record is bookkeeping: if it cannot be created (no `CREATE` on the
//! schema) retention still works, `status` just cannot say what it removed.

use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use crate::config::ident::{quote_ident, TableName};
use crate::config::retention::RECORD_TABLE;
use crate::postgres::lsn::Lsn;
use crate::retention::RetentionError;

/// A partition detached from its outbox table, dropped once it is safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detached {
    /// Schema-qualified and quoted.
    pub(crate) partition: String,
    /// Its bound as `pg_get_expr` rendered it (`FOR VALUES FROM (…) TO (…)`), to attach it again.
    pub(crate) bound: String,
    /// WAL insert position read after the detach committed: every row in it committed before.
    pub(crate) lsn: Lsn,
}

/// The quoted record table beside `table`.
pub(crate) fn record_table(table: &TableName) -> String {
    format!("{}.{}", table.schema.quoted(), quote_ident(RECORD_TABLE))
}

/// The record's key for `table`: `schema.name`, unquoted (what `status` prints).
pub(crate) fn key(table: &TableName) -> String {
    format!("{}.{}", table.schema.as_str(), table.name.as_str())
}

/// Creates the record table if it is missing.
pub(crate) async fn ensure(client: &Client, table: &TableName) -> Result<(), RetentionError> {
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {t} (
            outbox_table text PRIMARY KEY,
            last_run_at timestamptz,
            last_removed_at timestamptz,
            last_removed_rows int8 NOT NULL DEFAULT 0,
            last_removed_partitions int8 NOT NULL DEFAULT 0,
            last_removed_through timestamptz,
            total_removed_rows int8 NOT NULL DEFAULT 0,
            detached_partition text,
            detached_bound text,
            detached_lsn pg_lsn
        );
        ALTER TABLE {t} ADD COLUMN IF NOT EXISTS slot_name text,
                        ADD COLUMN IF NOT EXISTS slot_created_at timestamptz,
                        ADD COLUMN IF NOT EXISTS slot_backfilled boolean",
        t = record_table(table)
    );
    client
        .batch_execute(&sql)
        .await
        .map_err(RetentionError::query(table, "creating the retention record table"))
}

/// `setup` created `slot`: rows of `table` older than now were committed before the slot's
/// consistent point (creating a logical slot waits for the transactions running then), so the
/// slot never streamed them. `backfilled`: `setup --backfill` published the pending ones from
/// the slot's snapshot, so the slot's position vouches for every row again.
pub(crate) async fn note_slot_created(
    client: &Client,
    table: &TableName,
    slot: &str,
    backfilled: bool,
) -> Result<(), RetentionError> {
    ensure(client, table).await?;
    let sql = format!(
        "INSERT INTO {t} AS r (outbox_table, slot_name, slot_created_at, slot_backfilled)
         VALUES ($1::text, $2::text, now(), $3)
         ON CONFLICT (outbox_table) DO UPDATE SET
            slot_name = EXCLUDED.slot_name, slot_created_at = EXCLUDED.slot_created_at,
            slot_backfilled = EXCLUDED.slot_backfilled",
        t = record_table(table)
    );
    write(
        client,
        table,
        &sql,
        &[&slot, &backfilled],
        "recording the slot setup created",
    )
    .await
}

/// When `setup` created `slot` without a backfill (Unix seconds): rows of `table` older than
/// that are not vouched for by the slot. `None`: no such record (an adopted slot, a backfilled
/// one, or no record table).
pub(crate) async fn slot_created_at(
    client: &Client,
    table: &TableName,
    slot: &str,
) -> Result<Option<f64>, RetentionError> {
    let sql = format!(
        "SELECT EXTRACT(EPOCH FROM slot_created_at)::float8 FROM {t}
          WHERE outbox_table = $1 AND slot_name = $2 AND slot_created_at IS NOT NULL
            AND NOT coalesce(slot_backfilled, false)",
        t = record_table(table)
    );
    // The record table may be missing (never created): nothing recorded then.
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&record_table(table)])
        .await
        .map_err(RetentionError::query(table, "looking for the retention record table"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    // Its columns were added by `ensure` when retention first resolved the table (`target`),
    // not here: this runs every interval and `ensure` takes the table's exclusive lock.
    Ok(client
        .query_opt(&sql, &[&key(table), &slot])
        .await
        .map_err(RetentionError::query(table, "reading when setup created the slot"))?
        .map(|r| r.get(0)))
}

/// One run's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Removed {
    pub(crate) rows: u64,
    pub(crate) partitions: u64,
    /// Newest timestamp (Unix seconds) among what was removed.
    pub(crate) through_unix: Option<f64>,
}

/// Runs `sql`, a write of `table`'s record row: `$1` is the row's key, `params` the rest;
/// `doing` names it in the error.
async fn write(
    client: &Client,
    table: &TableName,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    doing: &'static str,
) -> Result<(), RetentionError> {
    let key = key(table);
    let params: Vec<&(dyn ToSql + Sync)> = std::iter::once(&key as &(dyn ToSql + Sync))
        .chain(params.iter().copied())
        .collect();
    client
        .execute(sql, &params)
        .await
        .map(drop)
        .map_err(RetentionError::query(table, doing))
}

/// Notes a finished run (and what it removed, if anything).
pub(crate) async fn note_run(client: &Client, table: &TableName, removed: &Removed) -> Result<(), RetentionError> {
    // Parameters cast once in a CTE: each is used both as a value and in comparisons.
    let sql = format!(
        "WITH p AS (SELECT $1::text AS t, $2::int8 AS n, $3::int8 AS parts, to_timestamp($4::float8) AS through)
         INSERT INTO {t} AS r (outbox_table, last_run_at, last_removed_at, last_removed_rows, last_removed_partitions,
                              last_removed_through, total_removed_rows)
         SELECT t, now(), CASE WHEN n > 0 OR parts > 0 THEN now() END, n, parts, through, n FROM p
         ON CONFLICT (outbox_table) DO UPDATE SET
            last_run_at = now(),
            last_removed_at = CASE WHEN EXCLUDED.last_removed_rows > 0 OR EXCLUDED.last_removed_partitions > 0
                                   THEN now() ELSE r.last_removed_at END,
            last_removed_rows = CASE WHEN EXCLUDED.last_removed_rows > 0 OR EXCLUDED.last_removed_partitions > 0
                                     THEN EXCLUDED.last_removed_rows ELSE r.last_removed_rows END,
            last_removed_partitions = CASE WHEN EXCLUDED.last_removed_rows > 0 OR EXCLUDED.last_removed_partitions > 0
                                           THEN EXCLUDED.last_removed_partitions ELSE r.last_removed_partitions END,
            last_removed_through = COALESCE(EXCLUDED.last_removed_through, r.last_removed_through),
            total_removed_rows = r.total_removed_rows + EXCLUDED.last_removed_rows",
        t = record_table(table)
    );
    write(
        client,
        table,
        &sql,
        &[
            &(removed.rows as i64),
            &(removed.partitions as i64),
            &removed.through_unix,
        ],
        "recording what retention removed",
    )
    .await
}

/// Remembers (`Some`) or forgets (`None`) the partition waiting to be dropped.
pub(crate) async fn set_detached(
    client: &Client,
    table: &TableName,
    detached: Option<&Detached>,
) -> Result<(), RetentionError> {
    let sql = format!(
        "INSERT INTO {t} AS r (outbox_table, detached_partition, detached_bound, detached_lsn)
         VALUES ($1::text, $2::text, $3::text, $4::text::pg_lsn)
         ON CONFLICT (outbox_table) DO UPDATE SET
            detached_partition = $2, detached_bound = $3, detached_lsn = $4::text::pg_lsn",
        t = record_table(table)
    );
    let (partition, bound, lsn) = match detached {
        Some(d) => (
            Some(d.partition.as_str()),
            Some(d.bound.as_str()),
            Some(d.lsn.to_string()),
        ),
        None => (None, None, None),
    };
    write(
        client,
        table,
        &sql,
        &[&partition, &bound, &lsn],
        "recording the detached partition",
    )
    .await
}

/// The partition a previous run detached and did not drop, if any (and if it still exists).
pub(crate) async fn detached(client: &Client, table: &TableName) -> Result<Option<Detached>, RetentionError> {
    let sql = format!(
        "SELECT detached_partition, detached_bound, detached_lsn::text FROM {t}
          WHERE outbox_table = $1 AND detached_partition IS NOT NULL AND to_regclass(detached_partition) IS NOT NULL",
        t = record_table(table)
    );
    let row = client
        .query_opt(&sql, &[&key(table)])
        .await
        .map_err(RetentionError::query(table, "reading the detached partition"))?;
    Ok(row.and_then(|r| {
        let lsn: String = r.get(2);
        Some(Detached {
            partition: r.get(0),
            bound: r.get(1),
            lsn: lsn.parse().ok()?,
        })
    }))
}
