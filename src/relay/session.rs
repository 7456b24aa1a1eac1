//! One replication session: connect, stream, and wind down.
//!
//! The event loop is a single biased `tokio::select!`. Arms, in priority order:
//! 1. **shutdown** — stop reading at once;
//! 2. **status timer** — fires once per `status_interval`; it sits above the data arms because a
//!    busy stream must never starve it (the walsender drops connections that stay silent for
//!    `wal_sender_timeout`, and it is the only way confirmed LSNs reach the server). The same
//!    tick checks for a dead connection (`silence.rs`), for a pause past the stale limit or a
//!    server unheard too long (`liveness.rs`), and publishes progress (metrics, lag, what the
//!    delivery guarantee holds the stream back by);
//! 3. **slot verdict** — the slot monitor task (`slot_monitor.rs`) found the slot lost: stop.
//!    Rare and cheap, so it sits above the busy arms;
//! 4. **delivery reports** — cheap, and they free in-flight capacity and advance the watermark;
//! 5. **the guarantee's answers** (exactly-once by read-back) — a partition's tail arrived from
//!    its thread; the event that waited for it is published (`guarantee/read_back.rs`);
//! 6. **room in the sink** — the sink's own queue was full ([`FULL_RETRY`] after it said so,
//!    unless a delivery report freed room first): what it did not take is handed over again;
//! 7. **replication frames** — disabled while the in-flight budget is exhausted or the sink has
//!    no room (backpressure: TCP then pushes back on the walsender, which keeps answering our
//!    status updates);
//! 8. **deferred work** — a released streamed transaction (`stage.rs`) or a held one goes on a
//!    batch at a time at the top of the loop; this arm only yields to the runtime and brings
//!    the loop back there while the sink can take more, below every other arm so that none
//!    waits for it. (The status deadline is also checked at the top of the loop: a busy loop
//!    may keep the runtime from firing timers.)
//!
//! Reading a backlog, the loop also rests after a read emptied the socket, so frames and reports
//! come in large batches (`receive.rs`).
//!
//! Before streaming, the slot is checked (`slot.rs`: missing or lost is fatal, held by someone
//! else means standing by) and the publication too (`publication.rs`: it must publish inserts);
//! right after `START_REPLICATION` it is re-read to make sure the server will not skip WAL this
//! session has not seen. Then the session's delivery guarantee is chosen, once, and its sink
//! created (`guarantee/`).
//!
//! Every way out of the loop goes through [`wind_down`]: wait (bounded; not at all after a pause
//! past the stale limit) for outstanding deliveries, send a last status update with everything
//! confirmed, abandon the sink so a replay cannot be overtaken by its stragglers, and only
//! then end the copy (a standby that takes the slot once the walsender is gone must find nothing
//! of this process still on its way to the sink: `takeover.rs`).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::decode::Decoder;
use super::error::{InternalError, RelayError};
use super::guarantee::{self, Answer, Answers, Chosen};
use super::liveness::{self, Liveness};
use super::outage::Waiting;
use super::publish::{Delivery, DeliveryTag};
use super::receive;
use super::silence::Silence;
use super::stage::Stage;
use super::stream::{Parts, StreamState};
use super::takeover::Predecessor;
use super::{heartbeat, publication, slot, SessionContext};
use crate::config::Settings;
use crate::ops::health::Mode;
use crate::ops::metrics::{now_unix_us, StreamGauges};
use crate::ops::units::utc_from_unix_us;
use crate::outbox::column_types::check_mapping;
use crate::outbox::layout::DebeziumColumns;
use crate::outbox::payload::ByteaTypes;
use crate::postgres::client as pg_client;
use crate::postgres::replication::connection::{FrameReader, ReplicationConnection, StatusWriter};
use crate::postgres::replication::error::ReplicationError;
use crate::postgres::replication::protocol::Protocol;
use crate::sink::Completions;

