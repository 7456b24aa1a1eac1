//! The polling relayer (`outbox-relay poll`): the classic transactional-outbox relay, shipped as
//! the baseline the WAL-streaming relay is measured against, and for databases where logical
//! replication is unavailable.
//!
//! Each of `poll.workers` workers loops: `BEGIN`; claim up to `poll.batch_size` pending rows
//! (`<dispatched> IS NULL`) with `FOR UPDATE SKIP LOCKED`; produce each with the same routing,
//! key, headers and timestamp as the streaming relay; wait until Kafka acknowledged every one;
//! `UPDATE … SET <dispatched> = now() WHERE id = ANY(…)`; `COMMIT`. A claim that came back short
//! of a full batch is followed by a pause of `poll.interval_ms`; a full one by the next claim at
//! once. See [`worker`] for the delivery invariants and [`sql`] for how rows are read so that a
//! polled record is byte-identical to a streamed one.
//!
//! Polling needs no slot, publication or `wal_level = logical`, but costs the database a
//! transaction, a locking index scan and an UPDATE (a new row version, later vacuumed) per batch —
//! which `benches/cdc_vs_polling` measures against streaming. `setup --poll` creates the partial
//! index claims read ([`setup`]).
//!
//! With several outbox tables (`outbox.table` a list) every table is checked before any claim,
//! and each gets `poll.workers` workers and a watchdog of its own: a worker claims from one table
//! only, so per-aggregate order holds within each table exactly as with one, and a slow table
//! never holds up another's claims.
//!
//! With `[http] listen` set, `poll` serves the same endpoints as `run` (`src/ops/http.rs`): `/readyz`
//! is ready while polling, and `/latency` holds row-timestamp-to-ack samples.

mod error;
mod record;
pub(crate) mod setup;
pub(crate) mod sql;
pub(crate) mod table;
mod watchdog;
mod worker;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

pub(crate) use error::PollError;

use crate::backoff::Backoff;
use crate::config::relay::BadEventPolicy;
use crate::config::Settings;
use crate::ops::health::{Mode, RelayHealth};
use crate::ops::retry::wait_or_shutdown;
use sql::PollSql;
use worker::Worker;

/// What `poll` refuses to start with from the configuration alone; `setup --poll` calls it
/// first too, so it refuses the same, in the same words.
pub(crate) fn refusal(settings: &Settings) -> Result<(), PollError> {
    if settings.relay.on_bad_event != BadEventPolicy::Fail {
        return Err(PollError::UnsupportedBadEventPolicy {
            policy: settings.relay.on_bad_event.label(),
        });
    }
    if let Some(tracing) = &settings.tracing {
        crate::ops::tracing_export::check(tracing).map_err(|e| PollError::Tracing(e.to_string()))?;
    }
    Ok(())
}

