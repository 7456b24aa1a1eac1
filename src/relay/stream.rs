//! Where the pipeline's steps meet, for one streaming session.
//!
//! One event goes through the steps in this order, each in a file of its own with its own type:
//!
//! | step | file | type | what it does |
//! |---|---|---|---|
//! | receive | `receive.rs` | functions | reads replication frames off the socket, in batches |
//! | decode | `decode.rs` | `Decoder` | frame → [`Decoded`]: keepalive, Begin, Commit or an outbox event (pure) |
//! | stage | `stage.rs` | `Stage` | keeps a streamed transaction's outbox changes until its commit releases them |
//! | early | `early.rs` | `Early` | with sink transactions, produces a streamed transaction before its commit |
//! | publish | `publish.rs` | `Publish` | event → route → sink record, through the delivery guarantee; bad events and suspects |
//! | watermark | `durability/watermark.rs` | `AckWatermark` | settles acknowledgements in commit order |
//! | confirm | `durability/confirm.rs` | `Confirm` | flush LSN = the durable position, never backwards |
//!
//! The watermark and the confirm step are reached only through `Durability`
//! (`durability/mod.rs`), the durability contract. [`StreamState::on_frame`] takes the decode
//! step's output and hands it on — transactions to the durability contract, events to the
//! publish step, a streamed transaction's changes to the stage until its commit replays them
//! through the decode step as a transaction sent after its commit — with the session's delivery guarantee (`guarantee/`, chosen once) and its
//! takeover liveness (`liveness.rs`) looking on. An event the guarantee makes wait is kept here,
//! as decoded, and published again once the guarantee's answer arrived. Pure with respect to
//! I/O except for handing records to the sink: the event loop (`session.rs`) feeds it frames,
//! delivery reports and answers, and writes the status updates it makes.
//!
//! Invariant: no field of this state is visible outside this file.

use std::collections::VecDeque;

use super::decode::{Decoded, Decoder, EventSource};
use super::durability::{Durability, TxnTicket};
use super::early::{Early, Finished, Report};
use super::error::{RelayError, StreamViolation};
use super::guarantee::{Answer, Guarantee, HoldNote, RelaySink};
use super::liveness::Liveness;
use super::progress::{Progress, SessionCounts};
use super::publish::{Accounts, Delivery, Publish, Published, TagKind};
use super::quarantine::{Suspects, TxnEvent};
use super::stage::{Release, Stage};
use crate::config::Settings;
use crate::ops::metrics::StreamSnapshot;
use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::StreamCommit;
use crate::postgres::replication::frames::StandbyStatusUpdate;
use crate::sink::SinkError;

/// Steps of deferred work (events of a held or released transaction) per
/// [`StreamState::work_backlog`]: as many as the receive step takes frames per wake-up, so a
/// released transaction of any size never keeps the event loop from its status updates.
const WORK_BATCH: usize = 512;

/// An event the delivery guarantee made wait: published again, as decoded, once its answer
/// arrived (reading pauses meanwhile: [`StreamState::is_full`]).
struct Pending {
    txn: TxnEvent,
    source: EventSource,
}

/// `[transactions] headers`: the open transaction's events, held from its Begin until its
/// Commit so that each carries its transaction's count (`transaction_meta.rs`). The walsender
/// sends a committed transaction in one go, so holding costs an event the transfer time of the
/// rest of its transaction; the in-flight budget bounds it.
enum Collecting {
    /// Events go out as they are decoded: headers off, between transactions, or a transaction
    /// larger than the budget.
    Off,
    Holding {
        events: Vec<Pending>,
        /// Events that count (`Publish::is_transaction_event`).
        counted: u32,
        bytes: usize,
    },
}

/// Decoded work not done yet: a held transaction's events and its Commit, in stream order,
/// handed on as the in-flight budget allows before another frame is read.
enum Deferred {
    Event(Pending),
    Commit { end_lsn: Lsn },
}

/// A committed streamed transaction being replayed from the stage: its Begin, then its staged
/// messages, then its Commit, each handed on as the in-flight budget allows.
struct Releasing {
    commit: StreamCommit,
    messages: Release,
    step: ReleaseStep,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ReleaseStep {
    Begin,
    Messages,
}

/// What the event loop must do after a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameAction {
    Nothing,
    /// The server asked for a status update right away.
    ReplyNow,
    /// The frame's event waits for the delivery guarantee's answer (a read-back); it is kept
    /// and published once that arrived.
    Blocked,
}

pub(crate) struct StreamState<'s> {
    settings: &'s Settings,
    decoder: Decoder,
    /// The open transaction's ticket.
    ticket: Option<TxnTicket>,
    publish: Publish<'s>,
    /// The durability contract: the only way to a flush LSN.
    durability: Durability,
    guarantee: Box<dyn Guarantee>,
    liveness: Liveness,
    progress: Progress,
    /// The event that waits for the guarantee's answer.
    blocked: Option<Pending>,
    /// `[transactions] headers`: the open transaction's events, held until its Commit.
    collecting: Collecting,
    /// Decoded work waiting for room (a released transaction), done before the next frame.
    backlog: VecDeque<Deferred>,
    /// The streamed transactions not committed yet (protocol 2).
    stage: Stage,
    /// The streamed transaction being published, done before the next frame.
    release: Option<Releasing>,
    /// The streamed transaction produced before its commit, if any (`early.rs`).
    early: Early,
}

