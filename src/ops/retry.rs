//! The one shutdown-aware wait every retry loop uses (the backoff itself is the leaf
//! `crate::backoff`, shared with the sinks).

use std::time::Duration;

use tokio::sync::watch;

/// Sleeps for `delay` unless shutdown is requested first; true if shutdown was requested
/// (before or during the wait).
pub(crate) async fn wait_or_shutdown(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}
