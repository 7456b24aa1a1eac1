//! librdkafka's own log lines and global errors, kept out of the operator's way.
//!
//! During a broker outage librdkafka reports every failed connection attempt, about once a
//! second per broker, and each global error twice (its log line and its error callback). What
//! that means for the outbox is said once by the relay (`relay/outage.rs`), so these go to DEBUG
//! (target `librdkafka`); only what librdkafka itself calls critical or worse reaches WARN, at
//! most once a minute per distinct message. The latest global error is kept for the relay's
//! outage summary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::{debug, warn};

use crate::sink::SinkError;

/// The same message is repeated at WARN at most this often.
const REPEAT_AFTER: Duration = Duration::from_secs(60);
/// Distinct messages remembered for the repeat limit (bounded memory).
const REMEMBERED: usize = 256;

/// What a librdkafka client said last; shared by its context callbacks.
#[derive(Debug, Default)]
pub(crate) struct ClientLog {
    last_error: Mutex<Option<String>>,
    /// The first global error that no retry can mend, with its code ([`ClientLog::verdict`]);
    /// an unresolvable host gives way to a refusal that came after it (that one always counts).
    fatal: Mutex<Option<(RDKafkaErrorCode, SinkError)>>,
    /// A broker acknowledged a record of this client (a host that fails to resolve later is
    /// then a stale bootstrap entry or a DNS hiccup, not a configuration that never worked).
    acknowledged: AtomicBool,
    /// librdkafka said every broker is down.
    all_down: AtomicBool,
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
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.all_down.store(true, Ordering::Relaxed);
        }
        if let Some((code, cause)) = code.and_then(|c| Some((c, fatal_cause(c, reason)?))) {
            if let Ok(mut fatal) = self.fatal.lock() {
                if fatal
                    .as_ref()
                    .is_none_or(|(kept, _)| *kept == RDKafkaErrorCode::Resolve)
                {
                    let error = SinkError {
                        sink: "Kafka",
                        cause,
                        transient: false,
                    };
                    *fatal = Some((code, error));
                }
            }
        }
    }

    /// A delivery failed for a reason the cluster gave: the latest complaint from now on.
    pub(crate) fn note(&self, cause: &str) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(cause.to_owned());
        }
    }

    /// A delivery was acknowledged: the connection settings work.
    pub(crate) fn acknowledged(&self) {
        if !self.acknowledged.load(Ordering::Relaxed) {
            self.acknowledged.store(true, Ordering::Relaxed);
        }
    }

    /// The cluster refused the credentials, its certificate is not trusted, or (before any
    /// broker ever acknowledged and with every broker down) a bootstrap host does not resolve:
    /// what an operator must fix, said with the keys to look at (`Sink::verdict`).
    pub(crate) fn verdict(&self) -> Option<SinkError> {
        let (code, fatal) = self.fatal.lock().ok()?.clone()?;
        if code == RDKafkaErrorCode::Resolve
            && (self.acknowledged.load(Ordering::Relaxed) || !self.all_down.load(Ordering::Relaxed))
        {
            return None;
        }
        Some(fatal)
    }

    /// librdkafka said every broker is down and none ever acknowledged a record of this
    /// client: the latest global error (for `Sink::unreachable`). `None` when there is a
    /// [`verdict`](Self::verdict) instead: then waiting cannot help, and that is what is said.
    pub(crate) fn unreachable(&self) -> Option<String> {
        if self.acknowledged.load(Ordering::Relaxed) || !self.all_down.load(Ordering::Relaxed) {
            return None;
        }
        if self.verdict().is_some() {
            return None;
        }
        self.last_error()
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

/// What an operator must fix, for the global errors that waiting cannot mend; `None` for the
/// rest (a broker down, a connection refused or reset: the relay waits for the broker).
fn fatal_cause(code: RDKafkaErrorCode, reason: &str) -> Option<String> {
    match code {
        RDKafkaErrorCode::Authentication => Some(format!(
            "the cluster refused the relay's credentials ({reason}). Check sasl.mechanism, sasl.username and \
             the password (sasl.password, e.g. from OUTBOX_RELAY__KAFKA__SASL_PASSWORD), and that the user \
             exists on the cluster for that mechanism"
        )),
        RDKafkaErrorCode::SSL => Some(format!(
            "the TLS handshake with the cluster failed ({reason}). {}",
            if reason.contains("certificate verify failed") || reason.contains("verify") {
                "The broker's certificate is not signed by a CA the relay trusts: point ssl.ca.location at the \
                 CA that signed it (and check ssl.endpoint.identification.algorithm for the host name)"
            } else {
                "Check security.protocol (SSL or SASL_SSL against a TLS listener), ssl.ca.location and the \
                 client certificate settings"
            }
        )),
        RDKafkaErrorCode::Resolve => Some(format!(
            "a bootstrap host does not resolve ({reason}). Check bootstrap.servers for a typo, and the relay's DNS"
        )),
        _ => None,
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
    fn a_refused_password_is_a_verdict_an_unresolvable_host_only_before_any_broker_answered() {
        let global = |c| KafkaError::Global(c);
        let log = ClientLog::default();
        log.error(&global(RDKafkaErrorCode::Resolve), "Failed to resolve 'nohost:9092'");
        assert!(log.verdict().is_none(), "one unresolvable host while others may answer");
        assert!(log.unreachable().is_none(), "not every broker is down yet");
        log.error(&global(RDKafkaErrorCode::AllBrokersDown), "1/1 brokers are down");
        assert!(
            log.unreachable().is_none(),
            "a host that does not resolve: the verdict speaks, not 'retrying'"
        );
        let v = log.verdict().expect("nothing answers and the host does not resolve");
        assert!(!v.transient && v.cause.contains("bootstrap.servers"), "{}", v.cause);
        log.acknowledged();
        assert!(log.verdict().is_none(), "a broker answered: a DNS hiccup, not a typo");
        // A refusal after it replaces it, and counts whatever answered before.
        log.error(&global(RDKafkaErrorCode::Authentication), "SASL authentication error");
        let v = log.verdict().expect("credentials refused");
        assert!(v.cause.contains("refused the relay's credentials"), "{}", v.cause);
        // The first refusal stays the one reported.
        log.error(&global(RDKafkaErrorCode::SSL), "certificate verify failed");
        assert!(log.verdict().unwrap().cause.contains("credentials"));
    }

    #[test]
    fn every_broker_down_before_any_acknowledgement_is_unreachable() {
        let log = ClientLog::default();
        assert!(log.unreachable().is_none());
        log.error(
            &KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert!(log.unreachable().is_some_and(|u| u.contains("1/1 brokers are down")));
        log.acknowledged();
        assert!(log.unreachable().is_none(), "a broker answered");
    }

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
