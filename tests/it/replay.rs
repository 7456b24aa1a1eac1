//! Issue 34, `outbox-relay replay`: re-publishing rows still in the outbox on a real
//! PostgreSQL and a real Kafka broker — byte-identical records, selection, `--to-topic`,
//! `--dry-run`, `--rate`, the relay and its slot untouched, rows already removed, and a replay
//! killed with SIGKILL and resumed.

use std::time::{Duration, Instant};

use crate::harness::relay_process::run_cmd_with;
use crate::harness::workload::OutboxSchema;
use crate::harness::*;

const REPLAY_HEADER: &str = "outbox-relay-replay";

/// Inserts `n` rows of `ty`, alternating between two aggregates, one transaction; returns the ids.
async fn insert(client: &tokio_postgres::Client, ty: &str, aggregates: [&str; 2], n: i64) -> Vec<i64> {
    client
        .query(
            "INSERT INTO events_outbox (aggregate_id, type, payload) \
             SELECT (CASE WHEN g % 2 = 0 THEN $2 ELSE $3 END)::uuid, $1, jsonb_build_object('n', g) \
             FROM generate_series(1, $4::int8) g RETURNING id",
            &[&ty, &aggregates[0], &aggregates[1], &n],
        )
        .await
        .expect("insert outbox rows")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn slot_lsn(client: &tokio_postgres::Client, slot: &str) -> String {
    client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("read the slot")
        .get(0)
}

/// `outbox-relay replay ARGS`, which must succeed and print `expect`; returns what it printed.
async fn replay_ok(args: &[&str], config: &RelayConfig, expect: &str) -> String {
    let mut full = vec!["replay"];
    full.extend_from_slice(args);
    let out = run_cmd_with(&full, config, &[], Duration::from_secs(120)).await;
    let text = stdout(&out);
    assert!(
        out.status.success() && text.contains(expect),
        "replay {args:?}: want {expect:?} in\n{text}"
    );
    text
}

/// A replay of `rows` fresh rows at 400 events/s to the namespace's topic `topic`, with a state
/// directory of its own, left running for `run_for`.
struct RatedReplay {
    _db: String,
    _client: tokio_postgres::Client,
    config: RelayConfig,
    ids: Vec<i64>,
    state: tempfile::TempDir,
    /// Its arguments, without the subcommand.
    args: Vec<String>,
    replay: RelayProcess,
}

impl RatedReplay {
    fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

async fn start_rated_replay(kafka: &KafkaNs, rows: i64, topic: &str, run_for: Duration) -> RatedReplay {
    let (db, client, config) = prepared_ns(OutboxSchema::A, kafka).await;
    let ids = insert(&client, "order.created", [A1, A2], rows).await;
    let state = tempfile::tempdir().expect("state dir");
    let state_dir = state.path().to_str().unwrap().to_owned();
    let topic = kafka.topic(topic);
    let args: Vec<String> = [
        "--since",
        "id:1",
        "--to-topic",
        &topic,
        "--rate",
        "400",
        "--state",
        &state_dir,
    ]
    .map(str::to_owned)
    .to_vec();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let replay = RelayProcess::start("replay", &config, &arg_refs, &[]);
    tokio::time::sleep(run_for).await;
    RatedReplay {
        _db: db,
        _client: client,
        config,
        ids,
        state,
        args,
        replay,
    }
}

/// `replayed` is `original` byte for byte — key, value, timestamp, every header in order — plus
/// the replay header (after the record's headers; Redis writes the payload field last).
fn assert_same_record(replayed: &Received, original: &Received) {
    let own: Vec<_> = replayed
        .headers
        .iter()
        .filter(|(k, _)| k != REPLAY_HEADER)
        .cloned()
        .collect();
    assert_eq!(own, original.headers, "{replayed:?} replays {original:?}");
    assert_eq!(replayed.key, original.key);
    assert_eq!(replayed.payload, original.payload);
    assert_eq!(replayed.timestamp_ms, original.timestamp_ms);
    assert!(
        replayed.header(REPLAY_HEADER).is_some_and(|v| !v.is_empty()),
        "the replay header carries the replay's id: {replayed:?}"
    );
}

/// Per aggregate (the `key` header), the records are in id order: commit order for these rows.
fn assert_per_key_order(records: &[Received]) {
    let mut last: std::collections::HashMap<Vec<u8>, i64> = std::collections::HashMap::new();
    for r in records {
        let id: i64 = std::str::from_utf8(r.header("id").unwrap()).unwrap().parse().unwrap();
        let key = r.header("key").unwrap().to_vec();
        if let Some(prev) = last.insert(key, id) {
            assert!(prev < id, "{id} after {prev} on one aggregate: {records:?}");
        }
    }
}

fn stdout(out: &std::process::Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const A1: &str = "00000000-0000-0000-0000-0000000000a1";
const A2: &str = "00000000-0000-0000-0000-0000000000a2";
const B1: &str = "00000000-0000-0000-0000-0000000000b1";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_republishes_what_run_wrote_beside_the_running_relay() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config.header_column("created_at", "x-created");
    let slot = config.slot.clone();
    let relay = RelayProcess::run_streaming(&config).await;
    let orders = insert(&client, "order.created", [A1, A2], 6).await;
    let invoices = insert(&client, "invoice.paid", [B1, B1], 3).await;
    let streamed = kafka
        .collect(&["order.created", "invoice.paid"], 9, Duration::from_secs(60))
        .await;
    assert_eq!(streamed.len(), 9, "{streamed:?}");

    // Replay the orders, by id range and type, to one topic, beside the running relay.
    let since = format!("id:{}", orders[0]);
    let replayed_topic = kafka.topic("replayed");
    let out = replay_ok(
        &["--since", &since, "--type", "order.*", "--to-topic", &replayed_topic],
        &config,
        "replay complete: 6 events re-published",
    )
    .await;
    eprintln!("{out}");
    let replayed = kafka.collect(&["replayed"], 6, Duration::from_secs(60)).await;
    assert_eq!(replayed.len(), 6, "{replayed:?}");
    // Byte-identical with what `run` wrote: key, value, timestamp, every header but the replay's.
    let mut previous_per_aggregate = std::collections::HashMap::new();
    for record in &replayed {
        let id = record.header("id").expect("id header");
        let original = streamed
            .iter()
            .find(|r| r.header("id") == Some(id))
            .expect("the replayed row was streamed");
        assert_eq!(original.topic, "order.created");
        assert_same_record(record, original);
        // Per aggregate, in insertion order (one partition per topic here, so offsets order them).
        let id: i64 = std::str::from_utf8(id).unwrap().parse().unwrap();
        if let Some(prev) = previous_per_aggregate.insert(record.key.clone(), id) {
            assert!(prev < id, "aggregate order: {prev} before {id}");
        }
    }

    // The relay is untouched: still streaming (a new row arrives) and still holding the slot.
    let later = insert(&client, "invoice.paid", [B1, B1], 1).await;
    let more = kafka.collect(&["invoice.paid"], 4, Duration::from_secs(60)).await;
    assert!(
        more.iter()
            .any(|r| r.header("id") == Some(later[0].to_string().as_bytes())),
        "{more:?}"
    );
    drop(relay);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // With the relay stopped, the slot's position is the relay's alone: a replay leaves it.
    let before = slot_lsn(&client, &slot).await;
    let until = format!("id:{}", invoices[0]);
    let dry = replay_ok(
        &[
            "--since",
            "1h",
            "--until",
            &until,
            "--aggregate",
            A1,
            "--dry-run",
            "--to-topic",
            &kafka.topic("dry"),
        ],
        &config,
        "dry run: 3 rows would be re-published",
    )
    .await;
    assert_eq!(dry.matches(&format!("aggregate={A1}")).count(), 3, "{dry}");
    assert!(
        kafka.collect(&["dry"], 1, Duration::from_secs(3)).await.is_empty(),
        "a dry run sent records"
    );

    // --rate: 4 events at 5/s take at least 0.6 s (the first one goes at once).
    let rate_topic = kafka.topic("rated");
    let started = Instant::now();
    replay_ok(
        &[
            "--since",
            "2026-01-01T00:00:00Z",
            "--to-topic",
            &rate_topic,
            "--rate",
            "5",
            "--aggregate",
            B1,
        ],
        &config,
        "replay complete: 4 events re-published",
    )
    .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(600), "4 events at 5/s took {took:?}");
    assert_eq!(kafka.collect(&["rated"], 4, Duration::from_secs(30)).await.len(), 4);
    assert_eq!(slot_lsn(&client, &slot).await, before, "the replay moved the slot");

    // Rows already gone: said, with how many.
    client
        .execute("DELETE FROM events_outbox WHERE id < $1", &[&orders[2]])
        .await
        .unwrap();
    replay_ok(
        &["--since", &since, "--dry-run"],
        &config,
        &format!("the oldest row still in the table is id {}: up to 2 rows", orders[2]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_killed_mid_way_resumes_without_resending_what_was_acknowledged() {
    let Some(kafka) = shared_kafka().await else { return };
    let started = start_rated_replay(&kafka, 1500, "resumed", Duration::from_secs(2)).await;
    let (ids, config, replay) = (&started.ids, &started.config, &started.replay);
    let args = started.args();
    assert!(replay.sigkill());
    let first = kafka.collect(&["resumed"], 1500, Duration::from_secs(5)).await;
    assert!(
        !first.is_empty() && first.len() < 1500,
        "the kill should land mid-way: {} records",
        first.len()
    );
    // Without --resume the same arguments are refused: the state says it was interrupted.
    let mut refused_args = vec!["replay"];
    refused_args.extend_from_slice(&args);
    let refused = run_cmd(&refused_args, config).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    assert!(stdout(&refused).contains("add --resume"), "{}", stdout(&refused));

    let mut resume_args = refused_args.clone();
    resume_args.push("--resume");
    replay_ok(&resume_args[1..], config, "resumed after").await;
    let all = kafka.collect(&["resumed"], 1500, Duration::from_secs(60)).await;
    let mut seen = std::collections::HashMap::<Vec<u8>, usize>::new();
    for r in &all {
        *seen.entry(r.header("id").unwrap().to_vec()).or_default() += 1;
    }
    for id in ids {
        assert!(
            seen.contains_key(id.to_string().as_bytes()),
            "event {id} missing after the resume"
        );
    }
    let duplicates = all.len() - seen.len();
    // What was in flight at the kill (a few at 400/s) plus at most 20 ms of acknowledgements
    // not yet saved: far below what the first run delivered.
    assert!(
        duplicates <= 50 && duplicates < first.len(),
        "{duplicates} duplicates; the first run delivered {}",
        first.len()
    );
    eprintln!(
        "resume: first run delivered {} of 1500 before SIGKILL; {duplicates} sent again by --resume",
        first.len()
    );
    // Completed: the state file is gone.
    assert_eq!(std::fs::read_dir(started.state.path()).unwrap().count(), 0);
}

/// On a second sink (Redis Streams), beside the relay streaming to it: the replayed entries
/// carry every field the streamed ones carry, plus the replay's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_on_redis_writes_the_entries_run_wrote() {
    use crate::harness::redis::{delete, read_streams_until, SHARED_REDIS};
    let prefix = unique_name("replay_redis");
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = config
        .sink("redis", &[("url", SHARED_REDIS)])
        .route("(?<routedByValue>.*)", &format!("{prefix}.${{routedByValue}}"));
    let relay = RelayProcess::run_streaming(&config).await;
    let ids = insert(&client, "order.created", [A1, A2], 5).await;
    let routed = format!("{prefix}.order.created");
    let streamed = read_streams_until(SHARED_REDIS, std::slice::from_ref(&routed), 5, Duration::from_secs(60)).await;
    assert_eq!(streamed.len(), 5, "{streamed:?}");

    let replayed_stream = format!("{prefix}.replayed");
    let since = format!("id:{}", ids[0]);
    replay_ok(
        &["--since", &since, "--to-topic", &replayed_stream],
        &config,
        "replay complete: 5 events",
    )
    .await;
    let replayed = read_streams_until(
        SHARED_REDIS,
        std::slice::from_ref(&replayed_stream),
        5,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(replayed.len(), 5, "{replayed:?}");
    for (record, original) in replayed.iter().zip(&streamed) {
        // Same rows, same order (one aggregate after the other as inserted), same fields.
        assert_same_record(record, original);
    }
    drop(relay);
    delete(SHARED_REDIS, &[routed, replayed_stream]).await;
}

/// On NATS JetStream, beside the relay streaming to it: the replayed messages carry the headers
/// the streamed ones carry (a NATS header map has no order: compared as sets), plus the replay's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_on_nats_publishes_the_messages_run_published() {
    use crate::harness::nats::{NatsStream, SHARED_NATS};
    let stream = NatsStream::create(SHARED_NATS).await;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = config
        .sink("nats", &stream.section())
        .route("(?<routedByValue>.*)", &format!("{}.${{routedByValue}}", stream.prefix));
    let relay = RelayProcess::run_streaming(&config).await;
    let ids = insert(&client, "order.created", [A1, A2], 5).await;
    let streamed = stream.collect(5, Duration::from_secs(60)).await;
    assert_eq!(streamed.len(), 5, "{streamed:?}");

    let since = format!("id:{}", ids[0]);
    let to = format!("{}.replayed", stream.prefix);
    replay_ok(
        &["--since", &since, "--to-topic", &to],
        &config,
        "replay complete: 5 events",
    )
    .await;
    let all = stream.collect(10, Duration::from_secs(60)).await;
    assert_eq!(all.len(), 10, "{all:?}");
    let sorted = |r: &Received| {
        let mut h: Vec<_> = r.headers.iter().filter(|(k, _)| k != REPLAY_HEADER).cloned().collect();
        h.sort();
        h
    };
    assert_per_key_order(&all[5..]);
    // Aggregates go out in parallel: each replayed message is compared with its own original.
    for replayed in &all[5..] {
        let original = all[..5]
            .iter()
            .find(|o| o.header("id") == replayed.header("id"))
            .unwrap();
        assert_eq!(replayed.topic, to);
        assert_eq!(sorted(replayed), sorted(original), "{replayed:?} replays {original:?}");
        assert_eq!(replayed.payload, original.payload);
        assert!(
            replayed.header(REPLAY_HEADER).is_some_and(|v| !v.is_empty()),
            "{replayed:?}"
        );
    }
    drop(relay);
    stream.delete().await;
}

/// On RabbitMQ, beside the relay streaming to it: the replayed messages are the streamed ones
/// (routing key the `--to-topic` name), with the replay's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_on_rabbitmq_publishes_the_messages_run_published() {
    use crate::harness::rabbitmq::{RabbitFixture, RABBITMQ_URL};
    let fx = RabbitFixture::new(&["#"]).await;
    let (_db, client, config) = prepared(OutboxSchema::A, "unused:9092").await;
    let config = config.sink("rabbitmq", &[("url", RABBITMQ_URL), ("exchange", &fx.exchange)]);
    let relay = RelayProcess::run_streaming(&config).await;
    let ids = insert(&client, "order.created", [A1, A2], 5).await;
    let streamed = fx.collect(5, Duration::from_secs(60)).await;
    assert_eq!(streamed.len(), 5, "{streamed:?}");

    let since = format!("id:{}", ids[0]);
    let to = unique_name("replayed");
    replay_ok(
        &["--since", &since, "--to-topic", &to],
        &config,
        "replay complete: 5 events",
    )
    .await;
    let all = fx.collect(10, Duration::from_secs(60)).await;
    assert_eq!(all.len(), 10, "{all:?}");
    assert_per_key_order(&all[5..]);
    // Aggregates go out in parallel: each replayed message is compared with its own original.
    for replayed in &all[5..] {
        let original = all[..5]
            .iter()
            .find(|o| o.header("id") == replayed.header("id"))
            .unwrap();
        assert_eq!(replayed.topic, to);
        assert_same_record(replayed, original);
    }
    drop(relay);
    fx.clean().await;
}

/// Rows retention already removed: `replay` says so before sending anything, naming
/// `[retention] keep`, with how many rows when the ids can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_removed_by_retention_are_reported_with_how_many() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let config = config
        .set("retention", "mode", "delete")
        .set("retention", "keep", "2s")
        .set("retention", "interval", "1s");
    let relay = RelayProcess::run_streaming(&config).await;
    let removed = insert(&client, "order.created", [A1, A2], 5).await;
    let c = &client;
    let emptied = wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        move || async move {
            let n: i64 = c
                .query_one("SELECT count(*) FROM events_outbox", &[])
                .await
                .unwrap()
                .get(0);
            n == 0
        },
    )
    .await;
    assert!(emptied, "retention did not remove the published rows");
    drop(relay);
    // Without a relay nothing removes these two.
    let kept = insert(&client, "order.created", [A1, A2], 2).await;
    let since = format!("id:{}", removed[0]);
    let text = replay_ok(
        &["--since", &since, "--dry-run"],
        &config,
        "dry run: 2 rows would be re-published",
    )
    .await;
    assert!(
        text.contains(&format!(
            "the oldest row still in the table is id {}: up to 5 rows (ids {} to {}",
            kept[0], removed[0], removed[4]
        )) && text.contains("removed by retention ([retention] keep = 2s)")
            && text.contains("retention's record: 5 rows removed from this table in all"),
        "{text}"
    );
    eprintln!("{text}");
    let text = replay_ok(&["--since", "1h", "--dry-run"], &config, "h after --since").await;
    assert!(text.contains("the oldest row still in the table is from"), "{text}");
}

