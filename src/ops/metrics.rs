//! Prometheus metrics: every metric name the relay exports, in one place.
//!
//! Other code (and tests, and dashboards) refer to these constants, never to string literals.
//! Metrics go through the `metrics` facade; `outbox-relay run` installs the Prometheus recorder
//! only when `[http] listen` is set (see `src/ops/http.rs`), otherwise every update is a no-op.
//!
//! Hot-path rule: nothing per event allocates. Per-topic counters are registered once per topic
//! and session in a [`TopicMetrics`] table; each event carries the table index
//! ([`TopicId`]) in its delivery tag, so an acknowledgement costs one atomic add.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `outbox_relay_events_received_total{topic}` | counter | outbox inserts decoded and routed to `topic` |
//! | `outbox_relay_events_published_total{topic}` | counter | events the broker acknowledged (replays count again) |
//! | `outbox_relay_events_failed_total{topic}` | counter | events the broker finally refused (the session then replays) |
//! | `outbox_relay_in_flight_events` | gauge | events handed to the sink and not yet acknowledged |
//! | `outbox_relay_in_flight_bytes` | gauge | their bytes (keys + values + headers) |
//! | `outbox_relay_commit_to_ack_seconds` | histogram | PostgreSQL commit time to the sink's acknowledgement |
//! | `outbox_relay_seconds_behind_source` | gauge | age of the oldest received, unconfirmed transaction's commit (0 when caught up) |
//! | `outbox_relay_received_lsn` | gauge | highest WAL position received from the server |
//! | `outbox_relay_flushed_lsn` | gauge | WAL position confirmed to the server (everything before it is in the sink) |
//! | `outbox_relay_slot_retained_wal_bytes` | gauge | WAL the server keeps for the slot (current LSN − `restart_lsn`) |
//! | `outbox_relay_reconnects_total` | counter | sessions restarted after a transient error |
//! | `outbox_relay_active` | gauge | 1 while this instance streams, 0 while it stands by or reconnects |
//! | `outbox_relay_last_confirmed_commit_timestamp_seconds` | gauge | commit time (Unix seconds) of the latest transaction with events confirmed to the server: every event committed up to then is in the sink (the recovery point after losing the slot) |
//! | `outbox_relay_slot_failover_ready` | gauge | 1 when the slot would survive a promotion: a failover slot, `synchronized_standby_slots` set and each slot it names streaming; else 0. PostgreSQL 17+ only: not exported where the server has no failover slots (14–16) |
//! | `outbox_relay_bad_events_total{policy,cause}` | counter | events `relay.on_bad_event` handled (`policy`: fail, skip, dead-letter; `cause`: see `BadEvent::label`) |
//! | `outbox_relay_events_skipped_in_sink_total` | counter | exactly-once: replayed events not sent because the sink already held them (the old name, `outbox_relay_events_skipped_in_kafka_total`, is exported beside it until the next release) |
//! | `outbox_relay_partitions_read_back_total` | counter | exactly-once: partition tails read back (once per partition and streaming session, replay window only) |
//! | `outbox_relay_read_back_seconds` | histogram | exactly-once: time to read back one partition's tail (metadata included) |
//! | `outbox_relay_pending_rows` | gauge | `poll` mode: outbox rows not yet dispatched, counted by the watchdog every `poll.watchdog_interval_ms` |
//! | `outbox_relay_oldest_pending_age_seconds` | gauge | `poll` mode: how long the oldest pending row has waited (by its creation-time column; 0 when none) |
//! | `outbox_relay_retention_rows_removed_total{table}` | counter | `[retention]`: published rows removed (partitions mode: the dropped partitions' row estimates) |
//! | `outbox_relay_retention_partitions_created_total{table}` | counter | `[retention]` partitions mode: partitions created ahead |
//! | `outbox_relay_retention_partitions_dropped_total{table}` | counter | `[retention]` partitions mode: expired partitions detached and dropped |
//! | `outbox_relay_retention_errors_total{table,kind}` | counter | `[retention]`: failed runs (`kind`: transient, retried next interval; fatal, retention stopped for the table) |
//! | `outbox_relay_retention_last_run_timestamp_seconds{table}` | gauge | `[retention]`: Unix time of the last successful run on this instance |
//! | `outbox_relay_retention_paused{table}` | gauge | `[retention]` streaming: 1 while the slot is missing, invalidated or held by no relay (nothing is removed) |
//! | `outbox_relay_events_filtered_total` | counter | events `[filter]` kept from the sink (their WAL position is confirmed like a published event's; rows a PostgreSQL 15+ publication's row filter drops are never decoded, so never counted) |
//! | `outbox_relay_traceparent_invalid_total` | counter | events whose `outbox.trace_column` held a value that is no W3C `traceparent` (published untouched all the same) |
//! | `outbox_relay_spans_exported_total` | counter | `[tracing]`: PRODUCER spans the OTLP collector accepted |
//! | `outbox_relay_spans_dropped_total{reason}` | counter | `[tracing]`: spans lost (`reason`: queue_full, the export queue was full and the span was not waited for; export_failed, its batch failed to export) |
//! | `outbox_relay_span_export_errors_total` | counter | `[tracing]`: failed OTLP export calls (collector down, refused, timed out) |
//! | `outbox_relay_stage_memory_bytes` | gauge | streamed, uncommitted transactions' outbox changes the relay keeps in memory (`relay.stage_memory_bytes` bounds it) |
//! | `outbox_relay_stage_disk_bytes` | gauge | … and in spill files under `relay.stage_dir` (`relay.stage_disk_bytes` bounds it) |
//! | `outbox_relay_stage_transactions` | gauge | streamed transactions with outbox changes kept, not committed yet |
//! | `outbox_relay_takeover_fence_seconds` | gauge | exactly-once: seconds left of a takeover's wait for the previous holder's queued records to land or expire (0: none) |
//!
//! LSNs are exported as numbers (bytes since the start of WAL); `f64` is exact up to 8 PiB.

