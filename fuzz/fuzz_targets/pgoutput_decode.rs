//! Feeds arbitrary bytes to both wire decoders (pgoutput inside and outside a stream block): neither may panic, whatever the input.
//!
//! A successful XLogData frame's payload is decoded too, as the relay does, so inputs that
//! start like a real frame also reach the pgoutput decoder through the same path.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_relay::postgres::pgoutput::{decode, decode_streamed};
use outbox_relay::postgres::replication::frames::{decode_server_frame, ServerFrame};

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    let _ = decode(input.clone());
    let _ = decode_streamed(input.clone());
    if let Ok(ServerFrame::XLogData { data, .. }) = decode_server_frame(input) {
        let _ = decode(data.clone());
        let _ = decode_streamed(data);
    }
});
