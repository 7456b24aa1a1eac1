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

/// Issue 44, point 8: a broker that is down when the relay starts (here: a bootstrap address
/// with no listener) is said at once — which sink, which address, that the relay keeps
/// retrying and nothing is lost — before any event waits for it; a SIGTERM while events wait
/// ends the drain after `relay.shutdown_timeout_ms` and exits 1, saying that the slot was not
/// confirmed past what was delivered and the next start replays.
///
/// Then the same with the shipped `relay.shutdown_timeout_ms` (30 s): the drain waits it out
/// whole, then exits 1. One after the other: the slot check compares with WAL positions of the
/// shared cluster, which a concurrent twin would move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_down_at_start_is_said_at_once_and_an_incomplete_drain_exits_non_zero() {
    broker_down_at_start(Some(Duration::from_secs(3))).await;
    broker_down_at_start(None).await;
}

/// `shutdown`: the `relay.shutdown_timeout_ms` set, `None` for the shipped default.
async fn broker_down_at_start(shutdown: Option<Duration>) {
    const SHIPPED_SHUTDOWN: Duration = Duration::from_secs(30);
    let bootstrap = format!("127.0.0.1:{}", free_port());
    let pg = shared_cluster().await;
    let (db, client, config) = prepared_on(pg, "down_at_start", OutboxSchema::B, &bootstrap).await;
    let config = match shutdown {
        Some(t) => config.set("relay", "shutdown_timeout_ms", t.as_millis() as i64),
        None => config,
    };
    let shutdown = shutdown.unwrap_or(SHIPPED_SHUTDOWN);
    let mut relay = RelayProcess::run_streaming(&config).await;
    let started = std::time::Instant::now();
    assert!(
        relay.wait_for_log("is unreachable", Duration::from_secs(5)).await,
        "nothing said within 5 s of streaming while no broker answers:\n{}",
        relay.log_text()
    );
    let said_after = started.elapsed();
    let log = relay.log_text();
    let line = log.lines().find(|l| l.contains("is unreachable")).expect("the line");
    for needle in [
        " WARN ",
        "Kafka is unreachable",
        bootstrap.as_str(),
        "keeps retrying",
        "nothing is lost",
    ] {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }
    assert!(
        !log.contains("has acknowledged nothing"),
        "said before any event waited, not as the 5 s outage notice:\n{log}"
    );
    assert!(said_after < Duration::from_secs(4), "said only after {said_after:?}");

    // Events handed over that can never be acknowledged, then SIGTERM.
    run_workload(&pg.url(&db), &Workload::new(OutboxSchema::B, 5, 1, 1)).await;
    assert!(
        relay
            .wait_for_log("has acknowledged nothing", Duration::from_secs(20))
            .await,
        "the events never waited:\n{}",
        relay.log_text()
    );
    let asked = std::time::Instant::now();
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(shutdown + Duration::from_secs(30))
        .await
        .expect("exited after SIGTERM");
    let log = relay.log_text();
    assert_eq!(status.code(), Some(1), "an incomplete drain exits non-zero:\n{log}");
    assert!(asked.elapsed() >= shutdown, "waited relay.shutdown_timeout_ms first");
    let last = log
        .lines()
        .rev()
        .find(|l| l.contains(" ERROR "))
        .expect("an ERROR line");
    for needle in [
        "shutdown incomplete",
        "Nothing is lost",
        "confirmed only up to",
        "next start replays",
    ] {
        assert!(last.contains(needle), "{needle:?} missing from: {last}");
    }
    // Every event handed over is still in the slot: the next start is sent it again. (A WAL
    // position taken before the workload is no bound: other tests write to the shared
    // cluster, and an idle relay rightly confirms their WAL before its own events arrive.)
    let held = inserts_held_by_slot(&client, &config.slot, &config.publication).await;
    assert_eq!(held, 5, "the slot moved past undelivered events: it holds {held} of 5");
}
