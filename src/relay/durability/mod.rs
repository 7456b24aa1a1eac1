//! The durability contract, as one type: [`Durability`] alone owns the acknowledged-prefix
//! watermark (`watermark.rs`), the seal cap and the confirm step (`confirm.rs`), and it is the
//! only way to a flush LSN.
//!
//! ```text
//! begin() -> TxnTicket             a transaction's Begin
//! sent(ticket, bytes)              one of its records handed to the sink
//! acknowledged(ticket, bytes)      the sink stored it
//! failed(ticket, bytes)            the sink finally failed it: nothing at or after it is confirmed
//! commit(ticket, end_lsn)          its Commit (all its records were handed over)
//! keepalive(wal_end)               the server streamed everything before wal_end
//! hold(floor) / release()          the seal cap: nothing past floor until the hold is released
//! next_status(reply) -> update     the next standby status update (flush never goes backwards)
//! ```
//!
//! Invariant: the flush LSN sent to PostgreSQL is the end LSN of the latest transaction T such
//! that every outbox record of T and of every earlier transaction was acknowledged by the sink,
//! never past the floor of the oldest hold (a sink unit that may still abort: the transactions
//! guarantee, `guarantee/transactions.rs`), and never below what was reported before.
//!
//! The watermark and the confirm step are private submodules: no other code can advance or
//! report a position except through this API.

mod confirm;
mod watermark;

use std::collections::VecDeque;

use crate::postgres::lsn::Lsn;
use crate::postgres::replication::frames::StandbyStatusUpdate;

use confirm::Confirm;
use watermark::AckWatermark;
pub(crate) use watermark::{TxnTicket, WatermarkError};

/// What the stream may confirm, and what it has told PostgreSQL.
#[derive(Debug)]
pub(crate) struct Durability {
    watermark: AckWatermark,
    /// The floors of the sink units not yet sealed, oldest first: nothing past the front is
    /// confirmed. A failed seal leaves its hold for good (the session ends).
    holds: VecDeque<Lsn>,
    confirm: Confirm,
    /// How far the stream has read (the status update's write position).
    received: Lsn,
}

impl Durability {
    /// Starts at `start`, the slot's confirmed position (already safe and reported).
    pub(crate) fn new(start: Lsn) -> Durability {
        Durability {
            watermark: AckWatermark::new(start),
            holds: VecDeque::new(),
            confirm: Confirm::new(start),
            received: start,
        }
    }

    /// A transaction's Begin.
    pub(crate) fn begin(&mut self) -> Result<TxnTicket, WatermarkError> {
        self.watermark.begin()
    }

    /// One record of `ticket`'s transaction was handed to the sink.
    pub(crate) fn sent(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        self.watermark.event_sent(ticket, bytes)
    }

    /// The sink acknowledged one record of `ticket`'s transaction.
    pub(crate) fn acknowledged(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        self.watermark.acked(ticket, bytes)
    }

    /// The sink finally failed one record: its transaction, and everything after it, is never
    /// confirmed by this session.
    pub(crate) fn failed(&mut self, ticket: TxnTicket, bytes: usize) -> Result<(), WatermarkError> {
        self.watermark.failed(ticket, bytes)
    }

    /// The open transaction's Commit: every record of it was handed over.
    pub(crate) fn commit(&mut self, ticket: TxnTicket, end_lsn: Lsn) -> Result<(), WatermarkError> {
        self.watermark.commit(ticket, end_lsn)?;
        self.received = self.received.max(end_lsn);
        Ok(())
    }

    /// The server streamed everything before `wal_end`.
    pub(crate) fn keepalive(&mut self, wal_end: Lsn) {
        self.received = self.received.max(wal_end);
        self.watermark.keepalive(wal_end);
    }

    /// Caps confirmation at `floor` until the matching [`release`](Self::release): a sink
    /// unit opened whose records may still be withdrawn.
    pub(crate) fn hold(&mut self, floor: Lsn) {
        self.holds.push_back(floor);
    }

