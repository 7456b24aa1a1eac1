//! Google Cloud Pub/Sub's half of `outbox-relay demo`: the relay publishes to a running emulator
//! (`--sink-url`, host:port; `PUBSUB_EMULATOR_HOST` is set for this process, so the demo never
//! reaches a cloud account), to a topic of the run's own that `setup` creates. The consumer is
//! a subscription with message ordering on, made on the run's topic
//! before the relay starts — a subscription only gets what is published after it exists. It
//! pulls over the emulator's REST API (an empty pull returns at once, and the consumer looks
//! again shortly) and acknowledges what it read; counts by
//! the `id` attribute. Pub/Sub reports no count of what a topic received, so `published` is what
//! was read (and the relay's acknowledgements). At the end it deletes the subscription and the
//! topic (best effort).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use super::config::{PubSubSettings, EMULATOR_HOST_VAR};
use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    container, parse_id, start, DemoConfig, DemoConsumer, DemoRun, DemoTarget, LocalServer, Server, SinkDemo, Starting,
    Tally, BROKER_TIMEOUT,
};

const BROKER: &str = "the Pub/Sub emulator";
/// How long the consumer waits after an empty pull. Pulls are never cut short: the emulator may
/// already have handed messages to a waiting pull the client gave up on, and those would come
/// back only after the acknowledgement deadline (so no waiting pulls: `returnImmediately`).
const IDLE: Duration = Duration::from_millis(10);
const BATCH: usize = 1_000;
/// The project of the demo's Pub/Sub topic (the emulator accepts any).
const PROJECT: &str = "outbox-relay-demo";

pub(crate) struct PubSubConsumer {
    http: reqwest::Client,
    /// `http://host:port/v1/projects/<project>/`.
    base: String,
    topic: String,
    subscription: String,
}

impl PubSubConsumer {
    /// Makes the run's subscription on `topic` (which must exist) at the emulator `host`.
    pub(crate) async fn new(host: &str, project: &str, topic: &str) -> Result<PubSubConsumer, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(BROKER_TIMEOUT)
            .build()
            .map_err(|e| format!("Pub/Sub: building the HTTP client: {e}"))?;
        let me = PubSubConsumer {
            http,
            base: format!("http://{host}/v1/projects/{project}/"),
            topic: topic.to_owned(),
            subscription: format!("{topic}-sub"),
        };
        let body = json!({
            "topic": format!("projects/{project}/topics/{topic}"),
            "enableMessageOrdering": true,
            "ackDeadlineSeconds": 60,
        });
        let r = me
            .http
            .put(format!("{}subscriptions/{}", me.base, me.subscription))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("{BROKER} at {host}, creating the subscription: {e}"))?;
        if !r.status().is_success() {
            return Err(format!(
                "{BROKER} at {host}, creating subscription {}: {} {}",
                me.subscription,
                r.status(),
                r.text().await.unwrap_or_default()
            ));
        }
        Ok(me)
    }

    /// One pull, its messages counted and acknowledged; returns how many came.
    async fn pull(&self, tally: &dyn Tally) -> Result<usize, String> {
        let reply = self
            .http
            .post(format!("{}subscriptions/{}:pull", self.base, self.subscription))
            .header("content-type", "application/json")
            .body(json!({ "maxMessages": BATCH, "returnImmediately": true }).to_string())
            .send()
            .await
            .map_err(|e| format!("pull: {e}"))?;
        if !reply.status().is_success() {
            return Err(format!("pull: {}", reply.status()));
        }
        let bytes = reply.bytes().await.map_err(|e| format!("pull: {e}"))?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| format!("pull: {e}"))?;
        let mut ack_ids = Vec::new();
        for m in body["receivedMessages"].as_array().into_iter().flatten() {
            if let Some(ack) = m["ackId"].as_str() {
                ack_ids.push(ack.to_owned());
            }
            let message = &m["message"];
            let id = message["attributes"]["id"]
                .as_str()
                .and_then(|v| parse_id(v.as_bytes()));
            let payload = message["data"]
                .as_str()
                .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
            tally.record(id, payload.as_deref());
        }
        let n = ack_ids.len();
        if n == 0 {
            return Ok(0);
        }
        // Unacknowledged, a message comes again after the deadline: counted once regardless.
        let acked = self
            .http
            .post(format!("{}subscriptions/{}:acknowledge", self.base, self.subscription))
            .header("content-type", "application/json")
            .body(json!({ "ackIds": ack_ids }).to_string())
            .send()
            .await
            .map_err(|e| format!("acknowledge: {e}"))?;
        if !acked.status().is_success() {
            return Err(format!("acknowledge: {}", acked.status()));
        }
        Ok(n)
    }
}

