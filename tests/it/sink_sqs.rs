//! What is SQS's own, end to end through `outbox-relay run` against moto in server mode
//! (docs/sink-sqs.md; `tests/it/harness/moto.rs`): standard queues, which keep no order (the
//! start warning) and no message group. Routing, keys, attributes and order into FIFO queues,
//! SIGKILLs, exactly-once through FIFO deduplication, moto frozen for 30 s, bad events under each
//! `relay.on_bad_event` and the exactly-once refusal of standard queues are the conformance
//! suite's (`tests/it/conformance.rs`, `harness/conformance/sqs.rs`).
//!
//! The test runs a moto of its own: moto keeps its state in memory and deduplicates only
//! against messages still queued, so the queue is read once everything arrived
//! (`Moto::collect`), never while the relay may still send.

use std::time::Duration;

use crate::harness::moto::{aws_run_streaming as run_streaming, Moto};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// Standard queues: delivered (order is not SQS's to keep), with the start warning, and no
/// message group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_queues_warn_at_start_and_deliver_without_a_message_group() {
    let Some(moto) = Moto::start("standard_queues_warn_at_start_and_deliver_without_a_message_group").await else {
        return;
    };
    let prefix = unique_name("sqs_std");
    let queue = format!("{prefix}-order");
    moto.create_queue(&queue).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push(("fifo", "false"));
    let config = config
        .sink("sqs", &pairs)
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let relay = run_streaming(&config).await;
    let log = relay.log_text();
    assert!(
        log.contains("WARN") && log.contains("standard SQS queues do not keep order"),
        "{log}"
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::B, 200, 10, 2),
    )
    .await;
    let records = moto
        .collect(
            std::slice::from_ref(&queue),
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let dups = check_delivered(&all, &records, |_| queue.clone());
    assert_eq!(dups, 0);
    assert!(records.iter().all(|r| r.header("sqs:MessageGroupId").is_none()));
    eprintln!("standard queue: {} events, 0 lost, 0 duplicates", all.len());
}
