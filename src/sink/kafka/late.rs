//! Late writes held outside this process: produce requests an earlier producer of this process
//! wrote, that something between it and the log (a stalled broker's socket buffer, a
//! middlebox) acknowledged at the TCP level and may still hand on at any later time. The
//! exactly-once read-back fences them with the broker's own timestamp bound before it reads.
//!
//! Why: the read-back (`tail.rs`) decides which events the next session publishes again from
//! what the partition holds *now*. A request of the old producer that lands after it is a
//! duplicate (docs/reliability.md §10, defect 6). `unsettled.rs` waits for what this host's
//! kernel still holds; nothing on this host knows what a peer holds. Kafka fences late writes
//! only for transactional producers — but a topic whose `message.timestamp.type` is
//! `CreateTime` refuses every record whose timestamp is older than its
//! `message.timestamp.before.max.ms` (`message.timestamp.difference.max.ms` before Kafka 3.6)
//! when it is appended. So once that bound has passed since the newest record an earlier
//! producer handed over without learning it was stored, nothing of that producer can be
//! appended any more: a request held back that long is refused, one appended before is seen.
//! An idempotent producer's requests for one partition append as a prefix (a refused batch
//! makes every later batch of the producer out of sequence), so the read-back never sees a
//! later event stored without an earlier one.
//!
//! What: every producer stamps each record at hand-over ([`Handed`]); a producer dropped with
//! records it does not know stored leaves its newest stamp for its cluster
//! ([`Handed::retire`]). Before a read-back reads a topic, [`deadline`] says until when it
//! waits: that stamp + the topic's bound ([`Bound`]) + [`MARGIN`] for clock skew between this
//! host and the brokers and for the append to reach the high watermark.
//!
//! Invariant: after the wait, no record an earlier producer of this process handed over can be
//! appended to a topic with a bound, if the brokers' clocks are within [`SKEW`] of this host's.
//! Records of *other* processes (a frozen holder elsewhere) are section 7's frozen-holder rules.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::KafkaProperties;

/// How far the brokers' clocks may be behind this host's (NTP keeps it to milliseconds).
pub(crate) const SKEW: Duration = Duration::from_secs(1);
/// [`SKEW`], and the time an append takes to reach the high watermark: the same grace
/// `unsettled.rs` gives a request it saw acknowledged.
pub(crate) const MARGIN: Duration =
    Duration::from_millis(SKEW.as_millis() as u64 + super::unsettled::GRACE.as_millis() as u64);

/// Now, in milliseconds since the epoch (the unit of Kafka's record timestamps).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The key a cluster's producers and readers share: the configured brokers.
pub(crate) fn cluster_of(props: &KafkaProperties) -> String {
    ["bootstrap.servers", "metadata.broker.list"]
        .into_iter()
        .find_map(|k| props.0.get(k))
        .cloned()
        .unwrap_or_default()
}

/// Per cluster (its `bootstrap.servers`): the newest stamp of a record a dropped producer
/// handed over without learning it was stored.
fn retired() -> &'static Mutex<HashMap<String, i64>> {
    static RETIRED: OnceLock<Mutex<HashMap<String, i64>>> = OnceLock::new();
    RETIRED.get_or_init(Default::default)
}

/// The newest stamp an earlier producer to `cluster` may still have on its way there.
pub(crate) fn unsettled_since(cluster: &str) -> Option<i64> {
    retired()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(cluster)
        .copied()
}

/// What one producer handed over: its newest stamp, how many records it handed over and how
/// many it learnt the fate of, and the newest stamp of a failed record the broker may have
/// stored anyway (its request was on the wire).
#[derive(Debug)]
pub(crate) struct Handed {
    cluster: String,
    newest_ms: AtomicI64,
    /// Newest stamp among failed records whose request may have reached a broker
    /// (librdkafka's `POSSIBLY_PERSISTED`); `i64::MIN`: none.
    possibly_ms: AtomicI64,
    handed: AtomicU64,
    /// Records reported stored, or failed without reaching a broker.
    settled: AtomicU64,
    /// Whether any record carried a timestamp of its own (an event time) rather than the
    /// hand-over's.
    explicit: AtomicBool,
}