/// What a stream is made of, from the session's start.
pub(crate) struct Parts<'s> {
    pub(crate) decoder: Decoder,
    pub(crate) sink: RelaySink,
    pub(crate) guarantee: Box<dyn Guarantee>,
    pub(crate) liveness: Liveness,
    /// The slot's confirmed position.
    pub(crate) start: Lsn,
    pub(crate) suspects: &'s mut Suspects,
    pub(crate) tracer: Option<crate::ops::tracing_export::Tracer>,
    pub(crate) stage: Stage,
}

impl<'s> StreamState<'s> {
    pub(crate) fn new(settings: &'s Settings, parts: Parts<'s>) -> Self {
        StreamState {
            settings,
            decoder: parts.decoder,
            ticket: None,
            publish: Publish::new(settings, parts.sink, parts.start, parts.suspects, parts.tracer),
            durability: Durability::new(parts.start),
            guarantee: parts.guarantee,
            liveness: parts.liveness,
            progress: Progress::default(),
            blocked: None,
            collecting: Collecting::Off,
            backlog: VecDeque::new(),
            stage: parts.stage,
            release: None,
            early: Early::new(),
        }
    }

    /// The publish step with what it accounts to.
    fn publishing(&mut self) -> (&mut Publish<'s>, Accounts<'_>) {
        (
            &mut self.publish,
            Accounts {
                guarantee: &mut *self.guarantee,
                durability: &mut self.durability,
                progress: &mut self.progress,
            },
        )
    }

    /// Backpressure: stop reading WAL while this many events or bytes are unacknowledged, while
    /// the delivery guarantee holds sending (by default: as many events of committed
    /// transactions await confirmation — what a crash would replay), while a suspect is held
    /// (`quarantine.rs`), while an event waits for the guarantee's answer, and while the sink's
    /// own queue has no room (the event it did not take is handed over again first).
    pub(crate) fn is_full(&self) -> bool {
        self.sending_paused() || !self.backlog.is_empty() || self.release.is_some() || self.early.has_work()
    }

    /// Nothing more may be handed to the sink for now (see [`is_full`](Self::is_full)).
    fn sending_paused(&self) -> bool {
        self.budget_full()
            || self.guarantee.pauses_sending(
                &self.durability,
                self.settings.relay.max_in_flight,
                self.ticket.is_none(),
            )
            || self.publish.holding()
            || self.blocked.is_some()
            || self.publish.waiting_for_room()
    }

    /// The in-flight budget (events or bytes) is used up.
    fn budget_full(&self) -> bool {
        self.durability.in_flight_events() >= self.settings.relay.max_in_flight
            || self.durability.in_flight_bytes() >= self.settings.relay.max_in_flight_bytes
    }

    /// Seals what was sent since the previous seal when the delivery guarantee says it is due
    /// (sink transactions) and the stream is at a source-transaction boundary with nothing
    /// waiting; `nothing_ready`: the last read emptied the socket.
    pub(crate) fn seal_if_due(&mut self, nothing_ready: bool) -> Result<(), RelayError> {
        let at_boundary = self.ticket.is_none() && self.blocked.is_none() && self.publish.streaming();
        if !at_boundary {
            return Ok(());
        }
        let nothing_ready = nothing_ready || self.budget_full();
        self.guarantee.seal_if_due(nothing_ready, std::time::Instant::now())
    }

    pub(crate) fn status_interval(&self) -> std::time::Duration {
        self.settings.relay.status_interval
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.durability.in_flight_events()
    }

    /// The next standby status update with everything confirmed (`durability/`);
    /// `reply_requested` makes the walsender answer at once. The caller writes it.
    pub(crate) fn next_status(&mut self, reply_requested: bool) -> StandbyStatusUpdate {
        self.liveness.status_sent();
        self.durability.next_status(reply_requested)
    }

    /// The server was silent a status interval: the next update should ask it for a reply, so
    /// that a live, idle walsender is heard (`liveness.rs`).
    pub(crate) fn wants_reply(&self) -> bool {
        self.liveness.wants_reply()
    }

    /// Errs once the stream may have been taken over: no status update for the stale limit, or
    /// the server unheard past the unheard limit (`liveness.rs`).
    pub(crate) fn check_alive(&self) -> Result<(), RelayError> {
        self.liveness.check()
    }

    /// Reading is paused on purpose: counts as hearing the server (`liveness.rs`).
    pub(crate) fn heard(&mut self) {
        self.liveness.heard();
    }

    /// Whether acknowledgements moved the durable position past what PostgreSQL was told.
    pub(crate) fn has_unreported_progress(&self) -> bool {
        self.durability.has_unreported()
    }

    pub(crate) fn confirmed(&self) -> Lsn {
        self.durability.confirmed()
    }

    pub(crate) fn received(&self) -> Lsn {
        self.durability.received()
    }

    pub(crate) fn counts(&self) -> SessionCounts {
        self.progress.counts
    }

    /// Where the stream stands, once per status interval.
    pub(crate) fn snapshot(&mut self, now_unix_us: i64) -> StreamSnapshot {
        let stage = self.stage.usage();
        StreamSnapshot {
            stage_memory_bytes: stage.memory_bytes,
            stage_disk_bytes: stage.disk_bytes,
            stage_transactions: stage.transactions,
            ..self.progress.snapshot(&self.durability, now_unix_us)
        }
    }

