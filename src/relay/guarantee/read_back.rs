//! Exactly-once by read-back: a (re)started stream skips the events the sink already holds,
//! found by reading back the tail of each partition (the sink's ordered lane) it is about to
//! write — no broker transactions (on Kafka: any Kafka). The records carry their position
//! headers (`position.rs`).
//!
//! **Skipped only when seen.** A replayed event is skipped only when a record of this source with
//! *its exact position* is in its partition: never inferred from a neighbour, so a gap (an event
//! whose delivery failed while a later one of the partition landed) can cost a duplicate but
//! never an event. The read-back collects this source's positions at or above the replay start
//! (the slot's confirmed position: everything before it is in the sink), reading backwards from
//! the partition's end until it meets one of this source's records from before the replay start.
//! One source writes each partition in commit order, so everything after that record was read;
//! a record it did not read is sent again (a duplicate at worst).
//!
//! **The replay window.** Only events whose transaction committed before the server's WAL
//! position read right after `START_REPLICATION` (`window.rs`; the slot is ours by then, so no
//! earlier holder can still be streaming) can have been published before. Later events are sent
//! without any check: steady state costs nothing. A replay-window event needs its partition's
//! tail: computed with the sink's partitioner (`sink::ReadBackSpec::partition_for`, or the
//! record's explicit partition), read back once per session on a thread of its own, lazily,
//! before the first event for that partition is sent. Until it is known the stream reads no
//! frames: the event that needed it is kept, as decoded, and published afterwards (`stream.rs`).
//!
//! **Gaps cost nothing but duplicates.** A failed delivery can leave a gap (the client may still
//! deliver later records of the partition, e.g. after an epoch bump), and a wind-down may give
//! up on outstanding deliveries: the missing event's position is not in the sink, so the replay
//! sends it, whatever its neighbours are. A record without a key has no computable partition
//! and is never skipped.
//!
//! **The takeover fence.** A session that took the slot over from another instance waits, before
//! its first read-back, until whatever the old holder may still have queued in its sink's client
//! has landed or expired (`takeover.rs`); the old holder itself stopped handing records over as
//! soon as it could have lost the slot (`liveness.rs`). What remains is in docs/reliability.md.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use tokio::sync::mpsc;
use tracing::info;

use super::window::ReplayWindow;
use super::{position, Answer, Answers, Bound, Guarantee, HoldNote, Stamp, Start, Verdict};
use crate::config::Settings;
use crate::ops::metrics::{PARTITIONS_READ_BACK, READ_BACK_SECONDS};
use crate::ops::units::utc_from_system_time;
use crate::postgres::lsn::Lsn;
use crate::relay::error::RelayError;
use crate::relay::quarantine::EventRef;
use crate::relay::takeover::Fence;
use crate::sink::{tail_since, ClientQueueExpiry, ReadBackError, ReadBackReader, ReadBackSource, Tail};

/// What this session knows about one record's partition.
enum Lookup {
    /// Outside the replay window, in a topic that did not exist, or without a computable
    /// partition: sent as it is.
    Unchecked,
    /// The partition was read back: whether the sink holds the record's exact position.
    Known(bool),
    /// Not read back yet (with the topic's partition count when known).
    Unknown(Option<Option<i32>>),
}

/// One topic as read back this session.
#[derive(Debug, Default)]
struct TopicTail {
    /// `None`: the topic did not exist (nothing of it is in the sink).
    partitions: Option<i32>,
    /// Per partition read back: this source's positions there at or above the replay start.
    found: HashMap<i32, BTreeSet<EventRef>>,
}

/// A read-back job's request and answer.
struct Job {
    topic: String,
    key: Vec<u8>,
    explicit: Option<i32>,
    /// The partition count, when this session knows it already.
    partitions: Option<Option<i32>>,
}

/// What a read-back found: the topic's partition count (`None`: no such topic) and, when the
/// record's partition is computable, that partition with its tail.
type Found = (Option<i32>, Option<(i32, Tail<EventRef>)>);