impl Handed {
    pub(crate) fn new(cluster: &str) -> Handed {
        Handed {
            cluster: cluster.to_owned(),
            newest_ms: AtomicI64::new(i64::MIN),
            possibly_ms: AtomicI64::new(i64::MIN),
            handed: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            explicit: AtomicBool::new(false),
        }
    }

    /// A record stamped `stamp_ms` was handed to librdkafka at `now_ms`; `explicit`: the stamp
    /// is the record's own. A stamp in the future counts as it is (the broker measures its age
    /// from it); one in the past as now.
    pub(crate) fn handed(&self, stamp_ms: i64, now_ms: i64, explicit: bool) {
        self.newest_ms.fetch_max(stamp_ms.max(now_ms), Ordering::Relaxed);
        self.handed.fetch_add(1, Ordering::Relaxed);
        if explicit {
            self.explicit.store(true, Ordering::Relaxed);
        }
    }

    /// A delivery report said a record is stored.
    pub(crate) fn stored(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
    }

    /// A delivery report said a record failed; `possibly_stored`: its request had been sent
    /// (`stamp_ms`: the record's timestamp, when known; else the newest handed over counts).
    pub(crate) fn failed(&self, stamp_ms: Option<i64>, possibly_stored: bool) {
        if possibly_stored {
            let stamp = stamp_ms.unwrap_or_else(|| self.newest_ms.load(Ordering::Relaxed));
            self.possibly_ms.fetch_max(stamp, Ordering::Relaxed);
        }
        self.settled.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the fate of every record handed over is known (stored, or failed).
    pub(crate) fn all_settled(&self) -> bool {
        self.settled.load(Ordering::Relaxed) >= self.handed.load(Ordering::Relaxed)
    }

    /// Whether every record so far was stamped at hand-over: then a broker refusing one for its
    /// timestamp says it arrived late, not that the record is bad.
    pub(crate) fn stamped_at_hand_over(&self) -> bool {
        !self.explicit.load(Ordering::Relaxed)
    }

    /// The producer is going: the newest stamp of a record that may still land — a failed one
    /// whose request was sent, or any record whose fate it never learnt — is what a read-back
    /// must fence.
    pub(crate) fn retire(&self) {
        let mut newest = self.possibly_ms.load(Ordering::Relaxed);
        if !self.all_settled() {
            newest = newest.max(self.newest_ms.load(Ordering::Relaxed));
        }
        if newest == i64::MIN {
            return;
        }
        let mut retired = retired().lock().unwrap_or_else(PoisonError::into_inner);
        let slot = retired.entry(self.cluster.clone()).or_insert(newest);
        *slot = (*slot).max(newest);
    }
}

/// A topic's timestamp bound, from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The broker refuses records older than this when it appends them.
    Refuses(Duration),
    /// Nothing is refused for its age: `LogAppendTime`, or no finite bound.
    Unbounded,
}

impl Bound {
    /// From a topic's configuration values (`get(name)`).
    pub(crate) fn of<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Bound {
        if get("message.timestamp.type").is_some_and(|t| t.trim() == "LogAppendTime") {
            return Bound::Unbounded;
        }
        // A topic may carry both on Kafka 3.6–3.9; the broker applies each: the smaller wins.
        ["message.timestamp.before.max.ms", "message.timestamp.difference.max.ms"]
            .into_iter()
            .filter_map(|k| get(k)?.trim().parse::<i64>().ok())
            // Kafka's "no bound" is Long.MAX_VALUE; a year is as good as none here.
            .filter(|ms| (0..365 * 24 * 3_600_000).contains(ms))
            .min()
            .map_or(Bound::Unbounded, |ms| Bound::Refuses(Duration::from_millis(ms as u64)))
    }
}

/// Until when (ms since the epoch) a read-back of a topic with `bound` waits, for records
/// stamped up to `newest_ms`: after it, the broker refuses every one of them.
pub(crate) fn deadline(newest_ms: i64, bound: Duration) -> i64 {
    newest_ms
        .saturating_add(bound.as_millis() as i64)
        .saturating_add(MARGIN.as_millis() as i64)
}

