//! The polling relayer (`outbox-relay poll`, `setup --poll`) against real PostgreSQL and the
//! mock Kafka cluster: both seed schemas, rollback and re-claim after a failed publish, two
//! workers, byte-identical records to the streaming relay, bad rows, and setup without
//! `wal_level = logical`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use regex::Regex;
use tokio_postgres::Client;

use crate::harness::scrape::{http_get, latency_window, with_http, Metrics};
use crate::harness::workload::{
    expect_binary, insert_binary_payloads, insert_event, new_uuid, ExpectedEvent, OutboxSchema, Workload,
};
use crate::harness::*;

const WAIT: Duration = Duration::from_secs(90);

fn dispatched_column(schema: OutboxSchema) -> &'static str {
    match schema {
        OutboxSchema::A => "dispatched_at",
        OutboxSchema::B => "processed_at",
    }
}

/// A poll config for `schema` whose events all go to topic `order`.
fn poll_config(schema: OutboxSchema, url: &str, bootstrap: &str) -> RelayConfig {
    let config = RelayConfig::for_schema(schema, url, bootstrap)
        .set("poll", "dispatched_column", dispatched_column(schema))
        .set("poll", "interval_ms", 20)
        .set("relay", "reconnect_backoff_initial_ms", 200)
        .set("relay", "reconnect_backoff_max_ms", 1000);
    match schema {
        OutboxSchema::A => config.route(PREFIX_REGEX, "${routedByValue}"),
        OutboxSchema::B => config, // routes by aggregate_type = "order"
    }
}

/// A fresh database on `pg` with `schema` (then `extra_sql`), and `setup --poll` done for
/// `config_of(url)`.
async fn prepared(
    pg: &PgCluster,
    schema: OutboxSchema,
    extra_sql: &str,
    config_of: impl FnOnce(&str) -> RelayConfig,
) -> (Client, RelayConfig) {
    let db = unique_name("poll");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, schema).await;
    client.batch_execute(extra_sql).await.expect("extra schema");
    let config = config_of(&pg.url(&db));
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(
        out.status.success(),
        "setup --poll failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (client, config)
}

async fn pending(client: &Client, schema: OutboxSchema) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE {} IS NULL",
        schema.table(),
        dispatched_column(schema)
    );
    client.query_one(&sql, &[]).await.expect("count pending").get(0)
}

/// Every expected event arrived with its key and payload bytes, nothing else arrived; returns
/// the number of duplicates.
fn check_delivered(expected: &[ExpectedEvent], records: &[Received]) -> usize {
    let mut by_id: HashMap<String, Vec<&Received>> = HashMap::new();
    for r in records {
        by_id
            .entry(String::from_utf8_lossy(r.header("id").expect("id header")).into_owned())
            .or_default()
            .push(r);
    }
    let missing: Vec<&str> = expected
        .iter()
        .filter(|e| !by_id.contains_key(&e.id))
        .map(|e| e.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} events never arrived, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    for e in expected {
        for r in &by_id[&e.id] {
            assert_eq!(r.key_str(), Some(e.aggregate_id.as_str()), "key of {}", e.id);
            assert_eq!(r.payload_str(), Some(e.payload_text.as_str()), "payload of {}", e.id);
        }
    }
    assert_eq!(
        by_id.len(),
        expected.len(),
        "records for events that were never committed"
    );
    records.len() - by_id.len()
}

async fn stop(mut relay: RelayProcess) -> String {
    assert!(relay.sigterm());
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("poll exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}; log:\n{}", relay.log_text());
    relay.log_text()
}

