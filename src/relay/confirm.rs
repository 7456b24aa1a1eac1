//! Step 5, confirm: the flush LSN reported to PostgreSQL.
//!
//! [`Confirm`] is the only producer of the standby status update's flush position. Its rules:
//! - flush = the watermark's confirmed LSN (every event at or before it is in Kafka);
//! - reported positions never go backwards (a reconnect may briefly hold an older watermark);
//! - an update goes out every `relay.status_interval_ms` (the walsender drops a silent client
//!   after `wal_sender_timeout`), when the server asks, and as soon as acknowledgements moved the
//!   watermark (what a crash replays stays within the in-flight budget).
//!
//! PostgreSQL then sets the slot's `confirmed_flush_lsn`: WAL before it may be recycled, and a
//! restart resumes there.

use tracing::debug;

use super::error::RelayError;
use super::watermark::AckWatermark;
use crate::postgres::lsn::Lsn;
use crate::postgres::replication::connection::StatusWriter;
use crate::postgres::replication::frames::{now_pg_timestamp, StandbyStatusUpdate};

/// The last flush LSN sent, and the rule for the next.
#[derive(Debug)]
pub(crate) struct Confirm {
    reported: Lsn,
}

impl Confirm {
    /// Starts at the slot's confirmed position (what the server already has).
    pub(crate) fn new(start: Lsn) -> Confirm {
        Confirm { reported: start }
    }

    /// Everything confirmed so far: the watermark (never past `limit`, the floor of the oldest
    /// broker transaction not yet committed: `seal.rs`), or what was already reported if higher.
    pub(crate) fn confirmed(&self, watermark: &AckWatermark, limit: Option<Lsn>) -> Lsn {
        self.reported.max(Self::durable(watermark, limit))
    }

    fn durable(watermark: &AckWatermark, limit: Option<Lsn>) -> Lsn {
        match limit {
            Some(limit) => watermark.confirmed().min(limit),
            None => watermark.confirmed(),
        }
    }

    /// Whether the watermark moved past the last reported position (an update would release
    /// WAL and shrink what a crash replays).
    pub(crate) fn has_unreported(&self, watermark: &AckWatermark, limit: Option<Lsn>) -> bool {
        Self::durable(watermark, limit) > self.reported
    }

    /// The next update, recorded as reported. `write` is what was received (never below flush).
    pub(crate) fn next_update(
        &mut self,
        watermark: &AckWatermark,
        limit: Option<Lsn>,
        received: Lsn,
        reply_requested: bool,
    ) -> StandbyStatusUpdate {
        let flush = self.confirmed(watermark, limit);
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

    /// Sends the next update on `writer`.
    pub(crate) async fn send(
        &mut self,
        watermark: &AckWatermark,
        limit: Option<Lsn>,
        received: Lsn,
        writer: &mut StatusWriter,
        reply_requested: bool,
    ) -> Result<(), RelayError> {
        let update = self.next_update(watermark, limit, received, reply_requested);
        writer.send_copy_data(|out| update.encode(out)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_follows_the_watermark_and_never_goes_back() {
        let mut confirm = Confirm::new(Lsn(100));
        // A fresh watermark below the slot's position (e.g. after a reconnect) reports 100.
        let mut low = AckWatermark::new(Lsn(50));
        assert!(!confirm.has_unreported(&low, None));
        let u = confirm.next_update(&low, None, Lsn(60), false);
        assert_eq!((u.write, u.flush, u.apply), (Lsn(100), Lsn(100), Lsn(100)));
        // Idle keepalive: wal_end is confirmed and reported.
        low.keepalive(Lsn(300));
        assert!(confirm.has_unreported(&low, None));
        let u = confirm.next_update(&low, None, Lsn(300), true);
        assert_eq!((u.write, u.flush), (Lsn(300), Lsn(300)));
        assert!(u.reply_requested);
        assert!(!confirm.has_unreported(&low, None));
        // An older watermark cannot pull it back.
        let older = AckWatermark::new(Lsn(200));
        assert_eq!(confirm.next_update(&older, None, Lsn(250), false).flush, Lsn(300));
        assert_eq!(confirm.confirmed(&older, None), Lsn(300));
    }
}
