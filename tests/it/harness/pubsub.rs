//! Google's Pub/Sub emulator for the Pub/Sub sink's tests (`scripts/ensure-pubsub-emulator.sh`
//! installs it): [`PubSubEmulator`] runs one of a test's own on a free loopback port (killed on
//! drop, tied to the test process by a watchdog), and talks to it over its REST API — topics,
//! subscriptions with message ordering on, pulls read back as [`Received`] records so the
//! shared checks (`check_delivered`, `check_order`) apply.
//!
//! A message maps to a record as the sink writes it (docs/sink-pubsub.md): `topic` = the topic
//! id, `key` = attribute `key`, `payload` = `data`, every attribute a header (`id` and `key`
//! first, then by name), `offset` = its position in the order the test pulled it.
//!
//! The emulator keeps everything in memory: a restarted one has no topics, no subscriptions
//! and no messages. [`PubSubEmulator::restart`] starts it again on the same port and recreates
//! the topics and subscriptions the test made (what was published before the stop and not yet
//! pulled is gone with it — the tests that stop it pull continuously and say what that cost).
//! Without the emulator (no Java, package missing) [`PubSubEmulator::start`] returns `None`
//! after `needs::missing` (a loud SKIPPING line; a failure under CI).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::consumer::Received;
use super::process::Watchdog;
use super::util::free_port;

