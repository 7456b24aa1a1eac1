//! Amazon Kinesis Data Streams for the conformance suite: streams `<prefix>-<name>` of 3 shards
//! on a moto of the test's own (`moto_kinesis.rs`), frozen for the outage (SIGSTOP). A stream is
//! a log: reading it back consumes nothing, so it is read whenever the scenario likes.
//!
//! moto 5.1.4 numbers a shard's records without a lock, so two `PutRecords` calls it serves at
//! the same moment would give two records one sequence number, the second overwriting the first
//! while both calls answer "stored" — which is how this suite once lost an event moto had
//! acknowledged (docs/sink-kinesis.md, "What moto does not reproduce"). Real Kinesis does not.
//! `scripts/ensure-moto.sh` serialises moto's numbering, so the relay runs here with its shipped
//! settings (`max_requests` 8 calls at once) and two relays may write one stream: a record
//! missing is the relay's.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use super::sqs::aws_env;
use super::{BadKind, BadRow, Capabilities, Received, RelayConfig, Server, SinkHarness, Variant};
use crate::harness::moto::Moto;
use crate::harness::util::unique_name;

pub struct Kinesis {
    moto: Moto,
    prefix: String,
}

impl SinkHarness for Kinesis {
    const NAME: &'static str = "Kinesis";

    fn capabilities() -> Capabilities {
        Capabilities {
            exactly_once: None,
            timestamps: false,
            workload: (800, 40),
            per_kill: 150,
            two_writers: true,
            server_per_arm: true,
        }
    }

    async fn start(test: &str, _server: Server) -> Option<Kinesis> {
        Some(Kinesis {
            moto: Moto::start(test).await?,
            prefix: unique_name("kin_cf"),
        })
    }

    async fn create(&self, names: &[&str]) {
        for name in names {
            self.moto.create_stream(&self.destination(name), 3).await;
        }
    }

    fn destination(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    fn configure(&self, config: RelayConfig, regex: &str, name: &str) -> RelayConfig {
        let section = self.moto.section();
        let pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
        config.sink("kinesis", &pairs).route(regex, &self.destination(name))
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        aws_env()
    }

    async fn read(&self, names: &[&str], want: usize, timeout: Duration) -> Vec<Received> {
        let names: Vec<String> = names.iter().map(|n| self.destination(n)).collect();
        super::poll(want, timeout, Duration::from_secs(1), || async {
            let mut all = Vec::new();
            for name in &names {
                all.extend(self.moto.read_stream(name).await);
            }
            all
        })
        .await
    }

    async fn take_down(&mut self) {
        self.moto.freeze();
    }

    async fn bring_back(&mut self) {
        self.moto.thaw();
    }

    /// 2 s attempts instead of 10.
    fn short_timeouts(&self, config: RelayConfig) -> RelayConfig {
        config.set("kinesis", "timeout_ms", 2000)
    }

    /// The relay's outage summary always; the batcher's retry line when an attempt failed past
    /// the SDK's own retries (with the shipped 10 s attempts, the third attempt may be the one
    /// moto answers after the thaw).
    fn check_outage_log(&self, log: &str, variant: Variant) {
        assert!(
            log.contains("has acknowledged nothing for")
                && (variant == Variant::ShippedDefaults || log.contains("Kinesis did not store a batch; retrying")),
            "Kinesis: the outage should show in the log:\n{log}"
        );
    }

    /// Every record of an aggregate in one shard, under its partition key (the aggregate id).
    fn check_records(&self, records: &[Received]) {
        let mut shard_of: BTreeMap<(String, String), String> = BTreeMap::new();
        for r in records {
            let key = r.key_str().expect("key").to_owned();
            assert_eq!(r.header("kinesis:PartitionKey"), Some(key.as_bytes()), "{r:?}");
            let shard = String::from_utf8_lossy(r.header("kinesis:ShardId").unwrap()).into_owned();
            let prev = shard_of.entry((r.topic.clone(), key)).or_insert_with(|| shard.clone());
            assert_eq!(*prev, shard, "an aggregate's records in one shard: {r:?}");
        }
    }

    /// The aggregates spread over the shards; the envelope: `id`, no headers configured.
    fn check_workload(&self, records: &[Received], _log: &str) {
        let streams: HashSet<&str> = records.iter().map(|r| r.topic.as_str()).collect();
        let shards: HashSet<(&str, i32)> = records.iter().map(|r| (r.topic.as_str(), r.partition)).collect();
        assert!(
            shards.len() > streams.len(),
            "the aggregates spread over the shards: {shards:?}"
        );
        let names: Vec<&str> = records[0]
            .headers
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !n.starts_with("kinesis:"))
            .collect();
        assert_eq!(
            names,
            ["id"],
            "the envelope: id, no headers configured: {:?}",
            records[0]
        );
    }

    fn exactly_once_refusal(&self, config: RelayConfig) -> Option<(RelayConfig, &'static [&'static str])> {
        Some((config, &["Kinesis Data Streams has no deduplication", "at-least-once"]))
    }

    fn bad_kinds() -> Vec<BadKind> {
        vec![
            // Over Kinesis's 1 MiB per record (data and partition key): refused before sending.
            BadKind::new("too large", BadRow::Payload(1_100_000), "max_record_bytes"),
            // Kinesis answers ResourceNotFoundException.
            BadKind::new(
                "a stream that does not exist",
                BadRow::Route("missing".into()),
                "does not exist",
            ),
        ]
    }

    /// The oversized raw row cut to fit a record.
    fn check_dead_letter(&self, letter: &Received, kind: &BadKind) {
        if matches!(kind.row, BadRow::Payload(_)) {
            assert!(
                letter.header("outbox-relay-truncated-from").is_some()
                    && letter.payload.as_ref().is_some_and(|p| p.len() < 1024 * 1024),
                "the raw row cut to fit a record: {:?}",
                letter.headers
            );
        }
    }
}
