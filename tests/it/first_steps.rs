//! Issue 44, the sharp edges a new user hits with the shipped config: `replay --since 24h` on
//! the shipped config (no record timestamp), `status` on a plain and on a partitioned outbox
//! table, `run` with a column mapping the table does not fit, a bad environment override, and
//! the log of a fatal error (once, without colours when stderr is no terminal).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::harness::process::{wait_child, Watchdog};
use crate::harness::relay_process::{run_cmd_with, RELAY_BIN};
use crate::harness::scrape::{http_get, with_http};
use crate::harness::*;

/// `outbox-relay ARGS --config config/outbox-relay.toml` — the file as shipped — with `env` as
/// its `OUTBOX_RELAY__*` overrides (what a deployment sets: the URL, the broker), bounded.
async fn shipped(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/outbox-relay.toml");
    let mut cmd = Command::new(RELAY_BIN);
    cmd.args(args)
        .arg("--config")
        .arg(&config)
        .arg("--state")
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the relay");
    let _watchdog = Watchdog::guard(child.id());
    let status = wait_child(&mut child, Duration::from_secs(90))
        .await
        .unwrap_or_else(|| panic!("`outbox-relay {}` did not exit within 90 s", args.join(" ")));
    Output {
        status,
        stdout: std::fs::read(&out).unwrap_or_default(),
        stderr: std::fs::read(&err).unwrap_or_default(),
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn insert(client: &tokio_postgres::Client, n: i64) {
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) \
             SELECT gen_random_uuid(), 'order.created', jsonb_build_object('n', g) FROM generate_series(1, $1::int8) g",
            &[&n],
        )
        .await
        .expect("insert outbox rows");
}

/// The README's `replay --since 24h` on the shipped config, which sets no
/// `outbox.timestamp_column` (exactly-once by read-back asks to leave it unset): the rows are
/// selected by their `created_at`, a dry run on this new table says nothing about removed rows,
/// and the replay sends them. A table without the creation-time column is refused, naming it
/// and the keys to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_since_24h_selects_by_created_at_on_the_shipped_config() {
    let kafka = MockKafka::new(1);
    let bootstrap = kafka.bootstrap_servers();
    let (_db, client, config) = prepared(workload::OutboxSchema::A, &bootstrap).await;
    insert(&client, 3).await;
    // A new table: every row is newer than --since asks for, and nothing was ever removed, so
    // there is nothing to warn of (the harness's config, which sets timestamp_column, too).
    let out = run_cmd(&["replay", "--since", "24h", "--dry-run"], &config).await;
    let said = text(&out);
    assert!(said.contains("dry run: 3 rows would be re-published"), "{said}");
    assert!(!said.contains("deleted") && !said.contains("removed"), "{said}");
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload, created_at) \
             VALUES (gen_random_uuid(), 'order.created', '{}', now() - interval '2 days')",
            &[],
        )
        .await
        .unwrap();
    let env = [
        ("OUTBOX_RELAY__POSTGRES__URL", config.postgres_url.as_str()),
        ("OUTBOX_RELAY__POSTGRES__SLOT", config.slot.as_str()),
        ("OUTBOX_RELAY__POSTGRES__PUBLICATION", config.publication.as_str()),
        ("OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS", bootstrap.as_str()),
    ];
    let out = shipped(&["replay", "--since", "24h", "--dry-run"], &env).await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("dry run: 3 rows would be re-published"), "{said}");
    assert!(said.contains("\"created_at\" >= "), "{said}");
    assert!(
        !said.contains("deleted") && !said.contains("removed"),
        "nothing was ever removed from this new table: {said}"
    );
    let topic = unique_name("replayed");
    let out = shipped(&["replay", "--since", "24h", "--to-topic", &topic], &env).await;
    let said = text(&out);
    assert!(
        out.status.success() && said.contains("replay complete: 3 events re-published"),
        "{said}"
    );
    assert_eq!(
        collect(&bootstrap, &[&topic], 3, Duration::from_secs(30)).await.len(),
        3
    );

    client
        .batch_execute(
            "CREATE TABLE no_created (id bigserial PRIMARY KEY, aggregate_id uuid, type text, payload jsonb)",
        )
        .await
        .unwrap();
    let mut refused = env.to_vec();
    refused.push(("OUTBOX_RELAY__OUTBOX__TABLE", "public.no_created"));
    let out = shipped(&["replay", "--since", "24h", "--dry-run"], &refused).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("column \"created_at\"")
            && said.contains("\"public\".\"no_created\" has no such column")
            && said.contains("retention.timestamp_column")
            && said.contains("--since id:N"),
        "{said}"
    );
}

