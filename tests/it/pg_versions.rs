//! The version matrix: the core path on every supported PostgreSQL major (14–18) — `setup`,
//! `run`, events delivered with per-aggregate order, a restart that resumes where the slot
//! was confirmed (nothing lost, nothing skipped), `status`, `teardown`.
//!
//! Majors other than Debian's 15 come from `scripts/install-postgres-majors.sh` (`.ci/run`
//! calls it); a major whose binaries are missing is skipped with a loud SKIPPING line (a failure
//! under CI: `harness/needs.rs`). The
//! whole suite can also run on one major: `OUTBOX_RELAY_TEST_PG_MAJOR=17 cargo test …`.

use std::time::Duration;

use crate::harness::scrape::{with_http, Metrics};
use crate::harness::workload::{create_schema, OutboxSchema, Workload};
use crate::harness::*;

async fn core_path(major: u32) {
    let Some(bin) = pg_bin_for_major(major) else {
        skip_missing_major(major, "the core path");
        return;
    };
    let Some(pg) = PgCluster::start_dedicated_with(&bin, &[]).await else {
        return;
    };
    let client = pg.client("postgres").await;
    let version: String = client
        .query_one("SELECT current_setting('server_version')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        version.starts_with(&format!("{major}.")),
        "asked for {major}, got {version}"
    );
    let db = unique_name("pgv");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let kafka = MockKafka::new(1);
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("relay", "slot_check_interval_ms", 300);
    let (config, addr) = with_http(&config);
    let out = run_cmd(&["setup"], &config).await;
    let setup_text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "setup on {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slot = slot_row(&client, &config.slot).await.expect("setup created the slot");
    assert_eq!(slot.plugin.as_deref(), Some("pgoutput"));
    // 17+: `failover_slot = "auto"` makes it a failover slot.
    let failover: Option<bool> = client
        .query_one(
            "SELECT (to_jsonb(s) ->> 'failover')::bool FROM pg_replication_slots s WHERE slot_name = $1",
            &[&config.slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(failover, (major >= 17).then_some(true), "{setup_text}");

    let mut relay = RelayProcess::run(&config);
    let url = pg.url(&db);
    let first = run_workload(&url, &Workload::new(OutboxSchema::A, 300, 10, 4)).await;
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        first.len(),
        Duration::from_secs(60),
    )
    .await;
    let all: Vec<_> = first.all().cloned().collect();
    check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&first, &records);
    check_failover_gauge(major, &addr).await;
    assert!(relay.sigterm());
    let exit = relay.wait_exit(Duration::from_secs(30)).await.expect("relay exits");
    assert!(exit.success(), "{version}: {exit:?}\n{}", relay.log_text());

    // Written while no relay runs: the next one resumes at the slot and publishes them.
    let second = run_workload(&url, &Workload::new(OutboxSchema::A, 200, 10, 4)).await;
    let mut relay = RelayProcess::run(&config);
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        first.len() + second.len(),
        Duration::from_secs(60),
    )
    .await;
    let all: Vec<_> = first.all().chain(second.all()).cloned().collect();
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    assert_eq!(dups, 0, "{version}: a clean restart republishes nothing");
    check_order(&second, &records);

    let out = run_cmd(&["status", "--json"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(status["slot"]["exists"], true);
    assert!(relay.sigterm());
    relay.wait_exit(Duration::from_secs(30)).await.expect("relay exits");
    let out = run_cmd(&["teardown", "--yes"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(slot_row(&client, &config.slot).await.is_none());
    eprintln!(
        "version matrix: PostgreSQL {version}: core path OK ({} events)",
        all.len()
    );
}

/// `outbox_relay_slot_failover_ready` (src/ops/metrics.rs) exists only where failover slots do:
/// on 17+ it is exported (0 here: no standby, `synchronized_standby_slots` unset); on 14–16 it is
/// absent, so the not-failover-ready alert (`max(…) < 1`) has no series and cannot fire forever.
async fn check_failover_gauge(major: u32, addr: &str) {
    const FAILOVER_READY: &str = "outbox_relay_slot_failover_ready";
    const RETAINED: &str = "outbox_relay_slot_retained_wal_bytes";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut checked_at = None;
    loop {
        let m = Metrics::scrape(addr).await;
        let gauge = m.as_ref().and_then(|m| m.get(FAILOVER_READY, &[]));
        // The slot check sets the retained-WAL gauge just before it asks about failover: once it
        // shows, a few more 300 ms checks have surely asked.
        if checked_at.is_none() && m.as_ref().is_some_and(|m| m.get(RETAINED, &[]).is_some()) {
            checked_at = Some(tokio::time::Instant::now());
        }
        let settled = checked_at.is_some_and(|t| t.elapsed() > Duration::from_millis(1500));
        if major >= 17 && gauge.is_some() || major < 17 && settled {
            let expected = (major >= 17).then_some(0.0);
            assert_eq!(
                gauge,
                expected,
                "PostgreSQL {major}: {FAILOVER_READY}\n{}",
                m.map(|m| m.text).unwrap_or_default()
            );
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "PostgreSQL {major}: no slot check within 20 s, or {FAILOVER_READY} never exported"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_path_on_postgres_14() {
    core_path(14).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_path_on_postgres_15() {
    core_path(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_path_on_postgres_16() {
    core_path(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_path_on_postgres_17() {
    core_path(17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_path_on_postgres_18() {
    core_path(18).await;
}
