//! What a sink can do for exactly-once delivery, declared as a value: [`ExactlyOnce`].
//!
//! A sink never learns the delivery mode. Its plugin answers what it can do with its
//! configuration — nothing (and why), let its broker drop repeats, be read back, or commit
//! records in units — and the relay chooses its strategy from that answer and `relay.delivery`,
//! once per session (`relay/guarantee/`). What each answer needs of the sink is here, in words
//! of no broker in particular:
//!
//! * **Broker deduplication**: the sink hands a record's deduplication key (`Sink::send`'s
//!   `dedup_key`) to its broker, which drops a key it saw within its window.
//! * **Read-back** ([`ReadBackSource`]): a destination is written in ordered *lanes* (a Kafka
//!   partition; a stream with one lane); the sink says which lane a key goes to, and reads a
//!   lane back from its end, showing the caller each record's headers.
//! * **Transactions** ([`Transactional`]): the sink commits what it was handed since its last
//!   seal as one unit with the caller's checkpoint ([`Sealer`]), having fenced every earlier
//!   producer of its identity when it was created.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::{Completions, Refusal, Sink};

/// How a sink can avoid republishing what it already holds, with its configuration.
#[derive(Debug, Clone)]
pub(crate) enum ExactlyOnce {
    /// Not possible: why, in the words of the refusal (docs name the fix).
    Unsupported(Cow<'static, str>),
    /// The broker drops a record whose deduplication key it has seen within its window.
    BrokerDeduplicates,
    /// The sink's stored records can be read back.
    ReadBack(Arc<dyn ReadBackSource>),
    /// The sink commits records in units with a checkpoint (`create_transactional`).
    Transactions,
}

/// A record's headers by name, as a read-back sees them.
pub(crate) trait HeaderGet {
    /// The value of the first header called `name` (`None`: absent or null).
    fn get(&self, name: &str) -> Option<&[u8]>;
}

/// Whether a record a read-back met is one of the caller's, and where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The caller's, at or above the caller's floor: kept.
    Kept,
    /// The caller's, below the floor: everything after it was read.
    Below,
    /// Not the caller's.
    Foreign,
}

/// A read-back that could not say what the sink holds.
#[derive(Debug, thiserror::Error)]
pub enum ReadBackError {
    /// `lane`: the sink's words for it ("topic t partition 3").
    #[error("reading back the tail of {lane} failed: {cause}")]
    Broker { lane: String, cause: String },
    #[error("reading back the tail of {lane} timed out after {timeout_ms} ms")]
    Timeout { lane: String, timeout_ms: u64 },
    #[error(
        "read back {read} records of {lane} (positions {from}..{high}) without reaching this relay's records from \
         before the replay, so which events the sink already holds is unknown; raise relay.read_back_max_records \
         (now {max}) or restart once with relay.delivery = \"at-least-once\" (which may publish the replayed \
         events twice)"
    )]
    BoundHit {
        lane: String,
        read: u64,
        from: i64,
        high: i64,
        max: u64,
    },
}

impl ReadBackError {
    /// Only the bound is the operator's to change; everything else is the sink's and passes.
    pub(crate) fn is_transient(&self) -> bool {
        !matches!(self, ReadBackError::BoundHit { .. })
    }
}

/// A broker client's own queue expiry: how long a record handed to the client may still reach
/// the broker after the caller handed it over (librdkafka's `message.timeout.ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientQueueExpiry {
    pub(crate) expiry: Duration,
    /// The setting that says so, for messages: "message.timeout.ms".
    pub(crate) key: &'static str,
    /// The user set it: what the sink uses when the setting is left out (`None`: this is it).
    pub(crate) unset: Option<Duration>,
}

/// A sink whose stored records can be read back ([`ExactlyOnce::ReadBack`]), made by its plugin.
pub(crate) trait ReadBackSource: std::fmt::Debug + Send + Sync {
    /// The lane of `lanes` a record keyed `key` goes to (`None`: not computable; then it is not
    /// checked).
    fn lane_of(&self, key: &[u8], lanes: i32) -> Option<i32>;