/// `status --json` of `table` (after `ANALYZE`): its figures.
async fn table_figures(config: &RelayConfig) -> serde_json::Value {
    let out = run_cmd(&["status", "--json"], config).await;
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    report["outbox_tables"][0].clone()
}

/// `status` knows a plain outbox table (outside any partition tree) as well as a partitioned
/// one: estimated rows after ANALYZE, its size, its oldest row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_rows_size_and_oldest_row_of_plain_and_partitioned_tables() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(workload::OutboxSchema::A, &kafka.bootstrap_servers()).await;
    insert(&client, 40).await;
    client.batch_execute("ANALYZE events_outbox").await.unwrap();
    let plain = table_figures(&config).await;
    assert_eq!(plain["partitioned"], false, "{plain}");
    assert_eq!(plain["estimated_rows"], 40, "{plain}");
    assert!(plain["size_bytes"].as_i64() > Some(0), "{plain}");
    assert!(plain["oldest_row"].is_string(), "{plain}");

    client
        .batch_execute(
            "CREATE TABLE part_outbox (id bigserial, aggregate_id uuid NOT NULL, type text NOT NULL, \
                 payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, created_at)) \
               PARTITION BY RANGE (created_at);
             CREATE TABLE part_outbox_any PARTITION OF part_outbox DEFAULT;
             INSERT INTO part_outbox (aggregate_id, type, payload)
               SELECT gen_random_uuid(), 'order.created', '{}' FROM generate_series(1, 25);
             ANALYZE part_outbox;",
        )
        .await
        .unwrap();
    let partitioned = config.clone().set("outbox", "table", "public.part_outbox");
    let figures = table_figures(&partitioned).await;
    assert_eq!(figures["partitioned"], true, "{figures}");
    assert_eq!(figures["estimated_rows"], 25, "{figures}");
    assert!(figures["size_bytes"].as_i64() > Some(0), "{figures}");
    assert!(figures["oldest_row"].is_string(), "{figures}");

    let out = run_cmd(&["status"], &config).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("~40 (estimate) rows") && !said.contains("oldest row: none"),
        "{said}"
    );
}

/// `run` with a `route_by_column` the table never had stops before it streams — never logging
/// "streaming started" nor answering /readyz 200 — naming the key, the column, the table and
/// the fix, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_mapping_the_table_does_not_fit_before_streaming() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(workload::OutboxSchema::A, &kafka.bootstrap_servers()).await;
    insert(&client, 1).await;
    let (mut config, addr) = with_http(&config);
    config.route_by_column = "kind".into();
    let mut relay = RelayProcess::run(&config);
    let mut ready = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        ready |= http_get(&addr, "/readyz").await.is_some_and(|(code, _)| code == 200);
        if let Some(status) = relay.wait_exit(Duration::from_millis(100)).await {
            break Some(status);
        }
        if std::time::Instant::now() >= deadline {
            break None;
        }
    };
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert!(!ready, "/readyz answered 200 for a relay that cannot publish: {log}");
    assert!(!log.contains("streaming started"), "{log}");
    let refusal =
        "outbox.route_by_column = \"kind\", but the outbox table \"public\".\"events_outbox\" has no such column";
    assert_eq!(log.matches(refusal).count(), 1, "said once: {log}");
    assert!(log.contains("Fix outbox.route_by_column in the config"), "{log}");
}

/// A fatal error met while streaming (a bad event under `on_bad_event = "fail"`) is logged once,
/// saying what helps; the text log carries no ANSI colours when stderr is not a terminal (here
/// a file, and `NO_COLOR` empty, i.e. unset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_is_logged_once_without_colours() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(workload::OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let mut relay = RelayProcess::run_with(&config, &[], &[("NO_COLOR", "")]);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'bad topic!', '{}')",
            &[],
        )
        .await
        .unwrap();
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert_eq!(log.matches("cannot be published").count(), 1, "said once: {log}");
    assert!(!log.contains("stopping stream"), "{log}");
    assert!(
        log.contains("a restart reads it again") && log.contains("relay.on_bad_event = \"dead-letter\""),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "ANSI escape codes in a log file: {log:?}");
}

/// An `OUTBOX_RELAY__*` variable with a bad value is named as the culprit, never the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_environment_override_is_named() {
    let config = RelayConfig::new("postgres://relay@127.0.0.1:9/app", "127.0.0.1:9");
    for args in [&["setup", "--check"][..], &["run"][..]] {
        let out = run_cmd_with(
            args,
            &config,
            &[("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "lots")],
            Duration::from_secs(30),
        )
        .await;
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(
            said.contains(
                "environment variable OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT is not usable: it sets relay.max_in_flight"
            ) && said.contains("\"lots\""),
            "{said}"
        );
        assert!(!said.contains("config file"), "{said}");
    }
}
