//! What the log says while the broker or PostgreSQL is away: what the outage means for the
//! outbox, once, then a summary at a steady pace, then one line when it is over — never a line
//! per failed attempt.
//!
//! **Broker** ([`BrokerWatch`], sink-neutral): the stream sees an outage as events waiting with
//! no acknowledgement for [`NOTICE_AFTER`]. It then logs one WARN (how many events and bytes
//! wait, since when, that nothing is lost and the slot keeps the WAL meanwhile, the broker's last
//! complaint if the sink reported one), a WARN summary every [`SUMMARY_EVERY`] with the same
//! figures brought up to date, and one INFO when an acknowledgement arrives again (how long it
//! lasted, how many sessions were restarted meanwhile). It lives across sessions: a session
//! that fails during the outage (a delivery timed out) and its replay belong to the same outage.
//!
//! Before that, from the first status tick until the broker is first heard, a sink that says it
//! reaches no broker at all (`Sink::unreachable`: Kafka's "all brokers are down" before any
//! acknowledgement) is said at once, with the addresses, whether or not events wait.
//!
//! **PostgreSQL** ([`Reconnects`]): the first [`LOUD_ATTEMPTS`] failed sessions in a row are
//! WARNs, as before; after that a WARN summary every [`SUMMARY_EVERY`] (attempts, how long,
//! the last error) and DEBUG in between; one INFO once a session streams again.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::ops::units::{human_bytes, utc_from_unix_us};

/// Events waiting this long without an acknowledgement make an outage.
pub(crate) const NOTICE_AFTER: Duration = Duration::from_secs(5);
/// How often an ongoing outage is summarized.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(30);
/// Failed sessions in a row logged one by one before the summaries take over.
pub(crate) const LOUD_ATTEMPTS: u32 = 3;

/// What waits for the broker, as the stream sees it at a status tick.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waiting {
    pub(crate) events: usize,
    pub(crate) bytes: usize,
    /// Commit time (µs since the epoch) of the oldest unconfirmed transaction, if any.
    pub(crate) oldest_commit_unix_us: Option<i64>,
    /// WAL the slot keeps, from the slot monitor's last look.
    pub(crate) retained_wal_bytes: Option<i64>,
}

#[derive(Debug)]
enum BrokerState {
    Acknowledging,
    Stalled {
        since: Instant,
        next_summary: Instant,
        sessions_restarted: u32,
        /// Why the last session ended (a delivery the cluster failed, in its words): the
        /// summaries name it when the new session's client has no complaint of its own yet.
        last_failure: Option<String>,
    },
}

/// Whether the broker was heard since the process started ([`BrokerWatch::unheard_at_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstWord {
    /// Nothing acknowledged yet, nothing said.
    Awaited,
    /// The sink said it reaches no broker, and the log said so.
    SaidUnreachable,
    /// A record was acknowledged.
    Heard,
}

/// The broker's side; see the module docs.
#[derive(Debug)]
pub(crate) struct BrokerWatch {
    /// The last acknowledgement, or the moment events started waiting after a quiet spell.
    last_progress: Instant,
    state: BrokerState,
    first_word: FirstWord,
}

impl Default for BrokerWatch {
    fn default() -> Self {
        BrokerWatch {
            last_progress: Instant::now(),
            state: BrokerState::Acknowledging,
            first_word: FirstWord::Awaited,
        }
    }
}

impl BrokerWatch {
    /// Whether an outage is under way (the log already said so).
    pub(crate) fn stalled(&self) -> bool {
        matches!(self.state, BrokerState::Stalled { .. })
    }

    /// Once per status interval until the broker was first heard: a sink that reaches no
    /// broker (`unreachable`, the sink's words naming the addresses) is said at once — whether
    /// or not events wait — with what it means: the relay retries, nothing is lost.
    pub(crate) fn unheard_at_start(&mut self, sink: &str, unreachable: impl FnOnce() -> Option<String>) {
        if self.first_word != FirstWord::Awaited {
            return;
        }
        let Some(cause) = unreachable() else { return };
        warn!(
            sink,
            "{sink} is unreachable: {cause}. The relay keeps retrying on its own, and nothing is lost: events wait \
             in the WAL, which the slot keeps until {sink} acknowledges them"
        );
        self.first_word = FirstWord::SaidUnreachable;
    }

