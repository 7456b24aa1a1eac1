//! Step 1, receive: replication frames off the socket, in batches.
//!
//! The event loop awaits one frame; this step then takes what else is already buffered (up to
//! [`FRAME_BATCH`], and only while the in-flight budget has room) and hands each frame to the
//! decode step. Reading a backlog, a read that emptied the socket is followed by a short rest
//! (see [`Received::pace`]).

use std::time::Duration;

use bytes::Bytes;

use super::error::RelayError;
use super::stream::{FrameAction, StreamState};
use crate::postgres::replication::connection::FrameReader;

/// Frames handled per wake-up before yielding back to the select (keeps timers responsive).
const FRAME_BATCH: usize = 512;
/// Reading a backlog (transactions the server sent more than [`BACKLOG_AGE`] after their
/// commit), a read that emptied the socket is followed by this pause, during which neither
/// frames nor delivery reports are taken: the walsender fills the socket buffer and the sink
/// queues up reports meanwhile, and the relay handles both in large batches instead of waking
/// (epoll, recv, TCP acknowledgements, a channel wake-up per report) for every few messages.
/// Those wake-ups were most of the relay's CPU while draining, on the same two cores the
/// walsender needs (benches/cdc_vs_polling). Live traffic is never paused.
const BACKLOG_READ_PAUSE: Duration = Duration::from_millis(1);
const BACKLOG_AGE: Duration = Duration::from_secs(1);

/// What one batch of frames asks of the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Received {
    /// The server asked for a status update at once.
    pub(super) reply_requested: bool,
    /// The batch ended because the socket had nothing more buffered.
    pub(super) socket_drained: bool,
}

/// Decodes `first` and the frames already buffered behind it.
pub(super) fn take_batch(
    first: Bytes,
    reader: &mut FrameReader,
    state: &mut StreamState<'_>,
) -> Result<Received, RelayError> {
    let mut received = Received {
        reply_requested: state.on_frame(first)? == FrameAction::ReplyNow,
        socket_drained: false,
    };
    for _ in 0..FRAME_BATCH {
        if state.is_full() {
            break;
        }
        match reader.try_next_frame()? {
            Some(frame) => received.reply_requested |= state.on_frame(frame)? == FrameAction::ReplyNow,
            None => {
                received.socket_drained = true;
                break;
            }
        }
    }
    Ok(received)
}

impl Received {
    /// Rests after a read that emptied the socket while reading a backlog.
    pub(super) fn pace(self, state: &StreamState<'_>) {
        if self.socket_drained && state.catching_up(BACKLOG_AGE) {
            rest_while_backlog_accumulates();
        }
    }
}

/// Blocks the stream thread for [`BACKLOG_READ_PAUSE`] — on purpose, and only while reading a
/// backlog. The stream runs alone on that thread's runtime (`relay::run`), so nothing else
/// waits: HTTP, the slot monitor and heartbeats run on the process's main runtime. An async
/// sleep would not do: the runtime would keep waking for every TCP segment the walsender sends
/// (edge-triggered epoll reports each arrival, and pgoutput flushes each message on its own)
/// and for every delivery report, which is exactly the cost this pause removes.
fn rest_while_backlog_accumulates() {
    std::thread::sleep(BACKLOG_READ_PAUSE);
}
