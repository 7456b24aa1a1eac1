//! The AWS sinks — Amazon SQS (`sqs/`), SNS (`sns/`) and Kinesis Data Streams (`kinesis/`) —
//! and what they share, so that each folder keeps only what differs:
//!
//! * `client.rs` — the SDK client setup (the default chain: credentials, `AWS_REGION`,
//!   `AWS_ENDPOINT_URL`, profiles; the section's `region` / `endpoint_url` on top; rustls with
//!   ring), one line for an SDK error, and the cache of resolved names;
//! * `config.rs` — the section keys they share (`region`, `endpoint_url`), and the whole section
//!   of the two message services (`[sqs]` and `[sns]` have the same keys);
//! * `message.rs` — a record as an SQS or SNS message (SNS delivers to SQS subscribers what SQS
//!   takes, so one model), everything the service would refuse refused before sending;
//! * `exchange.rs` — what the shared driver runs: entries through the shared batcher
//!   (`sink/batch.rs`), one entry per key on the wire;
//! * here — the plugin's halves the three sinks share: their SDK's log targets, and the limits,
//!   exactly-once answer and driver of the two message services.
//!
//! The `[sink] kind` words (`"sqs"`, `"sns"`, `"kinesis"`) and sections are each sink's own;
//! nothing here names one of them.
//!
//! Invariant: like every adapter, these know nothing of PostgreSQL or the watermark, and never
//! print credentials (the SDK resolves them; nothing of them is in a section).

pub(crate) mod client;
pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod exchange;
pub(crate) mod kinesis;
pub(crate) mod message;
pub(crate) mod sns;
pub(crate) mod sqs;

use std::sync::Arc;
use std::time::Duration;

use crate::sink::batch::{BatchLimits, BatchSend};
use crate::sink::driver::{self, DriverOptions};
use crate::sink::plugin::{ClientLogTarget, SinkContext};
use crate::sink::{boxed, ExactlyOnce, SinkLimits, SinkWithCompletions};
use config::{MessageService, MessagesSettings};
use exchange::Batched;
use message::{Encoder, Message};

/// How long `setup` and `status` wait for a connection.
pub(crate) const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The log targets of an AWS sink, its service's SDK crate (`sdk`) among them: the SDK's own
/// lines (retries, credential lookups, connection churn) are DEBUG, the sink reports failures
/// itself.
pub(crate) const fn log_targets(sdk: ClientLogTarget) -> [ClientLogTarget; 4] {
    [
        ClientLogTarget::debug("aws_config"),
        sdk,
        ClientLogTarget::debug("aws_smithy_runtime"),
        ClientLogTarget::debug("aws_smithy_http_client"),
    ]
}

/// SQS's and SNS's limit of entries per batch call.
pub(crate) const MAX_MESSAGE_BATCH: usize = 10;

/// How long a message with a deduplication id may wait in the driver's queue before it is
/// failed unsent instead: well inside the services' 5-minute deduplication window, so a frozen
/// and thawed holder's queue is never sent after the window closed on what a standby sent
/// meanwhile.
const DEDUP_QUEUE_WAIT: Duration = Duration::from_secs(60);

/// A message service's routed-name rule (standard or FIFO names, as configured) and its
/// `max_message_bytes`.
pub(crate) fn message_limits<S: MessageService>(settings: &MessagesSettings<S>) -> SinkLimits {
    SinkLimits {
        check_name: if settings.fifo {
            |name| S::SERVICE.check_fifo_name(name)
        } else {
            |name| S::SERVICE.check_standard_name(name)
        },
        max_message_bytes: settings.max_message_bytes,
    }
}

/// FIFO queues and topics deduplicate on `MessageDeduplicationId` within 5 minutes; standard
/// ones are refused by the config already (the service's `no_exactly_once`).
pub(crate) fn message_exactly_once<S: MessageService>(settings: &MessagesSettings<S>) -> ExactlyOnce {
    if settings.fifo {
        ExactlyOnce::BrokerDeduplicates
    } else {
        ExactlyOnce::Unsupported(S::KEYS.no_exactly_once.into())
    }
}

/// A message service's sink on the shared driver: `batches` (the service's batch call) fed by
/// the shared encoder, one message per key on the wire, up to `max_concurrency` keys at once.
pub(crate) fn start_messages<S, B, Tag>(
    batches: B,
    settings: &MessagesSettings<S>,
    cx: &SinkContext,
    reply_name: &'static str,
) -> SinkWithCompletions<Tag>
where
    S: MessageService,
    B: BatchSend<Entry = Message>,
    Tag: Send + Sync + 'static,
{
    let encoder = Encoder {
        service: S::SERVICE,
        fifo: settings.fifo,
        headers: settings.headers,
        max_message_bytes: settings.max_message_bytes,
    };
    // A batch's limit equals a message's for both services.
    let limits = BatchLimits {
        max_entries: MAX_MESSAGE_BATCH,
        max_bytes: settings.max_message_bytes,
        max_calls: settings.requests.max_requests,
    };
    let exchange = Batched::start(batches, encoder, limits, reply_name);
    let options = DriverOptions {
        dedup_queue_wait: Some(DEDUP_QUEUE_WAIT),
        ..settings.requests.per_key(cx)
    };
    boxed(driver::start(Arc::new(exchange), options))
}
