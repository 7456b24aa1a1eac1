//! NATS JetStream's half of `outbox-relay demo`: the relay publishes to a running server
//! (`--sink-url`), into a stream of the run's own that `setup` creates from the run's subject
//! (so it overlaps no other stream, a stream left by an earlier, killed demo included). The
//! consumer is an ordered (ephemeral, flow-controlled) pull consumer on that stream. Counts by the `id` header; the stream's message count
//! is what the broker reports as published. At the end it deletes the stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

use super::config::NatsSettings;
use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    bounded, cleaned_up, parse_id, start, toml_string, DemoConfig, DemoConsumer, DemoRun, DemoTarget, Server, SinkDemo,
    Starting, Tally, BROKER_TIMEOUT,
};

const TIMEOUT: Duration = BROKER_TIMEOUT;
const BROKER: &str = "NATS";
const REFRESH: Duration = Duration::from_secs(1);

pub(crate) struct NatsConsumer {
    js: jetstream::Context,
    stream: String,
}

fn err(what: &str) -> impl FnOnce(String) -> String + '_ {
    move |e| format!("NATS, {what}: {e}")
}

impl NatsConsumer {
    pub(crate) async fn new(url: &str, stream: &str) -> Result<NatsConsumer, String> {
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
        })
    }

    async fn read(&self, tally: &dyn Tally, stop: &AtomicBool) -> Result<(), String> {
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
                    tally.published(info.state.messages);
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
                    tally.record(id, Some(&message.payload));
                }
                Ok(Some(Err(e))) => eprintln!("demo: NATS consumer: {e}"),
                Ok(None) => return Err(err("reading")("the consumer ended".into())),
                Err(_) => {}
            }
        }
        if let Ok(info) = bounded(BROKER, "stream info", stream.info()).await {
            tally.published(info.state.messages);
        }
        Ok(())
    }
}

impl DemoConsumer for NatsConsumer {
    /// Reads until `stop`, then deletes the stream; returns what it cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        if let Err(e) = self.read(&*tally, &stop).await {
            eprintln!("demo: the NATS consumer stopped: {e}");
        }
        let deleted = bounded(BROKER, "deleting the stream", self.js.delete_stream(&self.stream)).await;
        vec![cleaned_up(deleted, format!("NATS stream {} deleted", self.stream))]
    }
}

/// NATS JetStream's answers to the demo.
pub(crate) const DEMO: SinkDemo = SinkDemo::new(Server::running("nats://127.0.0.1:4222"), open);

fn open(url: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(NatsTarget {
        url: url.unwrap_or_default(),
        stream: format!("OUTBOX_RELAY_DEMO_{}", run.id),
        run_id: run.id.clone(),
    }))
}

/// The server and the run's stream.
struct NatsTarget {
    url: String,
    stream: String,
    run_id: String,
}

impl DemoTarget for NatsTarget {
    /// A subject per run, which `setup` creates the stream with.
    fn config(&self) -> DemoConfig {
        let keys = format!(
            "url = {}\nstream = \"{}\"\nsubjects = [\"demo.{}.>\"]\n",
            toml_string(&self.url),
            self.stream,
            self.run_id
        );
        DemoConfig::routed(keys, &format!("demo.{}.${{routedByValue}}", self.run_id))
    }

    /// The URL as the settings print it: any password masked.
    fn describe(&self, sink: &SinkSettings) -> String {
        match sink.section::<NatsSettings>() {
            Some(n) => format!("NATS JetStream {} (stream {})", n.url, n.stream),
            None => "NATS JetStream".to_owned(),
        }
    }

    fn consume<'a>(&'a self, _: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(NatsConsumer::new(&self.url, &self.stream), tally, stop)
    }
}
