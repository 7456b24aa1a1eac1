//! Stream shapes: whatever a transaction looks like in the WAL, every committed outbox event is
//! published once, in commit order, and nothing that was rolled back is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::workload::{
    expect_binary, insert_binary_payloads, insert_event, make_payload_bytea, new_uuid, Committed, ExpectedEvent,
    OutboxSchema, Workload,
};
use crate::harness::*;

/// Generous bound on the relay's peak RSS while it streams one 200,000-event transaction.
const RSS_BOUND_KB: u64 = 256 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_of_200k_events_streams_with_bounded_memory() {
    const EVENTS: i64 = 200_000;
    const AGGREGATES: i64 = 8;
    let kafka = MockKafka::new(1);
    let (db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    // Far below the transaction's size, so the server spills it to disk while decoding.
    client
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" SET logical_decoding_work_mem = '64kB'"
        ))
        .await
        .unwrap();
    // Protocol 1, the server spilling (`streaming.rs` has the streamed path).
    let config = config
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("postgres", "streaming", "off");
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let aggregates: Vec<String> = (0..AGGREGATES).map(|_| new_uuid()).collect();
    let row = client
        .query_one(
            "WITH ins AS (
                INSERT INTO events_outbox (aggregate_id, type, payload)
                SELECT ($1::text[])[(1 + g % $2::bigint)::int]::uuid, 'order.placed',
                       jsonb_build_object('seq', g, 'pad', repeat('x', 64))
                  FROM generate_series(0, $3::bigint - 1) g
                RETURNING id)
             SELECT min(id), max(id), count(*) FROM ins",
            &[&aggregates, &AGGREGATES, &EVENTS],
        )
        .await
        .expect("one 200,000-row transaction");
    let (first_id, last_id, count): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((count, last_id - first_id + 1), (EVENTS, EVENTS));

    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        EVENTS as usize,
        Duration::from_secs(150),
    )
    .await;
    let peak_kb = peak_rss_kb(relay.pid()).expect("relay still running");
    let mut seen = HashSet::new();
    let mut last_by_key: HashMap<String, i64> = HashMap::new();
    for r in &records {
        let id: i64 = id_of(r).parse().expect("numeric id");
        assert!((first_id..=last_id).contains(&id), "unexpected id {id}");
        if seen.insert(id) {
            let prev = last_by_key.insert(r.key_str().unwrap().to_owned(), id);
            assert!(
                prev.is_none_or(|p| p < id),
                "aggregate {:?}: {id} after {prev:?}",
                r.key_str()
            );
        }
    }
    assert_eq!(seen.len() as i64, EVENTS, "every event of the transaction arrived");
    let spilled = wait_until(Duration::from_secs(20), Duration::from_millis(250), || async {
        let row = client
            .query_opt(
                "SELECT spill_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
                &[&config.slot],
            )
            .await
            .unwrap();
        row.is_some_and(|r| r.get::<_, i64>(0) > 0)
    })
    .await;
    assert!(
        spilled,
        "the server never spilled the transaction: logical_decoding_work_mem did not apply"
    );
    eprintln!("200k-event transaction: relay peak RSS {} MB", peak_kb / 1024);
    assert!(
        peak_kb < RSS_BOUND_KB,
        "relay peak RSS {peak_kb} kB exceeds the bound {RSS_BOUND_KB} kB"
    );
}

