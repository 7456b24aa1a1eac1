//! The typed pgoutput messages (protocol versions 1 and 2).
//!
//! Field names follow the PostgreSQL documentation's "Logical Replication Message Formats".
//! Strings are decoded as UTF-8: the walsender converts names and text values to the
//! connection's `client_encoding`, so the relay must connect with `client_encoding=UTF8`
//! (the default for `tokio-postgres`). Logical decoding message content is sent as raw
//! bytes without conversion, so it stays `Bytes`.

use bytes::Bytes;

use super::PgTimestamp;
use crate::postgres::lsn::Lsn;

/// One decoded pgoutput message (the payload of one XLogData frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeInfo),
    Insert(Insert),
    Update(Update),
    Delete(Delete),
    Truncate(Truncate),
    Message(LogicalDecodingMessage),
    /// Protocol 2 (`streaming 'on'`): a block of an in-progress transaction's changes starts.
    StreamStart(StreamStart),
    /// Protocol 2: the current block of streamed changes ends.
    StreamStop,
    /// Protocol 2: a streamed transaction committed.
    StreamCommit(StreamCommit),
    /// Protocol 2: a streamed transaction, or one of its subtransactions, aborted.
    StreamAbort(StreamAbort),
}

/// 'S': the changes that follow, up to a Stream Stop, belong to the in-progress transaction
/// `xid` (each carries its own, possibly a subtransaction's, xid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    /// True for the transaction's first block.
    pub first_segment: bool,
}

/// 'c': the streamed transaction `xid` committed; the same positions as a [`Commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    /// Currently always 0; PostgreSQL reserves it.
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// 'A': the streamed transaction `xid` aborted (`subxid == xid`), or only its subtransaction
/// `subxid` did (a `ROLLBACK TO SAVEPOINT`): those changes are never committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    pub subxid: u32,
}

impl StreamAbort {
    /// The whole transaction aborted, not only a subtransaction.
    pub fn is_toplevel(&self) -> bool {
        self.xid == self.subxid
    }
}

/// 'B': a transaction starts. Changes follow, then a [`Commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record (equal to [`Commit::commit_lsn`]), not the
    /// position to confirm after processing; that is [`Commit::end_lsn`].
    pub final_lsn: Lsn,
    pub commit_time: PgTimestamp,
    pub xid: u32,
}

/// 'C': the transaction announced by the last [`Begin`] is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Currently always 0; PostgreSQL reserves it.
    pub flags: u8,
    /// LSN of the commit record itself.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: the position to report as flushed once the
    /// transaction is durably handled, so that the server never resends it.
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// 'O': the transaction was replayed from another node through a replication origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// LSN of the commit on the origin server (as set by `pg_replication_origin_xact_setup`).
    pub commit_lsn: Lsn,
    pub name: String,
}

/// 'R': the shape of a table, sent before its first change in a session and again after
/// the server's relation cache entry was invalidated (DDL, TRUNCATE, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `relreplident`: b'd' default (primary key), b'n' nothing, b'f' full, b'i' index.
    pub replica_identity: u8,
    /// The published columns in attribute order; dropped and generated columns are absent,
    /// so tuple column *i* matches `columns[i]`, not `attnum` *i + 1*.
    pub columns: Vec<RelationColumn>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 0 set: part of the replica identity ("key"). With REPLICA IDENTITY FULL every
    /// column has it.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod`, -1 when the type has none.
    pub type_modifier: i32,
}

impl RelationColumn {
    /// Whether the column is part of the replica identity.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// 'Y': a non-built-in data type used by a following [`Relation`], so the client can map
/// its OID to a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
}

/// 'I': a row was inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub relation_oid: u32,
    pub new: TupleData,
}

/// 'U': a row was updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub relation_oid: u32,
    /// The old row's identity: [`OldTuple::Key`] only when the replica identity columns
    /// changed, [`OldTuple::Full`] always under REPLICA IDENTITY FULL, otherwise absent.
    pub old: Option<OldTuple>,
    pub new: TupleData,
}

/// 'D': a row was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub relation_oid: u32,
    pub old: OldTuple,
}

/// The old row of an update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// 'K': the replica identity columns; the other columns are sent as [`ColumnValue::Null`].
    Key(TupleData),
    /// 'O': the whole old row (REPLICA IDENTITY FULL).
    Full(TupleData),
}

impl OldTuple {
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// 'T': tables were truncated (one message may cover several tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Bit 0: CASCADE, bit 1: RESTART IDENTITY.
    pub options: u8,
    pub relation_oids: Vec<u32>,
}

impl Truncate {
    pub fn cascade(&self) -> bool {
        self.options & 1 != 0
    }

    pub fn restart_identity(&self) -> bool {
        self.options & 2 != 0
    }
}

/// 'M': a message written by `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalDecodingMessage {
    /// True when emitted transactionally: it then arrives between Begin and Commit, and
    /// only if the transaction committed. Non-transactional messages arrive on their own.
    pub transactional: bool,
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

/// The columns of one row, in [`Relation::columns`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData {
    pub columns: Vec<ColumnValue>,
}

/// One column of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// 'n'
    Null,
    /// 'u': an unchanged out-of-line (TOASTed) value the server did not send; keep the
    /// previous value. Only appears in the new tuple of an update.
    UnchangedToast,
    /// 't': the type's text output (as `typoutput` would print it), in client encoding.
    Text(Bytes),
    /// 'b': the type's binary send format; only with the `binary 'true'` option.
    Binary(Bytes),
}

#[cfg(test)]
impl Relation {
    /// A relation of `text` columns, as unit tests of the layers above need one.
    pub(crate) fn text_columns(namespace: &str, name: &str, columns: &[&str]) -> Relation {
        Relation {
            oid: 1,
            namespace: namespace.into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns.iter().map(|n| RelationColumn::new(0, n, 25, -1)).collect(),
        }
    }
}

#[cfg(test)]
impl RelationColumn {
    /// A column as tests write one: flags, name, type OID, type modifier.
    pub(crate) fn new(flags: u8, name: &str, type_oid: u32, type_modifier: i32) -> RelationColumn {
        RelationColumn {
            flags,
            name: name.into(),
            type_oid,
            type_modifier,
        }
    }
}
