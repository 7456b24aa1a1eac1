//! Seconds behind the source: how old the oldest event not yet confirmed to PostgreSQL is.
//!
//! Defined as now minus the commit time of the oldest transaction that carried outbox events
//! and is not yet confirmed; 0 when every such transaction is confirmed. Under steady load that
//! equals "now minus the commit time of the last confirmed transaction" (the next one is the
//! oldest unconfirmed), but it does not jump to hours after an idle night, and it keeps growing
//! while the sink is down, which is what an operator alerting on it wants.
//!
//! Only transactions with events are recorded (one entry each, when their first event is
//! sent), so the queue is bounded like the watermark's list of pending transactions.

use std::collections::VecDeque;

use crate::ops::metrics::seconds_since;
use crate::postgres::lsn::Lsn;

#[derive(Debug, Default)]
pub(crate) struct CommitLag {
    /// (commit LSN, commit time µs) of unconfirmed transactions with events, in commit order.
    pending: VecDeque<(Lsn, i64)>,
    /// Commit time (µs) of the latest confirmed transaction that carried events: every event
    /// committed up to then is in the sink (the recovery point of docs/operations.md).
    last_confirmed_unix_us: Option<i64>,
}

impl CommitLag {
    /// An event of the transaction committed at `commit_lsn` was sent.
    pub(crate) fn event_sent(&mut self, commit_lsn: Lsn, commit_unix_us: i64) {
        if self.pending.back().is_none_or(|(lsn, _)| *lsn != commit_lsn) {
            self.pending.push_back((commit_lsn, commit_unix_us));
        }
    }

    /// Forgets transactions below `confirmed` and returns the seconds behind at `now_unix_us`.
    ///
    /// A confirmed position is always the end of a transaction (or a keepalive position with
    /// nothing pending), so "commit record starts before it" means "confirmed".
    pub(crate) fn seconds_behind(&mut self, confirmed: Lsn, now_unix_us: i64) -> f64 {
        while self.pending.front().is_some_and(|(lsn, _)| *lsn < confirmed) {
            self.last_confirmed_unix_us = self.pending.pop_front().map(|(_, t)| t);
        }
        self.pending
            .front()
            .map_or(0.0, |(_, t)| seconds_since(*t, now_unix_us))
    }
}

impl CommitLag {
    /// See [`CommitLag::last_confirmed_unix_us`] (updated by [`CommitLag::seconds_behind`]).
    pub(crate) fn last_confirmed_unix_us(&self) -> Option<i64> {
        self.last_confirmed_unix_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_oldest_unconfirmed_transaction() {
        let mut lag = CommitLag::default();
        assert_eq!(lag.seconds_behind(Lsn(0), 50_000_000), 0.0, "nothing pending");
        lag.event_sent(Lsn(100), 10_000_000);
        lag.event_sent(Lsn(100), 10_000_000); // second event, same transaction
        lag.event_sent(Lsn(200), 12_000_000);
        assert_eq!(lag.pending.len(), 2);
        assert_eq!(lag.seconds_behind(Lsn(50), 20_000_000), 10.0);
        // The first transaction ends at 150: confirmed.
        assert_eq!(lag.seconds_behind(Lsn(150), 20_000_000), 8.0);
        assert_eq!(lag.last_confirmed_unix_us(), Some(10_000_000));
        assert_eq!(lag.seconds_behind(Lsn(250), 20_000_000), 0.0);
        assert!(lag.pending.is_empty());
    }
}
