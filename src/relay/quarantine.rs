//! Telling a bad record from its innocent batch-mates.
//!
//! When a broker refuses a produce request for the content of its records (`MESSAGE_TOO_LARGE`,
//! `INVALID_RECORD`, …) it refuses the whole batch, and its client reports that error for every
//! event in it. Applying `[relay] on_bad_event` to all of them would skip or dead-letter events
//! whose only fault was sharing a batch with a bad one. So a refused event only becomes a
//! *suspect*: the session ends (the transaction is poisoned, nothing past it is confirmed) and
//! the next session replays from the slot. When the replay reaches a suspect, the relay stops
//! reading, waits until nothing else is in flight, and sends the suspect alone. Accepted, it was
//! innocent; refused again, it is the bad one and the policy applies.
//!
//! Under sink transactions (`guarantee/transactions.rs`: Kafka transactions) a refusal also leaves
//! the open broker transaction unable to commit, so the policy cannot be applied inside it (a
//! dead letter or the events after a skipped one would go into a transaction that must abort).
//! There a suspect refused again alone is *condemned*: the session ends, the transaction is
//! aborted, and the replay applies the policy to it at once, without sending it.
//!
//! Suspects are identified by the commit LSN of their transaction and their position among its
//! outbox events, which a replay reproduces exactly. They live in the supervisor, across
//! sessions, and are forgotten once the slot's confirmed position passes their transaction.

use std::collections::HashMap;

use crate::outbox::bad_event::RawEvent;
use crate::outbox::event::OutboxEvent;
use crate::postgres::lsn::Lsn;
use crate::relay::durability::TxnTicket;

/// One outbox event's identity across replays: its transaction's commit LSN and its position
/// (0-based) among that transaction's outbox events.
/// Ordered as the relay writes each partition: by commit LSN, then position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct EventRef {
    pub(crate) commit_lsn: Lsn,
    pub(crate) seq: u32,
}

#[cfg(test)]
impl EventRef {
    /// The event at position `seq` of the transaction committed at `lsn` (unit tests).
    pub(crate) fn at(lsn: u64, seq: u32) -> EventRef {
        EventRef {
            commit_lsn: Lsn(lsn),
            seq,
        }
    }
}

/// What an earlier session learnt of a refused event, with the broker's refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Refused, perhaps only with its batch: the replay sends it alone.
    Suspect(String),
    /// Refused again alone inside a broker transaction, which had to abort: the replay applies
    /// `relay.on_bad_event` to it without sending it.
    Condemned(String),
}

/// Events the broker refused in an earlier session, with the refusal.
#[derive(Debug, Default)]
pub(crate) struct Suspects {
    events: HashMap<EventRef, Standing>,
}

impl Suspects {
    pub(crate) fn insert(&mut self, event: EventRef, cause: String) {
        self.events.insert(event, Standing::Suspect(cause));
    }

    /// It was refused again alone inside a broker transaction: a bad event, decided.
    pub(crate) fn condemn(&mut self, event: EventRef, cause: String) {
        self.events.insert(event, Standing::Condemned(cause));
    }

    /// What an earlier session learnt of `event` (`None`: nothing; it goes as any other).
    pub(crate) fn standing(&self, event: EventRef) -> Option<&Standing> {
        self.events.get(&event)
    }

    /// The event was accepted on its own: it was innocent.
    pub(crate) fn clear(&mut self, event: EventRef) {
        self.events.remove(&event);
    }

    /// Drops suspects whose transactions the server will not send again: those whose commit
    /// record starts before the confirmed position.
    pub(crate) fn forget_before(&mut self, confirmed: Lsn) {
        self.events.retain(|e, _| e.commit_lsn >= confirmed);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// The open transaction's side of one event: what its delivery tag and errors need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxnEvent {
    pub(crate) ticket: TxnTicket,
    pub(crate) commit_time_unix_us: i64,
    pub(crate) event: EventRef,
}

impl TxnEvent {
    pub(crate) fn commit_lsn(&self) -> Lsn {
        self.event.commit_lsn
    }
}

/// A suspect the replay reached: held (reading paused) until it can go out alone, then until
/// its delivery report says whether it is bad.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) txn: TxnEvent,
    /// The event, owned: the WAL frame it was decoded from is gone by the time it goes out,
    /// once everything sent before it is settled. Routed again then (routing is a pure
    /// function of the event), so no record shape of its own is kept.
    pub(crate) event: OutboxEvent<'static>,
    pub(crate) raw: RawEvent,
    /// The earlier refusal, for the log.
    pub(crate) earlier: String,
    pub(crate) state: HeldState,
    /// `[transactions]`: its index in its transaction (`transaction_meta.rs`), for its headers.
    pub(crate) txn_index: Option<u32>,
}

/// Where a held suspect stands.
#[derive(Debug)]
pub(crate) enum HeldState {
    /// Not handed over yet: handed over alone once nothing else is in flight.
    Waiting,
    /// Handed over alone, and the sink had no room for it: handed over again after the pause
    /// (said once, not at every try).
    NoRoom,
    /// Handed over alone: the sink's verdict is awaited.
    Sent,
    /// Refused again on its own — a bad event — and the sink had no room for its dead letter
    /// yet (a dead-letter topic's first record may wait for what the topic takes): the dead
    /// letter is handed over again, and only then is the suspect's own delivery (`ticket`,
    /// `bytes`) settled. `cause`: the sink's words.
    DeadLetterDue {
        ticket: TxnTicket,
        bytes: usize,
        cause: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_are_forgotten_once_confirmed_past() {
        let mut s = Suspects::default();
        let a = EventRef {
            commit_lsn: Lsn(100),
            seq: 0,
        };
        let b = EventRef {
            commit_lsn: Lsn(200),
            seq: 3,
        };
        s.insert(a, "too large".into());
        s.insert(b, "invalid record".into());
        assert_eq!(s.standing(b), Some(&Standing::Suspect("invalid record".into())));
        assert_eq!(
            s.standing(EventRef {
                commit_lsn: Lsn(200),
                seq: 2
            }),
            None
        );
        s.forget_before(Lsn(150));
        assert_eq!((s.standing(a), s.len()), (None, 1));
        s.clear(b);
        assert!(s.is_empty());
    }
}
