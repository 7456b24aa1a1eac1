//! Retention: published outbox rows older than `[retention] keep` are removed, in small
//! batches or whole partitions, so the outbox table does not grow forever.
//!
//! **Invariant, streaming and polling alike: a row is removed only once it is published.**
//! Streaming: only rows whose transaction ended before a WAL position the slot's
//! `confirmed_flush_lsn` has reached — the relay confirms a position only after the broker
//! acknowledged everything before it — and nothing while the slot is missing, invalidated or
//! held by no relay ([`gate`]; the mechanism is in [`delete`] and [`partitions`], the argument in
//! docs/reliability.md). Polling: only rows whose dispatched column is set.
//!
//! It runs beside the stream, never in it: on a connection of its own with `lock_timeout` and
//! `statement_timeout` set, one short transaction per statement, and only while this instance
//! is the active one (streaming from the slot, or polling) — a standby removes nothing. A
//! failure is logged once and retried at the next interval (or stops retention alone, when an
//! operator must act); publishing never waits on retention and never stops because of it.
//!
//! Several outbox tables: everything per table takes a [`TableName`]; [`tables`] is the one
//! place that lists them.

mod check;
mod delete;
mod error;
pub(crate) mod gate;
mod partitions;
mod record;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::Client;
use tracing::{error, info, warn};

pub(crate) use check::check;
pub use error::RetentionError;

use self::delete::Snapshot;
use self::gate::Gate;
use self::record::{Detached, Removed};
use crate::config::ident::{Ident, TableName};
use crate::config::retention::{RetentionMode, RetentionSettings};
use crate::config::Settings;
use crate::ops::metrics::{RETENTION_ERRORS, RETENTION_LAST_RUN, RETENTION_PAUSED, TABLE_LABEL};

/// Longest a run waits for the slot to confirm a fresh snapshot's position before leaving it
/// to the next interval (the relay confirms at least every `relay.status_interval_ms` while
/// events flow).
const CONFIRM_WAIT: Duration = Duration::from_secs(5);
/// How often the slot is read while waiting.
const CONFIRM_POLL: Duration = Duration::from_millis(200);
/// How often an instance that is not the active one checks whether it became active.
const INACTIVE_RECHECK: Duration = Duration::from_secs(1);

/// Snapshots (or polling batches of `SNAPSHOT_BATCHES` statements) one run goes through at
/// most, so one run of a huge backlog stays bounded and yields to the next interval.
const ROUNDS_PER_RUN: usize = 50;

/// Which relay runs retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// `outbox-relay run`: published means confirmed through the slot.
    Stream,
    /// `outbox-relay poll`: published means the dispatched column is set.
    Poll { dispatched: Ident },
}

/// One outbox table, with what its statements need.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) table: TableName,
    /// The metric label: `schema.name`.
    pub(crate) label: String,
    pub(crate) id: Ident,
    /// `format_type` of the id column, for the delete's array cast.
    pub(crate) id_type: String,
    pub(crate) timestamp: Ident,
    pub(crate) keep_ms: u128,
    /// Streaming: rows whose timestamp is older than this (Unix seconds) were committed before
    /// `setup` created the slot without a backfill, so the slot never streamed them and they
    /// are never removed (`record::slot_created_at`). Read at every run.
    pub(crate) not_before_unix: Option<f64>,
}

/// `setup` created the slot (`backfilled`: with `--backfill`): notes it beside every outbox
/// table for retention ([`record::note_slot_created`]) when `[retention]` is configured or its
/// record table exists. Returns what the setup report should say if it could not.
pub(crate) async fn note_slot_created(client: &Client, settings: &Settings, backfilled: bool) -> Vec<String> {
    let mut notices = Vec::new();
    let slot = settings.postgres.slot.as_str();
    for table in &settings.outbox.tables {
        let known = settings.retention.is_some()
            || client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&record::record_table(table)])
                .await
                .is_ok_and(|r| r.get::<_, bool>(0));
        if !known {
            continue;
        }
        if let Err(e) = record::note_slot_created(client, table, slot, backfilled).await {
            notices.push(format!(
                "could not note the new slot for retention beside {table} ({e}): retention will take rows older \
                 than the slot for published; grant CREATE on the schema and run setup again before enabling it"
            ));
        }
    }
    notices
}

/// Stops retention when dropped.
pub(crate) struct RetentionTask(tokio::task::JoinHandle<()>);

impl Drop for RetentionTask {
    fn drop(&mut self) {
        // An aborted statement is rolled back by the server: nothing half-done remains.
        self.0.abort();
    }
}

