//! End-to-end: real PostgreSQL → `outbox-relay run` (a child process) → a real Apache Kafka
//! broker (the harness's shared one; a cluster of the test's own where the broker is killed)
//! → an rdkafka consumer.

use std::collections::HashSet;
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

async fn end_to_end(schema: OutboxSchema) {
    let Some(kafka) = shared_kafka().await else { return };
    let (db, mut client, mut config) = prepared_ns(schema, &kafka).await;
    // All of an aggregate's events in one topic, so "per-aggregate order" is observable.
    config = match schema {
        OutboxSchema::A => config.route(PREFIX_REGEX, "${routedByValue}"),
        OutboxSchema::B => config, // routes by aggregate_type = "order"
    };
    let mut relay = RelayProcess::run(&config);
    let url = shared_cluster().await.url(&db);

    let mut committed = run_workload(&url, &Workload::new(schema, 10_000, 100, 8)).await;
    let rolled_back = insert_rolled_back(&mut client, schema, &new_uuid(), 3).await;
    let multi_agg = new_uuid();
    let multi = insert_multi_row(&client, schema, &multi_agg, 0, 5).await;
    committed.by_aggregate.insert(multi_agg, multi);
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    assert_eq!(all.len(), 10_005);

    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    assert_eq!(dups, 0, "a clean run delivers exactly once");
    check_order(&committed, &records);
    let rolled: HashSet<&str> = rolled_back.iter().map(|e| e.id.as_str()).collect();
    assert!(records
        .iter()
        .all(|r| !rolled.contains(String::from_utf8_lossy(r.header("id").unwrap()).as_ref())));
    assert!(
        records
            .iter()
            .all(|r| r.timestamp_ms.is_some_and(|t| t > 1_600_000_000_000)),
        "created_at → record timestamp"
    );

    // Graceful stop: exit 0, and a final status update confirms everything acknowledged.
    let (last, commit_end) = commit_one(&mut client, schema).await;
    let records = kafka.collect(&["order"], all.len() + 1, Duration::from_secs(60)).await;
    check_delivered(&[all, vec![last]].concat(), &records, |_| "order".to_owned());
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", relay.log_text());
    let confirmed = confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0);
    assert!(
        confirmed >= commit_end,
        "after shutdown confirmed {} < last commit {}",
        format_lsn(confirmed),
        format_lsn(commit_end)
    );
    let log = relay.log_text();
    assert!(
        log.contains("streaming started") && log.contains("stream stopped"),
        "log:\n{log}"
    );
}

