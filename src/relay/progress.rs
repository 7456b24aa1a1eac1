//! What the stream reports about itself: metrics per event and per status interval.
//!
//! Kept out of the steps' files: the hooks there are one call each
//! (`count_sent`, `count_delivery`), and everything they need lives here.

use super::stream::{DeliveryTag, StreamState};
use crate::config::Settings;
use crate::ops::metrics::{now_unix_us, StreamSnapshot, TopicId};
use crate::postgres::lsn::Lsn;

impl<'s> StreamState<'s> {
    /// The configuration this session runs with (for the event loop's own timers).
    pub(crate) fn settings(&self) -> &'s Settings {
        self.settings
    }

    /// An event of the transaction committed at `commit_lsn` was routed to `topic` and handed
    /// to Kafka: counts it, remembers its commit time for the lag, and returns the topic id its
    /// delivery tag must carry.
    pub(super) fn count_sent(&mut self, topic: &str, commit_lsn: Lsn, commit_unix_us: i64) -> TopicId {
        self.lag.event_sent(commit_lsn, commit_unix_us);
        self.metrics.received(topic)
    }

    /// One delivery report, for the per-topic counters and the commit-to-ack histogram.
    pub(super) fn count_delivery(&mut self, tag: &DeliveryTag, delivered: bool) {
        if delivered {
            self.metrics
                .published(tag.topic, tag.commit_time_unix_us, now_unix_us());
        } else {
            self.metrics.failed(tag.topic);
        }
    }

    /// Folds this batch of acknowledgements' exact latencies into `GET /latency`'s window.
    pub(crate) fn fold_latency(&mut self) {
        self.metrics.fold_latency();
    }

    /// Where the stream stands, once per status interval (also drops confirmed transactions
    /// from the lag bookkeeping).
    pub(crate) fn progress(&mut self, now_unix_us: i64) -> StreamSnapshot {
        let flushed = self.confirmed();
        StreamSnapshot {
            in_flight_events: self.watermark.in_flight_events(),
            in_flight_bytes: self.watermark.in_flight_bytes(),
            seconds_behind: self.lag.seconds_behind(flushed, now_unix_us),
            received_lsn: self.received.0,
            flushed_lsn: flushed.0,
            last_confirmed_commit_unix_us: self.lag.last_confirmed_unix_us(),
        }
    }
}
