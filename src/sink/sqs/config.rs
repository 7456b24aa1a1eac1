//! `[sqs]`: the Amazon SQS sink (`[sink] kind = "sqs"`, docs/sink-sqs.md) — which region and
//! endpoint, whether the routed queues are FIFO queues, how headers travel, and how hard the
//! relay pushes SQS.
//!
//! ```toml
//! [sqs]
//! region = "eu-west-1"                 # else AWS_REGION / the profile's region
//! endpoint_url = "http://127.0.0.1:5000" # else AWS_ENDPOINT_URL / the regional endpoint
//! fifo = true                          # every routed queue is a FIFO queue (name ends in .fifo)
//! headers = "attributes"               # or "json": all headers in one attribute
//! max_message_bytes = 262144           # SQS's own limit is 1 MiB; the queue's may be lower
//! max_concurrency = 256                # aggregates with a message on the wire at once
//! max_requests = 16                    # SendMessageBatch calls on the wire at once
//! timeout_ms = 10000                   # one attempt of one call
//! ```
//!
//! Credentials are never in this section: the AWS SDK's default chain finds them (environment,
//! profile, web identity, container and instance metadata), so nothing here is secret.
//!
//! Invariant: `fifo` decides what the sink promises. FIFO queues keep the order of each
//! aggregate (its key is the message group) and deduplicate replays, so exactly-once is
//! accepted; standard queues do neither, so exactly-once is refused here with the reason and a
//! start warning says order is not kept.

use std::time::Duration;

use serde::Deserialize;

use crate::config::aws;
use crate::config::cloudevents::CloudEventsMode;
use crate::config::relay::{Delivery, RelaySettings};
use crate::config::sink::{parse_section, SectionContext, SinkSection, SinkSectionSpec};
use crate::config::{number_or_numeric_string, ConfigError};

/// The largest message SQS accepts (body and attributes, since August 2025; a queue's
/// `MaximumMessageSize` may be lower).
pub(crate) const SQS_MAX_MESSAGE_BYTES: u64 = 1024 * 1024;
/// The largest message sent unless `max_message_bytes` says otherwise: the default
/// `MaximumMessageSize` of a queue created before SQS raised its limit, and of moto's queues.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: u64 = 256 * 1024;
/// Aggregates with a message on the wire at once unless `max_concurrency` says otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENCY: u64 = 256;
/// `SendMessageBatch` calls on the wire at once unless `max_requests` says otherwise: with
/// batches of 10, 16 calls carry 160 messages per round trip.
pub(crate) const DEFAULT_MAX_REQUESTS: u64 = 16;
/// One attempt of one call unless `timeout_ms` says otherwise.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

use crate::config::aws::optional_bool;
pub(crate) use crate::config::aws::HeaderMode;

/// The raw `[sqs]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SqsSection {
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint_url: Option<String>,
    #[serde(default, deserialize_with = "optional_bool")]
    fifo: Option<bool>,
    #[serde(default)]
    headers: Option<String>,
    #[serde(default, deserialize_with = "optional_number")]
    max_message_bytes: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_concurrency: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_requests: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    timeout_ms: Option<u64>,
}

fn optional_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    number_or_numeric_string(d).map(Some)
}

/// `[sqs]`, validated.
#[derive(Debug, Clone)]
pub struct SqsSettings {
    /// `None`: the SDK's chain (`AWS_REGION`, the profile).
    pub(crate) region: Option<String>,
    /// `None`: the SDK's chain (`AWS_ENDPOINT_URL`), else the regional endpoint.
    pub(crate) endpoint_url: Option<String>,
    pub(crate) fifo: bool,
    pub(crate) headers: HeaderMode,
    pub(crate) max_message_bytes: usize,
    pub(crate) max_concurrency: usize,
    pub(crate) max_requests: usize,
    pub(crate) timeout: Duration,
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

impl SqsSection {
    pub(crate) fn validate(self) -> Result<SqsSettings, ConfigError> {
        let region = aws::region("sqs.region", self.region.as_deref())?;
        let endpoint_url = aws::endpoint_url(
            "sqs.endpoint_url",
            self.endpoint_url.as_deref(),
            "https://sqs.eu-west-1.amazonaws.com",
        )?;
        let headers = aws::header_mode("sqs.headers", self.headers.as_deref())?;
        let positive = |key: &'static str, v: Option<u64>, default: u64| match v.unwrap_or(default) {
            0 => Err(invalid(key, format!("must be at least 1; leave it out for {default}"))),
            n => Ok(n),
        };
        let max_message_bytes = positive(
            "sqs.max_message_bytes",
            self.max_message_bytes,
            DEFAULT_MAX_MESSAGE_BYTES,
        )?;
        if max_message_bytes > SQS_MAX_MESSAGE_BYTES {
            return Err(invalid(
                "sqs.max_message_bytes",
                format!("{max_message_bytes} is above SQS's limit of {SQS_MAX_MESSAGE_BYTES} bytes; lower it"),
            ));
        }
        let max_concurrency = positive("sqs.max_concurrency", self.max_concurrency, DEFAULT_MAX_CONCURRENCY)?;
        let max_requests = positive("sqs.max_requests", self.max_requests, DEFAULT_MAX_REQUESTS)?;
        if max_requests > 1024 {
            return Err(invalid(
                "sqs.max_requests",
                format!("{max_requests} calls at once is more than 1024; lower it"),
            ));
        }
        let timeout = Duration::from_millis(positive("sqs.timeout_ms", self.timeout_ms, DEFAULT_TIMEOUT_MS)?);
        Ok(SqsSettings {
            region,
            endpoint_url,
            fifo: self.fifo.unwrap_or(false),
            headers,
            max_message_bytes: usize::try_from(max_message_bytes).unwrap_or(usize::MAX),
            max_concurrency: usize::try_from(max_concurrency).unwrap_or(usize::MAX),
            max_requests: usize::try_from(max_requests).unwrap_or(usize::MAX),
            timeout,
        })
    }
}

