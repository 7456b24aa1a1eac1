//! `outbox-relay replay`: re-publishes rows still in the outbox table(s) — the outbox as a
//! journal, after an incident (a consumer must re-read yesterday's `order.*` events).
//!
//! Rows are selected by [`selection`] and read by keyset pages (no long transaction, no snapshot
//! held back from vacuum or retention), table after table, in the backfill's order (sequence id,
//! or timestamp then id), and published through the backfill's publisher
//! ([`crate::control::backfill::publish`]): the same records `run` writes for the same row
//! (format options, CloudEvents, headers, trace context), plus [`REPLAY_HEADER`], optionally all
//! to one destination (`--to-topic`). Only `[transactions]` metadata is not reproduced: the
//! transaction id and commit LSN are in the WAL, not in the table.
//!
//! Order: within a table, per aggregate, rows go in insertion order (what the ordering columns
//! give: a sequence id is assigned at insert, which for concurrent transactions may differ from
//! commit order — the stream's order — for two rows of one aggregate only if two transactions
//! inserted for the same aggregate concurrently); with uuid ids the timestamp column orders
//! them, and rows of one aggregate with equal timestamps (one transaction's `now()`) go in id
//! order.
//!
//! It never touches the slot or the publication: ordinary connections, read-only queries. It can
//! run beside a running relay.
//!
//! Resume ([`resume`]): the state file advances only over the acknowledged prefix, so a replay
//! killed at any point and run again with `--resume` re-sends at most what was in flight (plus
//! what was acknowledged since the last save, [`SAVE_EVERY`]), and skips nothing.

mod error;
mod progress;
mod resume;
pub(crate) mod selection;

use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::Client;

pub(crate) use error::ReplayError;
use progress::Progress;
use resume::{Position, ReplayState, StateFile};
use selection::{literal, Bound, Criteria};

use super::backfill::pending::{order_columns, select_rows, set_output_formats, text_rows};
use super::backfill::publish::{BackfillPublisher, Handed, Replayed};
use super::backfill::{BackfillError, Source};
use super::connect;
use crate::config::Settings;
use crate::outbox::event::OutboxEvent;

/// The header every replayed record carries after its own; its value is the replay's id (the
/// state file's hash), so a consumer can tell which replay sent it.
pub(crate) const REPLAY_HEADER: &str = "outbox-relay-replay";
/// Rows per page.
const PAGE_ROWS: usize = 500;
/// Rows a dry run shows.
const SHOWN_ROWS: usize = 10;
/// Longest the acknowledged prefix goes unsaved while it advances.
const SAVE_EVERY: Duration = Duration::from_millis(20);

/// What the command line asked for.
#[derive(Debug, Clone)]
pub(crate) struct ReplayArgs {
    pub(crate) criteria: Criteria,
    pub(crate) dry_run: bool,
    /// Events per second at most.
    pub(crate) rate: Option<u32>,
    pub(crate) to_topic: Option<String>,
    pub(crate) resume: bool,
    /// Where the state file lives.
    pub(crate) state_dir: PathBuf,
}

/// What a replay did (or, dry, would do).
#[derive(Debug, Clone)]
pub(crate) struct ReplayReport {
    pub(crate) dry_run: bool,
    pub(crate) condition: String,
    /// Rows selected, per table (for a resumed replay: those after the saved position).
    pub(crate) counts: Vec<(String, u64)>,
    /// Acknowledged by earlier runs (`--resume`).
    pub(crate) earlier: u64,
    pub(crate) sent: u64,
    pub(crate) filtered: u64,
    pub(crate) elapsed: Duration,
    pub(crate) sink: &'static str,
    pub(crate) destination: Option<String>,
    /// Dry run: the first rows, one line each.
    pub(crate) shown: Vec<String>,
    /// Retention and resume notices.
    pub(crate) notes: Vec<String>,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.counts.iter().map(|(_, n)| n).sum();
        let per_table: Vec<String> = self.counts.iter().map(|(t, n)| format!("{t}: {n}")).collect();
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        writeln!(f, "selection: {}", self.condition)?;
        if self.dry_run {
            writeln!(
                f,
                "dry run: {total} rows would be re-published ({}); nothing was sent",
                per_table.join(", ")
            )?;
            for line in &self.shown {
                writeln!(f, "  {line}")?;
            }
            return Ok(());
        }
        let secs = self.elapsed.as_secs_f64();
        write!(
            f,
            "replay complete: {} events re-published to {}{} and acknowledged, {} skipped by [filter], in {secs:.1} s \
             ({:.0} ev/s); rows selected: {}",
            self.sent,
            self.sink,
            self.destination.as_ref().map(|d| format!(" ({d})")).unwrap_or_default(),
            self.filtered,
            self.sent as f64 / secs.max(1e-3),
            per_table.join(", ")
        )?;
        if self.earlier > 0 {
            write!(f, "; resumed after {} rows acknowledged by earlier runs", self.earlier)?;
        }
        Ok(())
    }
}

