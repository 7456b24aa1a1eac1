//! What the relay is doing right now, shared between the relay tasks and `/readyz`.
//!
//! Writers: the supervisor (mode), the session (seconds behind source, once per status
//! interval) and the slot monitor (slot problems). Readers: the HTTP handlers. Everything is a
//! plain atomic or a short lock, so the hot path never waits for a scrape.
//!
//! Readiness means "this instance is doing its job": streaming with lag under
//! `[http] ready_max_lag_seconds`, or standing by while the slot is healthy (so it can take
//! over). Starting, reconnecting and stopping are not ready.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::ops::metrics;

/// What the relay is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    Starting = 0,
    Streaming = 1,
    Standby = 2,
    Reconnecting = 3,
    Stopping = 4,
    /// `outbox-relay poll`: claiming and publishing pending rows.
    Polling = 5,
}

impl Mode {
    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Streaming,
            2 => Mode::Standby,
            3 => Mode::Reconnecting,
            4 => Mode::Stopping,
            5 => Mode::Polling,
            _ => Mode::Starting,
        }
    }
}

#[derive(Debug)]
pub(crate) struct RelayHealth {
    mode: AtomicU8,
    seconds_behind_bits: AtomicU64,
    /// The last slot check's verdict: `None` until the first check, then `Ok` or the problem.
    slot: Mutex<Option<Result<(), String>>>,
    /// Exactly-once: a takeover's wait in force, described (`relay/takeover.rs`).
    fence: Mutex<Option<String>>,
    /// WAL the slot keeps, from the slot monitor's last look (-1: unknown).
    retained_wal_bytes: AtomicI64,
}

impl Default for RelayHealth {
    fn default() -> Self {
        RelayHealth {
            mode: AtomicU8::new(Mode::Starting as u8),
            seconds_behind_bits: AtomicU64::new(0f64.to_bits()),
            slot: Mutex::new(None),
            fence: Mutex::new(None),
            retained_wal_bytes: AtomicI64::new(-1),
        }
    }
}

impl RelayHealth {
    pub(crate) fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        ::metrics::gauge!(metrics::ACTIVE).set(if matches!(mode, Mode::Streaming | Mode::Polling) {
            1.0
        } else {
            0.0
        });
    }

    pub(crate) fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    pub(crate) fn set_seconds_behind(&self, seconds: f64) {
        self.seconds_behind_bits.store(seconds.to_bits(), Ordering::Relaxed);
    }

    pub(crate) fn seconds_behind(&self) -> f64 {
        f64::from_bits(self.seconds_behind_bits.load(Ordering::Relaxed))
    }

    pub(crate) fn set_retained_wal_bytes(&self, bytes: i64) {
        self.retained_wal_bytes.store(bytes, Ordering::Relaxed);
    }

    /// WAL the slot keeps, as last seen (`None` before the first slot check).
    pub(crate) fn retained_wal_bytes(&self) -> Option<i64> {
        Some(self.retained_wal_bytes.load(Ordering::Relaxed)).filter(|b| *b >= 0)
    }

    /// Records the outcome of a slot check (`Err` says what is wrong).
    pub(crate) fn set_slot_check(&self, outcome: Result<(), String>) {
        if let Ok(mut slot) = self.slot.lock() {
            *slot = Some(outcome);
        }
    }

    fn slot_check(&self) -> Option<Result<(), String>> {
        self.slot.lock().ok().and_then(|s| s.clone())
    }

    /// A takeover's wait is in force (`Some(what it is)`) or over (`None`); also sets
    /// [`metrics::TAKEOVER_FENCE_SECONDS`] to `seconds_left`.
    pub(crate) fn set_fence(&self, fence: Option<String>, seconds_left: f64) {
        ::metrics::gauge!(metrics::TAKEOVER_FENCE_SECONDS).set(seconds_left);
        if let Ok(mut f) = self.fence.lock() {
            *f = fence;
        }
    }

    fn fence(&self) -> Option<String> {
        self.fence.lock().ok().and_then(|f| f.clone())
    }

    /// `Ok(why ready)` or `Err(why not)`, for `/readyz`.
    pub(crate) fn readiness(&self, max_lag: Duration) -> Result<String, String> {
        match self.mode() {
            Mode::Streaming => {
                if let Some(fence) = self.fence() {
                    // Not publishing yet: say why and until when.
                    return Err(fence);
                }
                let behind = self.seconds_behind();
                if behind <= max_lag.as_secs_f64() {
                    Ok(format!("streaming, {behind:.1} s behind the source"))
                } else {
                    Err(format!(
                        "streaming, but {behind:.1} s behind the source (ready_max_lag_seconds = {})",
                        max_lag.as_secs()
                    ))
                }
            }
            Mode::Standby => match self.slot_check() {
                Some(Ok(())) => Ok("standing by; the slot is healthy".into()),
                Some(Err(problem)) => Err(format!("standing by, but the slot check failed: {problem}")),
                None => Err("standing by; the slot has not been checked yet".into()),
            },
            Mode::Polling => Ok("polling".into()),
            Mode::Starting => Err("starting".into()),
            Mode::Reconnecting => Err("reconnecting".into()),
            Mode::Stopping => Err("stopping".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_is_ready_only_under_the_lag_threshold() {
        let h = RelayHealth::default();
        assert!(h.readiness(Duration::from_secs(60)).is_err(), "starting is not ready");
        h.set_mode(Mode::Streaming);
        h.set_seconds_behind(3.0);
        assert!(h.readiness(Duration::from_secs(60)).is_ok());
        h.set_seconds_behind(61.0);
        let why = h.readiness(Duration::from_secs(60)).unwrap_err();
        assert!(why.contains("61.0 s behind"), "{why}");
    }

    #[test]
    fn a_takeover_fence_is_not_ready_and_says_why() {
        let h = RelayHealth::default();
        h.set_mode(Mode::Streaming);
        h.set_fence(Some("exactly-once takeover fence: … until 12:00".into()), 9.0);
        assert_eq!(
            h.readiness(Duration::from_secs(60)).unwrap_err(),
            "exactly-once takeover fence: … until 12:00"
        );
        h.set_fence(None, 0.0);
        assert!(h.readiness(Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn a_standby_is_ready_while_its_slot_is_healthy() {
        let h = RelayHealth::default();
        h.set_mode(Mode::Standby);
        assert!(h.readiness(Duration::from_secs(1)).is_err(), "unchecked slot");
        h.set_slot_check(Ok(()));
        assert!(h.readiness(Duration::from_secs(1)).is_ok());
        h.set_slot_check(Err("slot is invalidated".into()));
        assert!(h.readiness(Duration::from_secs(1)).unwrap_err().contains("invalidated"));
        h.set_mode(Mode::Reconnecting);
        assert_eq!(h.readiness(Duration::from_secs(1)).unwrap_err(), "reconnecting");
    }
}
