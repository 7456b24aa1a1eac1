//! Hand-built messages: every field, every error path, and property tests.

use bytes::Bytes;
use proptest::prelude::*;

use super::decode::STREAMED_WITH_XID;
use super::*;
use crate::postgres::cursor::fuzz;
use crate::postgres::lsn::Lsn;

/// Builds a message the way the server's `pq_send*` functions do.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn tag(t: u8) -> Self {
        Msg(vec![t])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn i16(self, v: i16) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn i32(self, v: i32) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn u32(self, v: u32) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn i64(self, v: i64) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn u64(self, v: u64) -> Self {
        self.raw(&v.to_be_bytes())
    }
    fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn str(self, s: &str) -> Self {
        self.raw(s.as_bytes()).u8(0)
    }
    fn text(self, s: &str) -> Self {
        let len = i32::try_from(s.len()).unwrap();
        self.u8(b't').i32(len).raw(s.as_bytes())
    }
    fn bytes(self) -> Bytes {
        Bytes::from(self.0)
    }
}

fn text(s: &'static str) -> ColumnValue {
    ColumnValue::Text(Bytes::from_static(s.as_bytes()))
}

#[test]
fn decodes_begin_and_commit() {
    let begin = Msg::tag(b'B').u64(0x16_B374_D848).i64(42).u32(7).bytes();
    assert_eq!(
        decode(begin),
        Ok(LogicalMessage::Begin(Begin {
            final_lsn: Lsn(0x16_B374_D848),
            commit_time: PgTimestamp(42),
            xid: 7,
        }))
    );
    let commit = Msg::tag(b'C').u8(0).u64(10).u64(20).i64(-1).bytes();
    assert_eq!(
        decode(commit),
        Ok(LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(10),
            end_lsn: Lsn(20),
            commit_time: PgTimestamp(-1),
        }))
    );
}

#[test]
fn decodes_origin_type_and_message() {
    let origin = Msg::tag(b'O').u64(5).str("node_a").bytes();
    assert_eq!(
        decode(origin),
        Ok(LogicalMessage::Origin(Origin {
            commit_lsn: Lsn(5),
            name: "node_a".into(),
        }))
    );
    let ty = Msg::tag(b'Y').u32(16_386).str("public").str("mood").bytes();
    assert_eq!(
        decode(ty),
        Ok(LogicalMessage::Type(TypeInfo {
            oid: 16_386,
            namespace: "public".into(),
            name: "mood".into(),
        }))
    );
    // Content is raw bytes: it need not be UTF-8 and may contain NULs.
    let msg = Msg::tag(b'M').u8(0).u64(9).str("").i32(3).raw(&[0xFF, 0, 1]).bytes();
    assert_eq!(
        decode(msg),
        Ok(LogicalMessage::Message(LogicalDecodingMessage {
            transactional: false,
            lsn: Lsn(9),
            prefix: String::new(),
            content: Bytes::from_static(&[0xFF, 0, 1]),
        }))
    );
}

#[test]
fn decodes_relation() {
    let rel = Msg::tag(b'R')
        .u32(16_391)
        .str("public")
        .str("outbox")
        .u8(b'd')
        .i16(2)
        .u8(1)
        .str("id")
        .u32(20)
        .i32(-1)
        .u8(0)
        .str("topic")
        .u32(1043)
        .i32(68)
        .bytes();
    let LogicalMessage::Relation(rel) = decode(rel).unwrap() else {
        panic!("not a relation");
    };
    assert_eq!(
        (rel.oid, &*rel.namespace, &*rel.name, rel.replica_identity),
        (16_391, "public", "outbox", b'd')
    );
    assert_eq!(
        rel.columns,
        vec![
            RelationColumn::new(1, "id", 20, -1),
            RelationColumn::new(0, "topic", 1043, 68),
        ]
    );
    assert!(rel.columns[0].is_key() && !rel.columns[1].is_key());
}

#[test]
fn decodes_every_column_kind_zero_copy() {
    let input = Msg::tag(b'I')
        .u32(1)
        .u8(b'N')
        .i16(4)
        .u8(b'n')
        .text("héllo")
        .u8(b'b')
        .i32(2)
        .raw(&[0, 42])
        .text("")
        .bytes();
    let LogicalMessage::Insert(insert) = decode(input.clone()).unwrap() else {
        panic!("not an insert");
    };
    assert_eq!(insert.relation_oid, 1);
    assert_eq!(
        insert.new.columns,
        vec![
            ColumnValue::Null,
            text("héllo"),
            ColumnValue::Binary(Bytes::from_static(&[0, 42])),
            text(""),
        ]
    );
    let ColumnValue::Text(value) = &insert.new.columns[1] else {
        unreachable!()
    };
    let offset = 1 + 4 + 1 + 2 + 1 + 1 + 4;
    assert_eq!(value.as_ptr(), input[offset..].as_ptr());
}

