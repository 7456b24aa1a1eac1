//! `[retention]` against real PostgreSQL and the mock Kafka cluster: the invariant "a row is
//! removed only once it is published" tried the way an operator would break it (a long
//! transaction, the relay stopped and then behind, the slot dropped, a standby), partition
//! rotation under load, poll mode, and bad configuration.
//!
//! Retention runs every second with `keep = "2s"` here, so each scenario spans several runs in
//! a few seconds; the checks themselves do not depend on those values (with the shipped
//! defaults, one minute and seven days, the same steps hold, only slower).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio_postgres::{Client, GenericClient};

use crate::harness::*;

const WAIT: Duration = Duration::from_secs(90);
/// Several retention runs (interval 1 s).
const SEVERAL_RUNS: Duration = Duration::from_secs(6);

/// Schema A, events to topic `order`, retention every second keeping 2 s.
fn with_retention(config: RelayConfig, mode: &str) -> RelayConfig {
    config
        .route(PREFIX_REGEX, "${routedByValue}")
        .status_interval_ms(200)
        .set("retention", "mode", mode)
        .set("retention", "keep", "2s")
        .set("retention", "interval", "1s")
        .set("retention", "batch_size", 7)
}

/// Inserts `n` rows (one transaction each, or the caller's), `age` old by `created_at`; their ids.
async fn insert_rows(client: &impl GenericClient, n: usize, age_seconds: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let row = client
            .query_one(
                "INSERT INTO events_outbox (aggregate_id, type, payload, created_at)
                 VALUES (gen_random_uuid(), 'order.created', '{\"n\": 1}', now() - make_interval(secs => $1::float8))
                 RETURNING id::text",
                &[&(age_seconds as f64)],
            )
            .await
            .expect("insert");
        ids.push(row.get(0));
    }
    ids
}

/// Whether a ranged (not the default) partition of `events_outbox` covers the transaction's
/// `now()`: its bound expression is `FOR VALUES FROM ('…') TO ('…')`.
const A_RANGED_PARTITION_COVERS_NOW: &str = r"
    SELECT EXISTS (
        SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                        'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS b
        WHERE i.inhparent = 'events_outbox'::regclass
          AND b[1]::timestamptz <= now() AND now() < b[2]::timestamptz)";

