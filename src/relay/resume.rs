//! Exactly-once resume (`relay.delivery = "exactly-once"`): a (re)started stream skips the
//! events Kafka already holds, found by reading back the tail of each partition it is about to
//! write — no broker transactions, any Kafka.
//!
//! **Positions.** Every record of an exactly-once relay carries three headers after its own:
//! [`HEADER_SOURCE`] (`<database system identifier>/<slot>`: which relay wrote it),
//! [`HEADER_COMMIT_LSN`] (its transaction's commit LSN, PostgreSQL's text form) and
//! [`HEADER_INDEX`] (its 0-based index among that transaction's outbox events). Positions order
//! by commit LSN, then index — the order in which the relay writes every partition.
//!
//! **Skipped only when seen.** A replayed event is skipped only when a record of this source with
//! *its exact position* is in its partition: never inferred from a neighbour, so a gap (an event
//! whose delivery failed while a later one of the partition landed) can cost a duplicate but
//! never an event. The read-back collects this source's positions at or above the replay start
//! (the slot's confirmed position: everything before it is in Kafka), reading backwards from the
//! partition's end until it meets one of this source's records from before the replay start.
//! One source writes each partition in commit order, so everything after that record was read;
//! a record it did not read is sent again (a duplicate at worst).
//!
//! **The replay window.** Only events whose transaction committed before the server's WAL
//! position read right after `START_REPLICATION` ([`replay_end`]; the slot is ours by then, so no
//! earlier holder can still be streaming) can have been published before. Later events are sent
//! without any check: steady state costs nothing. A replay-window event needs its partition's
//! tail: computed with the producer's partitioner (`sink::ReadBackSpec::partition_for`, or the record's explicit
//! partition), read back once per session on a thread of its own, lazily, before the first
//! event for that partition is produced. Until it is known the stream reads no frames: the frame
//! that needed it is kept, as decoded, and published afterwards (`stream.rs`'s `Pending`).
//!
//! **Gaps cost nothing but duplicates.** A failed delivery can leave a gap (librdkafka may still
//! deliver later records of the partition, e.g. after an epoch bump), and a wind-down may give
//! up on outstanding deliveries: the missing event's position is not in Kafka, so the replay
//! sends it, whatever its neighbours are. A record without a key has no computable partition
//! and is never skipped.
//!
//! **The frozen holder.** A holder paused mid-flight whose slot a standby takes over must not
//! publish afterwards what the standby already checked: this stream hands no record to
//! librdkafka once it went more than [`RelaySettings::stale_limit`] without sending a status
//! update (the walsender may be gone) — [`RelayError::Paused`], checked before each hand-over and
//! before each status update, and the session then purges its producer's queue at once. Sending
//! is not being heard: a holder cut off from PostgreSQL by a silent network fault keeps writing
//! status updates into its socket while its walsender times out and a standby takes over, and
//! when the link heals the frames the dead walsender had sent arrive and would be published. So
//! the stream must also *hear* the server: a frame that arrives after a silence of more than
//! ¾ of the server's `wal_sender_timeout` is not handed on and the status tick ends such a
//! session ([`RelayError::Unheard`]). ¾ because the walsender frees the slot only after the whole
//! timeout without our replies (so the holder stops first), while a busy walsender (decoding a
//! large transaction) reads our replies, and answers our reply requests, at least every half of
//! it. Every status update asks for a reply once a status interval passed in silence; a pause of
//! reading for backpressure counts as hearing, as for `relay.receive_timeout_ms` — and a
//! session that took the slot over waits, before its first read-back, until whatever the old
//! holder may still have queued has landed or expired (`takeover.rs`: the fence). What remains is
//! in docs/reliability.md.
//!
//! **One place.** The rest of the stream meets exactly-once only through [`Guarantee`]: the
//! coordinator (`stream.rs`) shows it every decoded frame ([`Guarantee::observe`]), the publish
//! step asks it before handing a record to the sink ([`Guarantee::admit`]) and lets it stamp the
//! record ([`Guarantee::stamp`]), confirm reports status updates, and the event loop feeds it
//! read-backs. At-least-once is the same enum's other arm, which admits everything and stamps
//! nothing.
//!
//! [`RelaySettings::stale_limit`]: crate::config::relay::RelaySettings::stale_limit

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use tokio::sync::mpsc;
use tracing::info;

