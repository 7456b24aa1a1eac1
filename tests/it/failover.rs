//! A real PostgreSQL failover (17 and 18): a primary and a physical hot standby on this
//! machine (base backup by `pg_backup_start` / copy / `pg_backup_stop`; the standby runs
//! `sync_replication_slots = on`, the primary `synchronized_standby_slots`), the relay set up
//! with a failover slot and a two-host URL with `target_session_attrs=read-write`, writers
//! committing ~200 events/s, the primary stopped with `-m immediate`, the standby promoted, and
//! the writers continuing on the new primary.
//!
//! Checked: every event acknowledged to a writer (on either primary) reaches Kafka when
//! replication is synchronous; with asynchronous replication every event that exists on the
//! new primary does (an acknowledged commit the standby never received is lost by the
//! database, not by the relay — counted and printed); nothing reaches Kafka that the new
//! primary lacks (`synchronized_standby_slots`); first deliveries follow per-aggregate commit
//! order; the relay resumes within 5 s of the promotion (measured: promotion → slot active on
//! the new primary); duplicates stay within the in-flight window (`relay.max_in_flight`).
//!
//! The default run covers both majors, both host orders and both replication modes in four
//! scenarios; `OUTBOX_RELAY_LONG_TESTS=1` runs all eight combinations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::harness::fault_support::long_tests;
use crate::harness::workload::{
    create_schema, event_type, new_uuid, payload_json, Committed, ExpectedEvent, OutboxSchema,
};
use crate::harness::*;

const STANDBY_SLOT: &str = "standby1";
/// The relay's in-flight window in these tests: the duplicate bound.
const MAX_IN_FLIGHT: i64 = 1000;

#[derive(Debug, Clone, Copy)]
struct Scenario {
    major: u32,
    standby_first: bool,
    synchronous: bool,
}

/// What the writers saw.
#[derive(Default)]
struct Written {
    /// Acknowledged commits (the writer got COMMIT's OK), per aggregate in commit order.
    acked: BTreeMap<String, Vec<ExpectedEvent>>,
    /// Commits whose outcome the writer could not learn (the server died meanwhile).
    unknown: usize,
}

/// Whether `slot` on `client`'s server comes to satisfy `condition` (SQL over
/// `pg_replication_slots`) within `within`, checked every `every`.
async fn slot_shows(
    client: &tokio_postgres::Client,
    slot: &str,
    condition: &str,
    within: Duration,
    every: Duration,
) -> bool {
    let sql = format!("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND {condition}");
    wait_until(within, every, || {
        let sql = &sql;
        async move {
            client
                .query_opt(sql.as_str(), &[&slot])
                .await
                .is_ok_and(|r| r.is_some())
        }
    })
    .await
}

/// Four writer tasks over 20 new aggregates (5 each): the stop flag, what they wrote, the tasks.
fn start_writers(url: &str) -> (Arc<AtomicBool>, Arc<Mutex<Written>>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(Mutex::new(Written::default()));
    let aggregates: Vec<String> = (0..20).map(|_| new_uuid()).collect();
    let writers = aggregates
        .chunks(5)
        .map(|chunk| {
            tokio::spawn(writer(
                url.to_owned(),
                chunk.to_vec(),
                Arc::clone(&stop),
                Arc::clone(&written),
            ))
        })
        .collect();
    (stop, written, writers)
}

/// Tells the writers to stop and waits (bounded) until each has.
async fn stop_writers(stop: &AtomicBool, writers: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        tokio::time::timeout(Duration::from_secs(15), w)
            .await
            .expect("writer stops")
            .expect("writer task");
    }
}

