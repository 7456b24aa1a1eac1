//! Step 5, confirm: the flush LSN reported to PostgreSQL.
//!
//! [`Confirm`] turns the durable position [`super::Durability`] hands it into the next standby
//! status update. Its rules:
//! - flush = the durable position (every event at or before it is in the sink, and no sink
//!   transaction that may still abort covers it);
//! - reported positions never go backwards (a reconnect may briefly hold an older watermark);
//! - `write` is what was received, never below flush.
//!
//! When an update goes out (every `relay.status_interval_ms`, when the server asks, and as soon
//! as acknowledgements moved the watermark) is the event loop's business (`session.rs`).
//! PostgreSQL then sets the slot's `confirmed_flush_lsn`: WAL before it may be recycled, and a
//! restart resumes there. Private to `durability`: nothing else can make a flush LSN.

use tracing::debug;

use crate::postgres::lsn::Lsn;
use crate::postgres::replication::frames::{now_pg_timestamp, StandbyStatusUpdate};

/// The last flush LSN sent, and the rule for the next.
#[derive(Debug)]
pub(super) struct Confirm {
    reported: Lsn,
}

impl Confirm {
    /// Starts at the slot's confirmed position (what the server already has).
    pub(super) fn new(start: Lsn) -> Confirm {
        Confirm { reported: start }
    }

    /// Everything confirmed so far: `durable`, or what was already reported if higher.
    pub(super) fn confirmed(&self, durable: Lsn) -> Lsn {
        self.reported.max(durable)
    }

    /// Whether `durable` moved past the last reported position (an update would release WAL
    /// and shrink what a crash replays).
    pub(super) fn has_unreported(&self, durable: Lsn) -> bool {
        durable > self.reported
    }

    /// The next update, recorded as reported.
    pub(super) fn next_update(&mut self, durable: Lsn, received: Lsn, reply_requested: bool) -> StandbyStatusUpdate {
        let flush = self.confirmed(durable);
        if flush > self.reported {
            debug!(flush = %flush, "confirming");
        }
        self.reported = flush;
        StandbyStatusUpdate {
            write: received.max(flush),
            flush,
            apply: flush,
            client_time: now_pg_timestamp(),
            reply_requested,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_follows_the_durable_position_and_never_goes_back() {
        let mut confirm = Confirm::new(Lsn(100));
        // A durable position below the slot's (e.g. after a reconnect) reports 100.
        assert!(!confirm.has_unreported(Lsn(50)));
        let u = confirm.next_update(Lsn(50), Lsn(60), false);
        assert_eq!((u.write, u.flush, u.apply), (Lsn(100), Lsn(100), Lsn(100)));
        assert!(confirm.has_unreported(Lsn(300)));
        let u = confirm.next_update(Lsn(300), Lsn(300), true);
        assert_eq!((u.write, u.flush), (Lsn(300), Lsn(300)));
        assert!(u.reply_requested);
        assert!(!confirm.has_unreported(Lsn(300)));
        // An older position cannot pull it back.
        assert_eq!(confirm.next_update(Lsn(200), Lsn(250), false).flush, Lsn(300));
        assert_eq!(confirm.confirmed(Lsn(200)), Lsn(300));
    }
}
