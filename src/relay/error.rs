//! Why a streaming session ended, and whether the supervisor reconnects or stops.

use crate::outbox::bad_event::BadEvent;
use crate::outbox::column_types::MappingError;
use crate::outbox::layout::LayoutError;
use crate::postgres::client::ConnectError;
use crate::postgres::failure::{describe_pg, is_transient_pg};
use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::DecodeError;
use crate::postgres::replication::error::ReplicationError;
use crate::postgres::replication::frames::FrameError;
use crate::postgres::slot::{SlotHolder, SlotQueryError};
use crate::relay::durability::WatermarkError;
use crate::sink::{SinkError, SinkFailure};

/// What the walsender sent that pgoutput's protocol rules out: frames lost or reordered on the
/// way, or a server bug. Fatal: confirming anything after it could skip a transaction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamViolation {
    #[error("Commit without Begin")]
    CommitWithoutBegin,
    #[error("Commit at {commit} does not match its Begin's final LSN {begin}")]
    CommitMismatch { commit: Lsn, begin: Lsn },
    #[error("an outbox event outside a transaction")]
    EventOutsideTransaction,
    #[error("Insert for relation {0} before its Relation message")]
    InsertBeforeRelation(u32),
    #[error("{0} inside a block of streamed changes (between Stream Start and Stream Stop)")]
    InStreamBlock(&'static str),
    #[error("{0} while a transaction sent after its commit is open (between Begin and Commit)")]
    StreamInTransaction(&'static str),
    #[error("Stream Stop outside a block of streamed changes")]
    StreamStopOutsideBlock,
    #[error("streamed protocol messages on a stream started with protocol version 1")]
    StreamingNotAskedFor,
}

/// The stage of streamed transactions (`stage.rs`) cannot keep what it must.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(
        "the streamed transaction {xid} needs more than relay.stage_disk_bytes = {limit} bytes of spill files in {}: \
         raise relay.stage_disk_bytes (and make room on that disk; docs/operations.md, \"Disk for streamed \
         transactions\"), or set postgres.streaming = \"off\" to have the server spill large transactions on its own \
         disk instead. Nothing is lost: the slot is not confirmed past the transaction, and the server sends it again",
        .dir.display()
    )]
    Full {
        xid: u32,
        limit: u64,
        dir: std::path::PathBuf,
    },
    #[error(
        "cannot {what} {}: {source}. Give the relay a writable relay.stage_dir (docs/operations.md, \"Disk for \
         streamed transactions\")",
        .path.display()
    )]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the stage lost track of transaction {0} (a bug; please report it with the log)")]
    Protocol(u32),
}