async fn delivers_every_event_once_and_marks_it(schema: OutboxSchema) {
    let kafka = MockKafka::new(3);
    let pg = shared_cluster().await;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers())
    })
    .await;
    let (config, addr) = with_http(&config);
    let relay = RelayProcess::poll(&config);
    let committed = run_workload(&config.postgres_url, &Workload::new(schema, 2_000, 40, 6)).await;
    let expected: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = collect(&kafka.bootstrap_servers(), &["order"], expected.len(), WAIT).await;
    assert_eq!(
        check_delivered(&expected, &records),
        0,
        "a clean run publishes each event once"
    );
    // One worker publishes each aggregate's events in creation order.
    let mut firsts: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in &records {
        firsts
            .entry(r.key_str().unwrap())
            .or_default()
            .push(String::from_utf8_lossy(r.header("id").unwrap()).into());
    }
    for (agg, events) in &committed.by_aggregate {
        let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        assert_eq!(firsts[agg.as_str()], ids, "aggregate {agg} out of order");
    }
    assert!(
        wait_until(WAIT, Duration::from_millis(100), || async {
            pending(&client, schema).await == 0
        })
        .await,
        "{} rows still pending",
        pending(&client, schema).await
    );
    // `poll` serves the same endpoints: ready while polling, one latency sample per event.
    let (code, body) = http_get(&addr, "/readyz").await.expect("readyz");
    assert_eq!((code, body.as_str()), (200, "ready: polling\n"));
    let window = latency_window(&addr, false).await;
    assert_eq!(window["count"], expected.len(), "{window}");
    assert!(window["p99_ms"].as_f64().is_some_and(|p99| p99 > 0.0), "{window}");
    let log = stop(relay).await;
    assert!(log.contains("polling started"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_a_every_event_delivered_once_in_order_and_marked() {
    delivers_every_event_once_and_marks_it(OutboxSchema::A).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_b_every_event_delivered_once_in_order_and_marked() {
    delivers_every_event_once_and_marks_it(OutboxSchema::B).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_publish_rolls_back_and_the_rows_are_claimed_again() {
    let kafka = MockKafka::new(3);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::A;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers()).kafka("message.timeout.ms", "1000")
    })
    .await;
    let relay = RelayProcess::poll(&config);
    assert!(
        relay.wait_for_log("polling started", WAIT).await,
        "{}",
        relay.log_text()
    );
    kafka.all_brokers_down();
    let expected = insert_multi_row(&client, schema, &new_uuid(), 0, 20).await;
    assert!(
        relay.wait_for_log("batch failed; retrying", WAIT).await,
        "{}",
        relay.log_text()
    );
    assert!(
        relay.log_text().contains("Kafka did not take a claimed batch"),
        "{}",
        relay.log_text()
    );
    // Rolled back: nothing was marked while Kafka was unreachable.
    assert_eq!(pending(&client, schema).await, 20);
    kafka.all_brokers_up();
    let records = collect(&kafka.bootstrap_servers(), &["order"], expected.len(), WAIT).await;
    check_delivered(&expected, &records);
    assert!(
        wait_until(WAIT, Duration::from_millis(100), || async {
            pending(&client, schema).await == 0
        })
        .await
    );
    let log = stop(relay).await;
    let rolled_back: u64 = Regex::new(r"rolled_back=(\d+)")
        .unwrap()
        .captures(&log)
        .expect("final counts")[1]
        .parse()
        .unwrap();
    assert!(rolled_back >= 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_share_the_work_without_publishing_twice() {
    let kafka = MockKafka::new(3);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::B;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers())
            .set("poll", "workers", 2)
            .set("poll", "batch_size", 10)
    })
    .await;
    let relay = RelayProcess::poll(&config);
    let committed = run_workload(&config.postgres_url, &Workload::new(schema, 3_000, 60, 8)).await;
    let expected: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = collect(&kafka.bootstrap_servers(), &["order"], expected.len(), WAIT).await;
    assert_eq!(
        check_delivered(&expected, &records),
        0,
        "SKIP LOCKED keeps the workers' batches disjoint"
    );
    assert!(
        wait_until(WAIT, Duration::from_millis(100), || async {
            pending(&client, schema).await == 0
        })
        .await
    );
    let log = stop(relay).await;
    let per_worker: BTreeMap<u32, u64> = Regex::new(r"worker=(\d+) batches=\d+ events=(\d+)")
        .unwrap()
        .captures_iter(&log)
        .map(|c| (c[1].parse().unwrap(), c[2].parse().unwrap()))
        .collect();
    assert_eq!(per_worker.len(), 2, "{log}");
    assert_eq!(per_worker.values().sum::<u64>(), expected.len() as u64, "{log}");
    assert!(
        per_worker.values().all(|n| *n > 0),
        "both workers claimed batches: {per_worker:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poll_and_cdc_publish_byte_identical_records() {
    let kafka = MockKafka::new(3);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::A;
    let bootstrap = kafka.bootstrap_servers();
    let with_headers = |c: RelayConfig| {
        c.header_column("flag", "x-flag")
            .header_column("code", "x-code")
            .header_column("addr", "x-addr")
            .header_column("note", "x-note")
            .header_column("ratio", "x-ratio")
    };
    // Types whose cast to text differs from their output function, plus a NULL and a float.
    let extra =
        "ALTER TABLE events_outbox ADD COLUMN flag boolean DEFAULT true, ADD COLUMN code char(5) DEFAULT 'ab', \
                 ADD COLUMN addr inet DEFAULT '10.1.2.3', ADD COLUMN note text, ADD COLUMN ratio float8 DEFAULT 0.1";
    let (client, poll) = prepared(pg, schema, extra, |url| {
        with_headers(poll_config(schema, url, &bootstrap)).route("(?<routedByValue>.*)", "poll.${routedByValue}")
    })
    .await;
    let cdc = with_headers(RelayConfig::for_schema(schema, &poll.postgres_url, &bootstrap))
        .route("(?<routedByValue>.*)", "cdc.${routedByValue}");
    let out = run_cmd(&["setup"], &cdc).await;
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    let cdc_relay = RelayProcess::run(&cdc);
    let poll_relay = RelayProcess::poll(&poll);
    let mut expected: Vec<ExpectedEvent> = run_workload(&poll.postgres_url, &Workload::new(schema, 200, 10, 4))
        .await
        .all()
        .cloned()
        .collect();
    expected.extend(insert_multi_row(&client, schema, &new_uuid(), 0, 5).await);
    let n = expected.len();
    let from_cdc = collect_matching(&bootstrap, r"^cdc\.", n, WAIT).await;
    let from_poll = collect_matching(&bootstrap, r"^poll\.", n, WAIT).await;
    assert_eq!(check_delivered(&expected, &from_cdc), 0);
    assert_eq!(check_delivered(&expected, &from_poll), 0);
    let by_id = |records: &[Received]| -> HashMap<Vec<u8>, Received> {
        records
            .iter()
            .map(|r| (r.header("id").unwrap().to_vec(), r.clone()))
            .collect()
    };
    let (cdc_records, poll_records) = (by_id(&from_cdc), by_id(&from_poll));
    for (id, c) in &cdc_records {
        let p = &poll_records[id];
        assert_eq!(c.topic.strip_prefix("cdc."), p.topic.strip_prefix("poll."), "topic");
        assert_eq!(
            (&c.key, &c.payload, c.timestamp_ms, c.partition),
            (&p.key, &p.payload, p.timestamp_ms, p.partition)
        );
        assert_eq!(c.headers, p.headers, "headers of event {}", String::from_utf8_lossy(id));
        assert_eq!(c.header("x-flag"), Some(b"t".as_slice()));
        assert_eq!(c.header("x-code"), Some(b"ab   ".as_slice()));
        assert_eq!(c.header("x-addr"), Some(b"10.1.2.3".as_slice()));
        assert_eq!(c.header("x-ratio"), Some(b"0.1".as_slice()));
    }
    drop(cdc_relay);
    stop(poll_relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_row_stops_the_poller_with_its_id_and_stays_pending() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::A;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers()).route("(?<routedByValue>.*)", "${routedByValue}")
    })
    .await;
    let row = client
        .query_one(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'not a topic!', '{}') \
             RETURNING id::text",
            &[],
        )
        .await
        .unwrap();
    let id: String = row.get(0);
    // Skipping or dead-lettering is the streaming relay's; polling refuses to pretend.
    let mut skip = RelayProcess::poll(&config.clone().set("relay", "on_bad_event", "skip"));
    let status = skip.wait_exit(WAIT).await.expect("poll refuses on_bad_event = skip");
    assert_eq!(status.code(), Some(1), "{}", skip.log_text());
    assert!(
        skip.log_text()
            .contains("relay.on_bad_event = \"skip\" is not supported by `poll`"),
        "{}",
        skip.log_text()
    );
    // `setup --poll` refuses it too, in the same words, before it creates anything.
    let setup = run_cmd(
        &["setup", "--poll"],
        &config.clone().set("relay", "on_bad_event", "skip"),
    )
    .await;
    let stderr = String::from_utf8_lossy(&setup.stderr);
    assert_eq!(setup.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("relay.on_bad_event = \"skip\" is not supported by `poll`"),
        "{stderr}"
    );
    let mut relay = RelayProcess::poll(&config);
    let status = relay.wait_exit(WAIT).await.expect("the poller stops on a bad row");
    assert_eq!(status.code(), Some(1), "{}", relay.log_text());
    let log = relay.log_text();
    assert!(log.contains(&format!("event id={id} cannot be published")), "{log}");
    assert!(log.contains("Kafka topic names allow only"), "{log}");
    assert_eq!(pending(&client, schema).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_poll_explains_a_wrong_dispatched_column() {
    let pg = shared_cluster().await;
    let db = unique_name("poll");
    pg.create_database(&db).await;
    create_schema(&pg.client(&db).await, OutboxSchema::B).await;
    // Schema B with schema A's column name.
    let config = RelayConfig::for_schema(OutboxSchema::B, &pg.url(&db), "127.0.0.1:9");
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"dispatched_at\" (poll.dispatched_column) is not in table"),
        "{err}"
    );
    assert!(err.contains("processed_at in the outbox schema"), "{err}");
}

