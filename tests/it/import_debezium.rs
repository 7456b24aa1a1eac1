//! `outbox-relay import-debezium` on Debezium's documented connector configs, then `setup` with
//! what it printed, against the throwaway PostgreSQL: the imported config is one `setup` accepts
//! for Debezium's sample outbox table. Run with `cargo test --test it import_debezium`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{shared_cluster, unique_name, RELAY_BIN};

/// Debezium's sample outbox table (`inventory.outboxevent`), with the `eventType` column the
/// EventRouter docs forward as a header and the `timestamp` column of the outbox example.
const DEBEZIUM_OUTBOX: &str = r#"
CREATE SCHEMA inventory;
CREATE TABLE inventory.outboxevent (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    "eventType" varchar(255),
    timestamp timestamp NOT NULL DEFAULT now(),
    payload jsonb
);
"#;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/debezium")
        .join(name)
}

/// Runs the binary with `args` (no --config, no OUTBOX_RELAY_* from the caller's environment).
async fn relay(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(RELAY_BIN)
            .args(&args)
            .env_remove("OUTBOX_RELAY_CONFIG")
            .output()
            .expect("run outbox-relay")
    })
    .await
    .expect("join")
}

async fn imports_and_sets_up(fixture_name: &str) {
    let out = relay(vec![
        "import-debezium".into(),
        fixture(fixture_name).display().to_string(),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import-debezium {fixture_name}: {stderr}");
    assert!(stderr.contains("imported connector"), "{stderr}");
    let imported = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(!imported.contains("postgrespw"), "the password leaked:\n{imported}");

    let pg = shared_cluster().await;
    let db = unique_name("imp_dbz");
    pg.create_database(&db).await;
    pg.client(&db)
        .await
        .batch_execute(DEBEZIUM_OUTBOX)
        .await
        .expect("outbox table");

    // Only what points at Debezium's environment is replaced: the database (this cluster), the
    // slot and publication (cluster-wide, so unique per test), the brokers (setup does not use them).
    let mut config: toml::Table = imported.parse().expect("the output is TOML");
    let postgres = config["postgres"].as_table_mut().expect("[postgres]");
    postgres.insert("url".into(), pg.url(&db).into());
    postgres.insert("slot".into(), unique_name("imp_slot").into());
    postgres.insert("publication".into(), unique_name("imp_pub").into());
    config["kafka"]
        .as_table_mut()
        .expect("[kafka]")
        .insert("bootstrap.servers".into(), "127.0.0.1:9".into());
    let text = toml::to_string(&config).expect("serialize");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    let setup = |text: &str| {
        std::fs::write(&path, text).expect("write config");
        relay(vec!["setup".into(), "--config".into(), path.display().to_string()])
    };
    let out = setup(&text).await;
    assert!(
        out.status.success(),
        "setup with the config imported from {fixture_name} failed:\n{}\n--- config:\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("inventory"), "{report}");
    let slot = config["postgres"]["slot"].as_str().expect("slot").to_owned();
    let teardown = relay(vec![
        "teardown".into(),
        "--yes".into(),
        "--config".into(),
        path.display().to_string(),
    ])
    .await;
    assert!(
        teardown.status.success(),
        "teardown of {slot}: {}",
        String::from_utf8_lossy(&teardown.stderr)
    );
    if !pg.is_local() {
        pg.drop_database(&db).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_router_docs_example_imports_to_a_config_setup_accepts() {
    imports_and_sets_up("outbox-event-router-docs.properties").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_example_imports_to_a_config_setup_accepts() {
    imports_and_sets_up("outbox-example.json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_without_event_router_is_a_usage_error() {
    let out = relay(vec![
        "import-debezium".into(),
        fixture("postgresql-connector-docs.json").display().to_string(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("postgresql-connector-docs.json") && stderr.contains("no Outbox EventRouter"),
        "{stderr}"
    );
}
