//! `retention.mode = "partitions"`: the outbox is partitioned by range of its timestamp column.
//! Partitions are kept created `partitions_ahead` widths past now (so an insert always finds
//! one), and a partition whose upper bound is older than `keep` is detached, then dropped once
//! every row in it is known to be published.
//!
//! Creating: `CREATE TABLE … (LIKE parent INCLUDING DEFAULTS INCLUDING CONSTRAINTS)` then
//! `ATTACH PARTITION`, which takes `SHARE UPDATE EXCLUSIVE` on the parent and so never blocks
//! inserts. A range some existing partition already overlaps (`pg_partman`, a hand-made one) is
//! left alone. Names are `<table>_p<lower bound, Unix seconds>`.
//!
//! Dropping, streaming: `DETACH PARTITION` waits (at most `lock_timeout`, then the next interval
//! retries) for every transaction that inserted into the partition to end, and after it no
//! insert can reach the partition. The WAL insert position read after the detach committed is
//! therefore past the commit of every row in it; the partition is dropped once the slot's
//! `confirmed_flush_lsn` reached that position, and attached again if the slot turns missing or
//! invalidated first. Polling: a partition is detached only when it holds no row with the
//! dispatched column NULL, checked again after the detach (attached again if one appeared).
//! The default partition is never touched.

use tokio_postgres::Client;
use tracing::{info, warn};

use crate::config::ident::Ident;
use crate::ops::metrics::{
    RETENTION_PARTITIONS_CREATED, RETENTION_PARTITIONS_DROPPED, RETENTION_ROWS_REMOVED, TABLE_LABEL,
};
use crate::retention::record::{self, Detached, Removed};
use crate::retention::{RetentionError, Target};

/// One partition of the outbox table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Partition {
    /// Schema-qualified and quoted.
    pub(crate) name: String,
    /// `pg_get_expr(relpartbound)`: `FOR VALUES FROM (…) TO (…)` or `DEFAULT`.
    pub(crate) bound: String,
    /// Bounds in Unix seconds; `None` for the default partition or a bound that is not a time.
    pub(crate) lower: Option<f64>,
    pub(crate) upper: Option<f64>,
    /// Whether the upper bound is older than `keep`.
    pub(crate) expired: bool,
    /// `reltuples`: the planner's estimate of its rows (-1 never analyzed).
    pub(crate) estimated_rows: f64,
}

/// Checks that the table is partitioned by range of the timestamp column alone.
pub(crate) async fn check(client: &Client, target: &Target) -> Result<(), RetentionError> {
    let row = client
        .query_opt(
            "SELECT p.partstrat::text, ARRAY(SELECT a.attname::text FROM unnest(p.partattrs::int2[]) k
                                              JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k)
               FROM pg_partitioned_table p WHERE p.partrelid = $1::text::regclass",
            &[&target.table.quoted()],
        )
        .await
        .map_err(RetentionError::query(
            &target.table,
            "reading how the table is partitioned",
        ))?;
    let found = match row {
        None => "not partitioned".to_owned(),
        Some(r) => {
            let (strategy, columns): (String, Vec<String>) = (r.get(0), r.get(1));
            if strategy == "r" && columns == [target.timestamp.as_str()] {
                return Ok(());
            }
            format!("strategy {strategy}, key {columns:?}")
        }
    };
    Err(RetentionError::NotPartitioned {
        table: target.table.to_string(),
        column: target.timestamp.quoted(),
        found,
    })
}

/// The table's partitions, with their bounds read back as times (the session runs in UTC).
pub(crate) async fn list(client: &Client, target: &Target) -> Result<Vec<Partition>, RetentionError> {
    let rows = client
        .query(
            &format!(
                "WITH p AS (
                    SELECT format('%I.%I', n.nspname, c.relname) AS name, pg_get_expr(c.relpartbound, c.oid) AS bound,
                           c.reltuples::float8 AS estimated_rows
                      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                      JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE i.inhparent = $1::text::regclass),
                 b AS (
                    SELECT name, bound, estimated_rows,
                           EXTRACT(EPOCH FROM substring(bound FROM 'FROM \\(''([^'']*)''\\)')::timestamptz)::float8 AS lower,
                           EXTRACT(EPOCH FROM substring(bound FROM 'TO \\(''([^'']*)''\\)')::timestamptz)::float8 AS upper
                      FROM p)
                 SELECT name, bound, lower, upper,
                        COALESCE(to_timestamp(upper) < now() - interval '{ms} milliseconds', false), estimated_rows
                   FROM b ORDER BY upper NULLS LAST",
                ms = target.keep_ms
            ),
            &[&target.table.quoted()],
        )
        .await
        .map_err(RetentionError::query(&target.table, "listing partitions"))?;
    Ok(rows
        .into_iter()
        .map(|r| Partition {
            name: r.get(0),
            bound: r.get(1),
            lower: r.get(2),
            upper: r.get(3),
            expired: r.get(4),
            estimated_rows: r.get(5),
        })
        .collect())
}