/// Why `relay.delivery = "exactly-once"` is refused with standard queues (the config error's words).
pub(crate) const NO_EXACTLY_ONCE_STANDARD: &str = "standard SQS queues do not deduplicate (and may deliver a message \
     twice on their own): exactly-once needs FIFO queues, whose MessageDeduplicationId drops the relay's replays. Set \
     [sqs] fifo = true and route to queues whose names end in .fifo, or use relay.delivery = \"at-least-once\" and \
     deduplicate on the `id` attribute (docs/sink-sqs.md)";

/// The config half of the SQS sink (its plugin's `spec`, registered in `src/sink/registry.rs`).
pub(crate) struct SqsSpec;

/// The registration of `[sqs]`.
pub(crate) const SECTION: SqsSpec = SqsSpec;

impl SinkSectionSpec for SqsSpec {
    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn name(&self) -> &'static str {
        "Amazon SQS"
    }

    /// An empty (or missing) `[sqs]` is valid: region, endpoint and credentials then come from
    /// the AWS SDK's own chain, and queues are standard ones.
    fn validate(
        &self,
        section: Option<toml::Value>,
        cx: &SectionContext<'_>,
    ) -> Result<std::sync::Arc<dyn SinkSection>, ConfigError> {
        let raw: SqsSection = match section {
            Some(section) => parse_section("sqs", section)?,
            None => SqsSection::default(),
        };
        let settings = raw.validate()?;
        if cx.relay.delivery == Delivery::ExactlyOnce && !settings.fifo {
            return Err(invalid("relay.delivery", NO_EXACTLY_ONCE_STANDARD));
        }
        Ok(std::sync::Arc::new(settings))
    }

    /// SQS has no CloudEvents binding; at most 10 attributes leave no room for the binary
    /// mode's `ce_*` headers beside the relay's own.
    fn cloudevents_mode(&self, mode: CloudEventsMode) -> Result<(), String> {
        match mode {
            CloudEventsMode::Structured => Ok(()),
            CloudEventsMode::Binary => Err(
                "SQS has no CloudEvents binding and allows 10 message attributes; use mode = \"structured\" (the \
                 event as a JSON envelope in the message body)"
                    .into(),
            ),
        }
    }
}

impl SinkSection for SqsSettings {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn start_warnings(&self, _: &RelaySettings) -> Vec<String> {
        self.warnings()
    }

    fn get(&self, key: &str) -> Option<String> {
        match key {
            "region" => self.region.clone(),
            "endpoint_url" => self.endpoint_url.clone(),
            "fifo" => Some(self.fifo.to_string()),
            _ => None,
        }
    }
}

impl SqsSettings {
    /// The start warning of standard queues (order is not kept).
    fn warnings(&self) -> Vec<String> {
        if self.fifo {
            Vec::new()
        } else {
            vec![
                "[sqs] fifo = false: standard SQS queues do not keep order (nor deliver only once), so the events \
                  of one aggregate may reach consumers out of commit order. Route to FIFO queues (names ending in \
                  .fifo) with fifo = true to keep per-aggregate order (docs/sink-sqs.md)"
                    .to_owned(),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml: &str) -> Result<SqsSettings, String> {
        let s: SqsSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_section_takes_the_sdk_chain_and_the_defaults() {
        let s = section("").unwrap();
        assert_eq!((s.region.as_deref(), s.endpoint_url.as_deref()), (None, None));
        assert!(!s.fifo);
        assert_eq!(s.headers, HeaderMode::Attributes);
        assert_eq!(s.max_message_bytes as u64, DEFAULT_MAX_MESSAGE_BYTES);
        assert_eq!(s.max_concurrency as u64, DEFAULT_MAX_CONCURRENCY);
        assert_eq!(s.max_requests as u64, DEFAULT_MAX_REQUESTS);
        assert_eq!(s.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert!(!s.warnings().is_empty(), "standard queues warn");
    }

    #[test]
    fn every_key_is_read_and_checked() {
        let s = section(
            "region = \"eu-west-1\"\nendpoint_url = \"http://127.0.0.1:5000/\"\nfifo = \"true\"\nheaders = \"json\"\n\
             max_message_bytes = 1048576\nmax_concurrency = 8\nmax_requests = \"4\"\ntimeout_ms = 500",
        )
        .unwrap();
        assert_eq!(s.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(s.fifo && s.warnings().is_empty());
        assert_eq!(s.headers, HeaderMode::Json);
        assert_eq!(
            (s.max_message_bytes, s.max_concurrency, s.max_requests, s.timeout),
            (1 << 20, 8, 4, Duration::from_millis(500))
        );
        for (toml, says) in [
            ("region = \"Europe\"", "sqs.region"),
            ("endpoint_url = \"localhost:5000\"", "not an absolute URL"),
            ("endpoint_url = \"ftp://h\"", "not http"),
            ("endpoint_url = \"http://k:s@h\"", "credential chain"),
            ("headers = \"xml\"", "sqs.headers"),
            ("max_message_bytes = 2000000", "above SQS's limit"),
            ("max_concurrency = 0", "leave it out"),
            ("max_requests = 5000", "sqs.max_requests"),
            ("fifo = \"yes\"", "not true or false"),
            ("queue_url = \"x\"", "queue_url"),
        ] {
            let err = section(toml).unwrap_err();
            assert!(err.contains(says), "{toml}: {err}");
        }
    }
}
