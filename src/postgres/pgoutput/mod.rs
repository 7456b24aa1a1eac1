//! A pure decoder for PostgreSQL's `pgoutput` logical replication protocol, versions 1 and 2.
//!
//! [`decode`] turns the payload of one XLogData frame (see `crate::postgres::replication::frames`)
//! into a typed [`LogicalMessage`]. It does no I/O and keeps no state: mapping relation
//! OIDs to [`Relation`]s and pairing Begin/Commit is the caller's job. It never panics on
//! any input: short buffers, unknown tags, unknown tuple-column kinds, negative lengths and
//! trailing bytes are all [`DecodeError`]s, and hostile counts cannot trigger large
//! allocations. Column values are `Bytes` slices of the input, not copies.
//!
//! Format reference: the PostgreSQL documentation, "Logical Replication Message Formats"
//! (protocol-logicalrep-message-formats). Protocol subtleties the relay depends on:
//!
//! - **Versions 1 and 2.** Outside a block of streamed changes a change belongs to the
//!   transaction opened by the preceding [`Begin`] and carries no xid ([`decode`]). Version 2
//!   with `streaming 'on'` adds Stream Start ('S'), Stop ('E'), Commit ('c') and Abort ('A');
//!   between a Stream Start and its Stop every change message (R, Y, I, U, D, T, M) carries
//!   its (sub)transaction's xid after the tag ([`decode_streamed`]). Stream Commit and Abort
//!   arrive outside blocks; an Abort names the toplevel xid and the aborted subtransaction
//!   (equal when the whole transaction aborted). The two-phase ('b', 'P', 'K', 'r', 'p') and
//!   parallel-apply additions of versions 3 and 4 are unknown tags here: the relay does not
//!   ask for them (`postgres/replication/protocol.rs`).
//! - **Which LSN to confirm.** [`Begin::final_lsn`] is the LSN *of* the commit record (the
//!   same value as [`Commit::commit_lsn`]); [`Commit::end_lsn`] is the LSN just *past* it.
//!   Reporting `end_lsn` as flushed tells the server the whole transaction is handled;
//!   reporting `commit_lsn` would get the transaction resent after a reconnect.
//! - **Text vs binary values.** Without the `binary 'true'` option every value is
//!   [`ColumnValue::Text`]: the type's output function's text, in the connection's
//!   `client_encoding`. With it, types that have binary send functions arrive as
//!   [`ColumnValue::Binary`] in their `typsend` format.
//! - **Unchanged TOAST.** [`ColumnValue::UnchangedToast`] ('u') only appears in the new
//!   tuple of an [`Update`], for an out-of-line (TOASTed) value the update did not change;
//!   the server does not send the value, so the caller must not treat it as NULL.
//! - **Old tuples.** Under the default replica identity an update carries an old tuple
//!   ([`OldTuple::Key`], 'K') only when key columns changed; REPLICA IDENTITY FULL sends
//!   the whole old row ([`OldTuple::Full`], 'O') on every update and delete.
//! - **Relation and Type messages** are sent before the first change to a table in a
//!   session and again after the server's cache entry was invalidated (DDL, TRUNCATE).
//!   A [`TypeInfo`] precedes a Relation that uses a non-built-in type, such as an enum.
//! - **Empty transactions.** Since PostgreSQL 15 a transaction with no published change
//!   sends neither Begin nor Commit, so `end_lsn` can jump past unrelated WAL.
//! - **Logical decoding messages** ('M', from `pg_logical_emit_message`) are sent only
//!   with the `messages 'true'` option (PostgreSQL 14+). Transactional ones arrive inside
//!   Begin/Commit; non-transactional ones arrive alone, even if their transaction aborts.
//! - **Origin** ('O') follows Begin only for transactions replayed with a replication
//!   origin set (`pg_replication_origin_session_setup`), e.g. by another subscriber.

mod decode;
mod error;
mod messages;

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod tests;

pub use crate::postgres::timestamp::PgTimestamp;
pub use decode::{decode, decode_streamed, Streamed};
pub use error::DecodeError;
pub use messages::{
    Begin, ColumnValue, Commit, Delete, Insert, LogicalDecodingMessage, LogicalMessage, OldTuple, Origin, Relation,
    RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, TupleData, TypeInfo, Update,
};
