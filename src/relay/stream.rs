//! The state of one streaming session, shared by the pipeline's steps.
//!
//! One event goes through the steps in this order, each in a file of its own:
//!
//! | step | file | what it does |
//! |---|---|---|
//! | receive | `receive.rs` | reads replication frames off the socket, in batches |
//! | decode | `decode.rs` | frame → [`Decoded`]: keepalive, Begin, Commit or an outbox event (pure) |
//! | publish | `publish.rs` | event → route → sink record, through the delivery guarantee's gate; bad events and suspects |
//! | watermark | `watermark.rs` | settles acknowledgements in commit order |
//! | confirm | `confirm.rs` | flush LSN = watermark, never backwards, sent to PostgreSQL |
//!
//! [`StreamState::on_frame`] is where the steps meet: it takes the decode step's output and hands
//! it on — transactions to the watermark, events to the publish step — and it is the one place
//! the delivery guarantee (`resume.rs`'s [`Guarantee`]) sees the stream: what the stream reached,
//! whether it is still alive, and an event that must wait for a read-back, kept here as decoded
//! and published again once the read-back is done. Pure with respect to I/O except for handing
//! records to the sink: the event loop (`session.rs`) feeds it frames, delivery reports and
//! read-backs and does the waiting.

use super::confirm::Confirm;
use super::decode::{Decoded, Decoder, EventSource};
use super::error::{RelayError, StreamViolation};
use super::quarantine::{Held, Suspects, TxnEvent};
use super::resume::{Done, Guarantee};
use crate::config::Settings;
use crate::postgres::lsn::Lsn;
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
    /// `[tracing]`: the event's PRODUCER span, ended when this tag comes back; `None` (no
    /// allocation) without tracing, for an unsampled root, and for dead letters.
    pub(crate) span: Option<Box<crate::ops::tracing_export::ProducerSpan>>,
    /// The tag of a seal (`seal.rs`), not of a record: its completion says whether the sink
    /// committed the unit (`ticket` is [`TxnTicket::SEAL`]).
    pub(crate) seal: bool,
}

/// The relay's sink and its completions, tagged with [`DeliveryTag`]s.
pub(crate) type Publisher = Box<dyn crate::sink::Sink<DeliveryTag>>;
pub(crate) type Delivery = crate::sink::Completion<DeliveryTag>;

/// An event the delivery guarantee made wait for a read-back: published again, as decoded,
/// once it is done (reading pauses meanwhile: [`StreamState::is_full`]).
pub(super) struct Pending {
    pub(super) txn: TxnEvent,
    pub(super) source: EventSource,
}

/// `[transactions] headers`: the open transaction's events, held from its Begin until its
/// Commit so that each carries its transaction's count (`transaction_meta.rs`). The walsender
/// sends a committed transaction in one go, so holding costs an event the transfer time of the
/// rest of its transaction; the in-flight budget bounds it.
pub(super) enum Collecting {
    /// Events go out as they are decoded: headers off, between transactions, or a transaction
    /// larger than the budget.
    Off,
    Holding {
        events: Vec<Pending>,
        /// Events that count ([`StreamState::is_transaction_event`]).
        counted: u32,
        bytes: usize,
    },
}

/// Decoded work not done yet: a held transaction's events and its Commit, in stream order,
/// handed on as the in-flight budget allows before another frame is read.
pub(super) enum Deferred {
    Event(Pending),
    Commit { end_lsn: Lsn },
}

/// What the publish step did with an event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Published {
    /// Handed to the sink, skipped or settled by `relay.on_bad_event`.
    Done,
    /// The delivery guarantee needs a read-back first: publish it again afterwards.
    Wait,
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
    /// Exactly-once: the frame's event waits for its partition's read-back; it is kept and
    /// published once that is done (`resume.rs`).
    Blocked,
}

