//! Amazon SQS's half of `outbox-relay demo`, on a running moto server (`--sink-url`,
//! `aws/demo.rs`): the relay sends to a FIFO queue of the run's own, which the consumer makes
//! before the relay starts (the relay sends to existing queues only; `setup` creates none),
//! read with long polls of 10 messages, each batch deleted once counted; counts by the `id`
//! message attribute. The demo speaks to a local server only, with test credentials (moto
//! accepts any). SQS reports no count of what a queue received once it was deleted, so
//! `published` is what was read (and the relay's acknowledgements). At the end it deletes the
//! queue (best effort).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::sink::SinkSettings;
use crate::sink::aws::demo::{moto_config, moto_demo, sdk_call, MotoRun};
use crate::sink::demo::{
    cleaned_up, parse_id, start, DemoConfig, DemoConsumer, DemoRun, DemoTarget, SinkDemo, Starting, Tally,
};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, QueueAttributeName};

const BROKER: &str = "moto (Amazon SQS)";

pub(crate) struct SqsConsumer {
    client: aws_sdk_sqs::Client,
    queue: String,
    url: String,
}

impl SqsConsumer {
    /// Makes the FIFO queue `queue` at the moto `endpoint`.
    pub(crate) async fn new(endpoint: &str, queue: &str) -> Result<SqsConsumer, String> {
        let client = aws_sdk_sqs::Client::new(&moto_config(endpoint));
        let created = sdk_call(
            BROKER,
            "creating the queue",
            client
                .create_queue()
                .queue_name(queue)
                .attributes(QueueAttributeName::FifoQueue, "true")
                .send(),
        )
        .await?;
        let url = created
            .queue_url()
            .ok_or_else(|| format!("{BROKER}: CreateQueue {queue} returned no queue URL"))?
            .to_owned();
        Ok(SqsConsumer {
            client,
            queue: queue.to_owned(),
            url,
        })
    }

    /// The queue's ARN (what an SNS subscription names).
    pub(crate) async fn arn(&self) -> Result<String, String> {
        let got = sdk_call(
            BROKER,
            "reading the queue's ARN",
            self.client
                .get_queue_attributes()
                .queue_url(&self.url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send(),
        )
        .await?;
        got.attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| format!("{BROKER}: queue {} has no QueueArn attribute", self.queue))
    }

    /// One long poll (up to 1 s, 10 messages), its messages counted and deleted.
    async fn receive(&self, tally: &dyn Tally) -> Result<(), String> {
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
            tally.record(id, m.body().map(str::as_bytes));
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

impl DemoConsumer for SqsConsumer {
    /// Reads until `stop`, then deletes the queue; returns what it cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut reported = false;
        while !stop.load(Ordering::Relaxed) {
            match self.receive(&*tally).await {
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
        let deleted = sdk_call(
            BROKER,
            "deleting the queue",
            self.client.delete_queue().queue_url(&self.url).send(),
        )
        .await;
        vec![cleaned_up(deleted, format!("SQS queue {} deleted", self.queue))]
    }
}

/// Amazon SQS's answers to the demo.
pub(crate) const DEMO: SinkDemo = moto_demo(
    "moto server (Amazon SQS)",
    "Amazon SQS (a FIFO queue), on a running moto server",
    open,
);

fn open(endpoint: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(SqsTarget(MotoRun::of(endpoint, run))))
}

/// moto and the run's queue names.
struct SqsTarget(MotoRun);

impl DemoTarget for SqsTarget {
    /// A FIFO queue per run (made by the consumer: `setup` creates no queues). Queue names allow
    /// no `.` but the `.fifo` suffix: `order.placed` becomes `order-placed`.
    fn config(&self) -> DemoConfig {
        self.0.fifo_config()
    }

    fn describe(&self, _: &SinkSettings) -> String {
        format!("moto (Amazon SQS) at {} (a FIFO queue)", self.0.endpoint)
    }

    fn consume<'a>(&'a self, queue: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(SqsConsumer::new(&self.0.endpoint, queue), tally, stop)
    }
}
