//! `setup --backfill`: moving from a polling relayer to the relay without losing an event — and,
//! with `--since-id N` / `--since TIMESTAMP`, recovering from a lost slot (a failover on
//! PostgreSQL 14-16, which have no failover slots): the same steps, publishing every outbox row
//! after the recovery point instead of the undispatched ones (duplicates allowed, losses not).
//!
//! A polling relayer marks rows it has published (`dispatched_at = now()`); rows with that
//! column NULL are still owed to Kafka. A fresh slot only streams what commits *after* its
//! creation, so switching naively would lose every row pending at that moment. The backfill
//! closes exactly that gap:
//!
//! 1. preflight, and refuse if the slot already exists — the snapshot below can only be taken
//!    at the moment the slot is created;
//! 2. create the publication (if missing), then the slot on a replication connection with
//!    `CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')`, which returns the slot's consistent point
//!    and an exported snapshot showing precisely the transactions committed before it;
//! 3. on an ordinary connection, import that snapshot and publish every row whose dispatched
//!    column is NULL in it ([`pending`]), exactly as streaming would ([`publish`]), and wait for
//!    Kafka to acknowledge them all;
//! 4. release the snapshot. `run` then starts at the consistent point.
//!
//! With several outbox tables (`outbox.table` a list) step 3 reads and publishes each table in
//! turn, every one as of the same snapshot; within a table rows go in insertion order, so
//! per-aggregate order holds within each table, as it does when streaming.
//!
//! No gap: a row committed before the consistent point is in the snapshot (published here if
//! still pending); a row committed after it is decoded from the slot. No overlap in a clean run:
//! a transaction is on exactly one side of the consistent point. Rows a poller dispatched
//! before the snapshot are not republished. Per-aggregate order holds when `run` starts after
//! the backfill returned (the documented procedure): every backfilled row is acknowledged before
//! streaming starts, and all of them committed earlier than anything streamed.
//!
//! If anything fails after the slot was created, the slot is dropped again (nothing ever
//! streamed from it), so a second attempt starts from a clean state and at worst republishes
//! some rows — never skips one.

mod error;
pub(crate) mod pending;
pub(crate) mod publish;

use std::fmt;

use tokio_postgres::Client;
use tracing::{info, warn};

pub(crate) use error::BackfillError;
pub(crate) use pending::Selection;
use pending::{PendingOrder, PendingRows};
use publish::BackfillPublisher;

use super::preflight::{CheckedTable, MappedColumn};
use super::setup::{ensure_publication, SetupReport, SlotOutcome};
use super::{connect, describe, preflight, ControlError};
use crate::config::ident::{Ident, TableName};
use crate::config::Settings;
use crate::outbox::event::RowFormat;
use crate::postgres::lsn::Lsn;
use crate::postgres::replication::connection::ReplicationConnection;

/// The config key that names the dispatched column (shared with the polling relayer).
pub(crate) const DISPATCHED_KEY: &str = "poll.dispatched_column";

/// Id column types whose order is insertion order (sequences).
pub(crate) const SEQUENTIAL_ID_TYPES: [&str; 3] = ["smallint", "integer", "bigint"];

/// `--since TIMESTAMP` with `[retention]` configured: rows older than `retention.keep` may
/// already be gone, so a window reaching further back than `keep` would silently publish less
/// than asked. Refused, naming both.
async fn refuse_retention_shorter_than_window(
    client: &Client,
    settings: &Settings,
    selection: &Selection<'_>,
) -> Result<(), BackfillError> {
    let (Some(retention), Selection::Since(since)) = (&settings.retention, selection) else {
        return Ok(());
    };
    let window: f64 = client
        .query_one(
            "SELECT EXTRACT(EPOCH FROM now() - $1::text::timestamptz)::float8",
            &[since],
        )
        .await
        .map_err(|e| BackfillError::Unsupported(format!("--since {since:?} is not a time PostgreSQL reads: {e}")))?
        .get(0);
    let keep = retention.keep.as_secs_f64();
    if window > keep {
        return Err(BackfillError::Unsupported(format!(
            "--since {since:?} reaches {:.0} s back, but [retention] keep is {:.0} s: rows older than keep may already \
             have been removed, so the backfill could miss events. Raise retention.keep above the window (and restart \
             the relays) or choose a later --since",
            window, keep
        )));
    }
    Ok(())
}