pub(crate) struct StreamState<'s> {
    pub(super) settings: &'s Settings,
    /// Step 2's own state.
    pub(super) decoder: Decoder,
    /// The open transaction's watermark ticket.
    pub(super) ticket: Option<TxnTicket>,
    pub(super) publisher: Publisher,
    /// The sink's name rule and largest message.
    pub(super) limits: crate::sink::SinkLimits,
    pub(super) watermark: AckWatermark,
    /// The only producer of the flush LSN sent to PostgreSQL (`confirm.rs`).
    pub(super) confirm: Confirm,
    /// Events Kafka refused in earlier sessions (kept by the supervisor).
    pub(super) suspects: &'s mut Suspects,
    pub(super) phase: Phase,
    pub(super) received: Lsn,
    pub(crate) counts: SessionCounts,
    /// Per-topic counters and the commit-to-ack histogram (see `progress.rs`).
    pub(super) metrics: crate::ops::metrics::SessionMetrics,
    pub(super) lag: super::lag::CommitLag,
    /// `relay.delivery`: at-least-once, or exactly-once's replay check (`resume.rs`).
    pub(super) guarantee: Guarantee,
    /// The event that waits for a read-back (exactly-once only).
    pub(super) blocked: Option<Pending>,
    /// `[tracing]`: set by the session when spans are exported.
    pub(super) tracer: Option<crate::ops::tracing_export::Tracer>,
    /// `[transactions]`: the open transaction's metadata (`transaction_meta.rs`).
    pub(super) txn_meta: super::transaction_meta::TxnMeta,
    /// `[transactions] headers`: the open transaction's events, held until its Commit.
    pub(super) collecting: Collecting,
    /// Decoded work waiting for room (a released transaction), done before the next frame.
    pub(super) backlog: std::collections::VecDeque<Deferred>,
}

impl<'s> StreamState<'s> {
    pub(crate) fn new(
        settings: &'s Settings,
        decoder: Decoder,
        publisher: Publisher,
        guarantee: Guarantee,
        start: Lsn,
        suspects: &'s mut Suspects,
    ) -> Self {
        suspects.forget_before(start);
        StreamState {
            settings,
            decoder,
            ticket: None,
            publisher,
            limits: crate::sink::limits(settings),
            watermark: AckWatermark::new(start),
            suspects,
            confirm: Confirm::new(start),
            phase: Phase::Streaming,
            received: start,
            counts: SessionCounts::default(),
            metrics: crate::ops::metrics::SessionMetrics::default(),
            lag: super::lag::CommitLag::default(),
            guarantee,
            blocked: None,
            tracer: None,
            txn_meta: super::transaction_meta::TxnMeta::default(),
            collecting: Collecting::Off,
            backlog: std::collections::VecDeque::new(),
        }
    }

    /// Backpressure: stop reading WAL while this many events or bytes are unacknowledged, while
    /// as many events of committed transactions await confirmation (what a crash would replay;
    /// see `AckWatermark::committed_unconfirmed_events`), and while a suspect is held
    /// (`quarantine.rs`).
    ///
    /// With sink transactions (`seal.rs`) the committed-but-unconfirmed count is left out: a
    /// unit's events stay unconfirmed until its seal, which can only happen at a source
    /// transaction's end, so pausing on them inside a transaction would never resume; the unit's
    /// own bound (`relay.transaction_max_events`, at most `max_in_flight`) limits the replay
    /// instead. Reading pauses while a seal is under way (the sink takes no records then), and
    /// at a source-transaction boundary once the open unit is full, so that it is sealed there.
    pub(crate) fn is_full(&self) -> bool {
        self.sending_paused() || !self.backlog.is_empty()
    }

    /// Nothing more may be handed to the sink for now (see [`is_full`](Self::is_full)).
    fn sending_paused(&self) -> bool {
        self.budget_full()
            || (self.watermark.committed_unconfirmed_events() >= self.settings.relay.max_in_flight
                && !matches!(self.guarantee, Guarantee::Sealed(_)))
            || self.guarantee.is_sealing()
            || (self.guarantee.unit_full() && self.ticket.is_none())
            || matches!(self.phase, Phase::Holding(_))
            || self.blocked.is_some()
    }

