//! Several instances per slot, reconnects, slot health, heartbeats, and the metrics and health
//! endpoints — against real PostgreSQL and librdkafka's mock Kafka cluster.
//!
//! "Under load" means a workload commits concurrently with the fault. Tests that restart the
//! server or tune it (`max_slot_wal_keep_size`, `wal_sender_timeout`) get a dedicated cluster.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use crate::harness::process::send_signal;
use crate::harness::scrape::{http_get, latency_window, with_http, Metrics};
use crate::harness::workload::{event_type, insert_multi_row, new_uuid, payload_json, AGGREGATE_TYPE};
use crate::harness::*;

// Metric names, as src/ops/metrics.rs defines them (the test binary cannot import the crate's
// private constants without depending on the library's internals; the names are the contract).
const RECEIVED: &str = "outbox_relay_events_received_total";
const PUBLISHED: &str = "outbox_relay_events_published_total";
const FAILED: &str = "outbox_relay_events_failed_total";
const IN_FLIGHT: &str = "outbox_relay_in_flight_events";
const IN_FLIGHT_BYTES: &str = "outbox_relay_in_flight_bytes";
const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";
const BEHIND: &str = "outbox_relay_seconds_behind_source";
const RECEIVED_LSN: &str = "outbox_relay_received_lsn";
const FLUSHED_LSN: &str = "outbox_relay_flushed_lsn";
const RETAINED: &str = "outbox_relay_slot_retained_wal_bytes";
const RECONNECTS: &str = "outbox_relay_reconnects_total";
const ACTIVE: &str = "outbox_relay_active";

/// Gives the config its own `[http] listen` address; returns it.
/// Scrapes until `cond` holds (30 s at most); returns the last scrape.
async fn scrape_until(addr: &str, what: &str, cond: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(m) = Metrics::scrape(addr).await {
            if cond(&m) {
                return m;
            }
            last = Some(m);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "metrics never showed {what}; last scrape:\n{}",
        last.map(|m| m.text).unwrap_or_default()
    );
}

async fn wait_log(relay: &RelayProcess, needle: &str, within: Duration) {
    assert!(
        relay.wait_for_log(needle, within).await,
        "no {needle:?} in the relay log:\n{}",
        relay.log_text()
    );
}

/// The walsender pid holding `slot`, once one does (and differs from `not`).
async fn wait_holder(client: &Client, slot: &str, not: Option<i32>) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(pid) = slot_row(client, slot).await.and_then(|r| r.active_pid) {
            if Some(pid) != not {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no new walsender took slot {slot} within 30 s");
}

// ------------------------------------------------------------------ a workload that survives restarts

/// Commits schema-B events (client-chosen uuids) from several tasks until stopped, riding out
/// server restarts and terminated connections: a commit whose outcome was lost is looked up by
/// its id after reconnecting, and retried only if it is not there. So `finish` returns exactly
/// what was committed, in per-aggregate commit order.
struct ResilientLoad {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<ExpectedEvent>>>,
}

impl ResilientLoad {
    fn start(url: &str, aggregates: usize, concurrency: usize, pause: Duration) -> ResilientLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let aggs: Vec<String> = (0..aggregates).map(|_| new_uuid()).collect();
        let tasks = (0..concurrency)
            .map(|k| {
                let mine: Vec<String> = aggs.iter().skip(k).step_by(concurrency).cloned().collect();
                let (url, stop) = (url.to_string(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut conn = None;
                    let mut done = Vec::new();
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for agg in &mine {
                            done.push(commit_surely(&mut conn, &url, agg, seq).await);
                        }
                        seq += 1;
                        tokio::time::sleep(pause).await;
                    }
                    done
                })
            })
            .collect();
        ResilientLoad { stop, tasks }
    }

    async fn finish(self) -> Committed {
        self.stop.store(true, Ordering::Relaxed);
        let mut committed = Committed::default();
        for t in self.tasks {
            for ev in t.await.expect("workload task panicked") {
                committed
                    .by_aggregate
                    .entry(ev.aggregate_id.clone())
                    .or_default()
                    .push(ev);
            }
        }
        committed
    }
}

