//! Messages captured from a real PostgreSQL 15 server by
//! `tests/fixtures/pgoutput/capture.py` (see the README beside it for the SQL scenario).
//!
//! OIDs, LSNs and timestamps are those of the capture run; re-capturing changes them, and
//! these expectations with them.

use bytes::Bytes;
use tokio_postgres::types::Type;

use super::*;
use crate::postgres::lsn::Lsn;

const OUTBOX_OID: u32 = 16_391;
const AUDIT_FULL_OID: u32 = 16_398;
const MOOD_OID: u32 = 16_386;

/// Messages (not frames) in the fixture folder.
const MESSAGE_FIXTURES: &[&str] = &[
    "begin.bin",
    "commit.bin",
    "delete.bin",
    "delete_full.bin",
    "insert.bin",
    "insert_binary.bin",
    "insert_null.bin",
    "message.bin",
    "message_nontransactional.bin",
    "origin.bin",
    "relation.bin",
    "relation_full.bin",
    "truncate.bin",
    "type.bin",
    "update.bin",
    "update_key.bin",
    "update_new_only.bin",
    "update_toast.bin",
];

/// Protocol 2 stream messages in the fixture folder (`capture_streamed.sh`), each with whether it
/// is read inside a block of streamed changes.
const STREAM_FIXTURES: &[(&str, bool)] = &[
    ("stream_abort.bin", false),
    ("stream_abort_subxact.bin", false),
    ("stream_commit.bin", false),
    ("stream_insert.bin", true),
    ("stream_relation.bin", true),
    ("stream_start.bin", false),
    ("stream_start_first.bin", false),
    ("stream_stop.bin", true),
];

/// A decoder of one message: [`decode`], or [`decode_streamed`]'s message.
type DecodeFn = fn(Bytes) -> Result<LogicalMessage, DecodeError>;

/// Every message fixture with the decoder it is read with.
fn every_fixture() -> Vec<(&'static str, DecodeFn)> {
    fn streamed(buf: Bytes) -> Result<LogicalMessage, DecodeError> {
        decode_streamed(buf).map(|s| s.message)
    }
    let plain = MESSAGE_FIXTURES.iter().map(|n| (*n, decode as DecodeFn));
    let stream = STREAM_FIXTURES
        .iter()
        .map(|(n, in_block)| (*n, if *in_block { streamed } else { decode as DecodeFn }));
    plain.chain(stream).collect()
}

fn fixture(name: &str) -> Bytes {
    let path = format!(
        "{}/{name}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pgoutput")
    );
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

fn decoded(name: &str) -> LogicalMessage {
    decode(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn t(s: &'static str) -> ColumnValue {
    ColumnValue::Text(Bytes::from_static(s.as_bytes()))
}

fn tuple(columns: Vec<ColumnValue>) -> TupleData {
    TupleData { columns }
}

use ColumnValue::{Null, UnchangedToast};

#[test]
fn begin_and_commit_bracket_the_first_transaction() {
    let LogicalMessage::Begin(begin) = decoded("begin.bin") else {
        panic!("begin.bin is not a Begin");
    };
    let LogicalMessage::Commit(commit) = decoded("commit.bin") else {
        panic!("commit.bin is not a Commit");
    };
    assert_eq!(
        begin,
        Begin {
            final_lsn: Lsn(0x0194_DF08),
            commit_time: PgTimestamp(848_676_286_141_907),
            xid: 732,
        }
    );
    assert_eq!(
        commit,
        Commit {
            flags: 0,
            commit_lsn: Lsn(0x0194_DF08),
            end_lsn: Lsn(0x0194_DF38),
            commit_time: PgTimestamp(848_676_286_141_907),
        }
    );
    assert_eq!(begin.final_lsn, commit.commit_lsn);
    assert!(commit.end_lsn > commit.commit_lsn);
    assert_eq!(commit.commit_lsn.to_string(), "0/194DF08");
    // 2026-11-22 15:24:46.141907 UTC
    assert_eq!(commit.commit_time.to_unix_micros(), 1_795_361_086_141_907);
}

#[test]
fn relation_describes_the_outbox_table() {
    let LogicalMessage::Relation(rel) = decoded("relation.bin") else {
        panic!("relation.bin is not a Relation");
    };
    assert_eq!(rel.oid, OUTBOX_OID);
    assert_eq!((&*rel.namespace, &*rel.name), ("public", "outbox"));
    assert_eq!(rel.replica_identity, b'd');
    let shape: Vec<_> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, c.type_modifier, c.is_key()))
        .collect();
    assert_eq!(
        shape,
        vec![
            ("id", Type::INT8.oid(), -1, true),
            ("topic", Type::TEXT.oid(), -1, false),
            ("mood", MOOD_OID, -1, false),
            ("payload", Type::TEXT.oid(), -1, false),
            ("big", Type::TEXT.oid(), -1, false),
        ]
    );
}

