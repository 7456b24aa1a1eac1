//! The state of one streaming session, shared by the pipeline's steps.
//!
//! One event goes through the steps in this order, each in a file of its own:
//!
//! | step | file | what it does |
//! |---|---|---|
//! | receive | `receive.rs` | reads replication frames off the socket, in batches |
//! | decode | `decode.rs` | frame → pgoutput message → outbox event (transactions, relations, rows, messages) |
//! | publish | `publish.rs` | event → topic → Kafka record; bad events and suspects |
//! | watermark | `watermark.rs` | settles acknowledgements in commit order |
//! | confirm | `confirm.rs` | flush LSN = watermark, never backwards, sent to PostgreSQL |
//!
//! Pure with respect to I/O except for handing records to librdkafka: the event loop
//! (`session.rs`) feeds it frames and delivery reports and does the waiting.

use std::collections::HashMap;
use std::sync::Arc;

use super::confirm::Confirm;
use super::error::RelayError;
use super::quarantine::{Held, Suspects};
use super::resume::{Done, Resume};
use crate::config::Settings;
use crate::outbox::layout::DebeziumColumns;
use crate::outbox::layout::OutboxLayout;
use crate::outbox::payload::ByteaTypes;
use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::{PgTimestamp, Relation};
use crate::postgres::replication::connection::StatusWriter;
use crate::relay::watermark::{AckWatermark, TxnTicket};

/// Rides along with each record and comes back in its delivery report.
#[derive(Debug)]
pub(crate) struct DeliveryTag {
    pub(crate) ticket: TxnTicket,
    pub(crate) bytes: usize,
    /// Commit LSN of the event's transaction, for error messages.
    pub(crate) commit_lsn: Lsn,
    /// Commit time (µs since the Unix epoch), for latency measurements.
    pub(crate) commit_time_unix_us: i64,
    /// Position among its transaction's outbox events (with `commit_lsn`, the event's identity
    /// across replays; see `relay::quarantine`).
    pub(crate) event_seq: u32,
    /// A dead letter (`[relay] on_bad_event = "dead-letter"`): its failure is a plain delivery
    /// failure, never another bad event.
    pub(crate) dead_letter: bool,
    /// The event's topic in the session's per-topic metrics (`crate::ops::metrics::SessionMetrics`).
    pub(crate) topic: crate::ops::metrics::TopicId,
}

/// The relay's sink and its completions, tagged with [`DeliveryTag`]s.
pub(crate) type Publisher = Box<dyn crate::sink::Sink<DeliveryTag>>;
pub(crate) type Delivery = crate::sink::Completion<DeliveryTag>;

pub(super) struct CachedRelation {
    pub(super) relation: Relation,
    /// `Some` only for the outbox table.
    pub(super) layout: Option<OutboxLayout>,
}

pub(super) struct OpenTxn {
    pub(super) ticket: TxnTicket,
    pub(super) commit_lsn: Lsn,
    pub(super) commit_time: PgTimestamp,
    /// Outbox events (rows and messages) seen so far: the next event's position.
    pub(super) events: u32,
}

/// Where the session is, as far as sending goes.
pub(super) enum Phase {
    /// Reading frames and sending their events.
    Streaming,
    /// A suspect (`quarantine.rs`) is sent alone: reading pauses until Kafka's verdict on it.
    Holding(Held),
    /// Winding down: deliveries are applied, nothing new is sent. A suspect held when the
    /// session ended stays, so its acknowledgement still clears it.
    Draining(Option<Held>),
}

impl Phase {
    pub(super) fn held(&self) -> Option<&Held> {
        match self {
            Phase::Streaming => None,
            Phase::Holding(held) => Some(held),
            Phase::Draining(held) => held.as_ref(),
        }
    }

    /// Takes the held suspect, leaving the phase otherwise as it was.
    pub(super) fn take_held(&mut self) -> Option<Held> {
        match std::mem::replace(self, Phase::Streaming) {
            Phase::Streaming => None,
            Phase::Holding(held) => Some(held),
            Phase::Draining(held) => {
                *self = Phase::Draining(None);
                held
            }
        }
    }

