//! Waiting to try again: capped exponential backoff with jitter (so a fleet of relays does not
//! reconnect in lockstep, and the retries of many keys do not arrive at once). A leaf: the
//! relay's reconnects (`relay`, `poll`) and a sink's own retries (the webhook) share it.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// The next delay: `initial * 2^attempt`, capped, then scaled by a random factor in [0.5, 1.0].
    pub(crate) fn next_delay(&mut self) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << self.attempt.min(20));
        self.attempt = self.attempt.saturating_add(1);
        let capped = exp.min(self.max);
        capped.mul_f64(0.5 + 0.5 * random_unit())
    }

    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A random number in [0, 1) from the standard library's per-process random hash keys.
fn random_unit() -> f64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_with_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let d: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        for (i, x) in d.iter().enumerate() {
            let nominal = Duration::from_millis((100u64 << i).min(2_000));
            assert!(*x >= nominal / 2 && *x <= nominal, "attempt {i}: {x:?} vs {nominal:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
