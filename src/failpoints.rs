//! Failpoints for crash tests (the `failpoints` cargo feature).
//!
//! `fail::fail_point!` marks places where a crash is most likely to expose a durability bug:
//!
//! | name | where |
//! |---|---|
//! | `relay::acked_before_status` | Kafka acknowledgements applied to the watermark, status update not yet sent |
//! | `relay::sealed_before_status` | a sink transaction committed with its checkpoint (or aborted on purpose), status update not yet sent |
//! | `publisher::abandon` | a failed session's producer purged, its requests possibly still on the wire (the producer restart path) |
//!
//! Without the feature the macro expands to nothing. With it, `outbox-relay` reads the
//! `FAILPOINTS` environment variable at start (`name=action;name=action`, see the `fail`
//! crate), e.g. `FAILPOINTS='relay::acked_before_status=2%return'`. The action `return` calls
//! [`crash`]: the process aborts on the spot — no destructors, no final status update, like a
//! SIGKILL — which is what the crash tests want.

/// Aborts the process, saying which failpoint fired. (Without the feature the failpoints, and
/// so their only caller, compile to nothing.)
#[cfg(feature = "failpoints")]
pub(crate) fn crash(name: &str) -> ! {
    eprintln!("failpoint {name}: aborting the process");
    std::process::abort()
}