pub(super) struct Done {
    reader: Option<Box<dyn ReadBackReader>>,
    topic: String,
    outcome: Result<Found, ReadBackError>,
    elapsed: Duration,
}

/// The read-back state of one streaming session.
pub(super) struct ReadBack {
    /// [`position::HEADER_SOURCE`]'s value.
    source: String,
    window: ReplayWindow,
    /// The sink's read-back: where a key goes, and its readers (the sink's own business).
    sink: Arc<dyn ReadBackSource>,
    timeout: Duration,
    max_records: usize,
    topics: HashMap<String, TopicTail>,
    /// Lent to the running job.
    reader: Option<Box<dyn ReadBackReader>>,
    waiting: bool,
    done_tx: mpsc::UnboundedSender<Answer>,
    /// No read-back before this (a takeover's fence: `takeover.rs`); taken by the first job.
    fence_until: Option<Instant>,
    /// The fence, for `/readyz` while it holds.
    fence: Option<Fence>,
    skipped: u64,
    partitions_read: u64,
    read_back_time: Duration,
}

impl ReadBack {
    /// The session's read-back: the replay window ends at the server's WAL position now, and a
    /// takeover's fence holds the first read-back back.
    pub(super) async fn start(
        settings: &Settings,
        at: &Start<'_>,
        sink: Arc<dyn ReadBackSource>,
    ) -> Result<(ReadBack, Answers), RelayError> {
        let window = ReplayWindow::start(at.control, at.slot_start).await?;
        let fence = at.predecessor.fence(settings, sink.queue_expiry(), Instant::now());
        if let Some(f) = &fence {
            info!(
                slot = %settings.postgres.slot,
                until = %utc_from_system_time(f.until_utc),
                wait_ms = f.until.saturating_duration_since(Instant::now()).as_millis() as u64,
                reason = %f.reason,
                "exactly-once takeover: the first read-back waits for the previous holder's queued records"
            );
        }
        Ok(ReadBack::new(settings, sink, at.system_id, window, fence))
    }