    pub(super) fn is_draining(&self) -> bool {
        matches!(self, Phase::Draining(_))
    }
}

/// Counters for logs (and, later, metrics).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SessionCounts {
    pub(crate) transactions: u64,
    pub(crate) events_sent: u64,
    pub(crate) events_acked: u64,
    /// Events handled by `relay.on_bad_event`.
    pub(crate) bad_events: u64,
}

/// What the event loop must do after a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameAction {
    Nothing,
    /// The server asked for a status update right away.
    ReplyNow,
    /// Exactly-once: the frame's event waits for its partition's read-back; the frame is kept
    /// and decoded again once it is done (`resume.rs`).
    Blocked,
}

pub(crate) struct StreamState<'s> {
    pub(super) settings: &'s Settings,
    pub(super) publisher: Publisher,
    /// The sink's name rule and largest message.
    pub(super) limits: crate::sink::SinkLimits,
    pub(super) watermark: AckWatermark,
    /// The only producer of the flush LSN sent to PostgreSQL (`confirm.rs`).
    pub(super) confirm: Confirm,
    pub(super) relations: HashMap<u32, Arc<CachedRelation>>,
    /// Which payload column types are binary (`bytea` and the domains over it), read from the
    /// catalog when the session starts (`session.rs`).
    pub(super) bytea: ByteaTypes,
    /// `[debezium]`: the format and the outbox table's NOT NULL columns, read with `bytea`.
    pub(super) debezium: Option<DebeziumColumns>,
    pub(super) open: Option<OpenTxn>,
    /// Events Kafka refused in earlier sessions (kept by the supervisor).
    pub(super) suspects: &'s mut Suspects,
    pub(super) phase: Phase,
    pub(super) received: Lsn,
    /// How far behind the source the reading is, by the server's own clock: its send time of
    /// the last data frame minus the commit time of the last transaction begun, in µs (see
    /// [`StreamState::catching_up`]).
    pub(super) behind_us: i64,
    /// The server's send time of the last data frame (µs since the epoch).
    pub(super) last_send_unix_us: i64,
    pub(crate) counts: SessionCounts,
    /// Per-topic counters and the commit-to-ack histogram (see `progress.rs`).
    pub(super) metrics: crate::ops::metrics::SessionMetrics,
    pub(super) lag: super::lag::CommitLag,
    /// `relay.delivery = "exactly-once"`: the replay check (`resume.rs`); `None`: at-least-once.
    pub(super) resume: Option<Resume>,
    /// The frame whose event waits for a read-back (exactly-once only).
    pub(super) blocked: Option<bytes::Bytes>,
}

impl<'s> StreamState<'s> {
    pub(crate) fn new(settings: &'s Settings, publisher: Publisher, start: Lsn, suspects: &'s mut Suspects) -> Self {
        suspects.forget_before(start);
        StreamState {
            settings,
            publisher,
            limits: crate::sink::limits(settings),
            watermark: AckWatermark::new(start),
            relations: HashMap::new(),
            bytea: ByteaTypes::default(),
            debezium: None,
            open: None,
            suspects,
            confirm: Confirm::new(start),
            phase: Phase::Streaming,
            received: start,
            behind_us: 0,
            last_send_unix_us: 0,
            counts: SessionCounts::default(),
            metrics: crate::ops::metrics::SessionMetrics::default(),
            lag: super::lag::CommitLag::default(),
            resume: None,
            blocked: None,
        }
    }

    /// Backpressure: stop reading WAL while this many events or bytes are unacknowledged, while
    /// as many events of committed transactions await confirmation (what a crash would replay;
    /// see `AckWatermark::committed_unconfirmed_events`), and while a suspect is held
    /// (`quarantine.rs`).
    pub(crate) fn is_full(&self) -> bool {
        let max = self.settings.relay.max_in_flight;
        self.watermark.in_flight_events() >= max
            || self.watermark.in_flight_bytes() >= self.settings.relay.max_in_flight_bytes
            || self.watermark.committed_unconfirmed_events() >= max
            || matches!(self.phase, Phase::Holding(_))
            || self.blocked.is_some()
    }