use super::decode::Decoded;
use super::error::RelayError;
use super::quarantine::EventRef;
use crate::config::Settings;
use crate::ops::metrics::{EVENTS_SKIPPED_IN_KAFKA, PARTITIONS_READ_BACK, READ_BACK_SECONDS};
use crate::postgres::lsn::Lsn;
use crate::sink::ExactlyOnce;
use crate::sink::{HeaderGet, ReadBack, ReadBackError, ReadBackSpec, Tail};

/// `<database system identifier>/<slot>`: which relay wrote the record.
pub(crate) const HEADER_SOURCE: &str = "outbox-relay-source";
/// The commit LSN of the record's transaction, as PostgreSQL prints it (`16/B374D848`).
pub(crate) const HEADER_COMMIT_LSN: &str = "outbox-relay-commit-lsn";
/// The record's 0-based index among its transaction's outbox events (decimal).
pub(crate) const HEADER_INDEX: &str = "outbox-relay-index";

/// The headers that carry `at` written by `source`, formatted into `buf`.
pub(crate) fn position_headers<'b>(
    source: &'b str,
    at: EventRef,
    buf: &'b mut [u8; 40],
) -> [(&'static str, &'b [u8]); 3] {
    let (lsn, index) = buf.split_at_mut(20);
    let lsn_len = {
        let mut w = &mut lsn[..];
        let _ = write!(w, "{}", at.commit_lsn);
        20 - w.len()
    };
    let index_len = {
        let mut w = &mut index[..];
        let _ = write!(w, "{}", at.seq);
        20 - w.len()
    };
    [
        (HEADER_SOURCE, source.as_bytes()),
        (HEADER_COMMIT_LSN, &lsn[..lsn_len]),
        (HEADER_INDEX, &index[..index_len]),
    ]
}

/// What to do with one replay-window record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Send,
    /// Kafka already holds it.
    Skip,
    /// Its partition's tail is being read back; come back with the same frame.
    Wait,
}

/// What this session knows about one record's partition.
enum Lookup {
    /// Outside the replay window, in a topic that did not exist, or without a computable
    /// partition: sent as it is.
    Unchecked,
    /// The partition was read back: whether Kafka holds the record's exact position.
    Known(bool),
    /// Not read back yet (with the topic's partition count when known).
    Unknown(Option<Option<i32>>),
}

/// One topic as read back this session.
#[derive(Debug, Default)]
struct TopicTail {
    /// `None`: the topic did not exist (nothing of it is in Kafka).
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

pub(crate) struct Done {
    reader: Option<ReadBack>,
    topic: String,
    outcome: Result<Found, ReadBackError>,
    elapsed: Duration,
}

pub(crate) type DoneReceiver = mpsc::UnboundedReceiver<Done>;

/// The delivery guarantee of one session, as the stream sees it (module docs: "One place").
pub(crate) enum Guarantee {
    AtLeastOnce,
    ExactlyOnce(Box<Resume>),
    /// Exactly-once through sink transactions (`seal.rs`): no read-back.
    Sealed(Box<super::seal::Sealing>),
}

/// What [`Guarantee::stamp`] adds to a record: position headers and a broker deduplication key.
pub(crate) struct Stamp<'b> {
    pub(crate) headers: Option<[(&'static str, &'b [u8]); 3]>,
    pub(crate) dedup_key: Option<String>,
}

