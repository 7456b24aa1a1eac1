//! Exactly-once through sink transactions (`relay.exactly_once = "kafka-transactions"`,
//! [`ExactlyOnce::Transactions`]): the stream's records go out in *units* — one broker
//! transaction per batch of whole source transactions — each sealed (committed with a
//! checkpoint) by the sink before the WAL position of its source transactions is confirmed.
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
//! still abort is not delivered. A seal's failure (an abort, a commit that failed, a fencing)
//! ends the session like a failed delivery, and the next replays from the slot's position.
//!
//! **Checkpoint.** Each seal stores the commit LSN of the unit's last source transaction; the
//! sink reads the last committed one back when it is created — after fencing every earlier
//! producer of its identity, so no unit can commit later — and a (re)started stream skips
//! the source transactions at or below it: those are in Kafka, committed, although PostgreSQL
//! was not told before the crash. Records still carry their position headers (`resume.rs`).
//!
//! Invariant: the flush LSN sent to PostgreSQL covers only source transactions whose records
//! are in a committed broker transaction (or that had none).
//!
//! [`ExactlyOnce::Transactions`]: crate::sink::ExactlyOnce::Transactions

use std::time::{Duration, Instant};

use tracing::info;

use super::quarantine::EventRef;
use super::resume::Verdict;
use crate::config::Settings;
use crate::postgres::lsn::Lsn;

/// One unit: records sent since the previous seal.
#[derive(Debug, Clone, Copy)]
struct Unit {
    /// Nothing past this is confirmed before the unit is sealed.
    floor: Lsn,
    events: usize,
    opened: Instant,
    /// Commit LSN of the last source transaction with a record in the unit (the checkpoint).
    last_commit: Lsn,
}

pub(crate) struct Sealing {
    /// `resume::HEADER_SOURCE`'s value.
    pub(super) source: String,
    /// The committed checkpoint the sink read: source transactions at or below it are in Kafka.
    checkpoint: Option<Lsn>,
    open: Option<Unit>,
    /// The unit whose seal the sink is committing.
    sealing: Option<Unit>,
    max_events: usize,
    max_age: Duration,
    skipped: u64,
    sealed: u64,
    /// A seal failed: the unit was aborted; nothing is confirmed past its floor any more and
    /// nothing more is sealed (the session ends).
    failed: bool,
}

impl Sealing {
    pub(crate) fn new(settings: &Settings, system_id: &str, checkpoint: Option<u64>) -> Sealing {
        Sealing {
            source: format!("{system_id}/{}", settings.postgres.slot),
            checkpoint: checkpoint.map(Lsn),
            open: None,
            sealing: None,
            max_events: settings
                .relay
                .transaction_max_events
                .min(settings.relay.max_in_flight)
                .max(1),
            max_age: settings.relay.transaction_max_age,
            skipped: 0,
            sealed: 0,
            failed: false,
        }
    }

    /// A record at `at`: skipped when its source transaction is at or below the checkpoint.
    pub(crate) fn admit(&mut self, at: EventRef) -> Verdict {
        if self.checkpoint.is_some_and(|c| at.commit_lsn <= c) {
            self.skipped += 1;
            metrics::counter!(crate::ops::metrics::EVENTS_SKIPPED_IN_KAFKA).increment(1);
            return Verdict::Skip;
        }
        Verdict::Send
    }

    /// A record of the source transaction committed at `commit_lsn` was handed over; `received`
    /// is how far the stream had read (the new unit's floor).
    pub(crate) fn sent(&mut self, commit_lsn: Lsn, received: Lsn) {
        let unit = self.open.get_or_insert(Unit {
            floor: received,
            events: 0,
            opened: Instant::now(),
            last_commit: commit_lsn,
        });
        unit.events += 1;
        unit.last_commit = unit.last_commit.max(commit_lsn);
    }

    /// The most the flush LSN may say: the floor of the oldest unit not sealed yet.
    pub(crate) fn limit(&self) -> Option<Lsn> {
        self.sealing.or(self.open).map(|u| u.floor)
    }

