//! The demo's Amazon SQS consumer, on a running moto server (`--sink-url`): the run's FIFO queue,
//! made before the relay starts (the relay sends to existing queues only; `setup` creates none),
//! read with long polls of 10 messages, each batch deleted once counted; counts by the `id`
//! message attribute. The demo speaks to a local server only, with test credentials (moto
//! accepts any). SQS reports no count of what a queue received once it was deleted, so
//! `published` is what was read (and the relay's acknowledgements). At the end it deletes the
//! queue (best effort).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, QueueAttributeName};

use super::consumer::{bounded, parse_id, record_event};
use super::stats::Stats;
use super::DemoError;

const BROKER: &str = "moto (Amazon SQS)";
/// The region of the demo's client and relay (moto accepts any).
pub(crate) const REGION: &str = "us-east-1";
/// The credentials of the demo's client and relay: never real ones (moto accepts any).
pub(crate) const TEST_KEY: &str = "testing";

pub(crate) struct SqsConsumer {
    client: aws_sdk_sqs::Client,
    queue: String,
    url: String,
    run_id: String,
}

impl SqsConsumer {
    /// Makes the FIFO queue `queue` at the moto `endpoint`.
    pub(crate) async fn new(endpoint: &str, queue: &str, run_id: &str) -> Result<SqsConsumer, DemoError> {
        let client = aws_sdk_sqs::Client::new(&moto_config(endpoint));
        let created = bounded(BROKER, "creating the queue", async {
            client
                .create_queue()
                .queue_name(queue)
                .attributes(QueueAttributeName::FifoQueue, "true")
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await?;
        let url = created
            .queue_url()
            .ok_or_else(|| DemoError::Sink(format!("{BROKER}: CreateQueue {queue} returned no queue URL")))?
            .to_owned();
        Ok(SqsConsumer {
            client,
            queue: queue.to_owned(),
            url,
            run_id: run_id.to_owned(),
        })
    }

    /// The queue's ARN (what an SNS subscription names).
    pub(crate) async fn arn(&self) -> Result<String, DemoError> {
        let got = bounded(BROKER, "reading the queue's ARN", async {
            self.client
                .get_queue_attributes()
                .queue_url(&self.url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await?;
        got.attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| DemoError::Sink(format!("{BROKER}: queue {} has no QueueArn attribute", self.queue)))
    }

    /// Reads until `stop`, then deletes the queue; returns what it cleaned up.
    pub(crate) async fn run(self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut reported = false;
        while !stop.load(Ordering::Relaxed) {
            match self.receive(&stats).await {
                Ok(()) => reported = false,
                Err(e) => {
                    if !reported {
                        eprintln!("demo: SQS consumer: {e}; reading on");
                        reported = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let deleted = bounded(BROKER, "deleting the queue", async {
            self.client
                .delete_queue()
                .queue_url(&self.url)
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await;
        vec![match deleted {
            Ok(_) => format!("SQS queue {} deleted", self.queue),
            Err(e) => format!("FAILED: {e}"),
        }]
    }

    /// One long poll (up to 1 s, 10 messages), its messages counted and deleted.
    async fn receive(&self, stats: &Stats) -> Result<(), String> {
        let got = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(60)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| format!("ReceiveMessage: {}", DisplayErrorContext(e)))?;
        let messages = got.messages();
        if messages.is_empty() {
            return Ok(());
        }
        let mut delete = self.client.delete_message_batch().queue_url(&self.url);
        for (i, m) in messages.iter().enumerate() {
            let id = m
                .message_attributes()
                .and_then(|a| a.get("id"))
                .and_then(|v| v.string_value())
                .and_then(|v| parse_id(v.as_bytes()));
            record_event(stats, &self.run_id, id, m.body().map(str::as_bytes));
            if let Some(handle) = m.receipt_handle() {
                let entry = DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(handle)
                    .build()
                    .map_err(|e| format!("DeleteMessageBatch entry: {e}"))?;
                delete = delete.entries(entry);
            }
        }
        // Undeleted, a message comes again after its visibility timeout: counted once regardless.
        delete
            .send()
            .await
            .map_err(|e| format!("DeleteMessageBatch: {}", DisplayErrorContext(e)))?;
        Ok(())
    }
}

/// The AWS SDK configuration of the moto at `endpoint` (its SQS, SNS and Kinesis clients alike):
/// the test credentials, rustls with ring like the relay.
pub(crate) fn moto_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
            aws_credential_types::Credentials::new(TEST_KEY, TEST_KEY, None, None, "demo"),
        ))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build()
}
