//! The Amazon SNS sink (`[sink] kind = "sns"`): each event a message published to the topic
//! named by its routed name, standard or FIFO (`[sns] fifo`). docs/sink-sns.md describes what a
//! subscriber gets and the guarantees.
//!
//! * `client.rs` — the AWS SDK client (`sink/aws.rs`'s chain, `[sns]` on top) and the topic
//!   ARNs, looked up by name (`ListTopics`, never created) and cached;
//! * [`SERVICE`] — what the message encoder shared with SQS (`sink/aws_message.rs`: body,
//!   attributes, FIFO group and deduplication id, everything SNS would refuse) needs of SNS;
//! * `exchange.rs` — what the shared driver runs: messages batched into `PublishBatch` calls
//!   by the shared batcher (`sink/batch.rs`), each entry's failure refused or retried.
//!
//! Order per aggregate comes from the driver (one message per key on the wire, up to
//! `max_concurrency` keys at once) and, on the subscriber's side, from FIFO topics (the key is
//! the message group). Exactly-once is SNS's FIFO deduplication: the relay's source position is
//! the `MessageDeduplicationId`, so a replay within SNS's 5-minute window is dropped by SNS.
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! never prints credentials (the SDK resolves them; nothing of them is in `[sns]`).

pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod exchange;

use std::sync::Arc;
use std::time::Duration;

use crate::config::relay::Delivery;
use crate::config::sink::SinkSectionSpec;
use crate::sink::driver::{self, Concurrency, DriverOptions};
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, ExactlyOnce, SinkError, SinkLimits, SinkWithCompletions};
use config::SnsSettings;

use crate::sink::aws_message::{Encoder, Service};
use client::Sns;

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = "Amazon SNS";

/// What the shared message encoder (`sink/aws_message.rs`) needs to know of SNS.
pub(crate) const SERVICE: Service = Service {
    name: "SNS",
    section: "sns",
    destination: "topic",
    verb: "publishes to",
    attribute_limit: "SNS delivers at most 10 to SQS subscribers",
    max_name: 256,
    size_limit: "SNS's limit of 262144 bytes",
};

/// How long `setup` and `status` wait for a connection.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a message may wait in the driver's queue before it is failed unsent instead
/// (exactly-once): well inside SNS's 5-minute deduplication window, so a frozen and thawed
/// holder's queue is never published after the window closed on what a standby sent meanwhile.
const EXACTLY_ONCE_QUEUE_WAIT: Duration = Duration::from_secs(60);

/// The SNS sink's plugin (`src/sink/registry.rs`).
pub(crate) struct SnsPlugin;

impl SinkPlugin for SnsPlugin {
    type Config = SnsSettings;

    fn spec(&self) -> &'static dyn SinkSectionSpec {
        &config::SECTION
    }

    /// Named like OpenTelemetry's `aws_sqs`.
    fn messaging_system(&self) -> &'static str {
        "aws_sns"
    }

    /// The SDK's own lines (retries, credential lookups, connection churn) are DEBUG: the sink
    /// reports failures itself.
    fn log_targets(&self) -> &'static [ClientLogTarget] {
        &[
            ClientLogTarget {
                target: "aws_config",
                fixed: None,
            },
            ClientLogTarget {
                target: "aws_sdk_sns",
                fixed: None,
            },
            ClientLogTarget {
                target: "aws_smithy_runtime",
                fixed: None,
            },
            ClientLogTarget {
                target: "aws_smithy_http_client",
                fixed: None,
            },
        ]
    }

    fn limits(&self, config: &SnsSettings) -> SinkLimits {
        SinkLimits {
            check_name: if config.fifo {
                |name| SERVICE.check_fifo_name(name)
            } else {
                |name| SERVICE.check_standard_name(name)
            },
            max_message_bytes: config.max_message_bytes,
        }
    }

    /// FIFO topics deduplicate on `MessageDeduplicationId` within 5 minutes; standard topics
    /// are refused by the config already (`config::NO_EXACTLY_ONCE_STANDARD`).
    fn exactly_once(&self, config: &SnsSettings, _: &SinkContext) -> ExactlyOnce {
        if config.fifo {
            ExactlyOnce::BrokerDeduplicates
        } else {
            ExactlyOnce::Unsupported(config::NO_EXACTLY_ONCE_STANDARD)
        }
    }

    async fn prepare(&self, config: &SnsSettings) -> Result<Vec<String>, SinkError> {
        let line = probe(config).await?;
        Ok(vec![
            line,
            "SNS topics are not created by setup: create each routed topic (with fifo = true, FIFO topics whose \
             names end in .fifo) and its subscriptions before events are routed to it; an event for a missing topic \
             is a bad event (relay.on_bad_event)"
                .to_owned(),
        ])
    }

    async fn probe(&self, config: &SnsSettings) -> Result<String, SinkError> {
        probe(config).await
    }

    async fn create<Tag: Send + Sync + 'static>(
        &self,
        config: &SnsSettings,
        cx: &SinkContext,
    ) -> Result<SinkWithCompletions<Tag>, SinkError> {
        let sns = Sns::connect(config, cx.connect_timeout).await?;
        let encoder = Encoder {
            service: &SERVICE,
            fifo: config.fifo,
            headers: config.headers,
            max_message_bytes: config.max_message_bytes,
        };
        let exchange = exchange::SnsExchange::start(sns, encoder, config.max_requests);
        let options = DriverOptions {
            concurrency: Concurrency::PerKey {
                max_keys: config.max_concurrency,
            },
            max_in_flight: cx.max_in_flight.max(1),
            max_in_flight_bytes: cx.max_in_flight_bytes,
            // Each attempt is bounded ([sns] timeout_ms) and the batcher retries for as long as
            // SNS fails: no overall timer, or an outage would end in a replay.
            reply_timeout: None,
            max_queue_wait: (cx.delivery == Delivery::ExactlyOnce).then_some(EXACTLY_ONCE_QUEUE_WAIT),
            // Dropped without abandon: one attempt's time for what is on the wire.
            drop_wait: config.timeout,
        };
        Ok(boxed(driver::start(Arc::new(exchange), options)))
    }
}

/// `status`: credentials found, and SNS lists the topics the relay publishes to (`ListTopics`,
/// the call the sink resolves topic ARNs with: the relay needs `sns:ListTopics` and
/// `sns:Publish`).
pub(crate) async fn probe(settings: &SnsSettings) -> Result<String, SinkError> {
    let sns = Sns::connect(settings, PROBE_CONNECT_TIMEOUT).await?;
    let started = std::time::Instant::now();
    let kind = if settings.fifo { "FIFO" } else { "standard" };
    match sns.list().await {
        Ok(topics) => Ok(format!(
            "Amazon SNS at {} answers (ListTopics in {} ms: {} topic(s) visible); publishing to {kind} topics",
            sns.shown,
            started.elapsed().as_millis(),
            topics.len()
        )),
        Err(cause) => Err(SinkError {
            sink: SINK,
            cause: format!(
                "{}: {cause}; is [sns] endpoint_url / AWS_ENDPOINT_URL right, and may the credentials call \
                 sns:ListTopics (the relay finds topic ARNs with it)?",
                sns.shown
            ),
            transient: !cause.contains("AuthorizationError") && !cause.contains("AccessDenied"),
        }),
    }
}
