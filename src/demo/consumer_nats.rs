//! The demo's NATS JetStream consumer: an ordered (ephemeral, flow-controlled) pull consumer on
//! the run's stream, which `setup` created. Counts by the `id` header; the stream's message count
//! is what the broker reports as published. At the end it deletes the stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

use super::consumer::bounded;
use super::consumer::{parse_id, record_event};
use super::stats::Stats;
use super::DemoError;

const TIMEOUT: Duration = super::consumer::BROKER_TIMEOUT;
const BROKER: &str = "NATS";
const REFRESH: Duration = Duration::from_secs(1);

pub(crate) struct NatsConsumer {
    js: jetstream::Context,
    stream: String,
    run_id: String,
}

fn err(what: &str) -> impl FnOnce(String) -> DemoError + '_ {
    move |e| DemoError::Sink(format!("NATS, {what}: {e}"))
}

impl NatsConsumer {
    pub(crate) async fn new(url: &str, stream: &str, run_id: &str) -> Result<NatsConsumer, DemoError> {
        let client = bounded(
            BROKER,
            "connecting",
            async_nats::ConnectOptions::new()
                .connection_timeout(TIMEOUT)
                .connect(url),
        )
        .await?;
        Ok(NatsConsumer {
            js: jetstream::new(client),
            stream: stream.to_owned(),
            run_id: run_id.to_owned(),
        })
    }

    /// Reads until `stop`, then deletes the stream; returns what it cleaned up.
    pub(crate) async fn run(self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> Vec<String> {
        if let Err(e) = self.read(&stats, &stop).await {
            eprintln!("demo: the NATS consumer stopped: {e}");
        }
        let deleted = bounded(BROKER, "deleting the stream", self.js.delete_stream(&self.stream)).await;
        vec![match deleted {
            Ok(_) => format!("NATS stream {} deleted", self.stream),
            Err(e) => format!("FAILED: {e}"),
        }]
    }

    async fn read(&self, stats: &Stats, stop: &AtomicBool) -> Result<(), DemoError> {
        let mut stream = bounded(BROKER, "opening the stream", self.js.get_stream(&self.stream)).await?;
        let consumer = bounded(
            BROKER,
            "creating the consumer",
            stream.create_consumer(OrderedConfig::default()),
        )
        .await?;
        let mut messages = bounded(BROKER, "reading", consumer.messages()).await?;
        let mut next_refresh = Instant::now();
        loop {
            if Instant::now() >= next_refresh {
                next_refresh = Instant::now() + REFRESH;
                if let Ok(info) = bounded(BROKER, "stream info", stream.info()).await {
                    stats.published.store(info.state.messages, Ordering::Relaxed);
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(100), messages.next()).await {
                Ok(Some(Ok(message))) => {
                    let id = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("id"))
                        .and_then(|v| parse_id(v.as_str().as_bytes()));
                    record_event(stats, &self.run_id, id, Some(&message.payload));
                }
                Ok(Some(Err(e))) => eprintln!("demo: NATS consumer: {e}"),
                Ok(None) => return Err(err("reading")("the consumer ended".into())),
                Err(_) => {}
            }
        }
        if let Ok(info) = bounded(BROKER, "stream info", stream.info()).await {
            stats.published.store(info.state.messages, Ordering::Relaxed);
        }
        Ok(())
    }
}
