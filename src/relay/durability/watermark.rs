//! Step 4, watermark: how far the sink acknowledged the stream, over whole transactions. Held
//! by [`super::Durability`] alone, which caps it with the seal cap and hands the result to
//! `confirm.rs` — the one way to a flush LSN.
//!
//! Invariant: the confirmed LSN is the end LSN of the latest transaction T such that every outbox
//! event of T *and of every transaction before T* has been acknowledged by the sink. Confirming an
//! LSN lets the server discard the WAL before it and, on the next `START_REPLICATION`, skip every
//! transaction whose commit record lies before it — so confirming too early loses events forever,
//! while confirming too late only costs duplicates after a restart.
//!
//! Transactions arrive in commit order (pgoutput sends each one whole at its commit, protocol
//! version 1), so a FIFO of transactions is enough: deliveries may complete in any order across
//! partitions, and the watermark only advances over a contiguous prefix of finished transactions.
//!
//! Keepalives: when the server reports `wal_end` in a keepalive, every change before it has been
//! streamed to us. If nothing is in flight and no transaction is open, `wal_end` itself is safe to
//! confirm — that is what keeps a quiet outbox from pinning WAL while other tables are busy.
//! Otherwise it is queued as an event-less "transaction" behind the pending ones.
//!
//! A failed delivery poisons its transaction: the watermark never advances past it again. The
//! relay then restarts streaming from the last confirmed LSN and republishes.
//!
//! Reported LSNs never go backwards.

use std::collections::VecDeque;

use crate::postgres::lsn::Lsn;

/// Identifies one transaction for the deliveries of its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TxnTicket(u64);

impl TxnTicket {
    /// The ticket of a seal's tag (`seal.rs`), which belongs to no transaction and never
    /// reaches the watermark.
    pub(crate) const SEAL: TxnTicket = TxnTicket(u64::MAX);
}

#[derive(Debug)]
struct PendingTxn {
    /// `None` until the transaction's Commit arrives.
    end_lsn: Option<Lsn>,
    outstanding: u32,
    events: u32,
    poisoned: bool,
}

impl PendingTxn {
    fn is_done(&self) -> bool {
        self.end_lsn.is_some() && self.outstanding == 0 && !self.poisoned
    }

    fn is_empty_marker(&self) -> bool {
        self.end_lsn.is_some() && self.events == 0
    }
}

#[derive(Debug)]
pub(super) struct AckWatermark {
    pending: VecDeque<PendingTxn>,
    /// Ticket number of `pending[0]`.
    front_seq: u64,
    confirmed: Lsn,
    in_flight_events: usize,
    in_flight_bytes: usize,
    /// Events sent in pending (not yet confirmed) transactions, acknowledged or not.
    unconfirmed_events: usize,
    poisoned: bool,
}

/// A ticket that does not belong to a pending transaction: a bug in the caller, never ignored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WatermarkError {
    #[error("delivery for unknown transaction ticket {0}")]
    UnknownTicket(u64),
    #[error("transaction ticket {0} has no outstanding events")]
    NothingOutstanding(u64),
    #[error("a transaction is already open")]
    AlreadyOpen,
    #[error("commit for a transaction that is not the open one")]
    NotOpen,
}

impl AckWatermark {
    /// Starts at `start`, the slot's confirmed position (already safe).
    pub(super) fn new(start: Lsn) -> Self {
        AckWatermark {
            pending: VecDeque::new(),
            front_seq: 0,
            confirmed: start,
            in_flight_events: 0,
            in_flight_bytes: 0,
            unconfirmed_events: 0,
            poisoned: false,
        }
    }

    /// The LSN that is safe to report as flushed.
    pub(super) fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    pub(super) fn in_flight_events(&self) -> usize {
        self.in_flight_events
    }

    pub(super) fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// Events of *committed* transactions that are not yet confirmed, acknowledged or not: what
    /// a crash now would publish again (besides the open transaction's events). Acknowledgements
    /// that arrive out of order (another partition was slower) leave events here although they
    /// are no longer in flight, so this — not just the in-flight count — bounds the replay.
    pub(super) fn committed_unconfirmed_events(&self) -> usize {
        self.unconfirmed_events - self.open_txn().map_or(0, |t| t.events as usize)
    }

