//! librdkafka's own log lines and global errors, kept out of the operator's way.
//!
//! During a broker outage librdkafka reports every failed connection attempt, about once a
//! second per broker, and each global error twice (its log line and its error callback). What
//! that means for the outbox is said once by the relay (`relay/outage.rs`), so these go to DEBUG
//! (target `librdkafka`); only what librdkafka itself calls critical or worse reaches WARN, at
//! most once a minute per distinct message. The latest global error is kept for the relay's
//! outage summary.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use tracing::{debug, warn};

/// The same message is repeated at WARN at most this often.
const REPEAT_AFTER: Duration = Duration::from_secs(60);
/// Distinct messages remembered for the repeat limit (bounded memory).
const REMEMBERED: usize = 256;

/// What a librdkafka client said last; shared by its context callbacks.
#[derive(Debug, Default)]
pub(crate) struct ClientLog {
    last_error: Mutex<Option<String>>,
    warned: Mutex<HashMap<String, Instant>>,
}

impl ClientLog {
    /// librdkafka's log callback.
    pub(crate) fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let severe = matches!(
            level,
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical
        );
        if severe && self.first_in_a_while(message) {
            warn!(target: "librdkafka", facility = fac, "librdkafka: {message}");
        } else {
            debug!(target: "librdkafka", facility = fac, level = ?level, "librdkafka: {message}");
        }
    }

    /// librdkafka's global error callback.
    pub(crate) fn error(&self, error: &KafkaError, reason: &str) {
        debug!(target: "librdkafka", error = %error, "librdkafka global error: {reason}");
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(format!("{error}: {reason}"));
        }
    }

    /// The latest global error (for `Sink::complaint`).
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|l| l.clone())
    }

    fn first_in_a_while(&self, message: &str) -> bool {
        let Ok(mut warned) = self.warned.lock() else {
            return true;
        };
        let now = Instant::now();
        if warned
            .get(message)
            .is_some_and(|at| now.duration_since(*at) < REPEAT_AFTER)
        {
            return false;
        }
        if warned.len() >= REMEMBERED {
            warned.retain(|_, at| now.duration_since(*at) < REPEAT_AFTER);
        }
        warned.insert(message.to_owned(), now);
        true
    }
}

/// The context of a librdkafka client with no callbacks of its own (the read-back consumer):
/// its logs and errors go through [`ClientLog`].
#[derive(Default)]
pub(crate) struct QuietContext(pub(crate) ClientLog);

impl rdkafka::ClientContext for QuietContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(&error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_severe_message_is_warned_once_a_minute_and_errors_are_kept() {
        let log = ClientLog::default();
        assert!(log.first_in_a_while("disk full"));
        assert!(!log.first_in_a_while("disk full"));
        assert!(log.first_in_a_while("other"));
        assert_eq!(log.last_error(), None);
        log.error(
            &KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AllBrokersDown),
            "3/3 brokers are down",
        );
        let last = log.last_error().unwrap();
        assert!(last.contains("3/3 brokers are down"), "{last}");
    }
}