impl DemoConsumer for PubSubConsumer {
    /// Reads until `stop`, then deletes the subscription and the topic; returns what it cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut reported = false;
        while !stop.load(Ordering::Relaxed) {
            match self.pull(&*tally).await {
                Ok(0) => tokio::time::sleep(IDLE).await,
                Ok(_) => reported = false,
                Err(e) => {
                    // The emulator restarting, or busy: said once, and read on.
                    if !reported {
                        eprintln!("demo: Pub/Sub consumer: {e}; reading on");
                        reported = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let mut lines = Vec::new();
        for (what, path) in [
            ("subscription", format!("subscriptions/{}", self.subscription)),
            ("topic", format!("topics/{}", self.topic)),
        ] {
            let deleted = self.http.delete(format!("{}{path}", self.base)).send().await;
            lines.push(match deleted {
                Ok(r) if r.status().is_success() => format!("Pub/Sub {what} {path} deleted"),
                Ok(r) => format!("FAILED: deleting Pub/Sub {what} {path}: {}", r.status()),
                Err(e) => format!("FAILED: deleting Pub/Sub {what} {path}: {e}"),
            });
        }
        lines
    }
}

/// Pub/Sub's answers to the demo.
pub(crate) const DEMO: SinkDemo = SinkDemo::new(
    Server::Running {
        default_url: "127.0.0.1:8085",
        local: Some(LocalServer {
            name: "Pub/Sub emulator",
            start: "`gcloud beta emulators pubsub start --host-port=127.0.0.1:8085` (after \
                        scripts/ensure-pubsub-emulator.sh)",
        }),
    },
    open,
)
.help("Google Cloud Pub/Sub, on a running emulator")
.pointing(point_clients_at);

/// The sink has no endpoint key: the client goes to `PUBSUB_EMULATOR_HOST`.
fn point_clients_at(host: &str) {
    std::env::set_var(EMULATOR_HOST_VAR, host);
}

fn open(host: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(PubSubTarget {
        host: host.unwrap_or_default(),
        prefix: container(run),
        event_type: run.event_type,
    }))
}

/// The emulator and the run's topic names.
struct PubSubTarget {
    host: String,
    /// The run's topics are named `<prefix>.<routed-by value>`.
    prefix: String,
    event_type: &'static str,
}

impl DemoTarget for PubSubTarget {
    /// A topic per run, which `setup` creates.
    fn config(&self) -> DemoConfig {
        let keys = format!(
            "project = \"{PROJECT}\"\ntopics = [\"{}.{}\"]\n",
            self.prefix, self.event_type
        );
        DemoConfig::routed(keys, &format!("{}.${{routedByValue}}", self.prefix))
    }

    fn describe(&self, sink: &SinkSettings) -> String {
        match sink.section::<PubSubSettings>() {
            Some(p) => format!("the Pub/Sub emulator at {} (project {})", self.host, p.project),
            None => format!("the Pub/Sub emulator at {}", self.host),
        }
    }

    /// The subscription is made before the relay publishes: it only gets what comes after.
    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(PubSubConsumer::new(&self.host, PROJECT, topic), tally, stop)
    }
}
