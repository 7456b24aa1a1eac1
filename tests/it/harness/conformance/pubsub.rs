//! Google Pub/Sub for the conformance suite: an emulator of the test's own (`pubsub.rs`), the
//! relay pointed at it by `PUBSUB_EMULATOR_HOST` as Google's clients are; a destination is a
//! topic `<prefix>.<name>` with a subscription (message ordering on) made before anything is
//! published to it (a subscription receives only what is published after it exists) and pulled
//! continuously. The outage: the relay reaches the emulator through a proxy of the test's own
//! that resets every connection for the time; the emulator keeps running, and keeps what it
//! acknowledged (an emulator killed and restarted, which loses its memory, is `sink_pubsub.rs`'s
//! own test).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::RwLock;

use super::{BadKind, BadRow, Capabilities, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::net_fault::{Mode, Proxy};
use crate::harness::pubsub::{PubSubEmulator, Puller, PROJECT};
use crate::harness::util::unique_name;

/// Header columns of the bad-event scenarios: with `id` and `key`, 101 attributes when all are
/// set (the good rows leave them NULL, which the sink does not send as attributes).
const EXTRA_HEADERS: usize = 99;

pub struct PubSub {
    emulator: Arc<RwLock<PubSubEmulator>>,
    puller: Puller,
    proxy: Option<Proxy>,
    host: String,
    prefix: String,
}

impl SinkHarness for PubSub {
    const NAME: &'static str = "Pub/Sub";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: None,
            timestamps: false,
            workload: (400, 20),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(test: &str, server: Server) -> Option<PubSub> {
        let emulator = Arc::new(RwLock::new(PubSubEmulator::start(test).await?));
        let direct = emulator.read().await.host();
        let (proxy, host) = match server {
            Server::Shared => (None, direct),
            Server::Own => {
                let target: SocketAddr = direct.parse().unwrap();
                let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), Some(target)).await;
                let host = proxy.addr().to_string();
                (Some(proxy), host)
            }
        };
        Some(PubSub {
            puller: Puller::start(Arc::clone(&emulator), Vec::new()),
            emulator,
            proxy,
            host,
            prefix: unique_name("pubsub_cf"),
        })
    }

    async fn create(&self, names: &[&str]) {
        let e = self.emulator.read().await;
        for name in names {
            let topic = self.destination(name);
            e.create_topic(&topic).await;
            let sub = e.subscribe(&topic).await;
            self.puller.add(sub, topic);
        }
    }

    fn destination(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        config
            .sink("pubsub", &[("project", PROJECT)])
            .route(regex, &self.destination(name))
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("PUBSUB_EMULATOR_HOST", self.host.clone())]
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| self.destination(n)).collect();
        super::poll(want, timeout, Duration::from_secs(1), || async {
            super::of(self.puller.records(), &names)
        })
        .await
    }

    async fn take_down(&mut self) {
        self.proxy
            .as_ref()
            .expect("a proxy of the test's own (Server::Own)")
            .set_mode(Mode::Reset);
    }

    async fn bring_back(&mut self) {
        self.proxy
            .as_ref()
            .expect("a proxy of the test's own (Server::Own)")
            .set_mode(Mode::Pass);
    }

    fn check_outage_log(&self, log: &str, _variant: Variant) {
        assert!(
            log.contains("Pub/Sub"),
            "Pub/Sub: the outage should show in the log:\n{log}"
        );
    }

    /// The attributes: the event id and the aggregate key, nothing else without header
    /// columns; the relay names the emulator at start.
    fn check_workload(&self, records: &[Received], log: &str) {
        let names: Vec<&str> = records[0].headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["id", "key"], "{:?}", records[0]);
        assert!(
            log.contains("Pub/Sub emulator"),
            "the emulator is named at start: {log}"
        );
    }

    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((config, &["Pub/Sub's Publish has no deduplication", "at-least-once"]))
    }

    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new("a payload above 10 MB", BadRow::Payload(10_500_000), "larger"),
            BadKind::new("101 attributes", BadRow::AllHeaders, "at most 100 per message"),
        ]
    }

    fn header_columns(&self) -> usize {
        EXTRA_HEADERS
    }

    fn check_dead_letter(&self, letter: &Received, _kind: &BadKind) {
        assert_eq!(letter.key_str().map(str::len), Some(36), "the event's key");
    }
}