    /// `system_id`: the database system identifier; `fence`: wait until its end before the
    /// first read-back.
    pub(super) fn new(
        settings: &Settings,
        sink: Arc<dyn ReadBackSource>,
        system_id: &str,
        window: ReplayWindow,
        fence: Option<Fence>,
    ) -> (ReadBack, Answers) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let read_back = ReadBack {
            source: position::source(settings, system_id),
            window,
            sink,
            timeout: settings.relay.connect_timeout,
            max_records: settings.relay.read_back_max_records,
            topics: HashMap::new(),
            reader: None,
            waiting: false,
            done_tx,
            fence_until: fence.as_ref().map(|f| f.until),
            fence,
            skipped: 0,
            partitions_read: 0,
            read_back_time: Duration::ZERO,
        };
        (read_back, done_rx)
    }

    /// A read-back is running.
    #[cfg(test)]
    fn is_waiting(&self) -> bool {
        self.waiting
    }

    /// Whether a record at `at` for `topic` (keyed `key`, or placed in `explicit`) goes to
    /// the sink. Outside the replay window: always. Inside: once its partition's tail is known,
    /// skipped when the sink holds it; until then [`Verdict::Wait`] — a read-back is started unless
    /// `may_wait` is false, in which case the record is sent (a possible duplicate, never a loss).
    fn verdict(&mut self, at: EventRef, topic: &str, key: &[u8], explicit: Option<i32>, may_wait: bool) -> Verdict {
        match self.lookup(at, topic, key, explicit) {
            Lookup::Unchecked => Verdict::Send,
            Lookup::Known(true) => {
                self.skipped += 1;
                crate::ops::metrics::count_skipped_in_sink();
                Verdict::Skip
            }
            Lookup::Known(false) => Verdict::Send,
            Lookup::Unknown(_) if !may_wait => Verdict::Send,
            Lookup::Unknown(partitions) => {
                self.look(Job {
                    topic: topic.to_owned(),
                    key: key.to_vec(),
                    explicit,
                    partitions,
                });
                Verdict::Wait
            }
        }
    }

    /// Makes sure a [`verdict`](Self::verdict) on this record will not need to wait: false when
    /// a read-back had to be started for it (come back with the same frame).
    fn prepare(&mut self, at: EventRef, topic: &str, key: &[u8], explicit: Option<i32>) -> bool {
        let Lookup::Unknown(partitions) = self.lookup(at, topic, key, explicit) else {
            return true;
        };
        self.look(Job {
            topic: topic.to_owned(),
            key: key.to_vec(),
            explicit,
            partitions,
        });
        false
    }

    fn lookup(&self, at: EventRef, topic: &str, key: &[u8], explicit: Option<i32>) -> Lookup {
        if !self.window.holds(at.commit_lsn) {
            return Lookup::Unchecked;
        }
        let Some(t) = self.topics.get(topic) else {
            if explicit.is_none() && key.is_empty() {
                return Lookup::Unchecked;
            }
            return Lookup::Unknown(None);
        };
        let Some(count) = t.partitions else {
            return Lookup::Unchecked;
        };
        match explicit.or_else(|| self.sink.lane_of(key, count)) {
            Some(p) if (0..count).contains(&p) => match t.found.get(&p) {
                Some(found) => Lookup::Known(found.contains(&at)),
                None => Lookup::Unknown(Some(Some(count))),
            },
            _ => Lookup::Unchecked,
        }
    }

    /// Reads back on a thread of its own (the reader's calls block); the answer arrives on the
    /// session's [`Answers`].
    fn look(&mut self, job: Job) {
        self.waiting = true;
        let reader = self.reader.take();
        let (sink, timeout, max) = (Arc::clone(&self.sink), self.timeout, self.max_records);
        let (source, fence, tx) = (self.source.clone(), self.fence_until.take(), self.done_tx.clone());
        let floor = EventRef {
            commit_lsn: self.window.start,
            seq: 0,
        };
        std::thread::spawn(move || {
            if let Some(fence) = fence {
                std::thread::sleep(fence.saturating_duration_since(Instant::now()));
            }
            let started = Instant::now();
            let mut reader = reader;
            let topic = job.topic.clone();
            let outcome = (|| {
                let r = match reader.take() {
                    Some(r) => reader.insert(r),
                    None => reader.insert(sink.open(timeout, max)?),
                };
                let count = match job.partitions {
                    Some(count) => count,
                    None => r.lanes(&job.topic)?,
                };
                let Some(count) = count else { return Ok((None, None)) };
                let Some(p) = job.explicit.or_else(|| sink.lane_of(&job.key, count)) else {
                    return Ok((Some(count), None));
                };
                if !(0..count).contains(&p) {
                    return Ok((Some(count), None));
                }
                let tail = tail_since(&**r, &job.topic, p, &floor, |h| position::of_record(h, &source))?;
                Ok((Some(count), Some((p, tail))))
            })();
            let _ = tx.send(Answer(Done {
                reader,
                topic,
                outcome,
                elapsed: started.elapsed(),
            }));
        });
    }

    /// A read-back finished: what it found becomes this session's knowledge.
    fn on_done(&mut self, done: Done) -> Result<(), RelayError> {
        self.waiting = false;
        self.reader = done.reader.or(self.reader.take());
        let (count, tail) = done.outcome?;
        let topic = self.topics.entry(done.topic.clone()).or_default();
        topic.partitions = count;
        self.read_back_time += done.elapsed;
        if let Some((p, tail)) = tail {
            let newest = tail.positions.last().copied();
            let held = tail.positions.len();
            topic.found.insert(p, tail.positions);
            self.partitions_read += 1;
            counter!(PARTITIONS_READ_BACK).increment(1);
            histogram!(READ_BACK_SECONDS).record(done.elapsed.as_secs_f64());
            info!(
                topic = %done.topic,
                partition = p,
                held_since_replay_start = held,
                newest = %newest.map_or_else(|| "none".to_owned(), |n| format!("{}#{}", n.commit_lsn, n.seq)),
                records_read = tail.records_read,
                elapsed_ms = done.elapsed.as_millis() as u64,
                "read back a partition's tail"
            );
        }
        Ok(())
    }

    fn log_window(&self) {
        info!(
            skipped_already_in_sink = self.skipped,
            partitions_read_back = self.partitions_read,
            read_back_ms = self.read_back_time.as_millis() as u64,
            replay_from = %self.window.start,
            replay_to = %self.window.end,
            source = %self.source,
            "exactly-once: replay window checked against the sink"
        );
    }
}

