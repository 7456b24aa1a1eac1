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
        stderr.contains(r#"route.topic = "tenant" but "public"."events_outbox" has no such column"#)
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
    assert!(
        log.contains(r#"route.topic refers to column \"tenant\""#)
            || log.contains(r#"route.topic refers to column "tenant""#),
        "log:\n{log}"
    );
    assert!(!log.contains("streaming started"), "log:\n{log}");
}