    pub(crate) fn status_interval(&self) -> std::time::Duration {
        self.settings.relay.status_interval
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.watermark.in_flight_events()
    }

    /// Sends a standby status update with everything confirmed (`confirm.rs` has the rule).
    /// `reply_requested` makes the walsender answer at once (used to probe a silent connection).
    pub(crate) async fn send_status(
        &mut self,
        writer: &mut StatusWriter,
        reply_requested: bool,
    ) -> Result<(), RelayError> {
        self.confirm
            .send(&self.watermark, self.received, writer, reply_requested)
            .await?;
        if let Some(resume) = &mut self.resume {
            resume.status_sent();
        }
        Ok(())
    }

    /// Exactly-once: errs once the stream went longer than the stale limit without a status
    /// update (it was paused and may have been taken over; `resume.rs`).
    pub(crate) fn check_alive(&self) -> Result<(), RelayError> {
        self.resume.as_ref().map_or(Ok(()), Resume::check_alive)
    }

    /// Whether acknowledgements moved the watermark past what PostgreSQL was told.
    pub(crate) fn has_unreported_progress(&self) -> bool {
        self.confirm.has_unreported(&self.watermark)
    }

    pub(crate) fn confirmed(&self) -> Lsn {
        self.confirm.confirmed(&self.watermark)
    }

    pub(crate) fn received(&self) -> Lsn {
        self.received
    }

    /// Whether the stream is reading a backlog: the server sent the last transaction begun more
    /// than `age` after committing it. Both times are the server's, so this host's clock does
    /// not matter; live traffic is sent within milliseconds of its commit.
    pub(crate) fn catching_up(&self, age: std::time::Duration) -> bool {
        self.behind_us > i64::try_from(age.as_micros()).unwrap_or(i64::MAX)
    }

    pub(crate) fn into_publisher(self) -> Publisher {
        self.publisher
    }

    /// Decodes a frame; exactly-once, a frame whose event must wait for a read-back is kept
    /// (reading pauses: [`is_full`](Self::is_full)) until [`on_read_back`](Self::on_read_back).
    pub(crate) fn on_frame_or_block(&mut self, frame: bytes::Bytes) -> Result<FrameAction, RelayError> {
        if self.resume.is_none() {
            return self.on_frame(frame);
        }
        let action = self.on_frame(frame.clone())?;
        if action == FrameAction::Blocked {
            self.blocked = Some(frame);
        }
        Ok(action)
    }

    /// A read-back finished: the kept frame is decoded again (and may wait for another one).
    pub(crate) fn on_read_back(&mut self, done: Done) -> Result<(), RelayError> {
        if let Some(resume) = &mut self.resume {
            resume.on_done(done)?;
        }
        if let Some(frame) = self.blocked.take() {
            self.on_frame_or_block(frame)?;
        }
        Ok(())
    }

    /// Undoes the open transaction's last [`next_event`](Self::next_event): the frame that
    /// asked for it is decoded again later.
    pub(super) fn unallocate_event(&mut self) {
        if let Some(txn) = self.open.as_mut() {
            txn.events -= 1;
        }
    }

    /// Applies one delivery report. A failure poisons the watermark and ends the session,
    /// unless it is a suspect's verdict that `relay.on_bad_event` settles (see `publish.rs`).
    pub(crate) fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        let tag = delivery.tag;
        self.count_delivery(&tag, delivery.outcome.is_ok());
        match delivery.outcome {
            Ok(()) => {
                self.watermark.acked(tag.ticket, tag.bytes)?;
                self.counts.events_acked += 1;
                self.held_accepted(&tag);
            }
            Err(failure) => self.on_failed_delivery(&tag, failure)?,
        }
        self.release_held()
    }

    /// Like [`on_delivery`](Self::on_delivery) while winding down after an error: failures
    /// are already accounted for, so they only stop the watermark, and nothing new is sent.
    pub(crate) fn on_delivery_draining(&mut self, delivery: Delivery) {
        if !self.phase.is_draining() {
            self.phase = Phase::Draining(self.phase.take_held());
        }
        let _ = self.on_delivery(delivery);
    }
}
