//! The takeover fence (exactly-once by read-back, `guarantee/read_back.rs`): how long a session
//! that took the slot from another instance waits before its first read-back, and why.
//!
//! A previous holder can still send what it had handed to its sink's client (librdkafka, for
//! Kafka) after the slot changed
//! hands; a record that lands after this session read its partition back is published twice.
//! The holder hands records over only while its last status update is under
//! [`RelaySettings::stale_limit`] old, and the client drops a queued record its queue expiry
//! after it was handed over (exactly-once bounds that to 10 s unless the user set it). So
//! everything it may still send has landed or expired by
//! `last status update + stale limit + queue expiry (+ 1 s for the client's expiry scan)`:
//! the fence. The standby learns the holder's last status update from `pg_stat_replication`
//! while it waits ([`Predecessor::observe`]).
//!
//! Invariant: **the fence is skipped only when the holder provably stopped sending**. A holder
//! whose silence the standby could not see (its role lacks `pg_read_all_stats`, so
//! `pg_stat_replication` hides the holder's replies) gets the fence, timed from the last look, the
//! latest it may have replied. A holder
//! that was still replying at the standby's last look (within two status intervals) and whose
//! walsender then went away without anyone terminating it closed its own connection: its process
//! died, or it ended its session, which abandons its producer (queue purged, requests on the wire
//! awaited) before it closes the replication connection (`session.rs`). Either way nothing of it
//! is queued any more. A takeover that terminated a silent holder, or a holder that went silent
//! before its walsender disappeared, gets the fence. docs/reliability.md says what remains.
//!
//! [`RelaySettings::stale_limit`]: crate::config::relay::RelaySettings::stale_limit

use std::time::{Duration, Instant, SystemTime};

use crate::config::Settings;
use crate::ops::units::utc_from_system_time;
use crate::sink::ClientQueueExpiry;

/// What this process saw of the slot's previous holder while it stood by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Predecessor {
    /// No other instance held the slot since this process last streamed.
    #[default]
    None,
    /// Another instance held the slot.
    Seen {
        /// When its walsender last heard a status update from it (this host's clock); `None`:
        /// not known to this process.
        last_reply: Option<Instant>,
        /// When this process last saw it holding the slot.
        seen_at: Instant,
        /// Whether this process terminated its walsender (`relay.takeover_after_ms`).
        terminated: bool,
    },
}

impl Predecessor {
    /// The slot is held by another instance, silent for `silent_for` as `pg_stat_replication`
    /// says (`None`: unknown — fenced, as if it had replied at this look, the cautious reading).
    pub(crate) fn observe(&mut self, silent_for: Option<Duration>, now: Instant) {
        let last_reply = silent_for.map(|s| now.checked_sub(s).unwrap_or(now));
        *self = Predecessor::Seen {
            last_reply,
            seen_at: now,
            terminated: false,
        };
    }

    /// This process terminated the holder's walsender.
    pub(crate) fn terminated(&mut self) {
        if let Predecessor::Seen { terminated, .. } = self {
            *terminated = true;
        }
    }

    /// The fence for a session starting `now` that follows this predecessor (`None`: no wait).
    /// Only a read-back guarantee asks for one: a broker that deduplicates (NATS JetStream,
    /// Redis here) drops the old holder's late copies itself, within its deduplication window
    /// (docs/sink-nats.md, docs/sink-redis.md), and a sink transaction fences the old producer.
    /// `expiry`: how long the sink's client may still send what it was handed (`None`: it keeps
    /// no queue of its own, so there is nothing to wait for).
    pub(crate) fn fence(&self, settings: &Settings, expiry: Option<ClientQueueExpiry>, now: Instant) -> Option<Fence> {
        let expiry = expiry?;
        let Predecessor::Seen {
            last_reply,
            seen_at,
            terminated,
        } = *self
        else {
            return None;
        };
        let silent_at_last_look = last_reply.map(|r| seen_at.saturating_duration_since(r));
        if !terminated && silent_at_last_look.is_some_and(|s| s <= settings.relay.status_interval * 2) {
            return None;
        }
        let max = fence_max(settings, expiry);
        let until = last_reply.unwrap_or(seen_at) + max;
        let wait = until.checked_duration_since(now).filter(|w| !w.is_zero())?;
        let why = if terminated {
            "terminated its walsender"
        } else {
            "its walsender went away"
        };
        let holder = match silent_at_last_look {
            Some(s) => format!("a holder that was silent for {:.1} s", s.as_secs_f64()),
            None => "a holder whose status updates this relay could not see (its role lacks pg_read_all_stats), \
                     timed from the last look"
                .to_owned(),
        };
        Some(Fence {
            until,
            until_utc: SystemTime::now() + wait,
            reason: format!(
                "took the slot over from {holder} ({why}); records it may still have \
                 queued in the broker's client land or expire {} s after its last status update (relay stale limit \
                 {} s + {} {} ms + 1 s)",
                max.as_secs(),
                settings.relay.stale_limit().as_secs(),
                expiry.key,
                expiry.expiry.as_millis(),
            ),
        })
    }
}