    /// How long what a producer of this sink handed its client may still land after it was
    /// handed over (`None`: nothing outlives the sink's bounded abandon). A read-back after a
    /// takeover waits that long for a frozen holder's records (`relay/takeover.rs`).
    fn queue_expiry(&self) -> Option<ClientQueueExpiry>;

    /// Opens a reader. Blocks.
    fn open(&self, timeout: Duration, max_records: usize) -> Result<Box<dyn ReadBackReader>, ReadBackError>;
}

/// A reader of what a sink stored. Every call blocks, bounded by the reader's timeout: run it on
/// a thread of its own.
pub(crate) trait ReadBackReader: Send {
    /// How many lanes `destination` has (`None`: no such destination).
    fn lanes(&self, destination: &str) -> Result<Option<i32>, ReadBackError>;

    /// Shows `seen` the lane's records from its end back to the first one `seen` calls
    /// [`Seen::Below`] (or the lane's start); returns how many records it read.
    fn scan(
        &self,
        destination: &str,
        lane: i32,
        seen: &mut dyn FnMut(&dyn HeaderGet) -> Seen,
    ) -> Result<u64, ReadBackError>;
}

/// What reading back one lane found.
#[derive(Debug)]
pub(crate) struct Tail<P> {
    /// Every position of the caller's records at or above the floor, from the lane's end back
    /// to its first record below the floor (or the lane's start).
    pub(crate) positions: BTreeSet<P>,
    pub(crate) records_read: u64,
}

/// The positions `own` finds in `lane` of `destination` at or above `floor`, reading back from
/// the lane's end until one of the caller's records below `floor`. Blocks.
pub(crate) fn tail_since<P: Ord>(
    reader: &dyn ReadBackReader,
    destination: &str,
    lane: i32,
    floor: &P,
    own: impl Fn(&dyn HeaderGet) -> Option<P>,
) -> Result<Tail<P>, ReadBackError> {
    let mut positions = BTreeSet::new();
    let records_read = reader.scan(destination, lane, &mut |headers| match own(headers) {
        Some(p) if p >= *floor => {
            positions.insert(p);
            Seen::Kept
        }
        Some(_) => Seen::Below,
        None => Seen::Foreign,
    })?;
    Ok(Tail {
        positions,
        records_read,
    })
}

/// Commits a transactional sink's records in units ([`ExactlyOnce::Transactions`]).
pub(crate) trait Sealer<Tag>: Send {
    /// Commits every record handed over since the previous seal, together with `checkpoint`
    /// (the caller's position of the last of them; `label` says it to people), as one atomic
    /// unit, and reports the outcome as one completion carrying `tag`, after the completions of
    /// those records. The caller hands nothing over until that completion arrived. A failure is
    /// transient: the unit was aborted (or its producer fenced) and none of it is visible to
    /// readers of committed records.
    fn seal(&self, checkpoint: u64, label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>>;

    /// Aborts the open unit — every record handed over since the previous seal becomes
    /// invisible to readers of committed records — and opens the next, reporting the outcome
    /// as one completion carrying `tag`. The caller hands nothing over until it arrived; the
    /// aborted records' own completions may arrive before it or after, as failures or not, and
    /// count for nothing. A failure is transient (the producer may be fenced).
    fn abort(&self, label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>>;
}

/// A transactional sink, as its plugin creates it.
pub(crate) struct Transactional<Tag> {
    pub(crate) sink: Box<dyn Sink<Tag>>,
    pub(crate) completions: Completions<Tag>,
    pub(crate) sealer: Box<dyn Sealer<Tag>>,
    /// The checkpoint the last successful seal of this sink's identity stored, read after
    /// every earlier producer of that identity was fenced (no earlier unit can still commit).
    /// `None`: none yet.
    pub(crate) checkpoint: Option<u64>,
}