/// Poll mode on a server where logical decoding is impossible: `setup --poll` creates the index,
/// a second run finds it, and events flow; CDC `setup` refuses with the wal_level fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_poll_needs_no_logical_wal_and_creates_the_index_once() {
    let Some(pg) = PgCluster::start_dedicated(&[("wal_level", "replica")]).await else {
        return;
    };
    let kafka = MockKafka::new(1);
    let schema = OutboxSchema::A;
    let db = unique_name("poll");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, schema).await;
    client
        .batch_execute("DROP INDEX events_outbox_undispatched")
        .await
        .unwrap();
    let config = poll_config(schema, &pg.url(&db), &kafka.bootstrap_servers());

    let out = run_cmd(&["setup", "--poll"], &config).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("pending index events_outbox_dispatched_at_pending: created"),
        "{text}"
    );
    let def: String = client
        .query_one(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'events_outbox_dispatched_at_pending'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        def.ends_with("USING btree (created_at) WHERE (dispatched_at IS NULL)"),
        "{def}"
    );
    let again = run_cmd(&["setup", "--poll"], &config).await;
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already exists"),
        "{again:?}"
    );

    let cdc = run_cmd(&["setup"], &config).await;
    assert!(!cdc.status.success());
    assert!(String::from_utf8_lossy(&cdc.stderr).contains("wal_level"), "{cdc:?}");

    let relay = RelayProcess::poll(&config);
    let agg = new_uuid();
    let mut expected = Vec::new();
    for seq in 0..50 {
        expected.push(insert_event(&client, schema, &agg, seq).await);
    }
    let records = collect(&kafka.bootstrap_servers(), &["order"], expected.len(), WAIT).await;
    assert_eq!(check_delivered(&expected, &records), 0);
    stop(relay).await;
}

