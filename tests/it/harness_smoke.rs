//! Proves the harness itself works, so e2e failures point at the relay, not the rig.
//! Run with `cargo test --test it harness`.

use std::time::Duration;

use crate::harness::consumer::Topics;
use crate::harness::tls::pg_connector;
use crate::harness::workload::{insert_event, new_uuid};
use crate::harness::{
    collect, collect_with, confirmed_flush_lsn, create_schema, current_wal_lsn, insert_multi_row, insert_rolled_back,
    parse_lsn, produce, run_workload, shared_cluster, shared_kafka, slot_row, unique_name, wait_until, ClusterSpec,
    KafkaCluster, MockKafka, OutboxSchema, PgCluster, RelayConfig, Workload, SCRAM_USER,
};

#[tokio::test]
async fn harness_shared_cluster_accepts_queries() {
    let pg = shared_cluster().await;
    let db = unique_name("smoke");
    pg.create_database(&db).await;
    let c = pg.client(&db).await;
    let row = c
        .query_one("SELECT 40 + 2, current_setting('wal_level')", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(row.get::<_, String>(1), "logical");
    assert_ne!(pg.port(), 5432);
}

#[tokio::test]
async fn harness_scram_tls_user_connects_and_plain_is_rejected() {
    let pg = shared_cluster().await;
    let (Some(url), Some(ca)) = (pg.scram_url("postgres"), pg.ca_cert_path()) else {
        crate::harness::needs::missing(
            crate::harness::needs::LOCAL_POSTGRES,
            "harness_scram_tls_user_connects_and_plain_is_rejected",
            "the external server has no TLS test user",
        );
        return;
    };
    let (client, conn) = tokio_postgres::connect(&url, pg_connector(&ca))
        .await
        .expect("SCRAM over TLS as relay_scram");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT current_user::text, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), SCRAM_USER);
    assert!(row.get::<_, bool>(1), "connection is not TLS");

    // Same credentials without TLS: pg_hba rejects the user.
    let plain = url.replace("sslmode=require", "sslmode=disable");
    let err = tokio_postgres::connect(&plain, tokio_postgres::NoTls)
        .await
        .err()
        .expect("plain connection for relay_scram must be rejected");
    let db_err = err.as_db_error().expect("a server-side rejection");
    assert_eq!(
        db_err.code(),
        &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        "{db_err:?}"
    );
    assert!(db_err.message().contains("pg_hba.conf"), "{db_err:?}");

    // The wrong password is refused too (SCRAM really is checked).
    let bad = url.replace(crate::harness::SCRAM_PASSWORD, "wrong");
    assert!(tokio_postgres::connect(&bad, pg_connector(&ca)).await.is_err());
}

#[tokio::test]
async fn harness_logical_slot_create_and_drop() {
    let pg = shared_cluster().await;
    let db = unique_name("slot");
    pg.create_database(&db).await;
    let c = pg.client(&db).await;
    let slot = unique_name("smoke_slot");
    c.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&slot])
        .await
        .unwrap();
    let row = slot_row(&c, &slot).await.expect("slot exists");
    assert_eq!(row.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(row.slot_type, "logical");
    assert_eq!(row.database.as_deref(), Some(db.as_str()));
    assert!(!row.active);
    let confirmed = confirmed_flush_lsn(&c, &slot).await.expect("confirmed lsn");
    assert!(confirmed > 0 && confirmed <= current_wal_lsn(&c).await);
    c.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .unwrap();
    assert!(slot_row(&c, &slot).await.is_none());
    assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
}

#[tokio::test]
async fn harness_dedicated_cluster_restart_keeps_data() {
    let Some(pg) = PgCluster::start_dedicated(&[("max_slot_wal_keep_size", "64MB")]).await else {
        return;
    };
    let c = pg.client("postgres").await;
    c.batch_execute("CREATE TABLE kept(v int); INSERT INTO kept VALUES (7);")
        .await
        .unwrap();
    let setting: String = c.query_one("SHOW max_slot_wal_keep_size", &[]).await.unwrap().get(0);
    assert_eq!(setting, "64MB");
    drop(c);
    let port = pg.port();
    pg.restart().await;
    assert_eq!(pg.port(), port);
    let c = pg.client("postgres").await;
    let v: i32 = c.query_one("SELECT v FROM kept", &[]).await.unwrap().get(0);
    assert_eq!(v, 7);
    drop(c);
    // Crash + recovery also keeps committed data.
    pg.kill();
    assert!(pg.try_client("postgres").await.is_err());
    pg.start().await;
    let c = pg.client("postgres").await;
    let v: i32 = c.query_one("SELECT v FROM kept", &[]).await.unwrap().get(0);
    assert_eq!(v, 7);
}

