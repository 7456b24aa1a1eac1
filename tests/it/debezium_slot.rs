//! Adopting Debezium's slot and publication (docs/migrating-from-debezium.md, "Fastest
//! switch-over"): a `FOR ALL TABLES` publication with every operation is used as it is, the
//! relay publishes only the outbox's inserts from it and still confirms past WAL made of nothing
//! else, and a slot of another plugin is refused by `setup` and `run` with the way out.
//!
//! Slot names are cluster-wide and the cluster is shared, so Debezium's `debezium` slot is
//! played by a fresh name starting with `debezium`; `dbz_publication` is per database.

use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::fault_support::confirmed_reaches;
use crate::harness::workload::{insert_event, new_uuid, AGGREGATE_TYPE};
use crate::harness::*;

const DBZ_PUBLICATION: &str = "dbz_publication";

/// A database with schema B (Debezium's sample outbox and an `orders` table) and what a
/// Debezium connector with `plugin.name = <plugin>` and `publication.autocreate.mode =
/// all_tables` leaves behind: `dbz_publication` FOR ALL TABLES (every operation) and its slot.
async fn debezium_leftovers(plugin: &str, bootstrap: &str) -> (Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("dbz_slot");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::B).await;
    let slot = unique_name("debezium");
    client
        .batch_execute(&format!("CREATE PUBLICATION {DBZ_PUBLICATION} FOR ALL TABLES"))
        .await
        .unwrap();
    client
        .execute("SELECT pg_create_logical_replication_slot($1, $2)", &[&slot, &plugin])
        .await
        .unwrap();
    let config = RelayConfig::for_schema(OutboxSchema::B, &pg.url(&db), bootstrap)
        .slot(&slot)
        .publication(DBZ_PUBLICATION);
    (client, config)
}

/// Everything but outbox inserts, in separate transactions: another table's inserts, updates and
/// deletes, and updates, deletes and a truncate of the outbox (what a cleanup job does).
async fn other_changes(client: &Client) {
    for _ in 0..3 {
        let id = new_uuid();
        client
            .execute(
                "INSERT INTO orders (id, customer_id, total_cents, status) VALUES ($1::text::uuid, $1::text::uuid, 1, 'new')",
                &[&id],
            )
            .await
            .unwrap();
        client
            .execute("UPDATE orders SET status = 'paid' WHERE id = $1::text::uuid", &[&id])
            .await
            .unwrap();
        client
            .execute("DELETE FROM orders WHERE id = $1::text::uuid", &[&id])
            .await
            .unwrap();
    }
    client
        .batch_execute("UPDATE outbox SET processed_at = now() WHERE processed_at IS NULL")
        .await
        .unwrap();
    client
        .batch_execute("DELETE FROM outbox WHERE processed_at IS NOT NULL")
        .await
        .unwrap();
    client.batch_execute("TRUNCATE outbox").await.unwrap();
}

/// `per_aggregate` events for each of `aggregates`, one transaction each, round-robin, with
/// other tables' changes in the same transactions; appended to `committed` in commit order.
async fn outbox_inserts(client: &mut Client, committed: &mut Committed, aggregates: &[String], per_aggregate: u64) {
    for _ in 0..per_aggregate {
        for agg in aggregates {
            let events = committed.by_aggregate.entry(agg.clone()).or_default();
            let seq = events.len() as u64;
            let tx = client.transaction().await.unwrap();
            tx.execute(
                "INSERT INTO orders (id, customer_id, total_cents, status) VALUES ($1::text::uuid, $1::text::uuid, 2, 'x')",
                &[&new_uuid()],
            )
            .await
            .unwrap();
            events.push(insert_event(&tx, OutboxSchema::B, agg, seq).await);
            tx.commit().await.unwrap();
        }
    }
}

async fn publication_row(client: &Client) -> (bool, [bool; 4]) {
    let row = client
        .query_one(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1",
            &[&DBZ_PUBLICATION],
        )
        .await
        .unwrap();
    (row.get(0), [row.get(1), row.get(2), row.get(3), row.get(4)])
}

