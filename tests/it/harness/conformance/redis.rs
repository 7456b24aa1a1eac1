//! Redis Streams for the conformance suite: streams `<prefix>.<name>` on the shared Redis
//! (`redis.rs`, never stopped), or on a `redis-server` of the test's own with AOF on
//! (`appendfsync always`) that it stops and starts again — what Redis acknowledged survives, so
//! what is measured is the relay, not Redis' lack of persistence. The keys of the prefix (and
//! their dedup sets) are deleted at the end.

use std::time::Duration;

use super::{BadKind, BadRow, Capabilities, ExactlyOnce, Policy, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::redis::{connect, read_stream, PrivateRedis, SHARED_REDIS};
use crate::harness::util::unique_name;

/// `[redis] max_message_bytes` in the bad-event scenarios.
const MAX_MESSAGE: usize = 4096;

pub struct Redis {
    url: String,
    prefix: String,
    server: Option<PrivateRedis>,
    /// Entries the prefix's streams held when the server stopped.
    held: usize,
}

impl Redis {
    /// Every key of the prefix.
    async fn keys(&self) -> Vec<String> {
        let mut c = connect(&self.url).await;
        ::redis::cmd("KEYS")
            .arg(format!("{}.*", self.prefix))
            .query_async(&mut c)
            .await
            .unwrap_or_default()
    }

    /// Entries in the prefix's streams.
    async fn entries(&self) -> usize {
        let mut n = 0;
        for key in self.keys().await {
            if !key.ends_with(":outbox-relay-dedup") {
                n += read_stream(&self.url, &key).await.len();
            }
        }
        n
    }
}

/// The replayed records a relay's log says Redis dropped as duplicates.
fn duplicates_dropped(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("Redis dropped replayed records"))
        .filter_map(|l| {
            l.split("duplicates=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

impl SinkHarness for Redis {
    const NAME: &'static str = "Redis";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: Some(ExactlyOnce {
                how: "the dedup script's per-stream sets",
                kills: 20,
                long_kills: 20,
                per_kill: 100,
            }),
            timestamps: true,
            workload: (400, 20),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(_test: &str, server: Server) -> Option<Redis> {
        let server = match server {
            Server::Shared => None,
            Server::Own => Some(PrivateRedis::start(&["--appendonly", "yes", "--appendfsync", "always"])),
        };
        Some(Redis {
            url: server
                .as_ref()
                .map_or_else(|| SHARED_REDIS.to_owned(), PrivateRedis::url),
            prefix: unique_name("redis_cf"),
            server,
            held: 0,
        })
    }

    async fn create(&self, _names: &[&str]) {}

    fn destination(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        config
            .sink("redis", &[("url", &self.url)])
            .route(regex, &self.destination(name))
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| self.destination(n)).collect();
        super::poll(want, timeout, Duration::from_secs(1), || async {
            let mut all = Vec::new();
            for name in &names {
                all.extend(read_stream(&self.url, name).await);
            }
            all
        })
        .await
    }

    /// SIGTERM (a clean shutdown: the AOF is flushed).
    async fn take_down(&mut self) {
        self.held = self.entries().await;
        self.server
            .as_mut()
            .expect("a server of the test's own (Server::Own)")
            .stop();
    }

    /// Started again on its port and data: AOF kept everything Redis had acknowledged.
    async fn bring_back(&mut self) {
        self.server
            .as_mut()
            .expect("a server of the test's own (Server::Own)")
            .restart();
        let after = self.entries().await;
        assert!(
            after >= self.held,
            "AOF kept what Redis acknowledged ({} → {after})",
            self.held
        );
    }

    /// The connection loss, in the relay's words (a stopped server ends the session at once).
    fn check_outage_log(&self, log: &str, _variant: Variant) {
        assert!(
            log.contains("Redis"),
            "Redis: the outage should show in the log:\n{log}"
        );
    }

    /// The fields, in the documented order; the timestamp is the row's `created_at`.
    fn check_workload(&self, records: &[Received], _log: &str) {
        let r = &records[0];
        let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["id", "key", "timestamp", "payload"], "{r:?}");
        let ts = r.timestamp_ms.expect("created_at as the timestamp");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!((now - ts).abs() < 600_000, "timestamp {ts} is the row's created_at");
    }

    fn exactly_once_refusal(&self, _config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        None
    }

    /// With failpoints a relay stops between an acknowledgement and its confirmation: its
    /// replays must be there for the dedup sets to drop.
    fn check_exactly_once(&self, _records: &[Received], logs: &[String]) {
        let dropped: usize = logs.iter().map(|l| duplicates_dropped(l)).sum();
        eprintln!("replayed records Redis' dedup sets dropped: {dropped}");
        let crashed = logs.iter().any(|l| l.contains("failpoint relay::acked_before_status"));
        assert!(
            dropped > 0 || !crashed,
            "the failpoint crash should have made replays for the dedup sets to drop"
        );
    }

    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new("a key of another type", BadRow::Route("wrong".into()), "WRONGTYPE"),
            BadKind::new("too large", BadRow::Payload(MAX_MESSAGE * 2), "larger"),
            BadKind::new(
                "a stream key Redis refuses",
                BadRow::Route("bad\u{7}name".into()),
                "control characters",
            ),
        ]
    }

    /// `[redis] max_message_bytes` = 4096, and the key `wrong` routes to holds a string.
    async fn prepare_bad(&self, _client: &tokio_postgres::Client, config: RelayConfig, _policy: Policy) -> RelayConfig {
        let mut c = connect(&self.url).await;
        let _: () = ::redis::cmd("SET")
            .arg(self.destination("wrong"))
            .arg("not a stream")
            .query_async(&mut c)
            .await
            .unwrap();
        config.set("redis", "max_message_bytes", MAX_MESSAGE as i64)
    }

    /// The bad event's key is left alone.
    async fn check_skipped(&self, _log: &str) {
        let mut c = connect(&self.url).await;
        let ty: String = ::redis::cmd("TYPE")
            .arg(self.destination("wrong"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(ty, "string", "the bad event's key is left alone");
    }

    fn check_dead_letter(&self, letter: &Received, _kind: &BadKind) {
        assert_eq!(letter.header("key").map(<[u8]>::len), Some(36), "the event's key");
    }

    async fn finish(self) {
        let keys = self.keys().await;
        if !keys.is_empty() {
            let mut c = connect(&self.url).await;
            let _: () = ::redis::cmd("DEL").arg(&keys).query_async(&mut c).await.unwrap();
        }
    }
}
