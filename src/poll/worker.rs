//! One claimer of one outbox table: begin → claim → produce every row → wait for every ack →
//! mark → commit.
//!
//! Invariants:
//! * A row is marked dispatched only in the transaction that claimed it, and only after Kafka
//!   acknowledged its record (`acks=all`, idempotent producer). Any failure before the commit
//!   rolls the transaction back: the row locks are released, the rows stay pending and are
//!   claimed again (by this or another worker). Nothing is lost; records that had already been
//!   acknowledged are published again (at-least-once, like the streaming relay's replay).
//! * After a failed batch the producer is abandoned — its queue purged and its in-flight requests
//!   awaited (bounded) — *before* the rollback, so the re-claimed rows' new records cannot be
//!   overtaken by stragglers of the old ones.
//! * Batches of one worker are strictly sequential, and a batch is produced in claim order; with
//!   `workers = 1` one aggregate's events therefore reach Kafka in creation order. Several
//!   workers publish disjoint batches concurrently, which gives up that order (as with any
//!   number of polling relayers sharing one table).
//! * Shutdown never interrupts a batch half-way: the current batch still gets its acks, mark and
//!   commit, bounded by `relay.shutdown_timeout_ms`; past that it is rolled back (and published
//!   again by the next run).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::{Client, Statement, Transaction};
use tracing::{debug, info, warn};

use super::error::PollError;
use super::record::claimed_values;
use super::sql::{PollSql, SESSION_SETTINGS};
use crate::backoff::Backoff;
use crate::config::Settings;
use crate::ops::latency::LatencyBatch;
use crate::ops::metrics::now_unix_us;
use crate::ops::retry::wait_or_shutdown;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::event::OutboxEvent;
use crate::sink::{Completions, Handover, Sink, SinkLimits};

use crate::ops::tracing_export::{ProducerSpan, Tracer};

/// Rides with each record: which batch it belongs to. Reports of an earlier batch can only reach
/// a producer that is already abandoned, but the check keeps the count honest regardless.
#[derive(Debug)]
pub(crate) struct BatchTag {
    batch: u64,
    /// The row's timestamp column (µs since the epoch), for `GET /latency`'s window.
    created_unix_us: Option<i64>,
    /// `[tracing]`: the row's PRODUCER span, ended by its report; `None` (no allocation) without.
    span: Option<Box<ProducerSpan>>,
}

/// How long an abandoned producer may take to finish requests already on the wire.
const ABANDON_WAIT: Duration = Duration::from_secs(5);
const REPORTS_PER_WAKEUP: usize = 4096;

/// What one worker did, for the final log line.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WorkerCounts {
    pub(crate) batches: u64,
    pub(crate) events: u64,
    pub(crate) rolled_back: u64,
}

struct Connection {
    client: Client,
    claim: Statement,
    mark: Statement,
}

type Producer = (Box<dyn Sink<BatchTag>>, Completions<BatchTag>);

pub(crate) struct Worker {
    settings: Arc<Settings>,
    sql: Arc<PollSql>,
    id_type: Arc<str>,
    index: usize,
    connection: Option<Connection>,
    producer: Option<Producer>,
    next_batch: u64,
    counts: WorkerCounts,
    /// `[tracing]`: `None` = no spans.
    tracer: Option<Tracer>,
}

/// How a batch ended without error.
enum Claimed {
    /// This many rows were published and marked (0: nothing was pending).
    Rows(usize),
    /// Shutdown outlasted `relay.shutdown_timeout_ms`; the batch was rolled back.
    GaveUp,
}

impl Worker {
    pub(crate) fn new(settings: Arc<Settings>, sql: Arc<PollSql>, id_type: Arc<str>, index: usize) -> Worker {
        Worker {
            settings,
            sql,
            id_type,
            index,
            connection: None,
            producer: None,
            next_batch: 0,
            counts: WorkerCounts::default(),
            tracer: None,
        }
    }

    /// With `[tracing]`: a PRODUCER span per row.
    pub(crate) fn traced(mut self, tracer: Option<Tracer>) -> Worker {
        self.tracer = tracer;
        self
    }