    /// True once any delivery failed; nothing is confirmed past it afterwards.
    #[cfg(test)]
    pub(super) fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Nothing in flight and no open transaction.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.pending.iter().all(|t| t.is_empty_marker())
    }

    fn open_txn(&self) -> Option<&PendingTxn> {
        self.pending.back().filter(|t| t.end_lsn.is_none())
    }

    /// A transaction's Begin.
    pub(super) fn begin(&mut self) -> Result<TxnTicket, WatermarkError> {
        if self.open_txn().is_some() {
            return Err(WatermarkError::AlreadyOpen);
        }
        self.pending.push_back(PendingTxn {
            end_lsn: None,
            outstanding: 0,
            events: 0,
            poisoned: false,
        });
        Ok(TxnTicket(self.front_seq + self.pending.len() as u64 - 1))
    }

    /// One event of the open transaction was handed to the sink.
    pub(super) fn event_sent(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        let txn = self.get_mut(ticket)?;
        txn.outstanding += 1;
        txn.events += 1;
        self.in_flight_events += 1;
        self.unconfirmed_events += 1;
        self.in_flight_bytes += bytes;
        Ok(())
    }

    /// The open transaction's Commit: it may complete as soon as its events are acknowledged.
    pub(super) fn commit(&mut self, ticket: TxnTicket, end_lsn: Lsn) -> Result<(), WatermarkError> {
        let is_open = self.open_txn().is_some() && ticket.0 == self.front_seq + self.pending.len() as u64 - 1;
        if !is_open {
            return Err(WatermarkError::NotOpen);
        }
        let txn = self.get_mut(ticket)?;
        txn.end_lsn = Some(end_lsn);
        if txn.events == 0 {
            self.merge_trailing_markers();
        }
        self.advance();
        Ok(())
    }

    /// The sink acknowledged one event.
    pub(super) fn acked(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        self.settle(ticket, bytes)?;
        self.advance();
        Ok(())
    }

    /// The sink finally failed one event: its transaction (and so everything after) is never confirmed.
    pub(super) fn failed(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        self.settle(ticket, bytes)?;
        self.get_mut(ticket)?.poisoned = true;
        self.poisoned = true;
        Ok(())
    }

    /// A keepalive (or any server report) saying everything before `wal_end` was streamed.
    pub(super) fn keepalive(&mut self, wal_end: Lsn) {
        if self.open_txn().is_some() || wal_end <= self.confirmed {
            return;
        }
        if self.pending.is_empty() {
            if !self.poisoned {
                self.confirmed = wal_end;
            }
            return;
        }
        self.pending.push_back(PendingTxn {
            end_lsn: Some(wal_end),
            outstanding: 0,
            events: 0,
            poisoned: false,
        });
        self.merge_trailing_markers();
        self.advance();
    }

    fn settle(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        let txn = self.get_mut(ticket)?;
        if txn.outstanding == 0 {
            return Err(WatermarkError::NothingOutstanding(ticket.0));
        }
        txn.outstanding -= 1;
        self.in_flight_events -= 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
        Ok(())
    }

    fn get_mut(&mut self, ticket: TxnTicket) -> Result<&mut PendingTxn, WatermarkError> {
        let idx = ticket
            .0
            .checked_sub(self.front_seq)
            .ok_or(WatermarkError::UnknownTicket(ticket.0))?;
        self.pending
            .get_mut(idx as usize)
            .ok_or(WatermarkError::UnknownTicket(ticket.0))
    }

    /// Two event-less finished entries at the back carry no information but the later LSN;
    /// folding them keeps the queue bounded by the number of in-flight events however idle
    /// the outbox is. Ticket numbers stay valid because only the last entry is removed and no
    /// ticket is held for an already-committed, event-less transaction.
    fn merge_trailing_markers(&mut self) {
        while self.pending.len() >= 2 {
            let n = self.pending.len();
            if !(self.pending[n - 1].is_empty_marker() && self.pending[n - 2].is_empty_marker()) {
                break;
            }
            let last = self.pending.pop_back().and_then(|t| t.end_lsn);
            if let Some(prev) = self.pending.back_mut() {
                prev.end_lsn = last.max(prev.end_lsn);
            }
        }
    }

    fn advance(&mut self) {
        while let Some(front) = self.pending.front() {
            if !front.is_done() {
                break;
            }
            if let Some(end) = front.end_lsn {
                self.confirmed = self.confirmed.max(end);
            }
            self.unconfirmed_events -= front.events as usize;
            self.pending.pop_front();
            self.front_seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A transaction with `events` one-byte events handed over and its Commit at `end`.
    fn committed(w: &mut AckWatermark, events: usize, end: u64) -> TxnTicket {
        let t = w.begin().unwrap();
        for _ in 0..events {
            w.event_sent(t, 1).unwrap();
        }
        w.commit(t, Lsn(end)).unwrap();
        t
    }

    /// From `Lsn(0)`: `a`, one event committed at 10, then `b`, `b_events` committed at 20.
    fn two_committed(b_events: usize) -> (AckWatermark, TxnTicket, TxnTicket) {
        let mut w = AckWatermark::new(Lsn(0));
        let a = committed(&mut w, 1, 10);
        let b = committed(&mut w, b_events, 20);
        (w, a, b)
    }

    #[test]
    fn confirms_only_after_every_event_of_the_transaction() {
        let mut w = AckWatermark::new(Lsn(100));
        let t = w.begin().unwrap();
        w.event_sent(t, 10).unwrap();
        w.event_sent(t, 10).unwrap();
        w.commit(t, Lsn(200)).unwrap();
        assert_eq!(w.confirmed(), Lsn(100));
        w.acked(t, 10).unwrap();
        assert_eq!(w.confirmed(), Lsn(100));
        w.acked(t, 10).unwrap();
        assert_eq!(w.confirmed(), Lsn(200));
        assert!(w.is_idle());
        assert_eq!(w.in_flight_bytes(), 0);
    }

    #[test]
    fn later_transaction_acked_first_waits_for_the_earlier_one() {
        let (mut w, a, b) = two_committed(1);
        w.acked(b, 1).unwrap();
        assert_eq!(w.confirmed(), Lsn(0));
        w.acked(a, 1).unwrap();
        assert_eq!(w.confirmed(), Lsn(20));
    }

    #[test]
    fn out_of_order_acks_stay_counted_until_confirmed() {
        let (mut w, a, b) = two_committed(2);
        let open = w.begin().unwrap();
        w.event_sent(open, 1).unwrap();
        // The open transaction's events never count (it cannot be confirmed before its commit).
        assert_eq!(w.committed_unconfirmed_events(), 3);
        w.acked(b, 1).unwrap();
        w.acked(b, 1).unwrap();
        assert_eq!(
            (w.in_flight_events(), w.committed_unconfirmed_events()),
            (2, 3),
            "acked behind a slower one"
        );
        w.acked(a, 1).unwrap();
        assert_eq!(w.committed_unconfirmed_events(), 0);
        w.commit(open, Lsn(30)).unwrap();
        assert_eq!(w.committed_unconfirmed_events(), 1);
    }

    #[test]
    fn acks_before_commit_do_not_confirm_an_open_transaction() {
        let mut w = AckWatermark::new(Lsn(0));
        let a = w.begin().unwrap();
        w.event_sent(a, 1).unwrap();
        w.acked(a, 1).unwrap();
        assert_eq!(w.confirmed(), Lsn(0));
        w.keepalive(Lsn(500));
        assert_eq!(
            w.confirmed(),
            Lsn(0),
            "keepalive inside an open transaction must not confirm"
        );
        w.commit(a, Lsn(30)).unwrap();
        assert_eq!(w.confirmed(), Lsn(30));
    }

    #[test]
    fn keepalive_confirms_wal_end_when_idle_and_queues_behind_pending() {
        let mut w = AckWatermark::new(Lsn(5));
        w.keepalive(Lsn(50));
        assert_eq!(w.confirmed(), Lsn(50));
        let a = committed(&mut w, 1, 60);
        w.keepalive(Lsn(70));
        w.keepalive(Lsn(80));
        assert_eq!(w.confirmed(), Lsn(50));
        assert_eq!(w.pending.len(), 2, "consecutive keepalives fold into one marker");
        w.acked(a, 1).unwrap();
        assert_eq!(w.confirmed(), Lsn(80));
    }

    #[test]
    fn failure_poisons_everything_after_it() {
        let (mut w, a, b) = two_committed(1);
        w.failed(a, 1).unwrap();
        w.acked(b, 1).unwrap();
        w.keepalive(Lsn(99));
        assert_eq!(w.confirmed(), Lsn(0));
        assert!(w.is_poisoned());
    }

    #[test]
    fn never_goes_backwards() {
        let mut w = AckWatermark::new(Lsn(1000));
        let a = w.begin().unwrap();
        w.commit(a, Lsn(900)).unwrap();
        assert_eq!(w.confirmed(), Lsn(1000));
        w.keepalive(Lsn(10));
        assert_eq!(w.confirmed(), Lsn(1000));
    }

    #[test]
    fn misuse_is_reported_not_ignored() {
        let mut w = AckWatermark::new(Lsn(0));
        assert_eq!(w.acked(TxnTicket(7), 1), Err(WatermarkError::UnknownTicket(7)));
        let a = w.begin().unwrap();
        assert_eq!(w.begin(), Err(WatermarkError::AlreadyOpen));
        assert_eq!(w.acked(a, 1), Err(WatermarkError::NothingOutstanding(a.0)));
    }

    /// One generated transaction: its event count and whether the server sent a keepalive after it.
    #[derive(Debug, Clone)]
    struct GenTxn {
        events: u32,
        keepalive_after: bool,
    }

    fn scenario() -> impl Strategy<Value = (Vec<GenTxn>, Vec<u32>)> {
        prop::collection::vec((0u32..4, any::<bool>()), 1..40).prop_flat_map(|txns| {
            let txns: Vec<GenTxn> = txns
                .into_iter()
                .map(|(events, keepalive_after)| GenTxn {
                    events,
                    keepalive_after,
                })
                .collect();
            let total: u32 = txns.iter().map(|t| t.events).sum();
            // A random permutation of delivery order, expressed as picks from the remaining set.
            let picks = prop::collection::vec(any::<u32>(), total as usize);
            (Just(txns), picks)
        })
    }

    proptest! {
        /// Deliveries complete in random order, interleaved with the stream; after every step the
        /// reported LSN is never past the true safe point, never decreases, and it reaches the end.
        #[test]
        fn reported_lsn_never_passes_the_safe_point((txns, picks) in scenario(), stream_ahead in 1usize..10) {
            let mut w = AckWatermark::new(Lsn(0));
            // (ticket, txn index) of events handed to the sink but not yet acknowledged.
            let mut in_flight: Vec<(TxnTicket, usize)> = Vec::new();
            let mut acked_per_txn = vec![0u32; txns.len()];
            let mut committed = 0usize;
            let mut picks = picks.into_iter();
            let mut last = Lsn(0);
            let end_lsn = |i: usize| Lsn(100 * (i as u64 + 1));
            let keepalive_lsn = |i: usize| Lsn(100 * (i as u64 + 1) + 50);

            let true_safe = |acked: &[u32], committed: usize, keepalives_seen: &dyn Fn(usize) -> bool| {
                let mut safe = Lsn(0);
                for (i, t) in txns.iter().enumerate().take(committed) {
                    if acked[i] < t.events { break; }
                    safe = end_lsn(i);
                    if keepalives_seen(i) && t.keepalive_after { safe = keepalive_lsn(i); }
                }
                safe
            };

            loop {
                // Stream a few transactions ahead, then deliver one event.
                let mut streamed = 0;
                while committed < txns.len() && streamed < stream_ahead {
                    let t = w.begin().unwrap();
                    for _ in 0..txns[committed].events {
                        w.event_sent(t, 8).unwrap();
                        in_flight.push((t, committed));
                    }
                    w.commit(t, end_lsn(committed)).unwrap();
                    if txns[committed].keepalive_after {
                        w.keepalive(keepalive_lsn(committed));
                    }
                    committed += 1;
                    streamed += 1;
                }
                let c = committed;
                let safe = true_safe(&acked_per_txn, committed, &|i| i < c);
                prop_assert!(w.confirmed() <= safe, "confirmed {} past safe {}", w.confirmed(), safe);
                prop_assert!(w.confirmed() >= last);
                last = w.confirmed();
                if in_flight.is_empty() {
                    if committed == txns.len() { break; }
                    continue;
                }
                let pick = picks.next().unwrap_or(0) as usize % in_flight.len();
                let (ticket, idx) = in_flight.swap_remove(pick);
                w.acked(ticket, 8).unwrap();
                acked_per_txn[idx] += 1;
                let safe = true_safe(&acked_per_txn, committed, &|i| i < c);
                prop_assert!(w.confirmed() <= safe, "confirmed {} past safe {}", w.confirmed(), safe);
                prop_assert!(w.confirmed() >= last);
                last = w.confirmed();
            }
            // Everything acknowledged: the watermark reached the last transaction (or its keepalive).
            let n = txns.len() - 1;
            let expected = if txns[n].keepalive_after { keepalive_lsn(n) } else { end_lsn(n) };
            prop_assert_eq!(w.confirmed(), expected);
            prop_assert!(w.is_idle());
            prop_assert_eq!(w.in_flight_events(), 0);
        }
    }
}