/// What `setup --backfill` did.
#[derive(Debug, Clone)]
pub(crate) struct BackfillReport {
    pub(crate) setup: SetupReport,
    /// Which rows it published, for the report (e.g. `dispatched_at IS NULL`, `id > 41`).
    pub(crate) selection: String,
    /// Pending rows published and acknowledged by Kafka.
    pub(crate) published: u64,
    /// Rows committed after this position are streamed by `run`.
    pub(crate) consistent_point: Lsn,
}

impl fmt::Display for BackfillReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.setup)?;
        write!(
            f,
            "backfill: published {} pending rows ({} in the slot's snapshot); the broker acknowledged all of them. \
             Start `outbox-relay run` now: it streams every row committed after {}",
            self.published, self.selection, self.consistent_point
        )
    }
}

/// Creates the publication and the slot, and publishes the rows still pending at the slot's
/// consistent point (see the module docs).
pub(crate) async fn setup_with_backfill(
    settings: &Settings,
    selection: Selection<'_>,
) -> Result<BackfillReport, BackfillError> {
    // What `run` would refuse, refused before anything is created.
    super::setup::refuse_as_run(settings)?;
    let client = connect(settings).await?;
    let before = preflight(&client, settings).await?;
    let retention = crate::retention::check(&client, settings)
        .await
        .map_err(ControlError::from)?;
    let slot = settings.postgres.slot.as_str();
    if before.slot.is_some() {
        return Err(BackfillError::SlotExists { slot: slot.to_owned() });
    }
    // The sink must be ready (a stream, an exchange) before the slot's snapshot is published.
    let sink = crate::sink::prepare(settings).await.map_err(BackfillError::Producer)?;
    // Every table is checked before the slot exists: a refusal leaves nothing behind.
    let mut sources = Vec::with_capacity(before.tables.len());
    for table in &before.tables {
        let id_is_sequential = id_is_sequential(&table.columns);
        match selection {
            Selection::Undispatched(dispatched) => check_dispatched_column(&client, table, dispatched).await?,
            Selection::AfterId(_) if !id_is_sequential => {
                return Err(BackfillError::Unsupported(format!(
                    "--since-id needs an integer id column (a sequence), but {} of {} is {}; use --since TIMESTAMP",
                    settings.outbox.id,
                    table.facts.name,
                    table.columns.first().map_or("unknown", |c| c.type_name.as_str())
                )))
            }
            Selection::Since(_) => {
                let (created_at, _) = settings.created_at_column();
                if !super::catalog::has_column(&client, &table.facts.name, &created_at).await? {
                    return Err(BackfillError::Unsupported(super::catalog::no_creation_column(
                        settings,
                        &table.facts.name,
                        "--since",
                        "use --since-id",
                    )));
                }
            }
            _ => {}
        }
        sources.push(Source::of(settings, &table.facts.name, &table.columns)?);
    }
    refuse_retention_shorter_than_window(&client, settings, &selection).await?;
    let mut notices = Vec::new();
    let publication = ensure_publication(&client, &before, &mut notices).await?;

    let mut repl = ReplicationConnection::connect(&settings.postgres, settings.relay.connect_timeout)
        .await
        .map_err(BackfillError::replication("opening a replication connection"))?;
    // Like any slot creation, this waits for the transactions running right now to finish.
    let (consistent_point, snapshot) = match repl
        .create_logical_slot_exporting_snapshot(slot, before.wants_failover)
        .await
    {
        Ok(created) => created,
        Err(e) if e.sqlstate() == Some("42710") => return Err(BackfillError::SlotExists { slot: slot.to_owned() }),
        Err(e) => {
            return Err(BackfillError::replication(
                "creating the slot with an exported snapshot",
            )(e))
        }
    };
    info!(%slot, %consistent_point, %snapshot, "slot created; publishing the rows pending in its snapshot");

    let description = selection.to_string();
    let published = match copy_pending(settings, &snapshot, &selection, &sources).await {
        Ok(n) => n,
        Err(cause) => return Err(undo_slot(repl, &client, slot, settings.relay.connect_timeout, cause).await),
    };
    // Closing the exporting connection releases the snapshot (and the xmin it held back).
    repl.close().await;
    info!(%slot, published, "backfill complete");

    // The pending rows are published now: the slot vouches for every row again.
    notices.extend(crate::retention::note_slot_created(&client, settings, true).await);
    let after = preflight(&client, settings).await?;
    Ok(BackfillReport {
        setup: SetupReport {
            preflight: after,
            publication,
            slot: SlotOutcome::Created { consistent_point },
            notices,
            sink,
            retention,
        },
        selection: description,
        published,
        consistent_point,
    })
}