use std::collections::HashMap;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Gauge, Histogram,
};

use crate::ops::latency::LatencyBatch;

pub(crate) const EVENTS_RECEIVED: &str = "outbox_relay_events_received_total";
pub(crate) const EVENTS_PUBLISHED: &str = "outbox_relay_events_published_total";
pub(crate) const EVENTS_FAILED: &str = "outbox_relay_events_failed_total";
pub(crate) const IN_FLIGHT_EVENTS: &str = "outbox_relay_in_flight_events";
pub(crate) const IN_FLIGHT_BYTES: &str = "outbox_relay_in_flight_bytes";
pub(crate) const STAGE_MEMORY_BYTES: &str = "outbox_relay_stage_memory_bytes";
pub(crate) const STAGE_DISK_BYTES: &str = "outbox_relay_stage_disk_bytes";
pub(crate) const STAGE_TRANSACTIONS: &str = "outbox_relay_stage_transactions";
pub(crate) const COMMIT_TO_ACK_SECONDS: &str = "outbox_relay_commit_to_ack_seconds";
pub(crate) const SECONDS_BEHIND_SOURCE: &str = "outbox_relay_seconds_behind_source";
pub(crate) const RECEIVED_LSN: &str = "outbox_relay_received_lsn";
pub(crate) const FLUSHED_LSN: &str = "outbox_relay_flushed_lsn";
pub(crate) const SLOT_RETAINED_WAL_BYTES: &str = "outbox_relay_slot_retained_wal_bytes";
pub(crate) const RECONNECTS: &str = "outbox_relay_reconnects_total";
pub(crate) const ACTIVE: &str = "outbox_relay_active";
pub(crate) const LAST_CONFIRMED_COMMIT: &str = "outbox_relay_last_confirmed_commit_timestamp_seconds";
pub(crate) const SLOT_FAILOVER_READY: &str = "outbox_relay_slot_failover_ready";
pub(crate) const BAD_EVENTS: &str = "outbox_relay_bad_events_total";
pub(crate) const EVENTS_SKIPPED_IN_SINK: &str = "outbox_relay_events_skipped_in_sink_total";
/// [`EVENTS_SKIPPED_IN_SINK`]'s name until this release (it named the first sink); exported
/// beside it until the next release, so dashboards can move.
pub(crate) const EVENTS_SKIPPED_IN_KAFKA: &str = "outbox_relay_events_skipped_in_kafka_total";
pub(crate) const PARTITIONS_READ_BACK: &str = "outbox_relay_partitions_read_back_total";
pub(crate) const READ_BACK_SECONDS: &str = "outbox_relay_read_back_seconds";
pub(crate) const TAKEOVER_FENCE_SECONDS: &str = "outbox_relay_takeover_fence_seconds";
pub(crate) const PENDING_ROWS: &str = "outbox_relay_pending_rows";
pub(crate) const OLDEST_PENDING_AGE_SECONDS: &str = "outbox_relay_oldest_pending_age_seconds";
pub(crate) const RETENTION_ROWS_REMOVED: &str = "outbox_relay_retention_rows_removed_total";
pub(crate) const RETENTION_PARTITIONS_CREATED: &str = "outbox_relay_retention_partitions_created_total";
pub(crate) const RETENTION_PARTITIONS_DROPPED: &str = "outbox_relay_retention_partitions_dropped_total";
pub(crate) const RETENTION_ERRORS: &str = "outbox_relay_retention_errors_total";
pub(crate) const RETENTION_LAST_RUN: &str = "outbox_relay_retention_last_run_timestamp_seconds";
pub(crate) const RETENTION_PAUSED: &str = "outbox_relay_retention_paused";
pub(crate) const TRACEPARENT_INVALID: &str = "outbox_relay_traceparent_invalid_total";
pub(crate) const EVENTS_FILTERED: &str = "outbox_relay_events_filtered_total";
pub(crate) const SPANS_EXPORTED: &str = "outbox_relay_spans_exported_total";
pub(crate) const SPANS_DROPPED: &str = "outbox_relay_spans_dropped_total";
pub(crate) const SPAN_EXPORT_ERRORS: &str = "outbox_relay_span_export_errors_total";