/// (a) Debezium's FOR ALL TABLES, all-operations publication and its pgoutput slot, adopted:
/// setup changes nothing (and says what the relay ignores), run publishes exactly the outbox's
/// inserts in commit order, and the slot's confirmed position moves past WAL made only of
/// other tables' changes and the outbox's updates, deletes and truncates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopted_all_tables_publication_relays_only_outbox_inserts_and_the_slot_advances() {
    let kafka = MockKafka::new(1);
    let (mut client, config) = debezium_leftovers("pgoutput", &kafka.bootstrap_servers()).await;
    let aggregates: Vec<String> = (0..4).map(|_| new_uuid()).collect();
    let mut committed = Committed::default();

    // Written while "Debezium" was stopped: the slot holds it.
    outbox_inserts(&mut client, &mut committed, &aggregates, 5).await;
    other_changes(&client).await;

    let before = publication_row(&client).await;
    assert_eq!(before, (true, [true; 4]));
    let out = run_cmd(&["setup"], &config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "setup must accept Debezium's publication: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slot_line = format!("slot {}: already exists", config.slot);
    for needle in [
        "publication dbz_publication: already exists",
        slot_line.as_str(),
        "note: publication dbz_publication publishes update, delete, truncate operations, and every table",
        "ignores changes of other tables",
        "ALTER PUBLICATION dbz_publication SET (publish = 'insert')",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from setup's output:\n{stdout}"
        );
    }
    assert_eq!(
        publication_row(&client).await,
        before,
        "setup must leave the publication as it is"
    );

    let relay = RelayProcess::run(&config);
    outbox_inserts(&mut client, &mut committed, &aggregates, 5).await;
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    assert_eq!(all.len(), 40);
    let records = collect(
        &kafka.bootstrap_servers(),
        &[AGGREGATE_TYPE],
        all.len(),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        check_delivered(&all, &records, |_| AGGREGATE_TYPE.to_owned()),
        0,
        "exactly once"
    );
    check_order(&committed, &records);
    assert!(
        relay.log_text().contains("publication used as it is"),
        "{}",
        relay.log_text()
    );

    // WAL with nothing for the relay: the slot still moves past it.
    let confirmed_before = confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0);
    other_changes(&client).await;
    let target = current_wal_lsn(&client).await;
    assert!(target > confirmed_before);
    let advanced = wait_until(Duration::from_secs(30), Duration::from_millis(200), || async {
        confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0) >= target
    })
    .await;
    assert!(
        advanced,
        "confirmed_flush_lsn {} never reached {} after WAL of other changes only",
        format_lsn(confirmed_flush_lsn(&client, &config.slot).await.unwrap_or(0)),
        format_lsn(target)
    );
    // …and none of it became a record.
    let again = collect(
        &kafka.bootstrap_servers(),
        &[AGGREGATE_TYPE],
        all.len() + 1,
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(again.len(), all.len(), "only outbox inserts are published");
    assert_eq!(
        relay.log_text().matches("publication used as it is").count(),
        1,
        "the note is logged once"
    );
    drop(relay);
    drop_slot(&client, &config.slot).await;
}

/// Drops the slot once the killed relay's walsender let go of it (the cluster is shared).
async fn drop_slot(client: &Client, slot: &str) {
    let dropped = wait_until(Duration::from_secs(15), Duration::from_millis(100), || async {
        client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
            .is_ok()
    })
    .await;
    assert!(dropped, "slot {slot} still in use");
}

