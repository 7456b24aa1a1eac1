//! Bytes → [`LogicalMessage`], one message per call.

use bytes::Bytes;

use super::{
    Begin, ColumnValue, Commit, DecodeError, Delete, Insert, LogicalDecodingMessage, LogicalMessage, OldTuple, Origin,
    PgTimestamp, Relation, RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, TupleData, TypeInfo,
    Update,
};
use crate::postgres::cursor::{Reader, Short};
use crate::postgres::lsn::Lsn;

/// Decodes one pgoutput message outside a block of streamed changes: the `data` of one
/// XLogData frame.
///
/// The whole buffer must be exactly one message; column values share its allocation.
///
/// # Errors
///
/// Any malformed input: a buffer that ends early, an unknown message tag, tuple-column
/// kind or old-tuple marker, a negative length, a string without its NUL terminator or
/// not in UTF-8, or bytes left over after the message. See [`DecodeError`].
pub fn decode(buf: Bytes) -> Result<LogicalMessage, DecodeError> {
    decode_message(buf, false).map(|streamed| streamed.message)
}

/// A message read inside a block of streamed changes (between Stream Start and Stop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// The (sub)transaction a change belongs to: present on Relation, Type, Insert, Update,
    /// Delete, Truncate and Message, absent on the rest (a Stream Stop).
    pub xid: Option<u32>,
    pub message: LogicalMessage,
}

/// Decodes one pgoutput message inside a block of streamed changes, where the change messages
/// carry their transaction's xid after the tag.
///
/// # Errors
///
/// As [`decode`].
pub fn decode_streamed(buf: Bytes) -> Result<Streamed, DecodeError> {
    decode_message(buf, true)
}

/// The tags that carry an xid inside a block of streamed changes.
pub(super) const STREAMED_WITH_XID: &[u8] = b"RYIUDTM";

fn decode_message(buf: Bytes, in_block: bool) -> Result<Streamed, DecodeError> {
    let mut f = Fields::new(buf);
    let tag = f.u8("message tag")?;
    let xid = if in_block && STREAMED_WITH_XID.contains(&tag) {
        f.message = message_name(tag);
        Some(f.u32("xid")?)
    } else {
        None
    };
    let message = match tag {
        b'B' => {
            f.message = "Begin";
            LogicalMessage::Begin(Begin {
                final_lsn: f.lsn("final LSN")?,
                commit_time: f.timestamp("commit timestamp")?,
                xid: f.u32("xid")?,
            })
        }
        b'C' => {
            f.message = "Commit";
            LogicalMessage::Commit(commit(&mut f)?)
        }
        b'O' => {
            f.message = "Origin";
            LogicalMessage::Origin(Origin {
                commit_lsn: f.lsn("commit LSN")?,
                name: f.string("origin name")?,
            })
        }
        b'R' => {
            f.message = "Relation";
            LogicalMessage::Relation(relation(&mut f)?)
        }
        b'Y' => {
            f.message = "Type";
            LogicalMessage::Type(TypeInfo {
                oid: f.u32("type OID")?,
                namespace: f.string("namespace")?,
                name: f.string("type name")?,
            })
        }
        b'I' => {
            f.message = "Insert";
            let relation_oid = f.u32("relation OID")?;
            f.expect_new_marker()?;
            LogicalMessage::Insert(Insert {
                relation_oid,
                new: f.tuple()?,
            })
        }
        b'U' => {
            f.message = "Update";
            LogicalMessage::Update(update(&mut f)?)
        }
        b'D' => {
            f.message = "Delete";
            let relation_oid = f.u32("relation OID")?;
            let old = match f.u8("old tuple marker")? {
                b'K' => OldTuple::Key(f.tuple()?),
                b'O' => OldTuple::Full(f.tuple()?),
                other => return Err(DecodeError::UnknownOldTupleMarker(other)),
            };
            LogicalMessage::Delete(Delete { relation_oid, old })
        }
        b'T' => {
            f.message = "Truncate";
            LogicalMessage::Truncate(truncate(&mut f)?)
        }
        b'M' => {
            f.message = "Message";
            LogicalMessage::Message(LogicalDecodingMessage {
                // Only bit 0 is defined; other bits are ignored as the server's own
                // decoder does.
                transactional: f.u8("flags")? & 1 != 0,
                lsn: f.lsn("message LSN")?,
                prefix: f.string("prefix")?,
                content: f.counted_bytes("content length", "content")?,
            })
        }
        b'S' => {
            f.message = "Stream Start";
            LogicalMessage::StreamStart(StreamStart {
                xid: f.u32("xid")?,
                first_segment: f.u8("first segment")? == 1,
            })
        }
        b'E' => {
            f.message = "Stream Stop";
            LogicalMessage::StreamStop
        }
        b'c' => {
            f.message = "Stream Commit";
            let xid = f.u32("xid")?;
            // A Commit's fields after the xid.
            let Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            } = commit(&mut f)?;
            LogicalMessage::StreamCommit(StreamCommit {
                xid,
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            })
        }
        b'A' => {
            f.message = "Stream Abort";
            LogicalMessage::StreamAbort(StreamAbort {
                xid: f.u32("xid")?,
                subxid: f.u32("subtransaction xid")?,
            })
        }
        other => return Err(DecodeError::UnknownMessageTag(other)),
    };
    f.finish()?;
    Ok(Streamed { xid, message })
}