/// One writer task: its aggregates, one transaction (an outbox row) at a time, reconnecting
/// through the multi-host URL after errors.
async fn writer(url: String, aggregates: Vec<String>, stop: Arc<AtomicBool>, written: Arc<Mutex<Written>>) {
    let mut seqs: HashMap<String, u64> = aggregates.iter().map(|a| (a.clone(), 0)).collect();
    let mut client = None;
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        if client.is_none() {
            match tokio::time::timeout(Duration::from_secs(3), tokio_postgres::connect(&url, NoTls)).await {
                Ok(Ok((c, conn))) => {
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    client = Some(c);
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let c = client.as_mut().expect("connected");
        let agg = aggregates[turn % aggregates.len()].clone();
        turn += 1;
        let seq = seqs[&agg];
        // Once sent, a seq is never reused: a commit of unknown outcome may have happened.
        seqs.insert(agg.clone(), seq + 1);
        let attempt = async {
            let tx = c.transaction().await?;
            let row = tx
                .query_one(
                    "INSERT INTO events_outbox (aggregate_id, type, payload)
                     VALUES ($1::text::uuid, $2, $3::text::jsonb)
                     RETURNING id::text, aggregate_id::text, type, payload::text",
                    &[&agg, &event_type(seq), &payload_json(&agg, seq)],
                )
                .await?;
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(ExpectedEvent {
                id: row.get(0),
                aggregate_id: row.get(1),
                event_type: row.get(2),
                payload_text: row.get(3),
                seq,
            })
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(ev)) => {
                written.lock().unwrap().acked.entry(agg).or_default().push(ev);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => {
                written.lock().unwrap().unknown += 1;
                client = None;
            }
        }
    }
}

async fn failover(s: Scenario) {
    let label = format!(
        "PostgreSQL {} {}, {} replication",
        s.major,
        if s.standby_first {
            "standby-first"
        } else {
            "primary-first"
        },
        if s.synchronous { "synchronous" } else { "asynchronous" }
    );
    let Some(bin) = pg_bin_for_major(s.major) else {
        skip_missing_major(s.major, "the failover test");
        return;
    };
    let Some(primary) = PgCluster::start_dedicated_with(&bin, &[("wal_keep_size", "256MB")]).await else {
        return;
    };
    let db = unique_name("fo");
    primary.create_database(&db).await;
    create_schema(&primary.client(&db).await, OutboxSchema::A).await;
    let standby = primary.start_standby(STANDBY_SLOT, &[]).await;
    let admin = primary.client("postgres").await;
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
        ))
        .await
        .unwrap();
    if s.synchronous {
        admin
            .batch_execute(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_SLOT}'"
            ))
            .await
            .unwrap();
    }
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();

    let hosts = if s.standby_first {
        format!("127.0.0.1:{},127.0.0.1:{}", standby.port(), primary.port())
    } else {
        format!("127.0.0.1:{},127.0.0.1:{}", primary.port(), standby.port())
    };
    let url = format!("postgres://postgres@{hosts}/{db}?target_session_attrs=read-write");
    let kafka = MockKafka::new(1);
    let config = RelayConfig::for_schema(OutboxSchema::A, &url, &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}")
        .max_in_flight(MAX_IN_FLIGHT);
    let out = run_cmd(&["setup"], &config).await;
    let setup_text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{label}: setup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(setup_text.contains("failover slot"), "{label}: {setup_text}");
    assert!(
        setup_text.contains("synchronized_standby_slots = 'standby1'"),
        "{label}: {setup_text}"
    );

    let mut relay = RelayProcess::run(&config);
    let (stop, written, writers) = start_writers(&url);

    // The standby's copy of the slot must exist (and follow) before the primary goes.
    let standby_client = standby.client(&db).await;
    let synced = slot_shows(
        &standby_client,
        &config.slot,
        "synced AND confirmed_flush_lsn IS NOT NULL",
        Duration::from_secs(60),
        Duration::from_millis(200),
    )
    .await;
    assert!(
        synced,
        "{label}: the standby never synchronized the slot; log:\n{}",
        standby.log_text()
    );
    let status = run_cmd(&["status", "--json"], &config).await;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
    assert_eq!(status["slot"]["failover"], true, "{label}: {status}");
    assert_eq!(status["failover"]["ready"], true, "{label}: {status}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = written.lock().unwrap().acked.values().map(Vec::len).sum::<usize>();

    // The failover: primary gone at once, standby promoted.
    primary.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    standby.promote().await;
    let promoted = Instant::now();
    drop(standby_client);
    let new_primary = standby.client(&db).await;
    let resumed = slot_shows(
        &new_primary,
        &config.slot,
        "active",
        Duration::from_secs(30),
        Duration::from_millis(20),
    )
    .await;
    let resume = promoted.elapsed();
    assert!(
        resumed,
        "{label}: the relay never resumed on the new primary; log:\n{}",
        relay.log_text()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_writers(&stop, writers).await;

    // What the new primary has is the truth; what the writers were told must be in it (sync).
    let rows = new_primary
        .query(
            "SELECT id::text, aggregate_id::text, type, payload::text, (payload->>'seq')::int8 FROM events_outbox",
            &[],
        )
        .await
        .unwrap();
    let mut table: Committed = Committed::default();
    for r in &rows {
        let ev = ExpectedEvent {
            id: r.get(0),
            aggregate_id: r.get(1),
            event_type: r.get(2),
            payload_text: r.get(3),
            seq: r.get::<_, i64>(4) as u64,
        };
        table.by_aggregate.entry(ev.aggregate_id.clone()).or_default().push(ev);
    }
    for events in table.by_aggregate.values_mut() {
        events.sort_by_key(|e| e.seq);
    }
    let (acked, unknown) = {
        let w = written.lock().unwrap();
        (w.acked.values().flatten().cloned().collect::<Vec<_>>(), w.unknown)
    };
    let in_table: HashSet<&str> = table.all().map(|e| e.id.as_str()).collect();
    let acked_lost_by_db: Vec<&ExpectedEvent> = acked.iter().filter(|e| !in_table.contains(e.id.as_str())).collect();
    if s.synchronous {
        assert!(
            acked_lost_by_db.is_empty(),
            "{label}: synchronous replication, yet acknowledged commits are missing on the new primary: {:?}",
            &acked_lost_by_db[..acked_lost_by_db.len().min(5)]
        );
    }
    let all: Vec<ExpectedEvent> = table.all().cloned().collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(90),
    )
    .await;
    // Every row of the new primary arrived, and nothing else did (no phantom from the old one).
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(&table, &records);
    let acked_delivered = acked.len() - acked_lost_by_db.len();
    eprintln!(
        "FAILOVER {label}: events {} (acknowledged {}, {} before the kill; {} commits of unknown outcome), \
         acknowledged and delivered {acked_delivered}, acknowledged but lost by the database {}, lost by the relay 0, \
         duplicates {dups} (bound: max_in_flight {MAX_IN_FLIGHT}), resume after promotion {:.2} s",
        all.len(),
        acked.len(),
        before_kill,
        unknown,
        acked_lost_by_db.len(),
        resume.as_secs_f64()
    );
    assert!(
        resume <= Duration::from_secs(5),
        "{label}: resumed {:.2} s after the promotion",
        resume.as_secs_f64()
    );
    assert!(dups as i64 <= MAX_IN_FLIGHT, "{label}: {dups} duplicates");
    let log = relay.log_text();
    assert!(
        log.contains("skipping this host"),
        "{label}: no host was skipped?\n{log}"
    );
    assert!(relay.sigterm());
    let exit = relay.wait_exit(Duration::from_secs(30)).await.expect("relay exits");
    assert!(exit.success(), "{label}: {exit:?}\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_pg17_primary_first_async() {
    failover(Scenario {
        major: 17,
        standby_first: false,
        synchronous: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_pg17_standby_first_sync() {
    failover(Scenario {
        major: 17,
        standby_first: true,
        synchronous: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_pg18_primary_first_sync() {
    failover(Scenario {
        major: 18,
        standby_first: false,
        synchronous: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_pg18_standby_first_async() {
    failover(Scenario {
        major: 18,
        standby_first: true,
        synchronous: false,
    })
    .await;
}

/// The other four combinations (`OUTBOX_RELAY_LONG_TESTS=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_remaining_combinations_long() {
    if !long_tests() {
        eprintln!("failover_remaining_combinations_long: set OUTBOX_RELAY_LONG_TESTS=1 to run it");
        return;
    }
    for (major, standby_first, synchronous) in [
        (17, false, true),
        (17, true, false),
        (18, false, false),
        (18, true, true),
    ] {
        failover(Scenario {
            major,
            standby_first,
            synchronous,
        })
        .await;
    }
}

/// PostgreSQL 16 has no failover slots: after the promotion the relay finds no slot on the new
/// primary and stops, naming the recovery point (the commit time of the last transaction it
/// confirmed). The documented recovery — `setup --backfill --since '<that time minus a
/// margin>'`, then `run` — publishes every event the new primary has: 0 lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_slot_recovery_on_pg16() {
    let Some(bin) = pg_bin_for_major(16) else {
        skip_missing_major(16, "the lost-slot recovery test");
        return;
    };
    let Some(primary) = PgCluster::start_dedicated_with(&bin, &[("wal_keep_size", "256MB")]).await else {
        return;
    };
    let db = unique_name("lost");
    primary.create_database(&db).await;
    create_schema(&primary.client(&db).await, OutboxSchema::A).await;
    let standby = primary.start_standby(STANDBY_SLOT, &[]).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let kafka = MockKafka::new(1);
    let config = RelayConfig::for_schema(OutboxSchema::A, &url, &kafka.bootstrap_servers())
        .route(PREFIX_REGEX, "${routedByValue}")
        .max_in_flight(MAX_IN_FLIGHT);
    let out = run_cmd(&["setup"], &config).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("no failover slots"), "preflight names the risk: {text}");
    let mut relay = RelayProcess::run(&config);
    let (stop, written, writers) = start_writers(&url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    primary.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    standby.promote().await;
    let exit = relay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the relay stops: its slot is gone");
    assert!(!exit.success());
    let log = relay.log_text();
    assert!(log.contains("does not exist") && log.contains("--backfill"), "{log}");
    // The recovery point the relay named.
    let since = log
        .lines()
        .find_map(|l| {
            let at = l.find("last_confirmed_commit=")? + "last_confirmed_commit=".len();
            Some(l[at..].split_whitespace().next()?.trim_matches('"').to_owned())
        })
        .filter(|s| s.ends_with('Z'))
        .unwrap_or_else(|| panic!("no recovery point in the log:\n{log}"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The documented margin: the longest transaction (here: well under 5 s).
    let new_primary = standby.client(&db).await;
    let since_with_margin: String = new_primary
        .query_one(
            "SELECT (($1::text)::timestamptz - interval '5 seconds')::text",
            &[&since],
        )
        .await
        .unwrap()
        .get(0);
    let out = run_cmd(&["setup", "--backfill", "--since", &since_with_margin], &config).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "backfill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _relay = RelayProcess::run(&config);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_writers(&stop, writers).await;
    let rows = new_primary
        .query(
            "SELECT id::text, aggregate_id::text, type, payload::text FROM events_outbox",
            &[],
        )
        .await
        .unwrap();
    let all: Vec<ExpectedEvent> = rows
        .iter()
        .map(|r| ExpectedEvent {
            id: r.get(0),
            aggregate_id: r.get(1),
            event_type: r.get(2),
            payload_text: r.get(3),
            seq: 0,
        })
        .collect();
    let records = collect(
        &kafka.bootstrap_servers(),
        &["order"],
        all.len(),
        Duration::from_secs(90),
    )
    .await;
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    let acked = written.lock().unwrap().acked.values().map(Vec::len).sum::<usize>();
    eprintln!(
        "LOST-SLOT RECOVERY PostgreSQL 16: events on the new primary {}, acknowledged to writers {acked}, lost 0, \
         duplicates {dups}; recovery point {since} (backfill --since {since_with_margin}); {}",
        all.len(),
        text.lines().last().unwrap_or_default()
    );
}