    /// Claims batches until `shutdown` turns true (`Ok`) or a fatal error occurs.
    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<WorkerCounts, PollError> {
        let relay = &self.settings.relay;
        let mut backoff = Backoff::new(relay.reconnect_backoff_initial, relay.reconnect_backoff_max);
        let interval = self.settings.poll.interval;
        let batch_size = self.settings.poll.batch_size;
        let outcome = loop {
            if *shutdown.borrow() {
                break Ok(());
            }
            match self.one_batch(&mut shutdown).await {
                Ok(Claimed::Rows(n)) => {
                    backoff.reset();
                    // A full batch means more may be waiting: claim again at once.
                    if n < batch_size && wait_or_shutdown(interval, &mut shutdown).await {
                        break Ok(());
                    }
                }
                Ok(Claimed::GaveUp) => break Ok(()),
                Err(e) if e.is_transient() => {
                    if e.breaks_connection() {
                        self.connection = None;
                    }
                    let delay = backoff.next_delay();
                    warn!(worker = self.index, table = %self.sql.table, error = %e, retry_in_ms = delay.as_millis() as u64, "batch failed; retrying");
                    if wait_or_shutdown(delay, &mut shutdown).await {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Some((publisher, _)) = self.producer.take() {
            let _ = tokio::task::spawn_blocking(move || publisher.abandon(ABANDON_WAIT)).await;
        }
        let c = self.counts;
        info!(
            worker = self.index,
            batches = c.batches,
            events = c.events,
            rolled_back = c.rolled_back,
            "poll worker stopped"
        );
        outcome.map(|()| c)
    }

    async fn one_batch(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<Claimed, PollError> {
        if self.connection.is_none() {
            self.connection = Some(connect(&self.settings, &self.sql).await?);
        }
        if self.producer.is_none() {
            let producer = crate::sink::create(
                &self.settings,
                self.settings.poll.batch_size,
                crate::sink::Purpose::Plain,
            )
            .await
            .map_err(PollError::Sink)?;
            self.producer = Some(producer);
        }
        let Some(conn) = self.connection.as_mut() else {
            unreachable!("connected above")
        };
        let batch_size = self.settings.poll.batch_size as i64;
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(PollError::query("beginning a claim"))?;
        let rows = tx
            .query(&conn.claim, &[&batch_size])
            .await
            .map_err(PollError::query("claiming pending rows"))?;
        if rows.is_empty() {
            tx.commit().await.map_err(PollError::query("ending an empty claim"))?;
            return Ok(Claimed::Rows(0));
        }
        self.next_batch += 1;
        let batch = self.next_batch;
        let Some((publisher, deliveries)) = self.producer.as_mut() else {
            unreachable!("created above")
        };
        let published = publish_and_await(
            &self.settings,
            &self.sql,
            Outlet {
                publisher: publisher.as_ref(),
                tracer: self.tracer.as_ref(),
            },
            deliveries,
            batch,
            &rows,
            shutdown,
        )
        .await;
        let ids = match published {
            Ok(Some(ids)) => ids,
            mut outcome => {
                // A sink that knows waiting cannot help (`Sink::verdict`): stop with that.
                if let (Err(_), Some(fatal)) = (&outcome, publisher.verdict()) {
                    outcome = Err(PollError::Sink(fatal));
                }
                // Abandon first, roll back second: see the module docs.
                if let Some((publisher, _)) = self.producer.take() {
                    let _ = tokio::task::spawn_blocking(move || publisher.abandon(ABANDON_WAIT)).await;
                }
                rollback(tx).await;
                self.counts.rolled_back += 1;
                return match outcome {
                    Ok(_) => {
                        warn!(worker = self.index, rows = rows.len(), "shutdown timeout passed before the broker acknowledged the batch; rolled back, it will be published again");
                        Ok(Claimed::GaveUp)
                    }
                    Err(e) => Err(e),
                };
            }
        };
        let marked = tx
            .execute(&conn.mark, &[&ids])
            .await
            .map_err(PollError::query("marking the batch published"))?;
        if (marked as usize) < ids.len() {
            rollback(tx).await;
            return Err(PollError::MarkedFewer {
                claimed: ids.len(),
                marked,
                id_type: self.id_type.to_string(),
            });
        }
        tx.commit().await.map_err(PollError::query("committing the batch"))?;
        self.counts.batches += 1;
        self.counts.events += ids.len() as u64;
        debug!(worker = self.index, batch, rows = ids.len(), "batch published");
        Ok(Claimed::Rows(ids.len()))
    }
}

/// Opens the worker's connection: output formats pinned, both statements prepared.
async fn connect(settings: &Settings, sql: &PollSql) -> Result<Connection, PollError> {
    let mut postgres = settings.postgres.clone();
    if postgres.connection.get_application_name().is_none() {
        postgres.connection.application_name("outbox-relay poll");
    }
    let client = crate::postgres::client::connect(&postgres, settings.relay.connect_timeout).await?;
    client
        .batch_execute(SESSION_SETTINGS)
        .await
        .map_err(PollError::query("pinning the session's output formats"))?;
    let claim = client
        .prepare(&sql.claim)
        .await
        .map_err(PollError::query("preparing the claim query"))?;
    let mark = client
        .prepare(&sql.mark)
        .await
        .map_err(PollError::query("preparing the mark statement"))?;
    Ok(Connection { client, claim, mark })
}

/// Where a batch's records go: the sink, and `[tracing]`'s spans.
struct Outlet<'a> {
    publisher: &'a dyn Sink<BatchTag>,
    tracer: Option<&'a Tracer>,
}

/// Produces every claimed row and waits for all acknowledgements. `Ok(Some(ids))`: all
/// acknowledged; `Ok(None)`: shutdown outlasted its timeout first.
async fn publish_and_await(
    settings: &Settings,
    sql: &PollSql,
    out: Outlet<'_>,
    deliveries: &mut Completions<BatchTag>,
    batch: u64,
    rows: &[tokio_postgres::Row],
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Vec<String>>, PollError> {
    let mut ids = Vec::with_capacity(rows.len());
    let mut sent_count = 0;
    let limits: SinkLimits = crate::sink::limits(settings);
    let claimed_us = now_unix_us();
    for row in rows {
        let values = claimed_values(row)?;
        let id = OutboxEvent::id_of_columns(&values);
        let bad = |cause: BadEvent| PollError::BadEvent {
            id: id.to_owned(),
            cause,
        };
        let event = OutboxEvent::from_columns(&settings.outbox, &sql.table, &values, &sql.rows).map_err(bad)?;
        // `[filter]`: marked dispatched with the batch, never sent.
        if !event.passes(settings) {
            crate::ops::metrics::count_filtered();
            ids.push(id.to_owned());
            continue;
        }
        // `[tracing]`: the span starts at the row's timestamp column, else at the claim.
        let start_us = event.timestamp_ms.map_or(claimed_us, |ms| ms.saturating_mul(1000));
        let (span, traced) = out
            .tracer
            .and_then(|tracer| event.traced(tracer, settings, &limits, start_us))
            .unzip();
        let sent = traced.as_ref().unwrap_or(&event);
        let record = sent.record(settings, &limits).map_err(bad)?;
        if event.has_invalid_traceparent() {
            crate::ops::metrics::count_invalid_traceparent();
        }
        let tag = Box::new(BatchTag {
            batch,
            created_unix_us: event.timestamp_ms.map(|ms| ms.saturating_mul(1000)),
            span,
        });
        // A full sink queue is waited out (backpressure), never a failed batch.
        if let Err(mut refusal) = crate::sink::send_waiting(out.publisher, Handover::of(&record), tag).await {
            if let (Some(span), Some(tracer)) = (refusal.tag.span.take(), out.tracer) {
                tracer.end(*span, Some(refusal.failure.cause.clone()));
            }
            if refusal.failure.is_refusal() {
                return Err(bad(BadEvent::refused_by(
                    settings.sink.broker_name(),
                    &refusal.failure.cause,
                )));
            }
            return Err(PollError::Delivery {
                sink: settings.sink.broker_name(),
                failure: Box::new(refusal.failure),
            });
        }
        ids.push(id.to_owned());
        sent_count += 1;
    }
    let all_acked = await_batch(deliveries, (batch, out.tracer), sent_count, shutdown, settings).await?;
    Ok(all_acked.then_some(ids))
}

/// Waits for `count` reports of `batch`; the first failure ends the wait. `Ok(false)`: shutdown
/// was requested and `shutdown_timeout` passed before every report arrived.
async fn await_batch(
    deliveries: &mut Completions<BatchTag>,
    (batch, tracer): (u64, Option<&Tracer>),
    count: usize,
    shutdown: &mut watch::Receiver<bool>,
    settings: &Settings,
) -> Result<bool, PollError> {
    let (sink, shutdown_timeout) = (settings.sink.broker_name(), settings.relay.shutdown_timeout);
    let mut deadline = shutdown.borrow().then(|| Instant::now() + shutdown_timeout);
    let mut settled = 0;
    let mut reports = Vec::with_capacity(count.min(REPORTS_PER_WAKEUP));
    let mut latency = LatencyBatch::default();
    let window = crate::ops::latency::commit_to_ack();
    while settled < count {
        let give_up_at = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        tokio::select! {
            n = deliveries.recv_many(&mut reports, REPORTS_PER_WAKEUP) => {
                if n == 0 {
                    return Err(PollError::ProducerGone);
                }
                for mut report in reports.drain(..) {
                    if let (Some(span), Some(tracer)) = (report.tag.span.take(), tracer) {
                        tracer.end(*span, report.outcome.as_ref().err().map(|f| f.cause.clone()));
                    }
                    if report.tag.batch != batch {
                        continue;
                    }
                    settled += 1;
                    report.outcome.map_err(|f| PollError::Delivery { sink, failure: Box::new(f) })?;
                    if let Some(created) = report.tag.created_unix_us {
                        latency.record(created, now_unix_us());
                    }
                }
                window.absorb(&mut latency);
            }
            // Either a request or a dropped sender means stop; start the clock once.
            _ = shutdown.changed(), if deadline.is_none() => deadline = Some(Instant::now() + shutdown_timeout),
            _ = tokio::time::sleep_until(give_up_at), if deadline.is_some() => return Ok(false),
        }
    }
    Ok(true)
}

async fn rollback(tx: Transaction<'_>) {
    if let Err(e) = tx.rollback().await {
        // The server rolls back by itself when the connection is gone.
        debug!(error = %e, "rollback failed");
    }
}
