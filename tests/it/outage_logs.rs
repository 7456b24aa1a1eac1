//! Logs an operator can act on during an outage: a broker outage and a PostgreSQL restart,
//! with the shipped defaults, leave a bounded number of WARN/ERROR lines, each saying something
//! new — the relay's own account of what waits (docs/operations.md, "During an outage") rather
//! than a line per failed attempt — and lose nothing. `OUTBOX_RELAY_LONG_TESTS=1` runs the
//! 6-minute broker outage (longer than librdkafka's 5-minute `message.timeout.ms`, so a session
//! also fails and replays during it).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::fault_support::long_tests;
use crate::harness::workload::{Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// The WARN and ERROR lines of a relay log, without their timestamps.
fn loud_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest).trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_and_a_postgres_restart_log_a_summary_not_a_flood() {
    let broker_down = if long_tests() {
        Duration::from_secs(360)
    } else {
        Duration::from_secs(40)
    };
    let Some(pg) = PgCluster::start_dedicated(&[]).await else {
        return;
    };
    let kafka = MockKafka::new(3);
    kafka.create_topic("order", 3);
    let (db, _client, config) = prepared_on(&pg, "outage_logs", OutboxSchema::B, &kafka.bootstrap_servers()).await;
    // Shipped defaults throughout: message.timeout.ms, backoff, status interval.
    let relay = RelayProcess::run_streaming(&config).await;

    // 50 events/s for the whole broker outage and 10 s around it.
    let url = pg.url(&db);
    let mut w = Workload::new(OutboxSchema::B, (broker_down.as_secs() as usize + 10) * 50, 30, 1);
    w.pause = Duration::from_millis(20);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    kafka.all_brokers_down();
    tokio::time::sleep(broker_down).await;
    kafka.all_brokers_up();
    let first = load.await.expect("workload");
    let first_all: Vec<ExpectedEvent> = first.all().cloned().collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        first_all.len(),
        Duration::from_secs(400),
    )
    .await;
    let dups = check_delivered(&first_all, &records, |_| "order".to_owned());
    check_order(&first, &records);

    // PostgreSQL away for 20 s: the relay's reconnects back off 0.5, 1, 2, 4, 8 s.
    pg.stop();
    tokio::time::sleep(Duration::from_secs(20)).await;
    pg.start().await;
    let url = pg.url(&db);
    let second = run_workload(&url, &Workload::new(OutboxSchema::B, 50, 5, 1)).await;
    let mut committed = Committed::default();
    for c in [&first, &second] {
        for (agg, events) in &c.by_aggregate {
            committed
                .by_aggregate
                .entry(agg.clone())
                .or_default()
                .extend(events.iter().cloned());
        }
    }
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(120),
    )
    .await;
    check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);

    let log = relay.log_text();
    let loud = loud_lines(&log);
    eprintln!(
        "outage of {broker_down:?} + PostgreSQL down 20 s: {} events, {dups} duplicates, {} WARN/ERROR lines:\n{}",
        all.len(),
        loud.len(),
        loud.join("\n")
    );
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &loud {
        *seen.entry(l.as_str()).or_default() += 1;
    }
    let repeated: Vec<&&str> = seen.iter().filter(|(_, n)| **n > 1).map(|(l, _)| l).collect();
    assert!(repeated.is_empty(), "lines repeated word for word: {repeated:?}");
    let bound = if long_tests() { 36 } else { 20 };
    assert!(
        loud.len() <= bound,
        "{} WARN/ERROR lines (bound {bound}):\n{log}",
        loud.len()
    );
    assert!(
        !log.contains("ERROR librdkafka") && !log.contains("WARN librdkafka"),
        "{log}"
    );
    let notice = loud
        .iter()
        .find(|l| l.contains("has acknowledged nothing"))
        .unwrap_or_else(|| panic!("no outage notice:\n{log}"));
    assert!(
        notice.contains("events (") && notice.contains("Nothing is lost"),
        "{notice}"
    );
    assert!(
        loud.iter()
            .any(|l| l.contains("still acknowledges nothing") && l.contains("events (")),
        "no summary with the waiting count:\n{log}"
    );
    assert!(log.contains("acknowledges again after"), "{log}");
    assert!(!log.contains("changed shape"), "{log}");
    assert!(
        log.contains("reconnecting"),
        "the PostgreSQL restart was not noticed:\n{log}"
    );
}
