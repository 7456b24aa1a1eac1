//! Amazon SQS for the conformance suite: FIFO queues `<prefix>-<name>.fifo` on a moto of the
//! test's own (`moto.rs`), which it freezes for the outage (SIGSTOP: a killed moto forgets every
//! queue and message, which would measure moto, not the relay).
//!
//! moto deduplicates FIFO messages only against those still queued, so a queue is drained
//! (received and deleted) only once it holds what the scenario waits for: nothing is deleted
//! while the relay may still send, and a duplicate the relay sent shows up as a message too
//! many. What was drained is kept, so reading again returns it too. moto's FIFO queues slow down
//! as they fill (~10 ms per message in a small queue, ~100 ms at 1,000): the loads are a few
//! hundred events (docs/sink-sqs.md).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{BadKind, BadRow, Capabilities, ExactlyOnce, Policy, Received, RelayConfig, Server, SinkHarness};
use crate::harness::moto::{Moto, AWS_ENV};
use crate::harness::util::unique_name;

/// A moto and the queues drained so far (shared by the SQS and SNS harnesses: SNS is read
/// through an SQS queue subscribed to each topic).
pub struct MotoQueues {
    pub moto: Moto,
    pub prefix: String,
    drained: Mutex<Vec<Received>>,
}

impl MotoQueues {
    pub async fn start(test: &str, prefix: &str) -> Option<MotoQueues> {
        Some(MotoQueues {
            moto: Moto::start(test).await?,
            prefix: unique_name(prefix),
            drained: Mutex::new(Vec::new()),
        })
    }

    /// `<prefix>-<name>.fifo`.
    pub fn queue(&self, name: &str) -> String {
        format!("{}-{name}.fifo", self.prefix)
    }

    fn drained(&self, names: &[String]) -> Vec<Received> {
        super::of(self.drained.lock().unwrap().clone(), names)
    }

    /// Waits until the queues `names` hold (with what was drained) `want` events, then 2 s
    /// more for stragglers, then drains them.
    pub async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| self.queue(n)).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let mut have = super::distinct(&self.drained(&names));
            for name in &names {
                have += self.moto.count(name).await;
            }
            if have >= want || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        for name in &names {
            let got = self.moto.drain(name).await;
            let mut drained = self.drained.lock().unwrap();
            for mut r in got {
                r.offset = drained.len() as i64;
                drained.push(r);
            }
        }
        self.drained(&names)
    }

    /// `[<kind>]` on this moto, FIFO, and the route to `<prefix>-<name>.fifo`.
    pub fn configure(&self, kind: &str, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        let section = self.moto.section();
        let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
        pairs.push(("fifo", "true"));
        config.sink(kind, &pairs).route(regex, &self.queue(name))
    }
}

pub fn aws_env() -> Vec<(&'static str, String)> {
    AWS_ENV.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The FIFO fields of a clean workload: the aggregate key is the message group, the event id
/// deduplicates (at-least-once); attributes `id` and `key` only; no order warning at start.
pub fn check_fifo_workload(records: &[Received], log: &str) {
    for r in records {
        assert_eq!(r.header("sqs:MessageGroupId"), r.key.as_deref(), "{r:?}");
        assert_eq!(r.header("sqs:MessageDeduplicationId"), r.header("id"), "{r:?}");
    }
    let names: Vec<&str> = records[0]
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("sqs:"))
        .collect();
    assert_eq!(names, ["id", "key"], "{:?}", records[0]);
    assert!(
        !log.contains("do not keep order"),
        "FIFO destinations do not warn:\n{log}"
    );
}

/// Exactly-once through FIFO deduplication: every message's deduplication id is its source
/// position.
pub fn check_dedup_ids(records: &[Received]) {
    for r in records {
        let dedup = String::from_utf8_lossy(r.header("sqs:MessageDeduplicationId").expect("dedup id")).into_owned();
        let lsn = String::from_utf8_lossy(r.header("outbox-relay-commit-lsn").expect("position")).into_owned();
        assert!(
            dedup.contains(&lsn),
            "the deduplication id is the source position: {dedup} / {lsn}"
        );
    }
}

pub struct Sqs {
    q: MotoQueues,
}

impl SinkHarness for Sqs {
    const NAME: &'static str = "SQS";

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

    async fn start(test: &str, _server: Server) -> Option<Sqs> {
        Some(Sqs {
            q: MotoQueues::start(test, "sqs_cf").await?,
        })
    }

    async fn create(&self, names: &[&str]) {
        for name in names {
            self.q.moto.create_queue(&self.q.queue(name)).await;
        }
    }

    fn destination(&self, name: &str) -> String {
        self.q.queue(name)
    }

    /// `[sqs] timeout_ms` keeps its default even in the short variants: moto's FIFO queue, slow
    /// as it fills and slower under a loaded CI machine, can take seconds per call after a
    /// thaw, and a shorter attempt timeout only makes the retries pile up on it.
    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        self.q.configure("sqs", config, regex, name)
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

    /// Standard queues (`fifo = false`) do not deduplicate.
    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((
            config.set("sqs", "fifo", false),
            &["standard SQS queues do not deduplicate", "fifo = true"],
        ))
    }

    fn check_exactly_once(&self, records: &[Received], _logs: &[String]) {
        check_dedup_ids(records);
    }

    fn bad_kinds() -> Vec<BadKind> {
        vec![
            // Over `[sqs] max_message_bytes` (1 MiB here, the default 256 KiB under dead-letter):
            // refused before sending.
            BadKind::new("too large", BadRow::Payload(1_100_000), "max_message_bytes"),
            // Within `max_message_bytes` (1 MiB) but over the queue's 256 KiB (moto's
            // `MaximumMessageSize`): SQS refuses it. Its raw row would not fit the queue as a
            // dead letter either.
            BadKind::new(
                "too large for the queue",
                BadRow::Payload(300_000),
                "SQS refused the message",
            )
            .no_dead_letter(),
            // Nine header columns set: 11 message attributes with `id` and `key`.
            BadKind::new("too many attributes", BadRow::AllHeaders, "SQS allows 10"),
            BadKind::new(
                "a queue that does not exist",
                BadRow::Route("missing".into()),
                "does not exist",
            ),
        ]
    }

    fn header_columns(&self) -> usize {
        9
    }

    /// `max_message_bytes` = 1 MiB, except under dead-letter: a dead letter carries the raw row
    /// cut to the sink's largest message, and with the default (the queue's 256 KiB) it fits.
    async fn prepare_bad(&self, _client: &tokio_postgres::Client, config: RelayConfig, policy: Policy) -> RelayConfig {
        match policy {
            Policy::DeadLetter => config,
            _ => config.set("sqs", "max_message_bytes", 1024 * 1024),
        }
    }
}
