//! Step 2c, early: a streamed transaction (`stage.rs`) produced into an open sink transaction
//! before its commit, so that `read_committed` consumers see it one commit round after its
//! COMMIT instead of after the whole of it was produced from the stage.
//!
//! Only a delivery guarantee whose units can still be aborted lets it happen
//! (`Guarantee::may_produce_early`: sink transactions with `relay.streamed_produce =
//! "as-received"`); every other one publishes at the commit. Its changes are staged all the
//! same, so that the stage can always publish it instead.
//!
//! **When.** At the transaction's first block of outbox changes, when it is the only
//! transaction in play: nothing else staged, no unit open or being committed (so an abort takes
//! back its records and nothing else), the stream past the sink's checkpoint (a transaction met
//! again below it may be in the sink already, which only its commit LSN can tell), and the
//! plain publish path (`Publish::can_produce_early`: no suspects, no `[transactions]` metadata,
//! no `[tracing]`).
//!
//! **Falling back.** Per-aggregate commit order would break — and the unit could not be
//! committed — if anything else went into the unit before its commit. So the unit is aborted
//! (its records never reach a `read_committed` consumer) and the transaction is published from
//! the stage at its commit, as if it had never started early, when: another transaction commits
//! meanwhile (a Begin, or another Stream Commit), another transaction streams, a subtransaction
//! of it rolls back (a record cannot be taken back alone), or one of its events would not go out
//! on the plain path (a bad event, a refusal, a failed delivery). Its own abort aborts the unit
//! and drops it. Nothing waits on the fallback but the abort's round trip.
//!
//! **At its commit** the rest of it goes out the same way (reading waits meanwhile, as for a
//! release), the stage forgets it without reading it back, the decode step adopts the Relation
//! messages the fork learnt, and the durability contract learns a transaction committed at its
//! end LSN with nothing left in flight of its own; the unit — held by its floor until then —
//! is sealed with the commit LSN as checkpoint. Should an event of the rest decline, it still
//! falls back: the unit is aborted and the stage releases the whole transaction.
//!
//! Invariant: the records of a unit holding a transaction produced early are that
//! transaction's alone until its commit; the unit is never sealed before it.

use std::collections::VecDeque;

use bytes::Bytes;

use super::decode::{Decoded, Decoder, EventSource};
use super::error::RelayError;
use super::publish::{Accounts, EarlySent, Publish};
use crate::config::Settings;
use crate::postgres::pgoutput::StreamCommit;
use crate::sink::SinkFailure;

/// Where the early step stands.
enum State {
    /// No streamed transaction is produced before its commit.
    Idle,
    /// Transaction `xid` is produced as its blocks arrive (and, once it committed, the rest of
    /// it).
    Producing(Box<Producing>),
}

struct Producing {
    xid: u32,
    /// Decodes its staged messages (`Decoder::fork_for_early`).
    decoder: Decoder,
    /// Its staged messages not produced yet, in order.
    queue: VecDeque<Bytes>,
    /// An event the sink had no room for: handed over again first.
    waiting: Option<(EventSource, u32)>,
    /// Events handled in order (sent, or not for the sink).
    done: u32,
    /// Its Stream Commit, once it arrived: what is left goes out, then it is done.
    commit: Option<StreamCommit>,
}

/// A transaction produced early whose every event went out after its commit: what the stream
/// tells the decode step, the stage and the durability contract (`StreamState::finish_early`).
pub(super) struct Finished {
    pub(super) commit: StreamCommit,
    /// The decoder that read it: its Relation cache is the stream's from now on.
    pub(super) decoder: Decoder,
    pub(super) events: u32,
}

/// What a delivery report of a record produced early means.
#[derive(Debug)]
pub(super) enum Report {
    /// Nothing to do.
    Settled,
    /// The unit cannot commit as it is: fall back.
    FallBack(&'static str),
    /// It failed after its transaction committed: the session ends (transient).
    Failed(SinkFailure),
}

pub(super) struct Early {
    state: State,
    /// Tells this attempt's delivery reports from those of records an abort took back.
    generation: u64,
    in_flight: usize,
    in_flight_bytes: usize,
}

impl Early {
    pub(super) fn new() -> Early {
        Early {
            state: State::Idle,
            generation: 1,
            in_flight: 0,
            in_flight_bytes: 0,
        }
    }

    /// No transaction is produced early.
    pub(super) fn idle(&self) -> bool {
        matches!(self.state, State::Idle)
    }

    /// The transaction produced early now, if any.
    pub(super) fn producing(&self) -> Option<u32> {
        match &self.state {
            State::Producing(p) => Some(p.xid),
            _ => None,
        }
    }