    /// The broker acknowledged a record.
    pub(crate) fn acknowledged(&mut self, now: Instant, sink: &str) {
        if self.first_word == FirstWord::SaidUnreachable && !self.stalled() {
            info!(sink, "{sink} is reachable: it acknowledged the first events");
        }
        self.first_word = FirstWord::Heard;
        self.last_progress = now;
        if let BrokerState::Stalled {
            since,
            sessions_restarted,
            ..
        } = std::mem::replace(&mut self.state, BrokerState::Acknowledging)
        {
            info!(
                sink,
                outage_seconds = now.duration_since(since).as_secs(),
                sessions_restarted,
                "{sink} acknowledges again after {} s without acknowledgements; the events that waited are being \
                 published (replayed where a session restarted), nothing was lost",
                now.duration_since(since).as_secs()
            );
        }
    }

    /// A session starts streaming: time without acknowledgements counts from here (the time
    /// spent reconnecting to PostgreSQL is not the broker's).
    pub(crate) fn session_started(&mut self, now: Instant) {
        if !self.stalled() {
            self.last_progress = now;
        }
    }

    /// A session ended during the outage with `failure` (its replay follows).
    pub(crate) fn session_restarted(&mut self, failure: String) {
        if let BrokerState::Stalled {
            sessions_restarted,
            last_failure,
            ..
        } = &mut self.state
        {
            *sessions_restarted += 1;
            *last_failure = Some(failure);
        }
    }

    /// Once per status interval: notices an outage, or summarizes the one under way.
    /// `complaint`: the broker's latest error as the sink reported it.
    pub(crate) fn tick(&mut self, now: Instant, waiting: &Waiting, sink: &str, complaint: Option<String>) {
        match &mut self.state {
            BrokerState::Acknowledging if waiting.events == 0 => self.last_progress = now,
            BrokerState::Acknowledging => {
                let silent = now.saturating_duration_since(self.last_progress);
                if silent < NOTICE_AFTER {
                    return;
                }
                warn!(
                    sink,
                    waiting_events = waiting.events,
                    waiting_bytes = waiting.bytes,
                    cause = complaint.as_deref().unwrap_or("no acknowledgement"),
                    "{sink} has acknowledged nothing for {} s: {}. Nothing is lost: the slot keeps the WAL until \
                     every event is acknowledged, and the relay retries on its own (summary every {} s)",
                    silent.as_secs(),
                    describe(waiting),
                    SUMMARY_EVERY.as_secs()
                );
                self.state = BrokerState::Stalled {
                    since: self.last_progress,
                    next_summary: now + SUMMARY_EVERY,
                    sessions_restarted: 0,
                    last_failure: None,
                };
            }
            BrokerState::Stalled {
                since,
                next_summary,
                sessions_restarted,
                last_failure,
            } => {
                if now < *next_summary {
                    return;
                }
                *next_summary = now + SUMMARY_EVERY;
                warn!(
                    sink,
                    outage_seconds = now.duration_since(*since).as_secs(),
                    waiting_events = waiting.events,
                    waiting_bytes = waiting.bytes,
                    sessions_restarted = *sessions_restarted,
                    cause = complaint
                        .as_deref()
                        .or(last_failure.as_deref())
                        .unwrap_or("no acknowledgement"),
                    "{sink} still acknowledges nothing, for {} s now: {}; nothing is lost",
                    now.duration_since(*since).as_secs(),
                    describe(waiting)
                );
            }
        }
    }
}

/// "120 events (48.0 KiB) handed over and unacknowledged, the oldest committed at …; the slot
/// keeps 1.2 GiB of WAL".
fn describe(w: &Waiting) -> String {
    let mut s = format!(
        "{} events ({}) handed over and unacknowledged",
        w.events,
        human_bytes(i64::try_from(w.bytes).unwrap_or(i64::MAX))
    );
    if let Some(us) = w.oldest_commit_unix_us {
        s.push_str(&format!(
            ", the oldest waiting transaction committed at {}",
            utc_from_unix_us(us)
        ));
    }
    if let Some(bytes) = w.retained_wal_bytes {
        s.push_str(&format!("; the slot keeps {} of WAL", human_bytes(bytes)));
    }
    s
}

/// PostgreSQL's side: failed sessions in a row; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Reconnects {
    attempts: u32,
    since: Option<Instant>,
    next_summary: Option<Instant>,
}