/// `--since id:0` on a table whose id sequence starts at 1 asks for nothing that is gone: no
/// "removed" message (ids below the sequence's start never existed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn since_id_0_on_a_table_whose_ids_start_at_1_reports_nothing_removed() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    let ids = insert(&client, "order.created", [A1, A2], 3).await;
    assert_eq!(ids[0], 1, "a fresh table's first id");
    let text = replay_ok(
        &["--since", "id:0", "--dry-run"],
        &config,
        "dry run: 3 rows would be re-published",
    )
    .await;
    assert!(!text.contains("removed") && !text.contains("deleted"), "{text}");
}

/// Schema B (uuid ids): rows are ordered by the timestamp column then the id, and paged by that
/// pair (1,200 rows: three pages); every row once, each aggregate in creation order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uuid_ids_replay_in_creation_order_across_pages() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::B, &kafka).await;
    client
        .execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
             SELECT gen_random_uuid(), 'order', 'agg-' || (g % 3), 'created', jsonb_build_object('n', g), \
                    now() - interval '10 minutes' + g * interval '1 millisecond' \
             FROM generate_series(1, 1200) g",
            &[],
        )
        .await
        .expect("insert schema B rows");
    let topic = kafka.topic("uuid_replayed");
    replay_ok(
        &["--since", "1h", "--to-topic", &topic],
        &config,
        "replay complete: 1200 events re-published",
    )
    .await;
    let mut records = kafka.collect(&["uuid_replayed"], 1200, Duration::from_secs(60)).await;
    assert_eq!(records.len(), 1200);
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut last = std::collections::HashMap::<Vec<u8>, i64>::new();
    let mut ids = std::collections::HashSet::new();
    for r in &records {
        assert!(ids.insert(r.header("id").unwrap().to_vec()), "sent twice: {r:?}");
        let value: serde_json::Value = serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
        let n = value["n"].as_i64().unwrap();
        let key = r.key.clone().unwrap();
        if let Some(prev) = last.insert(key, n) {
            assert!(prev < n, "aggregate order: {prev} before {n}");
        }
    }
}

