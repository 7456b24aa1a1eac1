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

/// The config half of the SQS sink (its plugin's `SPEC`, registered in `src/sink/registry.rs`).
pub(crate) const SECTION: MessagesSpec<Sqs> = MessagesSpec::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_every_key_and_the_warning() {
        crate::sink::aws::config::tests::every_key_is_read_and_checked::<Sqs>(
            1048576,
            2000000,
            "queue_url",
            "[sqs] fifo = false: standard SQS queues do not keep order (nor deliver only once), so the events of \
             one aggregate may reach consumers out of commit order. Route to FIFO queues (names ending in .fifo) \
             with fifo = true to keep per-aggregate order (docs/sink-sqs.md)",
        );
    }
}
