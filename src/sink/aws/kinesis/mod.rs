//! The Amazon Kinesis Data Streams sink (`[sink] kind = "kinesis"`): each event a record in the
//! stream named by its routed name, its aggregate key the partition key. docs/sink-kinesis.md
//! describes what a consumer gets and the guarantees.
//!
//! * `config.rs` — `[kinesis]`: the keys every AWS section has (`aws/config.rs`), the request
//!   keys every request sink has (`sink/requests.rs`), and Kinesis's own (`format`, `streams`,
//!   `max_record_bytes`);
//! * `client.rs` — the AWS SDK client (`aws/client.rs`'s chain, `[kinesis]` on top), and the
//!   streams `setup` creates;
//! * `record.rs` — a record as a Kinesis record: partition key (hashed when Kinesis would not
//!   take the key), data (the JSON envelope or the payload alone), and what Kinesis would
//!   refuse, refused before sending;
//! * `exchange.rs` — the batcher's Kinesis part: records batched into `PutRecords` calls, each
//!   record's failure retried, a missing stream refused; the driver runs it as every AWS sink
//!   (`aws/exchange.rs`).
//!
//! Order per aggregate: all records of a partition key go to one shard, which keeps the order
//! they were stored in; the driver keeps at most one record per key on the wire, so a
//! `PutRecords` call never holds two records of a key and nothing of a key is stored after a
//! failed one (PutRecords does not keep order within a call, and a failed record does not stop
//! the next). Exactly-once is refused (`config::NO_EXACTLY_ONCE`): Kinesis does not
//! deduplicate.
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface, and never prints credentials (the SDK resolves
//! them; nothing of them is in `[kinesis]`).

pub(crate) mod client;
pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod exchange;
pub(crate) mod record;

use std::sync::Arc;

use crate::config::sink::SinkSectionSpec;
use crate::sink::aws::{self, PROBE_CONNECT_TIMEOUT};
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::driver;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{check_stream_name, KinesisSettings, NO_EXACTLY_ONCE};

use client::{Kinesis, Stream};
use record::Encoder;

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = "Amazon Kinesis";

/// The Kinesis sink's plugin (`src/sink/registry.rs`).
pub(crate) struct KinesisPlugin;

impl SinkPlugin for KinesisPlugin {
    type Config = KinesisSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    /// OpenTelemetry's messaging conventions have no Kinesis value: the `[sink] kind`.
    const MESSAGING_SYSTEM: &'static str = "kinesis";

    const LOG_TARGETS: &'static [ClientLogTarget] = &aws::log_targets(ClientLogTarget::debug("aws_sdk_kinesis"));

    fn limits(&self, config: &KinesisSettings) -> SinkLimits {
        SinkLimits {
            check_name: check_stream_name,
            max_message_bytes: encoder(config).max_message_bytes(),
        }
    }

    /// Refused at load already (`config.rs`); this is the same answer for callers that
    /// ask the plugin.
    fn exactly_once(&self, _: &KinesisSettings) -> ExactlyOnce {
        ExactlyOnce::Unsupported(NO_EXACTLY_ONCE.into())
    }

    async fn prepare(&self, config: &KinesisSettings) -> Result<Vec<String>, SinkError> {
        let kinesis = Kinesis::connect(config, PROBE_CONNECT_TIMEOUT).await?;
        if config.streams.is_empty() {
            return Ok(vec![
                probe_with(&kinesis, config).await?,
                "Kinesis streams are not created by setup unless listed in [kinesis] streams: every routed stream \
                 must exist (an event routed to a missing stream is a bad event, relay.on_bad_event)"
                    .to_owned(),
            ]);
        }
        let mut done = Vec::new();
        for stream in &config.streams {
            done.push(kinesis.ensure(stream).await?);
        }
        Ok(done)
    }

    async fn probe(&self, config: &KinesisSettings) -> Result<String, SinkError> {
        let kinesis = Kinesis::connect(config, PROBE_CONNECT_TIMEOUT).await?;
        probe_with(&kinesis, config).await
    }

    async fn create<Tag: SinkTag>(&self, config: &KinesisSettings, cx: &SinkContext) -> Created<Tag> {
        let kinesis = Kinesis::connect(config, cx.connect_timeout).await?;
        let exchange = exchange::start(kinesis, encoder(config), config.requests.max_requests);
        // One record per partition key on the wire (module docs; docs/sink-kinesis.md measures
        // it against sending a key's records together).
        Ok(boxed(driver::start(Arc::new(exchange), config.requests.per_key(cx))))
    }
}

fn encoder(config: &KinesisSettings) -> Encoder {
    Encoder {
        format: config.format,
        max_record_bytes: config.max_record_bytes,
    }
}

/// `status`: credentials found, Kinesis answers, and the `[kinesis] streams` exist
/// (`ListShards`); else `ListStreams` (a principal not allowed to list is fine — sending needs
/// only `kinesis:PutRecords`).
async fn probe_with(kinesis: &Kinesis, config: &KinesisSettings) -> Result<String, SinkError> {
    let started = std::time::Instant::now();
    if !config.streams.is_empty() {
        let mut states = Vec::new();
        let mut missing = Vec::new();
        for name in &config.streams {
            match kinesis.describe(name).await? {
                Stream::Active { shards } => states.push(format!("{name} ACTIVE ({shards} open shards)")),
                Stream::Busy(why) => states.push(format!("{name} not ACTIVE yet ({why})")),
                Stream::Missing => missing.push(name.as_str()),
            }
        }
        if !missing.is_empty() {
            return Err(SinkError {
                sink: SINK,
                cause: format!(
                    "Kinesis at {} answers, but stream(s) {} do not exist; run `outbox-relay setup` (it creates \
                     [kinesis] streams) or create them",
                    kinesis.shown,
                    missing.join(", ")
                ),
                transient: false,
            });
        }
        return Ok(format!(
            "Amazon Kinesis at {} answers ({} ms): {}",
            kinesis.shown,
            started.elapsed().as_millis(),
            states.join(", ")
        ));
    }
    match kinesis.client.list_streams().limit(100).send().await {
        Ok(out) => Ok(format!(
            "Amazon Kinesis at {} answers (ListStreams in {} ms: {} stream(s) visible)",
            kinesis.shown,
            started.elapsed().as_millis(),
            out.stream_names().len()
        )),
        // moto answers ListStreams with timestamps the SDK cannot read: an answer all the same.
        Err(aws_sdk_kinesis::error::SdkError::ResponseError(_)) => Ok(format!(
            "Amazon Kinesis at {} answers (ListStreams in {} ms)",
            kinesis.shown,
            started.elapsed().as_millis()
        )),
        Err(e) => {
            let cause = aws::client::words(&e);
            if cause.contains("AccessDenied") {
                Ok(format!(
                    "Amazon Kinesis at {} answers (credentials found; ListStreams not permitted, which sending does \
                     not need)",
                    kinesis.shown
                ))
            } else {
                Err(SinkError {
                    sink: SINK,
                    cause: format!(
                        "{}: {cause}; is [kinesis] endpoint_url / AWS_ENDPOINT_URL right?",
                        kinesis.shown
                    ),
                    transient: true,
                })
            }
        }
    }
}
