//! Adopting Debezium's slot and publication (docs/migrating-from-debezium.md, "Fastest
//! switch-over"): a `FOR ALL TABLES` publication with every operation is used as it is, the
//! relay publishes only the outbox's inserts from it and still confirms past WAL made of nothing
//! else, and a slot of another plugin is refused by `setup` and `run` with the way out.
//!
//! Slot names are cluster-wide and the cluster is shared, so Debezium's `debezium` slot is
//! played by a fresh name starting with `debezium`; `dbz_publication` is per database.

use std::time::Duration;

use tokio_postgres::Client;

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