/// The partition name for a range starting at `lower` (Unix seconds).
pub(crate) fn partition_name(target: &Target, lower: i64) -> Result<Ident, RetentionError> {
    let name = format!("{}_p{lower}", target.table.name.as_str());
    Ident::exact("partition", &name).map_err(|_| RetentionError::PartitionNameTooLong {
        table: target.table.to_string(),
    })
}

/// The ranges `[lower, upper)` (Unix seconds) that should exist: the one holding `now` and
/// `ahead` more.
pub(crate) fn wanted_ranges(now_unix: i64, width_secs: i64, ahead: u32) -> Vec<(i64, i64)> {
    let first = now_unix.div_euclid(width_secs) * width_secs;
    (0..=i64::from(ahead))
        .map(|k| (first + k * width_secs, first + (k + 1) * width_secs))
        .collect()
}

/// Creates the missing partitions ahead; returns how many it created.
pub(crate) async fn create_ahead(
    client: &Client,
    target: &Target,
    width_secs: i64,
    ahead: u32,
) -> Result<u64, RetentionError> {
    let now: i64 = client
        .query_one("SELECT EXTRACT(EPOCH FROM now())::int8", &[])
        .await
        .map_err(RetentionError::query(&target.table, "reading the time"))?
        .get(0);
    let existing = list(client, target).await?;
    let mut created = 0;
    for (lower, upper) in wanted_ranges(now, width_secs, ahead) {
        let overlaps = existing.iter().any(|p| match (p.lower, p.upper) {
            (Some(l), Some(u)) => l < upper as f64 && u > lower as f64,
            _ => false,
        });
        if overlaps {
            continue;
        }
        let name = partition_name(target, lower)?;
        let qualified = format!("{}.{}", target.table.schema.quoted(), name.quoted());
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {qualified} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
             ALTER TABLE {parent} ATTACH PARTITION {qualified} FOR VALUES FROM (to_timestamp({lower})) TO (to_timestamp({upper}))",
            parent = target.table.quoted()
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(RetentionError::query(&target.table, "creating a partition ahead"))?;
        info!(table = %target.table, partition = %qualified, "retention created a partition ahead");
        ::metrics::counter!(RETENTION_PARTITIONS_CREATED, TABLE_LABEL => target.label.clone()).increment(1);
        created += 1;
    }
    Ok(created)
}

/// Whether `partition` holds a row whose dispatched column is NULL (polling: unpublished).
async fn holds_undispatched(
    client: &Client,
    target: &Target,
    partition: &str,
    dispatched: &Ident,
) -> Result<bool, RetentionError> {
    client
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {partition} WHERE {} IS NULL)",
                dispatched.quoted()
            ),
            &[],
        )
        .await
        .map(|r| r.get(0))
        .map_err(RetentionError::query(
            &target.table,
            "looking for undispatched rows in a partition",
        ))
}

