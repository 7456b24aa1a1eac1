//! Which pgoutput protocol a session asks for, decided once from `postgres.streaming` and the
//! server's version, before `START_REPLICATION`.
//!
//! - **Version 1** sends a transaction only after its COMMIT was decoded. One larger than the
//!   server's `logical_decoding_work_mem` (64 MB by default) is spilled by the walsender to the
//!   primary's disk (`pg_stat_replication_slots.spill_bytes`) and read back from there: the
//!   primary pays disk and CPU, and the relay sees nothing until the spill was replayed.
//! - **Version 2 with `streaming 'on'`** (PostgreSQL 14+) sends such a transaction as it is
//!   decoded, in blocks (Stream Start … Stop), and ends it with a Stream Commit or Abort
//!   (`stream_bytes` instead of `spill_bytes`). The relay keeps the changes itself
//!   (`relay/stage.rs`) and publishes them at the commit, in commit order. Small transactions
//!   are sent exactly as in version 1.
//! - **Versions 3 and 4 are not asked for.** Version 3 adds two-phase commit (transactions
//!   decoded at PREPARE TRANSACTION): the relay must publish only what committed, so it would
//!   stage prepared transactions exactly as streamed ones and gain nothing. Version 4 adds
//!   `streaming 'parallel'`, which only adds the abort LSN and time to Stream Abort, for a
//!   subscriber applying several streamed transactions at once; the relay publishes in commit
//!   order and has no use for them.
//!
//! Invariant: a session's decode step reads the stream messages only when this said so.

use super::error::ReplicationError;
use crate::config::postgres::Streaming;

/// The first server version that streams in-progress transactions.
const STREAMING_SINCE: u32 = 140_000;

/// What a session asked the walsender for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Protocol 1: transactions after their commit only.
    V1,
    /// Protocol 2 with `streaming 'on'`.
    V2Streaming,
}

impl Protocol {
    /// The protocol for `streaming` on a server of `server_version_num`.
    ///
    /// # Errors
    ///
    /// [`ReplicationError::StreamingUnsupported`] for `streaming = "on"` before PostgreSQL 14:
    /// fatal, the operator asked for what this server cannot do.
    pub(crate) fn choose(streaming: Streaming, server_version_num: u32) -> Result<Protocol, ReplicationError> {
        let supported = server_version_num >= STREAMING_SINCE;
        match streaming {
            Streaming::Off => Ok(Protocol::V1),
            Streaming::Auto if supported => Ok(Protocol::V2Streaming),
            Streaming::Auto => Ok(Protocol::V1),
            Streaming::On if supported => Ok(Protocol::V2Streaming),
            Streaming::On => Err(ReplicationError::StreamingUnsupported {
                version: format!("{}.{}", server_version_num / 10_000, server_version_num % 10_000),
            }),
        }
    }

    /// The `START_REPLICATION` options that select it.
    pub(crate) fn options(self) -> &'static str {
        match self {
            Protocol::V1 => "proto_version '1'",
            Protocol::V2Streaming => "proto_version '2', streaming 'on'",
        }
    }

    /// Whether the stream may carry Stream Start/Stop/Commit/Abort.
    pub(crate) fn streams(self) -> bool {
        self == Protocol::V2Streaming
    }

    /// For the log and `status`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Protocol::V1 => "pgoutput 1 (transactions after their commit)",
            Protocol::V2Streaming => "pgoutput 2, streaming on (large transactions as they are written)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_where_the_server_has_it_and_the_key_allows() {
        assert_eq!(
            Protocol::choose(Streaming::Auto, 150_004).unwrap(),
            Protocol::V2Streaming
        );
        assert_eq!(
            Protocol::choose(Streaming::Auto, 140_000).unwrap(),
            Protocol::V2Streaming
        );
        assert_eq!(Protocol::choose(Streaming::Auto, 130_011).unwrap(), Protocol::V1);
        assert_eq!(Protocol::choose(Streaming::Off, 180_000).unwrap(), Protocol::V1);
        assert_eq!(Protocol::choose(Streaming::On, 170_002).unwrap(), Protocol::V2Streaming);
        let err = Protocol::choose(Streaming::On, 130_011).unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert!(err.to_string().contains("PostgreSQL 13.11"), "{err}");
        assert!(err.to_string().contains("postgres.streaming = \"auto\""), "{err}");
        assert_eq!(Protocol::V2Streaming.options(), "proto_version '2', streaming 'on'");
        assert!(Protocol::V2Streaming.streams() && !Protocol::V1.streams());
    }
}
