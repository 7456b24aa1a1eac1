//! The request settings the request/response sinks' sections repeat — how many aggregates have
//! a request on the wire at once (`max_concurrency`), how many calls of a batching sink are on
//! the wire at once (`max_requests`), how long one request may take (`timeout_ms`, or the name
//! the sink gives it) — validated once, here, and turned into the driver's options
//! ([`DriverOptions`]).
//!
//! A sink declares which of the keys it has in a [`RequestKeys`] (their full names, defaults and
//! ceilings: each sink keeps its own), lists the raw keys in its own section struct (serde's
//! `deny_unknown_fields` needs them there) and hands their values to [`RequestKeys::validate`].
//!
//! Invariant: every key is at least 1 (a timeout at least its floor) and at most its ceiling, and
//! an error names the key and the fix, as every config error does.

use std::time::Duration;

use crate::config::ConfigError;
use crate::sink::driver::{Concurrency, DriverOptions};
use crate::sink::plugin::SinkContext;

/// A count key (`"sqs.max_concurrency"`), its default and, if any, its ceiling.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Count {
    pub(crate) key: &'static str,
    pub(crate) default: u64,
    /// The most it may be and what it counts, for the error: `(1024, "calls at once")`.
    pub(crate) most: Option<(u64, &'static str)>,
}

/// A key in milliseconds (`"sqs.timeout_ms"`), its default and its floor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Millis {
    pub(crate) key: &'static str,
    pub(crate) default: u64,
    pub(crate) least: u64,
}

/// The request keys of one sink's section.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestKeys {
    /// Aggregates with a request on the wire at once; `None`: the sink has no such key.
    pub(crate) concurrency: Option<Count>,
    /// Calls on the wire at once (a sink that batches); `None`: the sink has no such key.
    pub(crate) requests: Option<Count>,
    /// One request's (or one attempt's) bound.
    pub(crate) timeout: Millis,
}

/// A section's request keys, validated. A key the sink does not have reads as `usize::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Requests {
    pub(crate) max_concurrency: usize,
    pub(crate) max_requests: usize,
    pub(crate) timeout: Duration,
}

impl Count {
    /// The count `value` (or the default) stands for.
    pub(crate) fn validate(&self, value: Option<u64>) -> Result<usize, ConfigError> {
        let n = value.unwrap_or(self.default);
        if n == 0 {
            return Err(ConfigError::invalid(
                self.key,
                format!("must be at least 1; leave it out for {}", self.default),
            ));
        }
        if let Some((most, what)) = self.most {
            if n > most {
                return Err(ConfigError::invalid(
                    self.key,
                    format!("{n} {what} is more than {most}; lower it"),
                ));
            }
        }
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

impl Millis {
    /// The duration `value` (or the default) stands for.
    pub(crate) fn validate(&self, value: Option<u64>) -> Result<Duration, ConfigError> {
        match value.unwrap_or(self.default) {
            ms if ms < self.least.max(1) => Err(ConfigError::invalid(
                self.key,
                format!(
                    "must be at least {} ms; leave it out for {} ms",
                    self.least.max(1),
                    self.default
                ),
            )),
            ms => Ok(Duration::from_millis(ms)),
        }
    }
}

impl RequestKeys {
    /// The section's values of `max_concurrency`, `max_requests` and the timeout, validated (a
    /// value for a key the sink does not have is ignored: its section has no such field).
    pub(crate) fn validate(
        &self,
        max_concurrency: Option<u64>,
        max_requests: Option<u64>,
        timeout_ms: Option<u64>,
    ) -> Result<Requests, ConfigError> {
        let count = |key: &Option<Count>, value| key.as_ref().map_or(Ok(usize::MAX), |k| k.validate(value));
        Ok(Requests {
            max_concurrency: count(&self.concurrency, max_concurrency)?,
            max_requests: count(&self.requests, max_requests)?,
            timeout: self.timeout.validate(timeout_ms)?,
        })
    }
}

impl Requests {
    /// The driver of a sink with one request per key on the wire (what a transport without order
    /// between requests needs), up to `max_concurrency` keys at once within the caller's
    /// budgets. Each attempt is bounded by the adapter, which retries for as long as the broker
    /// fails: no reply timer, or an outage would end in a replay. Dropped without abandon, what
    /// is on the wire gets one timeout.
    pub(crate) fn per_key(&self, cx: &SinkContext) -> DriverOptions {
        DriverOptions {
            concurrency: Concurrency::PerKey {
                max_keys: self.max_concurrency,
            },
            max_in_flight: cx.max_in_flight.max(1),
            max_in_flight_bytes: cx.max_in_flight_bytes,
            reply_timeout: None,
            max_queue_wait: None,
            dedup_queue_wait: None,
            drop_wait: self.timeout,
        }
    }

    /// The driver of a sink whose requests are pipelined on one connection: the caller's budget
    /// bounds what is queued and the connection what is on the wire; no reply timer (the
    /// connection bounds its replies). Dropped without abandon, what is on the wire gets one
    /// timeout.
    pub(crate) fn pipelined(&self) -> DriverOptions {
        DriverOptions {
            concurrency: Concurrency::Pipelined,
            max_in_flight: usize::MAX,
            max_in_flight_bytes: usize::MAX,
            reply_timeout: None,
            max_queue_wait: None,
            dedup_queue_wait: None,
            drop_wait: self.timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: RequestKeys = RequestKeys {
        concurrency: Some(Count {
            key: "x.max_concurrency",
            default: 256,
            most: None,
        }),
        requests: Some(Count {
            key: "x.max_requests",
            default: 16,
            most: Some((1024, "calls at once")),
        }),
        timeout: Millis {
            key: "x.timeout_ms",
            default: 10_000,
            least: 1,
        },
    };

    #[test]
    fn defaults_values_floors_and_ceilings() {
        assert_eq!(
            KEYS.validate(None, None, None).unwrap(),
            Requests {
                max_concurrency: 256,
                max_requests: 16,
                timeout: Duration::from_secs(10)
            }
        );
        assert_eq!(
            KEYS.validate(Some(8), Some(1024), Some(500)).unwrap(),
            Requests {
                max_concurrency: 8,
                max_requests: 1024,
                timeout: Duration::from_millis(500)
            }
        );
        for ((c, r, t), says) in [
            (
                (Some(0), None, None),
                "x.max_concurrency: must be at least 1; leave it out for 256",
            ),
            (
                (None, Some(5000), None),
                "x.max_requests: 5000 calls at once is more than 1024; lower it",
            ),
            (
                (None, None, Some(0)),
                "x.timeout_ms: must be at least 1 ms; leave it out for 10000 ms",
            ),
        ] {
            let err = KEYS.validate(c, r, t).unwrap_err().to_string();
            assert!(err.ends_with(says), "{err}");
        }
        let floor = Millis {
            key: "y.timeout_ms",
            default: 10_000,
            least: 100,
        };
        assert!(floor
            .validate(Some(99))
            .unwrap_err()
            .to_string()
            .contains("at least 100 ms"));
        let only_timeout = RequestKeys {
            concurrency: None,
            requests: None,
            timeout: floor,
        };
        let r = only_timeout.validate(Some(0), Some(0), None).unwrap();
        assert_eq!(
            (r.max_concurrency, r.max_requests),
            (usize::MAX, usize::MAX),
            "keys it has not"
        );
    }
}
