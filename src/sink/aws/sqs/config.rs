//! `[sqs]`: the Amazon SQS sink (`[sink] kind = "sqs"`, docs/sink-sqs.md) — which region and
//! endpoint, whether the routed queues are FIFO queues, how headers travel, and how hard the
//! relay pushes SQS. The keys are those of every message service (`aws/config.rs`, which
//! validates them); what is SQS's own is here: its names, limits and defaults.
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
//! Invariant: `fifo` decides what the sink promises (`aws/config.rs`): FIFO queues keep each
//! aggregate's order and deduplicate replays; standard queues do neither, so exactly-once is
//! refused with [`NO_EXACTLY_ONCE_STANDARD`].

use crate::sink::aws::config::{EndpointKeys, MessageService, MessagesKeys, MessagesSettings, MessagesSpec};
use crate::sink::aws::message::Service;
use crate::sink::requests::{Count, Millis, RequestKeys};

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

/// Why `relay.delivery = "exactly-once"` is refused with standard queues (the config error's words).
pub(crate) const NO_EXACTLY_ONCE_STANDARD: &str = "standard SQS queues do not deduplicate (and may deliver a message \
     twice on their own): exactly-once needs FIFO queues, whose MessageDeduplicationId drops the relay's replays. Set \
     [sqs] fifo = true and route to queues whose names end in .fifo, or use relay.delivery = \"at-least-once\" and \
     deduplicate on the `id` attribute (docs/sink-sqs.md)";

/// Amazon SQS as a message service: the section's keys and SQS's names ([`super::SERVICE`]).
#[derive(Debug, Clone)]
pub(crate) struct Sqs;

impl MessageService for Sqs {
    const SERVICE: &'static Service = &super::SERVICE;
    const KEYS: MessagesKeys = MessagesKeys {
        endpoint: EndpointKeys {
            region: "sqs.region",
            endpoint_url: "sqs.endpoint_url",
            example: "https://sqs.eu-west-1.amazonaws.com",
        },
        headers: "sqs.headers",
        max_message_bytes: Count {
            key: "sqs.max_message_bytes",
            default: DEFAULT_MAX_MESSAGE_BYTES,
            most: None,
        },
        message_limit: SQS_MAX_MESSAGE_BYTES,
        requests: RequestKeys {
            concurrency: Some(Count {
                key: "sqs.max_concurrency",
                default: DEFAULT_MAX_CONCURRENCY,
                most: None,
            }),
            requests: Some(Count {
                key: "sqs.max_requests",
                default: DEFAULT_MAX_REQUESTS,
                most: Some((1024, "calls at once")),
            }),
            timeout: Millis {
                key: "sqs.timeout_ms",
                default: DEFAULT_TIMEOUT_MS,
                least: 1,
            },
        },
        no_exactly_once: NO_EXACTLY_ONCE_STANDARD,
    };
}

/// `[sqs]`, validated.
pub(crate) type SqsSettings = MessagesSettings<Sqs>;

/// The config half of the SQS sink (its plugin's `spec`, registered in `src/sink/registry.rs`).
pub(crate) const SECTION: MessagesSpec<Sqs> = MessagesSpec::new();

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sink::aws::config::{HeaderMode, MessagesSection};

    fn section(toml: &str) -> Result<SqsSettings, String> {
        let s: MessagesSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_section_takes_the_sdk_chain_and_the_defaults() {
        let s = section("").unwrap();
        assert_eq!(
            (s.endpoint.region.as_deref(), s.endpoint.endpoint_url.as_deref()),
            (None, None)
        );
        assert!(!s.fifo);
        assert_eq!(s.headers, HeaderMode::Attributes);
        assert_eq!(s.max_message_bytes as u64, DEFAULT_MAX_MESSAGE_BYTES);
        assert_eq!(s.requests.max_concurrency as u64, DEFAULT_MAX_CONCURRENCY);
        assert_eq!(s.requests.max_requests as u64, DEFAULT_MAX_REQUESTS);
        assert_eq!(s.requests.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert!(!s.warnings().is_empty(), "standard queues warn");
    }

    #[test]
    fn every_key_is_read_and_checked() {
        let s = section(
            "region = \"eu-west-1\"\nendpoint_url = \"http://127.0.0.1:5000/\"\nfifo = \"true\"\nheaders = \"json\"\n\
             max_message_bytes = 1048576\nmax_concurrency = 8\nmax_requests = \"4\"\ntimeout_ms = 500",
        )
        .unwrap();
        assert_eq!(s.endpoint.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.endpoint.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(s.fifo && s.warnings().is_empty());
        assert_eq!(s.headers, HeaderMode::Json);
        assert_eq!(
            (
                s.max_message_bytes,
                s.requests.max_concurrency,
                s.requests.max_requests,
                s.requests.timeout
            ),
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

    #[test]
    fn the_standard_queues_warning_names_the_fix() {
        let s = section("").unwrap();
        assert_eq!(
            s.warnings(),
            [
                "[sqs] fifo = false: standard SQS queues do not keep order (nor deliver only once), so the events of \
              one aggregate may reach consumers out of commit order. Route to FIFO queues (names ending in .fifo) \
              with fifo = true to keep per-aggregate order (docs/sink-sqs.md)"
            ]
        );
    }
}