async fn connect(url: &str) -> Option<Client> {
    let (client, conn) = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(client)
}

const RETURNING: &str = "id::text, aggregate_id::text, event_type::text, payload::text";

fn expected(row: &tokio_postgres::Row, seq: u64) -> ExpectedEvent {
    ExpectedEvent {
        id: row.get(0),
        aggregate_id: row.get(1),
        event_type: row.get(2),
        payload_text: row.get(3),
        seq,
    }
}

/// Commits one event (with an order row) and returns it; retries across outages (bounded).
async fn commit_surely(conn: &mut Option<Client>, url: &str, agg: &str, seq: u64) -> ExpectedEvent {
    let id = new_uuid();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "could not commit event {id} for 120 s");
        if conn.as_ref().is_none_or(Client::is_closed) {
            *conn = connect(url).await;
        }
        let Some(client) = conn.as_mut() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let attempt = async {
            let tx = client.transaction().await?;
            tx.execute(
                "INSERT INTO orders (id, customer_id, total_cents, status) VALUES ($1::text::uuid, $2::text::uuid, 1, 'x')",
                &[&new_uuid(), &agg],
            )
            .await?;
            let row = tx
                .query_one(
                    &format!(
                        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
                         VALUES ($1::text::uuid, '{AGGREGATE_TYPE}', $2, $3, $4::text::jsonb) RETURNING {RETURNING}"
                    ),
                    &[&id, &agg, &event_type(seq), &payload_json(agg, seq)],
                )
                .await?;
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(expected(&row, seq))
        };
        match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(ev)) => return ev,
            _ => {
                *conn = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                // The outcome is unknown: look the event up before retrying it.
                if let Some(c) = connect(url).await {
                    let sql = format!("SELECT {RETURNING} FROM outbox WHERE id = $1::text::uuid");
                    match c.query_opt(&sql, &[&id]).await {
                        Ok(Some(row)) => return expected(&row, seq),
                        Ok(None) => *conn = Some(c),
                        Err(_) => {}
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ standby and takeover

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_takes_over_within_ten_seconds_of_a_sigkill_under_load() {
    let kafka = MockKafka::new(3);
    let (db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config.route(PREFIX_REGEX, "${routedByValue}");
    let (cfg_a, addr_a) = with_http(&config);
    let (cfg_b, addr_b) = with_http(&config);

    let a = RelayProcess::run(&cfg_a);
    wait_log(&a, "streaming started", Duration::from_secs(30)).await;
    let b = RelayProcess::run(&cfg_b);
    wait_log(&b, "standing by", Duration::from_secs(30)).await;
    let holder = slot_row(&client, &config.slot)
        .await
        .and_then(|r| r.active_pid)
        .expect("A holds the slot");
    assert!(
        b.log_text().contains(&format!("walsender pid {holder}")),
        "the standby names the holder:\n{}",
        b.log_text()
    );
    scrape_until(&addr_a, "A active", |m| m.get(ACTIVE, &[]) == Some(1.0)).await;
    scrape_until(&addr_b, "B standing by", |m| m.get(ACTIVE, &[]) == Some(0.0)).await;
    let ready = wait_until(Duration::from_secs(15), Duration::from_millis(200), || async {
        http_get(&addr_b, "/readyz").await.is_some_and(|(code, _)| code == 200)
    })
    .await;
    assert!(
        ready,
        "a standby with a healthy slot is ready: {:?}",
        http_get(&addr_b, "/readyz").await
    );

    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, 3_000, 30, 4);
    w.pause = Duration::from_millis(2);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(a.sigkill());
    let killed = Instant::now();
    wait_log(&b, "streaming started", Duration::from_secs(10)).await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(10), "takeover took {took:?}");
    drop(a);

    let committed = load.await.expect("workload");
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
    let m = scrape_until(&addr_b, "B active", |m| m.get(ACTIVE, &[]) == Some(1.0)).await;
    assert_eq!(m.value(RECONNECTS, &[]), 0.0, "standing by is not reconnecting");
    eprintln!("takeover after SIGKILL: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover_after_terminates_a_frozen_holder_but_never_a_healthy_one() {
    // wal_sender_timeout far above takeover_after_ms: only the standby can free the slot in time.
    let Some(pg) = PgCluster::start_dedicated(&[("wal_sender_timeout", "60s")]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared_on(&pg, "ha", OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config
        .route(PREFIX_REGEX, "${routedByValue}")
        .status_interval_ms(300)
        .set("relay", "takeover_after_ms", 1500)
        .set("relay", "standby_poll_ms", 300);
    let a = RelayProcess::run(&config);
    wait_log(&a, "streaming started", Duration::from_secs(30)).await;
    let b = RelayProcess::run(&config);
    wait_log(&b, "standing by", Duration::from_secs(30)).await;
    // A healthy holder is left alone through many polls.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.log_text().contains("terminated the slot holder"), "{}", b.log_text());

    assert!(a.sigstop());
    let frozen = Instant::now();
    wait_log(&b, "streaming started", Duration::from_secs(15)).await;
    let took = frozen.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "takeover of a frozen holder took {took:?}"
    );
    assert!(
        b.log_text().contains("terminated the slot holder's walsender"),
        "{}",
        b.log_text()
    );

    let agg = new_uuid();
    let events = insert_multi_row(&client, OutboxSchema::A, &agg, 0, 10).await;
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        events.len(),
        Duration::from_secs(60),
    )
    .await;
    check_delivered(&events, &records, |_| "order".to_owned());

    // Thawed, the old holder finds its connection gone and becomes the standby.
    assert!(a.sigcont());
    wait_log(&a, "standing by", Duration::from_secs(60)).await;
    eprintln!("takeover of a frozen holder: {took:?}");
}

// ------------------------------------------------------------------ reconnects

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn walsender_terminations_and_a_server_restart_lose_nothing_and_count_reconnects() {
    let Some(pg) = PgCluster::start_dedicated(&[]).await else {
        return;
    };
    let kafka = MockKafka::new(3);
    let (db, client, config) = prepared_on(&pg, "ha", OutboxSchema::B, &kafka.bootstrap_servers()).await;
    let (config, addr) = with_http(&config.set("relay", "reconnect_backoff_initial_ms", 100).set(
        "relay",
        "reconnect_backoff_max_ms",
        1000,
    ));
    let relay = RelayProcess::run(&config);
    wait_log(&relay, "streaming started", Duration::from_secs(30)).await;
    let load = ResilientLoad::start(&pg.url(&db), 16, 4, Duration::from_millis(5));

    let mut previous = None;
    for _ in 0..5 {
        let pid = wait_holder(&client, &config.slot, previous).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let row = client
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .expect("terminate");
        assert!(row.get::<_, bool>(0), "walsender {pid} was not terminated");
        previous = Some(pid);
    }
    wait_holder(&client, &config.slot, previous).await;
    drop(client);
    pg.restart().await;
    let client = pg.client(&db).await;
    wait_holder(&client, &config.slot, None).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let committed = load.finish().await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    assert!(
        all.len() > 100,
        "the load ran through the faults ({} events)",
        all.len()
    );
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(120),
    )
    .await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    let m = scrape_until(&addr, "six reconnects", |m| m.value(RECONNECTS, &[]) >= 6.0).await;
    let reconnects = m.value(RECONNECTS, &[]);
    assert!(
        relay.log_text().matches("reconnecting").count() >= 6,
        "{}",
        relay.log_text()
    );
    let m = scrape_until(&addr, "streaming again", |m| m.get(ACTIVE, &[]) == Some(1.0)).await;
    assert!(
        m.value(PUBLISHED, &[("topic", "order")]) >= all.len() as f64,
        "{}",
        m.text
    );
    eprintln!("{} events, {dups} duplicates, {reconnects} reconnects", all.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_walsender_is_detected_and_replaced() {
    // A frozen walsender behaves like a cut network: no error, no EOF, no data.
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config
        .route(PREFIX_REGEX, "${routedByValue}")
        .status_interval_ms(300)
        .set("relay", "receive_timeout_ms", 3000)
        .set("relay", "standby_poll_ms", 300);
    let relay = RelayProcess::run(&config);
    wait_log(&relay, "streaming started", Duration::from_secs(30)).await;
    let walsender = wait_holder(&client, &config.slot, None).await;
    if !send_signal(walsender as u32, "STOP") {
        crate::harness::needs::missing(
            crate::harness::needs::SIGNALS_TO_POSTGRES,
            "a_silent_walsender_is_detected_and_replaced",
            "SIGSTOP to the walsender failed",
        );
        return;
    }
    let detected = relay
        .wait_for_log("waiting for any message from the walsender", Duration::from_secs(20))
        .await;
    // Reconnecting, the relay finds its old walsender still holding the slot and asks the server
    // to end it; a frozen process acts on that once thawed.
    let ended = detected && relay.wait_for_log("previous walsender", Duration::from_secs(20)).await;
    assert!(send_signal(walsender as u32, "CONT"));
    assert!(detected, "the silence was not detected:\n{}", relay.log_text());
    assert!(ended, "the old walsender was not ended:\n{}", relay.log_text());
    wait_holder(&client, &config.slot, Some(walsender)).await;
    let events = insert_multi_row(&client, OutboxSchema::A, &new_uuid(), 0, 5).await;
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        events.len(),
        Duration::from_secs(60),
    )
    .await;
    check_delivered(&events, &records, |_| "order".to_owned());
}

// ------------------------------------------------------------------ slot health

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_invalidated_slot_stops_the_relay_with_the_cause_and_recovery_steps() {
    let Some(pg) = PgCluster::start_dedicated(&[("max_slot_wal_keep_size", "1MB")]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared_on(&pg, "ha", OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config.route(PREFIX_REGEX, "${routedByValue}").status_interval_ms(500);
    let mut relay = RelayProcess::run(&config);
    wait_log(&relay, "streaming started", Duration::from_secs(30)).await;
    let events = insert_multi_row(&client, OutboxSchema::A, &new_uuid(), 0, 3).await;
    collect(
        &kafka.bootstrap_servers(),
        &["order"],
        events.len(),
        Duration::from_secs(60),
    )
    .await;

    assert!(relay.sigstop());
    let lost = invalidate_slot(&client, &config.slot, Duration::from_secs(90)).await;
    assert!(relay.sigcont());
    assert!(lost, "the slot was not invalidated");

    let status = relay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the resumed relay exits");
    assert_eq!(status.code(), Some(1), "exit status; log:\n{}", relay.log_text());
    let check_message = |log: &str| {
        for needle in [
            "is invalidated",
            "wal_status = lost",
            "never recreates",
            "teardown --yes",
            "setup",
        ] {
            assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
        }
    };
    check_message(&relay.log_text());

    let mut again = RelayProcess::run(&config);
    let status = again
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("a restarted relay exits at once");
    assert_eq!(status.code(), Some(1));
    check_message(&again.log_text());
    assert!(!again.log_text().contains("streaming started"), "{}", again.log_text());

    let out = run_cmd(&["status", "--json"], &config).await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(report["health"]["verdict"], "critical", "{report:#}");
    assert_eq!(
        slot_row(&client, &config.slot)
            .await
            .and_then(|s| s.wal_status)
            .as_deref(),
        Some("lost"),
        "the slot was recreated or touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_slot_stops_the_relay_without_creating_one() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config.slot(&unique_name("never_created"));
    let mut relay = RelayProcess::run(&config);
    let status = relay.wait_exit(Duration::from_secs(30)).await.expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(relay.log_text().contains("does not exist"), "{}", relay.log_text());
    assert!(slot_row(&client, &config.slot).await.is_none(), "a slot was created");
}

/// Slot names are cluster-wide: a slot of the configured name in another database is not this
/// database's slot. `status` and `run` ask the same query, so both say it is missing; `setup`
/// (which could not create one of that name) names the database that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_of_another_database_is_missing_for_status_and_run_alike() {
    let kafka = MockKafka::new(1);
    let (_db, _client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let pg = shared_cluster().await;
    let other_db = unique_name("other_db");
    pg.create_database(&other_db).await;
    let other = pg.client(&other_db).await;
    let slot = unique_name("elsewhere");
    other
        .execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&slot])
        .await
        .expect("slot in the other database");
    let config = config.slot(&slot);

    let out = run_cmd(&["status", "--json"], &config).await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status JSON: {e}; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["slot"]["exists"], false, "{report:#}");

    let mut relay = RelayProcess::run(&config);
    let status = relay.wait_exit(Duration::from_secs(30)).await.expect("exits");
    assert_eq!(status.code(), Some(1), "{}", relay.log_text());
    assert!(
        relay.log_text().contains("does not exist in this database"),
        "{}",
        relay.log_text()
    );
    assert!(!relay.log_text().contains("streaming started"), "{}", relay.log_text());

    let out = run_cmd(&["setup"], &config).await;
    assert!(!out.status.success(), "setup must not claim the other database's slot");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("belongs to database {other_db}")), "{stderr}");

    other
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop the other database's slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_are_written_while_streaming_and_the_slot_moves_past_them() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config.set("relay", "heartbeat_interval_ms", 200);
    let relay = RelayProcess::run(&config);
    wait_log(&relay, "streaming started", Duration::from_secs(30)).await;
    let before = current_flush_lsn(&client).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = current_flush_lsn(&client).await;
    let row = client
        .query_one(
            "SELECT count(*), max(end_lsn)::text FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
              WHERE resource_manager = 'LogicalMessage' AND description LIKE '%outbox-relay-heartbeat%'",
            &[&format_lsn(before), &format_lsn(after)],
        )
        .await
        .expect("pg_walinspect");
    let count: i64 = row.get(0);
    assert!(count >= 3, "only {count} heartbeats in 2 s at a 200 ms interval");
    let last = parse_lsn(row.get::<_, Option<&str>>(1).expect("a heartbeat")).expect("lsn");
    let passed = wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let (client, slot) = (&client, config.slot.clone());
        async move { confirmed_flush_lsn(client, &slot).await.unwrap_or(0) >= last }
    })
    .await;
    assert!(
        passed,
        "the slot never confirmed past the heartbeat at {}",
        format_lsn(last)
    );
}

