//! The Kinesis client: the AWS SDK's configuration chain (credentials, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, profiles) with `[kinesis] region` / `endpoint_url` on top
//! (`aws/client.rs`), and what `setup` and `status` ask of the streams.
//!
//! Invariant: credentials are resolved (never printed) before the sink is handed out, so a
//! machine without any fails at start with the fix, not on the first event. Requests name the
//! stream (`StreamName`): nothing is cached about a stream, which may be created any time.

use std::time::{Duration, Instant};

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::list_shards::ListShardsError;
use aws_sdk_kinesis::types::{StreamMode, StreamModeDetails};

use super::config::KinesisSettings;
use super::SINK;
use crate::sink::aws::client::{self, words};
use crate::sink::SinkError;

/// How long `setup` waits for a stream it created to become ACTIVE.
const ACTIVE_WAIT: Duration = Duration::from_secs(120);

/// A Kinesis client.
#[derive(Clone)]
pub(crate) struct Kinesis {
    pub(crate) client: aws_sdk_kinesis::Client,
    /// Where the client sends requests, for messages (`region`, or the endpoint).
    pub(crate) shown: String,
}

/// What `ListShards` said of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stream {
    /// It takes records: its open shards.
    Active {
        shards: usize,
    },
    /// It exists but is not ACTIVE yet (`ResourceInUseException`: CREATING, or DELETING).
    Busy(String),
    Missing,
}

impl Kinesis {
    /// The SDK configuration chain with `[kinesis]` on top (`aws/client.rs`); `connect_timeout`
    /// bounds a connection. Fails (for good) when no region is configured anywhere or no
    /// credentials are found.
    pub(crate) async fn connect(settings: &KinesisSettings, connect_timeout: Duration) -> Result<Kinesis, SinkError> {
        let client::Connected { config, shown } = client::connect(
            SINK,
            "kinesis",
            &settings.endpoint,
            settings.requests.timeout,
            connect_timeout,
        )
        .await?;
        Ok(Kinesis {
            client: aws_sdk_kinesis::Client::new(&config),
            shown,
        })
    }

    fn failed(&self, what: String) -> SinkError {
        SinkError {
            sink: SINK,
            cause: format!(
                "{what} at {}; is [kinesis] endpoint_url / AWS_ENDPOINT_URL right, and may the relay's credentials \
                 use Kinesis?",
                self.shown
            ),
            transient: true,
        }
    }

    /// `ListShards` of `name` (not `DescribeStreamSummary`: moto answers that one with a
    /// timestamp the SDK cannot read; `ListShards` needs `kinesis:ListShards`).
    pub(crate) async fn describe(&self, name: &str) -> Result<Stream, SinkError> {
        let mut shards = 0;
        let mut token: Option<String> = None;
        loop {
            let request = match &token {
                Some(t) => self.client.list_shards().next_token(t),
                None => self.client.list_shards().stream_name(name),
            };
            match request.send().await {
                Ok(out) => {
                    shards += out
                        .shards()
                        .iter()
                        .filter(|s| {
                            s.sequence_number_range()
                                .is_some_and(|r| r.ending_sequence_number().is_none())
                        })
                        .count();
                    match out.next_token() {
                        Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                        _ => return Ok(Stream::Active { shards }),
                    }
                }
                Err(SdkError::ServiceError(s)) if matches!(s.err(), ListShardsError::ResourceNotFoundException(_)) => {
                    return Ok(Stream::Missing)
                }
                Err(SdkError::ServiceError(s)) if matches!(s.err(), ListShardsError::ResourceInUseException(_)) => {
                    return Ok(Stream::Busy(s.err().message().unwrap_or("not ACTIVE").to_owned()))
                }
                Err(e) => return Err(self.failed(format!("ListShards of {name:?} failed: {}", words(&e)))),
            }
        }
    }

    /// Creates `name` in on-demand mode unless it exists, and waits (bounded) until it is
    /// ACTIVE: what `setup` says about it.
    pub(crate) async fn ensure(&self, name: &str) -> Result<String, SinkError> {
        let created = match self.describe(name).await? {
            Stream::Active { .. } | Stream::Busy(_) => false,
            Stream::Missing => {
                let mode = StreamModeDetails::builder()
                    .stream_mode(StreamMode::OnDemand)
                    .build()
                    .expect("the mode is set");
                match self
                    .client
                    .create_stream()
                    .stream_name(name)
                    .stream_mode_details(mode)
                    .send()
                    .await
                {
                    Ok(_) => true,
                    // Created by another `setup` meanwhile.
                    Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => false,
                    Err(e) => return Err(self.failed(format!("CreateStream {name:?} failed: {}", words(&e)))),
                }
            }
        };
        let deadline = Instant::now() + ACTIVE_WAIT;
        loop {
            let waiting = match self.describe(name).await? {
                Stream::Active { shards } => {
                    let done = if created { "created (on-demand)" } else { "exists" };
                    return Ok(format!("Kinesis stream {name} {done}: ACTIVE, {shards} open shard(s)"));
                }
                Stream::Busy(why) => why,
                Stream::Missing => "not visible yet".to_owned(),
            };
            if Instant::now() >= deadline {
                return Err(self.failed(format!(
                    "stream {name:?} is not ACTIVE after {} s ({waiting})",
                    ACTIVE_WAIT.as_secs()
                )));
            }
            tracing::debug!(stream = name, %waiting, "Kinesis: waiting for the stream to become ACTIVE");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