#[test]
fn full_identity_relation_marks_every_column_as_key() {
    let LogicalMessage::Relation(rel) = decoded("relation_full.bin") else {
        panic!("relation_full.bin is not a Relation");
    };
    assert_eq!(rel.oid, AUDIT_FULL_OID);
    assert_eq!(rel.name, "audit_full");
    assert_eq!(rel.replica_identity, b'f');
    assert_eq!(
        rel.columns,
        vec![
            RelationColumn::new(1, "id", Type::INT4.oid(), -1),
            RelationColumn::new(1, "note", Type::TEXT.oid(), -1),
        ]
    );
}

#[test]
fn type_names_the_enum() {
    assert_eq!(
        decoded("type.bin"),
        LogicalMessage::Type(TypeInfo {
            oid: MOOD_OID,
            namespace: "public".into(),
            name: "mood".into(),
        })
    );
}

#[test]
fn inserts() {
    assert_eq!(
        decoded("insert.bin"),
        LogicalMessage::Insert(Insert {
            relation_oid: OUTBOX_OID,
            new: tuple(vec![t("1"), t("orders"), t("happy"), t("hello"), Null]),
        })
    );
    assert_eq!(
        decoded("insert_null.bin"),
        LogicalMessage::Insert(Insert {
            relation_oid: OUTBOX_OID,
            new: tuple(vec![t("2"), t("nulls"), Null, Null, Null]),
        })
    );
    let bin = |b: &'static [u8]| ColumnValue::Binary(Bytes::from_static(b));
    assert_eq!(
        decoded("insert_binary.bin"),
        LogicalMessage::Insert(Insert {
            relation_oid: OUTBOX_OID,
            new: tuple(vec![
                // int8send: 8 bytes big-endian; enum_send and textsend: the raw text.
                bin(&[0, 0, 0, 0, 0, 0, 0, 1]),
                bin(b"orders"),
                bin(b"happy"),
                bin(b"hello"),
                Null,
            ]),
        })
    );
}

#[test]
fn updates() {
    assert_eq!(
        decoded("update.bin"),
        LogicalMessage::Update(Update {
            relation_oid: AUDIT_FULL_OID,
            old: Some(OldTuple::Full(tuple(vec![t("1"), t("before")]))),
            new: tuple(vec![t("1"), t("after")]),
        })
    );
    // Changing the primary key sends the old key; non-key columns are sent as NULL.
    assert_eq!(
        decoded("update_key.bin"),
        LogicalMessage::Update(Update {
            relation_oid: OUTBOX_OID,
            old: Some(OldTuple::Key(tuple(vec![t("1"), Null, Null, Null, Null]))),
            new: tuple(vec![t("3"), t("orders"), t("happy"), t("hello"), Null]),
        })
    );
    assert_eq!(
        decoded("update_new_only.bin"),
        LogicalMessage::Update(Update {
            relation_oid: OUTBOX_OID,
            old: None,
            new: tuple(vec![t("3"), t("orders"), t("happy"), t("changed"), Null]),
        })
    );
    assert_eq!(
        decoded("update_toast.bin"),
        LogicalMessage::Update(Update {
            relation_oid: OUTBOX_OID,
            old: None,
            new: tuple(vec![t("10"), t("toast-updated"), Null, Null, UnchangedToast]),
        })
    );
}

#[test]
fn deletes() {
    assert_eq!(
        decoded("delete.bin"),
        LogicalMessage::Delete(Delete {
            relation_oid: OUTBOX_OID,
            old: OldTuple::Key(tuple(vec![t("3"), Null, Null, Null, Null])),
        })
    );
    assert_eq!(
        decoded("delete_full.bin"),
        LogicalMessage::Delete(Delete {
            relation_oid: AUDIT_FULL_OID,
            old: OldTuple::Full(tuple(vec![t("1"), t("after")])),
        })
    );
}

#[test]
fn truncate_covers_both_tables() {
    let LogicalMessage::Truncate(truncate) = decoded("truncate.bin") else {
        panic!("truncate.bin is not a Truncate");
    };
    assert_eq!(truncate.relation_oids, vec![OUTBOX_OID, AUDIT_FULL_OID]);
    assert_eq!(truncate.options, 3);
    assert!(truncate.cascade() && truncate.restart_identity());
}