/// (b) A slot of another plugin (Debezium's `decoderbufs`, played by `test_decoding`): setup and
/// run both refuse it, naming the plugin and the way out, and leave it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_of_another_plugin_is_refused_by_setup_and_run_with_the_way_out() {
    let kafka = MockKafka::new(1);
    let (client, config) = debezium_leftovers("test_decoding", &kafka.bootstrap_servers()).await;
    let needles = [
        "uses output plugin test_decoding",
        "needs pgoutput",
        "postgres.slot",
        "docs/migrating-from-debezium.md",
        "Switch-over without losing an event",
    ];

    let out = run_cmd(&["setup"], &config).await;
    assert!(!out.status.success(), "setup must refuse a test_decoding slot");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from setup's error:\n{stderr}"
        );
    }

    let mut relay = RelayProcess::run(&config);
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("run stops at once on a slot it cannot use");
    assert!(!status.success());
    let log = relay.log_text();
    for needle in needles {
        assert!(log.contains(needle), "{needle:?} missing from run's log:\n{log}");
    }
    assert!(!log.contains("streaming started"), "{log}");

    let plugin: String = client
        .query_one(
            "SELECT plugin::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&config.slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plugin, "test_decoding", "the slot is left alone");
    drop_slot(&client, &config.slot).await;
}

// ------------------------------------------------------------------ the real switch-over