#[test]
fn decodes_update_variants() {
    let new_only = Msg::tag(b'U').u32(3).u8(b'N').i16(1).u8(b'u').bytes();
    assert_eq!(
        decode(new_only),
        Ok(LogicalMessage::Update(Update {
            relation_oid: 3,
            old: None,
            new: TupleData {
                columns: vec![ColumnValue::UnchangedToast]
            },
        }))
    );
    for (marker, wrap) in [
        (b'K', OldTuple::Key as fn(TupleData) -> OldTuple),
        (b'O', OldTuple::Full),
    ] {
        let msg = Msg::tag(b'U')
            .u32(3)
            .u8(marker)
            .i16(1)
            .text("old")
            .u8(b'N')
            .i16(1)
            .text("new")
            .bytes();
        let LogicalMessage::Update(update) = decode(msg).unwrap() else {
            panic!("not an update");
        };
        let old = update.old.unwrap();
        assert_eq!(
            old,
            wrap(TupleData {
                columns: vec![text("old")]
            })
        );
        assert_eq!(old.tuple().columns, vec![text("old")]);
        assert_eq!(update.new.columns, vec![text("new")]);
    }
}

#[test]
fn decodes_delete_and_truncate() {
    let delete = Msg::tag(b'D').u32(4).u8(b'K').i16(1).text("7").bytes();
    assert_eq!(
        decode(delete),
        Ok(LogicalMessage::Delete(Delete {
            relation_oid: 4,
            old: OldTuple::Key(TupleData {
                columns: vec![text("7")]
            }),
        }))
    );
    let truncate = Msg::tag(b'T').i32(2).u8(2).u32(10).u32(11).bytes();
    let LogicalMessage::Truncate(t) = decode(truncate).unwrap() else {
        panic!("not a truncate");
    };
    assert_eq!(t.relation_oids, vec![10, 11]);
    assert!(!t.cascade() && t.restart_identity());
}

#[test]
fn empty_and_unknown_tags() {
    assert_eq!(
        decode(Bytes::new()),
        Err(DecodeError::UnexpectedEof {
            message: "",
            reading: "message tag",
            column: None,
            needed: 1,
            remaining: 0,
        })
    );
    // 'P' (prepare) and 'b' (begin prepare) belong to protocol version 3, which the relay does not ask for.
    for tag in [b'P', b'b', 0, 0xFF] {
        assert_eq!(
            decode(Msg::tag(tag).u64(0).bytes()),
            Err(DecodeError::UnknownMessageTag(tag))
        );
    }
}

#[test]
fn short_column_value_names_the_column() {
    let msg = Msg::tag(b'I')
        .u32(1)
        .u8(b'N')
        .i16(3)
        .u8(b'n')
        .text("a")
        .u8(b't')
        .i32(12)
        .raw(b"abcd")
        .bytes();
    let err = decode(msg).unwrap_err();
    assert_eq!(err, error::SHORT_INSERT_VALUE);
    assert_eq!(err.to_string(), error::SHORT_INSERT_VALUE_TEXT);
}

#[test]
fn unknown_tuple_kind_and_markers() {
    let kind = Msg::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').bytes();
    assert_eq!(decode(kind), Err(DecodeError::UnknownTupleKind(b'x')));

    let update = Msg::tag(b'U').u32(1).u8(b'X').bytes();
    assert_eq!(decode(update), Err(DecodeError::UnknownOldTupleMarker(b'X')));
    // A delete always has an old tuple; 'N' is not valid there.
    let delete = Msg::tag(b'D').u32(1).u8(b'N').i16(0).bytes();
    assert_eq!(decode(delete), Err(DecodeError::UnknownOldTupleMarker(b'N')));

    let insert = Msg::tag(b'I').u32(1).u8(b'K').i16(0).bytes();
    assert_eq!(
        decode(insert),
        Err(DecodeError::UnexpectedTupleMarker {
            message: "Insert",
            expected: b'N',
            found: b'K'
        })
    );
    let update = Msg::tag(b'U').u32(1).u8(b'K').i16(0).u8(b'O').i16(0).bytes();
    assert_eq!(
        decode(update),
        Err(DecodeError::UnexpectedTupleMarker {
            message: "Update",
            expected: b'N',
            found: b'O'
        })
    );
}