    /// A seal is under way: the sink takes no records until it is done.
    pub(crate) fn is_sealing(&self) -> bool {
        self.sealing.is_some() && !self.failed
    }

    /// The seal under way failed: its unit stays unconfirmed for good.
    pub(crate) fn seal_failed(&mut self) {
        self.failed = true;
    }

    /// The open unit holds its bound of events: the stream stops reading at the next
    /// source-transaction boundary so that it is sealed there (reading on inside a source
    /// transaction: a unit only ever holds whole ones).
    pub(crate) fn unit_full(&self) -> bool {
        self.open.is_some_and(|u| u.events >= self.max_events)
    }

    /// Whether the open unit should be sealed now, at a source-transaction boundary;
    /// `nothing_ready`: the stream has nothing more to send at once.
    pub(crate) fn due(&self, nothing_ready: bool, now: Instant) -> bool {
        match (&self.open, &self.sealing) {
            (Some(u), None) if !self.failed => {
                nothing_ready || u.events >= self.max_events || now.duration_since(u.opened) >= self.max_age
            }
            _ => false,
        }
    }

    /// Starts sealing the open unit: the checkpoint to store and its label.
    pub(crate) fn start(&mut self) -> Option<(u64, String)> {
        let unit = self.open.take()?;
        self.sealing = Some(unit);
        Some((
            unit.last_commit.0,
            format!("{} {} ({} events)", self.source, unit.last_commit, unit.events),
        ))
    }

    /// The sink committed the unit being sealed: it is delivered.
    pub(crate) fn sealed(&mut self) -> Option<Lsn> {
        let unit = self.sealing.take()?;
        self.sealed += 1;
        Some(unit.last_commit)
    }

    /// The commit LSN of the unit being sealed (for a failure's message).
    pub(crate) fn sealing_commit(&self) -> Lsn {
        self.sealing.map_or(Lsn(0), |u| u.last_commit)
    }

    pub(crate) fn skipped(&self) -> u64 {
        self.skipped
    }

    pub(crate) fn finish(self) {
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

    fn at(lsn: u64) -> EventRef {
        EventRef {
            commit_lsn: Lsn(lsn),
            seq: 0,
        }
    }

    #[test]
    fn skips_at_or_below_the_checkpoint_and_limits_confirmation_to_the_oldest_unsealed_floor() {
        let s = settings("[relay]\ntransaction_max_events = 2\n");
        let mut sealing = Sealing::new(&s, "7000", Some(0x500));
        assert_eq!(sealing.admit(at(0x500)), Verdict::Skip);
        assert_eq!(sealing.admit(at(0x600)), Verdict::Send);
        assert_eq!(sealing.limit(), None, "nothing sent: no limit");
        let now = Instant::now();
        assert!(!sealing.due(true, now));
        sealing.sent(Lsn(0x600), Lsn(0x5f0));
        assert_eq!(sealing.limit(), Some(Lsn(0x5f0)));
        assert!(!sealing.due(false, now), "one event, young, more ready");
        assert!(sealing.due(true, now), "nothing more ready");
        sealing.sent(Lsn(0x700), Lsn(0x690));
        assert!(sealing.due(false, now), "two events: the bound");
        let (checkpoint, label) = sealing.start().unwrap();
        assert_eq!(checkpoint, 0x700);
        assert!(label.contains("0/700"), "{label}");
        assert!(sealing.is_sealing());
        // A record while sealing opens the next unit; the limit stays at the older floor.
        sealing.sent(Lsn(0x800), Lsn(0x7f0));
        assert!(!sealing.due(true, now), "one seal at a time");
        assert_eq!(sealing.limit(), Some(Lsn(0x5f0)));
        assert_eq!(sealing.sealed(), Some(Lsn(0x700)));
        assert_eq!(sealing.limit(), Some(Lsn(0x7f0)));
        sealing.start().unwrap();
        sealing.sealed();
        assert_eq!(sealing.limit(), None);
        assert_eq!(sealing.skipped(), 1);
    }
}