    /// Transaction `xid` is produced early from now on, decoded by `decoder`.
    pub(super) fn start(&mut self, xid: u32, decoder: Decoder) {
        self.state = State::Producing(Box::new(Producing {
            xid,
            decoder,
            queue: VecDeque::new(),
            waiting: None,
            done: 0,
            commit: None,
        }));
        tracing::debug!(
            xid,
            "streamed transaction produced into an open sink transaction as it arrives"
        );
    }

    /// A message of the transaction produced early was staged: it goes out next.
    pub(super) fn push(&mut self, xid: u32, message: Bytes) {
        if let State::Producing(p) = &mut self.state {
            if p.xid == xid {
                p.queue.push_back(message);
            }
        }
    }

    /// Something of it waits to be produced, or it committed and is not finished yet: reading
    /// waits.
    pub(super) fn has_work(&self) -> bool {
        matches!(&self.state, State::Producing(p) if !p.queue.is_empty() || p.waiting.is_some() || p.commit.is_some())
    }

    /// Whether the in-flight budget leaves room for another early record.
    pub(super) fn has_room(&self, settings: &Settings) -> bool {
        room(self.in_flight, self.in_flight_bytes, settings)
    }

    /// The transaction is not produced early any more (its unit is being aborted): the stage
    /// publishes it at its commit — its Stream Commit, returned if it arrived already. Reports
    /// of what was sent count for nothing from now on.
    pub(super) fn fall_back(&mut self, why: &str) -> Option<StreamCommit> {
        let State::Producing(p) = std::mem::replace(&mut self.state, State::Idle) else {
            return None;
        };
        tracing::info!(
            xid = p.xid,
            produced_early = p.done,
            why,
            "streamed transaction falls back to the stage: its open sink transaction is aborted, and it is \
             published at its commit"
        );
        self.generation += 1;
        self.in_flight = 0;
        self.in_flight_bytes = 0;
        p.commit
    }

    /// Transaction `xid` committed with `commit`: whether it was produced early (then what is
    /// left of it goes out the same way, and [`finished`](Self::finished) hands it back).
    pub(super) fn committed(&mut self, commit: &StreamCommit) -> bool {
        match &mut self.state {
            State::Producing(p) if p.xid == commit.xid => {
                p.commit = Some(commit.clone());
                true
            }
            _ => false,
        }
    }

    /// The transaction produced early committed and all of it went out: it is handed back,
    /// and nothing is produced early any more until the next.
    pub(super) fn finished(&mut self) -> Option<Finished> {
        match &self.state {
            State::Producing(p) if p.commit.is_some() && p.queue.is_empty() && p.waiting.is_none() => {}
            _ => return None,
        }
        let State::Producing(p) = std::mem::replace(&mut self.state, State::Idle) else {
            return None;
        };
        let p = *p;
        Some(Finished {
            commit: p.commit?,
            decoder: p.decoder,
            events: p.done,
        })
    }

    /// Produces what waits while the sink and the budget have room. `Ok(Some(why))`: an event
    /// cannot go out early — fall back.
    pub(super) fn work(
        &mut self,
        settings: &Settings,
        publish: &mut Publish<'_>,
        a: &mut Accounts<'_>,
    ) -> Result<Option<&'static str>, RelayError> {
        let generation = self.generation;
        let State::Producing(p) = &mut self.state else {
            return Ok(None);
        };
        while room(self.in_flight, self.in_flight_bytes, settings) {
            let (source, seq) = match p.waiting.take() {
                Some(waiting) => waiting,
                None => {
                    let Some(message) = p.queue.pop_front() else { break };
                    match p.decoder.decode_released(settings, message)? {
                        Decoded::Event { at, source } => (source, at.event.seq),
                        // A Relation: the fork learnt the table's shape.
                        _ => continue,
                    }
                }
            };
            match publish.early_event(&source, seq, generation, a)? {
                EarlySent::Sent { bytes } => {
                    p.done += 1;
                    self.in_flight += 1;
                    self.in_flight_bytes += bytes;
                }
                EarlySent::Filtered => p.done += 1,
                EarlySent::Full => {
                    p.waiting = Some((source, seq));
                    break;
                }
                EarlySent::Declined(why) => return Ok(Some(why)),
            }
        }
        Ok(None)
    }

    /// A delivery report of a record produced early (`generation`, `bytes`: from its tag).
    pub(super) fn on_delivery(&mut self, generation: u64, bytes: usize, outcome: Result<(), SinkFailure>) -> Report {
        if generation != self.generation {
            // Taken back by an abort.
            return Report::Settled;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
        match (outcome, &self.state) {
            (Ok(()), _) => Report::Settled,
            (Err(_), State::Producing(_)) => Report::FallBack("a record produced early failed"),
            (Err(failure), _) => Report::Failed(failure),
        }
    }
}

/// Whether `events` and `bytes` in flight leave room in the in-flight budget.
fn room(events: usize, bytes: usize, settings: &Settings) -> bool {
    events < settings.relay.max_in_flight && bytes < settings.relay.max_in_flight_bytes
}