/// Commits one event in its own transaction; returns it and the end LSN of its commit record.
async fn commit_one(client: &mut Client, schema: OutboxSchema) -> (ExpectedEvent, u64) {
    let before = current_wal_lsn(client).await;
    let tx = client.transaction().await.unwrap();
    let xid: i64 = tx.query_one("SELECT txid_current()", &[]).await.unwrap().get(0);
    let ev = insert_event(&tx, schema, &new_uuid(), 0).await;
    tx.commit().await.unwrap();
    let after = current_wal_lsn(client).await;
    (ev, commit_end_lsn(client, xid as u32, before, after).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_a_events_outbox_end_to_end() {
    end_to_end(OutboxSchema::A).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_b_outbox_end_to_end() {
    end_to_end(OutboxSchema::B).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn default_route_is_the_type_and_headers_are_mapped() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::B, &kafka).await;
    let config = RelayConfig {
        route_by_column: "event_type".into(),
        ..config
    }
    .header_column("aggregate_type", "x-aggregate-type");
    let _relay = RelayProcess::run(&config);
    let agg = new_uuid();
    let events = insert_multi_row(&client, OutboxSchema::B, &agg, 0, 4).await;
    let topics: Vec<String> = events
        .iter()
        .map(|e| e.event_type.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = kafka.collect(&topic_refs, events.len(), Duration::from_secs(60)).await;
    check_delivered(&events, &records, |e| e.event_type.clone());
    assert!(records
        .iter()
        .all(|r| r.header("x-aggregate-type") == Some(b"order".as_slice())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_after_sigterm_and_after_sigkill_loses_nothing() {
    let Some(kafka) = shared_kafka().await else { return };
    let (db, _client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config.route(PREFIX_REGEX, "${routedByValue}");
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, 3_000, 30, 4);
    w.pause = Duration::from_millis(2);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    let mut relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(relay.sigterm());
    let st = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exit after SIGTERM");
    assert!(st.success(), "{}", relay.log_text());

    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(relay.sigkill());
    drop(relay);

    let _relay = RelayProcess::run(&config);
    let committed = load.await.expect("workload");
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(120)).await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    assert!(dups <= 10_000, "duplicates {dups} exceed the in-flight bound");
}

/// The exact end LSN of the commit record of transaction `xid` (pg_walinspect).
pub(crate) async fn commit_end_lsn(client: &Client, xid: u32, from: u64, to: u64) -> u64 {
    let row = client
        .query_one(
            // `to` capped at the flushed WAL, as in `fault_support::commit_lsns`.
            "SELECT end_lsn::text
               FROM pg_get_wal_records_info($1::text::pg_lsn, LEAST($2::text::pg_lsn, pg_current_wal_flush_lsn()))
              WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $3",
            &[&format_lsn(from), &format_lsn(to), &xid.to_string()],
        )
        .await
        .expect("find the commit record");
    parse_lsn(row.get(0)).expect("lsn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lsn_is_confirmed_only_after_kafka_acknowledged() {
    // The broker is killed and started again: a cluster of this test's own.
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single()).await else {
        return;
    };
    let kafka = cluster.own_ns();
    let (_db, mut client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    // A tiny in-flight budget keeps the relay paused (not reading) for the whole outage, longer
    // than the cluster's 5 s wal_sender_timeout: status updates must keep the walsender alive.
    let config = config.max_in_flight(2);
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );

    cluster.kill(1);
    let before = current_wal_lsn(&client).await;
    let tx = client.transaction().await.unwrap();
    let xid: i64 = tx.query_one("SELECT txid_current()", &[]).await.unwrap().get(0);
    let agg = new_uuid();
    let mut events = Vec::new();
    for seq in 0..5 {
        events.push(insert_event(&tx, OutboxSchema::A, &agg, seq).await);
    }
    tx.commit().await.unwrap();
    let after = current_wal_lsn(&client).await;
    let commit_end = commit_end_lsn(&client, xid as u32, before, after).await;

    // Other tests keep the shared cluster's WAL moving, so keepalives arrive all the time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let confirmed = confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0);
        assert!(
            confirmed < commit_end,
            "confirmed_flush_lsn {} passed the commit {} of events Kafka never acknowledged",
            format_lsn(confirmed),
            format_lsn(commit_end)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    cluster.restart(1).await;
    let topics: HashSet<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    let records = kafka.collect(&topics, events.len(), Duration::from_secs(60)).await;
    check_delivered(&events, &records, |e| e.event_type.clone());
    let advanced = wait_until(Duration::from_secs(30), Duration::from_millis(200), || {
        let client = &client;
        let slot = config.slot.clone();
        async move { confirmed_flush_lsn(client, &slot).await.unwrap_or(0) >= commit_end }
    })
    .await;
    assert!(
        advanced,
        "confirmed_flush_lsn never reached the acknowledged commit; log:\n{}",
        relay.log_text()
    );
    let log = relay.log_text();
    assert_eq!(
        log.matches("streaming started").count(),
        1,
        "the paused relay lost its walsender; log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_outbox_does_not_pin_wal_while_other_tables_are_busy() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    client
        .batch_execute("CREATE TABLE busy (id serial primary key, filler text)")
        .await
        .unwrap();
    let start = current_wal_lsn(&client).await;
    // ~20 MB of WAL in tables outside the publication.
    for _ in 0..20 {
        client
            .batch_execute("INSERT INTO busy (filler) SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
            .await
            .unwrap();
    }
    let written = current_wal_lsn(&client).await;
    assert!(
        written - start >= 20_000_000,
        "only {} bytes of WAL written",
        written - start
    );
    let advanced = wait_until(Duration::from_secs(30), Duration::from_millis(200), || {
        let client = &client;
        let slot = config.slot.clone();
        async move { confirmed_flush_lsn(client, &slot).await.unwrap_or(0) >= written }
    })
    .await;
    let confirmed = confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0);
    assert!(
        advanced,
        "confirmed_flush_lsn {} stuck behind {} ; log:\n{}",
        format_lsn(confirmed),
        format_lsn(written),
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_and_scram_with_tight_backpressure() {
    let pg = shared_cluster().await;
    let (Some(_), Some(ca)) = (pg.scram_url("postgres"), pg.ca_cert_path()) else {
        crate::harness::needs::missing(
            crate::harness::needs::LOCAL_POSTGRES,
            "tls_and_scram_with_tight_backpressure",
            "the external server has no TLS/SCRAM user",
        );
        return;
    };
    let Some(kafka) = shared_kafka().await else { return };
    let db = unique_name("tls");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let scram_url = pg.scram_url(&db).unwrap();
    let config = RelayConfig::new(&scram_url, &kafka.bootstrap_servers())
        .on_kafka(&kafka)
        .sslrootcert(&ca)
        .max_in_flight(3)
        .route(PREFIX_REGEX, "${routedByValue}");
    setup(&config).await;
    let relay = RelayProcess::run(&config);
    let url = pg.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 300, 10, 2)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(60)).await;
    check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&committed, &records);
    assert!(
        !relay.log_text().contains(SCRAM_PASSWORD),
        "the password reached a log line"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_changes_updates_and_deletes_mid_stream() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, mut client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    // Updates and deletes must reach the relay too, to prove they are ignored, not just unpublished.
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {} SET (publish = 'insert, update, delete')",
            config.publication
        ))
        .await
        .unwrap();
    let config = config.route(PREFIX_REGEX, "${routedByValue}");
    let relay = RelayProcess::run(&config);
    let agg = new_uuid();
    let mut expected = insert_multi_row(&client, OutboxSchema::A, &agg, 0, 3).await;
    client
        .batch_execute("ALTER TABLE events_outbox ADD COLUMN note text DEFAULT 'n'")
        .await
        .unwrap();
    expected.extend(insert_multi_row(&client, OutboxSchema::A, &agg, 3, 3).await);
    client
        .batch_execute("ALTER TABLE events_outbox DROP COLUMN note")
        .await
        .unwrap();
    expected.extend(insert_multi_row(&client, OutboxSchema::A, &agg, 6, 3).await);
    // The polling relayer's marker, and an outbox kept empty by insert-then-delete.
    client
        .batch_execute("UPDATE events_outbox SET dispatched_at = now()")
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let ev = insert_event(&tx, OutboxSchema::A, &agg, 9).await;
    tx.execute("DELETE FROM events_outbox WHERE id = $1::text::bigint", &[&ev.id])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expected.push(ev);
    let records = kafka.collect(&["order"], expected.len(), Duration::from_secs(60)).await;
    let dups = check_delivered(&expected, &records, |_| "order".to_owned());
    assert_eq!(
        dups,
        0,
        "updates or deletes were published as events; log:\n{}",
        relay.log_text()
    );
    let ids: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap()).into_owned())
        .collect();
    assert_eq!(
        ids,
        expected.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        "commit order"
    );
    assert!(
        relay.log_text().contains("column mapping refreshed"),
        "{}",
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_deliveries_restart_the_stream_and_lose_nothing() {
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single()).await else {
        return;
    };
    let kafka = cluster.own_ns();
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config
        .route(PREFIX_REGEX, "${routedByValue}")
        .kafka("message.timeout.ms", "1500")
        .set("relay", "reconnect_backoff_initial_ms", 200)
        .set("relay", "reconnect_backoff_max_ms", 1000);
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    cluster.kill(1);
    let agg = new_uuid();
    let expected = insert_multi_row(&client, OutboxSchema::A, &agg, 0, 20).await;
    assert!(
        relay.wait_for_log("reconnecting", Duration::from_secs(30)).await,
        "a final delivery failure must restart streaming; log:\n{}",
        relay.log_text()
    );
    assert!(
        relay.log_text().contains("Kafka delivery failed"),
        "{}",
        relay.log_text()
    );
    cluster.restart(1).await;
    let records = kafka.collect(&["order"], expected.len(), Duration::from_secs(60)).await;
    check_delivered(&expected, &records, |_| "order".to_owned());
    let committed = Committed {
        by_aggregate: [(agg, expected)].into_iter().collect(),
    };
    check_order(&committed, &records);
}