/// Publishes pending rows until `shutdown` turns true (`Ok`, after every worker finished its
/// current batch) or a fatal error occurs (after the other workers finished theirs).
pub(crate) async fn run(
    settings: &Settings,
    health: &RelayHealth,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PollError> {
    refusal(settings)?;
    // Every table is checked before the first claim: a misconfigured table stops `poll` at start,
    // not after the others have run for a while.
    let mut checked = Vec::with_capacity(settings.outbox.tables.len());
    for outbox in &settings.outbox.tables {
        let Some(table) = check_table(settings, outbox, &mut shutdown).await? else {
            return Ok(());
        };
        match &table.pending_index {
            None => warn!(
                table = %outbox,
                "no index on ({}) WHERE {} IS NULL: every claim scans the table. Run `outbox-relay setup --poll` to create it",
                table.created_at, settings.poll.dispatched
            ),
            Some(index) if !index.valid => {
                warn!(table = %outbox, index = %index.name, "the pending-rows index is INVALID; run `outbox-relay setup --poll`")
            }
            Some(_) => {}
        }
        let rows =
            crate::control::preflight::row_format(settings, outbox, &table.facts.columns).map_err(PollError::Table)?;
        let sql = Arc::new(PollSql::new(settings, outbox, &table.id_type, &table.created_at, rows));
        checked.push((sql, table));
    }
    let poll = &settings.poll;
    info!(
        tables = %settings.outbox.tables_display(),
        dispatched_column = %poll.dispatched,
        workers_per_table = poll.workers,
        batch_size = poll.batch_size,
        interval_ms = poll.interval.as_millis() as u64,
        "polling started"
    );
    health.set_mode(Mode::Polling);
    // `[tracing]`: every worker's spans go through one export queue, on this runtime.
    let (tracer, export_task) = match &settings.tracing {
        Some(t) => {
            let (tracer, task) = crate::ops::tracing_export::start(t).map_err(|e| PollError::Tracing(e.to_string()))?;
            (Some(tracer), Some(task))
        }
        None => (None, None),
    };
    let settings = Arc::new(settings.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut workers = JoinSet::new();
    let _retention = crate::retention::spawn(
        &settings,
        crate::retention::Source::Poll {
            dispatched: settings.poll.dispatched.clone(),
        },
        // Every poller is active: claims never overlap, and retention's deletes skip locked rows.
        || true,
        stop_rx.clone(),
    );
    let mut watchdogs = Vec::with_capacity(checked.len());
    let mut index = 0;
    for (sql, table) in checked {
        let (watched, created_at, stop) = (Arc::clone(&settings), table.created_at.clone(), stop_rx.clone());
        let outbox = sql.table.clone();
        watchdogs.push(tokio::spawn(async move {
            watchdog::run(&watched, &outbox, &created_at, stop).await
        }));
        let id_type: Arc<str> = table.id_type.into();
        for _ in 0..settings.poll.workers {
            let worker = Worker::new(Arc::clone(&settings), Arc::clone(&sql), Arc::clone(&id_type), index)
                .traced(tracer.clone());
            workers.spawn(worker.run(stop_rx.clone()));
            index += 1;
        }
    }
    let mut first_error = None;
    let mut forwarded = false;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(_))) => {}
                Some(Ok(Err(e))) => {
                    error!(error = %e, "fatal; stopping the other workers after their current batch");
                    first_error.get_or_insert(e);
                    let _ = stop_tx.send(true);
                }
                Some(Err(join_error)) => {
                    first_error.get_or_insert(PollError::WorkerPanicked { message: join_error.to_string() });
                    let _ = stop_tx.send(true);
                }
            },
            // A request or a dropped sender both mean stop; forward once.
            _ = shutdown.changed(), if !forwarded => {
                forwarded = true;
                let _ = stop_tx.send(true);
            }
        }
    }
    let _ = stop_tx.send(true);
    for watchdog in watchdogs {
        let _ = watchdog.await;
    }
    // The workers (and their tracers) are gone: the last spans go out.
    drop(tracer);
    if let Some(task) = export_task {
        task.finish().await;
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            health.set_mode(Mode::Stopping);
            info!(tables = %settings.outbox.tables_display(), "polling stopped");
            Ok(())
        }
    }
}

/// Checks `outbox` (see [`table::check`]), retrying while the database is unreachable.
/// `None`: shutdown was requested first.
async fn check_table(
    settings: &Settings,
    outbox: &crate::config::ident::TableName,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<table::PollTable>, PollError> {
    let mut backoff = Backoff::new(
        settings.relay.reconnect_backoff_initial,
        settings.relay.reconnect_backoff_max,
    );
    loop {
        let attempt = async {
            let client = crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout).await?;
            table::check(&client, settings, outbox).await
        };
        match attempt.await {
            Ok(table) => return Ok(Some(table)),
            Err(e) if e.is_transient() => {
                let delay = backoff.next_delay();
                warn!(error = %e, table = %outbox, retry_in_ms = delay.as_millis() as u64, "cannot check the outbox table yet; retrying");
                if wait_or_shutdown(delay, shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}