/// Savepoints, two-phase commit, TRUNCATE, insert-then-delete — each in the WAL as it really is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn savepoints_prepared_transactions_truncate_and_insert_delete() {
    let Some(pg) = PgCluster::start_dedicated(&[("max_prepared_transactions", "10")]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let db = unique_name("shapes");
    pg.create_database(&db).await;
    let mut client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}");
    setup(&config).await;
    // TRUNCATE must reach the relay (and be ignored), not just be unpublished.
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {} SET (publish = 'insert, truncate')",
            config.publication
        ))
        .await
        .unwrap();
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let agg = new_uuid();
    let a = OutboxSchema::A;
    let mut expected = Vec::new();
    let mut never = Vec::new();

    // A savepoint rolled back inside a committed transaction.
    client.batch_execute("BEGIN").await.unwrap();
    expected.push(insert_event(&client, a, &agg, 0).await);
    client.batch_execute("SAVEPOINT s1").await.unwrap();
    never.push(insert_event(&client, a, &agg, 100).await);
    client.batch_execute("ROLLBACK TO SAVEPOINT s1").await.unwrap();
    expected.push(insert_event(&client, a, &agg, 1).await);
    client.batch_execute("COMMIT").await.unwrap();

    // PREPARE TRANSACTION, then COMMIT PREPARED after another transaction committed: the
    // prepared one's events come after it (commit order, not prepare order).
    client.batch_execute("BEGIN").await.unwrap();
    let prepared_ev = insert_event(&client, a, &agg, 2).await;
    client.batch_execute("PREPARE TRANSACTION 'p_commit'").await.unwrap();
    expected.push(insert_event(&client, a, &agg, 3).await);
    client.batch_execute("COMMIT PREPARED 'p_commit'").await.unwrap();
    expected.push(prepared_ev);
    // ... and ROLLBACK PREPARED.
    client.batch_execute("BEGIN").await.unwrap();
    never.push(insert_event(&client, a, &agg, 101).await);
    client.batch_execute("PREPARE TRANSACTION 'p_rollback'").await.unwrap();
    client.batch_execute("ROLLBACK PREPARED 'p_rollback'").await.unwrap();

    // TRUNCATE of the outbox between inserts.
    expected.push(insert_event(&client, a, &agg, 4).await);
    client.batch_execute("TRUNCATE events_outbox").await.unwrap();
    expected.push(insert_event(&client, a, &agg, 5).await);

    // Insert and delete of the same row in one transaction: the insert was committed.
    let tx = client.transaction().await.unwrap();
    let ev = insert_event(&tx, a, &agg, 6).await;
    tx.execute("DELETE FROM events_outbox WHERE id = $1::text::bigint", &[&ev.id])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expected.push(ev);

    let records = collect_each_once(&kafka, &expected, &relay).await;
    let ids: Vec<String> = records.iter().map(id_of).collect();
    assert_eq!(
        ids,
        expected.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        "commit order"
    );
    assert!(
        never.iter().all(|n| !ids.contains(&n.id)),
        "rolled-back events were published"
    );
    assert_eq!(
        relay.log_text().matches("streaming started").count(),
        1,
        "{}",
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_producers_interleaving() {
    let kafka = MockKafka::new(3);
    let (db, _client, config) = prepared(OutboxSchema::B, &kafka.bootstrap_servers()).await;
    let _relay = RelayProcess::run(&config.max_in_flight(500));
    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::B, 5_000, 200, 50)).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(90),
    )
    .await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    assert_eq!(dups, 0);
    check_order(&committed, &records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_case_outbox_in_a_non_public_schema() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let db = unique_name("mixed");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client
        .batch_execute(
            r#"CREATE SCHEMA "Sales";
               CREATE TABLE "Sales"."OutBox" (
                   "Id" bigserial PRIMARY KEY,
                   "AggregateId" text NOT NULL,
                   "EventType" text NOT NULL,
                   "Payload" jsonb NOT NULL,
                   "CreatedAt" timestamptz NOT NULL DEFAULT now());"#,
        )
        .await
        .unwrap();
    let mut config = RelayConfig::new(&pg.url(&db), &kafka.bootstrap_servers()).route(PREFIX_REGEX, "${routedByValue}");
    config.table = r#""Sales"."OutBox""#.into();
    config.id_column = r#""Id""#.into();
    config.key_column = r#""AggregateId""#.into();
    config.route_by_column = r#""EventType""#.into();
    config.payload_column = r#""Payload""#.into();
    config.timestamp_column = Some(r#""CreatedAt""#.into());
    setup(&config).await;
    let relay = RelayProcess::run(&config);
    let mut expected = Vec::new();
    for seq in 0..20u64 {
        let agg = format!("agg-{}", seq % 3);
        let row = client
            .query_one(
                r#"INSERT INTO "Sales"."OutBox" ("AggregateId", "EventType", "Payload")
                   VALUES ($1, 'order.placed', jsonb_build_object('seq', $2::bigint)) RETURNING "Id"::text, "Payload"::text"#,
                &[&agg, &(seq as i64)],
            )
            .await
            .unwrap();
        expected.push(ExpectedEvent {
            id: row.get(0),
            aggregate_id: agg,
            event_type: "order.placed".into(),
            payload_text: row.get(1),
            seq,
        });
    }
    let records = collect_each_once(&kafka, &expected, &relay).await;
    check_order(&committed_of(&expected), &records);
}

/// Collects topic `order` until every expected event arrived (60 s at most), asserts each arrived
/// exactly once, and returns the records for further checks.
async fn collect_each_once(kafka: &MockKafka, expected: &[ExpectedEvent], relay: &RelayProcess) -> Vec<Received> {
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        expected.len(),
        Duration::from_secs(60),
    )
    .await;
    let dups = check_delivered(expected, &records, |_| "order".to_owned());
    assert_eq!(dups, 0, "log:\n{}", relay.log_text());
    records
}

