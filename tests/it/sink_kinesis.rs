//! What is Kinesis's own, end to end through `outbox-relay run` against moto in server mode
//! (docs/sink-kinesis.md; `tests/it/harness/moto_kinesis.rs`): `setup` creating `[kinesis]
//! streams`, and the payload format with records near the 1 MiB limit (batches bounded by
//! 5 MiB). Routing over multi-shard streams (keys, envelope, per-aggregate order within a
//! shard), SIGKILLs, moto frozen for 30 s, bad events under each `relay.on_bad_event` and the
//! exactly-once refusal are the conformance suite's (`tests/it/conformance.rs`,
//! `harness/conformance/kinesis.rs`).
//!
//! The test runs a moto of its own. Kinesis streams are logs: reading them back consumes
//! nothing. moto never fails a record on its own (no shard throughput limits): the per-record
//! mapping is tested on constructed answers in `src/sink/aws/kinesis/exchange.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::moto::{aws_run_streaming as run_relay_streaming, Moto, AWS_ENV};
use crate::harness::relay_process::run_cmd_with;
use crate::harness::workload::OutboxSchema;
use crate::harness::*;

/// `config` publishing to Kinesis on `moto`, with `extra` `[kinesis]` keys.
fn to_kinesis(config: RelayConfig, moto: &Moto, extra: &[(&str, &str)]) -> RelayConfig {
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.extend_from_slice(extra);
    config.sink("kinesis", &pairs)
}

/// `setup` creates `[kinesis] streams` (on-demand) and says so; with `format = "payload"` a
/// record's data is the payload alone, and events near the 1 MiB limit go out in calls that
/// stay under Kinesis's 5 MiB per `PutRecords` (moto refuses a larger call).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_creates_the_streams_and_large_payloads_go_alone() {
    let Some(moto) = Moto::start("setup_creates_the_streams_and_large_payloads_go_alone").await else {
        return;
    };
    let prefix = unique_name("kin_setup");
    let stream = format!("{prefix}-big");
    let (db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = to_kinesis(config, &moto, &[("format", "payload")])
        .set("kinesis", "streams", vec![stream.clone()])
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let out = run_cmd_with(&["setup"], &config, &AWS_ENV, Duration::from_secs(120)).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("Kinesis stream {stream} created (on-demand): ACTIVE")),
        "{said}"
    );
    let again = run_cmd_with(&["setup"], &config, &AWS_ENV, Duration::from_secs(120)).await;
    let said = String::from_utf8_lossy(&again.stdout).into_owned() + &String::from_utf8_lossy(&again.stderr);
    assert!(
        again.status.success() && said.contains(&format!("Kinesis stream {stream} exists")),
        "{said}"
    );
    let relay = run_relay_streaming(&config).await;
    // 12 events of ~900 KB, each of its own aggregate, committed at once: 10.8 MB that no single
    // call may carry.
    let mut want = BTreeMap::new();
    client.simple_query("BEGIN").await.unwrap();
    for i in 0..12 {
        let payload = format!("{{\"n\": {i}, \"blob\": \"{}\"}}", "x".repeat(900_000));
        let row = client
            .query_one(
                "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'big', \
                 $1::text::jsonb) RETURNING aggregate_id::text, payload::text",
                &[&payload],
            )
            .await
            .unwrap();
        want.insert(row.get::<_, String>(0), row.get::<_, String>(1));
    }
    client.simple_query("COMMIT").await.unwrap();
    let records = moto
        .read_streams(
            std::slice::from_ref(&stream),
            want.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    assert_eq!(records.len(), want.len(), "each once");
    for r in &records {
        let key = r.key_str().expect("the partition key").to_owned();
        assert_eq!(
            r.payload_str(),
            want.get(&key).map(String::as_str),
            "the data is the payload alone"
        );
        assert!(r.header("id").is_none(), "no envelope");
    }
    let _ = db;
}
