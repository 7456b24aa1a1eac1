//! Amazon SNS's half of `outbox-relay demo`, on a running moto server (`--sink-url`,
//! `aws/demo.rs`): the relay publishes to a FIFO topic of the run's own; the consumer makes it,
//! and a FIFO queue of the same name subscribed to it with raw message delivery (the queue's
//! messages are the published ones, attributes included), both made before the relay starts (the
//! relay publishes to existing topics only); the queue is read and counted as the SQS demo reads
//! its own ([`SqsConsumer`]). At the end it deletes the topic and the queue (best effort).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::sink::SinkSettings;
use crate::sink::aws::demo::{moto_config, moto_demo, sdk_call, MotoRun};
use crate::sink::aws::sqs::demo::SqsConsumer;
use crate::sink::demo::{cleaned_up, start, DemoConfig, DemoConsumer, DemoRun, DemoTarget, SinkDemo, Starting, Tally};

const BROKER: &str = "moto (Amazon SNS)";

pub(crate) struct SnsConsumer {
    client: aws_sdk_sns::Client,
    topic: String,
    arn: String,
    queue: SqsConsumer,
}

impl SnsConsumer {
    /// Makes the FIFO topic `topic` at the moto `endpoint`, and its subscribed queue.
    pub(crate) async fn new(endpoint: &str, topic: &str) -> Result<SnsConsumer, String> {
        let client = aws_sdk_sns::Client::new(&moto_config(endpoint));
        let created = sdk_call(
            BROKER,
            "creating the topic",
            client.create_topic().name(topic).attributes("FifoTopic", "true").send(),
        )
        .await?;
        let arn = created
            .topic_arn()
            .ok_or_else(|| format!("{BROKER}: CreateTopic {topic} returned no topic ARN"))?
            .to_owned();
        let consumer = SnsConsumer {
            client,
            topic: topic.to_owned(),
            arn,
            queue: SqsConsumer::new(endpoint, topic).await?,
        };
        let queue_arn = consumer.queue.arn().await?;
        sdk_call(
            BROKER,
            "subscribing the queue to the topic",
            consumer
                .client
                .subscribe()
                .topic_arn(&consumer.arn)
                .protocol("sqs")
                .endpoint(queue_arn)
                .attributes("RawMessageDelivery", "true")
                .send(),
        )
        .await?;
        Ok(consumer)
    }
}

impl DemoConsumer for SnsConsumer {
    /// Reads the queue until `stop`, then deletes the topic and the queue; returns what it
    /// cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut lines = self.queue.run(tally, stop).await;
        let deleted = sdk_call(
            BROKER,
            "deleting the topic",
            self.client.delete_topic().topic_arn(&self.arn).send(),
        )
        .await;
        lines.insert(0, cleaned_up(deleted, format!("SNS topic {} deleted", self.topic)));
        lines
    }
}

/// Amazon SNS's answers to the demo.
pub(crate) const DEMO: SinkDemo = moto_demo(
    "moto server (Amazon SNS)",
    "Amazon SNS (a FIFO topic, read through a subscribed FIFO queue), on a running moto server",
    open,
);

fn open(endpoint: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(SnsTarget(MotoRun::of(endpoint, run))))
}

/// moto and the run's topic names.
struct SnsTarget(MotoRun);

impl DemoTarget for SnsTarget {
    /// A FIFO topic per run, named as the SQS demo's queue (made by the consumer with its
    /// subscribed queue: `setup` creates no topics).
    fn config(&self) -> DemoConfig {
        self.0.fifo_config()
    }

    fn describe(&self, _: &SinkSettings) -> String {
        format!(
            "moto (Amazon SNS) at {} (a FIFO topic, read through a subscribed FIFO queue)",
            self.0.endpoint
        )
    }

    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(SnsConsumer::new(&self.0.endpoint, topic), tally, stop)
    }
}