const DELIVERY_BATCH: usize = 4096;
/// After the sink said its queue is full and no delivery report came since: when to try again.
/// The client frees room as it serves reports, on its own clock, so a report alone is not a
/// reliable signal (Kafka: a report's records are freed only after its last completion).
const FULL_RETRY: Duration = Duration::from_millis(5);

/// How a session ended without error.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// Shutdown, with everything handed over acknowledged.
    Shutdown,
    /// Shutdown, the drain cut short by `relay.shutdown_timeout` ([`RelayError::Undrained`]):
    /// nothing is lost (the slot was not confirmed past what was acknowledged), but the
    /// process exits non-zero.
    Undrained(RelayError),
}

pub(crate) async fn run_session(
    settings: &Settings,
    shutdown: &mut watch::Receiver<bool>,
    ctx: &mut SessionContext,
) -> Result<SessionEnd, RelayError> {
    let slot_name = settings.postgres.slot.as_str();
    let timeout = settings.relay.connect_timeout;
    let control = pg_client::connect(&settings.postgres, timeout).await?;
    let (slot, decoder) = before_streaming(&control, settings, ctx).await?;
    let mut conn =
        ReplicationConnection::connect_with(&settings.postgres, timeout, Some(settings.relay.receive_timeout)).await?;
    let backend_pid = conn.backend_pid;
    let host = conn.host().to_owned();
    // Which cluster and timeline this session reads: after a failover or a restore the
    // operator can tell from the log which server the events came from.
    let system = conn.identify_system().await?;
    let protocol = Protocol::choose(settings.postgres.streaming, conn.server_version_num)?;
    let (mut reader, mut writer) = conn
        .start_replication(
            slot_name,
            slot.confirmed_flush,
            settings.postgres.publication.as_str(),
            true,
            protocol,
        )
        .await?;
    ctx.carried.last_walsender = Some(backend_pid);
    slot::verify_start(&control, slot_name, slot.confirmed_flush).await?;
    // Only the slot's holder gets here: the stage directory is this slot's alone (slot names are
    // unique in a cluster, the system identifier tells clusters apart).
    let stage = Stage::open(&settings.relay.stage, &format!("{}-{slot_name}", system.system_id))?;
    let decoder = decoder.with_streaming(protocol.streams());
    // The slot is ours now: takeover liveness starts, and the delivery guarantee is chosen and
    // its sink created — a transactional sink fences earlier producers of its identity, and a
    // holder must never fence the one that holds the slot (`guarantee/`).
    let liveness = Liveness::new(&settings.relay, liveness::wal_sender_timeout(&control).await?);
    let start = guarantee::Start {
        control: &control,
        system_id: &system.system_id,
        slot_start: slot.confirmed_flush,
        predecessor: &ctx.carried.predecessor,
    };
    let Chosen {
        guarantee,
        sink,
        mut completions,
        mut answers,
    } = guarantee::start(settings, &start).await?;
    info!(
        slot = %settings.postgres.slot,
        publication = %settings.postgres.publication,
        delivery = guarantee.label(),
        protocol = protocol.describe(),
        start_lsn = %slot.confirmed_flush,
        walsender_pid = backend_pid,
        host = %host,
        system_id = %system.system_id,
        timeline = system.timeline,
        server_wal_lsn = %system.xlogpos,
        "streaming started"
    );
    ctx.health.set_mode(Mode::Streaming);
    ctx.reconnects.streaming(std::time::Instant::now(), slot_name);
    ctx.broker.session_started(std::time::Instant::now());
    drop(control);
    let _heartbeat = heartbeat::spawn(settings, &ctx.side);
    // Lent to the session's state and handed back after the wind-down, for the next session.
    let mut suspects = std::mem::take(&mut ctx.carried.suspects);
    let parts = Parts {
        decoder,
        sink,
        guarantee,
        liveness,
        start: slot.confirmed_flush,
        suspects: &mut suspects,
        tracer: ctx.tracer.clone(),
        stage,
    };
    let mut state = StreamState::new(settings, parts);
    // The predecessor is forgotten once nothing holds the stream back for it: a session that
    // ends before its fence passed leaves it to the next one, whose fence ends at the same
    // instant (`takeover.rs`).
    show_hold(&mut state, ctx);
    let outcome = stream(
        &mut state,
        &mut reader,
        &mut writer,
        &mut completions,
        &mut answers,
        shutdown,
        ctx,
    )
    .await;
    // How the session ended is logged once, by whoever decides what follows: the supervisor for a
    // reconnect (`reconnecting`, or the outage summary), `run` for a fatal error.
    // A paused holder may have been taken over: what it still has queued must not reach the
    // sink after the new holder replayed, so nothing is waited for (`liveness.rs`).
    let wait = match &outcome {
        Err(RelayError::Paused { .. } | RelayError::Unheard { .. }) => Duration::ZERO,
        _ => settings.relay.shutdown_timeout,
    };
    ctx.health.set_fence(None, 0.0);
    // Only a clean stop seals what is whole: after a failure the producer may be unusable.
    let seal_last = outcome.is_ok();
    let wound = wind_down(state, &mut reader, &mut writer, &mut completions, wait, seal_last).await;
    if wound.last_confirmed.is_some() {
        ctx.carried.last_confirmed_commit_unix_us = wound.last_confirmed;
    }
    // Whatever was still in flight belongs to the abandoned producer and will be replayed.
    StreamGauges::default().set_idle();
    ctx.carried.suspects = suspects;
    match outcome {
        Ok(SessionEnd::Shutdown) if wound.unacknowledged > 0 => Ok(SessionEnd::Undrained(RelayError::Undrained {
            sink: settings.sink.broker_name(),
            slot: slot_name.to_owned(),
            in_flight: wound.unacknowledged,
            confirmed: wound.confirmed,
            timeout_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        })),
        other => other,
    }
}

