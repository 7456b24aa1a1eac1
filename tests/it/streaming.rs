//! Large transactions streamed before they commit (pgoutput protocol 2, `postgres.streaming`):
//! with `logical_decoding_work_mem = 64kB` the walsender streams a large transaction as it is
//! written instead of spilling it to the primary's disk; the relay stages it and publishes it at
//! its commit — once, in per-aggregate order, in commit order with other transactions — and
//! never publishes what was rolled back. Kills while it streams (before the commit) and while it
//! is published (after) lose nothing. On every supported major (14–18), on a real Kafka broker.
//! With Kafka transactions a lone streamed transaction is produced before its commit
//! (`relay/early.rs`), falls back to the stage when another commits meanwhile, and stays
//! exactly-once through kills before its commit and right after its Kafka commit.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::fault_support::*;
use crate::harness::kafka_real::KafkaNs;
use crate::harness::scrape::{with_http, Metrics};
use crate::harness::workload::{create_schema, new_uuid, OutboxSchema};
use crate::harness::*;

/// Far below any of these transactions: what makes the walsender stream (or, with protocol 1,
/// spill) them.
const WORK_MEM: (&str, &str) = ("logical_decoding_work_mem", "64kB");
/// The relay's peak RSS bound while it stages and publishes a 200,000-row transaction.
const RSS_BOUND_KB: u64 = 256 * 1024;

/// A dedicated cluster (`bin`: another major's binaries) with [`WORK_MEM`], a database with the
/// outbox, `setup` done, and a config publishing `order.*` into a one-partition topic of `kafka`.
async fn streaming_db(bin: Option<&Path>, kafka: &KafkaNs) -> Option<(PgCluster, String, Client, RelayConfig)> {
    let pg = match bin {
        Some(bin) => PgCluster::start_dedicated_with(bin, &[WORK_MEM]).await?,
        None => PgCluster::start_dedicated(&[WORK_MEM]).await?,
    };
    // Not `prepared_on`: it adds pg_walinspect, which PostgreSQL 14 does not have.
    let db = unique_name("streamed");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers());
    setup(&config).await;
    kafka.create_topic("order", 1).await;
    let config = config.on_kafka(kafka).route(PREFIX_REGEX, "${routedByValue}");
    Some((pg, db, client, config))
}

/// `INSERT … SELECT generate_series` of `rows` outbox rows over `aggregates` (payload `kind`),
/// in whatever transaction `client` has open; the ids it took.
async fn insert_rows(client: &Client, rows: i64, kind: &str, aggregates: &[String]) -> (i64, i64) {
    let row = client
        .query_one(
            "WITH ins AS (
                INSERT INTO events_outbox (aggregate_id, type, payload)
                SELECT ($1::text[])[(1 + g % array_length($1::text[], 1))::int]::uuid, 'order.placed',
                       jsonb_build_object('seq', g, 'kind', $3::text, 'pad', repeat('x', 64))
                  FROM generate_series(0, $2::bigint - 1) g
                RETURNING id)
             SELECT min(id), max(id) FROM ins",
            &[&aggregates, &rows, &kind],
        )
        .await
        .expect("outbox rows");
    (row.get(0), row.get(1))
}

fn aggregates(n: usize) -> Vec<String> {
    (0..n).map(|_| new_uuid()).collect()
}

/// The slot's `spill_bytes` and `stream_bytes`, once the server's statistics show a streamed
/// transaction (they are flushed asynchronously); `None` if none shows within 30 s.
async fn streamed_stats(client: &Client, slot: &str) -> Option<(i64, i64)> {
    let stats = std::cell::Cell::new(None);
    wait_until(Duration::from_secs(30), Duration::from_millis(250), || {
        let stats = &stats;
        async move {
            let row = client
                .query_opt(
                    "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .unwrap();
            stats.set(row.map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))));
            stats.get().is_some_and(|(_, stream)| stream > 0)
        }
    })
    .await
    .then_some(stats.get()?)
}

