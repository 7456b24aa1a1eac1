//! Exactly-once through sink transactions (a sink that declares
//! [`ExactlyOnce::Transactions`]: Kafka with `[kafka] exactly_once = "transactions"`): the
//! stream's records go out in *units* — one broker transaction per batch of whole source
//! transactions — each sealed (committed with a checkpoint) by the sink before the WAL position
//! of its source transactions is confirmed.
//!
//! **Units.** A unit opens with the first record sent after the previous seal, and is sealed at
//! a source-transaction boundary (no source transaction open, nothing waiting) once the stream
//! has nothing more ready (the socket was drained, or the in-flight budget is full), or once it
//! holds `relay.transaction_max_events` events (at most `relay.max_in_flight`), or is
//! `relay.transaction_max_ms` old. Nothing more ready is the usual trigger: while a seal is
//! under way the stream reads nothing (the sink cannot take records between a commit and the
//! next begin), so the next unit holds whatever arrived meanwhile — group commit, whose size
//! follows the load and the commit's round trip. The two bounds cap what an abort replays and
//! how long `read_committed` consumers wait when the stream is never drained (a backlog).
//!
//! **Confirmation.** The watermark settles acknowledgements as in every mode, but the flush LSN
//! never passes the *floor* of the oldest unit not yet sealed (what the stream had received
//! when that unit's first record was sent): a record acknowledged inside a transaction that may
//! still abort is not delivered. The floor is a hold on [`Durability`] (`durability/mod.rs`,
//! the seal cap), placed when a unit opens and released when it is sealed. A seal's failure (an abort, a commit that failed, a fencing)
//! ends the session like a failed delivery, and the next replays from the slot's position.
//!
//! **Checkpoint.** Each seal stores the commit LSN of the unit's last source transaction; the
//! sink reads the last committed one back when it is created — after fencing every earlier
//! producer of its identity, so no unit can commit later — and a (re)started stream skips
//! the source transactions at or below it: those are in the sink, committed, although PostgreSQL
//! was not told before the crash. Records still carry their position headers (`position.rs`).
//!
//! **Early units.** A streamed source transaction may go into a unit of its own before its
//! commit (`relay/early.rs`, [`Guarantee::may_produce_early`]): such a unit is never sealed
//! before that commit, is not bounded by `transaction_max_events`, and is aborted on purpose
//! ([`Sealer::abort`](crate::sink::Sealer::abort)) when the transaction aborts or falls back
//! to the stage.
//!
//! Invariant: the flush LSN sent to PostgreSQL covers only source transactions whose records
//! are in a committed broker transaction (or that had none).
//!
//! [`ExactlyOnce::Transactions`]: crate::sink::ExactlyOnce::Transactions
//! [`Durability`]: crate::relay::durability::Durability

use std::time::{Duration, Instant};

use tracing::info;

use super::{position, Bound, Guarantee, Stamp, Verdict};
use crate::config::Settings;
use crate::postgres::lsn::Lsn;
use crate::relay::durability::Durability;
use crate::relay::error::RelayError;
use crate::relay::publish::DeliveryTag;
use crate::relay::quarantine::EventRef;
use crate::sink::{Sealer, SinkFailure};

/// One unit: records sent since the previous seal.
#[derive(Debug, Clone, Copy)]
struct Unit {
    events: usize,
    opened: Instant,
    /// Commit LSN of the last source transaction with a record in the unit (the checkpoint).
    last_commit: Lsn,
    /// What the unit holds of a streamed transaction produced before its commit
    /// (`relay/early.rs`).
    early: Early,
}

/// A unit's records of a streamed transaction produced before its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Early {
    /// None, or only of one that committed since: the unit may be sealed.
    Settled,
    /// Records of a transaction that has not committed: never sealed like this (it may still
    /// abort), and not bounded by `transaction_max_events` (a unit holds whole transactions).
    Open,
}

/// Where the unit being committed stands.
#[derive(Debug, Clone, Copy)]
enum Sealing {
    /// No seal under way.
    Idle,
    /// The sink is committing this unit.
    Committing(Unit),
    /// The sink is aborting the unit that held a streamed transaction's early records.
    Aborting,
    /// A seal failed: its unit was aborted; nothing is confirmed past its floor any more and
    /// nothing more is sealed (the session ends).
    Failed,
}