/// The relay's own machinery failed: a bug, never the data's or the servers' doing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InternalError {
    #[error("the sink's completion channel closed while the stream ran")]
    CompletionsClosed,
    #[error("the stream thread ended without a result (it panicked; see the log)")]
    StreamThreadPanicked,
    #[error("the slot monitor has no control connection")]
    NoControlConnection,
    #[error("an outbox row was decoded against a relation that is not an outbox table")]
    RowWithoutLayout,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("control query failed: {}", describe_pg(.0))]
    Control(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Slot(#[from] SlotQueryError),
    #[error(
        "replication slot {slot:?} does not exist in this database. Create it with `outbox-relay setup --config …` \
         (if it existed before, it was dropped, or this server is a promoted standby that had no copy of it — \
         PostgreSQL 14-16 have no failover slots: events in WAL it retained may be unpublished. Recover with \
         `outbox-relay setup --backfill --since-id N` or `--since TIMESTAMP`, which re-creates the slot and first \
         republishes the outbox rows after that point; the relay logs the last confirmed commit time. See \
         docs/operations.md, \"Failover on PostgreSQL 14-16\")"
    )]
    SlotMissing { slot: String },
    #[error(
        "replication slot {slot:?} uses output plugin {plugin}, but outbox-relay needs pgoutput, and a slot's plugin is \
         fixed when it is created, so the relay cannot stream from it (nor adopt it, if it is Debezium's: \
         plugin.name = {plugin}). Give the relay a slot of its own: set postgres.slot to another name \
         (e.g. outbox_relay), run `outbox-relay setup`, and switch over with the overlap procedure in \
         docs/migrating-from-debezium.md (\"Switch-over without losing an event\"). Drop {slot:?} once nothing \
         uses it: SELECT pg_drop_replication_slot('{slot}')"
    )]
    WrongSlotPlugin { slot: String, plugin: String },
    #[error(
        "replication slot {slot:?} is a physical slot (used by a standby or a backup tool), not a logical one. Set \
         postgres.slot to the relay's own slot (created by `outbox-relay setup`)"
    )]
    PhysicalSlot { slot: String },
    #[error(
        "publication {publication:?} publishes {actions} but not insert, so no outbox row would ever reach the relay \
         (outbox rows are events when inserted). Run: ALTER PUBLICATION {publication} SET (publish = \
         '{with_insert}') — or, if others rely on it as it is, set postgres.publication to a name of the relay's own \
         and run `outbox-relay setup`, which creates it"
    )]
    PublicationWithoutInserts {
        publication: String,
        actions: String,
        /// The publication's operations with insert added, for the fix.
        with_insert: String,
    },
    #[error(
        "publication {publication:?} does not publish the outbox table(s) {tables}, so their events would never \
         reach the relay while the slot is confirmed past them. Run `outbox-relay setup` (it adds the outbox tables \
         to the relay's publication), or ALTER PUBLICATION {publication} ADD TABLE {tables}"
    )]
    PublicationMissesTables { publication: String, tables: String },
    #[error(
        "replication slot {slot:?} is invalidated ({cause}): PostgreSQL removed WAL the relay had not yet delivered, \
         so outbox events committed after {confirmed} may never be published. The relay never recreates a slot by \
         itself. Recover: (1) note the last event id each destination holds; (2) `outbox-relay teardown --yes` then \
         `outbox-relay setup` to create a fresh slot; (3) start the relay, then re-publish the outbox rows committed \
         since {confirmed} that the sink lacks (consumers deduplicate on the id header); (4) raise \
         max_slot_wal_keep_size or alert on retained WAL earlier. See docs/operations.md, \"Slot invalidated\""
    )]
    SlotLost {
        slot: String,
        confirmed: Lsn,
        cause: String,
    },
    #[error("replication slot {slot:?} is in use by {holder}; standing by")]
    SlotBusy { slot: String, holder: SlotHolder },
    #[error(
        "replication slot {slot:?} was advanced by something other than this relay: streaming was requested from \
         {requested}, but the slot's confirmed_flush_lsn is {confirmed}, so the server would skip the WAL in between \
         and any outbox events in it. Find out what advanced it (pg_replication_slot_advance, \
         pg_logical_slot_get_changes, another program using the slot name); if the skip was deliberate, restart \
         the relay; otherwise re-publish the outbox rows committed between those positions (docs/operations.md)"
    )]
    SlotAdvanced {
        slot: String,
        requested: Lsn,
        confirmed: Lsn,
    },
    /// The role cannot do what the configuration asks (`setup` refuses it too).
    #[error(transparent)]
    Role(#[from] crate::postgres::role::RoleRefusal),
    #[error("{0}")]
    Sink(#[source] SinkError),
    /// A shutdown's drain ran out of `relay.shutdown_timeout_ms` with records unacknowledged.
    #[error(
        "shutdown incomplete: {in_flight} event(s) handed to {sink} were not acknowledged within \
         relay.shutdown_timeout_ms ({timeout_ms} ms). Nothing is lost: slot {slot:?} was confirmed only up to \
         {confirmed}, and everything before it is in {sink}; the next start replays from there (consumers \
         deduplicate on the id header). If {sink} was reachable, raise relay.shutdown_timeout_ms to let a drain \
         finish"
    )]
    Undrained {
        sink: &'static str,
        slot: String,
        in_flight: usize,
        confirmed: Lsn,
        timeout_ms: u64,
    },
    /// The configuration asks for what the sink cannot do (`setup` refuses it too).
    #[error(transparent)]
    Refused(#[from] crate::sink::StartRefusal),
    #[error("{sink} delivery failed for the transaction committed at {commit_lsn}: {failure}; replaying from the last confirmed LSN")]
    DeliveryFailed {
        sink: &'static str,
        #[source]
        failure: Box<SinkFailure>,
        commit_lsn: Lsn,
    },
    #[error(
        "outbox event id={id} (transaction committed at {commit_lsn}) cannot be published: {cause}. Nothing from its \
         transaction on is confirmed (relay.on_bad_event = \"fail\"). The row is committed, so a restart reads it \
         again and stops here again (editing the row changes nothing: the stream reads what was committed). To go \
         on, set relay.on_bad_event = \"dead-letter\" (with relay.dead_letter_topic: the raw row is published there \
         with the error) or \"skip\" (logged and counted) and restart; or, where the configuration is the cause (a \
         [route] rule that names no legal destination, a size limit below the row), change it and restart \
         (docs/reliability.md, \"Bad rows\")"
    )]
    BadEvent {
        id: String,
        commit_lsn: Lsn,
        #[source]
        cause: BadEvent,
    },
    #[error(
        "{sink} refused the record of the transaction committed at {commit_lsn}: {failure}. It may only have shared a \
         batch with a bad record, so the stream restarts from the last confirmed LSN and sends it alone; \
         relay.on_bad_event applies if it is refused again"
    )]
    RecordRejected {
        sink: &'static str,
        #[source]
        failure: Box<SinkFailure>,
        commit_lsn: Lsn,
    },
    #[error(
        "{sink} refused the record of the transaction committed at {commit_lsn} again on its own: {failure}. It is a \
         bad event, but the refusal left the broker transaction it was in unable to commit, so the stream restarts \
         from the last confirmed LSN (that transaction is aborted) and relay.on_bad_event applies to it there"
    )]
    RecordCondemned {
        sink: &'static str,
        #[source]
        failure: Box<SinkFailure>,
        commit_lsn: Lsn,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The column mapping does not fit an outbox table (checked before streaming).
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error("undecodable pgoutput message after {lsn}: {source}")]
    Decode { lsn: Lsn, source: DecodeError },
    #[error("undecodable replication frame: {0}")]
    Frame(#[from] FrameError),
    #[error("internal bookkeeping error (a bug; please report it): {0}")]
    Watermark(#[from] WatermarkError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error("the replication stream broke pgoutput's rules: {0}. Nothing after the last confirmed position is lost; report it with the server version and the log")]
    Stream(#[from] StreamViolation),
    #[error("internal error (a bug; please report it with the log): {0}")]
    Internal(#[from] InternalError),
    #[error("the server reported no current WAL position (is it starting up or in recovery without replay?)")]
    NoWalPosition,
    #[error("cannot start the stream's thread or runtime: {0}")]
    StreamThread(#[source] std::io::Error),
    /// `[tracing]`'s exporter could not be built (`ops::tracing_export::ExporterError`'s text).
    #[error("{0}")]
    Tracing(String),
    #[error("exactly-once resume: {0}")]
    ReadBack(#[from] crate::sink::ReadBackError),
    #[error(
        "the stream sent no status update for {paused_ms} ms (the process was paused or starved): its walsender may \
         be gone and the slot taken over, so the frames in hand are dropped rather than published behind the new \
         holder; the next session replays them"
    )]
    Paused { paused_ms: u64 },
    #[error(
        "heard nothing from PostgreSQL for {silent_ms} ms (a network cut?): its walsender may have timed out and the \
         slot been taken over, so nothing more read on this connection is published; the session reconnects and \
         replays"
    )]
    Unheard { silent_ms: u64 },
}

impl RelayError {
    /// Whether reconnecting (with backoff) can fix this without an operator.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            RelayError::Replication(e) => e.is_transient(),
            RelayError::Connect(e) => e.is_transient(),
            RelayError::Control(e) => is_transient_pg(e),
            RelayError::Slot(e) => e.postgres().is_some_and(is_transient_pg),
            RelayError::DeliveryFailed { .. }
            | RelayError::RecordRejected { .. }
            | RelayError::RecordCondemned { .. }
            | RelayError::SlotBusy { .. } => true,
            RelayError::ReadBack(e) => e.is_transient(),
            RelayError::Paused { .. } | RelayError::Unheard { .. } | RelayError::NoWalPosition => true,
            RelayError::Sink(e) => e.transient,
            RelayError::Refused(_)
            | RelayError::Role(_)
            | RelayError::SlotMissing { .. }
            | RelayError::WrongSlotPlugin { .. }
            | RelayError::PhysicalSlot { .. }
            | RelayError::PublicationWithoutInserts { .. }
            | RelayError::PublicationMissesTables { .. }
            | RelayError::SlotLost { .. }
            | RelayError::SlotAdvanced { .. }
            | RelayError::BadEvent { .. }
            | RelayError::Layout(_)
            | RelayError::Mapping(_)
            | RelayError::Decode { .. }
            | RelayError::Frame(_)
            | RelayError::Watermark(_)
            | RelayError::Stream(_)
            | RelayError::Stage(_)
            | RelayError::Internal(_)
            | RelayError::StreamThread(_)
            | RelayError::Tracing(_)
            | RelayError::Undrained { .. } => false,
        }
    }

    /// The broker did not take or acknowledge an event (the session replays).
    pub(crate) fn is_delivery_failure(&self) -> bool {
        matches!(self, RelayError::DeliveryFailed { .. })
    }

    /// The session could not reach a primary, or lost it: the link broke, no host answered or
    /// none was the primary, or we reached a standby's synchronized copy of the slot. What a
    /// failover looks like from here.
    pub(crate) fn is_connection_failure(&self) -> bool {
        match self {
            RelayError::Replication(e) => match e {
                ReplicationError::Io(_)
                | ReplicationError::Connect { .. }
                | ReplicationError::Timeout { .. }
                | ReplicationError::Closed
                | ReplicationError::NoPrimary { .. } => true,
                ReplicationError::Server(s) => s.is_synced_slot_on_standby() || s.code.starts_with("57P"),
                _ => false,
            },
            RelayError::Connect(e) => e.is_transient(),
            RelayError::Control(e) => is_transient_pg(e),
            _ => false,
        }
    }

    /// Another instance holds the slot: this one is a standby.
    pub(crate) fn is_slot_busy(&self) -> bool {
        self.slot_holder().is_some()
    }

    /// Who holds the slot, when that is why the session ended: from the slot check before
    /// streaming, or from the server's refusal of `START_REPLICATION` (SQLSTATE 55006, "… is
    /// active for PID n") when another instance won the race in between.
    pub(crate) fn slot_holder(&self) -> Option<SlotHolder> {
        match self {
            RelayError::SlotBusy { holder, .. } => Some(holder.clone()),
            RelayError::Replication(ReplicationError::Server(e)) if e.code == "55006" => {
                Some(SlotHolder::from_pid(parse_holder_pid(&e.message)))
            }
            _ => None,
        }
    }
}

/// The holder's pid from the server's "replication slot \"x\" is active for PID 123" (55006).
pub(crate) fn parse_holder_pid(message: &str) -> Option<i32> {
    let at = message.rfind("PID ")? + 4;
    let digits: String = message[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_pid_comes_from_the_server_message() {
        assert_eq!(
            parse_holder_pid("replication slot \"outbox_relay\" is active for PID 31337"),
            Some(31337)
        );
        assert_eq!(parse_holder_pid("something else"), None);
    }
}