impl Reconnects {
    /// A session failed with `error` (transient); the next starts after `retry_in`.
    pub(crate) fn failed(&mut self, now: Instant, slot: &str, error: &dyn std::fmt::Display, retry_in: Duration) {
        self.attempts += 1;
        let since = *self.since.get_or_insert(now);
        let retry_in_ms = retry_in.as_millis() as u64;
        if self.attempts <= LOUD_ATTEMPTS {
            warn!(slot, error = %error, retry_in_ms, "reconnecting");
            if self.attempts == LOUD_ATTEMPTS {
                self.next_summary = Some(now + SUMMARY_EVERY);
            }
            return;
        }
        if self.next_summary.is_some_and(|at| now >= at) {
            self.next_summary = Some(now + SUMMARY_EVERY);
            warn!(
                slot,
                attempts = self.attempts,
                failing_seconds = now.duration_since(since).as_secs(),
                last_error = %error,
                retry_in_ms,
                "still reconnecting: {} attempts in {} s have failed (summary every {} s); the slot keeps the WAL \
                 meanwhile, nothing is lost",
                self.attempts,
                now.duration_since(since).as_secs(),
                SUMMARY_EVERY.as_secs()
            );
        } else {
            debug!(slot, error = %error, retry_in_ms, attempt = self.attempts, "reconnecting");
        }
    }

    /// A session is streaming again.
    pub(crate) fn streaming(&mut self, now: Instant, slot: &str) {
        if let Some(since) = self.since.take() {
            if self.attempts > 1 {
                info!(
                    slot,
                    attempts = self.attempts,
                    "streaming again after {} failed attempts in {} s",
                    self.attempts,
                    now.duration_since(since).as_secs()
                );
            }
        }
        self.attempts = 0;
        self.next_summary = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(events: usize) -> Waiting {
        Waiting {
            events,
            bytes: events * 100,
            oldest_commit_unix_us: Some(1_709_210_096_000_000),
            retained_wal_bytes: Some(3 << 20),
        }
    }

    #[test]
    fn an_outage_is_noticed_after_a_while_and_summarized_at_a_steady_pace() {
        let t0 = Instant::now();
        let mut w = BrokerWatch::default();
        w.tick(t0, &waiting(0), "Kafka", None);
        w.tick(t0 + Duration::from_secs(1), &waiting(3), "Kafka", None);
        w.tick(t0 + Duration::from_secs(4), &waiting(3), "Kafka", None);
        assert!(!w.stalled(), "4 s since the last quiet tick is not an outage yet");
        w.tick(t0 + Duration::from_secs(5), &waiting(3), "Kafka", None);
        assert!(w.stalled());
        w.session_restarted("delivery failed".to_owned());
        // The replay's session has nothing in flight yet: still the same outage.
        w.tick(t0 + Duration::from_secs(7), &waiting(0), "Kafka", None);
        assert!(w.stalled());
        w.acknowledged(t0 + Duration::from_secs(50), "Kafka");
        assert!(!w.stalled());
        // 20 s reconnecting to PostgreSQL, then a session whose first events wait 2 s: no outage.
        w.session_started(t0 + Duration::from_secs(70));
        w.tick(t0 + Duration::from_secs(72), &waiting(4), "Kafka", None);
        assert!(!w.stalled());
    }

    #[test]
    fn an_unreachable_sink_is_said_once_until_it_is_first_heard() {
        let mut w = BrokerWatch::default();
        w.unheard_at_start("Kafka", || None);
        assert_eq!(
            w.first_word,
            FirstWord::Awaited,
            "nothing to say while the client can tell nothing"
        );
        w.unheard_at_start("Kafka", || Some("no broker of bootstrap.servers answers".into()));
        assert_eq!(w.first_word, FirstWord::SaidUnreachable);
        w.unheard_at_start("Kafka", || panic!("said once: not asked again"));
        w.acknowledged(Instant::now(), "Kafka");
        assert_eq!(w.first_word, FirstWord::Heard);
        w.unheard_at_start("Kafka", || panic!("heard: never asked again"));
    }

    #[test]
    fn the_description_carries_counts_bytes_oldest_commit_and_wal() {
        let text = describe(&waiting(120));
        assert!(text.starts_with("120 events (11.7 KiB) handed over"), "{text}");
        assert!(text.contains("committed at 2024-02-29T12:34:56"), "{text}");
        assert!(text.contains("the slot keeps 3.0 MiB of WAL"), "{text}");
    }

    #[test]
    fn reconnects_are_loud_only_at_first_and_reset_once_streaming() {
        let t0 = Instant::now();
        let mut r = Reconnects::default();
        for i in 0..10 {
            r.failed(t0 + Duration::from_secs(i), "s", &"refused", Duration::from_secs(1));
        }
        assert_eq!(r.attempts, 10);
        assert!(r.next_summary.is_some());
        r.streaming(t0 + Duration::from_secs(11), "s");
        assert_eq!(r.attempts, 0);
        assert!(r.since.is_none());
    }
}
