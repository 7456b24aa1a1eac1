//! What is SNS's own, end to end through `outbox-relay run` against moto in server mode
//! (docs/sink-sns.md; `tests/it/harness/moto_sns.rs`): standard topics, which keep no order (the
//! start warning) and no message group. Routing over FIFO topics with keys, attributes and
//! order, SIGKILLs, exactly-once through FIFO deduplication, moto frozen for 30 s, bad events
//! under each `relay.on_bad_event` and the exactly-once refusal of standard topics are the
//! conformance suite's (`tests/it/conformance.rs`, `harness/conformance/sns.rs`).
//!
//! Each routed topic has an SQS queue of the same name subscribed with raw message delivery,
//! read back once everything arrived (`Moto::collect`).

use std::time::Duration;

use crate::harness::moto::{aws_run_streaming as run_streaming, Moto};
use crate::harness::workload::{ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// Standard topics: delivered (order is not SNS's to keep), with the start warning, and no
/// message group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_topics_warn_at_start_and_deliver_without_a_message_group() {
    let Some(moto) = Moto::start("standard_topics_warn_at_start_and_deliver_without_a_message_group").await else {
        return;
    };
    let prefix = unique_name("sns_std");
    let topic = format!("{prefix}-order");
    moto.create_topic_with_queue(&topic).await;
    let (db, _client, config) = prepared(OutboxSchema::B, "unused:9092").await;
    let section = moto.section();
    let mut pairs: Vec<(&str, &str)> = section.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.push(("fifo", "false"));
    let config = config
        .sink("sns", &pairs)
        .route("(?<routedByValue>.*)", &format!("{prefix}-${{routedByValue}}"));
    let relay = run_streaming(&config).await;
    let log = relay.log_text();
    assert!(
        log.contains("WARN") && log.contains("standard SNS topics do not keep order"),
        "{log}"
    );
    let committed = run_workload(
        &shared_cluster().await.url(&db),
        &Workload::new(OutboxSchema::B, 200, 10, 2),
    )
    .await;
    let records = moto
        .collect(
            std::slice::from_ref(&topic),
            committed.len(),
            Duration::from_secs(120),
            Duration::from_secs(1),
            || relay.log_text(),
        )
        .await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    assert_eq!(check_delivered(&all, &records, |_| topic.clone()), 0);
    assert!(records.iter().all(|r| r.header("sqs:MessageGroupId").is_none()));
    eprintln!("standard topic: {} events, 0 lost, 0 duplicates", all.len());
}
