//! Several outbox tables in one slot and publication (`outbox.table` a list, one outbox per
//! schema of a modular monolith): `setup` publishes and checks every table, the relay streams
//! them interleaved in commit order, `status` and `teardown` cover them all, and `poll` and
//! `setup --backfill` read every table.
//!
//! The two tables share the column mapping but not their column positions (`billing.outbox` has
//! an extra leading column), so each table's Relation must resolve its own layout.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::fault_support::id_of;
use crate::harness::scrape::{with_http, Metrics};
use crate::harness::*;

const WAIT: Duration = Duration::from_secs(90);
const TABLES: [&str; 2] = ["sales.outbox", "billing.outbox"];

/// Two outbox tables of one structure in two schemas; `billing.outbox` starts with an unmapped
/// column, so its mapped columns sit at other positions than `sales.outbox`'s.
const SCHEMA: &str = "
CREATE SCHEMA sales;
CREATE SCHEMA billing;
CREATE TABLE sales.outbox (
    id bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    dispatched_at timestamptz);
CREATE TABLE billing.outbox (
    note text DEFAULT 'billing',
    id bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    dispatched_at timestamptz);
";

/// A fresh database with [`SCHEMA`] (then `extra_sql`) and a config relaying both tables to
/// topic `order`.
async fn database(kafka: &MockKafka, extra_sql: &str) -> (Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("tables");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(SCHEMA).await.expect("schema");
    client.batch_execute(extra_sql).await.expect("extra schema");
    let mut config = RelayConfig::new(&pg.url(&db), &kafka.bootstrap_servers()).route(PREFIX_REGEX, "${routedByValue}");
    config.timestamp_column = Some("created_at".into());
    let config = config.set(
        "outbox",
        "table",
        toml::Value::Array(TABLES.iter().map(|t| toml::Value::String((*t).into())).collect()),
    );
    (client, config)
}

/// One inserted row: which table, its id there, its aggregate and its place in commit order.
#[derive(Debug, Clone)]
struct Row {
    table: &'static str,
    id: String,
    aggregate: String,
    seq: i64,
}

/// Inserts one `order.placed` row into `table` with `seq` in its payload.
async fn insert(client: &impl tokio_postgres::GenericClient, table: &'static str, aggregate: &str, seq: i64) -> Row {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO {table} (aggregate_id, type, payload) \
                 VALUES ($1, 'order.placed', jsonb_build_object('seq', $2::bigint, 'table', $3::text)) RETURNING id::text"
            ),
            &[&aggregate, &seq, &table],
        )
        .await
        .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
    Row {
        table,
        id: row.get(0),
        aggregate: aggregate.to_owned(),
        seq,
    }
}

/// The payload's `table` and `seq` of a record.
fn origin(r: &Received) -> (String, i64) {
    let v: serde_json::Value = serde_json::from_str(r.payload_str().expect("text payload")).expect("JSON payload");
    (
        v["table"].as_str().expect("table in payload").to_owned(),
        v["seq"].as_i64().expect("seq in payload"),
    )
}

/// Every row arrived exactly once, with its table's id as the `id` header and its aggregate as
/// the key; returns the records' `(table, seq)` per key, in arrival order.
fn check_each_once(rows: &[Row], records: &[Received], log: &str) -> BTreeMap<String, Vec<(String, i64)>> {
    let expected: HashMap<(String, i64), &Row> = rows.iter().map(|r| ((r.table.to_owned(), r.seq), r)).collect();
    let mut seen: HashMap<(String, i64), usize> = HashMap::new();
    let mut by_key: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for r in records {
        let origin = origin(r);
        let row = expected
            .get(&origin)
            .unwrap_or_else(|| panic!("a record of no committed row: {origin:?}"));
        assert_eq!(id_of(r), row.id, "id header of {origin:?}");
        assert_eq!(r.key_str(), Some(row.aggregate.as_str()), "key of {origin:?}");
        *seen.entry(origin.clone()).or_default() += 1;
        by_key.entry(row.aggregate.clone()).or_default().push(origin);
    }
    let missing: Vec<_> = rows
        .iter()
        .filter(|r| !seen.contains_key(&(r.table.to_owned(), r.seq)))
        .map(|r| (r.table, r.seq))
        .collect();
    assert!(missing.is_empty(), "never arrived: {missing:?}; log:\n{log}");
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "arrived more than once: {dups:?}; log:\n{log}");
    by_key
}

/// Per aggregate, each table's rows arrived in commit order (what `poll` promises: one set of
/// workers per table, so only order within a table).
fn check_order_within_each_table(by_key: &BTreeMap<String, Vec<(String, i64)>>) {
    for (key, origins) in by_key {
        for table in TABLES {
            let seqs: Vec<i64> = origins.iter().filter(|(t, _)| t == table).map(|(_, s)| *s).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "aggregate {key} in {table}: {seqs:?}"
            );
        }
    }
}

