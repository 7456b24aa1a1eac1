//! The demo's Google Cloud Pub/Sub consumer, on a running emulator (`--sink-url`, host:port):
//! a subscription with message ordering on, made on the run's topic (which `setup` created)
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

use super::consumer::{parse_id, record_event};
use super::stats::Stats;
use super::DemoError;

const BROKER: &str = "the Pub/Sub emulator";
/// How long the consumer waits after an empty pull. Pulls are never cut short: the emulator may
/// already have handed messages to a waiting pull the client gave up on, and those would come
/// back only after the acknowledgement deadline (so no waiting pulls: `returnImmediately`).
const IDLE: Duration = Duration::from_millis(10);
const BATCH: usize = 1_000;

pub(crate) struct PubSubConsumer {
    http: reqwest::Client,
    /// `http://host:port/v1/projects/<project>/`.
    base: String,
    topic: String,
    subscription: String,
    run_id: String,
}

impl PubSubConsumer {
    /// Makes the run's subscription on `topic` (which must exist) at the emulator `host`.
    pub(crate) async fn new(host: &str, project: &str, topic: &str, run_id: &str) -> Result<PubSubConsumer, DemoError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(super::consumer::BROKER_TIMEOUT)
            .build()
            .map_err(|e| DemoError::Sink(format!("Pub/Sub: building the HTTP client: {e}")))?;
        let me = PubSubConsumer {
            http,
            base: format!("http://{host}/v1/projects/{project}/"),
            topic: topic.to_owned(),
            subscription: format!("{topic}-sub"),
            run_id: run_id.to_owned(),
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
            .map_err(|e| DemoError::Sink(format!("{BROKER} at {host}, creating the subscription: {e}")))?;
        if !r.status().is_success() {
            return Err(DemoError::Sink(format!(
                "{BROKER} at {host}, creating subscription {}: {} {}",
                me.subscription,
                r.status(),
                r.text().await.unwrap_or_default()
            )));
        }
        Ok(me)
    }

    /// Reads until `stop`, then deletes the subscription and the topic; returns what it cleaned up.
    pub(crate) async fn run(self, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut reported = false;
        while !stop.load(Ordering::Relaxed) {
            match self.pull(&stats).await {
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

    /// One pull, its messages counted and acknowledged; returns how many came.
    async fn pull(&self, stats: &Stats) -> Result<usize, String> {
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
            record_event(stats, &self.run_id, id, payload.as_deref());
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
