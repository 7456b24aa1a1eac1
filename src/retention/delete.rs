//! `retention.mode = "delete"`: published rows older than `keep` are deleted in batches of
//! `batch_size`, one short transaction per statement.
//!
//! Streaming (the invariant of `src/retention/mod.rs`): a [`Snapshot`] is taken in one
//! `REPEATABLE READ` transaction — the candidate rows' ids first, then
//! `pg_current_wal_insert_lsn()`. Every row the snapshot sees was committed before it was
//! taken, and a commit record is inserted into WAL before its transaction becomes visible, so
//! every candidate's commit ends before that position. The ids are deleted only once the slot's
//! `confirmed_flush_lsn` reached it, i.e. once the relay confirmed (after the broker
//! acknowledged) every transaction that ended before it. A row committed later — even with an
//! old timestamp, by a long transaction — is in no earlier snapshot, so it waits for a later one.
//!
//! Streaming, pace: the walsender decodes every delete's WAL (and replays each delete
//! transaction through pgoutput at its commit) before it reaches the events committed after it,
//! although it publishes none of them. Deleting at the server's pace put the stream seconds
//! behind (docs/benchmarks.md, "Retention"), so after each batch [`delete_ids`] waits until the
//! slot's walsender has decoded past the batch's commit (`pg_stat_replication.sent_lsn`) before
//! the next one: the stream is never more than one batch behind because of retention. Then it
//! rests as long as the statement took. Where the role may not read `sent_lsn` (it needs
//! `pg_read_all_stats`), only the rest remains, and it says so once.
//!
//! Polling: the poller sets the dispatched column only after the broker acknowledged, so rows
//! with it set are published; they are deleted directly, skipping rows a claim has locked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, IsolationLevel};
use tracing::{info, warn};

use crate::config::ident::Ident;
use crate::postgres::lsn::Lsn;
use crate::retention::record::Removed;
use crate::retention::{RetentionError, Target};

/// Batches one snapshot holds at most: bounds memory (ids are kept as text) and how long a
/// snapshot waits for the slot.
pub(crate) const SNAPSHOT_BATCHES: usize = 20;

/// Candidate rows and the WAL position the slot must pass before they are deleted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) ids: Vec<String>,
    pub(crate) lsn: Lsn,
    /// Newest candidate's timestamp (Unix seconds).
    pub(crate) newest_unix: Option<f64>,
    /// The snapshot hit its limit: more old rows are probably waiting.
    pub(crate) full: bool,
}

/// `SELECT` of up to `limit` ids of rows older than `keep` (and not older than the slot, when
/// `setup` created it without a backfill: [`Target::not_before_unix`]), oldest first.
pub(crate) fn candidates_sql(target: &Target, limit: usize) -> String {
    let not_before = target
        .not_before_unix
        .map(|t| format!(" AND {} >= to_timestamp({t})", target.timestamp.quoted()))
        .unwrap_or_default();
    format!(
        "SELECT {id}::text, EXTRACT(EPOCH FROM {ts})::float8 FROM {t} WHERE {ts} < now() - interval '{ms} milliseconds'\
         {not_before} ORDER BY {ts} LIMIT {limit}",
        id = target.id.quoted(),
        ts = target.timestamp.quoted(),
        t = target.table.quoted(),
        ms = target.keep_ms,
    )
}

/// Takes a snapshot (see the module docs for why it is taken in this order).
pub(crate) async fn snapshot(
    client: &mut Client,
    target: &Target,
    batch_size: usize,
) -> Result<Snapshot, RetentionError> {
    let limit = batch_size * SNAPSHOT_BATCHES;
    let failed = |what| RetentionError::query(&target.table, what);
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(failed("starting the snapshot transaction"))?;
    let rows = tx
        .query(candidates_sql(target, limit).as_str(), &[])
        .await
        .map_err(failed("selecting rows older than retention.keep"))?;
    // Read after the snapshot exists (its first statement): past every visible commit.
    let lsn: String = tx
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(failed("reading the WAL position"))?
        .get(0);
    tx.commit().await.map_err(failed("ending the snapshot transaction"))?;
    let lsn = lsn.parse().map_err(|_| RetentionError::Lsn { text: lsn.clone() })?;
    let newest_unix = rows.last().map(|r| r.get::<_, f64>(1));
    Ok(Snapshot {
        full: rows.len() >= limit,
        ids: rows.into_iter().map(|r| r.get(0)).collect(),
        lsn,
        newest_unix,
    })
}

/// Longest wait for the walsender to decode past one batch before the run leaves the rest to the
/// next interval: the stream has a backlog of its own then, and retention yields to it.
const DECODE_WAIT: Duration = Duration::from_secs(10);
/// How often `sent_lsn` is read while waiting (a batch decodes in milliseconds).
const DECODE_POLL: Duration = Duration::from_millis(5);

/// How a batch's wait for the walsender ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// The walsender decoded past the batch.
    Decoded,
    /// It did not within [`DECODE_WAIT`], or no walsender holds the slot: stop this run.
    Behind,
    /// `sent_lsn` is not visible to this role: rest instead.
    Unknown,
}

/// Whether [`Pace::Unknown`] was logged (once per process).
static UNKNOWN_SAID: AtomicBool = AtomicBool::new(false);