async fn publication_tables(client: &Client, publication: &str) -> Vec<String> {
    client
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1",
            &[&publication],
        )
        .await
        .expect("publication tables")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn stop(mut relay: RelayProcess) -> String {
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the relay exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", relay.log_text());
    relay.log_text()
}

/// Rows alternating between the two tables within one transaction and across transactions, all
/// of one aggregate (plus a second aggregate in some): the consumer sees every row once, per
/// aggregate in commit order — the one WAL order across both tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_outbox_tables_interleaved_in_one_transaction_arrive_in_order() {
    let kafka = MockKafka::new(3);
    let (mut client, config) = database(&kafka, "").await;
    setup(&config).await;
    assert_eq!(
        publication_tables(&client, &config.publication).await,
        ["billing.outbox", "sales.outbox"],
        "setup publishes every outbox table"
    );
    let out = run_cmd(&["status", "--json"], &config).await;
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let listed: Vec<(String, bool)> = status["outbox_tables"]
        .as_array()
        .expect("outbox_tables")
        .iter()
        .map(|t| {
            (
                format!("{}.{}", t["schema"].as_str().unwrap(), t["table"].as_str().unwrap()),
                t["in_publication"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("sales.outbox".to_owned(), true), ("billing.outbox".to_owned(), true)]
    );
    assert_eq!(status["publication"]["includes_outbox_table"], true);

    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let mut rows = Vec::new();
    let mut seq = 0;
    // Mixed transactions: rows alternate between the tables inside each one, and the first row
    // of a transaction comes from the table the previous one ended with.
    for txn in 0..8 {
        let tx = client.transaction().await.expect("begin");
        for i in 0..6 {
            let table = TABLES[(txn + i) % 2];
            let aggregate = if i % 3 == 2 { "agg-2" } else { "agg-1" };
            rows.push(insert(&tx, table, aggregate, seq).await);
            seq += 1;
        }
        tx.commit().await.expect("commit");
    }
    // Transactions of one table only, alternating, and a single-row autocommit into each.
    for txn in 0..4 {
        let tx = client.transaction().await.expect("begin");
        for _ in 0..3 {
            rows.push(insert(&tx, TABLES[txn % 2], "agg-1", seq).await);
            seq += 1;
        }
        tx.commit().await.expect("commit");
    }
    for table in TABLES {
        rows.push(insert(&client, table, "agg-1", seq).await);
        seq += 1;
    }

    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    let by_key = check_each_once(&rows, &records, &relay.log_text());
    for (key, origins) in &by_key {
        let seqs: Vec<i64> = origins.iter().map(|(_, s)| *s).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(
            seqs, sorted,
            "aggregate {key}: not in commit order across the two tables"
        );
        let tables: Vec<&str> = origins.iter().map(|(t, _)| t.as_str()).collect();
        assert!(
            tables.contains(&TABLES[0]) && tables.contains(&TABLES[1]),
            "aggregate {key} has events of both tables: {tables:?}"
        );
    }
    assert_eq!(by_key["agg-1"].len() + by_key["agg-2"].len(), rows.len());

    stop(relay).await;
    // Teardown takes the publication of both outbox tables as the relay's own.
    let out = run_cmd(&["teardown", "--yes"], &config).await;
    assert!(
        out.status.success(),
        "teardown: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(publication_tables(&client, &config.publication).await.is_empty());
}

/// `setup` checks every table's columns and names the table at fault; an existing publication
/// of one of the tables is extended by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_checks_and_publishes_every_outbox_table() {
    let kafka = MockKafka::new(1);
    let (client, config) = database(&kafka, "ALTER TABLE billing.outbox RENAME COLUMN payload TO body").await;
    let out = run_cmd(&["setup"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "setup accepted a table without the payload column"
    );
    assert!(
        stderr.contains("\"billing\".\"outbox\"") && stderr.contains("payload"),
        "the error names the table and the column: {stderr}"
    );
    assert!(
        publication_tables(&client, &config.publication).await.is_empty(),
        "nothing is created before every table passed"
    );

    client
        .batch_execute(&format!(
            "ALTER TABLE billing.outbox RENAME COLUMN body TO payload; \
             CREATE PUBLICATION {} FOR TABLE sales.outbox WITH (publish = 'insert')",
            config.publication
        ))
        .await
        .unwrap();
    let out = run_cmd(&["setup"], &config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("existed without \"billing\".\"outbox\"; setup added it"),
        "{stdout}"
    );
    assert_eq!(
        publication_tables(&client, &config.publication).await,
        ["billing.outbox", "sales.outbox"]
    );
}

/// `poll` claims from every table; per-aggregate order holds within each table; the watchdog
/// counts each table under its own `table` label, and every row ends up dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poll_relays_every_outbox_table() {
    let kafka = MockKafka::new(3);
    let (client, config) = database(&kafka, "").await;
    let config = config
        .set("poll", "dispatched_column", "dispatched_at")
        .set("poll", "interval_ms", 20)
        .set("poll", "watchdog_interval_ms", 200);
    let out = run_cmd(&["setup", "--poll"], &config).await;
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "setup --poll: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for table in ["\"sales\".\"outbox\"", "\"billing\".\"outbox\""] {
        assert!(report.contains(&format!("ON {table} (\"created_at\")")), "{report}");
    }

    let mut rows = Vec::new();
    for seq in 0..60 {
        let aggregate = format!("agg-{}", seq % 4);
        rows.push(insert(&client, TABLES[(seq % 2) as usize], &aggregate, seq).await);
    }
    let (config, addr) = with_http(&config);
    let relay = RelayProcess::poll(&config);
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    let by_key = check_each_once(&rows, &records, &relay.log_text());
    check_order_within_each_table(&by_key);
    let drained = wait_until(WAIT, Duration::from_millis(200), || async {
        let m = Metrics::scrape(&addr).await;
        m.is_some_and(|m| {
            TABLES
                .iter()
                .all(|t| m.get("outbox_relay_pending_rows", &[("table", t)]) == Some(0.0))
        })
    })
    .await;
    assert!(
        drained,
        "both tables' pending-rows gauges fall to 0; log:\n{}",
        relay.log_text()
    );
    for table in TABLES {
        let pending: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE dispatched_at IS NULL"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(pending, 0, "{table} has undispatched rows");
    }
    stop(relay).await;
}

