//! `[sns]`: the Amazon SNS sink (`[sink] kind = "sns"`, docs/sink-sns.md) — which region and
//! endpoint, whether the routed topics are FIFO topics, how headers travel, and how hard the
//! relay pushes SNS. The keys are those of every message service (`aws/config.rs`, which
//! validates them); what is SNS's own is here: its names, limits and defaults.
//!
//! ```toml
//! [sns]
//! region = "eu-west-1"                   # else AWS_REGION / the profile's region
//! endpoint_url = "http://127.0.0.1:5000" # else AWS_ENDPOINT_URL / the regional endpoint
//! fifo = true                            # every routed topic is a FIFO topic (name ends in .fifo)
//! headers = "attributes"                 # or "json": all headers in one attribute
//! max_message_bytes = 262144             # SNS's limit (body and attributes)
//! max_concurrency = 256                  # aggregates with a message on the wire at once
//! max_requests = 16                      # PublishBatch calls on the wire at once
//! timeout_ms = 10000                     # one attempt of one call
//! ```
//!
//! Credentials are never in this section: the AWS SDK's default chain finds them.
//!
//! Invariant: `fifo` decides what the sink promises (`aws/config.rs`): FIFO topics keep each
//! aggregate's order and deduplicate replays; standard topics do neither, so exactly-once is
//! refused with [`NO_EXACTLY_ONCE_STANDARD`].

use crate::sink::aws::config::{EndpointKeys, MessageService, MessagesKeys, MessagesSettings, MessagesSpec};
use crate::sink::aws::message::Service;
use crate::sink::requests::{Count, Millis, RequestKeys};

/// The largest message SNS accepts (body and attributes), and the largest `PublishBatch`.
pub(crate) const SNS_MAX_MESSAGE_BYTES: u64 = 256 * 1024;
/// Aggregates with a message on the wire at once unless `max_concurrency` says otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENCY: u64 = 256;
/// `PublishBatch` calls on the wire at once unless `max_requests` says otherwise (batches of
/// 10: 160 messages per round trip).
pub(crate) const DEFAULT_MAX_REQUESTS: u64 = 16;
/// One attempt of one call unless `timeout_ms` says otherwise.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// Why `relay.delivery = "exactly-once"` is refused with standard topics (the config error's words).
pub(crate) const NO_EXACTLY_ONCE_STANDARD: &str = "standard SNS topics do not deduplicate (and may deliver a message \
     twice on their own): exactly-once needs FIFO topics, whose MessageDeduplicationId drops the relay's replays. Set \
     [sns] fifo = true and route to topics whose names end in .fifo, or use relay.delivery = \"at-least-once\" and \
     deduplicate on the `id` attribute (docs/sink-sns.md)";

/// Amazon SNS as a message service: the section's keys and SNS's names ([`super::SERVICE`]).
#[derive(Debug, Clone)]
pub(crate) struct Sns;

impl MessageService for Sns {
    const SERVICE: &'static Service = &super::SERVICE;
    const KEYS: MessagesKeys = MessagesKeys {
        endpoint: EndpointKeys {
            region: "sns.region",
            endpoint_url: "sns.endpoint_url",
            example: "https://sns.eu-west-1.amazonaws.com",
        },
        headers: "sns.headers",
        max_message_bytes: Count {
            key: "sns.max_message_bytes",
            default: SNS_MAX_MESSAGE_BYTES,
            most: None,
        },
        message_limit: SNS_MAX_MESSAGE_BYTES,
        requests: RequestKeys {
            concurrency: Some(Count {
                key: "sns.max_concurrency",
                default: DEFAULT_MAX_CONCURRENCY,
                most: None,
            }),
            requests: Some(Count {
                key: "sns.max_requests",
                default: DEFAULT_MAX_REQUESTS,
                most: Some((1024, "calls at once")),
            }),
            timeout: Millis {
                key: "sns.timeout_ms",
                default: DEFAULT_TIMEOUT_MS,
                least: 1,
            },
        },
        no_exactly_once: NO_EXACTLY_ONCE_STANDARD,
    };
}

/// `[sns]`, validated.
pub(crate) type SnsSettings = MessagesSettings<Sns>;

/// The config half of the SNS sink (its plugin's `SPEC`, registered in `src/sink/registry.rs`).
pub(crate) const SECTION: MessagesSpec<Sns> = MessagesSpec::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_every_key_and_the_warning() {
        crate::sink::aws::config::tests::every_key_is_read_and_checked::<Sns>(
            100000,
            300000,
            "topic_arn",
            "[sns] fifo = false: standard SNS topics do not keep order (nor deliver only once), so the events of \
             one aggregate may reach subscribers out of commit order. Route to FIFO topics (names ending in .fifo) \
             with fifo = true to keep per-aggregate order (docs/sink-sns.md)",
        );
    }
}