/// The label of the per-outbox-table retention metrics (`schema.name`).
pub(crate) const TABLE_LABEL: &str = "table";

/// The label of the per-topic counters.
pub(crate) const TOPIC_LABEL: &str = "topic";

/// Upper bounds (seconds) of the commit-to-ack histogram: 1 ms … 60 s, roughly ×2.5 apart.
pub(crate) const COMMIT_TO_ACK_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Counts an event published with an invalid `traceparent` (every pipeline calls this once per
/// event it sends whose `OutboxEvent::has_invalid_traceparent` is true).
pub(crate) fn count_invalid_traceparent() {
    counter!(TRACEPARENT_INVALID).increment(1);
}

/// One event `[filter]` kept from the sink.
pub(crate) fn count_filtered() {
    counter!(EVENTS_FILTERED).increment(1);
}

/// One replayed event not sent because the sink held it already (exactly-once); counted under
/// the old name too until the next release.
pub(crate) fn count_skipped_in_sink() {
    counter!(EVENTS_SKIPPED_IN_SINK).increment(1);
    counter!(EVENTS_SKIPPED_IN_KAFKA).increment(1);
}

/// Help texts, and the process-wide series registered up front so a scrape shows them (at 0)
/// before the first event or reconnect. Call once, after a recorder is installed.
pub(crate) fn describe() {
    describe_counter!(
        EVENTS_RECEIVED,
        "Outbox inserts decoded from the WAL and routed, by topic."
    );
    describe_counter!(
        EVENTS_PUBLISHED,
        "Events acknowledged by the broker, by topic (replays after a restart count again)."
    );
    describe_counter!(
        EVENTS_FAILED,
        "Events the broker finally refused, by topic; the session then replays from the slot."
    );
    describe_gauge!(IN_FLIGHT_EVENTS, "Events handed to the sink and not yet acknowledged.");
    describe_gauge!(
        IN_FLIGHT_BYTES,
        "Bytes (keys + values + headers) of the in-flight events."
    );
    describe_gauge!(
        STAGE_MEMORY_BYTES,
        "Bytes of streamed, uncommitted transactions' outbox changes kept in memory (relay.stage_memory_bytes)."
    );
    describe_gauge!(
        STAGE_DISK_BYTES,
        "Bytes of streamed, uncommitted transactions' outbox changes in spill files (relay.stage_disk_bytes)."
    );
    describe_gauge!(
        STAGE_TRANSACTIONS,
        "Streamed transactions with outbox changes kept by the relay, not committed yet."
    );
    describe_histogram!(
        COMMIT_TO_ACK_SECONDS,
        "Seconds from the PostgreSQL commit of an event to its acknowledgement by the broker."
    );
    describe_gauge!(
        SECONDS_BEHIND_SOURCE,
        "Seconds since the commit of the oldest received transaction not yet confirmed (0 when caught up)."
    );
    describe_gauge!(RECEIVED_LSN, "Highest WAL position received from PostgreSQL (bytes).");
    describe_gauge!(
        FLUSHED_LSN,
        "WAL position confirmed to PostgreSQL: everything before it is in the broker (bytes)."
    );
    describe_gauge!(
        SLOT_RETAINED_WAL_BYTES,
        "WAL kept on the server for the slot: current WAL position minus restart_lsn."
    );
    describe_counter!(
        RECONNECTS,
        "Streaming sessions restarted after a transient error (PostgreSQL or the broker)."
    );
    describe_gauge!(
        ACTIVE,
        "1 while this instance streams from the slot, 0 while it stands by or reconnects."
    );
    describe_gauge!(
        LAST_CONFIRMED_COMMIT,
        "Commit time (Unix seconds) of the latest transaction with events confirmed to PostgreSQL."
    );
    describe_gauge!(
        SLOT_FAILOVER_READY,
        "PostgreSQL 17+: 1 when the slot is a failover slot and every standby in synchronized_standby_slots streams; else 0."
    );
    describe_counter!(
        BAD_EVENTS,
        "Outbox events that can never be published, by relay.on_bad_event policy and cause."
    );
    describe_counter!(
        EVENTS_SKIPPED_IN_SINK,
        "Exactly-once: replayed events not sent because the sink already held them."
    );
    describe_counter!(
        EVENTS_SKIPPED_IN_KAFKA,
        "Deprecated alias of outbox_relay_events_skipped_in_sink_total (removed in the next release)."
    );
    describe_counter!(
        PARTITIONS_READ_BACK,
        "Exactly-once: partition tails read back when streaming (re)started."
    );
    describe_histogram!(
        READ_BACK_SECONDS,
        "Exactly-once: seconds to read back one partition's tail (metadata included)."
    );
    describe_gauge!(
        TAKEOVER_FENCE_SECONDS,
        "Exactly-once: seconds left of a takeover's wait for the previous holder's queued records (0: none)."
    );
    describe_gauge!(
        PENDING_ROWS,
        "poll mode: outbox rows not yet dispatched (the watchdog's count)."
    );
    describe_gauge!(
        OLDEST_PENDING_AGE_SECONDS,
        "poll mode: seconds the oldest pending outbox row has waited (0 when none)."
    );
    describe_counter!(
        RETENTION_ROWS_REMOVED,
        "[retention]: published outbox rows removed, by table (partitions mode: row estimates of dropped partitions)."
    );
    describe_counter!(
        RETENTION_PARTITIONS_CREATED,
        "[retention] partitions mode: partitions created ahead, by table."
    );
    describe_counter!(
        RETENTION_PARTITIONS_DROPPED,
        "[retention] partitions mode: expired partitions detached and dropped, by table."
    );
    describe_counter!(
        RETENTION_ERRORS,
        "[retention]: failed runs, by table and kind (transient: retried; fatal: retention stopped for the table)."
    );
    describe_gauge!(
        RETENTION_LAST_RUN,
        "[retention]: Unix time of the last successful run on this instance, by table."
    );
    describe_gauge!(
        RETENTION_PAUSED,
        "[retention] streaming: 1 while the slot is missing, invalidated or held by no relay (nothing removed)."
    );
    describe_counter!(
        TRACEPARENT_INVALID,
        "Events whose trace column held no valid W3C traceparent (published with the value untouched)."
    );
    describe_counter!(
        EVENTS_FILTERED,
        "Events [filter] kept from the sink (their WAL position is confirmed like a published event's)."
    );
    describe_counter!(SPANS_EXPORTED, "[tracing]: PRODUCER spans the OTLP collector accepted.");
    describe_counter!(
        SPANS_DROPPED,
        "[tracing]: spans lost, by reason (queue_full: the export queue was full; export_failed: their batch failed)."
    );
    describe_counter!(
        SPAN_EXPORT_ERRORS,
        "[tracing]: failed OTLP export calls (collector down, refused or timed out)."
    );
    counter!(RECONNECTS).absolute(0);
    counter!(TRACEPARENT_INVALID).absolute(0);
    counter!(EVENTS_FILTERED).absolute(0);
    gauge!(TAKEOVER_FENCE_SECONDS).set(0.0);
    gauge!(ACTIVE).set(0.0);
    gauge!(IN_FLIGHT_EVENTS).set(0.0);
    gauge!(IN_FLIGHT_BYTES).set(0.0);
    gauge!(STAGE_MEMORY_BYTES).set(0.0);
    gauge!(STAGE_DISK_BYTES).set(0.0);
    gauge!(STAGE_TRANSACTIONS).set(0.0);
}

/// The per-event metrics of one session: per-topic counters, the commit-to-ack histogram, and
/// the exact samples for `GET /latency` (see `crate::ops::latency`), folded in by
/// [`SessionMetrics::fold_latency`] once per batch of delivery reports.
pub(crate) struct SessionMetrics {
    topics: TopicMetrics,
    commit_to_ack: Histogram,
    exact: LatencyBatch,
}

impl Default for SessionMetrics {
    fn default() -> Self {
        SessionMetrics {
            topics: TopicMetrics::default(),
            commit_to_ack: histogram!(COMMIT_TO_ACK_SECONDS),
            exact: LatencyBatch::default(),
        }
    }
}

impl SessionMetrics {
    /// The id a delivery tag of an event routed to `topic` carries.
    pub(crate) fn topic(&mut self, topic: &str) -> TopicId {
        self.topics.id(topic)
    }

    /// An event routed to the topic `id` was handed to the sink: counts it.
    pub(crate) fn received(&self, id: TopicId) {
        self.topics.received(id);
    }

    /// Kafka acknowledged an event of a transaction committed at `commit_unix_us`.
    pub(crate) fn published(&mut self, topic: TopicId, commit_unix_us: i64, now_unix_us: i64) {
        self.topics.published(topic);
        self.commit_to_ack.record(seconds_since(commit_unix_us, now_unix_us));
        self.exact.record(commit_unix_us, now_unix_us);
    }

    /// Moves the exact samples recorded since the last call into the process-wide window.
    pub(crate) fn fold_latency(&mut self) {
        crate::ops::latency::commit_to_ack().absorb(&mut self.exact);
    }

    pub(crate) fn failed(&self, topic: TopicId) {
        self.topics.failed(topic);
    }

    /// Kafka acknowledged a record produced before its transaction committed
    /// (`relay/early.rs`): counted, with no commit-to-ack latency (the commit time was not
    /// known when it was sent, and it is visible only from the commit on).
    pub(crate) fn published_early(&self, topic: TopicId) {
        self.topics.published(topic);
    }
}

/// Index of a topic in a session's [`TopicMetrics`]; travels in each event's delivery tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TopicId(u32);

/// The per-topic counter handles of one session.
#[derive(Default)]
pub(crate) struct TopicMetrics {
    ids: HashMap<String, TopicId>,
    counters: Vec<TopicCounters>,
}

struct TopicCounters {
    received: Counter,
    published: Counter,
    failed: Counter,
}

impl TopicMetrics {
    /// The id of `topic`, registering its counters the first time (the only allocation).
    pub(crate) fn id(&mut self, topic: &str) -> TopicId {
        if let Some(id) = self.ids.get(topic) {
            return *id;
        }
        let label = || [(TOPIC_LABEL, topic.to_owned())];
        let id = TopicId(u32::try_from(self.counters.len()).unwrap_or(u32::MAX));
        self.counters.push(TopicCounters {
            received: counter!(EVENTS_RECEIVED, &label()),
            published: counter!(EVENTS_PUBLISHED, &label()),
            failed: counter!(EVENTS_FAILED, &label()),
        });
        self.ids.insert(topic.to_owned(), id);
        id
    }

    pub(crate) fn received(&self, id: TopicId) {
        if let Some(c) = self.counters.get(id.0 as usize) {
            c.received.increment(1);
        }
    }

    pub(crate) fn published(&self, id: TopicId) {
        if let Some(c) = self.counters.get(id.0 as usize) {
            c.published.increment(1);
        }
    }

    pub(crate) fn failed(&self, id: TopicId) {
        if let Some(c) = self.counters.get(id.0 as usize) {
            c.failed.increment(1);
        }
    }
}

/// The process-wide gauges a session updates once per status interval.
pub(crate) struct StreamGauges {
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
    seconds_behind: Gauge,
    received_lsn: Gauge,
    flushed_lsn: Gauge,
    stage_memory_bytes: Gauge,
    stage_disk_bytes: Gauge,
    stage_transactions: Gauge,
}

/// One status interval's view of the stream, for [`StreamGauges::set`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StreamSnapshot {
    pub(crate) in_flight_events: usize,
    pub(crate) in_flight_bytes: usize,
    pub(crate) seconds_behind: f64,
    pub(crate) received_lsn: u64,
    pub(crate) flushed_lsn: u64,
    /// See [`LAST_CONFIRMED_COMMIT`]; `None` until a transaction with events was confirmed.
    pub(crate) last_confirmed_commit_unix_us: Option<i64>,
    pub(crate) stage_memory_bytes: usize,
    pub(crate) stage_disk_bytes: u64,
    pub(crate) stage_transactions: usize,
}