    /// The oldest hold's unit was sealed: confirmation may pass its floor.
    pub(crate) fn release(&mut self) {
        self.holds.pop_front();
    }

    /// The watermark, capped by the oldest hold: what is durable now.
    fn durable(&self) -> Lsn {
        match self.holds.front() {
            Some(&floor) => self.watermark.confirmed().min(floor),
            None => self.watermark.confirmed(),
        }
    }

    /// The next standby status update (recorded as reported); `reply_requested` makes the
    /// walsender answer at once.
    pub(crate) fn next_status(&mut self, reply_requested: bool) -> StandbyStatusUpdate {
        self.confirm.next_update(self.durable(), self.received, reply_requested)
    }

    /// Whether acknowledgements moved the durable position past what PostgreSQL was told.
    pub(crate) fn has_unreported(&self) -> bool {
        self.confirm.has_unreported(self.durable())
    }

    /// Everything confirmed: the durable position, or what was reported if higher.
    pub(crate) fn confirmed(&self) -> Lsn {
        self.confirm.confirmed(self.durable())
    }

    /// How far the stream has read.
    pub(crate) fn received(&self) -> Lsn {
        self.received
    }

    /// Records handed to the sink and not yet acknowledged or failed.
    pub(crate) fn in_flight_events(&self) -> usize {
        self.watermark.in_flight_events()
    }

    /// Their bytes ([`crate::sink::SinkRecord::size`]).
    pub(crate) fn in_flight_bytes(&self) -> usize {
        self.watermark.in_flight_bytes()
    }

    /// Records of committed transactions the watermark has not passed, acknowledged or not:
    /// what a crash now would replay besides the open transaction.
    pub(crate) fn committed_unconfirmed_events(&self) -> usize {
        self.watermark.committed_unconfirmed_events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_lsn_follows_whole_acknowledged_transactions_and_never_goes_back() {
        let mut d = Durability::new(Lsn(0x10));
        let t = d.begin().unwrap();
        d.sent(t, 5).unwrap();
        d.commit(t, Lsn(0x110)).unwrap();
        assert_eq!((d.confirmed(), d.received()), (Lsn(0x10), Lsn(0x110)));
        assert!(!d.has_unreported());
        d.acknowledged(t, 5).unwrap();
        assert!(d.has_unreported());
        let status = d.next_status(false);
        assert_eq!((status.write, status.flush), (Lsn(0x110), Lsn(0x110)));
        assert!(!d.has_unreported());
        // A failed record poisons its transaction and every later one.
        let t = d.begin().unwrap();
        d.sent(t, 5).unwrap();
        d.commit(t, Lsn(0x210)).unwrap();
        d.failed(t, 5).unwrap();
        d.keepalive(Lsn(0x300));
        assert_eq!(d.next_status(false).flush, Lsn(0x110));
        assert_eq!(d.received(), Lsn(0x300));
    }

    #[test]
    fn a_hold_caps_confirmation_at_its_floor_until_released() {
        let mut d = Durability::new(Lsn(0x10));
        d.hold(Lsn(0x100));
        let t = d.begin().unwrap();
        d.sent(t, 1).unwrap();
        d.commit(t, Lsn(0x210)).unwrap();
        d.acknowledged(t, 1).unwrap();
        assert_eq!(
            d.confirmed(),
            Lsn(0x100),
            "acknowledged inside a unit that may abort: its floor"
        );
        assert_eq!(d.committed_unconfirmed_events(), 0, "the watermark itself passed it");
        // A second unit opened while the first is being sealed: the older floor holds.
        d.hold(Lsn(0x200));
        d.keepalive(Lsn(0x400));
        assert_eq!(d.next_status(false).flush, Lsn(0x100));
        d.release();
        assert_eq!(d.confirmed(), Lsn(0x200));
        d.release();
        assert_eq!(d.next_status(false).flush, Lsn(0x400));
        // Never backwards: a later hold below what was reported changes nothing reported.
        d.hold(Lsn(0x300));
        assert_eq!(d.confirmed(), Lsn(0x400));
    }
}