#[test]
fn negative_lengths_are_rejected() {
    let value = Msg::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'b').i32(-1).bytes();
    assert_eq!(
        decode(value),
        Err(DecodeError::NegativeLength {
            message: "Insert",
            field: "value length",
            column: Some(1),
            length: -1,
        })
    );
    let content = Msg::tag(b'M').u8(1).u64(0).str("p").i32(i32::MIN).bytes();
    assert!(matches!(
        decode(content),
        Err(DecodeError::NegativeLength {
            field: "content length",
            length: i32::MIN,
            ..
        })
    ));
    let truncate = Msg::tag(b'T').i32(-3).u8(0).bytes();
    assert!(matches!(
        decode(truncate),
        Err(DecodeError::NegativeLength {
            message: "Truncate",
            field: "relation count",
            ..
        })
    ));
}

#[test]
fn hostile_counts_fail_fast() {
    let columns = Msg::tag(b'I').u32(1).u8(b'N').u8(0xFF).u8(0xFF).bytes();
    assert!(matches!(
        decode(columns),
        Err(DecodeError::UnexpectedEof {
            reading: "kind",
            column: Some(1),
            ..
        })
    ));
    let relations = Msg::tag(b'T').i32(i32::MAX).u8(0).u32(1).bytes();
    assert!(matches!(
        decode(relations),
        Err(DecodeError::UnexpectedEof {
            reading: "relation OID",
            needed: 4,
            remaining: 0,
            ..
        })
    ));
    let relation = Msg::tag(b'R')
        .u32(1)
        .str("s")
        .str("t")
        .u8(b'd')
        .u8(0xFF)
        .u8(0xFF)
        .bytes();
    assert!(matches!(
        decode(relation),
        Err(DecodeError::UnexpectedEof {
            reading: "flags",
            column: Some(1),
            ..
        })
    ));
}

#[test]
fn strings_must_be_terminated_utf8() {
    let unterminated = Msg::tag(b'Y').u32(1).str("public").raw(b"mood").bytes();
    assert_eq!(
        decode(unterminated),
        Err(DecodeError::UnterminatedString {
            message: "Type",
            field: "type name",
            column: None
        })
    );
    let bad_utf8 = Msg::tag(b'R')
        .u32(1)
        .str("public")
        .str("t")
        .u8(b'f')
        .i16(1)
        .u8(0)
        .raw(&[0xC3, 0x28, 0])
        .u32(25)
        .i32(-1)
        .bytes();
    let err = decode(bad_utf8).unwrap_err();
    assert_eq!(
        err,
        DecodeError::InvalidUtf8 {
            message: "Relation",
            field: "name",
            column: Some(1)
        }
    );
    assert_eq!(
        err.to_string(),
        "pgoutput Relation message has invalid UTF-8 in column 1 name"
    );
}

#[test]
fn trailing_bytes_are_rejected() {
    let begin = Msg::tag(b'B').u64(1).i64(2).u32(3).u8(0).bytes();
    assert_eq!(
        decode(begin),
        Err(DecodeError::TrailingBytes {
            message: "Begin",
            remaining: 1
        })
    );
}

/// One valid message per tag, for mutation-based property tests.
fn valid_messages() -> Vec<Vec<u8>> {
    vec![
        Msg::tag(b'B').u64(1).i64(2).u32(3).0,
        Msg::tag(b'C').u8(0).u64(1).u64(2).i64(3).0,
        Msg::tag(b'O').u64(1).str("o").0,
        Msg::tag(b'R')
            .u32(1)
            .str("s")
            .str("t")
            .u8(b'd')
            .i16(1)
            .u8(1)
            .str("id")
            .u32(20)
            .i32(-1)
            .0,
        Msg::tag(b'Y').u32(1).str("s").str("t").0,
        Msg::tag(b'I').u32(1).u8(b'N').i16(2).text("x").u8(b'n').0,
        Msg::tag(b'U')
            .u32(1)
            .u8(b'O')
            .i16(1)
            .text("a")
            .u8(b'N')
            .i16(1)
            .u8(b'u')
            .0,
        Msg::tag(b'D').u32(1).u8(b'K').i16(1).text("k").0,
        Msg::tag(b'T').i32(2).u8(3).u32(1).u32(2).0,
        Msg::tag(b'M').u8(1).u64(1).str("p").i32(1).raw(b"c").0,
        Msg::tag(b'S').u32(7).u8(1).0,
        Msg::tag(b'E').0,
        Msg::tag(b'c').u32(7).u8(0).u64(1).u64(2).i64(3).0,
        Msg::tag(b'A').u32(7).u32(8).0,
    ]
}

/// `message` as it comes inside a block of streamed changes: a change message with xid 9 after
/// its tag, the rest as it is.
fn in_block(message: &[u8]) -> Vec<u8> {
    if !STREAMED_WITH_XID.contains(&message[0]) {
        return message.to_vec();
    }
    let mut inside = vec![message[0]];
    inside.extend_from_slice(&9u32.to_be_bytes());
    inside.extend_from_slice(&message[1..]);
    inside
}

