//! The sub-messages carried in CopyData during streaming replication (CopyBoth mode).
//!
//! After `START_REPLICATION` the server sends CopyData messages whose body starts with a
//! one-byte tag: 'w' (XLogData, wrapping one pgoutput message in logical replication) or
//! 'k' (primary keepalive). The client answers with 'r' (standby status update) bodies
//! telling the server how far it has written, flushed and applied.
//!
//! Subtleties:
//! - In logical replication, XLogData's `wal_start` is the LSN of the decoded record and
//!   `wal_end` the server's current WAL end; neither is the position to confirm. Confirm
//!   the pgoutput Commit's `end_lsn` (see `crate::postgres::pgoutput`).
//! - A keepalive with `reply_requested` must be answered promptly or the server drops the
//!   connection after `wal_sender_timeout`. Its `wal_end` may be confirmed only when
//!   everything received before it has been durably handled; otherwise the server would
//!   skip changes the relay has not published yet.
//! - The status update's `flush` is what the server persists as the slot's
//!   `confirmed_flush_lsn`; WAL before it can be recycled and is never resent.

use bytes::{BufMut, Bytes, BytesMut};

use crate::postgres::cursor::{count, show_byte, Reader, Short};
use crate::postgres::lsn::Lsn;
use crate::postgres::timestamp::PgTimestamp;

/// A decoded server → client CopyData body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerFrame {
    /// 'w': WAL data; in logical replication `data` is one pgoutput message.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        send_time: PgTimestamp,
        data: Bytes,
    },
    /// 'k': the server's heartbeat.
    PrimaryKeepalive {
        wal_end: Lsn,
        send_time: PgTimestamp,
        /// The server wants a [`StandbyStatusUpdate`] now.
        reply_requested: bool,
    },
}

/// A malformed or unknown server frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "replication {}frame ends early while reading {reading}: need {}, {remaining} left",
        frame_name(frame),
        count(*needed, "byte")
    )]
    UnexpectedEof {
        /// "XLogData" or "keepalive"; empty while reading the tag.
        frame: &'static str,
        reading: &'static str,
        needed: usize,
        remaining: usize,
    },

    #[error(
        "unknown replication frame tag {}; expected 'w' (XLogData) or 'k' (keepalive)",
        show_byte(*.0)
    )]
    UnknownTag(u8),

    #[error(
        "replication {}frame has {} after its last field",
        frame_name(frame),
        count(*remaining, "unexpected trailing byte")
    )]
    TrailingBytes { frame: &'static str, remaining: usize },
}

fn frame_name(frame: &str) -> String {
    if frame.is_empty() {
        String::new()
    } else {
        format!("{frame} ")
    }
}

/// Decodes one server → client CopyData body.
///
/// # Errors
///
/// An empty or short buffer, a tag other than 'w' or 'k', or bytes after a keepalive.
pub fn decode_server_frame(buf: Bytes) -> Result<ServerFrame, FrameError> {
    let mut r = Reader::new(buf);
    let eof = |frame: &'static str, reading: &'static str| {
        move |short: Short| FrameError::UnexpectedEof {
            frame,
            reading,
            needed: short.needed,
            remaining: short.remaining,
        }
    };
    match r.u8().map_err(eof("", "frame tag"))? {
        b'w' => {
            const F: &str = "XLogData";
            Ok(ServerFrame::XLogData {
                wal_start: Lsn(r.u64().map_err(eof(F, "WAL start"))?),
                wal_end: Lsn(r.u64().map_err(eof(F, "WAL end"))?),
                send_time: PgTimestamp(r.i64().map_err(eof(F, "send time"))?),
                data: r.rest(),
            })
        }
        b'k' => {
            const F: &str = "keepalive";
            let frame = ServerFrame::PrimaryKeepalive {
                wal_end: Lsn(r.u64().map_err(eof(F, "WAL end"))?),
                send_time: PgTimestamp(r.i64().map_err(eof(F, "send time"))?),
                // The server writes 0 or 1; like the server's own reader, treat any
                // non-zero byte as a request.
                reply_requested: r.u8().map_err(eof(F, "reply flag"))? != 0,
            };
            match r.remaining() {
                0 => Ok(frame),
                remaining => Err(FrameError::TrailingBytes { frame: F, remaining }),
            }
        }
        other => Err(FrameError::UnknownTag(other)),
    }
}