impl Default for StreamGauges {
    fn default() -> Self {
        StreamGauges {
            in_flight_events: gauge!(IN_FLIGHT_EVENTS),
            in_flight_bytes: gauge!(IN_FLIGHT_BYTES),
            seconds_behind: gauge!(SECONDS_BEHIND_SOURCE),
            received_lsn: gauge!(RECEIVED_LSN),
            flushed_lsn: gauge!(FLUSHED_LSN),
            stage_memory_bytes: gauge!(STAGE_MEMORY_BYTES),
            stage_disk_bytes: gauge!(STAGE_DISK_BYTES),
            stage_transactions: gauge!(STAGE_TRANSACTIONS),
        }
    }
}

impl StreamGauges {
    /// No session streams: nothing is in flight (LSN gauges keep their last values).
    pub(crate) fn set_idle(&self) {
        self.in_flight_events.set(0.0);
        self.in_flight_bytes.set(0.0);
        self.stage_memory_bytes.set(0.0);
        self.stage_disk_bytes.set(0.0);
        self.stage_transactions.set(0.0);
    }

    pub(crate) fn set(&self, s: &StreamSnapshot) {
        self.in_flight_events.set(s.in_flight_events as f64);
        self.in_flight_bytes.set(s.in_flight_bytes as f64);
        self.seconds_behind.set(s.seconds_behind);
        self.received_lsn.set(s.received_lsn as f64);
        self.flushed_lsn.set(s.flushed_lsn as f64);
        self.stage_memory_bytes.set(s.stage_memory_bytes as f64);
        self.stage_disk_bytes.set(s.stage_disk_bytes as f64);
        self.stage_transactions.set(s.stage_transactions as f64);
        if let Some(us) = s.last_confirmed_commit_unix_us {
            gauge!(LAST_CONFIRMED_COMMIT).set(us as f64 / 1e6);
        }
    }
}

/// Seconds between a commit (µs since the Unix epoch) and `now_us`; never negative (clocks of
/// the database and this host may disagree slightly).
pub(crate) fn seconds_since(commit_unix_us: i64, now_us: i64) -> f64 {
    (now_us.saturating_sub(commit_unix_us)).max(0) as f64 / 1e6
}

/// Now, in µs since the Unix epoch.
pub(crate) fn now_unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_are_stable_and_allocated_once() {
        let mut m = TopicMetrics::default();
        let a = m.id("order.placed");
        let b = m.id("order.paid");
        assert_ne!(a, b);
        assert_eq!(m.id("order.placed"), a);
        assert_eq!(m.counters.len(), 2);
        // Unknown ids (impossible in practice) are ignored rather than panicking.
        m.published(TopicId(99));
    }

    #[test]
    fn commit_latency_never_goes_negative() {
        assert_eq!(seconds_since(2_000_000, 1_000_000), 0.0);
        assert_eq!(seconds_since(1_000_000, 3_500_000), 2.5);
    }
}