#[tokio::test]
async fn harness_workload_shapes() {
    let pg = shared_cluster().await;
    for schema in [OutboxSchema::A, OutboxSchema::B] {
        let db = unique_name("wl");
        pg.create_database(&db).await;
        let mut c = pg.client(&db).await;
        create_schema(&c, schema).await;
        let committed = run_workload(&pg.url(&db), &Workload::new(schema, 40, 5, 3)).await;
        assert_eq!(committed.len(), 40);
        assert_eq!(committed.by_aggregate.len(), 5);
        for evs in committed.by_aggregate.values() {
            let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (0..8).collect::<Vec<_>>());
        }
        let agg = new_uuid();
        let gone = insert_rolled_back(&mut c, schema, &agg, 2).await;
        assert_eq!(gone.len(), 2);
        let multi = insert_multi_row(&c, schema, &agg, 0, 3).await;
        assert_eq!(multi.len(), 3);
        let single = insert_event(&c, schema, &agg, 3).await;
        let table = schema.table();
        let n: i64 = c
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 44, "rolled-back rows must not be there");
        let orders: i64 = c.query_one("SELECT count(*) FROM orders", &[]).await.unwrap().get(0);
        assert_eq!(orders, 40);
        // payload_text is what Postgres prints, not what we sent.
        let stored: String = c
            .query_one(
                &format!("SELECT payload::text FROM {table} WHERE id::text = $1"),
                &[&single.id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(stored, single.payload_text);
        assert!(stored.contains("\"seq\": 3"), "jsonb text form: {stored}");
    }
}

