//! What the stream reports about itself: counters and metrics per record, and a snapshot per
//! status interval. The publish step reports each record it sends and each delivery report
//! ([`Progress::sent`], [`Progress::delivered`]); the event loop takes the snapshot.

use super::durability::Durability;
use super::lag::CommitLag;
use super::publish::DeliveryTag;
use crate::ops::metrics::{now_unix_us, SessionMetrics, StreamSnapshot, TopicId};
use crate::postgres::lsn::Lsn;

/// Counters for logs (and, later, metrics).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SessionCounts {
    pub(crate) transactions: u64,
    pub(crate) events_sent: u64,
    pub(crate) events_acked: u64,
    /// Events handled by `relay.on_bad_event`.
    pub(crate) bad_events: u64,
}

/// One session's counters, per-topic metrics and commit lag.
#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) counts: SessionCounts,
    /// Per-topic counters and the commit-to-ack histogram.
    metrics: SessionMetrics,
    lag: CommitLag,
}

impl Progress {
    /// The id a delivery tag of an event routed to `topic` carries (nothing counted yet).
    pub(crate) fn topic(&mut self, topic: &str) -> TopicId {
        self.metrics.topic(topic)
    }

    /// An event of the transaction committed at `commit_lsn`, routed to `topic`, was handed to
    /// the sink (taken or refused, not waiting for room): counted, and its commit time kept
    /// for the lag.
    pub(crate) fn sent(&mut self, topic: TopicId, commit_lsn: Lsn, commit_unix_us: i64) {
        self.lag.event_sent(commit_lsn, commit_unix_us);
        self.metrics.received(topic);
    }

    /// A record of a transaction not committed yet was handed to the sink (`early.rs`): counted
    /// as received; the lag bookkeeping learns the transaction at its commit.
    pub(crate) fn sent_early(&mut self, topic: TopicId) {
        self.metrics.received(topic);
    }

    /// The delivery report of a record sent early: the per-topic counters only.
    pub(crate) fn delivered_early(&mut self, topic: TopicId, delivered: bool) {
        if delivered {
            self.metrics.published_early(topic);
        } else {
            self.metrics.failed(topic);
        }
    }

    /// One delivery report, for the per-topic counters and the commit-to-ack histogram.
    pub(crate) fn delivered(&mut self, tag: &DeliveryTag, delivered: bool) {
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
    pub(crate) fn snapshot(&mut self, durability: &Durability, now_unix_us: i64) -> StreamSnapshot {
        let flushed = durability.confirmed();
        StreamSnapshot {
            in_flight_events: durability.in_flight_events(),
            in_flight_bytes: durability.in_flight_bytes(),
            seconds_behind: self.lag.seconds_behind(flushed, now_unix_us),
            received_lsn: durability.received().0,
            flushed_lsn: flushed.0,
            last_confirmed_commit_unix_us: self.lag.last_confirmed_unix_us(),
            ..StreamSnapshot::default()
        }
    }
}
