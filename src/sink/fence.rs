//! [`KeyFence`]: after a broker refused a record, no later record of the same key is published
//! until the caller has decided about the refused one ([`Sink::release`](super::Sink::release)).
//!
//! Why: a sink learns of a refusal (unroutable, too large for the stream, a key of the wrong
//! type, a refused Kafka batch) only when the broker answers, and the caller learns of it even
//! later, from the completion. Records of the same aggregate handed over meanwhile would be
//! stored ahead of the refused one — or ahead of the records queued behind it, which fail and are
//! replayed. If the refused record turns out innocent (a Kafka batch-mate) or the operator fixes
//! the cause (binds a queue, raises a size limit) and the relay replays it, the aggregate's first
//! deliveries would be out of commit order. So the adapter closes the fence for the key when the
//! refusal arrives and fails every later record of that key as `Transient` (the caller replays
//! them) until the caller releases it.
//!
//! Invariant: a record the fence stops is reported after the refusal that closed it, so the
//! caller always sees the refusal first (and records its suspect) — [`KeyFence::close_then`]
//! and [`KeyFence::admit`] run their reports under one lock.
//!
//! Keys are kept as 64-bit hashes: a collision only fails an innocent record `Transient`, which
//! is replayed; it never lets a fenced one through.

use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A key's hash, as the fence keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyHash(u64);

impl KeyHash {
    pub(crate) fn of(key: &[u8]) -> KeyHash {
        // Fixed keys (no per-process seed): the hash only has to spread, not resist attacks.
        KeyHash(BuildHasherDefault::<DefaultHasher>::default().hash_one(key))
    }
}

/// The keys whose records a sink stops publishing; shared by the caller's side of the sink
/// (`send`, `release`) and whatever receives the broker's answers.
#[derive(Debug, Default)]
pub(crate) struct KeyFence {
    closed: Mutex<HashSet<KeyHash>>,
    /// Whether any key is closed: the common case (none) takes no lock.
    any: AtomicBool,
}

impl KeyFence {
    /// Closes the fence for `key`, then runs `report` (the refusal's completion) before anyone
    /// can see the fence closed.
    pub(crate) fn close_then<R>(&self, key: KeyHash, report: impl FnOnce() -> R) -> R {
        let mut closed = self.closed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        closed.insert(key);
        self.any.store(true, Ordering::Release);
        report()
    }

    /// Runs `pass` when `key` is open, `stopped` when it is closed; a `stopped` report is
    /// ordered after the refusal that closed the key.
    /// The key is hashed only while some key is closed; `value` goes to whichever runs.
    pub(crate) fn admit<T, R>(
        &self,
        key: &[u8],
        value: T,
        pass: impl FnOnce(T) -> R,
        stopped: impl FnOnce(T) -> R,
    ) -> R {
        if !self.any.load(Ordering::Acquire) {
            return pass(value);
        }
        let closed = self.closed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if closed.contains(&KeyHash::of(key)) {
            stopped(value)
        } else {
            drop(closed);
            pass(value)
        }
    }

    /// Whether `key` is closed (for an adapter that reports from one task, in order).
    pub(crate) fn is_closed(&self, key: KeyHash) -> bool {
        self.any.load(Ordering::Acquire)
            && self
                .closed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&key)
    }

    /// The caller decided about the refused record of `key`: its records pass again.
    pub(crate) fn open(&self, key: &[u8]) {
        let mut closed = self.closed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        closed.remove(&KeyHash::of(key));
        self.any.store(!closed.is_empty(), Ordering::Release);
    }
}

/// The cause a record stopped by the fence fails with.
pub(crate) fn stopped_cause() -> String {
    "not published: an earlier record of the same key was refused and the relay has not decided about it yet \
     (it replays this one after)"
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_key_stops_its_records_until_released_and_no_other() {
        let fence = KeyFence::default();
        let (k, other) = (KeyHash::of(b"k"), KeyHash::of(b"other"));
        assert!(!fence.is_closed(k));
        assert_eq!(fence.close_then(k, || "refused"), "refused");
        assert!(fence.is_closed(k));
        assert!(!fence.is_closed(other));
        assert_eq!(fence.admit(b"k", (), |()| "sent", |()| "stopped"), "stopped");
        assert_eq!(fence.admit(b"other", (), |()| "sent", |()| "stopped"), "sent");
        fence.open(b"k");
        assert!(!fence.is_closed(k));
        assert_eq!(fence.admit(b"k", (), |()| "sent", |()| "stopped"), "sent");
    }

    #[test]
    fn releasing_one_key_keeps_the_others_closed() {
        let fence = KeyFence::default();
        fence.close_then(KeyHash::of(b"a"), || ());
        fence.close_then(KeyHash::of(b"b"), || ());
        fence.open(b"a");
        assert!(!fence.is_closed(KeyHash::of(b"a")));
        assert!(fence.is_closed(KeyHash::of(b"b")));
        fence.open(b"b");
        assert!(!fence.any.load(Ordering::Acquire));
    }

    #[test]
    fn hashes_are_stable_across_instances() {
        assert_eq!(KeyHash::of(b"order-1"), KeyHash::of(b"order-1"));
        assert_ne!(KeyHash::of(b"order-1"), KeyHash::of(b"order-2"));
    }
}
