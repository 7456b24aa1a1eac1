//! Noticing a replication connection that went quiet for good.
//!
//! A cut network or a frozen server is silent: no error, no EOF. The walsender sends keepalives
//! only when it has something to say or hears nothing from us, so silence alone is not proof of
//! death on an idle cluster. Hence two steps, driven from the session's status timer:
//! after `limit / 2` without a frame, the next status update asks for a reply
//! (`reply_requested`, which every walsender answers at once with a keepalive); after `limit`
//! the connection is declared dead and the session reconnects.
//!
//! While the relay pauses reading (backpressure) nothing is heard by design, so the pause counts
//! as hearing: [`Silence::heard`] is called on every loop turn while paused. Dead peers during a
//! pause are caught by `TCP_USER_TIMEOUT` on the socket instead (status updates keep flowing and
//! stay unacknowledged), see `replication/connection.rs`.

use std::time::Duration;

use tokio::time::Instant;

use crate::postgres::replication::error::ReplicationError;

#[derive(Debug)]
pub(crate) struct Silence {
    limit: Duration,
    last_heard: Instant,
}

impl Silence {
    pub(crate) fn new(limit: Duration, now: Instant) -> Self {
        Silence { limit, last_heard: now }
    }

    /// A frame arrived (or the relay is deliberately not reading).
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// `Ok(true)`: ask the server for a reply in this status update; `Ok(false)`: all is well;
    /// `Err`: nothing was heard for `limit`.
    pub(crate) fn check(&self, now: Instant) -> Result<bool, ReplicationError> {
        let quiet = now.saturating_duration_since(self.last_heard);
        if quiet >= self.limit {
            return Err(ReplicationError::Timeout {
                what: "waiting for any message from the walsender",
                after: quiet,
            });
        }
        Ok(quiet >= self.limit / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_at_half_the_limit_and_gives_up_at_the_limit() {
        let t0 = Instant::now();
        let mut s = Silence::new(Duration::from_secs(10), t0);
        assert!(!s.check(t0 + Duration::from_secs(4)).unwrap());
        assert!(s.check(t0 + Duration::from_secs(5)).unwrap());
        let err = s.check(t0 + Duration::from_secs(10)).unwrap_err();
        assert!(err.is_transient(), "a silent server is reconnected to, not fatal");
        s.heard(t0 + Duration::from_secs(9));
        assert!(!s.check(t0 + Duration::from_secs(10)).unwrap());
    }
}
