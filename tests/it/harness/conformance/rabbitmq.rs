//! RabbitMQ for the conformance suite: a durable topic exchange of the test's own on the shared
//! broker (`rabbitmq.rs`), with one durable queue bound by each destination's routing key (a
//! destination is a routing key; an event routed to a key no queue is bound to is unroutable).
//! The outage is a TCP proxy of the test's own that drops every connection and refuses new ones
//! for the time (the shared broker is never stopped; a node of the test's own stopped and
//! restarted is `sink_rabbitmq.rs`'s own test).

use std::time::Duration;

use super::{BadKind, BadRow, Capabilities, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::rabbitmq::{AmqpProxy, RabbitFixture, RABBITMQ_ADDR, RABBITMQ_URL};

pub struct RabbitMq {
    fx: RabbitFixture,
    proxy: Option<AmqpProxy>,
    /// Records read when the proxy was cut.
    at_cut: usize,
}

impl SinkHarness for RabbitMq {
    const NAME: &'static str = "RabbitMQ";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: None,
            timestamps: true,
            workload: (2_000, 40),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(_test: &str, server: Server) -> Option<RabbitMq> {
        let proxy = match server {
            Server::Shared => None,
            Server::Own => Some(AmqpProxy::start(RABBITMQ_ADDR).await),
        };
        Some(RabbitMq {
            fx: RabbitFixture::new(&[]).await,
            proxy,
            at_cut: 0,
        })
    }

    async fn create(&self, names: &[&str]) {
        for name in names {
            self.fx.bind(name).await;
        }
    }

    fn destination(&self, name: &str) -> String {
        name.to_owned()
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        let url = self
            .proxy
            .as_ref()
            .map_or_else(|| RABBITMQ_URL.to_owned(), AmqpProxy::url);
        config
            .sink("rabbitmq", &[("url", &url), ("exchange", &self.fx.exchange)])
            .route(regex, name)
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        super::poll(want, timeout, Duration::from_secs(1), || async {
            super::of(self.fx.drain().await, &names)
        })
        .await
    }

    async fn take_down(&mut self) {
        self.proxy
            .as_ref()
            .expect("a proxy of the test's own (Server::Own)")
            .cut();
        self.at_cut = self.fx.drain().await.len();
    }

    /// Nothing can arrive through a cut proxy.
    async fn bring_back(&mut self) {
        let during = self.fx.drain().await.len() - self.at_cut;
        assert_eq!(during, 0, "nothing can arrive through a cut proxy");
        self.proxy
            .as_ref()
            .expect("a proxy of the test's own (Server::Own)")
            .restore();
    }

    /// The cut connection, in the relay's words (it fails the session and reconnects: no
    /// events wait on a dead connection, so the outage summary of a hung broker does not apply).
    fn check_outage_log(&self, log: &str, _variant: Variant) {
        assert!(
            log.contains("RabbitMQ: cannot connect to"),
            "RabbitMQ: the outage should show in the log:\n{log}"
        );
    }

    /// Every message persistent, with the event id as its `message_id`.
    fn check_workload(&self, records: &[Received], _log: &str) {
        for r in records {
            assert_eq!(r.header("message_id"), r.header("id"), "message_id = event id");
            assert_eq!(r.header("delivery_mode"), Some(&b"2"[..]), "persistent");
        }
    }

    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((config, &["deduplication", "at-least-once"]))
    }

    /// Neither ends the session: the routing key's length is refused on sight, an unroutable
    /// message on its publisher confirm (`basic.return`), and the aggregate's next event is not
    /// sent before it — nothing after it under `fail`, no good event twice, dead letters in
    /// commit order.
    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new("unroutable", BadRow::Route("nobody.listens".into()), "unroutable").on_sight(),
            BadKind::new(
                "a routing key over 255 bytes",
                BadRow::Route(format!("order.{}", "x".repeat(300))),
                "at most 255",
            )
            .on_sight(),
        ]
    }

    async fn check_skipped(&self, log: &str) {
        assert!(log.contains("unroutable"), "{log}");
    }

    async fn finish(self) {
        self.fx.clean().await;
    }
}