impl Guarantee {
    /// Every decoded frame: exactly-once stops a stream that went stale (it may have been taken
    /// over) before it hands anything on, and notes how far the stream got.
    pub(crate) fn observe(&mut self, decoded: &Decoded) -> Result<(), RelayError> {
        let Guarantee::ExactlyOnce(resume) = self else {
            // Kafka transactions need no staleness check: a standby's init_transactions fences
            // a frozen holder's producer, whose late writes the broker then refuses.
            return Ok(());
        };
        // A frame after a silence past the unheard limit may come from a walsender that is long
        // gone (a healed network cut): nothing of it is handed on, keepalives included.
        resume.check_heard()?;
        resume.heard();
        match decoded {
            Decoded::Keepalive { wal_end, .. } => resume.reached(*wal_end),
            Decoded::Begin { commit_lsn, .. } => {
                resume.check_alive()?;
                resume.reached(*commit_lsn);
            }
            _ => resume.check_alive()?,
        }
        Ok(())
    }

    /// Whether a record at `at` for `topic` (keyed `key`, or placed in `explicit`) goes out
    /// ([`Resume::verdict`]); `dead_letter_topic`: where the record's dead letter would go, should
    /// the broker refuse it — checked now, so that the dead letter never has to wait.
    pub(crate) fn admit(
        &mut self,
        at: EventRef,
        topic: &str,
        key: &[u8],
        explicit: Option<i32>,
        dead_letter_topic: Option<&str>,
        may_wait: bool,
    ) -> Verdict {
        let resume = match self {
            Guarantee::AtLeastOnce => return Verdict::Send,
            Guarantee::Sealed(sealing) => return sealing.admit(at),
            Guarantee::ExactlyOnce(resume) => resume,
        };
        match resume.verdict(at, topic, key, explicit, may_wait) {
            Verdict::Send => {}
            other => return other,
        }
        match dead_letter_topic {
            Some(dlt) if may_wait && !resume.prepare(at, dlt, key, None) => Verdict::Wait,
            _ => Verdict::Send,
        }
    }

    /// What a record at `at` carries for the guarantee (nothing at-least-once).
    pub(crate) fn stamp<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> Stamp<'b> {
        match self {
            Guarantee::AtLeastOnce => Stamp {
                headers: None,
                dedup_key: None,
            },
            Guarantee::ExactlyOnce(resume) => Stamp {
                dedup_key: resume.dedup_key(at),
                headers: Some(resume.position_headers(at, buf)),
            },
            Guarantee::Sealed(sealing) => Stamp {
                dedup_key: None,
                headers: Some(position_headers(&sealing.source, at, buf)),
            },
        }
    }

    /// Sink transactions: the most the flush LSN may say (`seal.rs`); `None`: no limit.
    pub(crate) fn confirm_limit(&self) -> Option<crate::postgres::lsn::Lsn> {
        match self {
            Guarantee::Sealed(sealing) => sealing.limit(),
            _ => None,
        }
    }

    /// Sink transactions: the unit being sealed and the open one, for the stream (`seal.rs`).
    pub(crate) fn sealing(&mut self) -> Option<&mut super::seal::Sealing> {
        match self {
            Guarantee::Sealed(sealing) => Some(sealing),
            _ => None,
        }
    }

    /// Sink transactions: a seal is under way (the sink takes no records meanwhile).
    pub(crate) fn is_sealing(&self) -> bool {
        matches!(self, Guarantee::Sealed(s) if s.is_sealing())
    }

    /// Sink transactions: the open unit is full (`seal.rs`).
    pub(crate) fn unit_full(&self) -> bool {
        matches!(self, Guarantee::Sealed(s) if s.unit_full())
    }

    pub(crate) fn status_sent(&mut self) {
        if let Guarantee::ExactlyOnce(resume) = self {
            resume.status_sent();
        }
    }

    /// Exactly-once: errs when the stream went past the stale limit without sending a status
    /// update, or past the unheard limit without hearing the server (either way it may have
    /// been taken over).
    pub(crate) fn check_alive(&self) -> Result<(), RelayError> {
        match self {
            Guarantee::AtLeastOnce | Guarantee::Sealed(_) => Ok(()),
            Guarantee::ExactlyOnce(resume) => {
                resume.check_alive()?;
                resume.check_heard()
            }
        }
    }

    /// Reading is paused for backpressure: silence says nothing about the server meanwhile.
    pub(crate) fn heard(&mut self) {
        if let Guarantee::ExactlyOnce(resume) = self {
            resume.heard();
        }
    }

    /// Exactly-once: the next status update asks the server for a reply (a status interval
    /// passed without hearing it), so a live, idle walsender is heard every status interval.
    pub(crate) fn wants_reply(&self) -> bool {
        matches!(self, Guarantee::ExactlyOnce(resume) if resume.wants_reply())
    }

    pub(crate) fn on_done(&mut self, done: Done) -> Result<(), RelayError> {
        match self {
            Guarantee::AtLeastOnce | Guarantee::Sealed(_) => Ok(()),
            Guarantee::ExactlyOnce(resume) => resume.on_done(done),
        }
    }

    /// Past the replay window (at-least-once: there is none).
    pub(crate) fn past_window(&self) -> bool {
        match self {
            Guarantee::AtLeastOnce | Guarantee::Sealed(_) => true,
            Guarantee::ExactlyOnce(resume) => resume.past_window(),
        }
    }

    /// Events skipped because the broker held them already.
    pub(crate) fn skipped(&self) -> u64 {
        match self {
            Guarantee::AtLeastOnce => 0,
            Guarantee::ExactlyOnce(resume) => resume.skipped(),
            Guarantee::Sealed(sealing) => sealing.skipped(),
        }
    }

    /// The session ends (exactly-once says what its check found).
    pub(crate) fn finish(self) {
        match self {
            Guarantee::AtLeastOnce => {}
            Guarantee::ExactlyOnce(resume) => resume.finish(),
            Guarantee::Sealed(sealing) => sealing.finish(),
        }
    }
}