    /// The in-flight budget (events or bytes) is used up.
    fn budget_full(&self) -> bool {
        self.watermark.in_flight_events() >= self.settings.relay.max_in_flight
            || self.watermark.in_flight_bytes() >= self.settings.relay.max_in_flight_bytes
    }

    /// Sink transactions: seals the open unit when it is due (`seal.rs`) and the stream is at a
    /// source-transaction boundary with nothing waiting; `nothing_ready`: the last read emptied
    /// the socket. Nothing to do in the other modes.
    pub(crate) fn seal_if_due(&mut self, nothing_ready: bool) -> Result<(), RelayError> {
        let at_boundary = self.ticket.is_none() && self.blocked.is_none() && matches!(self.phase, Phase::Streaming);
        let nothing_ready = nothing_ready || self.budget_full();
        let Some(sealing) = self.guarantee.sealing() else {
            return Ok(());
        };
        if !at_boundary || !sealing.due(nothing_ready, std::time::Instant::now()) {
            return Ok(());
        }
        let Some((checkpoint, label)) = sealing.start() else {
            return Ok(());
        };
        let tag = Box::new(DeliveryTag {
            ticket: TxnTicket::SEAL,
            bytes: 0,
            commit_lsn: Lsn(checkpoint),
            commit_time_unix_us: 0,
            event_seq: 0,
            dead_letter: false,
            topic: crate::ops::metrics::TopicId::default(),
            span: None,
            seal: true,
        });
        self.publisher
            .seal(checkpoint, &label, tag)
            .map_err(|refusal| RelayError::DeliveryFailed {
                sink: self.settings.sink.broker_name(),
                failure: Box::new(refusal.failure),
                commit_lsn: Lsn(checkpoint),
            })
    }

    /// A seal's completion: the unit is delivered, or the session ends (transient: the unit was
    /// aborted and the next session replays from the slot's position).
    fn on_sealed(&mut self, outcome: Result<(), crate::sink::SinkFailure>) -> Result<(), RelayError> {
        let Some(sealing) = self.guarantee.sealing() else {
            return Err(super::error::InternalError::CompletionsClosed.into());
        };
        match outcome {
            Ok(()) => {
                sealing.sealed();
                Ok(())
            }
            Err(failure) => {
                sealing.seal_failed();
                Err(RelayError::DeliveryFailed {
                    sink: self.settings.sink.broker_name(),
                    failure: Box::new(failure),
                    commit_lsn: sealing.sealing_commit(),
                })
            }
        }
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
            .send(
                &self.watermark,
                self.guarantee.confirm_limit(),
                self.received,
                writer,
                reply_requested,
            )
            .await?;
        self.guarantee.status_sent();
        Ok(())
    }

    /// Exactly-once: errs once the stream went longer than the stale limit without a status
    /// update (it was paused and may have been taken over; `resume.rs`).
    pub(crate) fn check_alive(&self) -> Result<(), RelayError> {
        self.guarantee.check_alive()
    }

    /// Reading is paused on purpose: counts as hearing the server (`resume.rs`).
    pub(crate) fn heard(&mut self) {
        self.guarantee.heard();
    }

    pub(crate) fn wants_reply(&self) -> bool {
        self.guarantee.wants_reply()
    }

    /// Whether acknowledgements moved the watermark past what PostgreSQL was told.
    pub(crate) fn has_unreported_progress(&self) -> bool {
        self.confirm
            .has_unreported(&self.watermark, self.guarantee.confirm_limit())
    }

    pub(crate) fn confirmed(&self) -> Lsn {
        self.confirm.confirmed(&self.watermark, self.guarantee.confirm_limit())
    }

