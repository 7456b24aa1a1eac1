//! The consumer at the end of the pipeline: reads the run's events from the beginning on its own
//! thread and records, per message, the event id and the instant it arrived.
//!
//! Kafka ([`TopicConsumer::start`]): partitions are assigned directly (no group join, which the
//! mock delays by seconds), and fetch requests wait at most `FETCH_WAIT_MS` for data, so a record
//! is seen within a few milliseconds of the broker making it visible — that is, of its
//! acknowledgement. The other brokers ([`TopicConsumer::start_async`], sources in
//! `sink_consumer.rs`) run their async client on a current-thread runtime of the consumer's own
//! thread, so the load generator's tasks never delay a receipt.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

pub use super::sink_consumer::AsyncSource;

const FETCH_WAIT_MS: &str = "5";
/// Connecting a consumer (and, for RabbitMQ, binding its queue) takes at most this long.
const CONNECT_LIMIT: Duration = Duration::from_secs(15);

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

impl TopicConsumer {
    /// A consumer of another broker: `connect` (run on the consumer's thread, bounded by
    /// `CONNECT_LIMIT`) opens it — for RabbitMQ that includes binding the queue, so this returns
    /// only once messages published from now on are kept for it — then the source is read until
    /// [`TopicConsumer::finish`]. An error while reading is reported once and reading goes on
    /// (a consumer that lost messages shows them as lost).
    pub fn start_async<F, Fut>(name: &str, connect: F) -> Result<TopicConsumer>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<AsyncSource>>,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (stop_flag, counter) = (Arc::clone(&stop), Arc::clone(&count));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let label = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("bench-consumer-{name}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("building the consumer's runtime: {e}")));
                        return Vec::new();
                    }
                };
                runtime.block_on(async move {
                    let mut source = match tokio::time::timeout(CONNECT_LIMIT, connect()).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            let _ = ready_tx.send(Err(format!("{e:#}")));
                            return Vec::new();
                        }
                        Err(_) => {
                            let _ = ready_tx.send(Err(format!("not connected within {CONNECT_LIMIT:?}")));
                            return Vec::new();
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let mut receipts = Vec::new();
                    let mut reported = false;
                    while !stop_flag.load(Ordering::Relaxed) {
                        if let Err(e) = source.poll(&mut receipts).await {
                            if !reported {
                                eprintln!("bench consumer ({label}): {e:#}; reading on");
                                reported = true;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        counter.store(receipts.len() as u64, Ordering::Relaxed);
                    }
                    receipts
                })
            })?;
        match ready_rx.recv_timeout(CONNECT_LIMIT + Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(TopicConsumer {
                stop,
                count,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(anyhow!("{e}")).with_context(|| format!("starting the {name} consumer"))
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                Err(anyhow!("the {name} consumer did not start within {CONNECT_LIMIT:?}"))
            }
        }
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
