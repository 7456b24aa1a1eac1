//! Exactly-once where the broker deduplicates (NATS JetStream's `Nats-Msg-Id`, the Redis sink's
//! dedup script, SQS and SNS FIFO deduplication ids): every record carries a deduplication key
//! made of its position (`<source>/<commit LSN>/<index>`), so a replayed record is dropped by the
//! broker within its deduplication window. Nothing is read back and nothing waits; the records
//! also carry their position headers (`position.rs`).
//!
//! The replay window (the slot's confirmed position up to the server's WAL position once the slot
//! was the session's) is only reported: once the stream got past it, the log says the window
//! went out with deduplication keys.

use tracing::info;

use super::window::ReplayWindow;
use super::{position, Guarantee, Stamp, Start};
use crate::config::Settings;
use crate::postgres::lsn::Lsn;
use crate::relay::error::RelayError;
use crate::relay::quarantine::EventRef;

pub(super) struct BrokerDedup {
    /// [`position::HEADER_SOURCE`]'s value.
    source: String,
    window: ReplayWindow,
}

impl BrokerDedup {
    pub(super) async fn start(settings: &Settings, at: &Start<'_>) -> Result<BrokerDedup, RelayError> {
        let window = ReplayWindow::start(at.control, at.slot_start).await?;
        Ok(BrokerDedup::new(settings, at.system_id, window))
    }

    pub(super) fn new(settings: &Settings, system_id: &str, window: ReplayWindow) -> BrokerDedup {
        BrokerDedup {
            source: position::source(settings, system_id),
            window,
        }
    }

    fn log_window(&self) {
        info!(
            replay_from = %self.window.start,
            replay_to = %self.window.end,
            source = %self.source,
            "exactly-once: the replay window went out with deduplication keys; the broker dropped what it held"
        );
    }
}

impl Guarantee for BrokerDedup {
    fn label(&self) -> &'static str {
        "exactly-once (broker deduplication)"
    }

    fn reached(&mut self, lsn: Lsn) {
        if self.window.reached(lsn) {
            self.log_window();
        }
    }

    fn stamp<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> Stamp<'b> {
        Stamp {
            dedup_key: Some(format!("{}/{}/{}", self.source, at.commit_lsn, at.seq)),
            headers: Some(position::headers(&self.source, at, buf)),
        }
    }

    fn finish(mut self: Box<Self>) {
        if self.window.close() {
            self.log_window();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    #[test]
    fn every_record_carries_its_position_as_the_deduplication_key() {
        let s = settings("[relay]\ndelivery = \"exactly-once\"\n");
        let g = BrokerDedup::new(&s, "7000", ReplayWindow::new(Lsn(0x100), Lsn(0x1000)));
        let mut buf = [0u8; 40];
        let at = EventRef {
            commit_lsn: Lsn(0x200),
            seq: 3,
        };
        let stamp = g.stamp(at, &mut buf);
        assert_eq!(stamp.dedup_key.as_deref(), Some("7000/outbox_relay/0/200/3"));
        assert_eq!(stamp.headers.map(|h| h[2].1.to_vec()), Some(b"3".to_vec()));
    }
}