/// SIGTERM: the replay stops handing rows over, waits for what is in flight and saves; the
/// resumed run sends nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_stopped_by_sigterm_resumes_with_no_duplicate() {
    let Some(kafka) = shared_kafka().await else { return };
    let mut started = start_rated_replay(&kafka, 800, "terminated", Duration::from_millis(1500)).await;
    let args = started.args.clone();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replay = &mut started.replay;
    assert!(replay.sigterm());
    let status = replay
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the replay stops");
    assert_eq!(status.code(), Some(1));
    let log = replay.log_text();
    assert!(
        log.contains("the replay was interrupted after") && log.contains("--resume"),
        "{log}"
    );
    let mut resumed = vec!["--resume"];
    resumed.extend_from_slice(&args);
    replay_ok(&resumed, &started.config, "resumed after").await;
    let all = kafka.collect(&["terminated"], 800, Duration::from_secs(60)).await;
    let distinct: std::collections::HashSet<_> = all.iter().map(|r| r.header("id").unwrap().to_vec()).collect();
    assert_eq!(distinct.len(), 800);
    assert_eq!(
        all.len(),
        800,
        "a graceful stop saves everything acknowledged: no duplicate"
    );
}

/// Arguments the replay cannot use (exit 2, naming the fix) and a state directory it cannot
/// write (exit 1) are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_arguments_and_an_unwritable_state_directory_are_refused_before_sending() {
    let Some(kafka) = shared_kafka().await else { return };
    let (_db, client, config) = prepared_ns(OutboxSchema::A, &kafka).await;
    insert(&client, "order.created", [A1, A2], 3).await;
    let topic = kafka.topic("never");
    let out = run_cmd(
        &["replay", "--since", "id:1", "--to-topic", &topic, "--state", "/proc"],
        &config,
    )
    .await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("give a writable directory with --state DIR"), "{text}");
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec!["--since", "yesterday", "--to-topic", &topic],
            "is neither an RFC 3339 time (2026-05-01T12:00:00Z), a duration back from now",
        ),
        (
            vec!["--table", "other", "--to-topic", &topic],
            "is not an outbox table of this config",
        ),
        (
            vec!["--to-topic", "no spaces"],
            "--to-topic \"no spaces\" is not a name Kafka accepts",
        ),
    ];
    for (args, says) in cases {
        let out = run_cmd(&[&["replay"], &args[..]].concat(), &config).await;
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains(says), "{text}");
    }
    assert!(kafka.collect(&["never"], 1, Duration::from_secs(3)).await.is_empty());
}
