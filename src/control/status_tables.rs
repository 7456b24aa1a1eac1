//! `status`, per outbox table: how big it is, its oldest row, and what retention last removed.
//!
//! Cheap on purpose — `status` runs often: rows are the planner's estimate (`reltuples`, summed
//! over partitions; `null` before the first `ANALYZE`), the size is `pg_total_relation_size`
//! over the partition tree (a plain table is a tree of one), and the oldest row is `min(<timestamp column>)` under a short
//! `statement_timeout` (an index on that column makes it instant). What retention did comes from
//! its record table beside the outbox table (`src/retention/record.rs`), written by whichever
//! instance is active, so any host sees it. Nothing here fails `status`: what cannot be read is
//! `null`, with the reason in `error`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use crate::config::ident::{quote_ident, TableName};
use crate::config::retention::RECORD_TABLE;
use crate::config::Settings;

/// How long `status` lets the oldest-row query run.
const OLDEST_ROW_TIMEOUT_MS: u32 = 2_000;

/// One outbox table's figures as `status` shows them (in `outbox_tables`, beside its name and
/// whether the publication publishes it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TableFigures {
    /// Planner's estimate of the rows (summed over partitions); `null` when never analyzed.
    pub estimated_rows: Option<i64>,
    /// Bytes on disk, indexes and TOAST included, over every partition.
    pub size_bytes: Option<i64>,
    pub partitioned: Option<bool>,
    /// The timestamp column's smallest value (RFC 3339, UTC); `null` when empty or unknown.
    pub oldest_row: Option<String>,
    /// Seconds since then.
    pub oldest_row_age_seconds: Option<f64>,
    /// `[retention]` as configured for it (`null`: off).
    pub retention: Option<String>,
    /// What retention last did (`null`: never ran, or its record cannot be read).
    pub last_retention: Option<RetentionRecord>,
    /// Why something above could not be read.
    pub error: Option<String>,
}

/// A row of retention's record table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetentionRecord {
    /// Last run (RFC 3339, UTC).
    pub last_run_at: Option<String>,
    /// Last run that removed anything, and what it removed.
    pub last_removed_at: Option<String>,
    pub last_removed_rows: i64,
    pub last_removed_partitions: i64,
    /// Newest timestamp among the rows it removed.
    pub last_removed_through: Option<String>,
    /// Rows removed since the record was created (partitions: estimates).
    pub total_removed_rows: i64,
    /// A partition detached and waiting for the slot to pass it before it is dropped.
    pub detached_partition: Option<String>,
}

/// Reads every outbox table's figures, in `outbox.table` order.
pub(crate) async fn read(client: &Client, settings: &Settings) -> Vec<TableFigures> {
    let mut out = Vec::new();
    for table in &settings.outbox.tables {
        out.push(read_one(client, settings, table).await);
    }
    out
}

fn time_text(sql_expr: &str) -> String {
    format!("to_char({sql_expr} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
}

async fn read_one(client: &Client, settings: &Settings, table: &TableName) -> TableFigures {
    let (timestamp, _) = settings.created_at_column();
    let mut status = TableFigures {
        estimated_rows: None,
        size_bytes: None,
        partitioned: None,
        oldest_row: None,
        oldest_row_age_seconds: None,
        retention: settings.retention.as_ref().map(|r| {
            format!(
                "{}, keep {} s, every {} s",
                r.mode.label(),
                r.keep.as_secs(),
                r.interval.as_secs()
            )
        }),
        last_retention: None,
        error: None,
    };
    let mut errors = Vec::new();
    let sizes = client
        .query_opt(
            // `pg_partition_tree()` lists nothing for a table outside a partition tree (a plain
            // outbox table): the table itself is then the one leaf.
            "WITH tree AS (
                 SELECT t.relid, t.isleaf FROM pg_partition_tree($1::text::regclass) t
                 UNION ALL
                 SELECT $1::text::regclass, true
                  WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::text::regclass)))
             SELECT (SELECT CASE WHEN bool_and(c.reltuples < 0) THEN NULL ELSE sum(GREATEST(c.reltuples, 0))::int8 END
                       FROM tree t JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf),
                    (SELECT sum(pg_total_relation_size(t.relid))::int8 FROM tree t),
                    (SELECT relkind = 'p' FROM pg_class WHERE oid = $1::text::regclass)
              WHERE to_regclass($1) IS NOT NULL",
            &[&table.quoted()],
        )
        .await;
    match sizes {
        Ok(Some(row)) => {
            status.estimated_rows = row.get(0);
            status.size_bytes = row.get(1);
            status.partitioned = row.get(2);
        }
        Ok(None) => errors.push(format!("table {table} does not exist")),
        Err(e) => errors.push(format!("size: {}", crate::postgres::failure::describe_pg(&e))),
    }
    if status.size_bytes.is_some() {
        // A transaction of its own so the timeout is local to it.
        let oldest = async {
            client.batch_execute("BEGIN READ ONLY").await?;
            client
                .batch_execute(&format!("SET LOCAL statement_timeout = {OLDEST_ROW_TIMEOUT_MS}"))
                .await?;
            let row = client
                .query_one(
                    &format!(
                        "SELECT {}, EXTRACT(EPOCH FROM now() - min({ts}))::float8 FROM {t}",
                        time_text(&format!("min({})::timestamptz", timestamp.quoted())),
                        ts = timestamp.quoted(),
                        t = table.quoted()
                    ),
                    &[],
                )
                .await;
            client.batch_execute("COMMIT").await?;
            row
        };
        match oldest.await {
            Ok(row) => {
                status.oldest_row = row.get(0);
                status.oldest_row_age_seconds = row.get(1);
            }
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                errors.push(format!(
                    "oldest row by {}: {}",
                    timestamp.quoted(),
                    crate::postgres::failure::describe_pg(&e)
                ))
            }
        }
    }
    let record = format!("{}.{}", table.schema.quoted(), quote_ident(RECORD_TABLE));
    let exists: Result<bool, _> = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&record])
        .await
        .map(|r| r.get(0));
    match exists {
        Ok(true) => {
            let sql = format!(
                "SELECT {}, {}, last_removed_rows, last_removed_partitions, {}, total_removed_rows, detached_partition
                   FROM {record} WHERE outbox_table = $1",
                time_text("last_run_at"),
                time_text("last_removed_at"),
                time_text("last_removed_through"),
            );
            let key = format!("{}.{}", table.schema.as_str(), table.name.as_str());
            match client.query_opt(&sql, &[&key]).await {
                Ok(row) => {
                    status.last_retention = row.map(|r| RetentionRecord {
                        last_run_at: r.get(0),
                        last_removed_at: r.get(1),
                        last_removed_rows: r.get(2),
                        last_removed_partitions: r.get(3),
                        last_removed_through: r.get(4),
                        total_removed_rows: r.get(5),
                        detached_partition: r.get(6),
                    })
                }
                Err(e) => errors.push(format!(
                    "retention record: {}",
                    crate::postgres::failure::describe_pg(&e)
                )),
            }
        }
        Ok(false) => {}
        Err(e) => errors.push(format!(
            "retention record: {}",
            crate::postgres::failure::describe_pg(&e)
        )),
    }
    if !errors.is_empty() {
        status.error = Some(errors.join("; "));
    }
    status
}

