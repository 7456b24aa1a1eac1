//! The relay: a supervisor that runs replication sessions until shutdown.
//!
//! A session ends with an error classified by [`RelayError::is_transient`]. Transient errors
//! (connection lost, Kafka delivery failed, slot busy because another instance streams) lead to
//! a new session after a capped, jittered exponential backoff; the new session resumes from the
//! slot's `confirmed_flush_lsn`, so everything not yet confirmed is republished (at-least-once).
//! Fatal errors (bad configuration, a bad event under the `fail` policy, a lost slot) stop the
//! process with a message that says what to do.

mod backoff;
pub mod error;
mod session;
mod stream_state;

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info, warn};

pub use backoff::Backoff;
pub use error::RelayError;
pub use session::SessionEnd;

use crate::config::Settings;

/// A session that streamed at least this long resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);
/// Standbys retry the busy slot at least this often, so takeover is quick.
const STANDBY_POLL: Duration = Duration::from_secs(2);

/// Streams until `shutdown` turns true (returns `Ok`) or a fatal error occurs.
pub async fn run(settings: &Settings, mut shutdown: watch::Receiver<bool>) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(settings.relay.reconnect_backoff_initial, settings.relay.reconnect_backoff_max);
    let mut standing_by = false;
    loop {
        let started = Instant::now();
        match session::run_session(settings, &mut shutdown).await {
            Ok(SessionEnd::Shutdown) => {
                info!(slot = %settings.postgres.slot, "relay stopped");
                return Ok(());
            }
            Err(e) if e.is_slot_busy() => {
                if !standing_by {
                    info!(slot = %settings.postgres.slot, reason = %e, "slot is held by another instance; standing by");
                    standing_by = true;
                }
                if wait_or_shutdown(STANDBY_POLL, &mut shutdown).await {
                    return Ok(());
                }
            }
            Err(e) if e.is_transient() => {
                standing_by = false;
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
                let delay = backoff.next_delay();
                warn!(slot = %settings.postgres.slot, error = %e, retry_in_ms = delay.as_millis() as u64, "reconnecting");
                if wait_or_shutdown(delay, &mut shutdown).await {
                    return Ok(());
                }
            }
            Err(e) => {
                error!(slot = %settings.postgres.slot, error = %e, "fatal");
                return Err(e);
            }
        }
    }
}

/// Sleeps; true if shutdown was requested meanwhile.
async fn wait_or_shutdown(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}
