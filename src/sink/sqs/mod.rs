//! The Amazon SQS sink (`[sink] kind = "sqs"`): each event a message in the queue named by its
//! routed name, standard or FIFO (`[sqs] fifo`). docs/sink-sqs.md describes what a consumer
//! gets and the guarantees.
//!
//! * `client.rs` — the AWS SDK client (default credential chain, `AWS_REGION`,
//!   `AWS_ENDPOINT_URL`, `[sqs]` on top) and the cached queue URLs;
//! * [`SERVICE`] — what the message encoder shared with SNS (`sink/aws_message.rs`: body,
//!   attributes, FIFO group and deduplication id, everything SQS would refuse) needs of SQS;
//! * `exchange.rs` — what the shared driver (`sink/driver.rs`) runs: messages batched into
//!   `SendMessageBatch` calls, each entry's failure mapped (refused, or retried).
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
pub(crate) mod exchange;

use std::sync::Arc;
use std::time::Duration;

use crate::config::sink::SinkSectionSpec;
use crate::sink::driver::{self, Concurrency, DriverOptions};
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, ExactlyOnce, SinkError, SinkLimits, SinkWithCompletions};
use config::SqsSettings;

use crate::sink::aws_message::{Encoder, Service};
use client::Sqs;

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = "Amazon SQS";

/// What the shared message encoder (`sink/aws_message.rs`) needs to know of SQS.
pub(crate) const SERVICE: Service = Service {
    name: "SQS",
    section: "sqs",
    destination: "queue",
    verb: "sends to",
    attribute_limit: "SQS allows 10",
    max_name: 80,
    size_limit: "the queue's MaximumMessageSize",
};

/// How long `setup` and `status` wait for a connection.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a message may wait in the driver's queue before it is failed unsent instead
/// (exactly-once): well inside SQS's 5-minute deduplication window, so a frozen and thawed
/// holder's queue is never sent after the window closed on what a standby sent meanwhile.
const EXACTLY_ONCE_QUEUE_WAIT: Duration = Duration::from_secs(60);

/// The SQS sink's plugin (`src/sink/registry.rs`).
pub(crate) struct SqsPlugin;

impl SinkPlugin for SqsPlugin {
    type Config = SqsSettings;

    fn spec(&self) -> &'static dyn SinkSectionSpec {
        &config::SECTION
    }

    /// OpenTelemetry's messaging conventions name SQS `aws_sqs`.
    fn messaging_system(&self) -> &'static str {
        "aws_sqs"
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
                target: "aws_sdk_sqs",
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

    fn limits(&self, config: &SqsSettings) -> SinkLimits {
        limits(config)
    }

    /// FIFO queues deduplicate on `MessageDeduplicationId` within 5 minutes; standard queues
    /// are refused by the config already (`config::NO_EXACTLY_ONCE_STANDARD`).
    fn exactly_once(&self, config: &SqsSettings, _: &SinkContext) -> ExactlyOnce {
        if config.fifo {
            ExactlyOnce::BrokerDeduplicates
        } else {
            ExactlyOnce::Unsupported(config::NO_EXACTLY_ONCE_STANDARD)
        }
    }

    async fn prepare(&self, config: &SqsSettings) -> Result<Vec<String>, SinkError> {
        let line = probe(config).await?;
        Ok(vec![
            line,
            "SQS queues are not created by setup: create each routed queue (with fifo = true, FIFO queues whose \
             names end in .fifo) before events are routed to it; an event for a missing queue is a bad event \
             (relay.on_bad_event)"
                .to_owned(),
        ])
    }

    async fn probe(&self, config: &SqsSettings) -> Result<String, SinkError> {
        probe(config).await
    }

    async fn create<Tag: Send + Sync + 'static>(
        &self,
        config: &SqsSettings,
        cx: &SinkContext,
    ) -> Result<SinkWithCompletions<Tag>, SinkError> {
        let sqs = Sqs::connect(config, cx.connect_timeout).await?;
        let encoder = Encoder {
            service: &SERVICE,
            fifo: config.fifo,
            headers: config.headers,
            max_message_bytes: config.max_message_bytes,
        };
        let exchange = exchange::SqsExchange::start(sqs, encoder, config.max_requests);
        let options = DriverOptions {
            concurrency: Concurrency::PerKey {
                max_keys: config.max_concurrency,
            },
            max_in_flight: cx.max_in_flight.max(1),
            max_in_flight_bytes: cx.max_in_flight_bytes,
            // Each attempt is bounded ([sqs] timeout_ms) and the batch task retries for as
            // long as SQS fails: no overall timer, or an outage would end in a replay.
            reply_timeout: None,
            max_queue_wait: (cx.delivery == crate::config::relay::Delivery::ExactlyOnce)
                .then_some(EXACTLY_ONCE_QUEUE_WAIT),
            // Dropped without abandon: one attempt's time for what is on the wire.
            drop_wait: config.timeout,
        };
        Ok(boxed(driver::start(Arc::new(exchange), options)))
    }
}

/// The queue-name rule of the configured queue type, and `[sqs] max_message_bytes`.
pub(crate) fn limits(settings: &SqsSettings) -> SinkLimits {
    SinkLimits {
        check_name: if settings.fifo {
            |name| SERVICE.check_fifo_name(name)
        } else {
            |name| SERVICE.check_standard_name(name)
        },
        max_message_bytes: settings.max_message_bytes,
    }
}

/// `status`: credentials found, and SQS answers (`ListQueues`; a principal not allowed to list
/// is fine — sending needs only `sqs:GetQueueUrl` and `sqs:SendMessage`).
pub(crate) async fn probe(settings: &SqsSettings) -> Result<String, SinkError> {
    let sqs = Sqs::connect(settings, PROBE_CONNECT_TIMEOUT).await?;
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
            let cause = client::words(&e);
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