/// Runs the replay (see the module docs). `stop` turns true on SIGINT/SIGTERM: the replay stops
/// handing rows over, waits for what is in flight, saves its position and says how to resume.
pub(crate) async fn replay(
    settings: &Settings,
    args: &ReplayArgs,
    stop: watch::Receiver<bool>,
) -> Result<ReplayReport, ReplayError> {
    args.criteria.check(settings).map_err(ReplayError::Usage)?;
    if let Some(name) = &args.to_topic {
        // The sink's name rule, as a routed name must pass it.
        (crate::sink::limits(settings).check_name)(name).map_err(|e| {
            ReplayError::Usage(format!(
                "--to-topic {name:?} is not a name {} accepts: {e}",
                settings.sink.broker_name()
            ))
        })?;
    }
    let client = connect(settings).await?;
    set_output_formats(&client).await?;
    let mut sources = Vec::new();
    for table in args.criteria.tables(settings).map_err(ReplayError::Usage)? {
        let facts = super::preflight::check_outbox_table(&client, settings, &table).await?;
        sources.push(Source::of(settings, &table, &facts.columns)?);
    }
    // Times select by the creation-time column, the one retention ages rows by — not the
    // record timestamp (`outbox.timestamp_column`), which may well be unset.
    let (created_at, _) = settings.created_at_column();
    let mut created = true;
    for source in &sources {
        if super::catalog::has_column(&client, &source.table, &created_at).await? {
            continue;
        }
        if args.criteria.by_time() {
            return Err(ReplayError::Usage(super::catalog::no_creation_column(
                settings,
                &source.table,
                "a time for --since/--until",
                "select by id (--since id:N)",
            )));
        }
        created = false;
    }
    let arguments = args.criteria.canonical(args.to_topic.as_deref());
    let file = StateFile::new(&args.state_dir, &arguments);
    let mut notes = Vec::new();
    let state = match (file.load().map_err(ReplayError::State)?, args.resume) {
        (Some(saved), true) => saved,
        (Some(_), false) if !args.dry_run => {
            return Err(ReplayError::Usage(format!(
                "a replay with these arguments was interrupted (its state is in {}): add --resume to continue it \
                 without re-sending what was acknowledged, or delete that file to start over",
                file.path().display()
            )))
        }
        (saved, resume) => {
            if resume && saved.is_none() {
                notes.push(format!(
                    "--resume: no interrupted replay with these arguments in {}; starting from the first row",
                    args.state_dir.display()
                ));
            }
            let now: String = client
                .query_one("SELECT now()::text", &[])
                .await
                .map_err(BackfillError::query("reading the database's clock"))?
                .get(0);
            ReplayState {
                arguments,
                condition: args.criteria.condition(settings, &now, created),
                acknowledged: 0,
                position: None,
            }
        }
    };
    // What retention itself recorded (`status` shows the same), read once.
    let retention_records = match settings.retention {
        Some(_) => super::status_tables::read(&client, settings).await,
        None => Vec::new(),
    };
    for source in &sources {
        let recorded = settings
            .outbox
            .tables
            .iter()
            .position(|t| *t == source.table)
            .and_then(|i| retention_records.get(i)?.last_retention.as_ref())
            .filter(|r| r.total_removed_rows > 0);
        // A row older than the oldest one left is missing only if rows were ever removed: a new
        // table simply has none older.
        let removed = recorded.is_some() || super::catalog::deleted_rows(&client, &source.table).await? > 0;
        let Some(mut note) = removed_rows(&client, settings, &args.criteria, source, removed).await? else {
            continue;
        };
        if let Some(r) = recorded {
            note.push_str(&format!(
                "; retention's record: {} rows removed from this table in all, the newest created at {}",
                r.total_removed_rows,
                r.last_removed_through.as_deref().unwrap_or("(not recorded)")
            ));
        }
        notes.push(note);
    }
    let mut counts = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        let condition = remaining(settings, source, index, &state);
        let n: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM {} WHERE {condition}", source.table.quoted()),
                &[],
            )
            .await
            .map_err(|e| ReplayError::Selection {
                condition: condition.clone(),
                source: e,
            })?
            .get(0);
        counts.push((source.table.to_string(), n as u64));
    }
    let mut report = ReplayReport {
        dry_run: args.dry_run,
        condition: state.condition.clone(),
        counts,
        earlier: state.acknowledged,
        sent: 0,
        filtered: 0,
        elapsed: Duration::ZERO,
        sink: settings.sink.broker_name(),
        destination: args.to_topic.clone(),
        shown: Vec::new(),
        notes,
    };
    if args.dry_run {
        report.shown = first_rows(&client, settings, &sources, &state, args.to_topic.as_deref()).await?;
        return Ok(report);
    }
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    // Saved before the first row goes: an unwritable --state is refused before anything is sent,
    // and a replay killed before its first acknowledgement resumes with the same resolved window.
    file.save(&state).map_err(ReplayError::State)?;
    // What `setup` makes sure of (a stream, an exchange), in case the replay is the first writer.
    crate::sink::prepare(settings).await.map_err(BackfillError::Producer)?;
    let total = report.counts.iter().map(|(_, n)| n).sum();
    let replayed = Replayed {
        destination: args.to_topic.clone(),
        header: Some((REPLAY_HEADER.to_owned(), file.id().into_bytes())),
    };
    let publisher = BackfillPublisher::new(settings).await?.replaying(replayed);
    let mut run = Run {
        settings,
        client: &client,
        file: &file,
        state,
        positions: VecDeque::new(),
        settled: 0,
        last_save: Instant::now(),
        progress: Progress::new(total),
        sent: 0,
        filtered: 0,
    };
    let started = Instant::now();
    let outcome = run.publish_all(publisher, &sources, args.rate, stop).await;
    run.progress.finish();
    report.elapsed = started.elapsed();
    report.sent = run.sent;
    report.filtered = run.filtered;
    match outcome {
        Ok(Finished::Complete) => {
            file.remove().map_err(ReplayError::State)?;
            Ok(report)
        }
        Ok(Finished::Interrupted) => Err(ReplayError::Interrupted {
            acknowledged: run.state.acknowledged,
            state: file.path().display().to_string(),
        }),
        Err(cause) => Err(ReplayError::Stopped {
            acknowledged: run.state.acknowledged,
            state: file.path().display().to_string(),
            cause: Box::new(cause),
        }),
    }
}