fn committed_of(events: &[ExpectedEvent]) -> Committed {
    let mut by_aggregate: BTreeMap<String, Vec<ExpectedEvent>> = BTreeMap::new();
    for e in events {
        by_aggregate.entry(e.aggregate_id.clone()).or_default().push(e.clone());
    }
    Committed { by_aggregate }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_and_drop_unmapped_columns_under_load() {
    let kafka = MockKafka::new(3);
    let (db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config.route(PREFIX_REGEX, "${routedByValue}");
    let relay = RelayProcess::run(&config);
    let url = shared_cluster().await.url(&db);
    let mut w = Workload::new(OutboxSchema::A, 2_000, 40, 8);
    w.pause = Duration::from_millis(5);
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    for ddl in [
        "ALTER TABLE events_outbox ADD COLUMN note text DEFAULT 'n'",
        "ALTER TABLE events_outbox ADD COLUMN extra int",
        "ALTER TABLE events_outbox DROP COLUMN note",
        "ALTER TABLE events_outbox DROP COLUMN dispatched_at",
        "ALTER TABLE events_outbox DROP COLUMN extra",
    ] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.batch_execute(ddl).await.unwrap_or_else(|e| panic!("{ddl}: {e}"));
    }
    let committed = load.await.expect("workload");
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(
        check_delivered(&all, &records, |_| "order".to_owned()),
        0,
        "{}",
        relay.log_text()
    );
    check_order(&committed, &records);
    assert!(
        relay.log_text().contains("column mapping refreshed"),
        "{}",
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_megabyte_payload_and_non_ascii_keys_and_payloads() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::B, &kafka.bootstrap_servers()).await;
    // librdkafka's default message.max.bytes (1,000,000) is below 1 MiB: raise it, as an
    // operator publishing such events must (docs/reliability.md).
    let relay = RelayProcess::run(&config.kafka("message.max.bytes", "3000000"));
    let mut expected = Vec::new();
    for (i, key) in ["客户-Ünïcødé-🚀", "ключ/αβγ", "plain-ascii"].iter().enumerate() {
        let key = format!("{key}-{}", new_uuid());
        expected.push(insert_payload(&client, &key, &format!("{{\"text\": \"naïve café 日本語 🎉 {i}\"}}")).await);
    }
    let big_key = format!("big-🚀-{}", new_uuid());
    let blob = "é".repeat(512 * 1024);
    expected.push(insert_payload(&client, &big_key, &format!("{{\"blob\": \"{blob}\"}}")).await);
    let big = expected.last().unwrap().payload_text.len();
    assert!(big >= 1024 * 1024, "the payload is {big} bytes, not ≥ 1 MiB");
    collect_each_once(&kafka, &expected, &relay).await;
}

async fn insert_payload(client: &Client, key: &str, payload: &str) -> ExpectedEvent {
    let row = client
        .query_one(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             VALUES (gen_random_uuid(), 'order', $1, 'order.placed', $2::text::jsonb)
             RETURNING id::text, payload::text",
            &[&key, &payload],
        )
        .await
        .unwrap();
    ExpectedEvent {
        id: row.get(0),
        aggregate_id: key.into(),
        event_type: "order.placed".into(),
        payload_text: row.get(1),
        seq: 0,
    }
}

/// Events written with `pg_logical_emit_message` into a database that has no outbox table at
/// all: the publication is empty; messages reach the relay regardless.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn message_prefix_events_without_an_outbox_table() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let db = unique_name("msgs");
    pg.create_database(&db).await;
    let mut client = pg.client(&db).await;
    install_walinspect(&client).await;
    let config = RelayConfig::new(&pg.url(&db), &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("outbox", "message_prefix", "outbox");
    // `setup` wants the outbox table; without one, create the empty publication and the slot.
    // (Two statements: a slot cannot be created in a transaction that already wrote.)
    client
        .batch_execute(&format!("CREATE PUBLICATION {}", config.publication))
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
            config.slot
        ))
        .await
        .unwrap();
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );

    let agg = format!("agg-{}", new_uuid());
    let message = |id: &str, payload: &str| {
        format!(r#"{{"type": "order.placed", "aggregate_id": "{agg}", "id": "{id}", "payload": {payload}}}"#)
    };
    let payloads = [r#"{"b": 1,  "a": [2]}"#, r#""just text""#, "[1, 2, 3]", r#"{"ü": "✓"}"#];
    // tx1: one event, plus a message with another prefix (not an event).
    let tx = client.transaction().await.unwrap();
    emit_message(&tx, true, "outbox", &message("m1", payloads[0])).await;
    emit_message(&tx, true, "someone-else", &message("x1", "1")).await;
    tx.commit().await.unwrap();
    // tx2: two events.
    let tx = client.transaction().await.unwrap();
    emit_message(&tx, true, "outbox", &message("m2", payloads[1])).await;
    emit_message(&tx, true, "outbox", &message("m3", payloads[2])).await;
    tx.commit().await.unwrap();
    // Rolled back: never published.
    let tx = client.transaction().await.unwrap();
    emit_message(&tx, true, "outbox", &message("m4", "1")).await;
    tx.rollback().await.unwrap();
    // Non-transactional: ignored (it is not atomic with any business write).
    emit_message(&client, false, "outbox", &message("m5", "1")).await;
    let tx = client.transaction().await.unwrap();
    let probe = TxnProbe::start(&tx).await;
    emit_message(&tx, true, "outbox", &message("m6", payloads[3])).await;
    tx.commit().await.unwrap();
    let last = probe.finish(&client).await;

    let records = collect(&kafka.bootstrap_servers(), &["order"], 4, Duration::from_secs(30)).await;
    let got: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                id_of(r),
                r.key_str().unwrap_or_default().to_owned(),
                r.payload_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = ["m1", "m2", "m3", "m6"]
        .iter()
        .zip(payloads)
        .map(|(id, p)| ((*id).to_owned(), agg.clone(), p.to_owned()))
        .collect();
    assert_eq!(got, want, "log:\n{}", relay.log_text());
    assert!(confirmed_reaches(&client, &config.slot, last.end_lsn, Duration::from_secs(15)).await);
    assert!(
        relay.log_text().contains("ignored a non-transactional"),
        "{}",
        relay.log_text()
    );
}

/// `run` with a `bytea` payload column (or one of a domain over a domain over `bytea`): the
/// record value is the column's bytes, not PostgreSQL's `\x…` text of them.
async fn bytea_payload_streams_as_its_bytes(domain: bool) {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let db = unique_name("bytea");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    make_payload_bytea(&client, domain).await;
    let config = RelayConfig::new(&pg.url(&db), &kafka.bootstrap_servers());
    setup(&config).await;
    let relay = RelayProcess::run(&config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    let expected = insert_binary_payloads(&client).await;
    expect_binary(&kafka.bootstrap_servers(), &expected, Duration::from_secs(60), || {
        relay.log_text()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bytea_payload_is_published_as_its_bytes() {
    bytea_payload_streams_as_its_bytes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payload_of_a_domain_over_bytea_is_published_as_its_bytes() {
    bytea_payload_streams_as_its_bytes(true).await;
}