/// What a session checks and reads on its control connection before it streams: the role
/// (first: a role that can never stream fails whether the slot is free or held,
/// `postgres/role.rs`), the slot (missing or lost is fatal, held by someone else means standing
/// by), the publication, the column mapping (every configured column, with its type), and what
/// the decoder needs of the catalog.
async fn before_streaming(
    control: &tokio_postgres::Client,
    settings: &Settings,
    ctx: &mut SessionContext,
) -> Result<(slot::StartPoint, Decoder), RelayError> {
    let slot_name = settings.postgres.slot.as_str();
    let role = crate::postgres::role::role_facts(control).await?;
    let fenced = crate::sink::takeover_fenced(settings);
    crate::postgres::role::check_session(settings, &role, fenced, &mut ctx.carried.role_checked)?;
    let slot = slot::check_for_start(slot_name, slot::read_slot(control, slot_name).await?)?;
    publication::log_note(
        publication::check(control, settings).await?,
        &mut ctx.carried.publication_noted,
    );
    // A payload column of bytea or of a domain over it is published as its bytes. Read once per
    // session: a domain created while the session streams is known from the next session on.
    let bytea = ByteaTypes::with_domains(pg_client::bytea_domain_oids(control).await?);
    // Every configured column exists with a usable type — the check `setup` makes — before
    // anything streams: a mapping the table does not fit stops here, named, not at the first
    // event (nor after /readyz said ready). A table that is not there is the publication's to
    // report (above); one altered later is caught by its Relation (`outbox/layout.rs`).
    let mut not_null = Vec::with_capacity(settings.outbox.tables.len());
    for table in &settings.outbox.tables {
        let columns = pg_client::catalog_columns(control, &table.quoted()).await?;
        if !columns.is_empty() {
            check_mapping(&settings.outbox, table, &columns)?;
        }
        let names = columns.into_iter().filter(|c| c.not_null).map(|c| c.name).collect();
        not_null.push((table.clone(), names));
    }
    let debezium = settings.debezium.as_ref().map(|format| DebeziumColumns {
        format: format.clone(),
        not_null,
    });
    Ok((slot, Decoder::new(bytea, debezium)))
}

