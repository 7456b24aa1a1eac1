//! One replication session: connect, stream, and wind down.
//!
//! The event loop is a single biased `tokio::select!`. Arms, in priority order:
//! 1. **shutdown** — stop reading at once;
//! 2. **status timer** — fires once per `status_interval`; it sits above the data arms because a
//!    busy stream must never starve it (the walsender drops connections that stay silent for
//!    `wal_sender_timeout`, and it is the only way confirmed LSNs reach the server);
//! 3. **delivery reports** — cheap, and they free in-flight capacity and advance the watermark;
//! 4. **replication frames** — disabled while the in-flight budget is exhausted (backpressure:
//!    TCP then pushes back on the walsender, which keeps answering our status updates).
//!
//! Every way out of the loop goes through [`wind_down`]: wait (bounded) for outstanding
//! deliveries, send a last status update with everything confirmed, end the copy, and abandon
//! the producer so a replay cannot be overtaken by its stragglers.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{interval, Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::error::RelayError;
use super::stream_state::{FrameAction, StreamState};
use crate::config::Settings;
use crate::lsn::Lsn;
use crate::pg_client;
use crate::publisher::{Delivery, Publisher};
use crate::replication::connection::{FrameReader, ReplicationConnection, StatusWriter};
use crate::replication::frames::{now_pg_timestamp, StandbyStatusUpdate};

/// Frames handled per wake-up before yielding back to the select (keeps timers responsive).
const FRAME_BATCH: usize = 512;
const DELIVERY_BATCH: usize = 4096;

/// How a session ended without error.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    Shutdown,
}

/// Where the slot stands before streaming.
struct SlotState {
    confirmed_flush: Lsn,
}

pub async fn run_session(settings: &Settings, shutdown: &mut watch::Receiver<bool>) -> Result<SessionEnd, RelayError> {
    let slot = check_slot(settings).await?;
    let timeout = settings.relay.connect_timeout;
    let conn = ReplicationConnection::connect(&settings.postgres, timeout).await?;
    let backend_pid = conn.backend_pid;
    let (mut reader, mut writer) = conn
        .start_replication(
            settings.postgres.slot.as_str(),
            slot.confirmed_flush,
            settings.postgres.publication.as_str(),
            true,
        )
        .await?;
    let (publisher, mut deliveries) =
        Publisher::new(&settings.kafka, settings.relay.max_in_flight).map_err(RelayError::ProducerConfig)?;
    info!(
        slot = %settings.postgres.slot,
        publication = %settings.postgres.publication,
        start_lsn = %slot.confirmed_flush,
        walsender_pid = backend_pid,
        "streaming started"
    );
    let mut state = StreamState::new(settings, publisher, slot.confirmed_flush);
    let outcome = stream(&mut state, &mut reader, &mut writer, &mut deliveries, shutdown).await;
    if let Err(e) = &outcome {
        warn!(error = %e, slot = %settings.postgres.slot, "stopping stream");
    }
    wind_down(state, &mut reader, &mut writer, &mut deliveries, settings.relay.shutdown_timeout).await;
    outcome
}

async fn check_slot(settings: &Settings) -> Result<SlotState, RelayError> {
    let client = pg_client::connect(&settings.postgres, settings.relay.connect_timeout).await?;
    let row = client
        .query_opt(
            "SELECT plugin, slot_type, confirmed_flush_lsn::text,
                    CASE WHEN current_setting('server_version_num')::int >= 130000
                         THEN (to_jsonb(s) ->> 'wal_status') END
               FROM pg_replication_slots s
              WHERE slot_name = $1 AND (database IS NULL OR database = current_database())",
            &[&settings.postgres.slot.as_str()],
        )
        .await?;
    let slot = settings.postgres.slot.to_string();
    let Some(row) = row else { return Err(RelayError::SlotMissing { slot }) };
    let plugin: Option<String> = row.get(0);
    let slot_type: String = row.get(1);
    let confirmed: Option<String> = row.get(2);
    let wal_status: Option<String> = row.get(3);
    if slot_type != "logical" || plugin.as_deref() != Some("pgoutput") {
        return Err(RelayError::WrongSlotPlugin { slot, plugin: plugin.unwrap_or(slot_type) });
    }
    let confirmed_flush = confirmed.and_then(|c| c.parse().ok()).unwrap_or(Lsn::ZERO);
    if wal_status.as_deref() == Some("lost") {
        return Err(RelayError::SlotLost { slot, confirmed: confirmed_flush });
    }
    Ok(SlotState { confirmed_flush })
}

