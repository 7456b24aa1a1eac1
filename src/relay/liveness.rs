//! Takeover liveness, in every delivery mode: a holder that may have lost its slot to a standby
//! hands nothing more to the sink.
//!
//! **The frozen holder.** A holder paused mid-flight (SIGSTOP, a starved VM) whose slot a
//! standby takes over must not publish afterwards: whatever it still holds would reach the sink
//! behind the standby's replay — a duplicate at best, an aggregate's events out of order at
//! worst. So the stream hands nothing on once it went more than
//! [`RelaySettings::stale_limit`] without sending a status update (the walsender may be gone):
//! [`RelayError::Paused`], checked on each frame and before each status update; the session
//! then abandons its sink without waiting.
//!
//! **The cut-off holder.** Sending is not being heard: a holder cut off from PostgreSQL by a
//! silent network fault keeps writing status updates into its socket while its walsender times
//! out and a standby takes over, and when the link heals the frames the dead walsender had sent
//! arrive. So the stream must also *hear* the server: a frame that arrives after a silence of
//! more than ¾ of the server's `wal_sender_timeout` is not handed on, and the status tick ends
//! such a session ([`RelayError::Unheard`]). ¾ because the walsender frees the slot only after
//! the whole timeout without our replies (so the holder stops first), while a busy walsender
//! reads our replies, and answers our reply requests, at least every half of it. Every status
//! update asks for a reply once a status interval passed in silence, so a live, idle walsender
//! is heard every status interval; a pause of reading for backpressure counts as hearing, as
//! for `relay.receive_timeout_ms`.
//!
//! What a read-back guarantee adds for the records a holder had already handed to its sink's
//! client (the takeover fence) is `takeover.rs`'s.
//!
//! [`RelaySettings::stale_limit`]: crate::config::relay::RelaySettings::stale_limit

use std::time::{Duration, Instant};

use super::error::RelayError;
use crate::config::relay::RelaySettings;

/// When this stream last told and last heard its walsender, and the limits on both.
#[derive(Debug)]
pub(crate) struct Liveness {
    last_status: Instant,
    /// When the server was last heard (a frame read, or reading paused on purpose).
    last_heard: Instant,
    /// Silence after which status updates ask for a reply (the status interval).
    reply_after: Duration,
    /// Silence after which nothing read is handed on (¾ of `wal_sender_timeout`; none when the
    /// server has no timeout: its walsender then never lets the slot go on silence).
    unheard_limit: Option<Duration>,
    stale_limit: Duration,
}

impl Liveness {
    /// Starts now; `wal_sender_timeout` as the server reports it ([`wal_sender_timeout`]).
    pub(crate) fn new(relay: &RelaySettings, wal_sender_timeout: Duration) -> Liveness {
        Liveness {
            last_status: Instant::now(),
            last_heard: Instant::now(),
            reply_after: relay.status_interval,
            unheard_limit: unheard_limit_of(wal_sender_timeout),
            stale_limit: relay.stale_limit(),
        }
    }

    /// A frame arrived: errs when it comes after a silence past the unheard limit (it may come
    /// from a walsender long gone: nothing of it is handed on, keepalives included) or, for
    /// anything but a keepalive, when the stream went stale.
    ///
    /// One clock reading per frame serves both checks: draining a backlog, a frame is handled
    /// every few microseconds and each reading costs a fraction of one (three per frame were
    /// ~4 % of the stream thread's time, benches/cdc_vs_polling under `perf`).
    pub(crate) fn on_frame(&mut self, keepalive: bool) -> Result<(), RelayError> {
        let now = Instant::now();
        self.check_heard(now)?;
        self.last_heard = now;
        if !keepalive {
            self.check_alive(now)?;
        }
        Ok(())
    }

    /// Errs when the stream went past the stale limit without sending a status update, or past
    /// the unheard limit without hearing the server (either way it may have been taken over).
    pub(crate) fn check(&self) -> Result<(), RelayError> {
        let now = Instant::now();
        self.check_alive(now)?;
        self.check_heard(now)
    }

    /// A status update went out: the walsender heard from this stream.
    pub(crate) fn status_sent(&mut self) {
        self.last_status = Instant::now();
    }

    /// Reading is paused on purpose: silence says nothing about the server meanwhile.
    pub(crate) fn heard(&mut self) {
        self.last_heard = Instant::now();
    }

