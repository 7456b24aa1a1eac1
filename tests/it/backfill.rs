//! `setup --backfill`: migrating from a polling relayer with no gap and no loss while producers
//! keep writing — rows pending at the slot's snapshot come from the backfill, later rows from
//! the WAL, rows the poller already dispatched are not sent again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::workload::{
    expect_binary, insert_binary, insert_binary_payloads, insert_event, make_payload_bytea, new_uuid, Committed,
    ExpectedEvent, OutboxSchema,
};
use crate::harness::*;

/// A schema-A database and a relay config for it (no setup yet).
async fn database(kafka: &MockKafka) -> (String, Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("backfill");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, OutboxSchema::A).await;
    // One topic for every event type, so per-aggregate order is checkable (one partition per key).
    let config = RelayConfig::for_schema(OutboxSchema::A, &pg.url(&db), &kafka.bootstrap_servers())
        .route(r"^(?<routedByValue>[^.]+)\..*$", "${routedByValue}");
    (db, client, config)
}

/// `count` events per aggregate over `aggregates` fresh aggregates, in commit order, each in
/// its own transaction; dispatched (as a poller would have marked them) when `dispatched`.
async fn polling_era_rows(client: &mut Client, aggregates: usize, count: u64, dispatched: bool) -> Committed {
    let mut committed = Committed::default();
    for _ in 0..aggregates {
        let agg = new_uuid();
        for seq in 0..count {
            let tx = client.transaction().await.expect("begin");
            let ev = insert_event(&tx, OutboxSchema::A, &agg, seq).await;
            if dispatched {
                tx.execute(
                    "UPDATE events_outbox SET dispatched_at = now() WHERE id = $1::text::bigint",
                    &[&ev.id],
                )
                .await
                .expect("mark dispatched");
            }
            tx.commit().await.expect("commit");
            committed.by_aggregate.entry(agg.clone()).or_default().push(ev);
        }
    }
    committed
}

/// Producers that keep committing events (each aggregate from one task, sequentially) until
/// `stop`; one of every 25 transactions stays open a while, so slot creation has to wait for
/// in-flight writers.
fn keep_producing(url: String, tasks: usize, stop: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Committed>> {
    (0..tasks)
        .map(|_| {
            let (url, stop) = (url.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(conn);
                let aggregates: Vec<String> = (0..5).map(|_| new_uuid()).collect();
                let mut committed = Committed::default();
                let mut n: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let agg = &aggregates[(n % 5) as usize];
                    let seq = n / 5;
                    let tx = client.transaction().await.expect("begin");
                    let ev = insert_event(&tx, OutboxSchema::A, agg, seq).await;
                    if n % 25 == 24 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    tx.commit().await.expect("commit");
                    committed.by_aggregate.entry(agg.clone()).or_default().push(ev);
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                committed
            })
        })
        .collect()
}

fn merge(into: &mut Committed, from: Committed) {
    for (agg, events) in from.by_aggregate {
        into.by_aggregate.entry(agg).or_default().extend(events);
    }
}