#[test]
fn stream_messages_of_protocol_2() {
    assert_eq!(
        decode(Msg::tag(b'S').u32(741).u8(1).bytes()),
        Ok(LogicalMessage::StreamStart(StreamStart {
            xid: 741,
            first_segment: true
        }))
    );
    assert_eq!(
        decode(Msg::tag(b'S').u32(741).u8(0).bytes()),
        Ok(LogicalMessage::StreamStart(StreamStart {
            xid: 741,
            first_segment: false
        }))
    );
    assert_eq!(decode(Msg::tag(b'E').bytes()), Ok(LogicalMessage::StreamStop));
    assert_eq!(
        decode(Msg::tag(b'c').u32(741).u8(0).u64(0x500).u64(0x530).i64(9).bytes()),
        Ok(LogicalMessage::StreamCommit(StreamCommit {
            xid: 741,
            flags: 0,
            commit_lsn: Lsn(0x500),
            end_lsn: Lsn(0x530),
            commit_time: PgTimestamp(9),
        }))
    );
    let sub = decode(Msg::tag(b'A').u32(741).u32(742).bytes()).unwrap();
    assert_eq!(sub, LogicalMessage::StreamAbort(StreamAbort { xid: 741, subxid: 742 }));
    let LogicalMessage::StreamAbort(sub) = sub else {
        unreachable!()
    };
    assert!(!sub.is_toplevel());
    assert!(StreamAbort { xid: 741, subxid: 741 }.is_toplevel());
    // A Stream Stop has no fields: anything after its tag is an error, not ignored.
    assert_eq!(
        decode(Msg::tag(b'E').u8(0).bytes()),
        Err(DecodeError::TrailingBytes {
            message: "Stream Stop",
            remaining: 1
        })
    );
}

#[test]
fn changes_inside_a_stream_block_carry_their_xid() {
    // The same Insert as outside a block, with the subtransaction's xid after the tag.
    let insert = Msg::tag(b'I').u32(742).u32(1).u8(b'N').i16(1).text("x").bytes();
    let streamed = decode_streamed(insert).unwrap();
    assert_eq!(streamed.xid, Some(742));
    let LogicalMessage::Insert(i) = streamed.message else {
        panic!("not an insert");
    };
    assert_eq!((i.relation_oid, i.new.columns.len()), (1, 1));
    // Every change message carries one; the stream's own messages do not.
    for (with_xid, message) in STREAMED_WITH_XID.iter().zip(valid_messages().into_iter().skip(3)) {
        assert_eq!(message[0], *with_xid);
        let inside = in_block(&message);
        let streamed = decode_streamed(Bytes::from(inside)).unwrap();
        assert_eq!(streamed.xid, Some(9), "{}", *with_xid as char);
        assert_eq!(streamed.message, decode(Bytes::from(message)).unwrap());
    }
    assert_eq!(
        decode_streamed(Msg::tag(b'E').bytes()),
        Ok(Streamed {
            xid: None,
            message: LogicalMessage::StreamStop
        })
    );
    // A change cut inside its xid says so.
    assert_eq!(
        decode_streamed(Msg::tag(b'I').u8(0).bytes()),
        Err(DecodeError::UnexpectedEof {
            message: "Insert",
            reading: "xid",
            column: None,
            needed: 4,
            remaining: 1,
        })
    );
}

#[test]
fn every_prefix_of_a_valid_message_errors() {
    for full in valid_messages() {
        assert!(decode(Bytes::from(full.clone())).is_ok(), "{full:?}");
        for cut in 0..full.len() {
            let result = decode(Bytes::copy_from_slice(&full[..cut]));
            assert!(result.is_err(), "prefix {cut} of {full:?} decoded");
        }
        let inside = in_block(&full);
        assert!(decode_streamed(Bytes::from(inside.clone())).is_ok(), "{inside:?}");
        for cut in 0..inside.len() {
            let result = decode_streamed(Bytes::copy_from_slice(&inside[..cut]));
            assert!(result.is_err(), "prefix {cut} of {inside:?} decoded in a stream block");
        }
    }
}

#[test]
fn never_panics_on_arbitrary_bytes_or_after_a_valid_tag() {
    fuzz::never_panics(decode, b"BCORYIUDTMSEcA", 128, 128);
    fuzz::never_panics(decode_streamed, b"BCORYIUDTMSEcA", 128, 128);
}

proptest! {

    #[test]
    fn never_panics_on_mutated_valid_messages(
        index in 0usize..14,
        in_block in any::<bool>(),
        position in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut v = valid_messages().swap_remove(index);
        let at = position.index(v.len());
        v[at] = byte;
        v.truncate(cut.index(v.len() + 1));
        if in_block {
            let _ = decode_streamed(Bytes::from(v));
        } else {
            let _ = decode(Bytes::from(v));
        }
    }
}