/// A broker client scans its queues for expired records about once a second.
const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// The longest a takeover may wait before its first read-back: the previous holder may hand
/// records to the sink's client until [`RelaySettings::stale_limit`] after its last status
/// update, and each may wait its client queue's `expiry`, plus a second for the client's expiry
/// scan (docs/reliability.md, "The frozen holder").
pub(crate) fn fence_max(settings: &Settings, expiry: ClientQueueExpiry) -> Duration {
    settings.relay.stale_limit() + expiry.expiry + FENCE_MARGIN
}

/// No read-back before `until`: the previous holder's queued records land or expire by then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fence {
    pub(crate) until: Instant,
    pub(crate) until_utc: SystemTime,
    pub(crate) reason: String,
}

impl Fence {
    /// What `/readyz`, `status` and the log say while it holds.
    pub(crate) fn describe(&self, now: Instant) -> String {
        format!(
            "exactly-once takeover fence: nothing is read back or published from the replay window until {} \
             ({:.1} s left): {}",
            utc_from_system_time(self.until_utc),
            self.until.saturating_duration_since(now).as_secs_f64(),
            self.reason
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    fn exactly_once() -> Settings {
        settings("[relay]\ndelivery = \"exactly-once\"\ntakeover_after_ms = 3000\n")
    }

    /// The default sink's (Kafka's exactly-once producer's) queue expiry.
    fn expiry(s: &Settings) -> Option<ClientQueueExpiry> {
        match crate::sink::exactly_once(s) {
            crate::sink::ExactlyOnce::ReadBack(sink) => sink.queue_expiry(),
            other => panic!("the default sink reads back, not {other:?}"),
        }
    }

    #[test]
    fn only_exactly_once_through_a_queueing_client_is_fenced() {
        // What `run` and `setup` warn about for a role that cannot see status updates.
        assert!(crate::sink::takeover_fenced(&exactly_once()));
        assert!(!crate::sink::takeover_fenced(&settings("")));
    }

    #[test]
    fn a_fresh_process_and_a_holder_that_closed_its_own_connection_wait_for_nothing() {
        let s = exactly_once();
        let now = Instant::now();
        assert_eq!(Predecessor::None.fence(&s, expiry(&s), now), None);
        let mut p = Predecessor::None;
        // Replied 0.5 s before the last look, then its walsender went away (crash or clean stop).
        p.observe(Some(Duration::from_millis(500)), now);
        assert_eq!(p.fence(&s, expiry(&s), now + Duration::from_secs(2)), None);
    }

    #[test]
    fn a_terminated_holder_is_fenced_from_its_last_reply() {
        let s = exactly_once();
        assert_eq!(
            expiry(&s).map(|e| e.expiry).unwrap_or_default(),
            Duration::from_secs(10),
            "exactly-once bounds it"
        );
        let now = Instant::now() + Duration::from_secs(100);
        let mut p = Predecessor::None;
        p.observe(Some(Duration::from_secs(4)), now);
        p.terminated();
        let f = p.fence(&s, expiry(&s), now).expect("fenced");
        // Last reply 4 s ago; 3 s stale limit + 10 s + 1 s after it.
        assert_eq!(f.until, now - Duration::from_secs(4) + Duration::from_secs(14));
        assert!(f.reason.contains("silent for 4.0 s"), "{}", f.reason);
        assert!(f.describe(now).contains("10.0 s left"), "{}", f.describe(now));
        // A fence already past is no fence.
        assert_eq!(p.fence(&s, expiry(&s), now + Duration::from_secs(11)), None);
    }

    #[test]
    fn a_holder_silent_at_the_last_look_is_fenced_though_nobody_terminated_it() {
        let s = exactly_once();
        let now = Instant::now() + Duration::from_secs(100);
        let mut p = Predecessor::None;
        p.observe(Some(Duration::from_secs(3)), now);
        assert!(p.fence(&s, expiry(&s), now).is_some());
    }

    #[test]
    fn an_unknown_silence_counts_as_a_reply_just_now() {
        let s = exactly_once();
        let now = Instant::now();
        let mut p = Predecessor::None;
        p.observe(None, now);
        p.terminated();
        assert_eq!(
            p.fence(&s, expiry(&s), now).map(|f| f.until),
            Some(now + Duration::from_secs(14))
        );
    }

    #[test]
    fn a_holder_whose_replies_were_hidden_is_fenced_though_its_walsender_just_went_away() {
        // Not terminated, gone 2 s after the last look: had its replies been visible and recent,
        // no fence; unseen, nothing proves it stopped sending.
        let s = exactly_once();
        let looked = Instant::now();
        let mut p = Predecessor::None;
        p.observe(None, looked);
        let f = p
            .fence(&s, expiry(&s), looked + Duration::from_secs(2))
            .expect("fenced");
        assert_eq!(f.until, looked + Duration::from_secs(14));
        assert!(f.reason.contains("pg_read_all_stats"), "{}", f.reason);
    }
}