/// The name errors give a message before its fields are read.
fn message_name(tag: u8) -> &'static str {
    match tag {
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        _ => "",
    }
}

fn commit(f: &mut Fields) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: f.u8("flags")?,
        commit_lsn: f.lsn("commit LSN")?,
        end_lsn: f.lsn("end LSN")?,
        commit_time: f.timestamp("commit timestamp")?,
    })
}

fn relation(f: &mut Fields) -> Result<Relation, DecodeError> {
    // flags + empty name + type OID + type modifier
    const MIN_COLUMN_LEN: usize = 1 + 1 + 4 + 4;
    let oid = f.u32("relation OID")?;
    let namespace = f.string("namespace")?;
    let name = f.string("relation name")?;
    let replica_identity = f.u8("replica identity")?;
    let count = f.u16("column count")?;
    let mut columns = Vec::with_capacity(f.capacity_for(count, MIN_COLUMN_LEN));
    for column in 1..=count {
        f.column = Some(column);
        columns.push(RelationColumn {
            flags: f.u8("flags")?,
            name: f.string("name")?,
            type_oid: f.u32("type OID")?,
            type_modifier: f.i32("type modifier")?,
        });
    }
    f.column = None;
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn update(f: &mut Fields) -> Result<Update, DecodeError> {
    let relation_oid = f.u32("relation OID")?;
    let old = match f.u8("tuple marker")? {
        b'N' => None,
        b'K' => Some(OldTuple::Key(f.tuple()?)),
        b'O' => Some(OldTuple::Full(f.tuple()?)),
        other => return Err(DecodeError::UnknownOldTupleMarker(other)),
    };
    if old.is_some() {
        f.expect_new_marker()?;
    }
    Ok(Update {
        relation_oid,
        old,
        new: f.tuple()?,
    })
}

fn truncate(f: &mut Fields) -> Result<Truncate, DecodeError> {
    let count = f.i32("relation count")?;
    let count = usize::try_from(count).map_err(|_| DecodeError::NegativeLength {
        message: f.message,
        field: "relation count",
        column: None,
        length: count,
    })?;
    let options = f.u8("options")?;
    let mut relation_oids = Vec::with_capacity(count.min(f.r.remaining() / 4));
    for _ in 0..count {
        relation_oids.push(f.u32("relation OID")?);
    }
    Ok(Truncate { options, relation_oids })
}

/// The reader plus what is being decoded, so every error can say where it happened.
struct Fields {
    r: Reader,
    message: &'static str,
    column: Option<u16>,
}

impl Fields {
    fn new(buf: Bytes) -> Self {
        Fields {
            r: Reader::new(buf),
            message: "",
            column: None,
        }
    }

    fn eof(&self, reading: &'static str) -> impl FnOnce(Short) -> DecodeError {
        let (message, column) = (self.message, self.column);
        move |short| DecodeError::UnexpectedEof {
            message,
            reading,
            column,
            needed: short.needed,
            remaining: short.remaining,
        }
    }

    fn u8(&mut self, reading: &'static str) -> Result<u8, DecodeError> {
        self.r.u8().map_err(self.eof(reading))
    }

    fn u16(&mut self, reading: &'static str) -> Result<u16, DecodeError> {
        self.r.u16().map_err(self.eof(reading))
    }

    fn u32(&mut self, reading: &'static str) -> Result<u32, DecodeError> {
        self.r.u32().map_err(self.eof(reading))
    }

    fn i32(&mut self, reading: &'static str) -> Result<i32, DecodeError> {
        self.r.i32().map_err(self.eof(reading))
    }

    fn lsn(&mut self, reading: &'static str) -> Result<Lsn, DecodeError> {
        self.r.u64().map(Lsn).map_err(self.eof(reading))
    }

    fn timestamp(&mut self, reading: &'static str) -> Result<PgTimestamp, DecodeError> {
        self.r.i64().map(PgTimestamp).map_err(self.eof(reading))
    }

    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let (message, column) = (self.message, self.column);
        let raw = self
            .r
            .cstr()
            .ok_or(DecodeError::UnterminatedString { message, field, column })?;
        String::from_utf8(raw.into()).map_err(|_| DecodeError::InvalidUtf8 { message, field, column })
    }

    /// An Int32 length followed by that many bytes.
    fn counted_bytes(&mut self, length_field: &'static str, field: &'static str) -> Result<Bytes, DecodeError> {
        let length = self.i32(length_field)?;
        let n = usize::try_from(length).map_err(|_| DecodeError::NegativeLength {
            message: self.message,
            field: length_field,
            column: self.column,
            length,
        })?;
        self.r.bytes(n).map_err(self.eof(field))
    }

    fn expect_new_marker(&mut self) -> Result<(), DecodeError> {
        match self.u8("new tuple marker")? {
            b'N' => Ok(()),
            found => Err(DecodeError::UnexpectedTupleMarker {
                message: self.message,
                expected: b'N',
                found,
            }),
        }
    }

    fn tuple(&mut self) -> Result<TupleData, DecodeError> {
        let count = self.u16("column count")?;
        // Every column takes at least its kind byte.
        let mut columns = Vec::with_capacity(self.capacity_for(count, 1));
        for column in 1..=count {
            self.column = Some(column);
            let value = match self.u8("kind")? {
                b'n' => ColumnValue::Null,
                b'u' => ColumnValue::UnchangedToast,
                b't' => ColumnValue::Text(self.counted_bytes("value length", "value")?),
                b'b' => ColumnValue::Binary(self.counted_bytes("value length", "value")?),
                other => return Err(DecodeError::UnknownTupleKind(other)),
            };
            columns.push(value);
        }
        self.column = None;
        Ok(TupleData { columns })
    }

    /// A `Vec` capacity for `count` items of at least `min_len` bytes each that a hostile
    /// count cannot inflate beyond what the remaining input could hold.
    fn capacity_for(&self, count: u16, min_len: usize) -> usize {
        let fits = self.r.remaining().checked_div(min_len).unwrap_or(0);
        usize::from(count).min(fits)
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.r.remaining() {
            0 => Ok(()),
            remaining => Err(DecodeError::TrailingBytes {
                message: self.message,
                remaining,
            }),
        }
    }
}