async fn stream(
    state: &mut StreamState<'_>,
    reader: &mut FrameReader,
    writer: &mut StatusWriter,
    deliveries: &mut mpsc::UnboundedReceiver<Delivery>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<SessionEnd, RelayError> {
    let mut status_timer = interval(state.status_interval());
    status_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(DELIVERY_BATCH);
    loop {
        if *shutdown.borrow() {
            return Ok(SessionEnd::Shutdown);
        }
        let paused = state.is_full();
        tokio::select! {
            biased;
            _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
            _ = status_timer.tick() => send_status(state, writer).await?,
            n = deliveries.recv_many(&mut batch, DELIVERY_BATCH) => {
                if n == 0 {
                    return Err(RelayError::Protocol("the producer's delivery channel closed".into()));
                }
                // Apply the whole batch even after a failure: dropping reports would leave
                // their events counted as in flight and stall the wind-down.
                let mut failure = None;
                for d in batch.drain(..) {
                    if let Err(e) = state.on_delivery(d) {
                        failure.get_or_insert(e);
                    }
                }
                if let Some(e) = failure {
                    return Err(e);
                }
            }
            frame = reader.next_frame(), if !paused => {
                let Some(frame) = frame? else { return Err(crate::replication::error::ReplicationError::Closed.into()) };
                let mut reply = state.on_frame(frame)? == FrameAction::ReplyNow;
                for _ in 0..FRAME_BATCH {
                    if state.is_full() {
                        break;
                    }
                    match reader.try_next_frame()? {
                        Some(frame) => reply |= state.on_frame(frame)? == FrameAction::ReplyNow,
                        None => break,
                    }
                }
                if reply {
                    send_status(state, writer).await?;
                }
            }
        }
    }
}

async fn send_status(state: &mut StreamState<'_>, writer: &mut StatusWriter) -> Result<(), RelayError> {
    let (write, flush) = state.status_position();
    let update = StandbyStatusUpdate { write, flush, apply: flush, client_time: now_pg_timestamp(), reply_requested: false };
    writer.send_copy_data(|out| update.encode(out)).await?;
    Ok(())
}

async fn wind_down(
    mut state: StreamState<'_>,
    reader: &mut FrameReader,
    writer: &mut StatusWriter,
    deliveries: &mut mpsc::UnboundedReceiver<Delivery>,
    wait: Duration,
) {
    let deadline = Instant::now() + wait;
    let mut batch = Vec::with_capacity(DELIVERY_BATCH);
    while state.in_flight() > 0 {
        tokio::select! {
            n = deliveries.recv_many(&mut batch, DELIVERY_BATCH) => {
                if n == 0 { break; }
                for d in batch.drain(..) {
                    state.on_delivery_draining(d);
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                warn!(in_flight = state.in_flight(), "gave up waiting for Kafka acknowledgements; they will be replayed");
                break;
            }
        }
    }
    let sent = send_status(&mut state, writer).await;
    let counts = state.counts;
    info!(
        confirmed_lsn = %state.confirmed(),
        received_lsn = %state.received(),
        transactions = counts.transactions,
        events_sent = counts.events_sent,
        events_acked = counts.events_acked,
        final_status_sent = sent.is_ok(),
        "stream stopped"
    );
    if sent.is_ok() && writer.send_copy_done().await.is_ok() {
        reader.finish(Duration::from_secs(2)).await;
    }
    writer.terminate().await;
    let publisher: Publisher = state.into_publisher();
    // Awaited: the next session's producer must not start replaying while this one's requests
    // are still on the wire.
    let _ = tokio::task::spawn_blocking(move || publisher.abandon(Duration::from_secs(5))).await;
}
