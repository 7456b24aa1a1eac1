//! Amazon SNS for the conformance suite: FIFO topics `<prefix>-<name>.fifo` on a moto of the
//! test's own, each with an SQS queue of the same name subscribed with raw message delivery
//! (`moto_sns.rs`), read back as the SQS harness reads its queues ([`MotoQueues`]: drained only
//! once they hold what is waited for). The outage freezes moto (SIGSTOP), as for SQS.

use std::time::Duration;

use super::sqs::{aws_env, check_dedup_ids, check_fifo_workload, MotoQueues};
use super::{BadKind, BadRow, Capabilities, ExactlyOnce, Received, RelayConfig, Server, SinkHarness};

pub struct Sns {
    q: MotoQueues,
}

impl SinkHarness for Sns {
    const NAME: &'static str = "SNS";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: Some(ExactlyOnce {
                how: "FIFO deduplication ids: the source position",
                kills: 10,
                long_kills: 10,
                per_kill: 60,
            }),
            timestamps: false,
            workload: (400, 20),
            per_kill: 100,
            two_writers: true,
            server_per_arm: true,
        }
    }

    async fn start(test: &str, _server: Server) -> Option<Sns> {
        Some(Sns {
            q: MotoQueues::start(test, "sns_cf").await?,
        })
    }

    async fn create(&self, names: &[&str]) {
        for name in names {
            self.q.moto.create_topic_with_queue(&self.q.queue(name)).await;
        }
    }

    fn destination(&self, name: &str) -> String {
        self.q.queue(name)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        self.q.configure("sns", config, regex, name)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        aws_env()
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        self.q.read(names, want, timeout).await
    }

    async fn take_down(&mut self) {
        self.q.moto.freeze();
    }

    async fn bring_back(&mut self) {
        self.q.moto.thaw();
    }

    fn check_workload(&self, records: &[Received], log: &str) {
        check_fifo_workload(records, log);
    }

    /// Standard topics (`fifo = false`) do not deduplicate.
    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((
            config.set("sns", "fifo", false),
            &["standard SNS topics do not deduplicate", "fifo = true"],
        ))
    }

    fn check_exactly_once(&self, records: &[Received], _logs: &[String]) {
        check_dedup_ids(records);
    }

    fn bad_kinds() -> Vec<BadKind> {
        vec![
            // Over 256 KiB (SNS's limit, `[sns] max_message_bytes`): refused before sending.
            BadKind::new("too large", BadRow::Payload(300_000), "max_message_bytes"),
            // Nine header columns set: 11 message attributes with `id` and `key`.
            BadKind::new("too many attributes", BadRow::AllHeaders, "at most 10"),
            BadKind::new(
                "a topic that does not exist",
                BadRow::Route("missing".into()),
                "does not exist",
            ),
        ]
    }

    fn header_columns(&self) -> usize {
        9
    }
}