    pub(crate) fn received(&self) -> Lsn {
        self.received
    }

    /// Whether the stream is reading a backlog: the server sent the last transaction begun more
    /// than `age` after committing it. Both times are the server's, so this host's clock does
    /// not matter; live traffic is sent within milliseconds of its commit.
    pub(crate) fn catching_up(&self, age: std::time::Duration) -> bool {
        self.decoder.behind_us() > i64::try_from(age.as_micros()).unwrap_or(i64::MAX)
    }

    /// The session ends: its sink and its delivery guarantee, for the wind-down.
    pub(crate) fn into_parts(self) -> (Publisher, Guarantee) {
        (self.publisher, self.guarantee)
    }

    /// One frame through the steps: decoded, then handed on — transactions to the watermark,
    /// events to the publish step. An event the delivery guarantee makes wait is kept (reading
    /// pauses: [`is_full`](Self::is_full)) until [`on_read_back`](Self::on_read_back).
    pub(crate) fn on_frame(&mut self, frame: bytes::Bytes) -> Result<FrameAction, RelayError> {
        let decoded = self.decoder.decode(self.settings, frame)?;
        self.guarantee.observe(&decoded)?;
        match decoded {
            Decoded::Keepalive {
                wal_end,
                reply_requested,
            } => {
                self.received = self.received.max(wal_end);
                self.watermark.keepalive(wal_end);
                return Ok(if reply_requested {
                    FrameAction::ReplyNow
                } else {
                    FrameAction::Nothing
                });
            }
            Decoded::Begin {
                commit_lsn,
                xid,
                commit_time_unix_us,
            } => {
                self.ticket = Some(self.watermark.begin()?);
                if let Some(meta) = &self.settings.transactions {
                    self.txn_meta.begin(xid, commit_lsn, commit_time_unix_us);
                    if meta.headers {
                        self.collecting = Collecting::Holding {
                            events: Vec::new(),
                            counted: 0,
                            bytes: 0,
                        };
                    }
                }
            }
            Decoded::Commit { end_lsn } => {
                if self.ticket.is_none() {
                    return Err(StreamViolation::CommitWithoutBegin.into());
                }
                if let Collecting::Holding { events, counted, .. } =
                    std::mem::replace(&mut self.collecting, Collecting::Off)
                {
                    self.txn_meta.set_count(counted);
                    self.backlog.extend(events.into_iter().map(Deferred::Event));
                    self.backlog.push_back(Deferred::Commit { end_lsn });
                    return self.work_backlog();
                }
                self.commit(end_lsn)?;
            }
            Decoded::Event { at, source } => {
                let ticket = self.ticket.ok_or(StreamViolation::EventOutsideTransaction)?;
                let txn = TxnEvent {
                    ticket,
                    commit_time_unix_us: at.commit_time.to_unix_micros(),
                    event: at.event,
                };
                if let Collecting::Holding { .. } = self.collecting {
                    return self.hold(Pending { txn, source });
                }
                if self.publish_event(&txn, &source)? == Published::Wait {
                    self.blocked = Some(Pending { txn, source });
                    return Ok(FrameAction::Blocked);
                }
            }
            Decoded::Nothing => {}
        }
        Ok(FrameAction::Nothing)
    }

    /// The open transaction committed and its events were handed on: the watermark learns it.
    fn commit(&mut self, end_lsn: Lsn) -> Result<(), RelayError> {
        let ticket = self.ticket.take().ok_or(StreamViolation::CommitWithoutBegin)?;
        // `[transactions]`: the END marker is a record of the transaction, sent before
        // the watermark learns it is complete.
        if let Some(ended) = self.txn_meta.end() {
            self.send_marker(ticket, &ended, super::transaction_meta::Marker::End)?;
        }
        self.watermark.commit(ticket, end_lsn)?;
        self.received = self.received.max(end_lsn);
        self.counts.transactions += 1;
        Ok(())
    }

