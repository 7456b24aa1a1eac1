//! Replication frames for the pipeline's unit tests: pgoutput messages (protocols 1 and 2) inside
//! XLogData frames, as the walsender sends them.

use bytes::{BufMut, Bytes, BytesMut};

pub(crate) const SECOND_US: i64 = 1_000_000;
/// A commit time, µs since 2000-01-01 (PostgreSQL's epoch).
pub(crate) const COMMITTED: i64 = 800_000_000 * SECOND_US;

/// An XLogData frame the server sent at `send_time` carrying `message`.
pub(crate) fn xlog(send_time: i64, message: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'w');
    b.put_u64(0x100);
    b.put_u64(0x100);
    b.put_i64(send_time);
    b.put_slice(message);
    b.freeze()
}

pub(crate) fn begin(final_lsn: u64) -> Vec<u8> {
    let mut b = vec![b'B'];
    b.put_u64(final_lsn);
    b.put_i64(COMMITTED);
    b.put_u32(7);
    b
}

pub(crate) fn commit(commit_lsn: u64, end_lsn: u64) -> Vec<u8> {
    let mut b = vec![b'C', 0];
    b.put_u64(commit_lsn);
    b.put_u64(end_lsn);
    b.put_i64(COMMITTED);
    b
}

fn cstring(b: &mut Vec<u8>, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

/// A Relation message for `schema.table` with text columns `columns`, relation id `oid`.
pub(crate) fn relation(oid: u32, schema: &str, table: &str, columns: &[&str]) -> Vec<u8> {
    let mut b = vec![b'R'];
    b.put_u32(oid);
    cstring(&mut b, schema);
    cstring(&mut b, table);
    b.put_u8(b'd');
    b.put_i16(columns.len() as i16);
    for c in columns {
        b.put_u8(0);
        cstring(&mut b, c);
        b.put_u32(25);
        b.put_i32(-1);
    }
    b
}

/// An Insert into relation `oid` with these values in text format (`None`: NULL).
pub(crate) fn insert(oid: u32, values: &[Option<&str>]) -> Vec<u8> {
    let mut b = vec![b'I'];
    b.put_u32(oid);
    b.put_u8(b'N');
    b.put_i16(values.len() as i16);
    for v in values {
        match v {
            Some(text) => {
                b.put_u8(b't');
                b.put_i32(text.len() as i32);
                b.put_slice(text.as_bytes());
            }
            None => b.put_u8(b'n'),
        }
    }
    b
}

/// Protocol 2: a block of the streamed transaction `xid`'s changes starts.
pub(crate) fn stream_start(xid: u32, first_segment: bool) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.put_u32(xid);
    b.put_u8(u8::from(first_segment));
    b
}

/// Protocol 2: the block ends.
pub(crate) fn stream_stop() -> Vec<u8> {
    vec![b'E']
}

/// Protocol 2: `message` (a Relation, an Insert, …) inside a block, as (sub)transaction `xid`'s.
pub(crate) fn in_stream(xid: u32, message: &[u8]) -> Vec<u8> {
    let mut b = vec![message[0]];
    b.put_u32(xid);
    b.put_slice(&message[1..]);
    b
}

/// Protocol 2: the streamed transaction `xid` committed.
pub(crate) fn stream_commit(xid: u32, commit_lsn: u64, end_lsn: u64) -> Vec<u8> {
    let mut b = vec![b'c'];
    b.put_u32(xid);
    b.put_u8(0);
    b.put_u64(commit_lsn);
    b.put_u64(end_lsn);
    b.put_i64(COMMITTED);
    b
}

/// Protocol 2: the streamed transaction `xid`, or its subtransaction `subxid`, aborted.
pub(crate) fn stream_abort(xid: u32, subxid: u32) -> Vec<u8> {
    let mut b = vec![b'A'];
    b.put_u32(xid);
    b.put_u32(subxid);
    b
}