/// Starts retention when `[retention]` is configured; it acts only while `active()` says this
/// instance is the active one (streaming from the slot, polling), and ends when `shutdown`
/// turns true or the handle is dropped.
pub(crate) fn spawn(
    settings: &Settings,
    source: Source,
    active: impl Fn() -> bool + Send + Sync + 'static,
    shutdown: watch::Receiver<bool>,
) -> Option<RetentionTask> {
    let config = settings.retention.clone()?;
    let settings = settings.clone();
    Some(RetentionTask(tokio::spawn(async move {
        Retention::new(settings, config, source, Box::new(active))
            .run(shutdown)
            .await;
    })))
}

/// Per table: what the previous runs left to do and what the log already said.
#[derive(Debug, Default)]
struct TableState {
    target: Option<Target>,
    /// Streaming, delete mode: rows waiting for the slot to pass their position.
    snapshot: Option<Snapshot>,
    /// Partitions mode: a partition detached and waiting to be dropped.
    detached: Option<Detached>,
    /// The gate's reason last logged, so a closed gate is said once, not every interval.
    closed: Option<String>,
    /// The last error logged (same idea).
    failing: Option<String>,
    /// Stopped by a fatal error: an operator must act, then restart.
    stopped: bool,
    /// Whether the "slot created by setup without a backfill" warning was logged.
    not_before_said: bool,
}

struct Retention {
    settings: Settings,
    config: RetentionSettings,
    source: Source,
    active: Box<dyn Fn() -> bool + Send + Sync>,
    client: Option<Client>,
    tables: HashMap<String, TableState>,
    /// Whether "retention is active on this instance" was logged (and the opposite).
    active_said: Option<bool>,
    record_failing: bool,
}

impl Retention {
    fn new(
        settings: Settings,
        config: RetentionSettings,
        source: Source,
        active: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        Retention {
            settings,
            config,
            source,
            active,
            client: None,
            tables: HashMap::new(),
            active_said: None,
            record_failing: false,
        }
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        info!(
            mode = self.config.mode.label(),
            keep_seconds = self.config.keep.as_secs(),
            interval_ms = self.config.interval.as_millis() as u64,
            batch_size = self.config.batch_size,
            "retention configured; it acts only while this instance is the active one"
        );
        loop {
            let active = (self.active)();
            if self.active_said != Some(active) {
                if active {
                    info!("retention active on this instance");
                } else if self.active_said.is_some() {
                    info!("retention idle: this instance is not the active one");
                }
                self.active_said = Some(active);
            }
            if active {
                let stop = shutdown.clone();
                self.run_once(&move || *stop.borrow()).await;
            }
            // Not active yet (starting, or a standby): look again soon rather than after a whole
            // interval, so an instance that starts streaming or takes over runs at once — in
            // partitions mode, the partitions ahead are then there before the first interval.
            let wait = if active {
                self.config.interval
            } else {
                self.config.interval.min(INACTIVE_RECHECK)
            };
            if crate::ops::retry::wait_or_shutdown(wait, &mut shutdown).await {
                return;
            }
        }
    }