async fn stream(
    state: &mut StreamState<'_>,
    reader: &mut FrameReader,
    writer: &mut StatusWriter,
    deliveries: &mut Completions<DeliveryTag>,
    answers: &mut Option<Answers>,
    shutdown: &mut watch::Receiver<bool>,
    ctx: &mut SessionContext,
) -> Result<SessionEnd, RelayError> {
    // The status update's deadline, served by the timer arm while the loop waits and checked
    // at the top of the loop while it is busy: publishing a released transaction (reports come
    // by channel, there is no I/O to wait for) can keep the runtime from turning its timer
    // driver for seconds, and the walsender drops a stream that goes silent.
    let interval = state.status_interval();
    // The first update goes out at once, as the server's first reply is awaited.
    let mut status_due = Instant::now();
    // One timer for the whole session, moved when an update went out (not one per iteration).
    let status_timer = tokio::time::sleep_until(status_due);
    tokio::pin!(status_timer);
    let settings = state.settings();
    let mut silence = Silence::new(settings.relay.receive_timeout, Instant::now());
    let gauges = StreamGauges::default();
    let slot_name = settings.postgres.slot.as_str();
    let sink_name = settings.sink.broker_name();
    let mut batch = Vec::with_capacity(DELIVERY_BATCH);
    loop {
        if *shutdown.borrow() {
            return Ok(SessionEnd::Shutdown);
        }
        // Deferred work (a transaction held for its count) goes on as room frees, before any
        // new frame is read.
        state.work_backlog()?;
        if Instant::now() >= status_due {
            status_tick(state, writer, &mut silence, ctx, &gauges, sink_name).await?;
            status_due = Instant::now() + interval;
            status_timer.as_mut().reset(status_due);
        }
        let paused = state.is_full();
        let no_room = state.waiting_for_room();
        let more_work = state.has_ready_work();
        if paused {
            // Not reading is deliberate: silence now says nothing about the server.
            silence.heard(Instant::now());
            state.heard();
        }
        tokio::select! {
            biased;
            _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
            () = &mut status_timer => {
                status_tick(state, writer, &mut silence, ctx, &gauges, sink_name).await?;
                status_due = Instant::now() + interval;
                status_timer.as_mut().reset(status_due);
            }
            Ok(()) = ctx.slot_verdict.changed() => {
                if let Some(fatal) = ctx.slot_verdict.borrow_and_update().fatal(slot_name) {
                    return Err(fatal);
                }
            }
            n = deliveries.recv_many(&mut batch, DELIVERY_BATCH) => {
                if n == 0 {
                    return Err(InternalError::CompletionsClosed.into());
                }
                on_deliveries(state, writer, &mut batch, ctx, sink_name).await?;
            }
            Some(answer) = next_answer(answers) => state.on_answer(answer)?,
            _ = tokio::time::sleep(FULL_RETRY), if no_room => state.retry_room()?,
            frame = reader.next_frame(), if !paused => {
                let Some(frame) = frame? else { return Err(ReplicationError::Closed.into()) };
                silence.heard(Instant::now());
                let received = receive::take_batch(frame, reader, state)?;
                if received.reply_requested {
                    send_status(state, writer, false).await?;
                }
                // Sink transactions: nothing more ready is when a unit is sealed.
                state.seal_if_due(received.socket_drained)?;
                received.pace(state);
            }
            // Deferred work goes on at the top of the loop, a batch at a time; yielding first
            // lets the runtime serve its other work (and resets tokio's cooperative budget).
            () = tokio::task::yield_now(), if more_work => {}
        }
    }
}