impl Guarantee for ReadBack {
    fn label(&self) -> &'static str {
        "exactly-once (read-back)"
    }

    /// Once past the replay window, says what the check found (once).
    fn reached(&mut self, lsn: Lsn) {
        if self.window.reached(lsn) {
            self.log_window();
        }
    }

    fn admit(&mut self, at: EventRef, to: Bound<'_>, dead_letter: Option<&str>, may_wait: bool) -> Verdict {
        match self.verdict(at, to.destination, to.key, to.placement, may_wait) {
            Verdict::Send => {}
            other => return other,
        }
        match dead_letter {
            Some(dlt) if may_wait && !self.prepare(at, dlt, to.key, None) => Verdict::Wait,
            _ => Verdict::Send,
        }
    }

    fn stamp<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> Stamp<'b> {
        Stamp {
            headers: Some(position::headers(&self.source, at, buf)),
            dedup_key: None,
        }
    }

    fn on_answer(&mut self, answer: Answer) -> Result<(), RelayError> {
        self.on_done(answer.0)
    }

    /// The takeover fence, while it holds and the stream is inside the replay window; its end
    /// is logged once.
    fn hold_note(&mut self, now: Instant) -> Option<HoldNote> {
        let f = self.fence.as_ref()?;
        if now < f.until && !self.window.is_past() {
            return Some(HoldNote {
                text: f.describe(now),
                seconds_left: f.until.duration_since(now).as_secs_f64(),
            });
        }
        info!("exactly-once takeover: the fence passed; reading back and publishing");
        self.fence = None;
        None
    }

    fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Says what the check found, if the stream never got past the window.
    fn finish(mut self: Box<Self>) {
        if self.window.close() {
            self.log_window();
        }
    }
}

/// A takeover fence longer than this is warned about at start.
const SLOW_TAKEOVER: Duration = Duration::from_secs(60);