/// The exactly-once state of one streaming session.
pub(crate) struct Resume {
    /// [`HEADER_SOURCE`]'s value.
    source: String,
    /// How the sink avoids duplicates: read back here, or leave it to the broker.
    strategy: ExactlyOnce,
    replay_start: Lsn,
    replay_end: Lsn,
    /// What the sink's read-back needs (the sink's own business: `sink::ReadBackSpec`).
    spec: ReadBackSpec,
    timeout: Duration,
    max_records: usize,
    topics: HashMap<String, TopicTail>,
    /// Lent to the running job.
    reader: Option<ReadBack>,
    waiting: bool,
    done_tx: mpsc::UnboundedSender<Done>,
    /// No read-back before this (a takeover's fence: `takeover.rs`).
    fence: Option<Instant>,
    last_status: Instant,
    /// When the server was last heard (a frame read, or reading paused on purpose).
    last_heard: Instant,
    /// Silence after which status updates ask for a reply (the status interval).
    reply_after: Duration,
    /// Silence after which nothing read is handed on (¾ of `wal_sender_timeout`; none when the
    /// server has no timeout: its walsender then never lets the slot go on silence).
    unheard_limit: Option<Duration>,
    stale_limit: Duration,
    skipped: u64,
    partitions_read: u64,
    read_back_time: Duration,
    window_logged: bool,
}