/// `poll` with a `bytea` payload column: the record value is the column's bytes, not
/// PostgreSQL's `\x…` text of them; the rows are marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bytea_payload_is_published_as_its_bytes() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::A;
    let bootstrap = kafka.bootstrap_servers();
    let (client, config) = prepared(
        pg,
        schema,
        "ALTER TABLE events_outbox ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')",
        |url| poll_config(schema, url, &bootstrap),
    )
    .await;
    let expected = insert_binary_payloads(&client).await;
    let relay = RelayProcess::poll(&config);
    expect_binary(&bootstrap, &expected, WAIT, || relay.log_text()).await;
    let marked = wait_until(WAIT, Duration::from_millis(100), || async {
        pending(&client, schema).await == 0
    })
    .await;
    assert!(marked, "log:\n{}", relay.log_text());
    stop(relay).await;
}

/// The watchdog: with the broker down nothing is dispatched, so the pending count and the oldest
/// row's age (rows written as if 10 minutes ago) show on `/metrics`, the log says once that rows
/// are stuck, and once they are published both fall to 0 and the log says so. The interval is
/// shortened here; `the_watchdog_reports_with_its_default_interval` runs the shipped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_reports_pending_rows_and_stuck_ones_until_they_are_published() {
    let kafka = MockKafka::new(1);
    let pg = shared_cluster().await;
    let schema = OutboxSchema::A;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers()).set("poll", "watchdog_interval_ms", 300)
    })
    .await;
    let (config, addr) = with_http(&config);
    kafka.all_brokers_down();
    client
        .batch_execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload, created_at) \
             SELECT gen_random_uuid(), 'order.placed', '{}', now() - interval '10 minutes' FROM generate_series(1, 7)",
        )
        .await
        .unwrap();
    let relay = RelayProcess::poll(&config);
    let pending_seen = wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
        Metrics::scrape(&addr)
            .await
            .is_some_and(|m| m.value("outbox_relay_pending_rows", &[("table", schema.qualified_table())]) == 7.0)
    })
    .await;
    assert!(pending_seen, "{}", relay.log_text());
    let m = Metrics::scrape(&addr).await.unwrap();
    let age = m.value(
        "outbox_relay_oldest_pending_age_seconds",
        &[("table", schema.qualified_table())],
    );
    assert!((600.0..700.0).contains(&age), "oldest pending age {age}");
    assert!(
        relay
            .wait_for_log("outbox rows are stuck", Duration::from_secs(10))
            .await,
        "{}",
        relay.log_text()
    );
    kafka.all_brokers_up();
    assert!(
        wait_until(WAIT, Duration::from_millis(200), || async {
            pending(&client, schema).await == 0
        })
        .await,
        "{}",
        relay.log_text()
    );
    let cleared = wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
        Metrics::scrape(&addr).await.is_some_and(|m| {
            m.value("outbox_relay_pending_rows", &[("table", schema.qualified_table())]) == 0.0
                && m.value(
                    "outbox_relay_oldest_pending_age_seconds",
                    &[("table", schema.qualified_table())],
                ) == 0.0
        })
    })
    .await;
    assert!(cleared, "{}", relay.log_text());
    assert!(
        relay
            .wait_for_log("no outbox row is stuck any more", Duration::from_secs(10))
            .await,
        "{}",
        relay.log_text()
    );
    assert_eq!(
        relay.log_text().matches("outbox rows are stuck").count(),
        1,
        "said once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_reports_with_its_default_interval() {
    let kafka = MockKafka::new(1);
    kafka.all_brokers_down();
    let pg = shared_cluster().await;
    let schema = OutboxSchema::B;
    let (client, config) = prepared(pg, schema, "", |url| {
        poll_config(schema, url, &kafka.bootstrap_servers())
    })
    .await;
    let (config, addr) = with_http(&config);
    insert_event(&client, schema, &new_uuid(), 0).await;
    let _relay = RelayProcess::poll(&config);
    // The first look is at start, the next 10 s later (poll.watchdog_interval_ms's default).
    let seen = wait_until(Duration::from_secs(15), Duration::from_millis(200), || async {
        Metrics::scrape(&addr)
            .await
            .is_some_and(|m| m.value("outbox_relay_pending_rows", &[("table", schema.qualified_table())]) == 1.0)
    })
    .await;
    assert!(seen, "the default watchdog did not count the pending row");
}
