//! Issue 34, the outbox as a journal: `[route]` templates over outbox columns on a real
//! PostgreSQL and a real Kafka broker.

use std::time::Duration;

use crate::harness::workload::OutboxSchema;
use crate::harness::*;

/// Adds a `tenant` column to schema A's outbox and inserts `(tenant, type)` rows, one
/// transaction each; returns their ids and aggregate ids in commit order.
async fn insert_tenant_rows(client: &tokio_postgres::Client, rows: &[(&str, &str)]) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for (tenant, ty) in rows {
        let row = client
            .query_one(
                "INSERT INTO events_outbox (aggregate_id, type, payload, tenant) \
                 VALUES (gen_random_uuid(), $1, '{\"n\": 1}', $2) RETURNING id, aggregate_id::text",
                &[ty, tenant],
            )
            .await
            .expect("insert a tenant's row");
        out.push((row.get(0), row.get(1)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_templates_name_topic_and_key_from_columns() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    client
        .batch_execute("ALTER TABLE events_outbox ADD COLUMN tenant text")
        .await
        .unwrap();
    let config = config
        .topic_template("${tenant}.${type}")
        .set("route", "key", "${tenant}/${aggregate_id}");
    let _relay = RelayProcess::run_streaming(&config).await;
    let rows = insert_tenant_rows(&client, &[("acme", "order"), ("globex", "order"), ("acme", "invoice")]).await;
    let records = kafka
        .collect(
            &["acme.order", "globex.order", "acme.invoice"],
            3,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(records.len(), 3, "{records:?}");
    for ((id, aggregate), (tenant, ty)) in
        rows.iter()
            .zip([("acme", "order"), ("globex", "order"), ("acme", "invoice")])
    {
        let record = records
            .iter()
            .find(|r| r.header("id") == Some(id.to_string().as_bytes()))
            .unwrap_or_else(|| panic!("event {id} not delivered: {records:?}"));
        assert_eq!(record.topic, format!("{tenant}.{ty}"));
        assert_eq!(record.key_str(), Some(format!("{tenant}/{aggregate}").as_str()));
    }

    // A row whose template column is NULL is a bad event (default policy: the relay stops,
    // naming the column and the key), never a record in some other topic.
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order', '{}')",
            &[],
        )
        .await
        .unwrap();
    let mut relay = _relay;
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the relay stops on the bad event");
    assert!(!status.success());
    let log = relay.log_text();
    assert!(
        log.contains(r#"column \"tenant\" (route.topic) is NULL"#)
            || log.contains(r#"column "tenant" (route.topic) is NULL"#),
        "log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_naming_no_column_is_refused_at_start_and_by_setup() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, _client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config.topic_template("${tenant}.${type}");
    // `setup --check` (preflight) names the key, the column and the table's columns.
    let out = run_cmd(&["setup", "--check"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(r#"route.topic = "tenant", but the outbox table "public"."events_outbox" has no such column"#)
            && stderr.contains(r#""aggregate_id", "type", "payload""#),
        "{stderr}"
    );
    // `run` refuses before streaming, not at the first row.
    let mut relay = RelayProcess::run(&config);
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("run stops at start");
    assert!(!status.success());
    let log = relay.log_text();
    // The same check as setup's (`outbox::column_types::check_mapping`), in the same words.
    assert!(
        log.contains(
            r#"route.topic = \"tenant\", but the outbox table \"public\".\"events_outbox\" has no such column"#
        ) || log
            .contains(r#"route.topic = "tenant", but the outbox table "public"."events_outbox" has no such column"#),
        "log:\n{log}"
    );
    assert!(!log.contains("streaming started"), "log:\n{log}");
}

use crate::harness::scrape;

/// `[filter]` with an include, an exclude and a `where` over `tenant`, as TOML values.
fn with_filter(config: RelayConfig, include: &[&str]) -> RelayConfig {
    let list = |v: &[&str]| toml::Value::Array(v.iter().map(|s| toml::Value::String((*s).into())).collect());
    let mut where_ = toml::Table::new();
    where_.insert("tenant".into(), list(&["acme", "glob*"]));
    config
        .set("filter", "include", list(include))
        .set("filter", "exclude", list(&["order.internal"]))
        .set("filter", "where", toml::Value::Table(where_))
}

/// Inserts `(tenant, type)` rows in one transaction each; returns the ids of those `[filter]`
/// (include `order.*` and `invoice.*` when `invoices`, exclude `order.internal`, tenant `acme`
/// or `glob*`) lets through.
async fn insert_filtered_mix(client: &tokio_postgres::Client, invoices: bool) -> Vec<String> {
    let rows = [
        ("acme", "order.placed", true),
        ("globex", "order.paid", true),
        ("initech", "order.placed", false), // tenant not listed
        ("acme", "order.internal", false),  // excluded
        ("acme", "invoice.sent", invoices), // included only when invoices are
        ("acme", "audit.read", false),      // not included
    ];
    let mut passing = Vec::new();
    for (tenant, ty, passes) in rows {
        let ids = insert_tenant_rows(client, &[(tenant, ty)]).await;
        if passes {
            passing.push(ids[0].0.to_string());
        }
    }
    // A NULL tenant matches no pattern.
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.placed', '{}')",
            &[],
        )
        .await
        .unwrap();
    passing
}

const TOPICS: [&str; 5] = [
    "order.placed",
    "order.paid",
    "order.internal",
    "invoice.sent",
    "audit.read",
];

/// The filter on `pg`: pushed into the publication on 15+, applied by the relay
/// on 14; filtered rows confirm their WAL; `status` shows it; a changed filter takes effect
/// through `setup` and a restart while events keep flowing.
async fn filter_scenario(pg: &PgCluster) {
    let Some(kafka) = shared_kafka().await else { return };
    // `prepared_on` would add pg_walinspect, which 14 lacks.
    let db = unique_name("filt");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    crate::harness::workload::create_schema(&client, OutboxSchema::A).await;
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers());
    let version: String = client.query_one("SHOW server_version_num", &[]).await.unwrap().get(0);
    let major = version.parse::<u32>().unwrap() / 10_000;
    let config = config.on_kafka(&kafka);
    client
        .batch_execute("ALTER TABLE events_outbox ADD COLUMN tenant text")
        .await
        .unwrap();
    let (config, addr) = scrape::with_http(&with_filter(config, &["order.*"]));
    let out = run_cmd(&["setup"], &config).await;
    let setup_text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{setup_text}");
    let row_filter: Option<String> = client
        .query_opt(
            "SELECT rowfilter FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'events_outbox'",
            &[&config.publication],
        )
        .await
        .ok()
        .flatten()
        .and_then(|r| r.get(0));
    if major >= 15 {
        assert!(setup_text.contains("row filter set"), "{setup_text}");
        let f = row_filter.expect("setup pushed the filter into the publication");
        assert!(f.contains("order.%") && f.contains("tenant"), "{f}");
    } else {
        assert!(setup_text.contains("applies [filter]"), "{setup_text}");
    }

    let mut relay = RelayProcess::run_streaming(&config).await;
    let passing = insert_filtered_mix(&client, false).await;
    // The last transaction is a filtered one: its WAL must still be confirmed.
    let end = current_wal_lsn(&client).await;
    let records = kafka.collect(&TOPICS, passing.len(), Duration::from_secs(60)).await;
    let mut got: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
        .collect();
    got.sort();
    let mut want = passing.clone();
    want.sort();
    assert_eq!(got, want, "exactly the rows the filter lets through");
    let slot = config.slot.clone();
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
            confirmed_flush_lsn(&client, &slot).await.unwrap_or(0) >= end
        })
        .await,
        "filtered rows pinned WAL: confirmed {} < {}",
        format_lsn(confirmed_flush_lsn(&client, &slot).await.unwrap_or(0)),
        format_lsn(end)
    );
    let filtered = scrape::Metrics::scrape(&addr)
        .await
        .expect("metrics")
        .value("outbox_relay_events_filtered_total", &[]);
    if major >= 15 {
        assert_eq!(filtered, 0.0, "the publication dropped them: never decoded");
    } else {
        assert_eq!(filtered, 5.0, "the relay dropped them");
    }
    let status = run_cmd(&["status"], &config).await;
    let status_text = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status_text.contains(r#"filter: include ["order.*"]"#), "{status_text}");
    if major >= 15 {
        assert!(
            status_text.contains("publication row filter: \"public\".\"events_outbox\": WHERE"),
            "{status_text}"
        );
    } else {
        assert!(status_text.contains("applied by the relay"), "{status_text}");
    }

    // Invoices too: the config changes while the relay runs. `status` sees the difference
    // (15+), `setup` brings the publication in line, a restart the relay.
    let widened = with_filter(config.clone(), &["order.*", "invoice.*"]);
    if major >= 15 {
        let status = run_cmd(&["status"], &widened).await;
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        assert!(text.contains("differs from [filter]"), "{text}");
    }
    let out = run_cmd(&["setup"], &widened).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(relay.sigterm());
    relay.wait_exit(Duration::from_secs(30)).await.expect("relay stops");
    let _relay = RelayProcess::run_streaming(&widened).await;
    let more = insert_filtered_mix(&client, true).await;
    let records = kafka
        .collect(&TOPICS, passing.len() + more.len(), Duration::from_secs(60))
        .await;
    let mut got: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
        .collect();
    got.sort();
    let mut want = [passing, more].concat();
    want.sort();
    assert_eq!(got, want, "after the change: invoices too, nothing else");
    if major >= 15 {
        let status = run_cmd(&["status"], &widened).await;
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        assert!(
            !text.contains("differs from [filter]") && text.contains("invoice.%"),
            "{text}"
        );
    }
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn filter_is_pushed_into_the_publication_on_15_and_later() {
    // The shared cluster: 15 unless OUTBOX_RELAY_TEST_PG_MAJOR says otherwise.
    filter_scenario(shared_cluster().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn filter_is_applied_by_the_relay_on_14() {
    let Some(bin) = pg_bin_for_major(14) else {
        skip_missing_major(14, "the relay-side filter");
        return;
    };
    let Some(pg) = PgCluster::start_dedicated_with(&bin, &[]).await else {
        return;
    };
    filter_scenario(&pg).await;
}

/// `[transactions]`: every event carries its transaction's id, commit LSN, commit time, index
/// and count; BEGIN / END markers in Debezium's format frame each transaction on their topic, and
/// the transaction is confirmed with its markers acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_metadata_headers_and_debezium_markers() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, mut client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config
        .set("transactions", "headers", true)
        .set("transactions", "topic", kafka.topic("transaction"));
    let _relay = RelayProcess::run_streaming(&config).await;
    let mut txns = Vec::new();
    for size in [3_i64, 1] {
        let tx = client.transaction().await.unwrap();
        let xid: i64 = tx.query_one("SELECT txid_current()", &[]).await.unwrap().get(0);
        let mut ids = Vec::new();
        for n in 0..size {
            let row = tx
                .query_one(
                    "INSERT INTO events_outbox (aggregate_id, type, payload) \
                     VALUES (gen_random_uuid(), 'order', jsonb_build_object('n', $1::int8)) RETURNING id",
                    &[&n],
                )
                .await
                .unwrap();
            ids.push(row.get::<_, i64>(0).to_string());
        }
        tx.commit().await.unwrap();
        txns.push((xid as u32, ids));
    }
    let end = current_wal_lsn(&client).await;
    let events = kafka.collect(&["order"], 4, Duration::from_secs(60)).await;
    let markers = kafka.collect(&["transaction"], 4, Duration::from_secs(60)).await;
    assert_eq!((events.len(), markers.len()), (4, 4), "{events:?}\n{markers:?}");
    let header = |r: &Received, name: &str| String::from_utf8(r.header(name).unwrap().to_vec()).unwrap();
    let value = |m: &Received| -> serde_json::Value { serde_json::from_slice(m.payload.as_deref().unwrap()).unwrap() };
    for (xid, ids) in &txns {
        let mut txn_id = None;
        for (i, id) in ids.iter().enumerate() {
            let r = events.iter().find(|r| r.header("id") == Some(id.as_bytes())).unwrap();
            let this = header(r, "outbox-relay-txn-id");
            assert!(this.starts_with(&format!("{xid}:")), "{this}");
            assert_eq!(
                *txn_id.get_or_insert_with(|| this.clone()),
                this,
                "one id per transaction"
            );
            assert_eq!(header(r, "outbox-relay-txn-index"), (i + 1).to_string());
            assert_eq!(header(r, "outbox-relay-txn-count"), ids.len().to_string());
            let lsn = parse_lsn(&header(r, "outbox-relay-commit-lsn")).unwrap();
            assert_eq!(this, format!("{xid}:{lsn}"));
            let ts: i64 = header(r, "outbox-relay-commit-ts-ms").parse().unwrap();
            assert!(ts > 1_600_000_000_000);
        }
        let txn_id = txn_id.unwrap();
        // BEGIN then END on one key (one partition, in that order).
        let of_txn: Vec<&Received> = markers.iter().filter(|m| value(m)["id"] == txn_id.as_str()).collect();
        assert_eq!(of_txn.len(), 2, "{markers:?}");
        let (begin_rec, end_rec) = (of_txn[0], of_txn[1]);
        assert_eq!(begin_rec.partition, end_rec.partition);
        assert!(begin_rec.offset < end_rec.offset);
        let (begin, end_marker) = (value(begin_rec), value(end_rec));
        assert_eq!(begin["status"], "BEGIN", "{begin}");
        assert!(begin["event_count"].is_null() && begin["data_collections"].is_null());
        assert_eq!(end_marker["status"], "END");
        assert_eq!(end_marker["event_count"], ids.len());
        assert_eq!(
            end_marker["data_collections"],
            serde_json::json!([{"data_collection": "public.events_outbox", "event_count": ids.len()}])
        );
        assert_eq!(begin["ts_ms"], end_marker["ts_ms"]);
        let key: serde_json::Value = serde_json::from_slice(begin_rec.key.as_deref().unwrap()).unwrap();
        assert_eq!(key, serde_json::json!({ "id": txn_id }));
        assert_eq!(begin_rec.header("id"), Some(txn_id.as_bytes()));
    }
    let slot = config.slot.clone();
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
            confirmed_flush_lsn(&client, &slot).await.unwrap_or(0) >= end
        })
        .await,
        "the transactions (markers included) are confirmed"
    );
}

/// The polling relayer reads the template and filter columns with SQL: the same routing and
/// the same filter as the stream; filtered rows are marked dispatched, never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poll_routes_by_template_and_marks_filtered_rows_dispatched() {
    let Some(kafka) = shared_kafka().await else { return };
    let pg = shared_cluster().await;
    let db = unique_name("pollj");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    crate::harness::workload::create_schema(&client, OutboxSchema::A).await;
    client
        .batch_execute("ALTER TABLE events_outbox ADD COLUMN tenant text")
        .await
        .unwrap();
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers())
        .on_kafka(&kafka)
        .set("poll", "dispatched_column", "dispatched_at")
        .set("poll", "interval_ms", 20)
        .topic_template("${tenant}.${type}");
    let config = with_filter(config, &["order.*"]);
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut relay = RelayProcess::poll(&config);
    let passing = insert_filtered_mix(&client, false).await;
    let records = kafka
        .collect(
            &[
                "acme.order.placed",
                "globex.order.paid",
                "initech.order.placed",
                "acme.audit.read",
            ],
            passing.len(),
            Duration::from_secs(60),
        )
        .await;
    let mut got: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (
                r.topic.clone(),
                String::from_utf8_lossy(r.header("id").unwrap()).into_owned(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        ("acme.order.placed".to_owned(), passing[0].clone()),
        ("globex.order.paid".to_owned(), passing[1].clone()),
    ];
    want.sort();
    assert_eq!(got, want);
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
            let pending: i64 = client
                .query_one("SELECT count(*) FROM events_outbox WHERE dispatched_at IS NULL", &[])
                .await
                .unwrap()
                .get(0);
            pending == 0
        })
        .await,
        "filtered rows are marked dispatched too; log:\n{}",
        relay.log_text()
    );
    assert!(relay.sigterm());
    relay.wait_exit(Duration::from_secs(30)).await.expect("poll stops");
}