/// The project every test publishes into (the emulator accepts any).
pub const PROJECT: &str = "outbox-relay-test";
/// Where the Debian package `google-cloud-cli-pubsub-emulator` puts the emulator.
const EMULATOR_BIN: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The emulator's launcher, if installed (`PUBSUB_EMULATOR_BIN` overrides the path).
pub fn emulator_bin() -> Option<PathBuf> {
    let path = std::env::var("PUBSUB_EMULATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(EMULATOR_BIN));
    path.is_file().then_some(path)
}

/// One emulator process of a test's own.
pub struct PubSubEmulator {
    child: Option<Child>,
    _watchdog: Option<Watchdog>,
    pub port: u16,
    dir: tempfile::TempDir,
    http: reqwest::Client,
    /// What the test created, to recreate after a restart: topic ids, and (subscription, topic).
    topics: Mutex<Vec<String>>,
    subscriptions: Mutex<Vec<(String, String)>>,
}

impl PubSubEmulator {
    /// Starts an emulator on a free loopback port; `None` when it is not installed (after
    /// [`super::needs::missing`]: a loud SKIPPING line, a failure under CI).
    pub async fn start(test: &str) -> Option<PubSubEmulator> {
        if emulator_bin().is_none() {
            super::needs::missing(super::needs::PUBSUB_EMULATOR, test, EMULATOR_BIN);
            return None;
        }
        let mut e = PubSubEmulator {
            child: None,
            _watchdog: None,
            port: 0,
            dir: tempfile::tempdir().unwrap(),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            topics: Mutex::new(Vec::new()),
            subscriptions: Mutex::new(Vec::new()),
        };
        // A free port can be taken by another test's listener before the JVM binds it: try again
        // on another one.
        for _ in 0..5 {
            e.port = free_port();
            if e.launch().await {
                return Some(e);
            }
        }
        panic!("the Pub/Sub emulator did not start; log:\n{}", e.log_text());
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("emulator.log")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Starts the process on `self.port` and waits (bounded) until it listens; `false` if it
    /// exited (the port was taken) or did not come up in time.
    async fn launch(&mut self) -> bool {
        let needle = format!("listening on {}", self.port);
        let before = self.log_text().matches(&needle).count();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new(emulator_bin().unwrap())
            .arg("--host=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .env("CLOUD_PUBSUB_EMULATOR_OPTS", "-Xmx768m")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn the Pub/Sub emulator");
        self._watchdog = Some(Watchdog::guard(child.id()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self.log_text().matches(&needle).count() > before {
                // The REST side answers too.
                if self
                    .http
                    .get(format!("{}/v1/projects/{PROJECT}/topics", self.url()))
                    .send()
                    .await
                    .is_ok()
                {
                    return true;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    self.child = None;
                    return false;
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `PUBSUB_EMULATOR_HOST` for the relay.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL (the emulator loses everything it held).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self._watchdog = None;
    }

    /// Starts it again on the same port and recreates the topics and subscriptions.
    pub async fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.launch().await {
            assert!(
                Instant::now() < deadline,
                "the emulator did not restart on port {}; log:\n{}",
                self.port,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let topics = self.topics.lock().unwrap().clone();
        for t in topics {
            self.put_topic(&t).await;
        }
        let subs = self.subscriptions.lock().unwrap().clone();
        for (s, t) in subs {
            self.put_subscription(&s, &t).await;
        }
    }

    async fn put_topic(&self, id: &str) {
        let r = self
            .http
            .put(format!("{}/v1/projects/{PROJECT}/topics/{id}", self.url()))
            .send()
            .await
            .expect("create topic");
        let status = r.status();
        assert!(
            status.is_success() || status.as_u16() == 409,
            "create topic {id}: {status} {}",
            r.text().await.unwrap_or_default()
        );
    }

    async fn put_subscription(&self, sub: &str, topic: &str) {
        let r = self
            .http
            .put(format!("{}/v1/projects/{PROJECT}/subscriptions/{sub}", self.url()))
            .header("content-type", "application/json")
            .body(
                json!({
                    "topic": format!("projects/{PROJECT}/topics/{topic}"),
                    "enableMessageOrdering": true,
                    "ackDeadlineSeconds": 60,
                })
                .to_string(),
            )
            .send()
            .await
            .expect("create subscription");
        let status = r.status();
        assert!(
            status.is_success() || status.as_u16() == 409,
            "create subscription {sub}: {status} {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// Creates topic `id` (recreated after a restart).
    pub async fn create_topic(&self, id: &str) {
        self.put_topic(id).await;
        self.topics.lock().unwrap().push(id.to_owned());
    }

    /// Whether topic `id` exists.
    pub async fn topic_exists(&self, id: &str) -> bool {
        let r = self
            .http
            .get(format!("{}/v1/projects/{PROJECT}/topics/{id}", self.url()))
            .send()
            .await
            .expect("get topic");
        r.status().is_success()
    }

    /// A subscription with message ordering on for `topic` (which must exist), named after it;
    /// recreated after a restart. Only what is published after this arrives in it.
    pub async fn subscribe(&self, topic: &str) -> String {
        let sub = format!("{topic}-sub");
        self.put_subscription(&sub, topic).await;
        self.subscriptions.lock().unwrap().push((sub.clone(), topic.to_owned()));
        sub
    }

    /// One pull of `sub` (of `topic`), acknowledged; `Err` while the emulator is down.
    pub async fn pull_once(&self, sub: &str, topic: &str) -> Result<Vec<Received>, String> {
        let r = self
            .http
            .post(format!("{}/v1/projects/{PROJECT}/subscriptions/{sub}:pull", self.url()))
            .header("content-type", "application/json")
            .body(json!({ "maxMessages": 1000, "returnImmediately": true }).to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("pull {sub}: {}", r.status()));
        }
        let body: Value =
            serde_json::from_slice(&r.bytes().await.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut ack_ids = Vec::new();
        for m in body["receivedMessages"].as_array().cloned().unwrap_or_default() {
            ack_ids.push(m["ackId"].as_str().unwrap().to_owned());
            out.push(received(topic, &m["message"]));
        }
        if !ack_ids.is_empty() {
            self.http
                .post(format!(
                    "{}/v1/projects/{PROJECT}/subscriptions/{sub}:acknowledge",
                    self.url()
                ))
                .header("content-type", "application/json")
                .body(json!({ "ackIds": ack_ids }).to_string())
                .send()
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(out)
    }
}

impl Drop for PubSubEmulator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A pulled message as a record (module docs).
fn received(topic: &str, m: &Value) -> Received {
    let data = m["data"]
        .as_str()
        .map(|d| {
            base64::engine::general_purpose::STANDARD
                .decode(d)
                .expect("base64 data")
        })
        .unwrap_or_default();
    let attrs: BTreeMap<String, String> = m["attributes"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    for first in ["id", "key"] {
        if let Some(v) = attrs.get(first) {
            headers.push((first.to_owned(), v.clone().into_bytes()));
        }
    }
    headers.extend(
        attrs
            .iter()
            .filter(|(k, _)| k.as_str() != "id" && k.as_str() != "key")
            .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
    );
    Received {
        topic: topic.to_owned(),
        partition: 0,
        offset: 0,
        key: attrs.get("key").map(|k| k.clone().into_bytes()),
        payload: Some(data),
        headers,
        timestamp_ms: None,
    }
}

/// Pulls `subs` (subscription, topic) continuously in a task of its own, keeping what arrived in
/// pull order; pulls that fail (the emulator down) are retried. [`Puller::add`] pulls one more.
pub struct Puller {
    records: Arc<Mutex<Vec<Received>>>,
    subs: Arc<Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Puller {
    pub fn start(emulator: Arc<tokio::sync::RwLock<PubSubEmulator>>, subs: Vec<(String, String)>) -> Puller {
        let records = Arc::new(Mutex::new(Vec::new()));
        let subs = Arc::new(Mutex::new(subs));
        let out = Arc::clone(&records);
        let pulled_subs = Arc::clone(&subs);
        let task = tokio::spawn(async move {
            loop {
                let mut got_any = false;
                let subs = pulled_subs.lock().unwrap().clone();
                for (sub, topic) in &subs {
                    let pulled = emulator.read().await.pull_once(sub, topic).await;
                    if let Ok(batch) = pulled {
                        got_any |= !batch.is_empty();
                        let mut all = out.lock().unwrap();
                        for mut r in batch {
                            r.offset = all.len() as i64;
                            all.push(r);
                        }
                    }
                }
                if !got_any {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Puller { records, subs, task }
    }

    /// Pulls subscription `sub` (of `topic`) too from now on.
    pub fn add(&self, sub: String, topic: String) {
        self.subs.lock().unwrap().push((sub, topic));
    }

    pub fn records(&self) -> Vec<Received> {
        self.records.lock().unwrap().clone()
    }

    /// What arrived once at least `want` distinct events did (or `timeout` passed).
    pub async fn wait_for(&self, want: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let records = self.records();
            let distinct: std::collections::HashSet<&[u8]> = records.iter().filter_map(|r| r.header("id")).collect();
            if distinct.len() >= want || Instant::now() > deadline {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Puller {
    fn drop(&mut self) {
        self.task.abort();
    }
}