enum Finished {
    Complete,
    Interrupted,
}

/// One run of the publishing loop and its bookkeeping.
struct Run<'a> {
    settings: &'a Settings,
    client: &'a Client,
    file: &'a StateFile,
    state: ReplayState,
    /// The position of every row handed over and not yet in the acknowledged prefix, in order.
    positions: VecDeque<Position>,
    /// Rows of this run already moved into `state` (the publisher's prefix it has seen).
    settled: u64,
    last_save: Instant,
    progress: Progress,
    sent: u64,
    filtered: u64,
}

impl Run<'_> {
    async fn publish_all(
        &mut self,
        mut publisher: BackfillPublisher<'_>,
        sources: &[Source],
        rate: Option<u32>,
        stop: watch::Receiver<bool>,
    ) -> Result<Finished, ReplayError> {
        let result = self.hand_over(&mut publisher, sources, rate, &stop).await;
        let finished = match result {
            Ok(finished) => finished,
            Err(e) => {
                // Whatever was acknowledged before the failure still counts.
                let _ = publisher.settle_ready();
                self.advance(&publisher, true)?;
                publisher.abandon();
                return Err(e);
            }
        };
        publisher.finish().await?;
        // Everything handed over is acknowledged now (acknowledgements may have come out of
        // order across partitions: the rows waiting in `positions` are exactly the rest).
        let handed = self.settled + self.positions.len() as u64;
        self.advance_to(handed, true)?;
        Ok(finished)
    }

    async fn hand_over(
        &mut self,
        publisher: &mut BackfillPublisher<'_>,
        sources: &[Source],
        rate: Option<u32>,
        stop: &watch::Receiver<bool>,
    ) -> Result<Finished, ReplayError> {
        let started = Instant::now();
        let mut handed: u64 = 0;
        let start_table = self.state.position.as_ref().map_or(0, |p| p.table);
        for (index, source) in sources.iter().enumerate().skip(start_table) {
            let key_columns = key_indices(self.settings, source);
            let mut after = self
                .state
                .position
                .as_ref()
                .filter(|p| p.table == index)
                .map(|p| p.key.clone());
            loop {
                let condition = page_condition(self.settings, source, &self.state.condition, after.as_deref());
                let sql = format!(
                    "{} LIMIT {PAGE_ROWS}",
                    select_rows(self.settings, &source.table, &condition, source.id_is_sequential)
                );
                let messages = self
                    .client
                    .simple_query(&sql)
                    .await
                    .map_err(|e| ReplayError::Selection { condition, source: e })?;
                let rows = text_rows(messages);
                for row in &rows {
                    if *stop.borrow() {
                        return Ok(Finished::Interrupted);
                    }
                    if let Some(rate) = rate {
                        let due = started + Duration::from_secs_f64(handed as f64 / f64::from(rate));
                        tokio::time::sleep_until(due.into()).await;
                        publisher.settle_ready()?;
                    }
                    let key: Vec<String> = key_columns
                        .iter()
                        .map(|&i| row.get(i).cloned().flatten().unwrap_or_default())
                        .collect();
                    self.positions.push_back(Position { table: index, key });
                    match publisher.publish(&source.table, &source.format, row).await? {
                        Handed::Sent => self.sent += 1,
                        Handed::Filtered => self.filtered += 1,
                    }
                    handed += 1;
                    self.advance(publisher, false)?;
                }
                match rows.last() {
                    Some(last) if rows.len() == PAGE_ROWS => {
                        after = Some(
                            key_columns
                                .iter()
                                .map(|&i| last.get(i).cloned().flatten().unwrap_or_default())
                                .collect(),
                        )
                    }
                    _ => break,
                }
            }
        }
        Ok(Finished::Complete)
    }

    /// Moves the publisher's acknowledged prefix into the state; saves it (at most every
    /// [`SAVE_EVERY`] unless `force`).
    fn advance(&mut self, publisher: &BackfillPublisher<'_>, force: bool) -> Result<(), ReplayError> {
        self.advance_to(publisher.acknowledged(), force)
    }

    fn advance_to(&mut self, acknowledged: u64, force: bool) -> Result<(), ReplayError> {
        let mut moved = false;
        while self.settled < acknowledged {
            let Some(position) = self.positions.pop_front() else {
                break;
            };
            self.settled += 1;
            self.state.acknowledged += 1;
            self.state.position = Some(position);
            moved = true;
        }
        self.progress.update(self.settled);
        if (moved && self.last_save.elapsed() >= SAVE_EVERY) || force {
            self.file.save(&self.state).map_err(ReplayError::State)?;
            self.last_save = Instant::now();
        }
        Ok(())
    }
}

