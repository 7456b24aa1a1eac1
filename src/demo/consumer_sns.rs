//! The demo's Amazon SNS consumer, on a running moto server (`--sink-url`): the run's FIFO topic
//! and a FIFO queue of the same name subscribed to it with raw message delivery (the queue's
//! messages are the published ones, attributes included), both made before the relay starts (the
//! relay publishes to existing topics only); the queue is read and counted as the SQS demo reads
//! its own ([`SqsConsumer`]). At the end it deletes the topic and the queue (best effort).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use aws_sdk_sns::error::DisplayErrorContext;

use super::consumer::bounded;
use super::consumer_sqs::{moto_config, SqsConsumer};
use super::stats::Stats;
use super::DemoError;

const BROKER: &str = "moto (Amazon SNS)";

pub(crate) struct SnsConsumer {
    client: aws_sdk_sns::Client,
    topic: String,
    arn: String,
    queue: SqsConsumer,
}

impl SnsConsumer {
    /// Makes the FIFO topic `topic` at the moto `endpoint`, and its subscribed queue.
    pub(crate) async fn new(endpoint: &str, topic: &str, run_id: &str) -> Result<SnsConsumer, DemoError> {
        let client = aws_sdk_sns::Client::new(&moto_config(endpoint));
        let created = bounded(BROKER, "creating the topic", async {
            client
                .create_topic()
                .name(topic)
                .attributes("FifoTopic", "true")
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await?;
        let arn = created
            .topic_arn()
            .ok_or_else(|| DemoError::Sink(format!("{BROKER}: CreateTopic {topic} returned no topic ARN")))?
            .to_owned();
        let consumer = SnsConsumer {
            client,
            topic: topic.to_owned(),
            arn,
            queue: SqsConsumer::new(endpoint, topic, run_id).await?,
        };
        let queue_arn = consumer.queue.arn().await?;
        bounded(BROKER, "subscribing the queue to the topic", async {
            consumer
                .client
                .subscribe()
                .topic_arn(&consumer.arn)
                .protocol("sqs")
                .endpoint(queue_arn)
                .attributes("RawMessageDelivery", "true")
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await?;
        Ok(consumer)
    }

    /// Reads the queue until `stop`, then deletes the topic and the queue; returns what it
    /// cleaned up.
    pub(crate) async fn run(self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut lines = self.queue.run(stats, stop).await;
        let deleted = bounded(BROKER, "deleting the topic", async {
            self.client
                .delete_topic()
                .topic_arn(&self.arn)
                .send()
                .await
                .map_err(|e| DisplayErrorContext(e).to_string())
        })
        .await;
        lines.insert(
            0,
            match deleted {
                Ok(_) => format!("SNS topic {} deleted", self.topic),
                Err(e) => format!("FAILED: {e}"),
            },
        );
        lines
    }
}
