//! The Kafka consumer at the end of the pipeline: reads one topic from the beginning on its own
//! thread and records, per record, the event id (`id` header) and the instant it arrived.
//!
//! Partitions are assigned directly (no group join, which the mock delays by seconds), and fetch
//! requests wait at most `FETCH_WAIT_MS` for data, so a record is seen within a few milliseconds
//! of the broker making it visible — that is, of its acknowledgement.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

const FETCH_WAIT_MS: &str = "5";

/// Event id and the instant the consumer got it.
pub type Receipt = (i64, Instant);

pub struct TopicConsumer {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    thread: Option<JoinHandle<Vec<Receipt>>>,
}

impl TopicConsumer {
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> Result<TopicConsumer> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("bench-{topic}"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", FETCH_WAIT_MS)
            .set("fetch.min.bytes", "1")
            .set("fetch.error.backoff.ms", "10")
            .set("allow.auto.create.topics", "false")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (stop_flag, counter) = (Arc::clone(&stop), Arc::clone(&count));
        let thread = std::thread::Builder::new()
            .name("bench-consumer".into())
            .spawn(move || {
                let mut receipts = Vec::new();
                while !stop_flag.load(Ordering::Relaxed) {
                    let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    let arrived = Instant::now();
                    let id = msg
                        .headers()
                        .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
                    if let Some(id) = id {
                        receipts.push((id, arrived));
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
                receipts
            })?;
        Ok(TopicConsumer {
            stop,
            count,
            thread: Some(thread),
        })
    }

    /// Records received so far (duplicates included).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn finish(mut self) -> Vec<Receipt> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for TopicConsumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