/// Where the ordering columns are in a selected row.
fn key_indices(settings: &Settings, source: &Source) -> Vec<usize> {
    let columns = settings.outbox.columns();
    order_columns(settings, source.id_is_sequential)
        .iter()
        .filter_map(|c| columns.iter().position(|(_, m)| m == c))
        .collect()
}

/// Rows after `key` in replay order: `(ts, id) > ('…', '…')` (untyped literals take the
/// columns' types).
fn after_key(settings: &Settings, source: &Source, key: &[String]) -> String {
    let columns: Vec<String> = order_columns(settings, source.id_is_sequential)
        .iter()
        .map(|c| c.quoted())
        .collect();
    let values: Vec<String> = key.iter().map(|v| literal(v)).collect();
    if columns.len() == 1 {
        format!("{} > {}", columns[0], values[0])
    } else {
        format!("({}) > ({})", columns.join(", "), values.join(", "))
    }
}

/// The condition for `source`'s rows still to replay: none before the saved table, those after
/// the saved key in it, all after it.
fn remaining(settings: &Settings, source: &Source, index: usize, state: &ReplayState) -> String {
    match &state.position {
        Some(p) if index < p.table => "false".to_owned(),
        Some(p) if index == p.table => page_condition(settings, source, &state.condition, Some(&p.key)),
        _ => page_condition(settings, source, &state.condition, None),
    }
}