/// The human lines of one table: `name` (quoted) and `note` (e.g. not in the publication) first.
pub(crate) fn render(name: &str, note: &str, t: &TableFigures, f: &mut String) -> std::fmt::Result {
    let rows = t
        .estimated_rows
        .map_or("unknown (never analyzed)".to_owned(), |r| format!("~{r} (estimate)"));
    let size = t.size_bytes.map_or("unknown".to_owned(), super::human_bytes);
    writeln!(f, "outbox table: {name}{note}: {rows} rows, {size}")?;
    match (&t.oldest_row, t.oldest_row_age_seconds) {
        (Some(at), Some(age)) => writeln!(f, "  oldest row: {at} ({:.0} s old)", age)?,
        _ => writeln!(f, "  oldest row: none")?,
    }
    match (&t.retention, &t.last_retention) {
        (None, _) => writeln!(f, "  retention: off")?,
        (Some(r), None) => writeln!(f, "  retention: {r}; no run recorded yet")?,
        (Some(r), Some(last)) => {
            writeln!(
                f,
                "  retention: {r}; last run {}; last removed {} rows, {} partitions at {} (through {}); {} rows in total",
                last.last_run_at.as_deref().unwrap_or("never"),
                last.last_removed_rows,
                last.last_removed_partitions,
                last.last_removed_at.as_deref().unwrap_or("never"),
                last.last_removed_through.as_deref().unwrap_or("-"),
                last.total_removed_rows
            )?;
            if let Some(p) = &last.detached_partition {
                writeln!(f, "  detached, waiting for the slot before it is dropped: {p}")?;
            }
        }
    }
    if let Some(e) = &t.error {
        writeln!(f, "  could not read: {e}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_status_lines_say_estimate_and_last_removal() {
        let t = TableFigures {
            estimated_rows: Some(1200),
            size_bytes: Some(3 * 1024 * 1024),
            partitioned: Some(false),
            oldest_row: Some("2026-11-18T00:00:00.000000Z".into()),
            oldest_row_age_seconds: Some(604_800.0),
            retention: Some("delete, keep 604800 s, every 60 s".into()),
            last_retention: Some(RetentionRecord {
                last_run_at: Some("2026-11-25T12:00:00.000000Z".into()),
                last_removed_at: Some("2026-11-25T11:59:00.000000Z".into()),
                last_removed_rows: 500,
                last_removed_partitions: 0,
                last_removed_through: Some("2026-11-18T00:00:00.000000Z".into()),
                total_removed_rows: 9000,
                detached_partition: None,
            }),
            error: None,
        };
        let mut s = String::new();
        render("public.events_outbox", "", &t, &mut s).unwrap();
        assert!(s.contains("~1200 (estimate)"), "{s}");
        assert!(s.contains("3.0 MiB"), "{s}");
        assert!(s.contains("last removed 500 rows"), "{s}");
        assert!(s.contains("9000 rows in total"), "{s}");
    }
}