pub(super) struct Transactions {
    /// [`position::HEADER_SOURCE`]'s value.
    source: String,
    /// Commits the sink's open unit with a checkpoint.
    sealer: Box<dyn Sealer<DeliveryTag>>,
    /// The sink's name, for errors.
    sink: &'static str,
    /// The committed checkpoint the sink read: source transactions at or below it are in the sink.
    checkpoint: Option<Lsn>,
    open: Option<Unit>,
    sealing: Sealing,
    max_events: usize,
    max_age: Duration,
    /// `relay.streamed_produce = "as-received"`.
    early_allowed: bool,
    skipped: u64,
    sealed: u64,
}

impl Transactions {
    pub(super) fn new(
        settings: &Settings,
        system_id: &str,
        sealer: Box<dyn Sealer<DeliveryTag>>,
        checkpoint: Option<u64>,
    ) -> Transactions {
        Transactions {
            source: position::source(settings, system_id),
            sealer,
            sink: settings.sink.broker_name(),
            checkpoint: checkpoint.map(Lsn),
            open: None,
            sealing: Sealing::Idle,
            max_events: settings
                .relay
                .transaction_max_events
                .min(settings.relay.max_in_flight)
                .max(1),
            max_age: settings.relay.transaction_max_age,
            early_allowed: settings.relay.streamed_produce == crate::config::relay::StreamedProduce::AsReceived,
            skipped: 0,
            sealed: 0,
        }
    }

    /// A seal is under way (the sink takes no records until it is done).
    fn is_sealing(&self) -> bool {
        matches!(self.sealing, Sealing::Committing(_) | Sealing::Aborting)
    }

    /// The open unit holds its bound of events: the stream stops reading at the next
    /// source-transaction boundary so that it is sealed there (reading on inside a source
    /// transaction: a unit only ever holds whole ones).
    fn unit_full(&self) -> bool {
        self.open
            .is_some_and(|u| u.events >= self.max_events && u.early == Early::Settled)
    }

    /// The open unit, opened by this record if there is none: its floor — how far the stream
    /// had read — holds confirmation back until the unit is sealed.
    fn unit(&mut self, durability: &mut Durability, commit_lsn: Lsn) -> &mut Unit {
        self.open.get_or_insert_with(|| {
            durability.hold(durability.received());
            Unit {
                events: 0,
                opened: Instant::now(),
                last_commit: commit_lsn,
                early: Early::Settled,
            }
        })
    }

    /// Whether the open unit should be sealed now, at a source-transaction boundary.
    fn due(&self, nothing_ready: bool, now: Instant) -> bool {
        match (&self.open, &self.sealing) {
            (Some(u), Sealing::Idle) if u.early == Early::Settled => {
                nothing_ready || u.events >= self.max_events || now.duration_since(u.opened) >= self.max_age
            }
            _ => false,
        }
    }
}