    /// One pass over every table.
    async fn run_once(&mut self, stop: &(dyn Fn() -> bool + Send + Sync)) {
        // A copy: each table's run needs `self` mutably.
        for table in self.settings.outbox.tables.clone() {
            let key = record::key(&table);
            if self.tables.get(&key).is_some_and(|s| s.stopped) {
                continue;
            }
            let outcome = self.run_table(&table, stop).await;
            let state = self.tables.entry(key.clone()).or_default();
            match outcome {
                Ok(()) => {
                    if state.failing.take().is_some() {
                        info!(table = %table, "retention works again");
                    }
                    ::metrics::gauge!(RETENTION_LAST_RUN, TABLE_LABEL => key.clone()).set(
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0.0, |d| d.as_secs_f64()),
                    );
                }
                Err(e) => {
                    ::metrics::counter!(RETENTION_ERRORS, TABLE_LABEL => key.clone(), "kind" => e.kind()).increment(1);
                    if e.is_transient() {
                        let text = e.to_string();
                        if state.failing.as_deref() != Some(text.as_str()) {
                            warn!(table = %table, error = %text, retry_in_ms = self.config.interval.as_millis() as u64,
                                  "retention failed; nothing was removed that is not published; retrying next interval");
                            state.failing = Some(text);
                        }
                    } else {
                        error!(table = %table, error = %e, "retention stopped for this table until the relay restarts; publishing goes on");
                        state.stopped = true;
                    }
                }
            }
        }
    }

    async fn connect(&mut self) -> Result<&mut Client, RetentionError> {
        let client = match self.client.take() {
            Some(c) if !c.is_closed() => c,
            _ => {
                let client =
                    crate::postgres::client::connect(&self.settings.postgres, self.settings.relay.connect_timeout)
                        .await?;
                client
                    .batch_execute(&format!(
                        "SET application_name = 'outbox-relay retention'; SET lock_timeout = {}; \
                         SET statement_timeout = {}; SET TimeZone = 'UTC'",
                        self.config.lock_timeout.as_millis(),
                        self.config.statement_timeout.as_millis()
                    ))
                    .await
                    .map_err(RetentionError::query(
                        &"the retention connection",
                        "setting its timeouts",
                    ))?;
                client
            }
        };
        Ok(self.client.insert(client))
    }

    /// Resolves the table's columns once (and the record table).
    async fn target(&mut self, table: &TableName) -> Result<Target, RetentionError> {
        let key = record::key(table);
        if let Some(t) = self.tables.get(&key).and_then(|s| s.target.clone()) {
            return Ok(t);
        }
        // Copies: the client borrows `self` mutably. Once per table (the target is kept).
        let (settings, config) = (self.settings.clone(), self.config.clone());
        let client = self.connect().await?;
        let target = check::resolve(client, &settings, &config, table).await?;
        match record::ensure(client, table).await {
            Ok(()) => {}
            Err(e) if !self.record_failing => {
                warn!(table = %table, error = %e, "retention cannot keep its record table; it removes rows all the same, but `status` cannot say what it removed");
                self.record_failing = true;
            }
            Err(_) => {}
        }
        let state = self.tables.entry(key).or_default();
        state.target = Some(target.clone());
        Ok(target)
    }

    async fn run_table(
        &mut self,
        table: &TableName,
        stop: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<(), RetentionError> {
        let mut target = self.target(table).await?;
        if self.source == Source::Stream {
            target.not_before_unix = self.slot_not_before(table).await?;
        }
        let removed = match (self.config.mode, self.source.clone()) {
            (RetentionMode::Delete, Source::Stream) => self.delete_streamed(&target, stop).await?,
            (RetentionMode::Delete, Source::Poll { dispatched }) => {
                let batch = self.config.batch_size;
                let client = self.connect().await?;
                delete::delete_dispatched(
                    client,
                    &target,
                    &dispatched,
                    batch,
                    ROUNDS_PER_RUN * delete::SNAPSHOT_BATCHES,
                    stop,
                )
                .await?
            }
            (RetentionMode::Partitions, source) => self.rotate_partitions(&target, &source).await?,
        };
        if removed.rows > 0 || removed.partitions > 0 {
            info!(table = %table, rows = removed.rows, partitions = removed.partitions, "retention removed published rows");
        }
        let client = self.connect().await?;
        if let Err(e) = record::note_run(client, table, &removed).await {
            if !self.record_failing {
                warn!(table = %table, error = %e, "retention cannot update its record; `status` will not show what it removed");
                self.record_failing = true;
            }
        }
        Ok(())
    }

    /// When `setup` created the slot without a backfill (see [`Target::not_before_unix`]),
    /// logged once per table.
    async fn slot_not_before(&mut self, table: &TableName) -> Result<Option<f64>, RetentionError> {
        let slot = self.settings.postgres.slot.clone();
        let client = self.connect().await?;
        let since = record::slot_created_at(client, table, slot.as_str()).await?;
        let state = self.tables.entry(record::key(table)).or_default();
        if since.is_some() && !state.not_before_said {
            warn!(
                table = %table,
                slot = %slot,
                "`setup` created this slot without --backfill: rows older than its creation were never streamed by it, \
                 so retention keeps them (they may be unpublished, e.g. after the slot was lost and re-created). \
                 Publish them with `setup --backfill` on a new slot, or delete them yourself once you know they are \
                 published (docs/operations.md, \"A re-created slot\")"
            );
            state.not_before_said = true;
        }
        Ok(since)
    }

    /// The gate, with its closing and reopening logged once each.
    async fn gate(&mut self, target: &Target) -> Result<Option<crate::postgres::lsn::Lsn>, RetentionError> {
        let settings = self.settings.clone();
        let client = self.connect().await?;
        let gate = gate::read(client, &settings).await?;
        let state = self.tables.entry(target.label.clone()).or_default();
        match gate {
            Gate::Open(lsn) => {
                ::metrics::gauge!(RETENTION_PAUSED, TABLE_LABEL => target.label.clone()).set(0.0);
                if state.closed.take().is_some() {
                    info!(table = %target.table, "retention resumes: the replication slot is healthy and held again");
                }
                Ok(Some(lsn))
            }
            Gate::Closed(why) => {
                ::metrics::gauge!(RETENTION_PAUSED, TABLE_LABEL => target.label.clone()).set(1.0);
                // A snapshot waiting for a slot that is gone or invalid is never applied: a
                // re-created slot's position says nothing about these rows.
                state.snapshot = None;
                if state.closed.as_deref() != Some(why.as_str()) {
                    warn!(table = %target.table, "retention paused: {why}");
                    state.closed = Some(why);
                }
                Ok(None)
            }
        }
    }

    /// Waits (bounded) for the slot to confirm `lsn`; `false` if it did not (yet).
    async fn confirmed(&mut self, target: &Target, lsn: crate::postgres::lsn::Lsn) -> Result<bool, RetentionError> {
        let deadline = Instant::now() + CONFIRM_WAIT.min(self.config.interval);
        loop {
            match self.gate(target).await? {
                None => return Ok(false),
                Some(confirmed) if confirmed >= lsn => return Ok(true),
                Some(_) if Instant::now() >= deadline => return Ok(false),
                Some(_) => tokio::time::sleep(CONFIRM_POLL).await,
            }
        }
    }

    /// Streaming, delete mode: snapshots applied once the slot passed them.
    async fn delete_streamed(
        &mut self,
        target: &Target,
        stop: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<Removed, RetentionError> {
        let mut total = Removed::default();
        for _ in 0..ROUNDS_PER_RUN {
            if stop() || self.gate(target).await?.is_none() {
                break;
            }
            let pending = self.tables.get(&target.label).and_then(|s| s.snapshot.clone());
            let snapshot = match pending {
                Some(s) => s,
                None => {
                    let batch = self.config.batch_size;
                    let s = delete::snapshot(self.connect().await?, target, batch).await?;
                    if s.ids.is_empty() {
                        break;
                    }
                    self.tables.entry(target.label.clone()).or_default().snapshot = Some(s.clone());
                    s
                }
            };
            if !self.confirmed(target, snapshot.lsn).await? {
                break;
            }
            let batch = self.config.batch_size;
            let slot = self.settings.postgres.slot.clone();
            let client = self.connect().await?;
            let (removed, pace) = delete::delete_ids(client, target, &snapshot, batch, slot.as_str(), stop).await?;
            total.rows += removed.rows;
            total.through_unix = removed.through_unix.or(total.through_unix);
            if stop() || pace == delete::Pace::Behind {
                // Some ids may remain: the next run's snapshot finds them again.
                self.tables.entry(target.label.clone()).or_default().snapshot = None;
                break;
            }
            self.tables.entry(target.label.clone()).or_default().snapshot = None;
            if !snapshot.full {
                break;
            }
        }
        Ok(total)
    }

    /// Partitions mode: create ahead, then detach and drop what expired.
    async fn rotate_partitions(&mut self, target: &Target, source: &Source) -> Result<Removed, RetentionError> {
        let width = self.config.partition_width.as_secs() as i64;
        let ahead = self.config.partitions_ahead;
        partitions::create_ahead(self.connect().await?, target, width, ahead).await?;
        let mut total = Removed::default();
        for _ in 0..ROUNDS_PER_RUN {
            let detached = match source {
                Source::Poll { dispatched } => {
                    let client = self.connect().await?;
                    match partitions::detach_oldest(client, target, Some(dispatched)).await? {
                        Some(d) => d,
                        None => break,
                    }
                }
                Source::Stream => {
                    let known = match self.tables.get(&target.label).and_then(|s| s.detached.clone()) {
                        Some(d) => Some(d),
                        None => record::detached(self.connect().await?, &target.table)
                            .await
                            .unwrap_or(None),
                    };
                    let d = match known {
                        Some(d) => d,
                        None => {
                            if self.gate(target).await?.is_none() {
                                break;
                            }
                            let client = self.connect().await?;
                            let Some(d) = partitions::detach_oldest(client, target, None).await? else {
                                break;
                            };
                            record::set_detached(client, &target.table, Some(&d)).await.ok();
                            d
                        }
                    };
                    self.tables.entry(target.label.clone()).or_default().detached = Some(d.clone());
                    if !self.confirmed(target, d.lsn).await? {
                        if self.gate(target).await?.is_none() {
                            // The slot cannot vouch for these rows any more: put them back.
                            partitions::reattach(self.connect().await?, target, &d).await?;
                            self.tables.entry(target.label.clone()).or_default().detached = None;
                        }
                        break;
                    }
                    d
                }
            };
            let client = self.connect().await?;
            let removed = partitions::drop_detached(client, target, &detached).await?;
            record::set_detached(client, &target.table, None).await.ok();
            self.tables.entry(target.label.clone()).or_default().detached = None;
            total.rows += removed.rows;
            total.partitions += removed.partitions;
            total.through_unix = removed.through_unix.or(total.through_unix);
        }
        Ok(total)
    }
}
