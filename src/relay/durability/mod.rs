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
//! stream_opened(xid, at)           a streamed transaction's first block: nothing past `at` …
//! stream_committed(xid, end_lsn)   … until its commit was confirmed (or it aborted:
//! stream_aborted(xid))
//! next_status(reply) -> update     the next standby status update (flush never goes backwards)
//! ```
//!
//! Invariant: the flush LSN sent to PostgreSQL is the end LSN of the latest transaction T such
//! that every outbox record of T and of every earlier transaction was acknowledged by the sink,
//! never past the floor of the oldest hold (a sink unit that may still abort: the transactions
//! guarantee, `guarantee/transactions.rs`), never past the start of a streamed transaction
//! (protocol 2) that is not both committed and confirmed, and never below what was reported
//! before.
//!
//! Why the streamed cap: a transaction the server streams before its commit is re-sent whole
//! after any restart whatever the relay confirmed (its commit lies past every confirmed
//! position), but the server decodes the WAL below the slot's confirmed position without
//! streaming, spilling to its own disk what it cannot hold. Confirming no further than the
//! oldest open streamed transaction keeps a restart streaming it again, nothing spilled.
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
    /// The streamed transactions not confirmed yet: where each was first seen, and where it
    /// ends once committed (see the module docs).
    streams: Vec<OpenStream>,
}

#[derive(Debug, Clone, Copy)]
struct OpenStream {
    xid: u32,
    start: Lsn,
    /// Its commit's end, once committed: the cap goes when the watermark passed it.
    end: Option<Lsn>,
}

impl Durability {
    /// Starts at `start`, the slot's confirmed position (already safe and reported).
    pub(crate) fn new(start: Lsn) -> Durability {
        Durability {
            watermark: AckWatermark::new(start),
            holds: VecDeque::new(),
            confirm: Confirm::new(start),
            received: start,
            streams: Vec::new(),
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

    /// The streamed transaction `xid` was first seen at `at` (its first block): nothing past
    /// `at` is confirmed until it committed and was confirmed, or aborted.
    pub(crate) fn stream_opened(&mut self, xid: u32, at: Lsn) {
        if self.streams.iter().all(|s| s.xid != xid) {
            self.streams.push(OpenStream {
                xid,
                start: at,
                end: None,
            });
        }
    }

    /// The streamed transaction `xid` committed at `end_lsn` and was handed on like any
    /// committed transaction: its cap goes once the watermark passed `end_lsn`.
    pub(crate) fn stream_committed(&mut self, xid: u32, end_lsn: Lsn) {
        for s in self.streams.iter_mut().filter(|s| s.xid == xid) {
            s.end = Some(end_lsn);
        }
    }

    /// The streamed transaction `xid` aborted: nothing of it is ever confirmed or needed.
    pub(crate) fn stream_aborted(&mut self, xid: u32) {
        self.streams.retain(|s| s.xid != xid);
    }

    /// The watermark, capped by the oldest hold and the oldest open streamed transaction: what
    /// is durable now.
    fn durable(&self) -> Lsn {
        let watermark = self.watermark.confirmed();
        let streamed = self
            .streams
            .iter()
            .filter(|s| s.end.is_none_or(|end| end > watermark))
            .map(|s| s.start)
            .min();
        [Some(watermark), self.holds.front().copied(), streamed]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(watermark)
    }

    /// Forgets the streamed transactions the watermark has passed.
    fn forget_confirmed_streams(&mut self) {
        let watermark = self.watermark.confirmed();
        self.streams.retain(|s| s.end.is_none_or(|end| end > watermark));
    }

    /// The next standby status update (recorded as reported); `reply_requested` makes the
    /// walsender answer at once.
    pub(crate) fn next_status(&mut self, reply_requested: bool) -> StandbyStatusUpdate {
        self.forget_confirmed_streams();
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
    fn an_open_streamed_transaction_caps_confirmation_until_its_commit_is_confirmed() {
        let mut d = Durability::new(Lsn(0x10));
        d.keepalive(Lsn(0x100));
        assert_eq!(d.confirmed(), Lsn(0x100));
        d.stream_opened(7, Lsn(0x200));
        d.stream_opened(8, Lsn(0x300));
        // Keepalives while they stream move nothing past the oldest one's start.
        d.keepalive(Lsn(0x400));
        assert_eq!(d.next_status(false).flush, Lsn(0x200));
        d.stream_aborted(7);
        assert_eq!(d.next_status(false).flush, Lsn(0x300));
        // Committed, handed on, not acknowledged: still capped.
        let t = d.begin().unwrap();
        d.sent(t, 1).unwrap();
        d.commit(t, Lsn(0x510)).unwrap();
        d.stream_committed(8, Lsn(0x510));
        assert_eq!(d.next_status(false).flush, Lsn(0x300));
        d.acknowledged(t, 1).unwrap();
        assert_eq!(d.next_status(false).flush, Lsn(0x510));
        assert!(d.streams.is_empty(), "a confirmed streamed transaction is forgotten");
        // A cap below what was reported never takes the flush LSN back.
        d.stream_opened(9, Lsn(0x20));
        assert_eq!(d.next_status(false).flush, Lsn(0x510));
    }

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