/// The client → server 'r' message: how far the relay has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbyStatusUpdate {
    /// Received and written (to our own buffers, for a logical client).
    pub(crate) write: Lsn,
    /// Durably handled: becomes the slot's `confirmed_flush_lsn`.
    pub(crate) flush: Lsn,
    pub(crate) apply: Lsn,
    pub(crate) client_time: PgTimestamp,
    /// Ask the server to answer with a keepalive right away (useful as a ping).
    pub(crate) reply_requested: bool,
}

impl StandbyStatusUpdate {
    /// Length of the encoded body, tag included.
    pub(crate) const ENCODED_LEN: usize = 1 + 8 * 4 + 1;

    /// Appends the 'r' body (34 bytes); the caller wraps it in a CopyData message.
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.reserve(Self::ENCODED_LEN);
        out.put_u8(b'r');
        out.put_u64(self.write.0);
        out.put_u64(self.flush.0);
        out.put_u64(self.apply.0);
        out.put_i64(self.client_time.0);
        out.put_u8(u8::from(self.reply_requested));
    }
}

/// The current time in PostgreSQL's form, for [`StandbyStatusUpdate::client_time`].
pub(crate) fn now_pg_timestamp() -> PgTimestamp {
    PgTimestamp::from_system_time(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::cursor::fuzz;
    use proptest::prelude::*;

    fn xlogdata_frame() -> Vec<u8> {
        let mut v = vec![b'w'];
        v.extend_from_slice(&0x16_B374_D848u64.to_be_bytes());
        v.extend_from_slice(&0x16_B374_D900u64.to_be_bytes());
        v.extend_from_slice(&815_000_000_000_000i64.to_be_bytes());
        v.extend_from_slice(b"Bpayload");
        v
    }

    fn keepalive_frame(reply: u8) -> Vec<u8> {
        let mut v = vec![b'k'];
        v.extend_from_slice(&0x1_0000_0002u64.to_be_bytes());
        v.extend_from_slice(&(-5i64).to_be_bytes());
        v.push(reply);
        v
    }

    #[test]
    fn decodes_xlogdata_zero_copy() {
        let input = Bytes::from(xlogdata_frame());
        let frame = decode_server_frame(input.clone()).unwrap();
        let ServerFrame::XLogData {
            wal_start,
            wal_end,
            send_time,
            data,
        } = frame
        else {
            panic!("not XLogData: {frame:?}");
        };
        assert_eq!(wal_start.to_string(), "16/B374D848");
        assert_eq!(wal_end, Lsn(0x16_B374_D900));
        assert_eq!(send_time, PgTimestamp(815_000_000_000_000));
        assert_eq!(data, Bytes::from_static(b"Bpayload"));
        assert_eq!(data.as_ptr(), input[25..].as_ptr());
    }

    #[test]
    fn xlogdata_may_carry_no_data() {
        let frame = decode_server_frame(Bytes::copy_from_slice(&xlogdata_frame()[..25]));
        assert!(matches!(frame, Ok(ServerFrame::XLogData { data, .. }) if data.is_empty()));
    }

    #[test]
    fn decodes_keepalive() {
        for (byte, reply) in [(0, false), (1, true), (7, true)] {
            assert_eq!(
                decode_server_frame(Bytes::from(keepalive_frame(byte))),
                Ok(ServerFrame::PrimaryKeepalive {
                    wal_end: Lsn(0x1_0000_0002),
                    send_time: PgTimestamp(-5),
                    reply_requested: reply,
                })
            );
        }
    }

    #[test]
    fn every_truncation_of_a_header_errors() {
        for full in [xlogdata_frame(), keepalive_frame(1)] {
            // XLogData's payload is open-ended, so only cuts inside its 25-byte header fail.
            let header_len = if full[0] == b'w' { 25 } else { full.len() };
            for cut in 0..header_len {
                let err = decode_server_frame(Bytes::copy_from_slice(&full[..cut])).unwrap_err();
                assert!(
                    matches!(err, FrameError::UnexpectedEof { remaining, .. } if remaining < 8),
                    "cut {cut}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn rejects_unknown_tags_and_trailing_bytes() {
        assert_eq!(
            decode_server_frame(Bytes::from_static(b"r123")),
            Err(FrameError::UnknownTag(b'r'))
        );
        let mut long = keepalive_frame(0);
        long.push(0);
        let err = decode_server_frame(Bytes::from(long)).unwrap_err();
        assert_eq!(
            err,
            FrameError::TrailingBytes {
                frame: "keepalive",
                remaining: 1
            }
        );
        assert_eq!(
            err.to_string(),
            "replication keepalive frame has 1 unexpected trailing byte after its last field"
        );
        assert_eq!(
            decode_server_frame(Bytes::new()).unwrap_err().to_string(),
            "replication frame ends early while reading frame tag: need 1 byte, 0 left"
        );
    }

    #[test]
    fn encodes_standby_status_update() {
        let update = StandbyStatusUpdate {
            write: Lsn(0x0102_0304_0506_0708),
            flush: Lsn(0x10),
            apply: Lsn(0),
            client_time: PgTimestamp(-1),
            reply_requested: true,
        };
        let mut out = BytesMut::from(&b"prefix"[..]);
        update.encode(&mut out);
        assert_eq!(out.len(), 6 + StandbyStatusUpdate::ENCODED_LEN);
        assert_eq!(StandbyStatusUpdate::ENCODED_LEN, 34);
        let mut want = b"prefixr".to_vec();
        want.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0x10]);
        want.extend_from_slice(&[0; 8]);
        want.extend_from_slice(&[0xFF; 8]);
        want.push(1);
        assert_eq!(&out[..], &want[..]);

        let mut out = BytesMut::new();
        StandbyStatusUpdate {
            reply_requested: false,
            ..update
        }
        .encode(&mut out);
        assert_eq!(out.last(), Some(&0));
    }

    #[test]
    fn now_is_after_2024_in_pg_epoch() {
        // 2024-01-01 is 757_382_400 s after 2000-01-01.
        assert!(now_pg_timestamp().0 > 757_382_400_000_000);
    }

    #[test]
    fn decodes_captured_frames() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pgoutput/");
        let xlog = std::fs::read(format!("{dir}xlogdata_frame.bin")).unwrap();
        let Ok(ServerFrame::XLogData {
            wal_start,
            wal_end,
            data,
            ..
        }) = decode_server_frame(Bytes::from(xlog))
        else {
            panic!("xlogdata_frame.bin is not XLogData");
        };
        assert!(wal_start <= wal_end);
        // The first message of the captured stream is the first transaction's Begin.
        let begin = std::fs::read(format!("{dir}begin.bin")).unwrap();
        assert_eq!(&data[..], &begin[..]);

        let keepalive = std::fs::read(format!("{dir}keepalive_frame.bin")).unwrap();
        let frame = decode_server_frame(Bytes::from(keepalive)).unwrap();
        assert!(matches!(
            frame,
            ServerFrame::PrimaryKeepalive { wal_end, .. } if !wal_end.is_zero()
        ));
    }

    #[test]
    fn never_panics_on_arbitrary_bytes_or_after_a_valid_tag() {
        fuzz::never_panics(decode_server_frame, b"wk", 64, 40);
    }

    proptest! {
        #[test]
        fn status_update_fields_land_where_the_server_reads_them(
            write in any::<u64>(), flush in any::<u64>(), apply in any::<u64>(),
            time in any::<i64>(), reply in any::<bool>(),
        ) {
            let mut out = BytesMut::new();
            StandbyStatusUpdate {
                write: Lsn(write), flush: Lsn(flush), apply: Lsn(apply),
                client_time: PgTimestamp(time), reply_requested: reply,
            }.encode(&mut out);
            prop_assert_eq!(out.len(), 34);
            prop_assert_eq!(out[0], b'r');
            prop_assert_eq!(&out[1..9], &write.to_be_bytes()[..]);
            prop_assert_eq!(&out[9..17], &flush.to_be_bytes()[..]);
            prop_assert_eq!(&out[17..25], &apply.to_be_bytes()[..]);
            prop_assert_eq!(&out[25..33], &time.to_be_bytes()[..]);
            prop_assert_eq!(out[33], u8::from(reply));
        }
    }
}