/// Inserts `n` rows of age 0 in one transaction whose `now()` a ranged partition covers (checked
/// inside that transaction, so the rows land there); `None` if none did within 30 s.
async fn insert_rows_into_a_ranged_partition(client: &mut Client, n: usize) -> Option<Vec<String>> {
    for _ in 0..150 {
        let tx = client.transaction().await.expect("begin");
        let covered: bool = tx
            .query_one(A_RANGED_PARTITION_COVERS_NOW, &[])
            .await
            .expect("partition bounds")
            .get(0);
        if covered {
            let ids = insert_rows(&tx, n, 0).await;
            tx.commit().await.expect("commit");
            return Some(ids);
        }
        tx.rollback().await.expect("rollback");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Schema A's outbox partitioned by range of `created_at`, no partition yet.
const PARTITIONED_OUTBOX: &str = "
    CREATE TABLE events_outbox (
        id bigserial, aggregate_id uuid NOT NULL, type text NOT NULL, payload jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz,
        PRIMARY KEY (id, created_at)
    ) PARTITION BY RANGE (created_at);";

/// [`PARTITIONED_OUTBOX`] with a default partition.
async fn create_partitioned_outbox(client: &Client) {
    client
        .batch_execute(&format!(
            "{PARTITIONED_OUTBOX} CREATE TABLE events_outbox_default PARTITION OF events_outbox DEFAULT;"
        ))
        .await
        .expect("partitioned outbox");
}

/// How many of `ids` are still in the table.
async fn remaining(client: &Client, ids: &[String]) -> i64 {
    client
        .query_one("SELECT count(*) FROM events_outbox WHERE id::text = ANY($1)", &[&ids])
        .await
        .expect("count")
        .get(0)
}

/// Asserts for `window` that every one of `ids` stays in the table.
async fn assert_all_stay(client: &Client, ids: &[String], window: Duration, what: &str) {
    let deadline = tokio::time::Instant::now() + window;
    let mut looks = 0;
    while tokio::time::Instant::now() < deadline {
        let left = remaining(client, ids).await;
        assert_eq!(left, ids.len() as i64, "{what}: an unpublished row was removed");
        looks += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(looks > 5, "{what}: too few looks");
}

async fn wait_all_removed(client: &Client, ids: &[String], what: &str, relay: &RelayProcess) {
    let gone = wait_until(WAIT, Duration::from_millis(200), || async move {
        remaining(client, ids).await == 0
    })
    .await;
    assert!(
        gone,
        "{what}: published rows were not removed; relay log:\n{}",
        relay.log_text()
    );
}

/// The `id` headers of what arrived on topic `order`, once `want` records did.
async fn delivered_ids(kafka: &MockKafka, want: usize) -> BTreeSet<String> {
    collect(&kafka.bootstrap_servers(), &["order"], want, WAIT)
        .await
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").expect("id header")).into_owned())
        .collect()
}

fn assert_delivered(delivered: &BTreeSet<String>, ids: &[String], what: &str) {
    let missing: Vec<&String> = ids.iter().filter(|id| !delivered.contains(*id)).collect();
    assert!(missing.is_empty(), "{what}: never delivered: {missing:?}");
}

async fn stop(mut relay: RelayProcess) -> String {
    assert!(relay.sigterm());
    let status = relay.wait_exit(Duration::from_secs(30)).await.expect("relay exits");
    assert!(status.success(), "exit {status:?}; log:\n{}", relay.log_text());
    relay.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_transaction_keeps_its_row_until_published() {
    // A cluster of its own: the open transaction would hold up every other test's slot
    // creation on the shared one (a logical slot waits for running transactions).
    let Some(pg) = PgCluster::start_dedicated(&[]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let (db, client, config) = prepared_on(&pg, "retlate", OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = with_retention(config, "delete");
    let relay = RelayProcess::run_streaming(&config).await;

    // A transaction starts now (its rows' created_at is its start) and stays open.
    let mut late = pg.client(&db).await;
    let tx = late.transaction().await.expect("begin");
    let late_id: String = tx
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.created', '{}')
             RETURNING id::text",
            &[],
        )
        .await
        .expect("insert in the open transaction")
        .get(0);

    // Meanwhile other rows are published and, once older than keep, removed.
    let early = insert_rows(&client, 20, 0).await;
    assert_delivered(&delivered_ids(&kafka, early.len()).await, &early, "early rows");
    wait_all_removed(&client, &early, "early rows", &relay).await;

    // The late row commits, already older than keep, while the broker is down: the relay cannot
    // publish it, so retention must not remove it.
    kafka.all_brokers_down();
    tx.commit().await.expect("commit the late transaction");
    let late_ids = vec![late_id];
    assert_all_stay(&client, &late_ids, SEVERAL_RUNS, "a late commit, broker down").await;

    kafka.all_brokers_up();
    let delivered = delivered_ids(&kafka, early.len() + 1).await;
    assert_delivered(&delivered, &late_ids, "the late row");
    wait_all_removed(&client, &late_ids, "the late row", &relay).await;
    let log = stop(relay).await;
    assert!(log.contains("retention removed published rows"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_stopped_and_behind_removes_nothing_unpublished() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = with_retention(config, "delete");
    stop(RelayProcess::run_streaming(&config).await).await;

    // Committed while no relay runs, then left for three times keep.
    let ids = insert_rows(&client, 30, 0).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The relay comes back but cannot publish: it streams, retention runs, the slot stays behind.
    kafka.all_brokers_down();
    let relay = RelayProcess::run_streaming(&config).await;
    assert!(
        relay.wait_for_log("retention active", Duration::from_secs(10)).await,
        "{}",
        relay.log_text()
    );
    assert_all_stay(&client, &ids, SEVERAL_RUNS, "relay behind, broker down").await;

    kafka.all_brokers_up();
    assert_delivered(
        &delivered_ids(&kafka, ids.len()).await,
        &ids,
        "rows committed while stopped",
    );
    wait_all_removed(&client, &ids, "rows committed while stopped", &relay).await;
    stop(relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_slot_removes_nothing() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = with_retention(config, "delete").set("relay", "reconnect_backoff_initial_ms", 2000);
    let mut relay = RelayProcess::run_streaming(&config).await;
    kafka.all_brokers_down();
    let ids = insert_rows(&client, 10, 60).await;
    assert_all_stay(&client, &ids, Duration::from_secs(3), "broker down").await;

    // Drop the slot under the relay: end its walsender, then drop before it reconnects.
    let slot = config.slot.clone();
    let dropped = wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
        let (client, slot) = (&client, slot.clone());
        async move {
            let _ = client
                .execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active",
                    &[&slot],
                )
                .await;
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
                .is_ok()
        }
    })
    .await;
    assert!(dropped, "could not drop the slot");
    kafka.all_brokers_up();
    // The relay stops on the missing slot; retention, in it, removed nothing meanwhile.
    assert_all_stay(&client, &ids, SEVERAL_RUNS, "slot dropped").await;
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("relay stops without its slot");
    assert!(!status.success());
    assert_all_stay(&client, &ids, Duration::from_secs(2), "after the relay stopped").await;
    let log = relay.log_text();
    assert!(log.contains(&slot) && log.contains("does not exist"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_removes_nothing() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let plain = config.clone().route(PREFIX_REGEX, "${routedByValue}");
    let active = RelayProcess::run_streaming(&plain).await;
    let standby = RelayProcess::run(&with_retention(config, "delete").set("relay", "standby_poll_ms", 500));
    assert!(
        standby.wait_for_log("standing by", Duration::from_secs(30)).await,
        "{}",
        standby.log_text()
    );
    let ids = insert_rows(&client, 30, 60).await;
    assert_delivered(
        &delivered_ids(&kafka, ids.len()).await,
        &ids,
        "published by the active instance",
    );
    // Published and old, but the only instance with retention stands by.
    assert_all_stay(&client, &ids, SEVERAL_RUNS, "retention on a standby").await;
    assert!(
        !standby.log_text().contains("retention removed"),
        "{}",
        standby.log_text()
    );

    stop(active).await;
    wait_all_removed(&client, &ids, "after the standby took over", &standby).await;
    stop(standby).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_deletes_only_dispatched_rows() {
    let kafka = MockKafka::new(1);
    // A cluster of its own: with the broker down, the poller's claim transaction stays open
    // (row locks, an xid) until the publish ends, and would hold up every other test's slot
    // creation on the shared one (a logical slot waits for running transactions).
    let Some(pg) = PgCluster::start_dedicated(&[]).await else {
        return;
    };
    let db = unique_name("retpoll");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let config = with_retention(
        RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers()),
        "delete",
    )
    .set("poll", "interval_ms", 50);
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    kafka.all_brokers_down();
    let poller = RelayProcess::poll(&config);
    assert!(
        poller.wait_for_log("polling started", Duration::from_secs(30)).await,
        "{}",
        poller.log_text()
    );
    // Old and pending (the broker is down): must stay.
    let pending = insert_rows(&client, 15, 3600).await;
    // Old and marked dispatched by an earlier poller: may go.
    let dispatched = insert_rows(&client, 15, 3600).await;
    client
        .execute(
            "UPDATE events_outbox SET dispatched_at = now() WHERE id::text = ANY($1)",
            &[&dispatched],
        )
        .await
        .expect("mark dispatched");
    wait_all_removed(&client, &dispatched, "dispatched rows", &poller).await;
    assert_all_stay(&client, &pending, SEVERAL_RUNS, "undispatched rows, broker down").await;

    kafka.all_brokers_up();
    assert_delivered(&delivered_ids(&kafka, pending.len()).await, &pending, "pending rows");
    wait_all_removed(&client, &pending, "rows dispatched after the outage", &poller).await;
    stop(poller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_rotation_under_load_loses_nothing() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let db = unique_name("retpart");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_partitioned_outbox(&client).await;
    let config = with_retention(
        RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers()),
        "partitions",
    )
    .set("retention", "keep", "4s")
    .set("retention", "partition_width", "2s")
    .set("retention", "partitions_ahead", 4)
    .set("retention", "lock_timeout", "200ms");
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let partitions = || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = 'events_outbox'::regclass",
                &[],
            )
            .await
            .expect("partitions")
            .get::<_, i64>(0)
    };
    // The default one plus the current range and four ahead.
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(200), || async {
            partitions().await >= 6
        })
        .await,
        "no partitions created ahead; log:\n{}",
        relay.log_text()
    );

    // ~1,000 inserts a second for 12 s, from 4 writers; every insert must succeed.
    let url = pg.url(&db);
    let mut writers = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        writers.push(tokio::spawn(async move {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let mut ids = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(4));
            let end = tokio::time::Instant::now() + Duration::from_secs(12);
            while tokio::time::Instant::now() < end {
                tick.tick().await;
                let row = c
                    .query_one(
                        "INSERT INTO events_outbox (aggregate_id, type, payload)
                         VALUES (gen_random_uuid(), 'order.created', '{}') RETURNING id::text",
                        &[],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("an insert failed during rotation: {e}"));
                ids.push(row.get::<_, String>(0));
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for w in writers {
        ids.extend(w.await.expect("writer"));
    }
    assert!(ids.len() > 6_000, "only {} inserts in 12 s", ids.len());
    let delivered = delivered_ids(&kafka, ids.len()).await;
    assert_delivered(&delivered, &ids, "inserts during rotation");

    // Expired partitions were dropped, never the default one.
    let dropped = wait_until(WAIT, Duration::from_millis(500), || async {
        relay.log_text().matches("retention dropped a partition").count() >= 3
    })
    .await;
    assert!(dropped, "no partition dropped; log:\n{}", relay.log_text());
    let default_kept: bool = client
        .query_one("SELECT to_regclass('events_outbox_default') IS NOT NULL", &[])
        .await
        .expect("default")
        .get(0);
    assert!(default_kept, "the default partition was dropped");
    let left: i64 = client
        .query_one("SELECT count(*) FROM events_outbox WHERE id::text = ANY($1)", &[&ids])
        .await
        .expect("count")
        .get(0);
    assert!((left as usize) < ids.len(), "nothing removed");
    let status = run_cmd(&["status", "--json"], &config).await;
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status json");
    let table = &report["outbox_tables"][0];
    assert_eq!(table["partitioned"], serde_json::Value::Bool(true), "{report}");
    assert!(
        table["last_retention"]["last_removed_partitions"].as_i64() >= Some(1),
        "{report}"
    );
    stop(relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_is_refused_with_clear_messages() {
    let config = RelayConfig::new("postgres://relay@127.0.0.1:1/app", "127.0.0.1:1");
    for (key, value, says) in [
        ("keep", "7", "without a unit"),
        ("keep", "0s", "between 1s"),
        ("mode", "truncate", "\"delete\""),
        ("interval", "soon", "not a duration"),
    ] {
        let bad = config
            .clone()
            .set("retention", "mode", "delete")
            .set("retention", "keep", "7d")
            .set("retention", key, value);
        let out = run_cmd(&["run"], &bad).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key} = {value}: {stderr}");
        assert!(
            stderr.contains(&format!("retention.{key}")) && stderr.contains(says),
            "{key} = {value}: {stderr}"
        );
    }
}

/// The shipped defaults (interval 60 s, batch size, timeouts, status interval): only `keep` is
/// short, as no test can wait 7 days. Published rows go within two intervals, and a row committed
/// while the broker is down stays until it is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_default_interval_retention_removes_published_rows_and_keeps_the_rest() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = config
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("retention", "mode", "delete")
        .set("retention", "keep", "2s");
    let relay = RelayProcess::run_streaming(&config).await;
    let published = insert_rows(&client, 10, 60).await;
    assert_delivered(&delivered_ids(&kafka, published.len()).await, &published, "old rows");
    let gone = wait_until(Duration::from_secs(200), Duration::from_secs(1), || async {
        remaining(&client, &published).await == 0
    })
    .await;
    assert!(gone, "published rows not removed within 200 s:\n{}", relay.log_text());
    kafka.all_brokers_down();
    let pending = insert_rows(&client, 3, 60).await;
    // One full default interval and more: nothing unpublished goes.
    assert_all_stay(
        &client,
        &pending,
        Duration::from_secs(75),
        "broker down, default interval",
    )
    .await;
    kafka.all_brokers_up();
    stop(relay).await;
}

/// The shipped interval (one minute) and no default partition: the relay creates the partitions
/// ahead as soon as it streams, not one interval later, so the service's inserts find one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_ahead_exist_as_soon_as_the_relay_streams_with_the_default_interval() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let db = unique_name("retpartstart");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client
        .batch_execute(PARTITIONED_OUTBOX)
        .await
        .expect("partitioned outbox without a default partition");
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("retention", "mode", "partitions")
        .set("retention", "keep", "7d");
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let streaming = std::time::Instant::now();
    let mut inserted = None;
    while inserted.is_none() && streaming.elapsed() < Duration::from_secs(20) {
        inserted = insert_one(&client).await;
        if inserted.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let id = inserted.unwrap_or_else(|| {
        panic!(
            "no partition for an insert within 20 s of streaming (interval 60 s):\n{}",
            relay.log_text()
        )
    });
    assert_delivered(&delivered_ids(&kafka, 1).await, &[id], "the first insert");
}

/// One row at now(); `None` while no partition takes it.
async fn insert_one(client: &Client) -> Option<String> {
    match client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'order.created', '{}')
             RETURNING id::text",
            &[],
        )
        .await
    {
        Ok(row) => Some(row.get(0)),
        Err(e)
            if e.as_db_error()
                .is_some_and(|d| d.message().contains("no partition of relation")) =>
        {
            None
        }
        Err(e) => panic!("insert: {e:?}"),
    }
}

/// Poll mode, partitions: a partition holding a row the poller has not dispatched (broker down)
/// is never dropped, however old; once the poller dispatched every row in it, it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_drops_only_partitions_whose_rows_are_all_dispatched() {
    let kafka = MockKafka::new(1);
    // A cluster of its own, as `poll_mode_deletes_only_dispatched_rows` says why.
    let Some(pg) = PgCluster::start_dedicated(&[]).await else {
        return;
    };
    let db = unique_name("retpollpart");
    pg.create_database(&db).await;
    let mut client = pg.client(&db).await;
    create_partitioned_outbox(&client).await;
    let config = with_retention(
        RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers()),
        "partitions",
    )
    .set("retention", "keep", "2s")
    .set("retention", "partition_width", "2s")
    .set("retention", "partitions_ahead", 4)
    .set("retention", "lock_timeout", "200ms")
    .set("poll", "interval_ms", 50);
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    kafka.all_brokers_down();
    let poller = RelayProcess::poll(&config);
    assert!(
        poller.wait_for_log("polling started", Duration::from_secs(30)).await,
        "{}",
        poller.log_text()
    );
    // The rows go in once a ranged partition covers their commit's `now()`, so they land in
    // one: counting the partitions created ahead is not enough, as under load the first ones
    // can lie behind `now()` before the next run creates the current one.
    let pending = insert_rows_into_a_ranged_partition(&mut client, 10)
        .await
        .unwrap_or_else(|| panic!("no ranged partition covered now() within 30 s:\n{}", poller.log_text()));
    let in_default: i64 = client
        .query_one("SELECT count(*) FROM ONLY events_outbox_default", &[])
        .await
        .expect("default count")
        .get(0);
    assert_eq!(in_default, 0, "the rows belong to a ranged partition");
    let holding: Vec<String> = client
        .query(
            "SELECT DISTINCT tableoid::regclass::text FROM events_outbox WHERE id::text = ANY($1)",
            &[&pending],
        )
        .await
        .expect("the rows' partitions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Past keep + width several times over, the broker still down: nothing may go.
    assert_all_stay(
        &client,
        &pending,
        Duration::from_secs(8),
        "undispatched rows, broker down",
    )
    .await;
    // Empty partitions older than the rows' expire meanwhile and may go; the rows' own may not.
    let log = poller.log_text();
    for partition in &holding {
        assert!(
            !log.lines()
                .any(|l| l.contains("retention dropped a partition") && l.contains(partition.as_str())),
            "partition {partition} was dropped while it held undispatched rows:\n{log}"
        );
    }

    kafka.all_brokers_up();
    assert_delivered(&delivered_ids(&kafka, pending.len()).await, &pending, "pending rows");
    wait_all_removed(&client, &pending, "rows dispatched after the outage", &poller).await;
    assert!(
        poller.log_text().contains("retention dropped a partition"),
        "{}",
        poller.log_text()
    );
    let default_kept: bool = client
        .query_one("SELECT to_regclass('events_outbox_default') IS NOT NULL", &[])
        .await
        .expect("default")
        .get(0);
    assert!(default_kept, "the default partition was dropped");
    stop(poller).await;
}

/// The slot invalidated (`max_slot_wal_keep_size` exceeded) while rows wait unpublished (broker
/// down): the relay stops, naming the cause and the recovery, and no unpublished row is removed —
/// neither before it stops nor by a relay started again on the lost slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidated_slot_removes_nothing() {
    let Some(pg) = PgCluster::start_dedicated(&[("max_slot_wal_keep_size", "1MB")]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared_on(&pg, "retinval", OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = with_retention(config, "delete");
    let mut relay = RelayProcess::run_streaming(&config).await;
    kafka.all_brokers_down();
    let ids = insert_rows(&client, 10, 60).await;
    assert_all_stay(&client, &ids, Duration::from_secs(3), "broker down").await;

    // WAL past max_slot_wal_keep_size while the slot cannot advance (nothing is acknowledged):
    // the checkpoint invalidates it and ends its walsender.
    let lost = invalidate_slot(&client, &config.slot, Duration::from_secs(90)).await;
    assert!(lost, "the slot was not invalidated");
    assert_all_stay(&client, &ids, SEVERAL_RUNS, "slot invalidated").await;
    let status = relay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the relay stops on an invalidated slot");
    assert!(!status.success());
    let log = relay.log_text();
    assert!(
        log.contains("is invalidated") && log.contains("wal_status = lost"),
        "the cause, clearly: {log}"
    );
    kafka.all_brokers_up();
    // Started again on the lost slot: it stops at once, and its retention removes nothing.
    let mut again = RelayProcess::run(&config);
    again
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("a relay on a lost slot stops");
    assert_all_stay(&client, &ids, Duration::from_secs(2), "after the relay stopped").await;
    assert!(!again.log_text().contains("retention removed"), "{}", again.log_text());
}

/// The slot lost and re-created by `setup` (without `--backfill`): rows committed while it was
/// missing were never streamed, and the new slot's position says nothing about them, so
/// retention keeps them; rows committed after the new slot are published and removed as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_re_created_by_setup_does_not_vouch_for_older_rows() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = prepared(OutboxSchema::A, &kafka.bootstrap_servers()).await;
    let config = with_retention(config, "delete");
    let relay = RelayProcess::run_streaming(&config).await;
    let before = insert_rows(&client, 5, 0).await;
    assert_delivered(&delivered_ids(&kafka, before.len()).await, &before, "before the loss");
    wait_all_removed(&client, &before, "published before the loss", &relay).await;
    stop(relay).await;

    // The slot is lost while nothing streams; rows keep coming.
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&config.slot])
        .await
        .expect("drop the slot");
    let gap = insert_rows(&client, 5, 0).await;
    // The operator's usual recovery: setup again, then run.
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let after = insert_rows(&client, 5, 0).await;
    assert_delivered(
        &delivered_ids(&kafka, before.len() + after.len()).await,
        &after,
        "after the new slot",
    );
    wait_all_removed(&client, &after, "published by the new slot", &relay).await;
    assert_all_stay(&client, &gap, SEVERAL_RUNS, "committed while the slot was missing").await;
    let log = stop(relay).await;
    assert!(
        log.contains("without --backfill") && log.contains("retention keeps them"),
        "{log}"
    );
}