async fn current_flush_lsn(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
        .await
        .expect("flush lsn");
    parse_lsn(row.get(0)).expect("lsn")
}

// ------------------------------------------------------------------ metrics and health endpoints

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_counters_match_the_events_sent() {
    let kafka = MockKafka::new(1);
    let (db, _client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let (config, addr) = with_http(
        &config
            .status_interval_ms(200)
            .set("relay", "slot_check_interval_ms", 500),
    );
    let relay = RelayProcess::run(&config);
    wait_log(&relay, "streaming started", Duration::from_secs(30)).await;

    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 400, 20, 4)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let mut per_topic: BTreeMap<String, f64> = BTreeMap::new();
    for e in &all {
        *per_topic.entry(e.event_type.clone()).or_default() += 1.0;
    }
    let topics: Vec<&str> = per_topic.keys().map(String::as_str).collect();
    let records = collect(&kafka.bootstrap_servers(), &topics, all.len(), Duration::from_secs(60)).await;
    assert_eq!(
        check_delivered(&all, &records, |e| e.event_type.clone()),
        0,
        "no duplicates in a clean run"
    );

    let m = scrape_until(&addr, "every event published and confirmed", |m| {
        m.sum(PUBLISHED) == all.len() as f64 && m.get(IN_FLIGHT, &[]) == Some(0.0) && m.get(BEHIND, &[]) == Some(0.0)
    })
    .await;
    assert_eq!(m.by_label(RECEIVED, "topic"), per_topic, "received by topic");
    assert_eq!(m.by_label(PUBLISHED, "topic"), per_topic, "published by topic");
    assert_eq!(m.sum(FAILED), 0.0);
    let n = all.len() as f64;
    assert_eq!(
        m.get(&format!("{COMMIT_TO_ACK}_count"), &[]),
        Some(n),
        "one latency sample per event"
    );
    assert_eq!(m.get(&format!("{COMMIT_TO_ACK}_bucket"), &[("le", "+Inf")]), Some(n));
    assert!(m.value(&format!("{COMMIT_TO_ACK}_bucket"), &[("le", "0.001")]) <= n);
    assert!(m.value(&format!("{COMMIT_TO_ACK}_sum"), &[]) > 0.0);
    assert_eq!(m.types.get(COMMIT_TO_ACK).map(String::as_str), Some("histogram"));
    assert_eq!(m.types.get(PUBLISHED).map(String::as_str), Some("counter"));
    assert_eq!(m.get(IN_FLIGHT_BYTES, &[]), Some(0.0));
    assert_eq!(m.get(ACTIVE, &[]), Some(1.0));
    assert_eq!(m.get(RECONNECTS, &[]), Some(0.0));
    let (received, flushed) = (m.value(RECEIVED_LSN, &[]), m.value(FLUSHED_LSN, &[]));
    assert!(
        flushed > 0.0 && received >= flushed,
        "received {received} flushed {flushed}"
    );
    let m = scrape_until(&addr, "retained WAL", |m| m.get(RETAINED, &[]).is_some()).await;
    assert!(m.value(RETAINED, &[]) >= 0.0);
    // What the Grafana dashboard and the alert rules query is what a running relay exports —
    // but for features this run does not use (those are checked against src/ops/metrics.rs only).
    let not_in_this_run = [
        ("outbox_relay_bad_events_total", "no bad row"),
        ("outbox_relay_slot_failover_ready", "PostgreSQL 17+ only"),
        ("outbox_relay_pending_rows", "poll mode"),
        ("outbox_relay_oldest_pending_age_seconds", "poll mode"),
        ("outbox_relay_retention_", "[retention] not configured"),
    ];
    let queried = crate::deploy_docs::queried_metrics();
    let mut checked = 0;
    for metric in &queried {
        if not_in_this_run.iter().any(|(prefix, _)| metric.starts_with(prefix)) {
            continue;
        }
        assert!(
            m.types.contains_key(metric),
            "the dashboard or an alert queries {metric}, which the running relay does not export:\n{}",
            m.text
        );
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} of {queried:?} checked");

    assert_eq!(http_get(&addr, "/healthz").await, Some((200, "ok\n".to_string())));
    let (code, body) = http_get(&addr, "/readyz").await.expect("readyz");
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("ready: streaming"), "{body}");

    // The exact window holds every acknowledgement; a reset hands it over and starts afresh.
    let window = latency_window(&addr, false).await;
    assert_eq!(window["count"], all.len(), "{window}");
    let ms = |w: &serde_json::Value, k: &str| w[k].as_f64().unwrap_or_else(|| panic!("{k} in {w}"));
    assert!(ms(&window, "p50_ms") > 0.0, "{window}");
    assert!(ms(&window, "p50_ms") <= ms(&window, "p99_ms"), "{window}");
    assert!(ms(&window, "p99_ms") <= ms(&window, "max_ms"), "{window}");
    assert_eq!(latency_window(&addr, true).await["count"], all.len());
    let fresh = latency_window(&addr, false).await;
    assert_eq!(fresh["count"], 0, "{fresh}");
    assert!(fresh["p99_ms"].is_null(), "{fresh}");

    let out = run_cmd(&["status", "--json"], &config).await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(report["health"]["verdict"], "ok", "{report:#}");
    assert_eq!(report["health"]["thresholds"]["lag_warn_seconds"], 60);
    let text = String::from_utf8(run_cmd(&["status"], &config).await.stdout).unwrap();
    assert!(text.contains("health: OK") && text.contains("retained WAL:"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_password_appears_in_no_log_line_status_output_or_metric() {
    let pg = shared_cluster().await;
    let (Some(_), Some(ca)) = (pg.scram_url("postgres"), pg.ca_cert_path()) else {
        crate::harness::needs::missing(
            crate::harness::needs::LOCAL_POSTGRES,
            "the_password_appears_in_no_log_line_status_output_or_metric",
            "no SCRAM user",
        );
        return;
    };
    let kafka = MockKafka::new(1);
    let db = unique_name("secret");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let config = RelayConfig::new(&pg.scram_url(&db).unwrap(), &kafka.bootstrap_servers())
        .sslrootcert(&ca)
        .route(PREFIX_REGEX, "${routedByValue}");
    let mut seen = Vec::new();
    let out = run_cmd(&["setup"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    seen.push((
        "setup",
        String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned(),
    ));

    let (cfg_a, addr) = with_http(&config);
    let active = RelayProcess::run(&cfg_a);
    wait_log(&active, "streaming started", Duration::from_secs(30)).await;
    let standby = RelayProcess::run(&with_http(&config).0);
    wait_log(&standby, "standing by", Duration::from_secs(30)).await;
    let events = insert_multi_row(&client, OutboxSchema::A, &new_uuid(), 0, 5).await;
    collect(
        &kafka.bootstrap_servers(),
        &["order"],
        events.len(),
        Duration::from_secs(60),
    )
    .await;
    let m = scrape_until(&addr, "published events", |m| m.sum(PUBLISHED) >= 5.0).await;
    seen.push(("metrics", m.text));
    for path in ["/healthz", "/readyz"] {
        seen.push((path, http_get(&addr, path).await.map(|(_, b)| b).unwrap_or_default()));
    }
    for args in [&["status"][..], &["status", "--json"]] {
        let out = run_cmd(args, &config).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        seen.push((
            "status",
            String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned(),
        ));
    }
    // Errors print the URL too: a server that is not there.
    let closed = RelayConfig {
        postgres_url: config
            .postgres_url
            .replace(&pg.port().to_string(), &free_port().to_string()),
        ..config.clone()
    };
    let out = run_cmd(&["status"], &closed).await;
    assert!(!out.status.success());
    let failure = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        failure.contains("relay_scram:********@"),
        "the failing URL is shown, redacted: {failure}"
    );
    seen.push(("status error", failure));
    let mut unreachable = RelayProcess::run(&closed);
    wait_log(&unreachable, "reconnecting", Duration::from_secs(30)).await;
    assert!(unreachable.sigterm());
    unreachable.wait_exit(Duration::from_secs(30)).await;
    seen.push(("relay, unreachable server", unreachable.log_text()));
    seen.push(("active relay", active.log_text()));
    seen.push(("standby relay", standby.log_text()));

    assert!(
        seen.iter().any(|(_, text)| text.contains("relay_scram:********@")),
        "URLs are shown redacted somewhere"
    );
    for (what, text) in &seen {
        assert!(
            !text.contains(SCRAM_PASSWORD),
            "the password leaked into {what}:\n{text}"
        );
    }
}
