//! The Amazon SQS sink (`[sink] kind = "sqs"`): each event a message in the queue named by its
//! routed name, standard or FIFO (`[sqs] fifo`). docs/sink-sqs.md describes what a consumer
//! gets and the guarantees.
//!
//! * `config.rs` — `[sqs]`: SQS's names, limits and defaults in the section every message
//!   service has (`aws/config.rs`);
//! * `client.rs` — the AWS SDK client (`aws/client.rs`'s chain, `[sqs]` on top) and the cached
//!   queue URLs;
//! * [`SERVICE`] — what the message encoder shared with SNS (`aws/message.rs`: body,
//!   attributes, FIFO group and deduplication id, everything SQS would refuse) needs of SQS;
//! * `exchange.rs` — the batcher's SQS part (`SendMessageBatch` calls, each entry's failure
//!   mapped: refused, or retried); the driver runs it as every AWS sink (`aws/exchange.rs`).
//!
//! Order per aggregate comes from the driver (one message per key on the wire, up to
//! `max_concurrency` keys at once) and, on the consumer's side, from FIFO queues (the key is the
//! message group). Exactly-once is SQS's FIFO deduplication: the relay's source position is the
//! `MessageDeduplicationId`, so a replay within SQS's 5-minute window is dropped by SQS.
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface, and never prints credentials (the SDK resolves
//! them; nothing of them is in `[sqs]`).

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

use client::SqsClient;
use config::SqsSettings;

/// What the shared message encoder and section (`aws/message.rs`, `aws/config.rs`) need to
/// know of SQS.
pub(crate) const SERVICE: Service = Service {
    name: "SQS",
    sink: "Amazon SQS",
    section: "sqs",
    destination: "queue",
    verb: "sends to",
    readers: "consumers",
    attribute_limit: "SQS allows 10",
    max_name: 80,
    size_limit: "the queue's MaximumMessageSize",
};

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = SERVICE.sink;

/// The SQS sink's plugin (`src/sink/registry.rs`).
pub(crate) struct SqsPlugin;

impl SinkPlugin for SqsPlugin {
    type Config = SqsSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    /// OpenTelemetry's messaging conventions name SQS `aws_sqs`.
    const MESSAGING_SYSTEM: &'static str = "aws_sqs";

    const LOG_TARGETS: &'static [ClientLogTarget] = &aws::log_targets(ClientLogTarget::debug("aws_sdk_sqs"));

    fn limits(&self, config: &SqsSettings) -> SinkLimits {
        aws::message_limits(config)
    }

    fn exactly_once(&self, config: &SqsSettings) -> ExactlyOnce {
        aws::message_exactly_once(config)
    }

    async fn prepare(&self, config: &SqsSettings) -> Result<Vec<String>, SinkError> {
        let line = self.probe(config).await?;
        Ok(vec![
            line,
            "SQS queues are not created by setup: create each routed queue (with fifo = true, FIFO queues whose \
             names end in .fifo) before events are routed to it; an event for a missing queue is a bad event \
             (relay.on_bad_event)"
                .to_owned(),
        ])
    }

    /// `status`: credentials found, and SQS answers (`ListQueues`; a principal not allowed to list
    /// is fine — sending needs only `sqs:GetQueueUrl` and `sqs:SendMessage`).
    async fn probe(&self, settings: &SqsSettings) -> Result<String, SinkError> {
        let sqs = SqsClient::connect(settings, PROBE_CONNECT_TIMEOUT).await?;
        let started = std::time::Instant::now();
        let kind = if settings.fifo { "FIFO" } else { "standard" };
        match sqs.client.list_queues().max_results(1000).send().await {
            Ok(out) => Ok(format!(
                "Amazon SQS at {} answers (ListQueues in {} ms: {} queue(s) visible); sending to {kind} queues",
                sqs.shown,
                started.elapsed().as_millis(),
                out.queue_urls().len()
            )),
            Err(e) => {
                let cause = aws::client::words(&e);
                if cause.contains("AccessDenied") {
                    Ok(format!(
                        "Amazon SQS at {} answers (credentials found; ListQueues not permitted, which sending does not \
                         need); sending to {kind} queues",
                        sqs.shown
                    ))
                } else {
                    Err(SinkError {
                        sink: SINK,
                        cause: format!(
                            "{}: {cause}; is [sqs] endpoint_url / AWS_ENDPOINT_URL right?",
                            sqs.shown
                        ),
                        transient: true,
                    })
                }
            }
        }
    }

    async fn create<Tag: SinkTag>(&self, config: &SqsSettings, cx: &SinkContext) -> Created<Tag> {
        let sqs = SqsClient::connect(config, cx.connect_timeout).await?;
        Ok(aws::start_messages(
            exchange::SqsBatches { sqs },
            config,
            cx,
            "SendMessageBatch answer",
        ))
    }
}