/// (c) The real switch-over from Debezium 3.6: Debezium (embedded engine, EventRouter) streams
/// from its own slot and autocreated `dbz_publication` (FOR ALL TABLES) while rows are inserted
/// continuously, stops mid-stream (its engine commits offsets and flushes the slot on close),
/// more rows are inserted while nothing runs, then the relay adopts the slot and publication.
/// Checked: Debezium's and the relay's records together hold every inserted event (0 lost); the
/// relay's first deliveries are, per aggregate, the tail of its commit order; every event both
/// published is one Debezium emitted (their count is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switch_over_from_debezium_by_adopting_its_slot_loses_nothing() {
    let Some(runner) = Debezium::get() else {
        return;
    };
    let pg = shared_cluster().await;
    if !pg.is_local() {
        crate::harness::needs::missing(
            crate::harness::needs::LOCAL_POSTGRES,
            "switch_over_from_debezium…",
            "Debezium connects as postgres",
        );
        return;
    }
    let db = unique_name("dbz_switch");
    pg.create_database(&db).await;
    let mut client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::B).await;
    let slot = unique_name("debezium");
    let aggregates: Vec<String> = (0..3).map(|_| new_uuid()).collect();
    let mut committed = Committed::default();

    // Debezium stops after this many records, mid-way through the three batches below.
    const DEBEZIUM_RECORDS: usize = 15;
    let spec = serde_json::json!({
        "connector": {
            "database.hostname": "127.0.0.1",
            "database.port": pg.port().to_string(),
            "database.user": "postgres",
            "database.password": "postgres",
            "database.dbname": db,
            "slot.name": slot,
            "plugin.name": "pgoutput",
            "publication.name": DBZ_PUBLICATION,
            "publication.autocreate.mode": "all_tables",
            "table.include.list": "public.outbox",
            // Kafka Connect's default: the slot is flushed on the graceful stop, not before.
            "offset.flush.interval.ms": "60000",
        },
        "records": DEBEZIUM_RECORDS,
        "partitions": 4,
        "variants": [{
            "name": "outbox",
            "smt": {
                "table.field.event.id": "id",
                "table.field.event.key": "aggregate_id",
                "table.field.event.payload": "payload",
                "route.by.field": "aggregate_type",
                "route.topic.replacement": "${routedByValue}",
            },
            "converters": {
                "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            },
        }],
    });
    let debezium = runner.start(&spec, Duration::from_secs(120)).await;

    // Three batches while Debezium runs; it stops after DEBEZIUM_RECORDS of them.
    for _ in 0..3 {
        outbox_inserts_paced(&mut client, &mut committed, &aggregates, 3).await;
    }
    let emitted: Vec<String> = debezium
        .finish(Duration::from_secs(120))
        .await
        .iter()
        .map(|r| {
            assert!(r.error.is_none(), "Debezium: {:?}", r.error);
            let id = r.headers.iter().find(|(k, _)| k == "id").and_then(|(_, v)| v.clone());
            String::from_utf8(id.expect("id header")).expect("utf-8 id")
        })
        .collect();
    assert_eq!(emitted.len(), DEBEZIUM_RECORDS, "Debezium's records");
    let debezium_ids: std::collections::HashSet<String> = emitted.iter().cloned().collect();
    assert_eq!(debezium_ids.len(), emitted.len(), "Debezium emitted an event twice");

    // Nothing runs now: more rows, kept by the slot.
    outbox_inserts(&mut client, &mut committed, &aggregates, 4).await;
    let last_insert = current_wal_lsn(&client).await;

    // The slot Debezium left: free, pgoutput, and where it flushed.
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
            slot_row(&client, &slot).await.is_some_and(|r| !r.active)
        })
        .await,
        "Debezium's slot stays active after its engine closed"
    );
    let flushed = confirmed_flush_lsn(&client, &slot).await.unwrap_or(0);

    let kafka = MockKafka::new(1);
    let config = RelayConfig::for_schema(OutboxSchema::B, &pg.url(&db), &kafka.bootstrap_servers())
        .slot(&slot)
        .publication(DBZ_PUBLICATION);
    let before = publication_row(&client).await;
    assert_eq!(before, (true, [true; 4]), "Debezium's all_tables publication");
    setup(&config).await;
    assert_eq!(publication_row(&client).await, before, "setup leaves it as it is");
    let relay = RelayProcess::run(&config);
    assert!(
        confirmed_reaches(&client, &slot, last_insert, Duration::from_secs(60)).await,
        "the relay never confirmed past the last insert; log:\n{}",
        relay.log_text()
    );
    let records = collect(
        &kafka.bootstrap_servers(),
        &[AGGREGATE_TYPE],
        committed.len() * 2,
        Duration::from_secs(5),
    )
    .await;
    drop(relay);

    // The relay's records: right bytes and topic, no event twice, commit order per aggregate.
    let relay_ids = ids_by_key(&records);
    let relayed: std::collections::HashSet<&str> = relay_ids.values().flatten().map(String::as_str).collect();
    let expected: Vec<ExpectedEvent> = committed
        .all()
        .filter(|e| relayed.contains(e.id.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        check_delivered(&expected, &records, |_| AGGREGATE_TYPE.to_owned()),
        0,
        "the relay published an event twice"
    );
    let mut lost = Vec::new();
    for (agg, events) in &committed.by_aggregate {
        let firsts = relay_ids.get(agg).cloned().unwrap_or_default();
        let start = events.len() - firsts.len();
        let tail: Vec<String> = events[start..].iter().map(|e| e.id.clone()).collect();
        assert_eq!(
            firsts, tail,
            "aggregate {agg}: the relay's deliveries are not the tail of its commit order"
        );
        lost.extend(
            events[..start]
                .iter()
                .filter(|e| !debezium_ids.contains(&e.id))
                .map(|e| e.id.clone()),
        );
    }
    assert!(
        lost.is_empty(),
        "events neither Debezium nor the relay published: {lost:?}"
    );
    let twice: Vec<&str> = relayed
        .iter()
        .copied()
        .filter(|id| debezium_ids.contains(*id))
        .collect();
    let after_debezium = committed.all().filter(|e| !debezium_ids.contains(&e.id)).count();
    assert_eq!(relayed.len(), after_debezium + twice.len());
    eprintln!(
        "switch-over: {} events committed, Debezium published {}, its slot flushed at {}, the relay published {} \
         ({} of them again, all already published by Debezium)",
        committed.len(),
        debezium_ids.len(),
        format_lsn(flushed),
        relayed.len(),
        twice.len()
    );
    drop_slot(&client, &slot).await;
}

/// Like [`outbox_inserts`], with a pause after each transaction so a running Debezium reads
/// them as a stream rather than one batch.
async fn outbox_inserts_paced(client: &mut Client, committed: &mut Committed, aggregates: &[String], rounds: u64) {
    for _ in 0..rounds {
        outbox_inserts(client, committed, aggregates, 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
