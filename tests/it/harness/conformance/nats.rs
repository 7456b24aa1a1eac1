//! NATS JetStream for the conformance suite: a stream of the test's own (subjects `<prefix>.>`)
//! on the shared server (`nats.rs`), or on a server of the test's own that it stops and starts
//! again (SIGTERM: a graceful stop, since a SIGKILLed nats-server may lose what it acknowledged
//! but had not written out yet — docs/sink-nats.md, "Guarantees"; its file store keeps the
//! stream across the restart). A destination is a subject `<prefix>.<name>`.

use std::time::Duration;

use super::{BadKind, BadRow, Capabilities, ExactlyOnce, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::nats::{NatsServer, NatsStream, SHARED_NATS};

pub struct Nats {
    stream: NatsStream,
    server: Option<NatsServer>,
}

impl SinkHarness for Nats {
    const NAME: &'static str = "NATS";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: Some(ExactlyOnce {
                how: "JetStream's Nats-Msg-Id deduplication",
                kills: 20,
                long_kills: 20,
                per_kill: 200,
            }),
            timestamps: true,
            workload: (5_000, 50),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(_test: &str, server: Server) -> Option<Nats> {
        Some(match server {
            Server::Shared => Nats {
                stream: NatsStream::create(SHARED_NATS).await,
                server: None,
            },
            Server::Own => {
                let server = NatsServer::start().await;
                Nats {
                    stream: NatsStream::create(&server.url()).await,
                    server: Some(server),
                }
            }
        })
    }

    async fn create(&self, _names: &[&str]) {}

    fn destination(&self, name: &str) -> String {
        format!("{}.{name}", self.stream.prefix)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        config
            .sink("nats", &self.stream.section())
            .route(regex, &self.destination(name))
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| self.destination(n)).collect();
        super::poll(want, timeout, Duration::from_secs(1), || async {
            super::of(self.stream.read_all().await, &names)
        })
        .await
    }

    async fn take_down(&mut self) {
        let server = self.server.as_mut().expect("a server of the test's own (Server::Own)");
        let pid = server.pid().expect("running");
        assert!(crate::harness::process::send_signal(pid, "TERM"));
        server.wait_stopped(Duration::from_secs(15)).await;
    }

    async fn bring_back(&mut self) {
        self.server
            .as_mut()
            .expect("a server of the test's own (Server::Own)")
            .restart()
            .await;
    }

    /// The connection loss, in the relay's words (a stopped server ends the session at once:
    /// no events wait on it, so the outage summary of a hung broker does not apply).
    fn check_outage_log(&self, log: &str, _variant: Variant) {
        assert!(
            log.contains("connection to NATS lost") || log.contains("cannot reach") || log.contains("cannot connect"),
            "NATS: the outage reached the relay:\n{log}"
        );
    }

    fn exactly_once_refusal(&self, _config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        None
    }

    /// How many sessions had JetStream drop a replayed duplicate (printed: whether a kill landed
    /// where a replay republishes is luck).
    fn check_exactly_once(&self, _records: &[Received], logs: &[String]) {
        let deduplicated = logs.iter().filter(|l| l.contains("as a duplicate")).count();
        eprintln!(
            "NATS exactly-once: {deduplicated} of {} sessions had JetStream drop a replayed duplicate",
            logs.len()
        );
    }

    /// Every one refused on sight (the publisher checks subject and size before sending).
    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new(
                "a subject NATS refuses",
                BadRow::Route("bad subject".into()),
                "may not contain whitespace",
            )
            .on_sight(),
            // Not `<prefix>.…` (a dot keeps the route from prefixing it): no subject of the
            // stream covers it.
            BadKind::new(
                "a subject no stream covers",
                BadRow::Route("elsewhere.order.x".into()),
                "covers",
            )
            .on_sight(),
            BadKind::new("too large", BadRow::Payload(1024 * 1024 + 10), "max_payload").on_sight(),
        ]
    }

    async fn finish(self) {
        self.stream.delete().await;
    }
}