/// `condition` for `source`, after `key` when given. Rows are paged by their ordering key, so
/// a NULL in it (a timestamp column that orders uuid ids) could not be paged past: such rows
/// are left out (docs/operations.md says so).
fn page_condition(settings: &Settings, source: &Source, condition: &str, key: Option<&[String]>) -> String {
    let mut parts = vec![condition.to_owned()];
    for column in order_columns(settings, source.id_is_sequential) {
        if *column != settings.outbox.id {
            parts.push(format!("{} IS NOT NULL", column.quoted()));
        }
    }
    if let Some(key) = key {
        parts.push(after_key(settings, source, key));
    }
    parts.join(" AND ")
}

/// A dry run's first rows: id, aggregate, route-by value and the destination they would go to.
async fn first_rows(
    client: &Client,
    settings: &Settings,
    sources: &[Source],
    state: &ReplayState,
    to_topic: Option<&str>,
) -> Result<Vec<String>, ReplayError> {
    let limits = crate::sink::limits(settings);
    let mut shown = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        if shown.len() >= SHOWN_ROWS {
            break;
        }
        let condition = remaining(settings, source, index, state);
        let sql = format!(
            "{} LIMIT {}",
            select_rows(settings, &source.table, &condition, source.id_is_sequential),
            SHOWN_ROWS - shown.len()
        );
        let rows = text_rows(
            client
                .simple_query(&sql)
                .await
                .map_err(|e| ReplayError::Selection { condition, source: e })?,
        );
        for row in &rows {
            let values: Vec<Option<&str>> = row.iter().map(Option::as_deref).collect();
            let line = match OutboxEvent::from_columns(&settings.outbox, &source.table, &values, &source.format) {
                Ok(event) => {
                    let destination = match (to_topic, event.record(settings, &limits)) {
                        (Some(t), _) => t.to_owned(),
                        (None, Ok(record)) => record.destination.into_owned(),
                        (None, Err(e)) => format!("(not publishable: {e})"),
                    };
                    format!(
                        "{} id={} aggregate={} {}={} -> {destination}",
                        source.table,
                        OutboxEvent::id_of_columns(&values),
                        values.get(1).copied().flatten().unwrap_or("NULL"),
                        settings.outbox.route_by,
                        values.get(2).copied().flatten().unwrap_or("NULL"),
                    )
                }
                Err(e) => format!(
                    "{} id={}: not publishable: {e}",
                    source.table,
                    OutboxEvent::id_of_columns(&values)
                ),
            };
            shown.push(line);
        }
    }
    Ok(shown)
}