    /// Folds this batch of acknowledgements' exact latencies into `GET /latency`'s window.
    pub(crate) fn fold_latency(&mut self) {
        self.progress.fold_latency();
    }

    /// What the delivery guarantee holds the stream back by, for `/readyz`.
    pub(crate) fn hold_note(&mut self, now: std::time::Instant) -> Option<HoldNote> {
        self.guarantee.hold_note(now)
    }

    /// Events skipped because the sink held them already.
    pub(crate) fn skipped(&self) -> u64 {
        self.guarantee.skipped()
    }

    /// A seal is under way (the wind-down waits for it like a delivery).
    pub(crate) fn sealing(&self) -> bool {
        self.guarantee.sealing()
    }

    /// The sink's complaint, while it acknowledges nothing.
    pub(crate) fn sink_complaint(&self) -> Option<String> {
        self.publish.sink_complaint()
    }

    /// The sink's word that it has reached no broker yet.
    pub(crate) fn sink_unreachable(&self) -> Option<String> {
        self.publish.sink_unreachable()
    }

    /// The sink's word that waiting cannot help.
    pub(crate) fn sink_verdict(&self) -> Option<SinkError> {
        self.publish.sink_verdict()
    }

    /// The configuration this session runs with (for the event loop's own timers).
    pub(crate) fn settings(&self) -> &'s Settings {
        self.settings
    }

    /// Whether the stream is reading a backlog: the server sent the last transaction begun more
    /// than `age` after committing it. Both times are the server's, so this host's clock does
    /// not matter; live traffic is sent within milliseconds of its commit.
    pub(crate) fn catching_up(&self, age: std::time::Duration) -> bool {
        self.decoder.behind_us() > i64::try_from(age.as_micros()).unwrap_or(i64::MAX)
    }

    /// The session ends: its sink, for the abandon; the delivery guarantee says what it found.
    pub(crate) fn finish(self) -> RelaySink {
        self.guarantee.finish();
        self.publish.into_sink()
    }

    /// One frame through the steps: decoded, then handed on — transactions to the durability
    /// contract, events to the publish step. An event the delivery guarantee makes wait is
    /// kept (reading pauses: [`is_full`](Self::is_full)) until [`on_answer`](Self::on_answer).
    pub(crate) fn on_frame(&mut self, frame: bytes::Bytes) -> Result<FrameAction, RelayError> {
        let decoded = self.decoder.decode(self.settings, frame)?;
        // A frame after a silence past the unheard limit may come from a walsender that is long
        // gone (a healed network cut), and a stream that went stale may have been taken over:
        // nothing of it is handed on.
        self.liveness.on_frame(matches!(decoded, Decoded::Keepalive { .. }))?;
        self.on_decoded(decoded)
    }

    /// A decoded frame, or a message of a released streamed transaction, handed on.
    fn on_decoded(&mut self, decoded: Decoded) -> Result<FrameAction, RelayError> {
        match decoded {
            Decoded::Keepalive {
                wal_end,
                reply_requested,
            } => {
                self.guarantee.reached(wal_end);
                self.durability.keepalive(wal_end);
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
                self.fall_back("another transaction committed meanwhile")?;
                self.guarantee.reached(commit_lsn);
                self.ticket = Some(self.durability.begin()?);
                if let Some(meta) = &self.settings.transactions {
                    self.publish.begin_transaction(xid, commit_lsn, commit_time_unix_us);
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
                    self.publish.set_transaction_count(counted);
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
                return self.publish_or_block(Pending { txn, source });
            }
            Decoded::StreamStart { xid, at } => {
                self.durability.stream_opened(xid, at);
                self.stream_start(xid)?;
            }
            Decoded::Staged { xid, entry } => {
                let message = entry.message();
                self.stage.push(xid, entry)?;
                if self.early.producing() == Some(xid) {
                    self.early.push(xid, message);
                    self.work_early()?;
                }
            }
            Decoded::StreamCommit(commit) => {
                tracing::debug!(xid = commit.xid, commit_lsn = %commit.commit_lsn, "streamed transaction committed");
                if self.early.committed(&commit) {
                    // Its unit may be sealed once the rest of it went out (`early.rs`).
                    self.guarantee.early_committed(commit.commit_lsn);
                    self.work_early()?;
                    return Ok(FrameAction::Nothing);
                }
                self.fall_back("another streamed transaction committed meanwhile")?;
                // Everything committed before it was read already: publishing it now is
                // publishing in commit order. Reading waits until it is done.
                self.release = Some(Releasing {
                    messages: self.stage.release(commit.xid)?,
                    commit,
                    step: ReleaseStep::Begin,
                });
                return self.work_backlog();
            }
            Decoded::StreamAbort { xid, subxid } => {
                if self.early.producing() == Some(xid) {
                    self.fall_back(if xid == subxid {
                        "it aborted"
                    } else {
                        "a subtransaction of it rolled back"
                    })?;
                }
                self.stage.abort(xid, subxid);
                if xid == subxid {
                    self.durability.stream_aborted(xid);
                }
            }
            Decoded::Nothing => {}
        }
        Ok(FrameAction::Nothing)
    }

    /// The released transaction's next step: its Begin, a staged message, or (all read) its
    /// Commit, which ends the release.
    fn step_release(&mut self) -> Result<FrameAction, RelayError> {
        let Some(mut releasing) = self.release.take() else {
            return Ok(FrameAction::Nothing);
        };
        let decoded = match releasing.step {
            ReleaseStep::Begin => {
                releasing.step = ReleaseStep::Messages;
                self.decoder.begin_released(self.settings, &releasing.commit)?
            }
            ReleaseStep::Messages => match releasing.messages.next_message()? {
                Some(message) => self.decoder.decode_released(self.settings, message)?,
                None => {
                    let commit = self.decoder.commit_released(self.settings, &releasing.commit)?;
                    self.durability
                        .stream_committed(releasing.commit.xid, releasing.commit.end_lsn);
                    return self.on_decoded(commit);
                }
            },
        };
        self.release = Some(releasing);
        self.on_decoded(decoded)
    }

    /// A block of streamed transaction `xid` begins: another one than the transaction produced
    /// early makes that fall back; the first block of a transaction, when it is the only one
    /// in play and the delivery guarantee can take it before its commit, starts producing it
    /// early (`early.rs`).
    fn stream_start(&mut self, xid: u32) -> Result<(), RelayError> {
        match self.early.producing() {
            Some(early) if early != xid => return self.fall_back("another transaction streams meanwhile"),
            Some(_) => return Ok(()),
            None => {}
        }
        let alone = self.early.idle()
            && self.stage.usage().transactions == 0
            && self.ticket.is_none()
            && self.release.is_none()
            && self.backlog.is_empty()
            && self.blocked.is_none();
        if alone && self.publish.can_produce_early() && self.guarantee.may_produce_early(self.durability.received()) {
            let fork = self.decoder.fork_for_early(self.settings, xid)?;
            self.early.start(xid, fork);
        }
        Ok(())
    }

    /// The transaction produced early, if any, falls back to the stage: the unit holding its
    /// records is aborted (nothing is sent until that is done).
    fn fall_back(&mut self, why: &'static str) -> Result<(), RelayError> {
        if self.early.producing().is_none() {
            return Ok(());
        }
        let committed = self.early.fall_back(why);
        self.guarantee.abort_early(why)?;
        if let Some(commit) = committed {
            // It had committed: the stage publishes it, once the abort is done.
            self.release = Some(Releasing {
                messages: self.stage.release(commit.xid)?,
                commit,
                step: ReleaseStep::Begin,
            });
        }
        Ok(())
    }

    /// Produces what waits of the transaction produced early while there is room, and
    /// finishes it once it committed and all of it went out.
    fn work_early(&mut self) -> Result<(), RelayError> {
        if !self.sending_paused() {
            let (publish, mut accounts) = (
                &mut self.publish,
                Accounts {
                    guarantee: &mut *self.guarantee,
                    durability: &mut self.durability,
                    progress: &mut self.progress,
                },
            );
            if let Some(why) = self.early.work(self.settings, publish, &mut accounts)? {
                return self.fall_back(why);
            }
        }
        if let Some(finished) = self.early.finished() {
            self.finish_early(finished)?;
        }
        Ok(())
    }

    /// The transaction produced early committed and all of it is in the sink's open unit: the
    /// decode step adopts the Relation messages it brought, the stage forgets it unread, and
    /// the durability contract learns a transaction committed at its end LSN with nothing of
    /// its own left in flight (the unit's floor holds confirmation until the seal).
    fn finish_early(&mut self, finished: Finished) -> Result<(), RelayError> {
        let commit = finished.commit;
        self.decoder.adopt_relations(finished.decoder);
        self.stage.discard(commit.xid);
        self.guarantee.reached(commit.commit_lsn);
        self.durability.stream_committed(commit.xid, commit.end_lsn);
        let ticket = self.durability.begin()?;
        self.durability.commit(ticket, commit.end_lsn)?;
        self.progress.counts.transactions += 1;
        tracing::debug!(
            xid = commit.xid,
            commit_lsn = %commit.commit_lsn,
            events = finished.events,
            "streamed transaction produced before its commit: all of it is in the open sink transaction"
        );
        Ok(())
    }

    /// Publishes `pending`, or keeps it when the delivery guarantee makes it wait — or, when
    /// the sink had no room for it, first in line for when room frees (nothing of it was sent).
    fn publish_or_block(&mut self, pending: Pending) -> Result<FrameAction, RelayError> {
        let (publish, mut accounts) = self.publishing();
        match publish.event(&pending.txn, &pending.source, &mut accounts)? {
            Published::Done => {}
            Published::Wait => {
                self.blocked = Some(pending);
                return Ok(FrameAction::Blocked);
            }
            Published::Full => self.backlog.push_front(Deferred::Event(pending)),
        }
        Ok(FrameAction::Nothing)
    }

    /// The open transaction committed and its events were handed on: the durability contract
    /// learns it — once its END marker (`[transactions]`) was taken; until then the Commit is
    /// first in line for when the sink has room.
    fn commit(&mut self, end_lsn: Lsn) -> Result<(), RelayError> {
        let ticket = self.ticket.ok_or(StreamViolation::CommitWithoutBegin)?;
        let (publish, mut accounts) = self.publishing();
        if publish.end_transaction(ticket, &mut accounts)? == Published::Full {
            self.backlog.push_front(Deferred::Commit { end_lsn });
            return Ok(());
        }
        self.ticket = None;
        self.durability.commit(ticket, end_lsn)?;
        self.progress.counts.transactions += 1;
        Ok(())
    }

    /// `[transactions] headers`: holds an event of the open transaction until its Commit. A
    /// transaction that outgrows the in-flight budget is let go: what was held goes on as
    /// usual, without the count, and so does the rest of it.
    fn hold(&mut self, pending: Pending) -> Result<FrameAction, RelayError> {
        let counts = self.publish.is_transaction_event(&pending.source);
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
            commit_lsn = %self.publish.open_transaction_lsn(),
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
        if self.early.has_work() {
            self.work_early()?;
        }
        for _ in 0..WORK_BATCH {
            if !self.has_ready_work() {
                break;
            }
            let action = match self.backlog.pop_front() {
                Some(Deferred::Event(pending)) => self.publish_or_block(pending)?,
                Some(Deferred::Commit { end_lsn }) => {
                    self.commit(end_lsn)?;
                    FrameAction::Nothing
                }
                // The deferred work first, then the released transaction's next step.
                None => self.step_release()?,
            };
            if action == FrameAction::Blocked {
                return Ok(FrameAction::Blocked);
            }
        }
        Ok(FrameAction::Nothing)
    }

    /// Deferred work waits and the sink may be handed more: the event loop comes back for it
    /// (in batches of [`WORK_BATCH`], so that its timers are served in between).
    pub(crate) fn has_ready_work(&self) -> bool {
        let early = self.early.has_work() && self.early.has_room(self.settings);
        (!self.backlog.is_empty() || self.release.is_some() || early)
            && !self.sending_paused()
            && !self.publish.draining()
    }

    /// The sink had no room for the last record handed over (its queue was full): the event
    /// loop tries again after a pause, if no delivery report frees room first.
    pub(crate) fn waiting_for_room(&self) -> bool {
        self.publish.waiting_for_room()
    }

    /// The pause after a full queue passed: what the sink did not take is handed over again
    /// (the backlog's first entry, at the next [`work_backlog`](Self::work_backlog), or the
    /// held suspect, now).
    pub(crate) fn retry_room(&mut self) -> Result<(), RelayError> {
        let (publish, mut accounts) = self.publishing();
        publish.retry_room(&mut accounts)
    }

    /// The delivery guarantee's answer arrived (a read-back): the kept event is published (and
    /// may wait for another one).
    pub(crate) fn on_answer(&mut self, answer: Answer) -> Result<(), RelayError> {
        self.guarantee.on_answer(answer)?;
        if let Some(pending) = self.blocked.take() {
            self.publish_or_block(pending)?;
        }
        Ok(())
    }

    /// Applies one delivery report: a seal's to the delivery guarantee, a record's to the
    /// publish step. A failure poisons the watermark and ends the session, unless it is a
    /// suspect's verdict that `relay.on_bad_event` settles (see `publish.rs`).
    pub(crate) fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        match delivery.tag.kind {
            TagKind::Seal => {
                self.guarantee.sealed(delivery.outcome, &mut self.durability)?;
                // Crash tests: a unit committed in the sink, its position not yet confirmed to
                // PostgreSQL (the next session must find it by the checkpoint, not send it again).
                fail::fail_point!("relay::sealed_before_status", |_| crate::failpoints::crash(
                    "relay::sealed_before_status"
                ));
                return Ok(());
            }
            TagKind::Early => {
                // A report frees room in the sink's queue.
                self.publish.room_freed();
                let tag = &delivery.tag;
                self.progress.delivered_early(tag.topic, delivery.outcome.is_ok());
                return match self.early.on_delivery(tag.commit_lsn.0, tag.bytes, delivery.outcome) {
                    Report::Settled => Ok(()),
                    Report::FallBack(why) => self.fall_back(why),
                    Report::Failed(failure) => Err(RelayError::DeliveryFailed {
                        sink: self.settings.sink.broker_name(),
                        failure: Box::new(failure),
                        commit_lsn: self.durability.confirmed(),
                    }),
                };
            }
            TagKind::Record | TagKind::DeadLetter => {}
        }
        let (publish, mut accounts) = self.publishing();
        publish.on_delivery(delivery, &mut accounts)
    }

    /// Like [`on_delivery`](Self::on_delivery) while winding down after an error: failures
    /// are already accounted for, so they only stop the watermark, and nothing new is sent.
    pub(crate) fn on_delivery_draining(&mut self, delivery: Delivery) {
        self.publish.drain();
        let _ = self.on_delivery(delivery);
    }

    /// The suspects as they stand (unit tests).
    #[cfg(test)]
    pub(crate) fn suspects(&self) -> &Suspects {
        self.publish.suspects()
    }

    /// A keepalive straight to the durability contract (unit tests).
    #[cfg(test)]
    pub(crate) fn keepalive(&mut self, wal_end: Lsn) {
        self.durability.keepalive(wal_end);
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

#[cfg(test)]
pub(crate) mod test_support {
    //! A stream over an in-memory sink, for the steps' unit tests.
    use super::*;
    use crate::sink::memory::{memory, MemoryHandle};
    use crate::sink::Completions;

    /// A stream of `settings` over an in-memory sink, starting at `start`, with the delivery
    /// guarantee `settings` chooses (an empty replay window: nothing is read back).
    pub(crate) fn stream<'s>(
        settings: &'s Settings,
        start: Lsn,
        suspects: &'s mut Suspects,
        tracer: Option<crate::ops::tracing_export::Tracer>,
    ) -> (
        StreamState<'s>,
        MemoryHandle<super::super::publish::DeliveryTag>,
        Completions<super::super::publish::DeliveryTag>,
    ) {
        static STAGES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let (sink, handle, completions) = memory();
        let stage_name = format!(
            "unit-{}-{}",
            std::process::id(),
            STAGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let parts = Parts {
            decoder: Decoder::default().with_streaming(true),
            sink: Box::new(sink),
            guarantee: crate::relay::guarantee::test_support::chosen_for(settings, start, &handle),
            liveness: Liveness::new(&settings.relay, std::time::Duration::ZERO),
            start,
            suspects,
            tracer,
            stage: Stage::open(&settings.relay.stage, &stage_name).expect("a stage in the temporary directory"),
        };
        (StreamState::new(settings, parts), handle, completions)
    }
}

#[cfg(test)]
mod streamed {
    //! Protocol 2: streamed transactions through the stage, published at their commit.
    use super::test_support::stream;
    use super::*;
    use crate::config::test_support::settings;
    use crate::relay::test_frames::{
        begin, commit, in_stream, insert, relation, stream_abort, stream_commit, stream_start, stream_stop, xlog,
        COMMITTED,
    };
    use crate::sink::memory::MemoryHandle;
    use crate::sink::Completions;

    const OUTBOX: u32 = 16_384;
    const ORDERS: u32 = 16_390;
    const COLUMNS: [&str; 6] = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];

    fn row(id: &str) -> Vec<u8> {
        insert(
            OUTBOX,
            &[Some(id), Some("agg"), Some("order.placed"), Some("{}"), None, None],
        )
    }

    fn ids(sink: &MemoryHandle<super::super::publish::DeliveryTag>) -> Vec<String> {
        sink.stored()
            .iter()
            .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
            .collect()
    }

    fn deliver_all(
        state: &mut StreamState<'_>,
        sink: &MemoryHandle<super::super::publish::DeliveryTag>,
        completions: &mut Completions<super::super::publish::DeliveryTag>,
    ) {
        sink.deliver(sink.pending());
        while let Ok(d) = completions.try_recv() {
            state.on_delivery(d).unwrap();
        }
    }

    /// A streamed transaction's events wait in the stage — through a small transaction that
    /// commits meanwhile, a subtransaction's abort and a spill to disk — and go out at its commit,
    /// in order, at the positions a transaction sent after its commit gets; the slot is confirmed
    /// past it only once all were acknowledged.
    #[test]
    fn a_streamed_transaction_is_published_at_its_commit_in_commit_order() {
        for memory in ["", "[relay]\nstage_memory_bytes = 1\n"] {
            let settings = settings(memory);
            let mut suspects = Suspects::default();
            let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
            fn feed(state: &mut StreamState<'_>, frame: Vec<u8>) {
                state.on_frame(xlog(COMMITTED, &frame)).unwrap();
            }
            feed(&mut state, stream_start(700, true));
            feed(
                &mut state,
                in_stream(700, &relation(OUTBOX, "public", "events_outbox", &COLUMNS)),
            );
            feed(
                &mut state,
                in_stream(700, &relation(ORDERS, "public", "orders", &COLUMNS)),
            );
            feed(&mut state, in_stream(700, &row("1")));
            feed(&mut state, in_stream(700, &insert(ORDERS, &[Some("x"); 6])));
            feed(&mut state, in_stream(701, &row("2")));
            feed(&mut state, stream_stop());
            // A small transaction commits while the large one is open: it goes out at once. The
            // block's Relation did not reach the cache: this transaction brings its own.
            feed(&mut state, begin(0x400));
            feed(&mut state, relation(OUTBOX, "public", "events_outbox", &COLUMNS));
            feed(&mut state, row("10"));
            feed(&mut state, commit(0x400, 0x410));
            feed(&mut state, stream_start(700, false));
            feed(&mut state, in_stream(702, &row("3")));
            feed(&mut state, in_stream(700, &row("4")));
            feed(&mut state, stream_stop());
            feed(&mut state, stream_abort(700, 701));
            assert_eq!(
                ids(&sink),
                ["10"],
                "nothing of an open streamed transaction is published"
            );
            deliver_all(&mut state, &sink, &mut completions);
            // The small transaction is acknowledged, but the open streamed one began at 0x100
            // (every frame here is sent at 0x100): nothing past it is confirmed.
            assert_eq!(state.confirmed(), Lsn(0x100));
            feed(&mut state, stream_commit(700, 0x500, 0x510));
            assert_eq!(
                ids(&sink),
                ["10", "1", "3", "4"],
                "the aborted subtransaction's event is dropped"
            );
            assert_eq!(
                state.confirmed(),
                Lsn(0x100),
                "not confirmed past what is not acknowledged"
            );
            deliver_all(&mut state, &sink, &mut completions);
            assert_eq!(state.confirmed(), Lsn(0x510));
            assert_eq!(state.snapshot(0).stage_transactions, 0);
            assert_eq!(state.counts().transactions, 2);
        }
    }

    /// The positions of a released transaction's events are those of a transaction sent after its
    /// commit: the replay after a restart, streamed or not, finds the same events at the same
    /// places (what the exactly-once read-back and the suspects rely on).
    #[test]
    fn a_released_event_sits_where_it_would_have_without_streaming() {
        let settings = settings("");
        let mut suspects = Suspects::default();
        let (mut state, sink, _completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        for frame in [
            stream_start(700, true),
            in_stream(700, &relation(OUTBOX, "public", "events_outbox", &COLUMNS)),
            in_stream(700, &row("1")),
            in_stream(700, &row("2")),
            stream_stop(),
            stream_commit(700, 0x500, 0x510),
        ] {
            state.on_frame(xlog(COMMITTED, &frame)).unwrap();
        }
        let at = sink.pending_with(|t| (t.commit_lsn, t.event_seq));
        assert_eq!(at, [(Lsn(0x500), 0), (Lsn(0x500), 1)]);
    }

    #[test]
    fn an_aborted_streamed_transaction_publishes_nothing_and_is_passed() {
        let settings = settings("[relay]\nstage_memory_bytes = 1\n");
        let mut suspects = Suspects::default();
        let (mut state, sink, _completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        for frame in [
            stream_start(800, true),
            in_stream(800, &relation(OUTBOX, "public", "events_outbox", &COLUMNS)),
            in_stream(800, &row("1")),
            stream_stop(),
        ] {
            state.on_frame(xlog(COMMITTED, &frame)).unwrap();
        }
        assert!(
            state.snapshot(0).stage_disk_bytes > 0,
            "spilled past a 1-byte memory bound"
        );
        state.on_frame(xlog(COMMITTED, &stream_abort(800, 800))).unwrap();
        assert_eq!(state.snapshot(0).stage_disk_bytes, 0);
        state.keepalive(Lsn(0x900));
        assert_eq!(state.confirmed(), Lsn(0x900));
        assert!(sink.stored().is_empty());
    }

    const TRANSACTIONS: &str =
        "\"transactional.id\" = \"t\"\nexactly_once = \"transactions\"\n[relay]\ndelivery = \"exactly-once\"\n";

    fn feed(state: &mut StreamState<'_>, frames: &[Vec<u8>]) {
        for frame in frames {
            assert!(
                !state.is_full(),
                "the event loop reads no frame while the stream is full"
            );
            state.on_frame(xlog(COMMITTED, frame)).unwrap();
        }
    }

    fn first_block(xid: u32, rows: &[&str]) -> Vec<Vec<u8>> {
        let mut frames = vec![
            stream_start(xid, true),
            in_stream(xid, &relation(OUTBOX, "public", "events_outbox", &COLUMNS)),
        ];
        frames.extend(rows.iter().map(|id| in_stream(xid, &row(id))));
        frames.push(stream_stop());
        frames
    }

    /// With sink transactions a streamed transaction goes into an open unit as it arrives, is
    /// never sealed before its commit, and what comes after it (up to its commit) goes out the
    /// same way, nothing twice; the seal's checkpoint is its commit LSN.
    #[test]
    fn with_sink_transactions_a_lone_streamed_transaction_is_produced_before_its_commit() {
        let settings = settings(TRANSACTIONS);
        let mut suspects = Suspects::default();
        let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        feed(&mut state, &first_block(700, &["1", "2"]));
        assert_eq!(ids(&sink), ["1", "2"], "produced as it arrives");
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        assert!(sink.seals().is_empty(), "never sealed before its commit");
        assert_eq!(state.confirmed(), Lsn(0x10));
        feed(
            &mut state,
            &[
                stream_start(700, false),
                in_stream(700, &row("3")),
                stream_stop(),
                stream_commit(700, 0x500, 0x510),
            ],
        );
        state.work_backlog().unwrap();
        assert_eq!(ids(&sink), ["1", "2", "3"], "each event once");
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        assert_eq!(sink.seals(), [0x500], "sealed with its commit LSN");
        assert_eq!(state.confirmed(), Lsn(0x10), "not before the seal");
        deliver_all(&mut state, &sink, &mut completions);
        assert_eq!(state.confirmed(), Lsn(0x510));
        assert!(sink.aborts().is_empty());
    }

    /// A full sink queue is backpressure for what is produced early too: the event it did not
    /// take goes out first once a report frees room, and reading waits meanwhile; at the commit
    /// nothing is read back from the stage (it is empty after).
    #[test]
    fn produced_early_through_a_full_sink_queue_each_event_once() {
        let settings = settings(&format!("{TRANSACTIONS}stage_memory_bytes = 1\n"));
        let mut suspects = Suspects::default();
        let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        sink.capacity(Some(1));
        let mut frames = first_block(700, &["1", "2", "3"]);
        frames.push(stream_commit(700, 0x500, 0x510));
        let mut waits = 0;
        for frame in frames {
            while state.is_full() {
                waits += 1;
                deliver_all(&mut state, &sink, &mut completions);
                while state.has_ready_work() {
                    state.work_backlog().unwrap();
                }
            }
            state.on_frame(xlog(COMMITTED, &frame)).unwrap();
        }
        assert!(waits >= 2, "the queue of one record filled");
        assert_eq!(ids(&sink), ["1", "2", "3"]);
        assert_eq!(state.snapshot(0).stage_transactions, 0);
        assert_eq!(state.snapshot(0).stage_disk_bytes, 0, "its spill file is gone");
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        assert_eq!(sink.seals(), [0x500]);
        deliver_all(&mut state, &sink, &mut completions);
        assert_eq!(state.confirmed(), Lsn(0x510));
        assert_eq!(state.counts().transactions, 1);
    }

    /// A transaction that commits while a streamed one is produced early makes that fall back:
    /// its unit is aborted (what it held taken back) before anything else is sent, and it is
    /// published from the stage at its commit — in commit order, each event once.
    #[test]
    fn a_commit_meanwhile_aborts_the_early_unit_and_the_stage_publishes_it_at_its_commit() {
        let settings = settings(TRANSACTIONS);
        let mut suspects = Suspects::default();
        let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        feed(&mut state, &first_block(700, &["1", "2"]));
        assert_eq!(ids(&sink), ["1", "2"]);
        feed(&mut state, &[begin(0x400)]);
        assert_eq!(sink.aborts(), [2], "the early unit is aborted");
        assert!(ids(&sink).is_empty(), "nothing of it is committed");
        assert!(state.is_full(), "nothing is read until the abort is done");
        deliver_all(&mut state, &sink, &mut completions);
        feed(
            &mut state,
            &[
                relation(OUTBOX, "public", "events_outbox", &COLUMNS),
                row("10"),
                commit(0x400, 0x410),
            ],
        );
        assert_eq!(ids(&sink), ["10"]);
        // Its next block is staged only.
        feed(
            &mut state,
            &[stream_start(700, false), in_stream(700, &row("3")), stream_stop()],
        );
        assert_eq!(ids(&sink), ["10"]);
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        deliver_all(&mut state, &sink, &mut completions);
        assert_eq!(sink.seals(), [0x400]);
        feed(&mut state, &[stream_commit(700, 0x500, 0x510)]);
        while state.has_ready_work() {
            state.work_backlog().unwrap();
        }
        assert_eq!(ids(&sink), ["10", "1", "2", "3"], "commit order, each event once");
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        deliver_all(&mut state, &sink, &mut completions);
        assert_eq!(sink.seals(), [0x400, 0x500]);
        assert_eq!(state.confirmed(), Lsn(0x510));
    }

    /// Its own abort drops it with its unit; a subtransaction's rollback makes it fall back (a
    /// record cannot be taken back alone) and the stage publishes the rest at its commit.
    #[test]
    fn an_abort_or_a_rolled_back_subtransaction_takes_back_what_was_produced_early() {
        let settings = settings(TRANSACTIONS);
        let mut suspects = Suspects::default();
        let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        feed(&mut state, &first_block(800, &["1"]));
        feed(&mut state, &[stream_abort(800, 800)]);
        assert_eq!(sink.aborts(), [1]);
        deliver_all(&mut state, &sink, &mut completions);
        state.keepalive(Lsn(0x900));
        assert_eq!(
            state.confirmed(),
            Lsn(0x900),
            "an aborted transaction holds nothing back"
        );
        assert!(ids(&sink).is_empty());

        let mut frames = first_block(900, &["2"]);
        frames.insert(3, in_stream(901, &row("3")));
        feed(&mut state, &frames);
        assert_eq!(ids(&sink), ["2", "3"]);
        feed(&mut state, &[stream_abort(900, 901)]);
        assert_eq!(sink.aborts(), [1, 2]);
        deliver_all(&mut state, &sink, &mut completions);
        feed(&mut state, &[stream_commit(900, 0xa00, 0xa10)]);
        while state.has_ready_work() {
            state.work_backlog().unwrap();
        }
        assert_eq!(ids(&sink), ["2"], "the rolled-back subtransaction's event is dropped");
        deliver_all(&mut state, &sink, &mut completions);
        state.seal_if_due(true).unwrap();
        deliver_all(&mut state, &sink, &mut completions);
        assert_eq!(sink.seals(), [0xa00]);
        assert_eq!(state.confirmed(), Lsn(0xa10));
    }

    /// `relay.streamed_produce = "at-commit"`, and every mode without sink transactions, keep
    /// a streamed transaction in the stage until its commit.
    #[test]
    fn without_sink_transactions_or_with_at_commit_nothing_goes_out_before_the_commit() {
        for config in [
            String::new(),
            format!("{TRANSACTIONS}streamed_produce = \"at-commit\"\n"),
        ] {
            let settings = settings(&config);
            let mut suspects = Suspects::default();
            let (mut state, sink, _completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
            feed(&mut state, &first_block(700, &["1"]));
            assert!(ids(&sink).is_empty(), "{config}");
        }
    }

    #[test]
    fn stream_messages_out_of_place_are_protocol_violations() {
        let settings = settings("");
        let violation = |frames: &[Vec<u8>], streams: bool| {
            let mut suspects = Suspects::default();
            let (mut state, _sink, _completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
            if !streams {
                state.decoder = Decoder::default();
            }
            let mut last = Ok(FrameAction::Nothing);
            for frame in frames {
                last = state.on_frame(xlog(COMMITTED, frame));
                if last.is_err() {
                    break;
                }
            }
            match last {
                Err(RelayError::Stream(v)) => v,
                other => panic!("expected a violation, got {other:?}"),
            }
        };
        assert_eq!(
            violation(&[stream_start(1, true)], false),
            StreamViolation::StreamingNotAskedFor
        );
        assert_eq!(
            violation(&[stream_start(1, true), begin(0x500)], true),
            StreamViolation::InStreamBlock("Begin")
        );
        assert_eq!(
            violation(&[begin(0x500), stream_start(1, true)], true),
            StreamViolation::StreamInTransaction("Stream Start")
        );
        assert_eq!(
            violation(&[stream_stop()], true),
            StreamViolation::StreamStopOutsideBlock
        );
        assert_eq!(
            violation(&[stream_start(1, true), in_stream(1, &row("1"))], true),
            StreamViolation::InsertBeforeRelation(OUTBOX)
        );
    }
}