    /// The next status update asks the server for a reply (a status interval passed without
    /// hearing it).
    pub(crate) fn wants_reply(&self) -> bool {
        self.last_heard.elapsed() >= self.reply_after
    }

    fn check_alive(&self, now: Instant) -> Result<(), RelayError> {
        let silent = now.saturating_duration_since(self.last_status);
        if silent > self.stale_limit {
            return Err(RelayError::Paused {
                paused_ms: silent.as_millis() as u64,
            });
        }
        Ok(())
    }

    fn check_heard(&self, now: Instant) -> Result<(), RelayError> {
        let Some(limit) = self.unheard_limit else { return Ok(()) };
        let silent = now.saturating_duration_since(self.last_heard);
        if silent > limit {
            return Err(RelayError::Unheard {
                silent_ms: silent.as_millis() as u64,
            });
        }
        Ok(())
    }
}

/// The server's `wal_sender_timeout` (zero: none).
pub(crate) async fn wal_sender_timeout(control: &tokio_postgres::Client) -> Result<Duration, RelayError> {
    let row = control
        .query_one(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?;
    let ms: i64 = row.get(0);
    Ok(Duration::from_millis(ms.max(0) as u64))
}

/// ¾ of `wal_sender_timeout` (`None` when it is 0: no timeout), see the module docs.
fn unheard_limit_of(wal_sender_timeout: Duration) -> Option<Duration> {
    (!wal_sender_timeout.is_zero()).then(|| wal_sender_timeout * 3 / 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    fn liveness(wal_sender_timeout_ms: u64) -> Liveness {
        Liveness::new(&settings("").relay, Duration::from_millis(wal_sender_timeout_ms))
    }

    fn ago(d: Duration) -> Instant {
        Instant::now().checked_sub(d).expect("instant")
    }

    /// The split brain the network nemesis found (`tests/it/nemesis.rs`, `split_brain_exactly_once`):
    /// a holder cut off from PostgreSQL kept sending status updates into its socket, so it never
    /// counted as paused; when the link healed, the frames its timed-out walsender had sent
    /// arrived after a standby had taken over and read back, and were published again.
    #[test]
    fn a_frame_after_a_silence_past_the_unheard_limit_is_not_handed_on() {
        // The harness's wal_sender_timeout (5 s).
        let mut l = liveness(5_000);
        assert_eq!(l.unheard_limit, Some(Duration::from_millis(3_750)));
        assert!(!l.wants_reply());
        l.on_frame(false).expect("heard just now");
        l.last_heard = ago(Duration::from_millis(4_000));
        // Still sending status updates (into a cut network): the staleness check alone passed.
        l.status_sent();
        assert!(l.check_alive(Instant::now()).is_ok());
        assert!(l.wants_reply(), "a silent stream asks the server for a reply");
        let err = l
            .on_frame(false)
            .expect_err("a frame after the silence is not handed on");
        assert!(matches!(err, RelayError::Unheard { .. }), "{err}");
        assert!(err.is_transient(), "the session reconnects and replays");
        l.last_heard = ago(Duration::from_millis(4_000));
        assert!(l.check().is_err(), "the status tick ends the session too");
        assert!(l.on_frame(true).is_err(), "keepalives included");
    }

    #[test]
    fn a_stream_that_sent_no_status_past_the_stale_limit_stops_handing_on() {
        let mut l = liveness(60_000);
        l.last_status = ago(Duration::from_secs(4));
        assert!(matches!(l.check(), Err(RelayError::Paused { .. })));
        assert!(l.on_frame(true).is_ok(), "a keepalive is only heard");
        assert!(matches!(l.on_frame(false), Err(RelayError::Paused { .. })));
        l.status_sent();
        assert!(l.on_frame(false).is_ok());
    }

    #[test]
    fn reading_paused_on_purpose_counts_as_hearing() {
        let mut l = liveness(60_000);
        l.last_heard = ago(Duration::from_secs(50));
        assert!(l.check().is_err());
        l.heard();
        assert!(l.check().is_ok());
        assert!(!l.wants_reply());
    }

    #[test]
    fn without_a_wal_sender_timeout_silence_stops_nothing() {
        assert_eq!(unheard_limit_of(Duration::ZERO), None);
        let mut l = liveness(0);
        l.last_heard = ago(Duration::from_secs(600));
        assert!(l.check_heard(Instant::now()).is_ok());
    }
}
