//! The relay: a supervisor that runs replication sessions until shutdown.
//!
//! A session ends with an error classified by [`RelayError::is_transient`]. Transient errors
//! (connection lost, a delivery the sink failed, slot busy because another instance streams) lead to
//! a new session after a capped, jittered exponential backoff; the new session resumes from the
//! slot's `confirmed_flush_lsn`, so everything not yet confirmed is republished (at-least-once).
//! Fatal errors (bad configuration, a bad event under the `fail` policy, a lost slot) stop the
//! process with a message that says what to do.
//!
//! With several hosts in `postgres.url` (a primary and its standbys), losing the connection is
//! how a failover starts: the next sessions look for the primary at least every
//! [`FAILOVER_POLL`], and resume on the promoted standby's copy of the failover slot.
//!
//! Several processes with the same config form an active/standby group: the slot admits one
//! walsender, the others stand by (`standby.rs`) and take over within `relay.standby_poll_ms`
//! of the slot becoming free. A slot monitor task (`slot_monitor.rs`) checks the slot's health
//! for the whole life of the process, active or standby.

// The pipeline, in the order one event goes through it (`stream.rs` draws the table), driven
// by the event loop in `session.rs`; the watermark and confirm steps live inside the durability
// contract (`durability/`), the one way to a flush LSN.
mod decode;
mod durability;
mod early;
mod publish;
mod receive;
mod session;
mod stage;
mod stream;
// The delivery guarantee, chosen once per session, and takeover liveness, in every mode.
mod guarantee;
mod liveness;
// Beside the pipeline: what the steps need and what keeps a session healthy.
pub(crate) mod error;
pub(crate) mod heartbeat;
mod lag;
mod outage;
mod progress;
mod publication;
pub(crate) mod quarantine;
mod silence;
pub(crate) mod slot;
pub(crate) mod slot_monitor;
mod standby;
mod takeover;
#[cfg(test)]
mod test_frames;
mod transaction_meta;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info, warn};

use error::InternalError;
pub(crate) use error::RelayError;
pub(crate) use session::SessionEnd;

use self::slot_monitor::SlotVerdict;
use self::standby::Standby;
use crate::backoff::Backoff;
use crate::config::Settings;
use crate::ops::health::{Mode, RelayHealth};
use crate::ops::retry::wait_or_shutdown;

/// A session that streamed at least this long resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);
/// With several hosts in `postgres.url`, the longest wait between two looks for the primary
/// while none is reachable: a promotion is noticed within about this long, however long the
/// outage before it (the ordinary backoff would have grown to `reconnect_backoff_max`).
const FAILOVER_POLL: Duration = Duration::from_secs(1);

/// What sessions share across reconnects.
pub(crate) struct SessionContext {
    pub(crate) health: Arc<RelayHealth>,
    /// The process's main runtime, for side tasks (heartbeats) that must not wait on the
    /// stream thread (see [`run`]).
    pub(crate) side: tokio::runtime::Handle,
    /// The slot monitor's latest verdict; a streaming session ends on a fatal one.
    pub(crate) slot_verdict: watch::Receiver<SlotVerdict>,
    /// What earlier sessions of this process leave the next one.
    pub(crate) carried: Carried,
    /// Whether the broker acknowledges, across sessions (`outage.rs`).
    pub(crate) broker: outage::BrokerWatch,
    /// Failed sessions in a row (`outage.rs`).
    pub(crate) reconnects: outage::Reconnects,
    /// `[tracing]`: starts and ends each event's PRODUCER span; `None`: no spans.
    pub(crate) tracer: Option<crate::ops::tracing_export::Tracer>,
}

/// What one session leaves the next (kept by the supervisor).
#[derive(Default)]
pub(crate) struct Carried {
    /// Backend pid of this process's most recent walsender (set once streaming started).
    pub(crate) last_walsender: Option<i32>,
    /// Events the sink refused in an earlier session, to be sent alone on replay (`quarantine.rs`).
    pub(crate) suspects: quarantine::Suspects,
    /// The note about a publication wider than the relay needs was logged (`publication.rs`).
    pub(crate) publication_noted: bool,
    /// What this process saw of another instance holding the slot since it last streamed: the
    /// next session may have to wait for its queued records (`takeover.rs`).
    pub(crate) predecessor: takeover::Predecessor,
    /// Commit time (µs) of the latest transaction with events any session of this process
    /// confirmed: the recovery point named when the slot turns out to be gone.
    pub(crate) last_confirmed_commit_unix_us: Option<i64>,
    /// The role passed its start checks once (`postgres/role.rs`).
    pub(crate) role_checked: bool,
}