/// Every id of `expected` (transactions in commit order, each an id range) arrived, none twice
/// and nothing else; per aggregate in commit order (first deliveries, which a replay after a
/// kill may follow with copies when `replays` is true).
fn check_once_in_commit_order(records: &[Received], expected: &[(i64, i64)], replays: bool) {
    let position = |id: i64| {
        expected
            .iter()
            .position(|(first, last)| (*first..=*last).contains(&id))
            .unwrap_or_else(|| panic!("id {id} is of no committed transaction"))
    };
    let mut seen = HashSet::new();
    let mut last_by_key: HashMap<String, (usize, i64)> = HashMap::new();
    for r in records {
        let id: i64 = id_of(r).parse().expect("numeric id");
        let at = (position(id), id);
        if !seen.insert(id) {
            assert!(replays, "id {id} arrived twice without a replay");
            continue;
        }
        let key = r.key_str().expect("key").to_owned();
        if let Some(prev) = last_by_key.insert(key.clone(), at) {
            assert!(
                prev < at,
                "aggregate {key}: {at:?} after {prev:?} (not in commit order)"
            );
        }
    }
    let total: i64 = expected.iter().map(|(first, last)| last - first + 1).sum();
    assert_eq!(seen.len() as i64, total, "every committed event arrived");
}

/// Exactly-once over Kafka transactions: a transactional.id of the test's own, the checkpoint
/// topic in its namespace, fast reconnects.
fn with_kafka_transactions(config: RelayConfig, kafka: &KafkaNs) -> RelayConfig {
    config
        .set("relay", "delivery", "exactly-once")
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("kafka", "exactly_once", "transactions")
        .set("kafka", "checkpoint_topic", kafka.topic("checkpoints"))
        .kafka("transactional.id", &unique_name("txn"))
}

fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The acceptance case: 200,000 rows in one transaction are streamed (the primary spills
/// nothing), staged and delivered once in per-aggregate order, with the relay's peak RSS within
/// 256 MiB; the stage is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_200k_row_transaction_is_streamed_not_spilled_and_delivered_once() {
    const ROWS: i64 = 200_000;
    let Some(kafka) = shared_kafka().await else { return };
    let Some((_pg, _db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let (config, addr) = with_http(&config);
    let relay = RelayProcess::run_streaming(&config).await;
    assert!(
        relay.log_text().contains("pgoutput 2, streaming on"),
        "{}",
        relay.log_text()
    );
    let ids = insert_rows(&client, ROWS, "one", &aggregates(8)).await;
    let records = kafka.collect(&["order"], ROWS as usize, Duration::from_secs(300)).await;
    let peak_kb = peak_rss_kb(relay.pid()).expect("relay still running");
    check_once_in_commit_order(&records, &[ids], false);
    let (spill, stream) = streamed_stats(&client, &config.slot)
        .await
        .expect("the server streamed the transaction");
    assert!(stream > 0 && spill == 0, "spill_bytes {spill}, stream_bytes {stream}");
    eprintln!(
        "200k-row streamed transaction: stream_bytes {stream}, relay peak RSS {} MiB",
        peak_kb / 1024
    );
    assert!(
        peak_kb <= RSS_BOUND_KB,
        "relay peak RSS {peak_kb} kB exceeds {RSS_BOUND_KB} kB"
    );
    let log = relay.log_text();
    assert_eq!(
        log.matches("streaming started").count(),
        1,
        "one session:\n{}",
        log_tail(&log)
    );
    let metrics = Metrics::scrape(&addr).await.expect("/metrics");
    assert_eq!(metrics.sum("outbox_relay_stage_transactions"), 0.0);
    assert_eq!(metrics.sum("outbox_relay_stage_memory_bytes"), 0.0);
}

/// A rolled-back streamed transaction and a rolled-back subtransaction of a committed one
/// publish nothing: the first record after the rollback is the next committed event, and the
/// committed transaction brings exactly its kept rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolled_back_streamed_transactions_and_subtransactions_publish_nothing() {
    let Some(kafka) = shared_kafka().await else { return };
    let Some((_pg, _db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let relay = RelayProcess::run_streaming(&config).await;
    let aggs = aggregates(4);
    client.batch_execute("BEGIN").await.unwrap();
    insert_rows(&client, 30_000, "rolled back", &aggs).await;
    client.batch_execute("ROLLBACK").await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    let kept = insert_rows(&client, 20_000, "kept", &aggs).await;
    client.batch_execute("SAVEPOINT s").await.unwrap();
    insert_rows(&client, 30_000, "in the savepoint", &aggs).await;
    client.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    let after = insert_rows(&client, 1, "after the savepoint", &aggs).await;
    client.batch_execute("COMMIT").await.unwrap();
    let records = kafka.collect(&["order"], 20_001, Duration::from_secs(120)).await;
    // Between `kept` and `after` lie the savepoint's rolled-back ids: any of them, or of the
    // rolled-back transaction, is "of no committed transaction".
    check_once_in_commit_order(&records, &[kept, after], false);
    let (_, stream) = streamed_stats(&client, &config.slot).await.expect("streamed");
    assert!(stream > 0, "{}", log_tail(&relay.log_text()));
}

/// Two large transactions over the same aggregates, written at the same time: the one that
/// commits first comes out first, whole, on every aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_large_transactions_come_out_in_commit_order() {
    let Some(kafka) = shared_kafka().await else { return };
    let Some((pg, db, first, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let second = pg.client(&db).await;
    let _relay = RelayProcess::run_streaming(&config).await;
    let aggs = aggregates(4);
    first.batch_execute("BEGIN").await.unwrap();
    second.batch_execute("BEGIN").await.unwrap();
    let a1 = insert_rows(&first, 20_000, "first, begun first", &aggs).await;
    let b1 = insert_rows(&second, 20_000, "second", &aggs).await;
    let a2 = insert_rows(&first, 20_000, "first, again", &aggs).await;
    second.batch_execute("COMMIT").await.unwrap();
    first.batch_execute("COMMIT").await.unwrap();
    let records = kafka.collect(&["order"], 60_000, Duration::from_secs(120)).await;
    // The second transaction committed first. Ids of the first transaction lie on both sides of the second's: an id's transaction is
    // told by the range it is in, the second's range first.
    let first_ids = |id: i64| (a1.0..=a1.1).contains(&id) || (a2.0..=a2.1).contains(&id);
    let mut by_key: HashMap<String, Vec<bool>> = HashMap::new();
    for r in &records {
        let id: i64 = id_of(r).parse().unwrap();
        assert!(first_ids(id) || (b1.0..=b1.1).contains(&id), "id {id}");
        by_key
            .entry(r.key_str().unwrap().to_owned())
            .or_default()
            .push(first_ids(id));
    }
    for (key, sequence) in &by_key {
        let switch = sequence
            .iter()
            .position(|from_first| *from_first)
            .unwrap_or(sequence.len());
        assert!(
            sequence[switch..].iter().all(|from_first| *from_first),
            "aggregate {key}: the transaction that committed second is interleaved with the first"
        );
    }
    let unique: HashSet<String> = records.iter().map(id_of).collect();
    assert_eq!((records.len(), unique.len()), (60_000, 60_000), "each event once");
}

/// Kills that lose nothing: SIGKILL while a large transaction streams (before its COMMIT, with
/// part of it spilled to the relay's stage directory), and SIGKILL while one is published (after
/// its COMMIT). Each time the next process removes what the last left in the stage and the
/// server streams the transaction again; no manual step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kills_before_and_after_the_commit_lose_nothing() {
    let Some(kafka) = shared_kafka().await else { return };
    let Some((pg, _db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let stage = tempfile::tempdir().unwrap();
    let (config, addr) = with_http(&config.set("relay", "stage_dir", stage.path().to_str().unwrap()).set(
        "relay",
        "stage_memory_bytes",
        1_048_576,
    ));
    let spill_files = || {
        walk_files(stage.path())
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "stage"))
            .count()
    };
    let aggs = aggregates(8);

    // Before the commit.
    let relay = RelayProcess::run_streaming(&config).await;
    client.batch_execute("BEGIN").await.unwrap();
    let before = insert_rows(&client, 100_000, "killed before its commit", &aggs).await;
    assert!(
        wait_until(Duration::from_secs(60), Duration::from_millis(100), || async {
            spill_files() > 0
        })
        .await,
        "the relay never spilled the open transaction:\n{}",
        log_tail(&relay.log_text())
    );
    assert!(relay.sigkill());
    assert!(spill_files() > 0, "a killed process leaves its spill files");
    let relay = RelayProcess::run_streaming(&config).await;
    assert!(
        relay.log_text().contains("removed the spill files"),
        "{}",
        log_tail(&relay.log_text())
    );
    client.batch_execute("COMMIT").await.unwrap();
    let records = kafka.collect(&["order"], 100_000, Duration::from_secs(180)).await;
    check_once_in_commit_order(&records, &[before], false);

    // After the commit: killed while publishing (once this process acknowledged a few thousand
    // of the second transaction's events); the restart replays the transaction.
    let after = insert_rows(&client, 100_000, "killed after its commit", &aggs).await;
    let published = std::cell::Cell::new(0.0);
    let publishing = wait_until(Duration::from_secs(120), Duration::from_millis(20), || {
        let published = &published;
        let addr = &addr;
        async move {
            published.set(
                Metrics::scrape(addr)
                    .await
                    .map_or(0.0, |m| m.sum("outbox_relay_events_published_total")),
            );
            published.get() > 102_000.0
        }
    })
    .await;
    assert!(
        publishing,
        "the second transaction was not being published:\n{}\nPostgreSQL:\n{}",
        log_tail(&relay.log_text()),
        log_tail(&pg.log_text())
    );
    assert!(relay.sigkill());
    eprintln!(
        "killed after {} events acknowledged in that process (of 200,000)",
        published.get()
    );
    let relay = RelayProcess::run_streaming(&config).await;
    let mut records = kafka.collect(&["order"], 200_000, Duration::from_secs(240)).await;
    // A replay may add copies after the kill: wait for the last event, then check.
    let last = after.1.to_string();
    if !records.iter().any(|r| id_of(r) == last) {
        records = kafka.collect(&["order"], 300_000, Duration::from_secs(60)).await;
    }

    check_once_in_commit_order(&records, &[before, after], true);
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(200), || async {
            spill_files() == 0
        })
        .await,
        "a published transaction's spill file is removed"
    );
    drop(relay);
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The fast variant on one major: a 20,000-row transaction streamed (nothing spilled on the
/// primary) and delivered once in order, after a rolled-back streamed one.
async fn streams_on_major(major: u32) {
    let Some(bin) = pg_bin_for_major(major) else {
        skip_missing_major(major, "streamed transactions");
        return;
    };
    let Some(kafka) = shared_kafka().await else { return };
    let Some((_pg, _db, client, config)) = streaming_db(Some(&bin), &kafka).await else {
        return;
    };
    let relay = RelayProcess::run_streaming(&config).await;
    let aggs = aggregates(4);
    client.batch_execute("BEGIN").await.unwrap();
    insert_rows(&client, 10_000, "rolled back", &aggs).await;
    client.batch_execute("ROLLBACK").await.unwrap();
    let ids = insert_rows(&client, 20_000, "committed", &aggs).await;
    let records = kafka.collect(&["order"], 20_000, Duration::from_secs(120)).await;
    check_once_in_commit_order(&records, &[ids], false);
    let (spill, stream) = streamed_stats(&client, &config.slot)
        .await
        .unwrap_or_else(|| panic!("PostgreSQL {major} streamed nothing:\n{}", log_tail(&relay.log_text())));
    assert!(
        stream > 0 && spill == 0,
        "PostgreSQL {major}: spill_bytes {spill}, stream_bytes {stream}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_large_transactions_on_postgres_14() {
    streams_on_major(14).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_large_transactions_on_postgres_15() {
    streams_on_major(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_large_transactions_on_postgres_16() {
    streams_on_major(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_large_transactions_on_postgres_17() {
    streams_on_major(17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_large_transactions_on_postgres_18() {
    streams_on_major(18).await;
}

/// `postgres.streaming = "off"` keeps protocol 1: the server spills the large transaction to its
/// own disk and sends it after its commit; it arrives all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streaming_off_is_protocol_1_and_the_server_spills() {
    let Some(kafka) = shared_kafka().await else { return };
    let Some((_pg, _db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let config = config.set("postgres", "streaming", "off");
    let relay = RelayProcess::run_streaming(&config).await;
    assert!(relay.log_text().contains("pgoutput 1"), "{}", relay.log_text());
    let ids = insert_rows(&client, 20_000, "off", &aggregates(4)).await;
    let records = kafka.collect(&["order"], 20_000, Duration::from_secs(120)).await;
    check_once_in_commit_order(&records, &[ids], false);
    let spilled = wait_until(Duration::from_secs(30), Duration::from_millis(250), || async {
        let row = client
            .query_one(
                "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = $1",
                &[&config.slot],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) > 0 && row.get::<_, i64>(1) == 0
    })
    .await;
    assert!(spilled, "with protocol 1 the server spills and streams nothing");
}

/// `[kafka] exactly_once = "transactions"` (shipped `relay.streamed_produce = "as-received"`):
/// a lone streamed transaction is produced into an open Kafka transaction before its COMMIT —
/// `read_uncommitted` consumers see its records while it is open, `read_committed` ones none —
/// and committed with it: each event once, in order. A transaction that commits while another
/// one streams makes that fall back to the stage (its open Kafka transaction aborted): both
/// arrive once, in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_kafka_transactions_a_lone_streamed_transaction_is_produced_before_its_commit() {
    const ROWS: i64 = 50_000;
    let Some(kafka) = shared_kafka().await else { return };
    let Some((pg, db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let (config, addr) = with_http(&with_kafka_transactions(config, &kafka));
    let relay = RelayProcess::run_streaming(&config).await;
    let aggs = aggregates(8);

    client.batch_execute("BEGIN").await.unwrap();
    let first = insert_rows(&client, ROWS, "early", &aggs).await;
    let seen_open = kafka.collect_uncommitted(&["order"], 1, Duration::from_secs(60)).await;
    assert!(
        !seen_open.is_empty(),
        "nothing produced before the COMMIT:\n{}",
        log_tail(&relay.log_text())
    );
    assert!(
        kafka.collect(&["order"], 1, Duration::from_secs(2)).await.is_empty(),
        "read_committed sees nothing of an open transaction"
    );
    client.batch_execute("COMMIT").await.unwrap();
    let records = kafka.collect(&["order"], ROWS as usize, Duration::from_secs(120)).await;
    check_once_in_commit_order(&records, &[first], false);
    // Counted like any published event (with no commit-to-ack latency: its commit came later).
    let counted = wait_until(Duration::from_secs(10), Duration::from_millis(200), || async {
        Metrics::scrape(&addr)
            .await
            .is_some_and(|m| m.sum("outbox_relay_events_published_total") >= ROWS as f64)
    })
    .await;
    assert!(
        counted,
        "outbox_relay_events_published_total counts the events produced early"
    );
    assert!(
        !relay.log_text().contains("falls back to the stage"),
        "{}",
        log_tail(&relay.log_text())
    );

    // Another transaction commits while the large one streams: the large one falls back.
    let other = pg.client(&db).await;
    client.batch_execute("BEGIN").await.unwrap();
    let large = insert_rows(&client, ROWS, "fallback", &aggs).await;
    kafka
        .collect_uncommitted(&["order"], ROWS as usize + 1, Duration::from_secs(60))
        .await;
    let small = insert_rows(&other, 10, "small", &aggs).await;
    client.batch_execute("COMMIT").await.unwrap();
    let total = 2 * ROWS as usize + 10;
    let records = kafka.collect(&["order"], total, Duration::from_secs(120)).await;
    check_once_in_commit_order(&records, &[first, small, large], false);
    let log = relay.log_text();
    assert!(log.contains("falls back to the stage"), "{}", log_tail(&log));
    assert_eq!(
        log.matches("streaming started").count(),
        1,
        "one session:\n{}",
        log_tail(&log)
    );
}

/// Exactly-once over Kafka transactions through kills of a transaction produced early: SIGKILL
/// while it is produced (before its COMMIT: the next process fences the open Kafka transaction
/// away and produces it again), and a crash right after its Kafka transaction committed, before
/// PostgreSQL was told (`relay::sealed_before_status`: the next process meets it again below the
/// checkpoint, stages it, and skips it at its commit). `read_committed` sees every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_kafka_transactions_kills_of_an_early_transaction_lose_nothing_and_copy_nothing() {
    const ROWS: i64 = 50_000;
    let Some(kafka) = shared_kafka().await else { return };
    let Some((_pg, _db, client, config)) = streaming_db(None, &kafka).await else {
        return;
    };
    let config = with_kafka_transactions(config, &kafka);
    let aggs = aggregates(8);

    let first = RelayProcess::run_streaming(&config).await;
    client.batch_execute("BEGIN").await.unwrap();
    let ids = insert_rows(&client, ROWS, "killed", &aggs).await;
    let produced = kafka
        .collect_uncommitted(&["order"], 10_000, Duration::from_secs(60))
        .await;
    assert!(
        produced.len() >= 10_000,
        "not produced early:\n{}",
        log_tail(&first.log_text())
    );
    assert!(first.sigkill());

    let mut second = RelayProcess::run_with(&config, &[], &[("FAILPOINTS", "relay::sealed_before_status=return")]);
    assert!(
        second.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        second.log_text()
    );
    client.batch_execute("COMMIT").await.unwrap();
    let status = second.wait_exit(Duration::from_secs(120)).await;
    assert!(
        status.is_some_and(|s| !s.success()) && second.log_text().contains("failpoint relay::sealed_before_status"),
        "the second process should crash right after its seal: {status:?}\n{}",
        log_tail(&second.log_text())
    );

    let third = RelayProcess::run_streaming(&config).await;
    let records = kafka.collect(&["order"], ROWS as usize, Duration::from_secs(120)).await;
    check_once_in_commit_order(&records, &[ids], false);
    // Nothing more comes: the third process skipped what the committed checkpoint covers.
    let marker = insert_rows(&client, 1, "after", &aggs).await;
    let records = kafka
        .collect(&["order"], ROWS as usize + 1, Duration::from_secs(120))
        .await;
    check_once_in_commit_order(&records, &[ids, marker], false);
    drop(third);
}