#[test]
fn logical_decoding_messages() {
    let message = |transactional, lsn| {
        LogicalMessage::Message(LogicalDecodingMessage {
            transactional,
            lsn: Lsn(lsn),
            prefix: "prefix".into(),
            content: Bytes::from_static(b"content"),
        })
    };
    assert_eq!(decoded("message.bin"), message(true, 0x0194_F3D8));
    assert_eq!(decoded("message_nontransactional.bin"), message(false, 0x0194_F448));
}

#[test]
fn origin_carries_the_remote_commit_lsn() {
    assert_eq!(
        decoded("origin.bin"),
        LogicalMessage::Origin(Origin {
            commit_lsn: "0/1234ABCD".parse().unwrap(),
            name: "fixture_origin".into(),
        })
    );
}

#[test]
fn every_strict_prefix_of_every_fixture_errors() {
    for (name, decode) in every_fixture() {
        let full = fixture(name);
        for cut in 0..full.len() {
            let err = decode(full.slice(..cut));
            assert!(err.is_err(), "{name}: prefix of {cut} bytes decoded: {err:?}");
        }
    }
}

#[test]
fn a_byte_past_every_fixture_is_trailing() {
    for (name, decode) in every_fixture() {
        let mut long = fixture(name).to_vec();
        long.push(0);
        match decode(Bytes::from(long)) {
            Err(DecodeError::TrailingBytes { remaining: 1, .. }) => {}
            other => panic!("{name} plus one byte: {other:?}"),
        }
    }
}

#[test]
fn the_fixture_list_is_complete() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pgoutput");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin") && !n.ends_with("_frame.bin"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<&str> = every_fixture().into_iter().map(|(name, _)| name).collect();
    listed.sort_unstable();
    assert_eq!(on_disk, listed);
}

/// Protocol 2 stream messages captured by `tests/fixtures/pgoutput/capture_streamed.sh`: a
/// committed transaction (xid 726) streamed in blocks, with a rolled-back savepoint (727), and a
/// rolled-back transaction (729).
mod streamed {
    use super::*;

    const XID: u32 = 726;
    const STREAMED_OUTBOX_OID: u32 = 16_384;

    fn inside(name: &str) -> Streamed {
        decode_streamed(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn the_stream_messages_of_a_real_server() {
        assert_eq!(
            decoded("stream_start_first.bin"),
            LogicalMessage::StreamStart(StreamStart {
                xid: XID,
                first_segment: true
            })
        );
        assert_eq!(
            decoded("stream_start.bin"),
            LogicalMessage::StreamStart(StreamStart {
                xid: XID,
                first_segment: false
            })
        );
        assert_eq!(inside("stream_stop.bin").message, LogicalMessage::StreamStop);
        let LogicalMessage::StreamCommit(commit) = decoded("stream_commit.bin") else {
            panic!("not a Stream Commit");
        };
        assert_eq!(
            (commit.xid, commit.flags, commit.commit_lsn, commit.end_lsn),
            (XID, 0, Lsn(0x0160_E2C0), Lsn(0x0160_E2F8))
        );
        assert_eq!(
            decoded("stream_abort_subxact.bin"),
            LogicalMessage::StreamAbort(StreamAbort { xid: XID, subxid: 727 })
        );
        let LogicalMessage::StreamAbort(abort) = decoded("stream_abort.bin") else {
            panic!("not a Stream Abort");
        };
        assert!(abort.is_toplevel() && abort.xid == 729, "{abort:?}");
    }

    #[test]
    fn changes_inside_a_block_carry_the_xid_of_their_transaction() {
        let relation = inside("stream_relation.bin");
        assert_eq!(relation.xid, Some(XID));
        let LogicalMessage::Relation(r) = relation.message else {
            panic!("not a Relation");
        };
        assert_eq!(
            (r.oid, r.name.as_str(), r.columns.len()),
            (STREAMED_OUTBOX_OID, "outbox", 2)
        );
        let insert = inside("stream_insert.bin");
        assert_eq!(insert.xid, Some(XID));
        let LogicalMessage::Insert(i) = insert.message else {
            panic!("not an Insert");
        };
        assert_eq!(i.relation_oid, STREAMED_OUTBOX_OID);
        assert_eq!(i.new.columns[0], t("1"));
        // Read as outside a block, the xid is taken for the relation OID: never silently right.
        assert_ne!(
            decode(fixture("stream_insert.bin")).ok(),
            Some(LogicalMessage::Insert(i))
        );
    }
}