    /// `[transactions] headers`: holds an event of the open transaction until its Commit. A
    /// transaction that outgrows the in-flight budget is let go: what was held goes on as
    /// usual, without the count, and so does the rest of it.
    fn hold(&mut self, pending: Pending) -> Result<FrameAction, RelayError> {
        let counts = self.is_transaction_event(&pending.source);
        let size = held_bytes(&pending.source);
        let relay = &self.settings.relay;
        let Collecting::Holding { events, counted, bytes } = &mut self.collecting else {
            // Not holding after all: it goes on as usual.
            self.backlog.push_back(Deferred::Event(pending));
            return self.work_backlog();
        };
        *counted += u32::from(counts);
        *bytes += size;
        events.push(pending);
        if events.len() < relay.max_in_flight && *bytes < relay.max_in_flight_bytes {
            return Ok(FrameAction::Nothing);
        }
        let (events, bytes) = (std::mem::take(events), *bytes);
        self.collecting = Collecting::Off;
        tracing::warn!(
            commit_lsn = %self.txn_meta.open().map(|t| t.commit_lsn()).unwrap_or_default(),
            held_events = events.len(),
            held_bytes = bytes,
            "a transaction larger than the in-flight budget (relay.max_in_flight, relay.max_in_flight_bytes): \
             its events go out without the outbox-relay-txn-count header (its END marker still counts them)"
        );
        self.backlog.extend(events.into_iter().map(Deferred::Event));
        self.work_backlog()
    }

    /// Hands on deferred work (a released transaction) while the sink has room; the event loop
    /// calls it before reading, and reading waits until it is done ([`is_full`](Self::is_full)).
    pub(crate) fn work_backlog(&mut self) -> Result<FrameAction, RelayError> {
        while !self.backlog.is_empty() && !self.sending_paused() && !self.phase.is_draining() {
            match self.backlog.pop_front() {
                Some(Deferred::Event(pending)) => {
                    if self.publish_event(&pending.txn, &pending.source)? == Published::Wait {
                        self.blocked = Some(pending);
                        return Ok(FrameAction::Blocked);
                    }
                }
                Some(Deferred::Commit { end_lsn }) => self.commit(end_lsn)?,
                None => break,
            }
        }
        Ok(FrameAction::Nothing)
    }

    /// A read-back finished: the kept event is published (and may wait for another one).
    pub(crate) fn on_read_back(&mut self, done: Done) -> Result<(), RelayError> {
        self.guarantee.on_done(done)?;
        if let Some(pending) = self.blocked.take() {
            if self.publish_event(&pending.txn, &pending.source)? == Published::Wait {
                self.blocked = Some(pending);
            }
        }
        Ok(())
    }

    /// Applies one delivery report. A failure poisons the watermark and ends the session,
    /// unless it is a suspect's verdict that `relay.on_bad_event` settles (see `publish.rs`).
    pub(crate) fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        if delivery.tag.seal {
            return self.on_sealed(delivery.outcome);
        }
        let mut tag = delivery.tag;
        self.count_delivery(&tag, delivery.outcome.is_ok());
        if let (Some(span), Some(tracer)) = (tag.span.take(), &self.tracer) {
            tracer.end(*span, delivery.outcome.as_ref().err().map(|f| f.cause.clone()));
        }
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

/// What a held event weighs against `relay.max_in_flight_bytes`: the bytes it was decoded from.
fn held_bytes(source: &EventSource) -> usize {
    use crate::postgres::pgoutput::ColumnValue;
    match source {
        EventSource::Row { row, .. } => row
            .columns
            .iter()
            .map(|c| match c {
                ColumnValue::Text(b) | ColumnValue::Binary(b) => b.len(),
                ColumnValue::Null | ColumnValue::UnchangedToast => 0,
            })
            .sum(),
        EventSource::Message(message) => message.content.len(),
    }
}