/// Streams until `shutdown` turns true (returns `Ok`) or a fatal error occurs, reporting what
/// it does to `health` (for `/readyz`; pass `Arc::default()` when nothing reads it).
///
/// The stream's event loop runs on a thread of its own, on a single-threaded runtime: while
/// reading a backlog it rests on purpose (`receive.rs`), and that rest must hold up nothing
/// else — the HTTP endpoints, the slot monitor and the heartbeats stay on the caller's runtime.
/// A single-threaded runtime also polls the loop on the thread that waits for its socket, with
/// no hand-over between threads per wake-up.
pub(crate) async fn run(
    settings: &Settings,
    shutdown: watch::Receiver<bool>,
    health: Arc<RelayHealth>,
) -> Result<(), RelayError> {
    for warning in settings
        .start_warnings()
        .into_iter()
        .chain(guarantee::warnings(settings))
    {
        warn!("{warning}");
    }
    // The same check `setup` and `setup --check` make first, so they refuse what this refuses.
    crate::sink::refusal::refusal(settings)?;
    // On the main runtime: exports never compete with the stream thread's event loop.
    let tracing = settings
        .tracing
        .as_ref()
        .map(crate::ops::tracing_export::start)
        .transpose()
        .map_err(|e| RelayError::Tracing(e.to_string()))?;
    let (tracer, export_task) = tracing.map_or((None, None), |(t, task)| (Some(t), Some(task)));
    let (_monitor, slot_verdict) = slot_monitor::spawn(settings, Arc::clone(&health));
    // On the main runtime, like the slot monitor; it acts only while this instance streams.
    let _retention = crate::retention::spawn(
        settings,
        crate::retention::Source::Stream,
        {
            let health = Arc::clone(&health);
            move || health.mode() == Mode::Streaming
        },
        shutdown.clone(),
    );
    let ctx = SessionContext {
        health: Arc::clone(&health),
        side: tokio::runtime::Handle::current(),
        slot_verdict,
        carried: Carried::default(),
        broker: Default::default(),
        reconnects: Default::default(),
        tracer,
    };
    let (done, outcome) = tokio::sync::oneshot::channel();
    let settings = settings.clone();
    std::thread::Builder::new()
        .name("outbox-relay-stream".into())
        .spawn(move || {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(RelayError::StreamThread)
                .and_then(|runtime| {
                    let (mut ctx, mut shutdown) = (ctx, shutdown);
                    runtime.block_on(supervise(&settings, &mut shutdown, &mut ctx))
                });
            let _ = done.send(outcome);
        })
        .map_err(RelayError::StreamThread)?;
    let outcome = outcome
        .await
        .unwrap_or_else(|_| Err(InternalError::StreamThreadPanicked.into()));
    health.set_mode(Mode::Stopping);
    // The stream thread dropped its tracer with the context: the last spans go out.
    if let Some(task) = export_task {
        task.finish().await;
    }
    outcome
}

async fn supervise(
    settings: &Settings,
    shutdown: &mut watch::Receiver<bool>,
    ctx: &mut SessionContext,
) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(
        settings.relay.reconnect_backoff_initial,
        settings.relay.reconnect_backoff_max,
    );
    let mut standby = Standby::default();
    let reconnects = ::metrics::counter!(crate::ops::metrics::RECONNECTS);
    loop {
        let started = Instant::now();
        match session::run_session(settings, shutdown, ctx).await {
            Ok(SessionEnd::Shutdown) => {
                info!(slot = %settings.postgres.slot, "relay stopped");
                return Ok(());
            }
            // Not "fatal": the caller says it once, and exits non-zero.
            Ok(SessionEnd::Undrained(e)) => return Err(e),
            Err(e) if e.is_slot_busy() => {
                let holder = e.slot_holder().unwrap_or_default();
                let delay = standby.on_busy(settings, ctx, &holder).await;
                if wait_or_shutdown(delay, shutdown).await {
                    return Ok(());
                }
            }
            Err(e) if e.is_transient() => {
                standby.reset();
                ctx.health.set_mode(Mode::Reconnecting);
                reconnects.increment(1);
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
                let mut delay = backoff.next_delay();
                if settings.postgres.host_ports().len() > 1 && e.is_connection_failure() {
                    delay = delay.min(FAILOVER_POLL);
                }
                if ctx.broker.stalled() && e.is_delivery_failure() {
                    // Part of the broker outage the log already reports (`outage.rs`).
                    ctx.broker.session_restarted(e.to_string());
                    info!(slot = %settings.postgres.slot, error = %e, retry_in_ms = delay.as_millis() as u64, "restarting the session during the broker outage");
                } else {
                    ctx.reconnects
                        .failed(Instant::now(), settings.postgres.slot.as_str(), &e, delay);
                }
                if wait_or_shutdown(delay, shutdown).await {
                    return Ok(());
                }
            }
            Err(e) => {
                // The error itself is logged once, by the caller (`run` exits with it).
                if let (RelayError::SlotMissing { .. }, Some(us)) = (&e, ctx.carried.last_confirmed_commit_unix_us) {
                    // After a failover on PostgreSQL 14-16 (or a dropped slot): where the
                    // recovery starts. Events committed up to then are in the sink.
                    let since = crate::ops::units::utc_from_unix_us(us);
                    error!(
                        slot = %settings.postgres.slot,
                        last_confirmed_commit = %since,
                        "every event committed up to {since} is in the broker. Recover: `outbox-relay setup --backfill --since \
                         '<{since} minus your longest transaction>'` (re-creates the slot and republishes the outbox \
                         rows created since; docs/operations.md, \"Failover on PostgreSQL 14-16\"), then run again"
                    );
                }
                return Err(e);
            }
        }
    }
}