/// The shortest bound a live session's own records always meet: librdkafka gives up on a
/// record (and on the request carrying it) `message.timeout.ms` after it was handed over, and
/// scans for that once a second; a bound below this can refuse a record of the running session.
pub(crate) fn shortest_safe_bound(message_timeout: Duration) -> Duration {
    message_timeout + Duration::from_secs(1) + SKEW
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
    }

    /// A producer of `cluster` handed one record at each of `stamps` (stamped at hand-over).
    fn handed_at(cluster: &str, stamps: &[i64]) -> Handed {
        let h = Handed::new(cluster);
        for &stamp in stamps {
            h.handed(stamp, stamp, false);
        }
        h
    }

    #[test]
    fn the_bound_is_the_smaller_finite_one_and_only_for_create_time() {
        assert_eq!(
            Bound::of(configs(&[("message.timestamp.before.max.ms", "20000")])),
            Bound::Refuses(Duration::from_secs(20))
        );
        assert_eq!(
            Bound::of(configs(&[
                ("message.timestamp.type", "CreateTime"),
                ("message.timestamp.before.max.ms", "9223372036854775807"),
                ("message.timestamp.difference.max.ms", "60000"),
            ])),
            Bound::Refuses(Duration::from_secs(60))
        );
        // Kafka's defaults: no bound.
        assert_eq!(
            Bound::of(configs(&[
                ("message.timestamp.type", "CreateTime"),
                ("message.timestamp.before.max.ms", "9223372036854775807"),
            ])),
            Bound::Unbounded
        );
        assert_eq!(Bound::of(configs(&[])), Bound::Unbounded);
        // The broker stamps the records itself: nothing is refused for its age.
        assert_eq!(
            Bound::of(configs(&[
                ("message.timestamp.type", "LogAppendTime"),
                ("message.timestamp.before.max.ms", "20000"),
            ])),
            Bound::Unbounded
        );
        assert_eq!(
            Bound::of(configs(&[("message.timestamp.before.max.ms", "soon")])),
            Bound::Unbounded
        );
    }

    #[test]
    fn a_producer_that_knows_everything_stored_leaves_nothing_to_fence() {
        let cluster = "late-test-all-stored:9092";
        let h = handed_at(cluster, &[1_000, 2_000, 3_000]);
        h.stored();
        h.stored();
        // Failed in librdkafka's queue: never sent, nothing to fence.
        h.failed(Some(3_000), false);
        h.retire();
        assert_eq!(unsettled_since(cluster), None);
        assert!(h.stamped_at_hand_over());
    }

    #[test]
    fn a_producer_going_with_records_unreported_leaves_its_newest_stamp() {
        let cluster = "late-test-unreported:9092";
        let first = Handed::new(cluster);
        first.handed(5_000, 5_000, false);
        // An event-time stamp in the past counts as the hand-over; one ahead counts as itself.
        first.handed(1, 6_000, true);
        first.stored();
        first.retire();
        assert_eq!(unsettled_since(cluster), Some(6_000));
        assert!(!first.stamped_at_hand_over());
        let later = Handed::new(cluster);
        later.handed(9_000, 7_000, true);
        later.retire();
        assert_eq!(unsettled_since(cluster), Some(9_000));
        // An older producer retiring late never moves it back.
        handed_at(cluster, &[3_000]).retire();
        assert_eq!(unsettled_since(cluster), Some(9_000));
        assert_eq!(unsettled_since("late-test-other:9092"), None);
    }

    #[test]
    fn a_failed_record_whose_request_was_sent_is_fenced_from_its_own_stamp() {
        let cluster = "late-test-possibly:9092";
        let h = handed_at(cluster, &[1_000, 2_000, 8_000]);
        // The first two were on the wire when they failed; the third expired in the queue.
        h.failed(Some(1_000), true);
        h.failed(Some(2_000), true);
        h.failed(Some(8_000), false);
        h.retire();
        assert_eq!(unsettled_since(cluster), Some(2_000));
    }

    #[test]
    fn the_deadline_adds_the_bound_and_the_margin() {
        assert_eq!(
            deadline(10_000, Duration::from_secs(20)),
            10_000 + 20_000 + MARGIN.as_millis() as i64
        );
        // docs/operations.md and docs/reliability.md say 3 s.
        assert_eq!(MARGIN, Duration::from_secs(3));
        assert_eq!(
            shortest_safe_bound(Duration::from_secs(10)),
            Duration::from_secs(10) + Duration::from_secs(1) + SKEW
        );
    }
}