/// What `--since` asked for that is no longer in `source`'s table, said with how many rows
/// where the table can tell (a sequence id), and with `[retention] keep` when configured.
///
/// Said only where rows may have been removed: a sequence id tells (ids below the oldest row's
/// were handed out — to rows removed since, or to inserts rolled back, hence "up to"); without
/// one, `removed` does (retention's record or the table's statistics count a removal). A new
/// table has no rows older than its oldest, and is told nothing.
async fn removed_rows(
    client: &Client,
    settings: &Settings,
    criteria: &Criteria,
    source: &Source,
    removed: bool,
) -> Result<Option<String>, ReplayError> {
    let by = match &settings.retention {
        Some(r) => format!(
            "removed by retention ([retention] keep = {})",
            crate::config::retention::show(r.keep)
        ),
        None => "deleted (no [retention] in this config: by hand or another process)".to_owned(),
    };
    let table = source.table.quoted();
    let query = |sql: String| async move {
        client
            .query_one(&sql, &[])
            .await
            .map_err(BackfillError::query("reading the oldest outbox row"))
    };
    // The id sequence: its start and whether it ever handed out an id (`None`: not a serial id,
    // or not readable by this role).
    let sequence: Option<(i64, bool)> = match source.id_is_sequential {
        true => client
            .query_one(
                "SELECT s.seqstart, pg_sequence_last_value(s.seqrelid) IS NOT NULL FROM pg_sequence s \
                  WHERE s.seqrelid = pg_get_serial_sequence($1, $2)::regclass",
                &[&table, &settings.outbox.id.as_str()],
            )
            .await
            .ok()
            .map(|r| (r.get(0), r.get(1))),
        false => None,
    };
    let id = settings.outbox.id.quoted();
    match &criteria.since {
        Some(Bound::Id(n)) if source.id_is_sequential => {
            let row = query(format!("SELECT min({id})::int8 FROM {table}")).await?;
            // Ids below the id sequence's start never existed: `--since id:0` on a table whose
            // ids start at 1 asks for nothing that is gone.
            let n = &sequence.map_or(*n, |(start, _)| (*n).max(start));
            let Some(oldest) = row.get::<_, Option<i64>>(0) else {
                if !removed && sequence.is_some_and(|(_, used)| !used) {
                    return Ok(None);
                }
                return Ok(Some(format!(
                    "{}: the table holds no rows: every row --since id:{n} asks for was {by} (how many the table \
                     cannot tell)",
                    source.table
                )));
            };
            Ok((oldest > *n).then(|| {
                format!(
                    "{}: --since id:{n} asks for rows from id {n}, but the oldest row still in the table is id \
                     {oldest}: up to {} rows (ids {n} to {}; a sequence can skip numbers) were {by} and cannot be \
                     replayed",
                    source.table,
                    oldest - n,
                    oldest - 1
                )
            }))
        }
        Some(Bound::At(_) | Bound::Ago(_)) => {
            let Some(since_sql) = criteria.since_sql() else {
                return Ok(None);
            };
            let ts = settings.created_at_column().0.quoted();
            // (An id that is no sequence may have no min(): uuid before PostgreSQL 16.)
            let oldest_id = match source.id_is_sequential {
                true => format!("min({id})::text"),
                false => "NULL::text".to_owned(),
            };
            let row = query(format!(
                "SELECT min({ts})::text, extract(epoch FROM min({ts}) - {since_sql})::float8, {oldest_id} FROM {table}"
            ))
            .await?;
            // With a sequence id, ids below the oldest row's say whether anything came before it;
            // without one, whether anything was ever removed.
            let may_be_missing = match sequence {
                Some((start, used)) => match row.get::<_, Option<String>>(2) {
                    Some(oldest_id) => oldest_id.parse::<i64>().is_ok_and(|o| o > start),
                    None => used,
                },
                None => removed,
            };
            if !may_be_missing {
                return Ok(None);
            }
            let (Some(oldest), Some(gap)) = (row.get::<_, Option<String>>(0), row.get::<_, Option<f64>>(1)) else {
                return Ok(Some(format!(
                    "{}: the table holds no rows: every row --since asks for was {by} (how many the table cannot \
                     tell)",
                    source.table
                )));
            };
            Ok((gap > 0.0).then(|| {
                format!(
                    "{}: the oldest row still in the table is from {oldest}, {:.1} h after --since: rows written \
                     before it were {by} and cannot be replayed (how many the table cannot tell: it keeps no trace \
                     of removed rows)",
                    source.table,
                    gap / 3600.0
                )
            }))
        }
        _ => Ok(None),
    }
}