/// One outbox table to backfill: how its rows are ordered and become events.
pub(crate) struct Source {
    pub(crate) table: TableName,
    /// The id column is an integer (a sequence), so its order is insertion order.
    pub(crate) id_is_sequential: bool,
    pub(crate) format: RowFormat,
}

impl Source {
    /// How `table`'s rows are ordered and become events.
    pub(crate) fn of(settings: &Settings, table: &TableName, columns: &[MappedColumn]) -> Result<Source, ControlError> {
        Ok(Source {
            table: table.clone(),
            id_is_sequential: id_is_sequential(columns),
            format: super::preflight::row_format(settings, table, columns)?,
        })
    }
}

/// The id column (the first mapped one) is an integer (a sequence), so its order is insertion
/// order.
pub(crate) fn id_is_sequential(columns: &[MappedColumn]) -> bool {
    columns
        .first()
        .is_some_and(|c| SEQUENTIAL_ID_TYPES.contains(&c.type_name.as_str()))
}

async fn check_dispatched_column(
    client: &Client,
    table: &CheckedTable,
    dispatched: &Ident,
) -> Result<(), BackfillError> {
    let rows = client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum",
            &[&table.facts.oid],
        )
        .await
        .map_err(BackfillError::query("listing the outbox table's columns"))?;
    let columns: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    if columns.iter().any(|c| c == dispatched.as_str()) {
        return Ok(());
    }
    Err(BackfillError::DispatchedColumnMissing {
        key: DISPATCHED_KEY,
        column: dispatched.clone(),
        table: table.facts.name.clone(),
        columns,
    })
}

/// Reads the pending rows of every table in `snapshot`, table after table, and publishes them;
/// returns how many Kafka acknowledged.
async fn copy_pending(
    settings: &Settings,
    snapshot: &str,
    selection: &Selection<'_>,
    sources: &[Source],
) -> Result<u64, BackfillError> {
    let mut publisher = BackfillPublisher::new(settings).await?;
    let sent = async {
        for source in sources {
            let order = PendingOrder {
                selection: selection.clone(),
                id_is_sequential: source.id_is_sequential,
            };
            let mut rows = PendingRows::open(settings, snapshot, &source.table, &order).await?;
            loop {
                let batch = rows.next_batch().await?;
                if batch.is_empty() {
                    break;
                }
                for row in &batch {
                    publisher.publish(&source.table, &source.format, row).await?;
                }
                if publisher.sent % 10_000 < batch.len() as u64 {
                    info!(published = publisher.sent, table = %source.table, "backfill in progress");
                }
            }
            rows.close().await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = sent {
        publisher.abandon();
        return Err(e);
    }
    publisher.finish().await
}

/// After a failed backfill: drop the slot it created, so the next attempt can start over.
async fn undo_slot(
    mut repl: ReplicationConnection,
    client: &Client,
    slot: &str,
    timeout: std::time::Duration,
    cause: BackfillError,
) -> BackfillError {
    warn!(%slot, error = %cause, "backfill failed; dropping the slot it created");
    let cause = Box::new(cause);
    // Bounded: the replication connection may be what broke (a dead peer never answers).
    let sql = format!("DROP_REPLICATION_SLOT {slot}");
    let drop_slot = repl.simple_query(&sql);
    let over_replication = match tokio::time::timeout(timeout, drop_slot).await {
        Ok(result) => result.map(|_| ()).map_err(|e| e.to_string()),
        Err(_) => Err(format!("DROP_REPLICATION_SLOT did not answer within {timeout:?}")),
    };
    repl.close().await;
    let Err(first) = over_replication else {
        return BackfillError::RolledBack {
            slot: slot.to_owned(),
            cause,
        };
    };
    // Try an ordinary connection instead.
    let second =
        match tokio::time::timeout(timeout, client.execute("SELECT pg_drop_replication_slot($1)", &[&slot])).await {
            Ok(Ok(_)) => {
                return BackfillError::RolledBack {
                    slot: slot.to_owned(),
                    cause,
                }
            }
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("pg_drop_replication_slot did not answer within {timeout:?}"),
        };
    BackfillError::SlotLeftBehind {
        slot: slot.to_owned(),
        cause,
        drop_error: format!("{first}; {second}"),
    }
}