impl Resume {
    /// `source`: the database system identifier; `replay_start`: the slot's confirmed position;
    /// `replay_end`: the server's WAL position once the slot was ours; `fence`: wait until
    /// then before the first read-back.
    pub(crate) fn new(
        settings: &Settings,
        system_id: &str,
        replay_start: Lsn,
        replay_end: Lsn,
        fence: Option<Instant>,
    ) -> (Resume, DoneReceiver) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let resume = Resume {
            source: format!("{system_id}/{}", settings.postgres.slot),
            strategy: crate::sink::exactly_once(settings),
            replay_start,
            replay_end,
            spec: ReadBackSpec::of(settings),
            timeout: settings.relay.connect_timeout,
            max_records: settings.relay.read_back_max_records,
            topics: HashMap::new(),
            reader: None,
            waiting: false,
            done_tx,
            fence,
            last_status: Instant::now(),
            last_heard: Instant::now(),
            reply_after: settings.relay.status_interval,
            unheard_limit: None,
            stale_limit: settings.relay.stale_limit(),
            skipped: 0,
            partitions_read: 0,
            read_back_time: Duration::ZERO,
            window_logged: false,
        };
        (resume, done_rx)
    }

    /// A read-back is running.
    #[cfg(test)]
    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting
    }

    /// The headers that carry `at` (with [`HEADER_SOURCE`]), formatted into `buf`.
    pub(crate) fn position_headers<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> [(&'static str, &'b [u8]); 3] {
        position_headers(&self.source, at, buf)
    }

    /// The key a deduplicating broker drops replays by (`<source>/<commit LSN>/<index>`), when
    /// the sink is one ([`ExactlyOnce::BrokerDeduplicates`]); `None` otherwise.
    pub(crate) fn dedup_key(&self, at: EventRef) -> Option<String> {
        (self.strategy == ExactlyOnce::BrokerDeduplicates)
            .then(|| format!("{}/{}/{}", self.source, at.commit_lsn, at.seq))
    }

    /// Whether a record at `at` for `topic` (keyed `key`, or placed in `explicit`) goes to
    /// Kafka. Outside the replay window: always. Inside: once its partition's tail is known,
    /// skipped when Kafka holds it; until then [`Verdict::Wait`] — a read-back is started unless
    /// `may_wait` is false, in which case the record is sent (a possible duplicate, never a loss).
    pub(crate) fn verdict(
        &mut self,
        at: EventRef,
        topic: &str,
        key: &[u8],
        explicit: Option<i32>,
        may_wait: bool,
    ) -> Verdict {
        match self.lookup(at, topic, key, explicit) {
            Lookup::Unchecked => Verdict::Send,
            Lookup::Known(true) => {
                self.skipped += 1;
                counter!(EVENTS_SKIPPED_IN_KAFKA).increment(1);
                Verdict::Skip
            }
            Lookup::Known(false) => Verdict::Send,
            Lookup::Unknown(_) if !may_wait => Verdict::Send,
            Lookup::Unknown(partitions) => {
                self.start(Job {
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
    pub(crate) fn prepare(&mut self, at: EventRef, topic: &str, key: &[u8], explicit: Option<i32>) -> bool {
        let Lookup::Unknown(partitions) = self.lookup(at, topic, key, explicit) else {
            return true;
        };
        self.start(Job {
            topic: topic.to_owned(),
            key: key.to_vec(),
            explicit,
            partitions,
        });
        false
    }

    fn lookup(&self, at: EventRef, topic: &str, key: &[u8], explicit: Option<i32>) -> Lookup {
        // A deduplicating broker drops replays itself: nothing to read back.
        if at.commit_lsn >= self.replay_end || self.strategy != ExactlyOnce::ReadBack {
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
        match explicit.or_else(|| self.spec.partition_for(key, count)) {
            Some(p) if (0..count).contains(&p) => match t.found.get(&p) {
                Some(found) => Lookup::Known(found.contains(&at)),
                None => Lookup::Unknown(Some(Some(count))),
            },
            _ => Lookup::Unchecked,
        }
    }

    /// Reads back on a thread of its own (the reader's calls block); the answer arrives on the
    /// session's [`DoneReceiver`].
    fn start(&mut self, job: Job) {
        self.waiting = true;
        let reader = self.reader.take();
        let (spec, timeout, max) = (self.spec.clone(), self.timeout, self.max_records);
        let (source, fence, tx) = (self.source.clone(), self.fence.take(), self.done_tx.clone());
        let floor = EventRef {
            commit_lsn: self.replay_start,
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
                    None => reader.insert(spec.open(timeout, max)?),
                };
                let count = match job.partitions {
                    Some(count) => count,
                    None => r.partition_count(&job.topic)?,
                };
                let Some(count) = count else { return Ok((None, None)) };
                let Some(p) = job.explicit.or_else(|| spec.partition_for(&job.key, count)) else {
                    return Ok((Some(count), None));
                };
                if !(0..count).contains(&p) {
                    return Ok((Some(count), None));
                }
                let tail = r.own_since(&job.topic, p, &floor, |h| own_position(h, &source))?;
                Ok((Some(count), Some((p, tail))))
            })();
            let _ = tx.send(Done {
                reader,
                topic,
                outcome,
                elapsed: started.elapsed(),
            });
        });
    }

    /// A read-back finished: what it found becomes this session's knowledge.
    pub(crate) fn on_done(&mut self, done: Done) -> Result<(), RelayError> {
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

    /// A status update went out: the walsender heard from this stream.
    pub(crate) fn status_sent(&mut self) {
        self.last_status = Instant::now();
    }

    /// Errs when the stream went too long without a status update to hand records to librdkafka.
    pub(crate) fn check_alive(&self) -> Result<(), RelayError> {
        let silent = self.last_status.elapsed();
        if silent > self.stale_limit {
            return Err(RelayError::Paused {
                paused_ms: silent.as_millis() as u64,
            });
        }
        Ok(())
    }

    pub(crate) fn heard(&mut self) {
        self.last_heard = Instant::now();
    }

    pub(crate) fn wants_reply(&self) -> bool {
        self.last_heard.elapsed() >= self.reply_after
    }

    /// Sets the silence after which nothing read is handed on ([`unheard_limit`]).
    pub(crate) fn set_unheard_limit(&mut self, limit: Option<Duration>) {
        self.unheard_limit = limit;
    }

    /// Errs when the server was not heard for longer than the unheard limit: its walsender may
    /// time out (or have timed out, and the slot been taken over) while the network is cut.
    pub(crate) fn check_heard(&self) -> Result<(), RelayError> {
        let Some(limit) = self.unheard_limit else { return Ok(()) };
        let silent = self.last_heard.elapsed();
        if silent > limit {
            return Err(RelayError::Unheard {
                silent_ms: silent.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// The stream reached `lsn`: once past the replay window, says what the check found (once).
    pub(crate) fn reached(&mut self, lsn: Lsn) {
        if !self.window_logged && lsn >= self.replay_end {
            self.log_window();
        }
    }

    fn log_window(&mut self) {
        self.window_logged = true;
        if self.strategy != ExactlyOnce::ReadBack {
            info!(
                replay_from = %self.replay_start,
                replay_to = %self.replay_end,
                source = %self.source,
                "exactly-once: the replay window went out with deduplication keys; the broker dropped what it held"
            );
            return;
        }
        info!(
            skipped_already_in_kafka = self.skipped,
            partitions_read_back = self.partitions_read,
            read_back_ms = self.read_back_time.as_millis() as u64,
            replay_from = %self.replay_start,
            replay_to = %self.replay_end,
            source = %self.source,
            "exactly-once: replay window checked against the broker"
        );
    }

    /// The stream got past the replay window: nothing more is read back this session.
    pub(crate) fn past_window(&self) -> bool {
        self.window_logged
    }

    pub(crate) fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The session ends: says what the check found, if the stream never got past the window.
    pub(crate) fn finish(mut self) {
        if !self.window_logged {
            self.log_window();
        }
    }
}

/// The position of a record `source` wrote, from its headers.
fn own_position(h: &dyn HeaderGet, source: &str) -> Option<EventRef> {
    if h.get(HEADER_SOURCE)? != source.as_bytes() {
        return None;
    }
    let commit_lsn = std::str::from_utf8(h.get(HEADER_COMMIT_LSN)?)
        .ok()?
        .parse::<Lsn>()
        .ok()?;
    let seq = std::str::from_utf8(h.get(HEADER_INDEX)?).ok()?.parse::<u32>().ok()?;
    Some(EventRef { commit_lsn, seq })
}

/// The server's WAL position now: no transaction committing at or after it can have been sent
/// to an earlier walsender. Read once the slot is this session's.
pub(crate) async fn replay_end(control: &tokio_postgres::Client) -> Result<Lsn, RelayError> {
    let row = control
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)::text",
            &[],
        )
        .await?;
    let text: Option<String> = row.get(0);
    text.and_then(|t| t.parse::<Lsn>().ok())
        .ok_or(RelayError::NoWalPosition)
}

/// ¾ of the server's `wal_sender_timeout` (`None` when it is 0: no timeout), see the module docs.
pub(crate) async fn unheard_limit(control: &tokio_postgres::Client) -> Result<Option<Duration>, RelayError> {
    let row = control
        .query_one(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?;
    let ms: i64 = row.get(0);
    Ok(unheard_limit_of(ms))
}

fn unheard_limit_of(wal_sender_timeout_ms: i64) -> Option<Duration> {
    (wal_sender_timeout_ms > 0).then(|| Duration::from_millis(wal_sender_timeout_ms as u64 * 3 / 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    fn at(lsn: u64, seq: u32) -> EventRef {
        EventRef {
            commit_lsn: Lsn(lsn),
            seq,
        }
    }

    fn resume() -> Resume {
        let s = settings("[relay]\ndelivery = \"exactly-once\"\n");
        Resume::new(&s, "7000000000000000001", Lsn(0x100), Lsn(0x1000), None).0
    }

    /// As if partition `p` of a 3-partition `t` had been read back, finding `found`.
    fn known(r: &mut Resume, p: i32, found: &[EventRef]) {
        let t = r.topics.entry("t".into()).or_default();
        t.partitions = Some(3);
        t.found.insert(p, found.iter().copied().collect());
    }

    /// A key the sink's partitioner places in partition `p` of 3.
    fn key_in(p: i32) -> Vec<u8> {
        let spec = resume().spec;
        (0..)
            .map(|i: u32| i.to_string().into_bytes())
            .find(|k| spec.partition_for(k, 3) == Some(p))
            .unwrap()
    }

    /// The split brain the network nemesis found (`tests/it/nemesis.rs`, `split_brain_exactly_once`):
    /// a holder cut off from PostgreSQL kept sending status updates into its socket, so it never
    /// counted as paused; when the link healed, the frames its timed-out walsender had sent
    /// arrived after a standby had taken over and read back, and were published again.
    #[test]
    fn a_frame_after_a_silence_past_the_unheard_limit_is_not_handed_on() {
        let mut r = resume();
        // The harness's wal_sender_timeout (5 s).
        r.set_unheard_limit(unheard_limit_of(5_000));
        assert_eq!(r.unheard_limit, Some(Duration::from_millis(3_750)));
        r.heard();
        r.status_sent();
        assert!(!r.wants_reply());
        let mut g = Guarantee::ExactlyOnce(Box::new(r));
        let begin = Decoded::Begin {
            commit_lsn: Lsn(0x2000),
            xid: 7,
            commit_time_unix_us: 0,
        };
        g.observe(&begin).expect("heard just now");
        let Guarantee::ExactlyOnce(r) = &mut g else {
            unreachable!()
        };
        let silence = Duration::from_millis(4_000);
        r.last_heard = Instant::now().checked_sub(silence).expect("instant");
        // Still sending status updates (into a cut network): the old check alone passed.
        r.status_sent();
        assert!(r.check_alive().is_ok());
        assert!(r.wants_reply(), "a silent stream asks the server for a reply");
        let err = g
            .observe(&begin)
            .expect_err("a frame after the silence is not handed on");
        assert!(matches!(err, RelayError::Unheard { .. }), "{err}");
        assert!(err.is_transient(), "the session reconnects and replays");
        assert!(g.check_alive().is_err(), "the status tick ends the session too");
        let keepalive = Decoded::Keepalive {
            wal_end: Lsn(0x2000),
            reply_requested: false,
        };
        assert!(g.observe(&keepalive).is_err(), "keepalives included");
    }

    #[test]
    fn reading_paused_on_purpose_counts_as_hearing() {
        let mut r = resume();
        r.set_unheard_limit(unheard_limit_of(60_000));
        r.last_heard = Instant::now().checked_sub(Duration::from_secs(50)).expect("instant");
        let mut g = Guarantee::ExactlyOnce(Box::new(r));
        assert!(g.check_alive().is_err());
        g.heard();
        assert!(g.check_alive().is_ok());
        assert!(!g.wants_reply());
        assert!(!Guarantee::AtLeastOnce.wants_reply(), "at-least-once asks nothing more");
    }

    #[test]
    fn without_a_wal_sender_timeout_silence_stops_nothing() {
        assert_eq!(unheard_limit_of(0), None);
        let mut r = resume();
        r.last_heard = Instant::now().checked_sub(Duration::from_secs(600)).expect("instant");
        assert!(r.check_heard().is_ok());
    }

    #[test]
    fn headers_round_trip_and_name_the_source() {
        let r = resume();
        let mut buf = [0u8; 40];
        let headers = r.position_headers(at(0x16_B374_D848, 42), &mut buf);
        let owned: Vec<(String, Vec<u8>)> = headers.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect();
        assert_eq!(
            owned,
            vec![
                (HEADER_SOURCE.to_owned(), b"7000000000000000001/outbox_relay".to_vec()),
                (HEADER_COMMIT_LSN.to_owned(), b"16/B374D848".to_vec()),
                (HEADER_INDEX.to_owned(), b"42".to_vec()),
            ]
        );
    }

    #[test]
    fn outside_the_replay_window_nothing_is_checked() {
        let mut r = resume();
        assert_eq!(r.verdict(at(0x1000, 0), "t", b"k", None, true), Verdict::Send);
        assert!(!r.is_waiting());
    }

    #[test]
    fn inside_it_events_kafka_holds_are_skipped_and_only_those() {
        let mut r = resume();
        // 0x180#0 is missing from the partition (a failed delivery): it is sent, though later
        // positions of the partition are in Kafka.
        known(&mut r, 0, &[at(0x200, 0), at(0x200, 1)]);
        known(&mut r, 1, &[]);
        let k0 = key_in(0);
        assert_eq!(r.verdict(at(0x180, 0), "t", &k0, None, true), Verdict::Send);
        assert_eq!(r.verdict(at(0x200, 0), "t", &k0, None, true), Verdict::Skip);
        assert_eq!(r.verdict(at(0x200, 1), "t", &k0, None, true), Verdict::Skip);
        assert_eq!(r.verdict(at(0x200, 2), "t", &k0, None, true), Verdict::Send);
        assert_eq!(r.verdict(at(0x300, 0), "t", &k0, None, true), Verdict::Send);
        assert_eq!(r.verdict(at(0x200, 0), "t", &key_in(1), None, true), Verdict::Send);
        // An explicit partition wins over the key's.
        assert_eq!(r.verdict(at(0x200, 0), "t", &key_in(1), Some(0), true), Verdict::Skip);
        // Without a key librdkafka picks at random: never skipped.
        assert_eq!(r.verdict(at(0x200, 0), "t", b"", None, true), Verdict::Send);
        assert_eq!(r.skipped(), 3);
    }

    #[test]
    fn an_unknown_partition_waits_unless_waiting_is_impossible() {
        let mut r = resume();
        known(&mut r, 0, &[at(0x200, 1)]);
        assert_eq!(r.verdict(at(0x200, 0), "t", &key_in(2), None, false), Verdict::Send);
        assert!(!r.is_waiting());
    }

    #[test]
    fn own_records_are_recognised_by_source() {
        struct Pairs<'a>(&'a [(&'a str, &'a [u8])]);
        impl HeaderGet for Pairs<'_> {
            fn get(&self, name: &str) -> Option<&[u8]> {
                self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
            }
        }
        let position = |headers: &[(&str, &[u8])]| own_position(&Pairs(headers), "1/s");
        let good: [(&str, &[u8]); 3] = [
            (HEADER_SOURCE, b"1/s"),
            (HEADER_COMMIT_LSN, b"0/200"),
            (HEADER_INDEX, b"3"),
        ];
        assert_eq!(position(&good), Some(at(0x200, 3)));
        let other: [(&str, &[u8]); 3] = [
            (HEADER_SOURCE, b"2/s"),
            (HEADER_COMMIT_LSN, b"0/200"),
            (HEADER_INDEX, b"3"),
        ];
        assert_eq!(position(&other), None);
        assert_eq!(position(&good[..2]), None);
    }
}