/// A sink client queue that makes a takeover wait long (a user-set expiry): said at start.
pub(super) fn warnings(settings: &Settings, sink: &dyn ReadBackSource) -> Vec<String> {
    let Some(expiry) = sink.queue_expiry() else {
        return Vec::new();
    };
    let fence = crate::relay::takeover::fence_max(settings, expiry);
    let Some(unset) = expiry.unset.filter(|_| fence > SLOW_TAKEOVER) else {
        return Vec::new();
    };
    let shorter = ClientQueueExpiry {
        expiry: unset,
        ..expiry
    };
    vec![format!(
        "relay.delivery = \"exactly-once\" with [{}] {} = {} ms: a standby taking over from a frozen or unreachable \
         holder waits up to {} s before publishing (the holder's queued records must land or expire first). Remove {} \
         (the relay then uses {} ms: at most {} s) or lower it",
        settings.sink.label(),
        expiry.key,
        expiry.expiry.as_millis(),
        fence.as_secs(),
        expiry.key,
        unset.as_millis(),
        crate::relay::takeover::fence_max(settings, shorter).as_secs(),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    /// The default sink's read-back (Kafka's partitioner).
    fn sink() -> Arc<dyn ReadBackSource> {
        let s = settings("[relay]\ndelivery = \"exactly-once\"\n");
        match crate::sink::exactly_once(&s) {
            crate::sink::ExactlyOnce::ReadBack(sink) => sink,
            other => panic!("the default sink reads back, not {other:?}"),
        }
    }

    fn resume() -> ReadBack {
        let s = settings("[relay]\ndelivery = \"exactly-once\"\n");
        ReadBack::new(
            &s,
            sink(),
            "7000000000000000001",
            ReplayWindow::new(Lsn(0x100), Lsn(0x1000)),
            None,
        )
        .0
    }

    /// As if partition `p` of a 3-partition `t` had been read back, finding `found`.
    fn known(r: &mut ReadBack, p: i32, found: &[EventRef]) {
        let t = r.topics.entry("t".into()).or_default();
        t.partitions = Some(3);
        t.found.insert(p, found.iter().copied().collect());
    }

    /// A key the sink's partitioner places in partition `p` of 3.
    fn key_in(p: i32) -> Vec<u8> {
        let sink = sink();
        (0..)
            .map(|i: u32| i.to_string().into_bytes())
            .find(|k| sink.lane_of(k, 3) == Some(p))
            .unwrap()
    }

    #[test]
    fn outside_the_replay_window_nothing_is_checked() {
        let mut r = resume();
        assert_eq!(r.verdict(EventRef::at(0x1000, 0), "t", b"k", None, true), Verdict::Send);
        assert!(!r.is_waiting());
    }

    #[test]
    fn inside_it_events_the_sink_holds_are_skipped_and_only_those() {
        let mut r = resume();
        // 0x180#0 is missing from the partition (a failed delivery): it is sent, though later
        // positions of the partition are in the sink.
        known(&mut r, 0, &[EventRef::at(0x200, 0), EventRef::at(0x200, 1)]);
        known(&mut r, 1, &[]);
        let k0 = key_in(0);
        assert_eq!(r.verdict(EventRef::at(0x180, 0), "t", &k0, None, true), Verdict::Send);
        assert_eq!(r.verdict(EventRef::at(0x200, 0), "t", &k0, None, true), Verdict::Skip);
        assert_eq!(r.verdict(EventRef::at(0x200, 1), "t", &k0, None, true), Verdict::Skip);
        assert_eq!(r.verdict(EventRef::at(0x200, 2), "t", &k0, None, true), Verdict::Send);
        assert_eq!(r.verdict(EventRef::at(0x300, 0), "t", &k0, None, true), Verdict::Send);
        assert_eq!(
            r.verdict(EventRef::at(0x200, 0), "t", &key_in(1), None, true),
            Verdict::Send
        );
        // An explicit partition wins over the key's.
        assert_eq!(
            r.verdict(EventRef::at(0x200, 0), "t", &key_in(1), Some(0), true),
            Verdict::Skip
        );
        // Without a key the sink's client picks at random: never skipped.
        assert_eq!(r.verdict(EventRef::at(0x200, 0), "t", b"", None, true), Verdict::Send);
        assert_eq!(r.skipped(), 3);
    }

    #[test]
    fn an_unknown_partition_waits_unless_waiting_is_impossible() {
        let mut r = resume();
        known(&mut r, 0, &[EventRef::at(0x200, 1)]);
        assert_eq!(
            r.verdict(EventRef::at(0x200, 0), "t", &key_in(2), None, false),
            Verdict::Send
        );
        assert!(!r.is_waiting());
    }

    #[test]
    fn a_fence_is_shown_until_it_passes_then_logged_once_and_gone() {
        let s = settings("[relay]\ndelivery = \"exactly-once\"\n");
        let now = Instant::now();
        let fence = Fence {
            until: now + Duration::from_secs(5),
            until_utc: std::time::SystemTime::now() + Duration::from_secs(5),
            reason: "a test".into(),
        };
        let (mut r, _answers) = ReadBack::new(
            &s,
            sink(),
            "7000",
            ReplayWindow::new(Lsn(0x100), Lsn(0x1000)),
            Some(fence),
        );
        let note = r.hold_note(now).expect("held");
        assert!(note.text.contains("a test") && note.seconds_left > 4.0, "{note:?}");
        assert_eq!(r.hold_note(now + Duration::from_secs(6)), None);
        assert_eq!(r.hold_note(now), None, "gone for good");
    }
}