/// Detaches the oldest expired partition (never the default one). Streaming: returns it with
/// the WAL position to wait for. Polling (`dispatched` set): `None` when it holds an
/// undispatched row (it stays, or is attached again).
pub(crate) async fn detach_oldest(
    client: &Client,
    target: &Target,
    dispatched: Option<&Ident>,
) -> Result<Option<Detached>, RetentionError> {
    let partitions = list(client, target).await?;
    // Streaming after `setup` created the slot without a backfill: only partitions wholly after
    // its creation (`Target::not_before_unix`).
    let after_slot = |p: &Partition| match (target.not_before_unix, p.lower) {
        (Some(t), Some(lower)) => lower >= t,
        (Some(_), None) => false,
        (None, _) => true,
    };
    let Some(oldest) = partitions
        .into_iter()
        .find(|p| p.expired && p.bound != "DEFAULT" && after_slot(p))
    else {
        return Ok(None);
    };
    if let Some(d) = dispatched {
        if holds_undispatched(client, target, &oldest.name, d).await? {
            return Ok(None);
        }
    }
    alter_outbox(
        client,
        target,
        &format!("DETACH PARTITION {}", oldest.name),
        "detaching an expired partition (an insert into it may still be running)",
    )
    .await?;
    let lsn: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(RetentionError::query(&target.table, "reading the WAL position"))?
        .get(0);
    let detached = Detached {
        partition: oldest.name,
        bound: oldest.bound,
        lsn: lsn.parse().map_err(|_| RetentionError::Lsn { text: lsn.clone() })?,
    };
    info!(table = %target.table, partition = %detached.partition, lsn = %detached.lsn, "retention detached an expired partition");
    if let Some(d) = dispatched {
        // A row may have been inserted between the look and the detach.
        if holds_undispatched(client, target, &detached.partition, d).await? {
            reattach(client, target, &detached).await?;
            return Ok(None);
        }
    }
    Ok(Some(detached))
}

/// `ALTER TABLE <the outbox table> <change>`; `doing` names it in the error.
async fn alter_outbox(
    client: &Client,
    target: &Target,
    change: &str,
    doing: &'static str,
) -> Result<(), RetentionError> {
    client
        .batch_execute(&format!("ALTER TABLE {} {change}", target.table.quoted()))
        .await
        .map_err(RetentionError::query(&target.table, doing))
}

/// Attaches a detached partition again (it holds, or may hold, an unpublished row).
pub(crate) async fn reattach(client: &Client, target: &Target, detached: &Detached) -> Result<(), RetentionError> {
    alter_outbox(
        client,
        target,
        &format!("ATTACH PARTITION {} {}", detached.partition, detached.bound),
        "attaching a detached partition again",
    )
    .await?;
    record::set_detached(client, &target.table, None).await.ok();
    warn!(table = %target.table, partition = %detached.partition, "retention attached the partition again: it may hold an unpublished row");
    Ok(())
}

/// Drops a detached partition; what it held counts as removed (rows: the planner's estimate).
pub(crate) async fn drop_detached(
    client: &Client,
    target: &Target,
    detached: &Detached,
) -> Result<Removed, RetentionError> {
    let row = client
        .query_one(
            "SELECT GREATEST(c.reltuples, 0)::int8 FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&detached.partition],
        )
        .await
        .map_err(RetentionError::query(&target.table, "estimating a partition's rows"))?;
    let rows = row.get::<_, i64>(0) as u64;
    let upper: Option<f64> = client
        .query_one(
            "SELECT EXTRACT(EPOCH FROM substring($1 FROM 'TO \\(''([^'']*)''\\)')::timestamptz)::float8",
            &[&detached.bound],
        )
        .await
        .map_err(RetentionError::query(&target.table, "reading a partition's bound"))?
        .get(0);
    client
        .batch_execute(&format!("DROP TABLE {}", detached.partition))
        .await
        .map_err(RetentionError::query(&target.table, "dropping a detached partition"))?;
    info!(table = %target.table, partition = %detached.partition, estimated_rows = rows, "retention dropped a partition");
    ::metrics::counter!(RETENTION_PARTITIONS_DROPPED, TABLE_LABEL => target.label.clone()).increment(1);
    ::metrics::counter!(RETENTION_ROWS_REMOVED, TABLE_LABEL => target.label.clone()).increment(rows);
    Ok(Removed {
        rows,
        partitions: 1,
        through_unix: upper,
    })
}

#[cfg(test)]
mod tests {
    use super::wanted_ranges;

    #[test]
    fn retention_ranges_are_aligned_and_cover_now_and_ahead() {
        let r = wanted_ranges(86_400 * 10 + 5, 86_400, 2);
        assert_eq!(
            r,
            vec![(864_000, 950_400), (950_400, 1_036_800), (1_036_800, 1_123_200)]
        );
        assert!(r[0].0 <= 86_400 * 10 + 5 && 86_400 * 10 + 5 < r[0].1);
    }
}