#[tokio::test]
async fn harness_mock_kafka_round_trip() {
    let kafka = MockKafka::new(1);
    let bootstrap = kafka.bootstrap_servers();
    let topic = unique_name("smoke");
    kafka.create_topic(&topic, 2);
    let (_, off0) = produce(&bootstrap, &topic, Some(b"k1"), b"v1", &[("h", b"x")]).await;
    let (_, _) = produce(&bootstrap, &topic, None, b"v2", &[]).await;
    assert_eq!(off0, 0);
    let got = collect(&bootstrap, &[&topic], 2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let first = got.iter().find(|r| r.payload_str() == Some("v1")).unwrap();
    assert_eq!(first.key_str(), Some("k1"));
    assert_eq!(first.header("h"), Some(&b"x"[..]));
    assert!(first.timestamp_ms.is_some());
    let second = got.iter().find(|r| r.payload_str() == Some("v2")).unwrap();
    assert_eq!(second.key, None);
    assert!(second.headers.is_empty());

    // Auto-created topics (first produce) get the mock's default of 4 partitions, and
    // a regex selection finds them.
    let auto = unique_name("smoke_auto");
    produce(&bootstrap, &auto, Some(b"k"), b"auto", &[]).await;
    let regex = format!("^{auto}$");
    let got = collect_with(
        &bootstrap,
        &Topics::Regex(regex),
        1,
        Duration::from_secs(20),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(got.len(), 1);
    // The escape hatch reaches the same cluster.
    assert_eq!(kafka.with_cluster(|c| c.bootstrap_servers()), bootstrap);
    let md = metadata_partitions(&bootstrap, &auto).await;
    assert_eq!(md, 4, "auto-created topic partition count");
}

#[tokio::test]
async fn harness_mock_kafka_brokers_down_and_up() {
    let kafka = MockKafka::new(1);
    let bootstrap = kafka.bootstrap_servers();
    let topic = unique_name("downup");
    kafka.create_topic(&topic, 1);
    kafka.all_brokers_down();
    let b = bootstrap.clone();
    let t = topic.clone();
    let pending = tokio::spawn(async move { produce(&b, &t, None, b"late", &[]).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !pending.is_finished(),
        "produce must not succeed while brokers are down"
    );
    kafka.all_brokers_up();
    let (_, off) = tokio::time::timeout(Duration::from_secs(20), pending)
        .await
        .expect("produce after brokers up")
        .unwrap();
    assert_eq!(off, 0);
}

#[tokio::test]
async fn harness_real_kafka_round_trip_in_a_namespace() {
    let Some(kafka) = shared_kafka().await else {
        return;
    };
    kafka.create_topic("smoke", 3).await;
    let topic = kafka.topic("smoke");
    let bootstrap = kafka.bootstrap_servers();
    produce(&bootstrap, &topic, Some(b"k"), b"{\"a\":1}", &[("id", b"1")]).await;
    let got = kafka.collect(&["smoke"], 1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].topic, "smoke", "read back without the namespace prefix");
    assert_eq!(got[0].key_str(), Some("k"));
    assert_eq!(got[0].payload_str(), Some("{\"a\":1}"));
    assert_eq!(got[0].header("id"), Some(&b"1"[..]));
    assert_eq!(metadata_partitions(&bootstrap, &topic).await, 3);
    // Another namespace on the same broker sees nothing of it.
    let other = shared_kafka().await.unwrap();
    assert!(other.collect(&["smoke"], 1, Duration::from_secs(2)).await.is_empty());
}

#[tokio::test]
async fn harness_relay_config_renders_valid_toml() {
    let cfg = RelayConfig::new("postgres://postgres@127.0.0.1:1/app", "127.0.0.1:9")
        .header_column("event-type", "type")
        .kafka("acks", "all")
        .route("(?<routedByValue>.*)", "outbox.${routedByValue}")
        .set("relay", "some_future_knob", 3);
    let text = cfg.render();
    let parsed: toml::Table = text.parse().expect("valid toml");
    assert_eq!(parsed["kafka"]["bootstrap.servers"].as_str(), Some("127.0.0.1:9"));
    assert_eq!(parsed["outbox"]["table"].as_str(), Some("public.events_outbox"));
    assert_eq!(parsed["outbox"]["header_columns"]["event-type"].as_str(), Some("type"));
    assert_eq!(
        parsed["route"]["topic_replacement"].as_str(),
        Some("outbox.${routedByValue}")
    );
    assert_eq!(parsed["relay"]["max_in_flight"].as_integer(), Some(10_000));
    assert_eq!(parsed["relay"]["some_future_knob"].as_integer(), Some(3));
    assert!(parsed["postgres"].get("sslrootcert").is_none());
}

#[tokio::test]
async fn harness_wait_until_is_bounded() {
    let start = std::time::Instant::now();
    let never = wait_until(Duration::from_millis(200), Duration::from_millis(20), || async {
        false
    })
    .await;
    assert!(!never);
    assert!(start.elapsed() < Duration::from_secs(2));
    // A condition that itself hangs is cut off at the deadline too.
    let hung = wait_until(Duration::from_millis(200), Duration::from_millis(20), || async {
        std::future::pending::<bool>().await
    })
    .await;
    assert!(!hung);
}

/// Partition count of `topic` as the broker reports it.
async fn metadata_partitions(bootstrap: &str, topic: &str) -> usize {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let bootstrap = bootstrap.to_string();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .unwrap();
        let md = c.fetch_metadata(Some(&topic), Duration::from_secs(10)).unwrap();
        md.topics()[0].partitions().len()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn harness_relay_process_plumbing() {
    // Whatever the relay does with an unreachable Postgres (retry or exit), the handle
    // must spawn it, capture its output to the log file, and reap it after SIGKILL.
    let unreachable = format!("postgres://postgres@127.0.0.1:{}/app", crate::harness::free_port());
    let cfg = RelayConfig::new(&unreachable, "127.0.0.1:9");
    let mut relay = crate::harness::RelayProcess::run(&cfg);
    assert!(relay.config_path().exists());
    assert!(relay.log_path().exists());
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.sigkill();
    let status = relay.wait_exit(Duration::from_secs(10)).await;
    assert!(status.is_some(), "relay not reaped after SIGKILL");
}

#[test]
fn harness_external_url_rewriting() {
    use crate::harness::postgres::{replace_url_db, url_port};
    assert_eq!(
        replace_url_db("postgres://u:p@h:6543/app?sslmode=require", "t_1"),
        "postgres://u:p@h:6543/t_1?sslmode=require"
    );
    assert_eq!(replace_url_db("postgres://u@h", "x"), "postgres://u@h/x");
    assert_eq!(url_port("postgres://u:p@h:6543/app"), Some(6543));
    assert_eq!(url_port("postgres://u@h/app"), None);
}

#[tokio::test]
async fn harness_real_kafka_broker_killed_and_restarted_keeps_its_data() {
    let Some(cluster) = KafkaCluster::start(ClusterSpec::single().prop("auto.create.topics.enable", "false")).await
    else {
        return;
    };
    let kafka = cluster.own_ns();
    kafka.create_topic("t", 1).await;
    let bootstrap = kafka.bootstrap_servers();
    produce(&bootstrap, &kafka.topic("t"), None, b"before", &[]).await;
    cluster.kill(1);
    assert!(!cluster.running(1));
    cluster.restart(1).await;
    produce(&bootstrap, &kafka.topic("t"), None, b"after", &[]).await;
    let got = kafka.collect(&["t"], 2, Duration::from_secs(30)).await;
    let payloads: Vec<_> = got.iter().filter_map(|r| r.payload_str()).collect();
    assert_eq!(payloads, ["before", "after"]);
    // auto.create.topics.enable = false holds: a produce to an unknown topic fails.
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("message.timeout.ms", "3000")
        .create()
        .unwrap();
    let missing = kafka.topic("missing");
    let res = producer
        .send(
            FutureRecord::<[u8], [u8]>::to(&missing).payload(b"x"),
            Duration::from_secs(5),
        )
        .await;
    assert!(res.is_err(), "{missing} was auto-created");
}