/// The status interval passed: the liveness checks, the status update, and the tick's
/// bookkeeping.
async fn status_tick(
    state: &mut StreamState<'_>,
    writer: &mut StatusWriter,
    silence: &mut Silence,
    ctx: &mut SessionContext,
    gauges: &StreamGauges,
    sink_name: &'static str,
) -> Result<(), RelayError> {
    // A stream that was paused past the stale limit may have been taken over: it stops before
    // telling the server anything (`liveness.rs`).
    state.check_alive()?;
    let ask_for_reply = silence.check(Instant::now())? || state.wants_reply();
    send_status(state, writer, ask_for_reply).await?;
    tick(state, ctx, gauges, sink_name)
}

/// Writes the stream's next status update (`durability/`).
async fn send_status(state: &mut StreamState<'_>, writer: &mut StatusWriter, reply: bool) -> Result<(), RelayError> {
    let update = state.next_status(reply);
    writer.send_copy_data(|out| update.encode(out)).await?;
    Ok(())
}

/// The status tick's bookkeeping once the update went out: progress (metrics, lag, the
/// sink's outage), the sink's verdict, what holds the stream back, and a unit due by age.
fn tick(
    state: &mut StreamState<'_>,
    ctx: &mut SessionContext,
    gauges: &StreamGauges,
    sink_name: &'static str,
) -> Result<(), RelayError> {
    let progress = state.snapshot(now_unix_us());
    gauges.set(&progress);
    ctx.health.set_seconds_behind(progress.seconds_behind);
    let waiting = Waiting {
        events: progress.in_flight_events,
        bytes: progress.in_flight_bytes,
        oldest_commit_unix_us: (progress.seconds_behind > 0.0)
            .then(|| now_unix_us() - (progress.seconds_behind * 1e6) as i64),
        retained_wal_bytes: ctx.health.retained_wal_bytes(),
    };
    ctx.broker
        .tick(std::time::Instant::now(), &waiting, sink_name, state.sink_complaint());
    if let Some(fatal) = state.sink_verdict() {
        return Err(RelayError::Sink(fatal));
    }
    // After the verdict: a sink that waiting cannot mend is not said to be retried.
    ctx.broker.unheard_at_start(sink_name, || state.sink_unreachable());
    show_hold(state, ctx);
    // Sink transactions: a unit that reached its age is sealed even if reads go on.
    state.seal_if_due(false)
}

/// A batch of delivery reports: applied, then confirmed at once if they completed
/// transactions.
async fn on_deliveries(
    state: &mut StreamState<'_>,
    writer: &mut StatusWriter,
    batch: &mut Vec<Delivery>,
    ctx: &mut SessionContext,
    sink_name: &'static str,
) -> Result<(), RelayError> {
    if batch.iter().any(|d| d.outcome.is_ok()) {
        ctx.broker.acknowledged(std::time::Instant::now(), sink_name);
    }
    // Apply the whole batch even after a failure: dropping reports would leave their events
    // counted as in flight and stall the wind-down.
    let mut failure = None;
    for d in batch.drain(..) {
        if let Err(e) = state.on_delivery(d) {
            failure.get_or_insert(e);
        }
    }
    state.fold_latency();
    // Crash tests: acknowledged by the sink, not yet confirmed to PostgreSQL.
    fail::fail_point!("relay::acked_before_status", |_| crate::failpoints::crash(
        "relay::acked_before_status"
    ));
    if let Some(e) = failure {
        // A sink that knows waiting cannot help (`Sink::verdict`) ends the session with that,
        // not with the record's failure: the relay stops, nothing replays.
        if let Some(fatal) = state.sink_verdict() {
            return Err(RelayError::Sink(fatal));
        }
        return Err(e);
    }
    // Confirm as soon as acknowledgements complete transactions rather than at the next tick:
    // what a crash would replay then stays within the in-flight budget (the budget counts only
    // what the watermark has not confirmed, so a confirmation held back here would be replayed
    // on top of it).
    if state.has_unreported_progress() {
        send_status(state, writer, false).await?;
    }
    // A full budget freed at a boundary, or a seal done with the next unit due.
    state.seal_if_due(false)
}