/// Event id → `created_at` in Unix milliseconds (what the record timestamp must be).
async fn created_at_ms(client: &Client) -> HashMap<String, i64> {
    client
        .query(
            "SELECT id::text, floor(extract(epoch FROM created_at) * 1000)::bigint FROM events_outbox",
            &[],
        )
        .await
        .expect("created_at")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_under_load_delivers_every_pending_and_later_event_once() {
    let kafka = MockKafka::new(3);
    let (db, mut client, config) = database(&kafka).await;
    let dispatched = polling_era_rows(&mut client, 10, 20, true).await;
    let mut expected = polling_era_rows(&mut client, 15, 20, false).await;

    let stop = Arc::new(AtomicBool::new(false));
    let producers = keep_producing(shared_cluster().await.url(&db), 3, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "setup --backfill failed: {}{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    let published: u64 = report
        .split("backfill: published ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no backfill count in:\n{report}"));
    // At least the rows pending before the producers started; producer rows committed before the
    // snapshot are pending too.
    assert!(published >= 300, "{report}");

    let mut relay = RelayProcess::run(&config);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        merge(&mut expected, p.await.expect("producer task"));
    }

    let all: Vec<ExpectedEvent> = expected.all().cloned().collect();
    // Both sides of the consistent point are exercised: some events were backfilled, some streamed.
    assert!(
        all.len() as u64 > published,
        "no event committed after the snapshot ({published} backfilled)"
    );
    eprintln!(
        "backfilled {published} events, streamed {}",
        all.len() as u64 - published
    );
    let records = collect_matching(
        &kafka.bootstrap_servers(),
        "^order$",
        all.len(),
        Duration::from_secs(90),
    )
    .await;
    // Every pending-at-snapshot and every later event, with CDC's key, payload and topic; none of
    // the dispatched ones (check_delivered rejects ids it does not expect).
    let duplicates = check_delivered(&all, &records, |_| "order".to_owned());
    assert_eq!(
        duplicates, 0,
        "a clean run delivers each event once: the snapshot and the stream do not overlap"
    );
    for ev in dispatched.all() {
        assert!(
            !records.iter().any(|r| r.header("id") == Some(ev.id.as_bytes())),
            "dispatched event {} was published again",
            ev.id
        );
    }
    check_order(&expected, &records);
    // Backfilled and streamed records carry the same timestamp rule (created_at).
    let created = created_at_ms(&client).await;
    for r in &records {
        let id = String::from_utf8_lossy(r.header("id").unwrap()).into_owned();
        assert_eq!(r.timestamp_ms, created.get(&id).copied(), "timestamp of event {id}");
    }
    // Streaming starts where the backfill's snapshot ended and confirms past it.
    assert!(relay.try_exit_status().is_none(), "relay exited:\n{}", relay.log_text());
    relay.sigterm();
    assert!(relay
        .wait_exit(Duration::from_secs(30))
        .await
        .is_some_and(|s| s.success()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_refuses_a_slot_that_already_exists() {
    let kafka = MockKafka::new(1);
    let (_db, mut client, config) = database(&kafka).await;
    polling_era_rows(&mut client, 1, 3, false).await;
    let out = run_cmd(&["setup"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("replication slot {} already exists", config.slot)),
        "{stderr}"
    );
    assert!(stderr.contains("snapshot exported at the moment the slot"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_names_a_missing_dispatched_column_and_creates_nothing() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = database(&kafka).await;
    let config = config.set("poll", "dispatched_column", "sent_at");
    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("poll.dispatched_column = \"sent_at\""), "{stderr}");
    assert!(stderr.contains("dispatched_at"), "lists the columns: {stderr}");
    assert!(
        slot_row(&client, &config.slot).await.is_none(),
        "no slot may be left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_backfill_drops_its_slot_so_it_can_be_retried() {
    let kafka = MockKafka::new(1);
    let (_db, mut client, config) = database(&kafka).await;
    let good = polling_era_rows(&mut client, 2, 5, false).await;
    // A pending row whose route value is not a valid topic name.
    client
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 'not a topic!', '{}')",
            &[],
        )
        .await
        .expect("bad row");

    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot be published"), "{stderr}");
    assert!(
        stderr.contains(&format!("Slot {} was dropped again", config.slot)),
        "{stderr}"
    );
    assert!(slot_row(&client, &config.slot).await.is_none(), "the slot must be gone");

    // The operator deals with the row (here: marks it dispatched) and retries.
    client
        .execute(
            "UPDATE events_outbox SET dispatched_at = now() WHERE type = 'not a topic!'",
            &[],
        )
        .await
        .expect("fix row");
    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("backfill: published 10 pending rows"), "{report}");
    let all: Vec<ExpectedEvent> = good.all().cloned().collect();
    let records = collect_matching(
        &kafka.bootstrap_servers(),
        "^order$",
        all.len(),
        Duration::from_secs(30),
    )
    .await;
    // The first attempt may have published some rows before it hit the bad one: at least once.
    check_delivered(&all, &records, |_| "order".to_owned());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_kafka_never_acknowledges_fails_and_drops_its_slot() {
    let kafka = MockKafka::new(1);
    let (_db, mut client, config) = database(&kafka).await;
    polling_era_rows(&mut client, 1, 3, false).await;
    // Nothing listens there: every delivery times out.
    let config = config
        .kafka("bootstrap.servers", &format!("127.0.0.1:{}", free_port()))
        .kafka("message.timeout.ms", "2000");
    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Kafka did not acknowledge a backfilled event"),
        "{stderr}"
    );
    assert!(stderr.contains("was dropped again"), "{stderr}");
    assert!(slot_row(&client, &config.slot).await.is_none(), "the slot must be gone");
}

/// `setup --backfill` with a `bytea` payload column: a pending row's record value is the
/// column's bytes, not PostgreSQL's `\x…` text of them — as `run` publishes the rows after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_publishes_a_bytea_payload_as_its_bytes() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = database(&kafka).await;
    make_payload_bytea(&client, false).await;
    let mut expected = insert_binary_payloads(&client).await;
    let out = run_cmd(&["setup", "--backfill"], &config).await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "setup --backfill failed: {}{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("backfill: published 2 "), "{report}");
    expect_binary(&kafka.bootstrap_servers(), &expected, Duration::from_secs(60), || {
        report.clone()
    })
    .await;

    // The streaming relay takes over from the slot: a later row arrives the same way.
    let relay = RelayProcess::run(&config);
    let later = vec![0xFE, 0x00, 0xED];
    expected.push((insert_binary(&client, &later).await, later));
    expect_binary(&kafka.bootstrap_servers(), &expected, Duration::from_secs(60), || {
        relay.log_text()
    })
    .await;
}

/// `setup --backfill --since` reaching further back than `[retention] keep` is refused (rows
/// older than keep may be gone already), naming both and the fix, and leaves no slot behind; a
/// window within keep is accepted and publishes the pending rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_window_longer_than_retention_keep_is_refused() {
    let kafka = MockKafka::new(1);
    let (_db, mut client, config) = database(&kafka).await;
    let pending = polling_era_rows(&mut client, 2, 3, false).await;
    let config = config.set("retention", "mode", "delete").set("retention", "keep", "7d");
    let out = run_cmd(&["setup", "--backfill", "--since", "2000-01-01 00:00:00+00"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("[retention] keep is 604800 s") && stderr.contains("Raise retention.keep above the window"),
        "{stderr}"
    );
    assert!(!stderr.contains("   "), "the message reads as one sentence: {stderr}");
    assert!(
        slot_row(&client, &config.slot).await.is_none(),
        "no slot may be left behind"
    );

    let since: String = client
        .query_one("SELECT (now() - interval '1 hour')::text", &[])
        .await
        .unwrap()
        .get(0);
    let out = run_cmd(&["setup", "--backfill", "--since", &since], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let records = collect_matching(
        &kafka.bootstrap_servers(),
        "^order$",
        pending.len(),
        Duration::from_secs(30),
    )
    .await;
    let all: Vec<ExpectedEvent> = pending.all().cloned().collect();
    assert_eq!(check_delivered(&all, &records, |_| "order".to_owned()), 0);
    check_order(&pending, &records);
}
