//! The Amazon SNS sink (`[sink] kind = "sns"`): each event a message published to the topic
//! named by its routed name, standard or FIFO (`[sns] fifo`). docs/sink-sns.md describes what a
//! subscriber gets and the guarantees.
//!
//! * `config.rs` — `[sns]`: SNS's names, limits and defaults in the section every message
//!   service has (`aws/config.rs`);
//! * `client.rs` — the AWS SDK client (`aws/client.rs`'s chain, `[sns]` on top) and the topic
//!   ARNs, looked up by name (`ListTopics`, never created) and cached;
//! * [`SERVICE`] — what the message encoder shared with SQS (`aws/message.rs`: body,
//!   attributes, FIFO group and deduplication id, everything SNS would refuse) needs of SNS;
//! * `exchange.rs` — the batcher's SNS part (`PublishBatch` calls, each entry's failure refused
//!   or retried); the driver runs it as every AWS sink (`aws/exchange.rs`).
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
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod exchange;

use crate::config::sink::SinkSectionSpec;
use crate::sink::aws::message::Service;
use crate::sink::aws::{self, PROBE_CONNECT_TIMEOUT};
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};

use client::SnsClient;
use config::SnsSettings;

/// What the shared message encoder and section (`aws/message.rs`, `aws/config.rs`) need to
/// know of SNS.
pub(crate) const SERVICE: Service = Service {
    name: "SNS",
    sink: "Amazon SNS",
    section: "sns",
    destination: "topic",
    verb: "publishes to",
    readers: "subscribers",
    attribute_limit: "SNS delivers at most 10 to SQS subscribers",
    max_name: 256,
    size_limit: "SNS's limit of 262144 bytes",
};

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = SERVICE.sink;

/// The SNS sink's plugin (`src/sink/registry.rs`).
pub(crate) struct SnsPlugin;

impl SinkPlugin for SnsPlugin {
    type Config = SnsSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    /// Named like OpenTelemetry's `aws_sqs`.
    const MESSAGING_SYSTEM: &'static str = "aws_sns";

    const LOG_TARGETS: &'static [ClientLogTarget] = &aws::log_targets(ClientLogTarget::debug("aws_sdk_sns"));

    fn limits(&self, config: &SnsSettings) -> SinkLimits {
        aws::message_limits(config)
    }

    fn exactly_once(&self, config: &SnsSettings) -> ExactlyOnce {
        aws::message_exactly_once(config)
    }

    async fn prepare(&self, config: &SnsSettings) -> Result<Vec<String>, SinkError> {
        let line = self.probe(config).await?;
        Ok(vec![
            line,
            "SNS topics are not created by setup: create each routed topic (with fifo = true, FIFO topics whose \
             names end in .fifo) and its subscriptions before events are routed to it; an event for a missing topic \
             is a bad event (relay.on_bad_event)"
                .to_owned(),
        ])
    }

    /// `status`: credentials found, and SNS lists the topics the relay publishes to (`ListTopics`,
    /// the call the sink resolves topic ARNs with: the relay needs `sns:ListTopics` and
    /// `sns:Publish`).
    async fn probe(&self, settings: &SnsSettings) -> Result<String, SinkError> {
        let sns = SnsClient::connect(settings, PROBE_CONNECT_TIMEOUT).await?;
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

    async fn create<Tag: SinkTag>(&self, config: &SnsSettings, cx: &SinkContext) -> Created<Tag> {
        let sns = SnsClient::connect(config, cx.connect_timeout).await?;
        Ok(aws::start_messages(
            exchange::SnsBatches { sns },
            config,
            cx,
            "PublishBatch answer",
        ))
    }
}