/// Shows what the delivery guarantee holds the stream back by (a takeover's fence) in
/// `/readyz` and the metric; once nothing does, the predecessor it waited for is forgotten.
fn show_hold(state: &mut StreamState<'_>, ctx: &mut SessionContext) {
    match state.hold_note(std::time::Instant::now()) {
        Some(note) => ctx.health.set_fence(Some(note.text), note.seconds_left),
        None => {
            ctx.health.set_fence(None, 0.0);
            ctx.carried.predecessor = Predecessor::None;
        }
    }
}

/// The next answer to the delivery guarantee's background work; never, for a strategy that
/// has none.
async fn next_answer(answers: &mut Option<Answers>) -> Option<Answer> {
    match answers {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What a session's wind-down left.
struct WoundDown {
    /// Commit time of the latest confirmed transaction with events (`None`: none this session).
    last_confirmed: Option<i64>,
    /// Records handed over and never acknowledged: the wait ran out (replayed by the next
    /// session or start).
    unacknowledged: usize,
    /// What the slot was confirmed to.
    confirmed: crate::postgres::lsn::Lsn,
}

async fn wind_down(
    mut state: StreamState<'_>,
    reader: &mut FrameReader,
    writer: &mut StatusWriter,
    deliveries: &mut Completions<DeliveryTag>,
    wait: Duration,
    seal_last: bool,
) -> WoundDown {
    let deadline = Instant::now() + wait;
    let mut batch = Vec::with_capacity(DELIVERY_BATCH);
    // Sink transactions: a clean stop seals what is whole (a no-op otherwise), so the next start
    // neither aborts nor replays it; a seal under way is waited for like a delivery.
    if seal_last && state.seal_if_due(true).is_err() {
        warn!("could not seal the last unit of records; the sink aborts it and the next session replays it");
    }
    while state.in_flight() > 0 || state.sealing() {
        tokio::select! {
            n = deliveries.recv_many(&mut batch, DELIVERY_BATCH) => {
                if n == 0 { break; }
                for d in batch.drain(..) {
                    state.on_delivery_draining(d);
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                // Their outcome is unknown; the next replay skips only what its read-back finds.
                // A clean stop (`seal_last`) says so once, as its `Undrained` error (`run_session`).
                if !seal_last {
                    warn!(in_flight = state.in_flight(), "gave up waiting for the sink's acknowledgements; they will be replayed");
                }
                break;
            }
        }
    }
    let unacknowledged = state.in_flight();
    state.fold_latency();
    let sent = send_status(&mut state, writer, false).await;
    let counts = state.counts();
    // Every event committed up to this instant is in the sink: the recovery point should the
    // slot be lost (docs/operations.md, "Failover on PostgreSQL 14-16").
    let last_confirmed = state.snapshot(now_unix_us()).last_confirmed_commit_unix_us;
    info!(
        confirmed_lsn = %state.confirmed(),
        last_confirmed_commit = %last_confirmed.map(utc_from_unix_us).unwrap_or_else(|| "none this session".into()),
        received_lsn = %state.received(),
        transactions = counts.transactions,
        events_sent = counts.events_sent,
        events_acked = counts.events_acked,
        bad_events = counts.bad_events,
        skipped_already_in_sink = state.skipped(),
        final_status_sent = sent.is_ok(),
        "stream stopped"
    );
    let confirmed = state.confirmed();
    let sink = state.finish();
    // Awaited: the next session's sink must not start replaying while this one's requests
    // are still on the wire. Before the replication connection closes: once its walsender is
    // gone, a standby may take the slot over and replay, and nothing of this process may land
    // after that (`takeover.rs`).
    let _ = tokio::task::spawn_blocking(move || sink.abandon(Duration::from_secs(5))).await;
    if sent.is_ok() && writer.send_copy_done().await.is_ok() {
        reader.finish(Duration::from_secs(2)).await;
    }
    writer.terminate().await;
    WoundDown {
        last_confirmed,
        unacknowledged,
        confirmed,
    }
}
