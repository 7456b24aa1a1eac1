//! The Kinesis client: the AWS SDK's configuration chain (credentials, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, profiles) with `[kinesis] region` / `endpoint_url` on top
//! (`sink/aws.rs`), and what `setup` and `status` ask of the streams.
//!
//! Invariant: credentials are resolved (never printed) before the sink is handed out, so a
//! machine without any fails at start with the fix, not on the first event. Requests name the
//! stream (`StreamName`): nothing is cached about a stream, which may be created any time.

use std::time::{Duration, Instant};

use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::operation::describe_stream_summary::DescribeStreamSummaryError;
use aws_sdk_kinesis::types::{StreamMode, StreamModeDetails, StreamStatus};

use super::SINK;
use crate::config::kinesis::KinesisSettings;
use crate::sink::aws;
pub(crate) use crate::sink::aws::words;
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

/// What `DescribeStreamSummary` said of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stream {
    /// Its status (`ACTIVE`, `CREATING`, `UPDATING`, `DELETING`) and open shards.
    Found { status: String, shards: i32 },
    Missing,
}

impl Kinesis {
    /// The SDK configuration chain with `[kinesis]` on top (`sink/aws.rs`); `connect_timeout`
    /// bounds a connection. Fails (for good) when no region is configured anywhere or no
    /// credentials are found.
    pub(crate) async fn connect(settings: &KinesisSettings, connect_timeout: Duration) -> Result<Kinesis, SinkError> {
        let aws::Connected { config, shown } = aws::connect(aws::Endpoint {
            sink: SINK,
            section: "kinesis",
            region: settings.region.as_deref(),
            endpoint_url: settings.endpoint_url.as_deref(),
            attempt_timeout: settings.timeout,
            connect_timeout,
        })
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

    /// `DescribeStreamSummary` of `name`.
    pub(crate) async fn describe(&self, name: &str) -> Result<Stream, SinkError> {
        match self.client.describe_stream_summary().stream_name(name).send().await {
            Ok(out) => {
                let summary = out.stream_description_summary();
                Ok(Stream::Found {
                    status: summary
                        .map(|s| s.stream_status().as_str().to_owned())
                        .unwrap_or_default(),
                    shards: summary.map_or(0, |s| s.open_shard_count()),
                })
            }
            Err(SdkError::ServiceError(s)) if matches!(s.err(), DescribeStreamSummaryError::ResourceNotFoundException(_)) => {
                Ok(Stream::Missing)
            }
            Err(e) => Err(self.failed(format!("DescribeStreamSummary of {name:?} failed: {}", words(&e)))),
        }
    }

    /// Creates `name` in on-demand mode unless it exists, and waits (bounded) until it is
    /// ACTIVE: what `setup` says about it.
    pub(crate) async fn ensure(&self, name: &str) -> Result<String, SinkError> {
        let created = match self.describe(name).await? {
            Stream::Found { .. } => false,
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
            match self.describe(name).await? {
                Stream::Found { status, shards } if status == StreamStatus::Active.as_str() => {
                    let done = if created { "created (on-demand)" } else { "exists" };
                    return Ok(format!(
                        "Kinesis stream {name} {done}: ACTIVE, {shards} open shard(s)"
                    ));
                }
                Stream::Found { status, .. } if Instant::now() < deadline => {
                    tracing::debug!(stream = name, %status, "Kinesis: waiting for the stream to become ACTIVE");
                }
                Stream::Found { status, .. } => {
                    return Err(self.failed(format!(
                        "stream {name:?} is still {status} after {} s",
                        ACTIVE_WAIT.as_secs()
                    )))
                }
                Stream::Missing if Instant::now() < deadline => {}
                Stream::Missing => {
                    return Err(self.failed(format!("stream {name:?} was created but cannot be found")))
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