/// Waits until the walsender holding `slot` has sent (decoded) WAL up to the current insert
/// position — past the batch that just committed.
async fn decoded_past_now(client: &Client, target: &Target, slot: &str) -> Result<Pace, RetentionError> {
    let failed = |what| RetentionError::query(&target.table, what);
    let lsn: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(failed("reading the WAL position"))?
        .get(0);
    let lsn: Lsn = lsn.parse().map_err(|_| RetentionError::Lsn { text: lsn.clone() })?;
    let deadline = Instant::now() + DECODE_WAIT;
    loop {
        let row = client
            .query_opt(
                "SELECT r.sent_lsn::text FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
                  WHERE s.slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(failed("reading the walsender's position"))?;
        let sent: Option<String> = match row {
            None => return Ok(Pace::Behind),
            Some(row) => row.get(0),
        };
        let Some(sent) = sent else {
            if !UNKNOWN_SAID.swap(true, Ordering::Relaxed) {
                info!(
                    slot,
                    "retention cannot read the walsender's position (pg_stat_replication.sent_lsn needs the \
                     pg_read_all_stats role): it paces deletes by resting instead; GRANT pg_read_all_stats to the \
                     relay's role to keep the stream from falling behind while a backlog is deleted"
                );
            }
            return Ok(Pace::Unknown);
        };
        match sent.parse::<Lsn>() {
            Ok(sent) if sent >= lsn => return Ok(Pace::Decoded),
            Ok(_) if Instant::now() >= deadline => {
                warn!(table = %target.table, slot, "the walsender is more than 10 s behind retention's deletes; retention yields until the next interval");
                return Ok(Pace::Behind);
            }
            Ok(_) => tokio::time::sleep(DECODE_POLL).await,
            Err(_) => return Err(RetentionError::Lsn { text: sent }),
        }
    }
}

/// Deletes a snapshot's rows in batches, each once the walsender decoded the previous one (see
/// the module docs); stops early (keeping the rest, `Pace::Behind`) when the walsender lags or
/// `stop` says so.
pub(crate) async fn delete_ids(
    client: &Client,
    target: &Target,
    snapshot: &Snapshot,
    batch_size: usize,
    slot: &str,
    stop: &(dyn Fn() -> bool + Send + Sync),
) -> Result<(Removed, Pace), RetentionError> {
    let sql = format!(
        "DELETE FROM {t} WHERE {id} = ANY($1::text[]::{ty}[])",
        t = target.table.quoted(),
        id = target.id.quoted(),
        ty = target.id_type,
    );
    let statement = client
        .prepare(&sql)
        .await
        .map_err(RetentionError::query(&target.table, "preparing the delete"))?;
    let mut removed = Removed::default();
    let mut pace = Pace::Decoded;
    for batch in snapshot.ids.chunks(batch_size.max(1)) {
        if stop() {
            break;
        }
        let started = std::time::Instant::now();
        let n = client
            .execute(&statement, &[&batch])
            .await
            .map_err(RetentionError::query(&target.table, "deleting published rows"))?;
        removed.rows += n;
        record_rows(target, n);
        pace = decoded_past_now(client, target, slot).await?;
        if pace == Pace::Behind {
            break;
        }
        // The writers and the server's other work get as much time as the statement took.
        rest_after(started).await;
    }
    removed.through_unix = snapshot.newest_unix;
    Ok((removed, pace))
}

/// Polling: deletes dispatched rows older than `keep`, `batch_size` per statement, until a
/// statement deletes fewer (or `max_batches` ran, or `stop` says so).
pub(crate) async fn delete_dispatched(
    client: &Client,
    target: &Target,
    dispatched: &Ident,
    batch_size: usize,
    max_batches: usize,
    stop: &(dyn Fn() -> bool + Send + Sync),
) -> Result<Removed, RetentionError> {
    let sql = format!(
        "WITH gone AS (
            DELETE FROM {t} WHERE {id} IN (
                SELECT {id} FROM {t} WHERE {d} IS NOT NULL AND {ts} < now() - interval '{ms} milliseconds'
                 ORDER BY {ts} LIMIT {batch_size} FOR UPDATE SKIP LOCKED)
              AND {d} IS NOT NULL AND {ts} < now() - interval '{ms} milliseconds'
            RETURNING {ts})
         SELECT count(*)::int8, max(EXTRACT(EPOCH FROM {ts}))::float8 FROM gone",
        t = target.table.quoted(),
        id = target.id.quoted(),
        d = dispatched.quoted(),
        ts = target.timestamp.quoted(),
        ms = target.keep_ms,
    );
    let mut removed = Removed::default();
    for _ in 0..max_batches {
        if stop() {
            break;
        }
        let started = std::time::Instant::now();
        let row = client
            .query_one(sql.as_str(), &[])
            .await
            .map_err(RetentionError::query(&target.table, "deleting dispatched rows"))?;
        let n = row.get::<_, i64>(0) as u64;
        removed.rows += n;
        if let Some(t) = row.get::<_, Option<f64>>(1) {
            removed.through_unix = Some(removed.through_unix.map_or(t, |u: f64| u.max(t)));
        }
        record_rows(target, n);
        if n < batch_size as u64 {
            break;
        }
        rest_after(started).await;
    }
    Ok(removed)
}

/// Longest rest between two delete statements.
const MAX_REST: std::time::Duration = std::time::Duration::from_secs(1);

/// Rests as long as the statement that started at `started` took (at most [`MAX_REST`]): a
/// backlog is removed at half the pace the server could take, and the other half is left to
/// the writers and, streaming, to the walsender.
async fn rest_after(started: std::time::Instant) {
    tokio::time::sleep(started.elapsed().min(MAX_REST)).await;
}

fn record_rows(target: &Target, n: u64) {
    ::metrics::counter!(crate::ops::metrics::RETENTION_ROWS_REMOVED, crate::ops::metrics::TABLE_LABEL => target.label.clone())
        .increment(n);
}