/// `setup --backfill` publishes the rows pending in every table at the slot's snapshot, and
/// `run` then streams both tables from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backfill_covers_every_outbox_table() {
    let kafka = MockKafka::new(3);
    let (client, config) = database(&kafka, "").await;
    let config = config.set("poll", "dispatched_column", "dispatched_at");
    let mut pending = Vec::new();
    for seq in 0..40 {
        let aggregate = format!("agg-{}", seq % 3);
        let row = insert(&client, TABLES[(seq % 2) as usize], &aggregate, seq).await;
        if seq % 5 == 0 {
            // A poller published it already: not sent again.
            client
                .execute(
                    &format!(
                        "UPDATE {} SET dispatched_at = now() WHERE id = $1::text::bigint",
                        row.table
                    ),
                    &[&row.id],
                )
                .await
                .unwrap();
        } else {
            pending.push(row);
        }
    }
    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "setup --backfill: {}{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains(&format!("backfill: published {} pending rows", pending.len())),
        "{report}"
    );
    assert_eq!(
        publication_tables(&client, &config.publication).await,
        ["billing.outbox", "sales.outbox"]
    );

    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let mut rows = pending;
    for seq in 40..60 {
        let aggregate = format!("agg-{}", seq % 3);
        rows.push(insert(&client, TABLES[(seq % 2) as usize], &aggregate, seq).await);
    }
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    let by_key = check_each_once(&rows, &records, &relay.log_text());
    check_order_within_each_table(&by_key);
    stop(relay).await;
}

/// An outbox table listed in the config but left out of the publication (a second table added to
/// `outbox.table` without `setup`): the relay refuses to stream, naming the table and the fix,
/// instead of streaming past its rows while the slot is confirmed beyond them (and retention
/// takes them for published).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listed_table_missing_from_the_publication_stops_the_relay_with_the_fix() {
    let kafka = MockKafka::new(3);
    let (client, config) = database(&kafka, "").await;
    setup(&config).await;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {} DROP TABLE billing.outbox",
            config.publication
        ))
        .await
        .expect("narrow the publication");
    let before = confirmed_flush(&client, &config.slot).await;
    insert(&client, "billing.outbox", "agg-1", 0).await;
    let mut relay = RelayProcess::run(&config);
    let status = relay.wait_exit(Duration::from_secs(60)).await.unwrap_or_else(|| {
        panic!(
            "the relay keeps running without billing.outbox published:\n{}",
            relay.log_text()
        )
    });
    let log = relay.log_text();
    assert!(!status.success(), "exit status {status:?}; log:\n{log}");
    assert!(
        log.contains("does not publish the outbox table(s) billing.outbox") && log.contains("outbox-relay setup"),
        "the log names the table and the fix:\n{log}"
    );
    assert!(!log.contains("streaming started"), "it streamed anyway:\n{log}");
    let after = confirmed_flush(&client, &config.slot).await;
    assert_eq!(before, after, "the slot was confirmed past the unpublished row");
}

async fn confirmed_flush(client: &Client, slot: &str) -> String {
    client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("slot")
        .get(0)
}