impl Guarantee for Transactions {
    fn label(&self) -> &'static str {
        "exactly-once (sink transactions)"
    }

    /// Skipped when its source transaction is at or below the checkpoint.
    fn admit(&mut self, at: EventRef, _: Bound<'_>, _: Option<&str>, _: bool) -> Verdict {
        if self.checkpoint.is_some_and(|c| at.commit_lsn <= c) {
            self.skipped += 1;
            crate::ops::metrics::count_skipped_in_sink();
            return Verdict::Skip;
        }
        Verdict::Send
    }

    fn stamp<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> Stamp<'b> {
        Stamp {
            headers: Some(position::headers(&self.source, at, buf)),
            dedup_key: None,
        }
    }

    /// The first record after a seal opens a unit, whose floor — how far the stream had read —
    /// holds confirmation back until the unit is sealed.
    fn sent(&mut self, commit_lsn: Lsn, durability: &mut Durability) {
        let unit = self.unit(durability, commit_lsn);
        unit.events += 1;
        unit.last_commit = unit.last_commit.max(commit_lsn);
    }

    /// Only into a unit of its own (nothing else is open or being sealed, so an abort takes
    /// back nothing but its records), and only past the checkpoint: a transaction the stream
    /// meets again before it reached the checkpoint may be in the sink already, which only its
    /// commit LSN can tell — it is published at its commit, and skipped then if it is.
    fn may_produce_early(&self, received: Lsn) -> bool {
        self.early_allowed
            && self.open.is_none()
            && matches!(self.sealing, Sealing::Idle)
            && self.checkpoint.is_none_or(|c| received > c)
    }

    fn early_sent(&mut self, durability: &mut Durability) {
        let unit = self.unit(durability, Lsn(0));
        unit.early = Early::Open;
        unit.events += 1;
    }

    fn early_committed(&mut self, commit_lsn: Lsn) {
        if let Some(unit) = self.open.as_mut() {
            unit.early = Early::Settled;
            unit.last_commit = unit.last_commit.max(commit_lsn);
        }
    }

    fn abort_early(&mut self, why: &str) -> Result<bool, RelayError> {
        let Some(unit) = self.open.take() else { return Ok(false) };
        self.sealing = Sealing::Aborting;
        let label = format!("{} ({} early events: {why})", self.source, unit.events);
        self.sealer
            .abort(&label, DeliveryTag::seal(0))
            .map_err(|refusal| RelayError::DeliveryFailed {
                sink: self.sink,
                failure: Box::new(refusal.failure),
                commit_lsn: unit.last_commit,
            })?;
        Ok(true)
    }

    /// Sending pauses while a seal is under way (the sink takes no records between a commit and
    /// the next begin), and between source transactions once the open unit is full, so that it
    /// is sealed there. The committed-but-unconfirmed count is left out: a unit's records stay
    /// unconfirmed until its seal, which can only happen at a source transaction's end, so
    /// pausing on them inside a transaction would never resume; the unit's own bound
    /// (`relay.transaction_max_events`, at most `max_in_flight`) limits the replay instead.
    fn pauses_sending(&self, _: &Durability, _: usize, between_transactions: bool) -> bool {
        self.is_sealing() || (self.unit_full() && between_transactions)
    }

    /// Asks the sink to commit the open unit with its checkpoint (the commit LSN of its last
    /// source transaction); the answer comes back as the seal tag's completion.
    fn seal_if_due(&mut self, nothing_ready: bool, now: Instant) -> Result<(), RelayError> {
        if !self.due(nothing_ready, now) {
            return Ok(());
        }
        let Some(unit) = self.open.take() else { return Ok(()) };
        self.sealing = Sealing::Committing(unit);
        let checkpoint = unit.last_commit.0;
        let label = format!("{} {} ({} events)", self.source, unit.last_commit, unit.events);
        self.sealer
            .seal(checkpoint, &label, DeliveryTag::seal(checkpoint))
            .map_err(|refusal| RelayError::DeliveryFailed {
                sink: self.sink,
                failure: Box::new(refusal.failure),
                commit_lsn: unit.last_commit,
            })
    }

    /// The unit is delivered, or the session ends (transient: the unit was aborted and the next
    /// session replays from the slot's position).
    fn sealed(&mut self, outcome: Result<(), SinkFailure>, durability: &mut Durability) -> Result<(), RelayError> {
        // What fails names the unit's last commit; an abort on purpose, the confirmed position.
        let (committed, commit_lsn) = match self.sealing {
            Sealing::Committing(unit) => (true, unit.last_commit),
            // Aborted on purpose: its floor goes with it, nothing of it is in the sink.
            Sealing::Aborting => (false, durability.confirmed()),
            Sealing::Idle | Sealing::Failed => return Err(crate::relay::error::InternalError::CompletionsClosed.into()),
        };
        match outcome {
            Ok(()) => {
                self.sealing = Sealing::Idle;
                self.sealed += u64::from(committed);
                durability.release();
                Ok(())
            }
            Err(failure) => {
                self.sealing = Sealing::Failed;
                Err(RelayError::DeliveryFailed {
                    sink: self.sink,
                    failure: Box::new(failure),
                    commit_lsn,
                })
            }
        }
    }

    fn sealing(&self) -> bool {
        self.is_sealing()
    }

    /// A refused record leaves the broker transaction unable to commit.
    fn refusal_dooms_unit(&self) -> bool {
        true
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }

    fn finish(self: Box<Self>) {
        info!(
            checkpoint = %self.checkpoint.map(|c| c.to_string()).unwrap_or_else(|| "none".into()),
            skipped_at_or_below_checkpoint = self.skipped,
            transactions_committed = self.sealed,
            "sink transactions: session summary"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;
    use crate::sink::memory::{memory, MemoryHandle};

    fn at(lsn: u64) -> EventRef {
        EventRef::at(lsn, 0)
    }

    fn to() -> Bound<'static> {
        Bound {
            destination: "t",
            key: b"k",
            placement: None,
        }
    }

    /// The strategy over an in-memory sink's sealer, and what it was asked to seal.
    fn transactions(s: &Settings, checkpoint: Option<u64>) -> (Transactions, MemoryHandle<DeliveryTag>) {
        let (_sink, handle, _completions) = memory::<DeliveryTag>();
        (
            Transactions::new(s, "7000", Box::new(handle.sealer()), checkpoint),
            handle,
        )
    }

    #[test]
    fn skips_at_or_below_the_checkpoint_and_holds_confirmation_at_the_oldest_unsealed_floor() {
        let s = settings("[relay]\ntransaction_max_events = 2\n");
        let (mut g, sealed) = transactions(&s, Some(0x500));
        let mut d = Durability::new(Lsn(0x10));
        assert_eq!(g.admit(at(0x500), to(), None, true), Verdict::Skip);
        assert_eq!(g.admit(at(0x600), to(), None, true), Verdict::Send);
        let now = Instant::now();
        g.seal_if_due(true, now).unwrap();
        assert!(sealed.seals().is_empty(), "nothing sent: nothing to seal");
        d.keepalive(Lsn(0x5f0));
        let t = d.begin().unwrap();
        d.sent(t, 1).unwrap();
        g.sent(Lsn(0x600), &mut d);
        assert!(!g.due(false, now), "one event, young, more ready");
        assert!(g.due(true, now), "nothing more ready");
        d.commit(t, Lsn(0x610)).unwrap();
        d.acknowledged(t, 1).unwrap();
        assert_eq!(d.confirmed(), Lsn(0x5f0), "held at the unit's floor");
        g.sent(Lsn(0x700), &mut d);
        assert!(g.due(false, now), "two events: the bound");
        assert!(
            g.pauses_sending(&d, 10, true),
            "a full unit waits for its seal at a boundary"
        );
        assert!(
            !g.pauses_sending(&d, 10, false),
            "inside a source transaction reading goes on"
        );
        g.seal_if_due(false, now).unwrap();
        assert_eq!(sealed.seals(), [0x700], "the checkpoint: the unit's last commit LSN");
        assert!(g.sealing() && g.pauses_sending(&d, 10, false));
        // A record while sealing opens the next unit; the older floor still holds.
        d.keepalive(Lsn(0x7f0));
        g.sent(Lsn(0x800), &mut d);
        g.seal_if_due(true, now).unwrap();
        assert_eq!(sealed.seals().len(), 1, "one seal at a time");
        assert_eq!(d.confirmed(), Lsn(0x5f0));
        g.sealed(Ok(()), &mut d).unwrap();
        assert_eq!(d.confirmed(), Lsn(0x7f0), "the next unit's floor");
        g.seal_if_due(true, now).unwrap();
        assert_eq!(sealed.seals(), [0x700, 0x800]);
        g.sealed(Ok(()), &mut d).unwrap();
        assert_eq!(d.confirmed(), Lsn(0x7f0));
        assert_eq!(g.skipped(), 1);
    }

    #[test]
    fn a_failed_seal_keeps_its_floor_for_good_and_ends_the_session() {
        let s = settings("");
        let (mut g, sealed) = transactions(&s, None);
        let mut d = Durability::new(Lsn(0x10));
        g.sent(Lsn(0x600), &mut d);
        g.seal_if_due(true, Instant::now()).unwrap();
        let failure = SinkFailure {
            kind: crate::sink::FailureKind::Transient,
            destination: "t".into(),
            partition: None,
            event_id: None,
            cause: "aborted".into(),
        };
        let err = g.sealed(Err(failure), &mut d).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(!g.sealing(), "nothing is under way any more");
        d.keepalive(Lsn(0x900));
        assert_eq!(d.confirmed(), Lsn(0x10));
        g.seal_if_due(true, Instant::now()).unwrap();
        assert_eq!(sealed.seals().len(), 1, "nothing more is sealed");
    }
}
