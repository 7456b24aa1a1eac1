//! The webhook sink for the conformance suite: an HTTP receiver of the test's own in the test
//! process (`webhook.rs`); a destination is the URL's `${topic}` (`<receiver>/hooks/<name>`), and
//! a record is a request it answered with a 2xx. The outage: the receiver stops listening and
//! drops every open connection, then binds the same port again.

use std::time::Duration;

use super::{BadKind, BadRow, Capabilities, Policy, Received, RelayConfig, Server, SinkHarness};
use crate::harness::webhook::WebhookReceiver;

/// The marker of the body the receiver refuses (422) in the bad-event scenarios.
const REFUSE: &str = "REFUSE-ME";

pub struct Webhook {
    receiver: WebhookReceiver,
}

impl SinkHarness for Webhook {
    const NAME: &'static str = "webhook";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: None,
            timestamps: false,
            workload: (2_000, 40),
            per_kill: 200,
            two_writers: true,
            server_per_arm: false,
        }
    }

    async fn start(_test: &str, _server: Server) -> Option<Webhook> {
        Some(Webhook {
            receiver: WebhookReceiver::start().await,
        })
    }

    async fn create(&self, _names: &[&str]) {}

    fn destination(&self, name: &str) -> String {
        name.to_owned()
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        config
            .sink("webhook", &[("url", &self.receiver.url())])
            .route(regex, name)
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        super::poll(want, timeout, Duration::from_millis(500), || async {
            super::of(self.receiver.received(), &names)
        })
        .await
    }

    async fn take_down(&mut self) {
        self.receiver.down();
    }

    async fn bring_back(&mut self) {
        self.receiver.up().await;
    }

    /// The requests carry the id as `Idempotency-Key`, JSON, no signature without a secret,
    /// and go to the routed path.
    fn check_workload(&self, _records: &[Received], _log: &str) {
        for hit in self.receiver.hits() {
            let id = hit.header("id").expect("id header");
            assert_eq!(hit.header("idempotency-key"), Some(id));
            assert_eq!(hit.header("content-type"), Some("application/json"));
            assert!(hit.header("webhook-signature").is_none(), "no secret, no signature");
            assert!(hit.path.starts_with("/hooks/"), "{}", hit.path);
        }
    }

    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((config, &["HTTP has no deduplication on the wire", "Idempotency-Key"]))
    }

    /// One request per aggregate on the wire: a refused event holds its aggregate's next one.
    fn bad_kinds() -> Vec<BadKind> {
        vec![
            BadKind::new("refused by the receiver (422)", BadRow::Marked(REFUSE), "HTTP 422").nothing_after(),
            // Refused on sight: under `fail` it would race the 422 to stop the relay.
            BadKind::new(
                "a name that cannot stand in the URL",
                BadRow::Route("bad name!".into()),
                "may only hold letters",
            )
            .not_under_fail(),
        ]
    }

    /// The receiver refuses marked bodies with 422; retries start at 50 ms and stay under 1 s.
    async fn prepare_bad(&self, _client: &tokio_postgres::Client, config: RelayConfig, _policy: Policy) -> RelayConfig {
        self.receiver.refuse_marked(REFUSE, 422);
        config
            .set("webhook", "retry_initial_ms", 50)
            .set("webhook", "retry_max_ms", 800)
    }

    /// A 4xx is not retried: sent once, and once more alone before it is called bad
    /// (relay/quarantine.rs).
    async fn check_skipped(&self, _log: &str) {
        let refusals = self.receiver.hits().iter().filter(|h| h.status == 422).count();
        assert!((1..=2).contains(&refusals), "a 4xx is not retried: {refusals} refusals");
    }

    /// The raw event is the dead letter's body.
    fn check_dead_letter(&self, letter: &Received, kind: &BadKind) {
        if kind.row == BadRow::Marked(REFUSE) {
            assert!(
                letter.payload_str().unwrap_or_default().contains(REFUSE),
                "the raw event is the body"
            );
        }
    }
}
