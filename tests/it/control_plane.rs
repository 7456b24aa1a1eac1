//! The control plane (`setup`, `status`, `teardown`, `preflight`) against real PostgreSQL.
//! Run with `cargo test --test it control_plane`.
//!
//! Every test has its own database and its own slot/publication names (slots are
//! cluster-wide). Tests call the library directly; one test also drives the binary.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_relay::config::Settings;
use outbox_relay::control::{
    self, ControlError, Dropped, PublicationOutcome, RoleRefusal, SlotOutcome, StartRefusal, StatusReport,
    STATUS_SCHEMA_VERSION,
};
use tokio_postgres::Client;

use crate::harness::postgres::PG_BIN;
use outbox_relay::postgres::replication::connection::ReplicationConnection;

use crate::harness::{
    create_schema_a, free_port, invalidate_slot, run_cmd, shared_cluster, slot_row, unique_name, url_as, wait_until,
    PgCluster, RelayConfig, RelayProcess,
};

// ------------------------------------------------------------------ local helpers

/// The outbox part of a config, schema A by default.
#[derive(Clone)]
struct Cfg {
    url: String,
    slot: String,
    publication: String,
    table: String,
    key: String,
    route_by: String,
    payload: String,
    timestamp: Option<String>,
}

impl Cfg {
    fn schema_a(url: &str) -> Cfg {
        Cfg {
            url: url.to_owned(),
            slot: unique_name("cp_slot"),
            publication: unique_name("cp_pub"),
            table: "public.events_outbox".into(),
            key: "aggregate_id".into(),
            route_by: "type".into(),
            payload: "payload".into(),
            timestamp: Some("created_at".into()),
        }
    }

    fn toml(&self) -> String {
        // toml::Value renders correctly quoted strings (mixed-case names carry `"`).
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let mut text = format!(
            "[postgres]\nurl = {}\nslot = {}\npublication = {}\n\
             [outbox]\ntable = {}\nkey_column = {}\nroute_by_column = {}\npayload_column = {}\n",
            q(&self.url),
            q(&self.slot),
            q(&self.publication),
            q(&self.table),
            q(&self.key),
            q(&self.route_by),
            q(&self.payload),
        );
        if let Some(ts) = &self.timestamp {
            text.push_str(&format!("timestamp_column = {}\n", q(ts)));
        }
        text.push_str("[kafka]\n\"bootstrap.servers\" = \"127.0.0.1:9\"\n[relay]\nconnect_timeout_ms = 15000\n");
        text
    }

    fn settings(&self) -> Settings {
        Settings::from_toml_str(&self.toml(), Path::new("test.toml"), std::iter::empty())
            .unwrap_or_else(|e| panic!("config: {e}\n{}", self.toml()))
    }
}

/// A fresh database on the shared cluster with schema A, and a superuser client to it.
async fn fresh_db(prefix: &str) -> (&'static PgCluster, String, Client) {
    let pg = shared_cluster().await;
    let db = unique_name(prefix);
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema_a(&client).await;
    (pg, db, client)
}

/// Drops the database on an external server; local clusters are thrown away whole.
async fn finish(pg: &PgCluster, db: &str) {
    if !pg.is_local() {
        pg.drop_database(db).await;
    }
}

/// Creates a login role with a password (the harness's pg_hba lets such roles in with SCRAM).
async fn create_role(admin: &Client, prefix: &str, attributes: &str) -> (String, String) {
    let role = unique_name(prefix);
    let password = "pw-for-tests";
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN {attributes} PASSWORD '{password}'"))
        .await
        .unwrap_or_else(|e| panic!("create role {role}: {e}"));
    (role, password.to_owned())
}

async fn expect_err(settings: &Settings) -> ControlError {
    match control::setup(settings).await {
        Ok(report) => panic!("setup should have failed, but reported:\n{report}"),
        Err(e) => e,
    }
}

async fn publication_actions(client: &Client, publication: &str) -> Vec<bool> {
    let row = client
        .query_one(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .expect("publication row");
    (0..4).map(|i| row.get(i)).collect()
}

async fn publication_tables(client: &Client, publication: &str) -> Vec<(String, String)> {
    client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2",
            &[&publication],
        )
        .await
        .expect("pg_publication_tables")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A `pg_recvlogical` streaming from `slot`, which makes the slot active. Killed on drop.
struct Streamer(Child);

impl Streamer {
    fn start(url: &str, slot: &str, publication: &str) -> Streamer {
        let child = Command::new(Path::new(PG_BIN).join("pg_recvlogical"))
            .args(["-d", url, "--slot", slot, "--start", "-f", "/dev/null", "--no-loop"])
            .args([
                "-o",
                "proto_version=1",
                "-o",
                &format!("publication_names={publication}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pg_recvlogical");
        Streamer(child)
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ------------------------------------------------------------------ setup

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_twice_creates_then_reports_already_exists() {
    let (pg, db, client) = fresh_db("cp_twice").await;
    let cfg = Cfg::schema_a(&pg.url(&db));
    let settings = cfg.settings();

    let first = control::setup(&settings).await.expect("first setup");
    assert_eq!(first.publication, PublicationOutcome::Created, "{first}");
    assert!(matches!(first.slot, SlotOutcome::Created { .. }), "{first}");
    assert!(!first.already_set_up());
    let text = first.to_string();
    assert!(text.contains("created"), "{text}");

    let second = control::setup(&settings).await.expect("second setup");
    assert!(second.already_set_up(), "{second}");
    let text = second.to_string();
    assert!(
        text.contains(&format!("publication {}: already exists", cfg.publication)),
        "{text}"
    );
    assert!(text.contains(&format!("slot {}: already exists", cfg.slot)), "{text}");

    let slot = slot_row(&client, &cfg.slot).await.expect("slot exists");
    assert_eq!(slot.slot_type, "logical");
    assert_eq!(slot.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(slot.database.as_deref(), Some(db.as_str()));
    assert!(!slot.temporary);
    assert_eq!(
        publication_actions(&client, &cfg.publication).await,
        [true, false, false, false]
    );
    assert_eq!(
        publication_tables(&client, &cfg.publication).await,
        [("public".to_owned(), "events_outbox".to_owned())]
    );
    let SlotOutcome::Created { consistent_point } = first.slot else {
        unreachable!()
    };
    assert!(!consistent_point.is_zero());
    finish(pg, &db).await;
}

/// Concurrent setups race on both creations; the losers must report "already exists", never
/// fail (a slot is visible to others while it is still being created, without its plugin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_setups_all_succeed_and_create_once() {
    let (pg, db, client) = fresh_db("cp_race").await;
    let blocker = pg.client(&db).await;
    for round in 0..4 {
        let settings = Cfg::schema_a(&pg.url(&db)).settings();
        // Round 0: a transaction holding an xid makes slot creation wait for it, so the other
        // setups are sure to find the slot half-created.
        let hold = round == 0;
        if hold {
            blocker
                .batch_execute("BEGIN; INSERT INTO orders (id) VALUES (gen_random_uuid())")
                .await
                .unwrap();
        }
        let release = async {
            if hold {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                blocker.batch_execute("COMMIT").await.unwrap();
            }
        };
        let (a, b, c, ()) = tokio::join!(
            control::setup(&settings),
            control::setup(&settings),
            control::setup(&settings),
            release
        );
        let reports = [a, b, c].map(|r| r.unwrap_or_else(|e| panic!("round {round}: a concurrent setup failed: {e}")));
        let created_pubs = reports
            .iter()
            .filter(|r| r.publication == PublicationOutcome::Created)
            .count();
        let created_slots = reports
            .iter()
            .filter(|r| matches!(r.slot, SlotOutcome::Created { .. }))
            .count();
        assert_eq!((created_pubs, created_slots), (1, 1), "round {round}: {reports:#?}");
        let slot = slot_row(&client, settings.postgres.slot.as_str()).await.expect("slot");
        assert_eq!(slot.plugin.as_deref(), Some("pgoutput"));
    }
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_is_named_with_similar_tables() {
    let (pg, db, _client) = fresh_db("cp_notable").await;
    let mut cfg = Cfg::schema_a(&pg.url(&db));
    cfg.table = "public.event_outbox".into();
    let err = expect_err(&cfg.settings()).await;
    assert!(matches!(err, ControlError::TableNotFound { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(r#""public"."event_outbox""#), "{msg}");
    assert!(msg.contains("does not exist"), "{msg}");
    assert!(
        msg.contains("public.events_outbox"),
        "similar table not suggested: {msg}"
    );
    assert!(msg.contains("outbox.table"), "{msg}");
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_column_names_the_config_key_and_the_real_columns() {
    let (pg, db, _client) = fresh_db("cp_nocol").await;
    let mut cfg = Cfg::schema_a(&pg.url(&db));
    cfg.key = "aggregate_key".into();
    let err = expect_err(&cfg.settings()).await;
    assert!(
        matches!(
            err,
            ControlError::ColumnNotFound {
                key: "outbox.key_column",
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("outbox.key_column"), "{msg}");
    assert!(msg.contains("aggregate_key"), "{msg}");
    assert!(
        msg.contains(r#""aggregate_id""#) && msg.contains(r#""payload""#),
        "actual columns not listed: {msg}"
    );
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_column_types_are_rejected_with_the_accepted_types() {
    let (pg, db, client) = fresh_db("cp_types").await;
    client
        .batch_execute(
            "CREATE DOMAIN event_body AS jsonb;
             CREATE TABLE int_outbox (id bigint, aggregate_id text, type text, payload integer);
             CREATE TABLE domain_outbox (id bigint, aggregate_id text, type text, payload event_body, at date);",
        )
        .await
        .unwrap();
    let mut cfg = Cfg::schema_a(&pg.url(&db));
    cfg.table = "int_outbox".into();
    cfg.timestamp = None;
    let err = expect_err(&cfg.settings()).await;
    assert!(
        matches!(
            err,
            ControlError::UnusableColumnType {
                key: "outbox.payload_column",
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("integer") && msg.contains("jsonb") && msg.contains("bytea"),
        "{msg}"
    );

    // A domain over jsonb is fine as payload; a date is no timestamp.
    cfg.table = "domain_outbox".into();
    cfg.timestamp = Some("at".into());
    let err = expect_err(&cfg.settings()).await;
    assert!(
        matches!(
            err,
            ControlError::UnusableColumnType {
                key: "outbox.timestamp_column",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("date"), "{err}");
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_case_quoted_schema_and_table_work() {
    let (pg, db, client) = fresh_db("cp_case").await;
    client
        .batch_execute(
            r#"CREATE SCHEMA "Sales";
               CREATE TABLE "Sales"."OutBox" (
                   "Id" bigserial PRIMARY KEY, "AggregateId" uuid NOT NULL, "Type" text NOT NULL,
                   "Payload" jsonb NOT NULL, "CreatedAt" timestamptz NOT NULL DEFAULT now());
               CREATE TABLE "Sales".outbox (id int);"#,
        )
        .await
        .unwrap();
    let mut cfg = Cfg::schema_a(&pg.url(&db));
    cfg.table = r#""Sales"."OutBox""#.into();
    cfg.key = r#""AggregateId""#.into();
    cfg.route_by = r#""Type""#.into();
    cfg.payload = r#""Payload""#.into();
    cfg.timestamp = Some(r#""CreatedAt""#.into());
    let mut toml = cfg.toml();
    toml = toml.replace("[outbox]\n", "[outbox]\nid_column = '\"Id\"'\n");
    let settings = Settings::from_toml_str(&toml, Path::new("test.toml"), std::iter::empty()).unwrap();

    let report = control::setup(&settings).await.expect("setup with mixed-case names");
    assert_eq!(report.publication, PublicationOutcome::Created);
    assert_eq!(
        publication_tables(&client, &cfg.publication).await,
        [("Sales".to_owned(), "OutBox".to_owned())],
        "the lower-case namesake must not be published"
    );
    let status = control::status(&settings).await.expect("status");
    assert!(status.publication.includes_outbox_table, "{status}");
    assert_eq!(
        (status.outbox_table.schema.as_str(), status.outbox_table.table.as_str()),
        ("Sales", "OutBox")
    );
    assert!(status.to_string().contains(r#""Sales"."OutBox""#), "{status}");
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ privileges

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_without_replication_gets_the_alter_role_hint() {
    let (pg, db, admin) = fresh_db("cp_norepl").await;
    let (role, password) = create_role(&admin, "cp_norepl", "").await;
    admin
        .batch_execute(&format!("GRANT SELECT ON events_outbox TO {role}"))
        .await
        .unwrap();
    let cfg = Cfg::schema_a(&url_as(&pg.url(&db), &role, &password));
    let err = expect_err(&cfg.settings()).await;
    assert!(
        matches!(err, ControlError::Role(RoleRefusal::NoReplication { .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&format!(r#"ALTER ROLE "{role}" REPLICATION;"#)), "{msg}");
    assert!(!msg.contains(&password), "password leaked: {msg}");
    assert!(slot_row(&admin, &cfg.slot).await.is_none(), "nothing may be created");
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_role_needs_select_and_table_ownership() {
    let (pg, db, admin) = fresh_db("cp_priv").await;
    let (role, password) = create_role(&admin, "cp_repl", "REPLICATION").await;
    let cfg = Cfg::schema_a(&url_as(&pg.url(&db), &role, &password));

    let err = expect_err(&cfg.settings()).await;
    assert!(matches!(err, ControlError::NoSelectPrivilege { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!(r#"GRANT SELECT ON "public"."events_outbox" TO "{role}""#)),
        "{err}"
    );

    // SELECT is enough to pass preflight, but CREATE PUBLICATION needs the table's owner (and
    // CREATE on the database): refused before anything is tried, by `setup --check` alike.
    admin
        .batch_execute(&format!("GRANT SELECT ON events_outbox TO {role}"))
        .await
        .unwrap();
    let err = expect_err(&cfg.settings()).await;
    assert!(matches!(err, ControlError::CannotCreatePublication { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("ownership of \"public\".\"events_outbox\"") && msg.contains("CREATE PUBLICATION"),
        "{msg}"
    );
    let checked = control::check(&cfg.settings())
        .await
        .expect_err("setup --check refuses too");
    assert_eq!(checked.to_string(), msg);

    // Once the superuser created the publication, setup as the role finds it and makes the slot.
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox WITH (publish = 'insert')",
            cfg.publication
        ))
        .await
        .unwrap();
    let report = control::setup(&cfg.settings())
        .await
        .expect("setup with an existing publication");
    assert_eq!(report.publication, PublicationOutcome::AlreadyExists);
    assert!(matches!(report.slot, SlotOutcome::Created { .. }));
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ existing objects

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_publications_are_extended_accepted_or_refused() {
    let (pg, db, admin) = fresh_db("cp_pubs").await;
    // Ours (same owner), without the outbox table: setup adds the table and says so.
    let cfg = Cfg::schema_a(&pg.url(&db));
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE orders WITH (publish = 'insert')",
            cfg.publication
        ))
        .await
        .unwrap();
    let report = control::setup(&cfg.settings()).await.expect("setup adds the table");
    assert_eq!(report.publication, PublicationOutcome::TableAdded, "{report}");
    assert!(report.to_string().contains("notice:"), "{report}");
    assert_eq!(publication_tables(&admin, &cfg.publication).await.len(), 2);

    // Publishing more than inserts: used as it is (never narrowed), with a note on how to narrow it.
    let mut wide = Cfg::schema_a(&pg.url(&db));
    wide.publication = unique_name("cp_wide");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox",
            wide.publication
        ))
        .await
        .unwrap();
    let report = control::setup(&wide.settings())
        .await
        .expect("setup accepts a publication that publishes more than inserts");
    assert_eq!(report.publication, PublicationOutcome::AlreadyExists, "{report}");
    let text = report.to_string();
    for needle in [
        "note: publication",
        "update, delete, truncate operations",
        "ignores",
        &format!("ALTER PUBLICATION {} SET (publish = 'insert')", wide.publication),
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert_eq!(
        publication_actions(&admin, &wide.publication).await,
        [true; 4],
        "setup must not narrow the publication"
    );

    // Not publishing inserts at all: refused with the statement that fixes it.
    let mut blind = Cfg::schema_a(&pg.url(&db));
    blind.publication = unique_name("cp_blind");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox WITH (publish = 'update, delete')",
            blind.publication
        ))
        .await
        .unwrap();
    let err = expect_err(&blind.settings()).await;
    assert!(matches!(err, ControlError::PublicationActions { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("publishes update, delete but not insert"), "{msg}");
    assert!(
        msg.contains(&format!(
            "ALTER PUBLICATION {} SET (publish = 'insert, update, delete')",
            blind.publication
        )),
        "{msg}"
    );
    assert!(
        slot_row(&admin, &blind.slot).await.is_none(),
        "no slot after a failed preflight"
    );

    // Someone else's publication without the table: named owner, ADD TABLE hint, untouched.
    let (role, password) = create_role(&admin, "cp_owner", "REPLICATION").await;
    admin
        .batch_execute(&format!("ALTER TABLE events_outbox OWNER TO {role}"))
        .await
        .unwrap();
    let mut foreign = Cfg::schema_a(&url_as(&pg.url(&db), &role, &password));
    foreign.publication = unique_name("cp_foreign");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE orders WITH (publish = 'insert')",
            foreign.publication
        ))
        .await
        .unwrap();
    let err = expect_err(&foreign.settings()).await;
    assert!(matches!(err, ControlError::PublicationLacksTable { .. }), "{err:?}");
    assert!(
        err.to_string().contains("ADD TABLE \"public\".\"events_outbox\""),
        "{err}"
    );
    assert_eq!(publication_tables(&admin, &foreign.publication).await.len(), 1);
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_lists_row_filters_and_partitioned_outboxes() {
    let (pg, db, admin) = fresh_db("cp_pub15").await;
    // A column list without mapped columns would deliver rows the relay cannot build events from.
    let mut narrow = Cfg::schema_a(&pg.url(&db));
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox (id, aggregate_id) WITH (publish = 'insert')",
            narrow.publication
        ))
        .await
        .unwrap();
    let err = expect_err(&narrow.settings()).await;
    assert!(matches!(err, ControlError::PublicationColumnList { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(r#""type", "payload", "created_at""#), "{msg}");

    // A row filter is legitimate but silently drops events: setup goes ahead and says so.
    narrow.publication = unique_name("cp_filtered");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox WHERE (type <> 'internal') WITH (publish = 'insert')",
            narrow.publication
        ))
        .await
        .unwrap();
    let report = control::setup(&narrow.settings())
        .await
        .expect("setup with a row filter");
    assert!(report.to_string().contains("row filter"), "{report}");

    // A partitioned outbox is published under its own name, not its partitions'.
    admin
        .batch_execute(
            "CREATE TABLE part_outbox (id bigint, aggregate_id uuid, type text, payload jsonb,
                                       created_at timestamptz NOT NULL) PARTITION BY RANGE (created_at);
             CREATE TABLE part_outbox_2020 PARTITION OF part_outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01');",
        )
        .await
        .unwrap();
    let mut part = Cfg::schema_a(&pg.url(&db));
    part.table = "part_outbox".into();
    control::setup(&part.settings())
        .await
        .expect("setup for a partitioned outbox");
    assert_eq!(
        publication_tables(&admin, &part.publication).await,
        [("public".to_owned(), "part_outbox".to_owned())]
    );
    let mut leafy = part.clone();
    leafy.publication = unique_name("cp_leafy");
    leafy.slot = unique_name("cp_leafy_slot");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE part_outbox WITH (publish = 'insert')",
            leafy.publication
        ))
        .await
        .unwrap();
    let err = expect_err(&leafy.settings()).await;
    assert!(matches!(err, ControlError::PublicationNotViaRoot { .. }), "{err:?}");
    assert!(err.to_string().contains("publish_via_partition_root = true"), "{err}");
    finish(pg, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_slots_are_refused_by_setup_and_teardown() {
    let (pg, db, admin) = fresh_db("cp_slots").await;
    let mut cfg = Cfg::schema_a(&pg.url(&db));
    admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
            &[&cfg.slot],
        )
        .await
        .unwrap();
    let err = expect_err(&cfg.settings()).await;
    assert!(matches!(err, ControlError::SlotWrongPlugin { .. }), "{err:?}");
    let msg = err.to_string();
    for needle in [
        "uses output plugin test_decoding",
        "needs pgoutput",
        "docs/migrating-from-debezium.md",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    let err = control::teardown(&cfg.settings())
        .await
        .expect_err("teardown must not drop a foreign slot");
    assert!(matches!(err, ControlError::SlotWrongPlugin { .. }), "{err:?}");
    assert!(slot_row(&admin, &cfg.slot).await.is_some());

    cfg.slot = unique_name("cp_phys");
    admin
        .execute("SELECT pg_create_physical_replication_slot($1)", &[&cfg.slot])
        .await
        .unwrap();
    let err = expect_err(&cfg.settings()).await;
    assert!(matches!(err, ControlError::SlotIsPhysical { .. }), "{err:?}");
    admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&cfg.slot])
        .await
        .unwrap();
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ connection errors

/// A wrong password is fatal on both connections and says so (server message, SQLSTATE, what to
/// check), never showing the password; a closed port is transient and shows the OS error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_show_their_cause_and_whether_retrying_helps() {
    let (pg, db, admin) = fresh_db("cp_conn").await;
    let (role, password) = create_role(&admin, "cp_conn", "REPLICATION").await;
    let wrong = "not-the-Password-9";
    let settings = Cfg::schema_a(&url_as(&pg.url(&db), &role, wrong)).settings();

    let err = control::status(&settings).await.expect_err("wrong password");
    let ControlError::Connect(connect) = &err else {
        panic!("expected a connect error: {err:?}")
    };
    assert!(!connect.is_transient(), "a wrong password is not worth retrying: {err}");
    assert_eq!(connect.sqlstate(), Some("28P01"), "{err}");
    let msg = err.to_string();
    for needle in [
        "password authentication failed",
        "28P01",
        "pg_hba.conf",
        "cannot connect",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    assert!(!msg.contains(wrong) && !msg.contains("db error"), "{msg}");

    let err = ReplicationConnection::connect(&settings.postgres, Duration::from_secs(15))
        .await
        .err()
        .expect("replication with a wrong password");
    assert!(!err.is_transient(), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("password authentication failed") && msg.contains("28P01"),
        "{msg}"
    );
    assert!(!msg.contains(wrong), "{msg}");

    // Nothing listens on a port just freed.
    let port = free_port();
    let closed = Cfg::schema_a(&format!("postgres://{role}:{password}@127.0.0.1:{port}/{db}")).settings();
    let err = control::status(&closed).await.expect_err("closed port");
    let ControlError::Connect(connect) = &err else {
        panic!("expected a connect error: {err:?}")
    };
    assert!(connect.is_transient(), "an unreachable server may come back: {err}");
    let msg = err.to_string();
    for needle in ["Connection refused", "server is running", &format!("127.0.0.1:{port}")] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    assert!(!msg.contains(&password), "{msg}");

    let err = ReplicationConnection::connect(&closed.postgres, Duration::from_secs(15))
        .await
        .err()
        .expect("replication to a closed port");
    assert!(err.is_transient(), "{err}");
    let msg = err.to_string();
    for needle in ["Connection refused", "server is running", &format!("127.0.0.1:{port}")] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    finish(pg, &db).await;
}

/// `run` connects the control connection first: a wrong password there stops the relay at once
/// with the server's reason, instead of reconnecting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_wrong_password_exits_at_once_naming_authentication() {
    let (pg, db, admin) = fresh_db("cp_run_pw").await;
    let (role, _password) = create_role(&admin, "cp_run_pw", "REPLICATION").await;
    let wrong = "not-the-Password-9";
    let config = RelayConfig::new(&url_as(&pg.url(&db), &role, wrong), "127.0.0.1:9");
    let mut relay = RelayProcess::run(&config);
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the relay kept retrying:\n{}", relay.log_text()));
    assert_eq!(status.code(), Some(1), "{}", relay.log_text());
    let log = relay.log_text();
    for needle in ["password authentication failed", "28P01", "pg_hba.conf"] {
        assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
    }
    assert!(!log.contains("reconnecting"), "a wrong password was retried:\n{log}");
    assert!(!log.contains(wrong), "the password reached the log:\n{log}");
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ what `run` refuses, and [retention]

/// The name of each refusal `run` makes from the configuration alone, as `setup` returns it.
/// Exhaustive over [`StartRefusal`] on purpose: a new refusal does not compile until it is named
/// here, and it must then be in [`REFUSAL_KINDS`] and provoked by a case of the test below.
fn refusal_kind(error: &ControlError) -> &'static str {
    match error {
        ControlError::Refused(refusal) => match refusal {
            StartRefusal::DeadLetterName { .. } => "dead-letter name",
            StartRefusal::ExactlyOnceUnsupported { .. } => "exactly-once unsupported",
        },
        ControlError::Tracing(_) => "tracing exporter",
        other => panic!("not one of run's refusals: {other:?}"),
    }
}

const REFUSAL_KINDS: [&str; 3] = ["dead-letter name", "exactly-once unsupported", "tracing exporter"];

fn settings_of(config: &RelayConfig) -> Settings {
    Settings::from_toml_str(&config.render(), Path::new("test.toml"), std::iter::empty())
        .unwrap_or_else(|e| panic!("config: {e}\n{}", config.render()))
}

/// Every configuration `run` refuses is refused by `setup` and `setup --check` too, with the same
/// message, before anything is created: a deploy pipeline that runs `setup` learns it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_its_check_refuse_what_run_refuses_in_the_same_words() {
    let (pg, db, admin) = fresh_db("cp_refuse").await;
    let url = pg.url(&db);
    let cases = [
        // Issue 36, point 1: setup used to declare the exchange; only `run` refused.
        RelayConfig::new(&url, "127.0.0.1:9")
            .sink(
                "rabbitmq",
                &[
                    ("url", "amqp://guest:guest@127.0.0.1:5672/%2f"),
                    ("exchange", &unique_name("cp_refuse_x")),
                ],
            )
            .set("relay", "delivery", "exactly-once"),
        // Kafka's names are checked when the config loads; a NATS subject only against the sink.
        RelayConfig::new(&url, "127.0.0.1:9")
            .sink("nats", &[("url", "nats://127.0.0.1:4222"), ("stream", "OUTBOX")])
            .set("relay", "on_bad_event", "dead-letter")
            .set("relay", "dead_letter_topic", "dead.*"),
        // The config takes any http:// URL; the exporter `run` builds refuses this one.
        RelayConfig::new(&url, "127.0.0.1:9").set("tracing", "otlp_endpoint", "http://no spaces in hosts:4318"),
    ];
    let mut provoked = Vec::new();
    for config in &cases {
        let settings = settings_of(config);
        let refusal = match control::setup(&settings).await {
            Err(e) => e,
            Ok(report) => panic!("setup should have refused {}:\n{report}", config.render()),
        };
        provoked.push(refusal_kind(&refusal));
        let message = refusal.to_string();
        match control::check(&settings).await {
            Err(e) => assert_eq!(e.to_string(), message),
            Ok(report) => panic!("setup --check should have refused:\n{report}"),
        }
        for args in [&["run"][..], &["setup"], &["setup", "--check"]] {
            let out = run_cmd(args, config).await;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains(&message), "{args:?} did not say {message:?}:\n{stderr}");
        }
        assert!(
            slot_row(&admin, &config.slot).await.is_none(),
            "a refused setup created the slot"
        );
        assert!(
            publication_tables(&admin, &config.publication).await.is_empty(),
            "a refused setup created the publication"
        );
    }
    provoked.sort_unstable();
    assert_eq!(provoked, REFUSAL_KINDS, "each refusal of `run` needs a case here");
    finish(pg, &db).await;
}

/// Issue 36, point 2: `setup` checks `[retention]` against the outbox table — partitioned by
/// the timestamp column for `partitions`, the role's privileges for either mode — refuses what
/// would stop retention at its first run, and says what it found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_checks_retention_against_the_outbox_table() {
    let (pg, db, admin) = fresh_db("cp_retention").await;
    let partitions = |config: RelayConfig| {
        config
            .set("retention", "mode", "partitions")
            .set("retention", "keep", "7d")
    };

    // Not partitioned at all: refused by setup and its check, nothing created.
    let flat = partitions(RelayConfig::new(&pg.url(&db), "127.0.0.1:9"));
    let err = expect_err(&settings_of(&flat)).await;
    assert!(matches!(err, ControlError::Retention(_)), "{err:?}");
    let message = err.to_string();
    for needle in [
        r#""public"."events_outbox" is not partitioned by range of "created_at" alone (not partitioned)"#,
        r#"PARTITION BY RANGE ("created_at")"#,
        r#"retention.mode = "delete""#,
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    let out = run_cmd(&["setup", "--check"], &flat).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&message));
    assert!(
        slot_row(&admin, &flat.slot).await.is_none(),
        "a refused setup created the slot"
    );

    // Partitioned, but by another column: refused, naming what it found.
    admin
        .batch_execute(
            "CREATE TABLE by_id_outbox (id bigint, aggregate_id uuid, type text, payload jsonb,
                                        created_at timestamptz NOT NULL) PARTITION BY RANGE (id);
             CREATE TABLE part_outbox (id bigint, aggregate_id uuid, type text, payload jsonb,
                                       created_at timestamptz NOT NULL) PARTITION BY RANGE (created_at);
             CREATE TABLE part_outbox_2020 PARTITION OF part_outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01');",
        )
        .await
        .unwrap();
    let mut by_id = partitions(RelayConfig::new(&pg.url(&db), "127.0.0.1:9"));
    by_id.table = "public.by_id_outbox".into();
    let err = expect_err(&settings_of(&by_id)).await;
    assert!(err.to_string().contains(r#"(strategy r, key ["id"])"#), "{err}");

    // Partitioned by the timestamp column: setup goes ahead and says what it found.
    let mut good = partitions(RelayConfig::new(&pg.url(&db), "127.0.0.1:9"));
    good.table = "public.part_outbox".into();
    let out = run_cmd(&["setup", "--check"], &good).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("check passed: nothing was created or changed"),
        "{stdout}"
    );
    assert!(
        slot_row(&admin, &good.slot).await.is_none(),
        "setup --check created the slot"
    );
    let report = control::setup(&settings_of(&good)).await.expect("setup");
    let text = report.to_string();
    assert!(
        text.contains(
            r#"retention: "public"."part_outbox": mode partitions, partitioned by range of "created_at" (1 partitions now)"#
        ),
        "{text}"
    );
    assert!(slot_row(&admin, &good.slot).await.is_some());

    // Delete mode as a role that may read the table but not delete from it: refused with the
    // GRANT to run; once granted, setup says the role has what retention needs.
    let (role, password) = create_role(&admin, "cp_ret_role", "REPLICATION").await;
    let mut delete = RelayConfig::new(&url_as(&pg.url(&db), &role, &password), "127.0.0.1:9")
        .set("retention", "mode", "delete")
        .set("retention", "keep", "1d");
    delete.publication = unique_name("cp_ret_pub");
    admin
        .batch_execute(&format!(
            "GRANT SELECT ON events_outbox TO {role};
             CREATE PUBLICATION {} FOR TABLE events_outbox WITH (publish = 'insert')",
            delete.publication
        ))
        .await
        .unwrap();
    let err = expect_err(&settings_of(&delete)).await;
    let message = err.to_string();
    assert!(matches!(err, ControlError::Retention(_)), "{err:?}");
    assert!(message.contains("needs DELETE on the table"), "{message}");
    assert!(
        message.contains(&format!(r#"GRANT DELETE ON "public"."events_outbox" TO "{role}""#)),
        "{message}"
    );
    admin
        .batch_execute(&format!("GRANT DELETE ON events_outbox TO {role}"))
        .await
        .unwrap();
    let text = control::setup(&settings_of(&delete))
        .await
        .expect("setup once DELETE is granted")
        .to_string();
    assert!(
        text.contains(&format!(
            r#"retention: "public"."events_outbox": mode delete, deletes published rows older than 1d by "created_at"; role {role} has the privileges it needs"#
        )),
        "{text}"
    );
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ status and teardown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_before_and_after_setup_and_teardown_twice() {
    let (pg, db, admin) = fresh_db("cp_status").await;
    let (role, password) = create_role(&admin, "cp_status", "REPLICATION").await;
    // What a non-superuser needs for setup: the table (CREATE PUBLICATION … FOR TABLE) and
    // CREATE on the database (PostgreSQL 15+).
    admin
        .batch_execute(&format!(
            "ALTER TABLE events_outbox OWNER TO {role}; GRANT CREATE ON DATABASE {db} TO {role}"
        ))
        .await
        .unwrap();
    let cfg = Cfg::schema_a(&url_as(&pg.url(&db), &role, &password));
    let settings = cfg.settings();

    let before = control::status(&settings).await.expect("status before setup");
    assert!(!before.slot.exists && !before.publication.exists, "{before}");
    assert_eq!(before.slot.confirmed_flush_lsn, None);
    assert_eq!(before.server.wal_level, "logical");
    assert!(before.to_string().contains("does not exist"), "{before}");
    check_json(&before, &password);

    control::setup(&settings).await.expect("setup");
    admin
        .execute(
            "INSERT INTO events_outbox (aggregate_id, type, payload) VALUES (gen_random_uuid(), 't', '{}')",
            &[],
        )
        .await
        .unwrap();
    let after = control::status(&settings).await.expect("status after setup");
    let slot = &after.slot;
    assert!(slot.exists && !slot.active && slot.active_pid.is_none(), "{after}");
    assert_eq!(slot.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(slot.slot_type.as_deref(), Some("logical"));
    assert_eq!(slot.database.as_deref(), Some(db.as_str()));
    assert!(slot.confirmed_flush_lsn.is_some() && slot.restart_lsn.is_some());
    assert!(slot.lag_bytes.unwrap() > 0, "the insert is not confirmed yet: {after}");
    assert!(slot.retained_wal_bytes.unwrap() >= slot.lag_bytes.unwrap());
    assert_eq!(slot.wal_status.as_deref(), Some("reserved"));
    assert_eq!(after.publication.publish, ["insert"]);
    assert!(after.publication.includes_outbox_table && !after.publication.all_tables);
    assert_eq!(after.publication.tables.len(), 1);
    assert!(after.server.current_wal_lsn.is_some());
    assert!(after.server.version_num >= 100_000);
    let text = after.to_string();
    assert!(
        text.contains("active: no") && text.contains("plugin pgoutput"),
        "{text}"
    );
    assert!(
        text.contains(" B") || text.contains("KiB"),
        "bytes not rendered in units: {text}"
    );
    check_json(&after, &password);

    // A streaming consumer makes the slot active: status shows the pid, teardown refuses.
    let streamer = Streamer::start(&pg.url(&db), &cfg.slot, &cfg.publication);
    let active = wait_until(Duration::from_secs(20), Duration::from_millis(100), || async {
        slot_row(&admin, &cfg.slot).await.is_some_and(|s| s.active)
    })
    .await;
    assert!(active, "pg_recvlogical did not attach to the slot");
    let busy = control::status(&settings).await.unwrap();
    let pid = busy.slot.active_pid.expect("active pid");
    assert!(busy.to_string().contains(&format!("pid {pid}")), "{busy}");
    let err = control::teardown(&settings)
        .await
        .expect_err("teardown of an active slot");
    assert!(matches!(err, ControlError::SlotInUse { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("in use by pid {pid}")), "{err}");
    assert!(err.to_string().contains("stop the relay first"), "{err}");
    drop(streamer);
    let idle = wait_until(Duration::from_secs(20), Duration::from_millis(100), || async {
        slot_row(&admin, &cfg.slot).await.is_some_and(|s| !s.active)
    })
    .await;
    assert!(idle, "slot stayed active after pg_recvlogical was killed");

    let first = control::teardown(&settings).await.expect("teardown");
    assert!(matches!(first.slot, Dropped::Dropped { .. }), "{first}");
    assert!(matches!(first.publication, Dropped::Dropped { .. }), "{first}");
    let second = control::teardown(&settings).await.expect("second teardown");
    assert_eq!(
        (second.slot.clone(), second.publication.clone()),
        (Dropped::AlreadyAbsent, Dropped::AlreadyAbsent)
    );
    assert!(second.to_string().contains("already absent"), "{second}");
    assert!(slot_row(&admin, &cfg.slot).await.is_none());

    let gone = control::status(&settings).await.expect("status after teardown");
    assert!(!gone.slot.exists && !gone.publication.exists, "{gone}");
    finish(pg, &db).await;
}

/// The JSON has the documented shape, round-trips, and never carries the password.
fn check_json(report: &StatusReport, password: &str) {
    let text = serde_json::to_string_pretty(report).unwrap();
    assert!(!text.contains(password), "password in status JSON: {text}");
    assert!(text.contains("********"), "URL not shown redacted: {text}");
    let back: StatusReport = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, report);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema_version"], STATUS_SCHEMA_VERSION);
    let keys = |obj: &serde_json::Value| {
        let mut k: Vec<String> = obj.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&v),
        [
            "failover",
            "filter",
            "health",
            "outbox_table",
            "outbox_tables",
            "postgres_url",
            "publication",
            "relay",
            "schema_version",
            "server",
            "sink",
            "slot",
            "streaming"
        ]
    );
    // The tests' servers are 14+: `postgres.streaming = "auto"` streams there.
    assert_eq!(v["streaming"]["mode"], "auto");
    assert_eq!(v["streaming"]["on"], true, "{text}");
    assert!(
        v["streaming"]["protocol"]
            .as_str()
            .is_some_and(|p| p.starts_with("pgoutput 2")),
        "{text}"
    );
    assert_eq!(
        keys(&v["server"]),
        [
            "current_wal_lsn",
            "database",
            "in_recovery",
            "version",
            "version_num",
            "wal_level"
        ]
    );
    assert_eq!(
        keys(&v["slot"]),
        [
            "active",
            "active_pid",
            "confirmed_flush_lsn",
            "database",
            "exists",
            "failover",
            "lag_bytes",
            "name",
            "plugin",
            "restart_lsn",
            "retained_wal_bytes",
            "safe_wal_size",
            "slot_type",
            "wal_status"
        ]
    );
    assert_eq!(
        keys(&v["outbox_tables"][0]),
        [
            "error",
            "estimated_rows",
            "in_publication",
            "last_retention",
            "oldest_row",
            "oldest_row_age_seconds",
            "partitioned",
            "retention",
            "schema",
            "size_bytes",
            "table"
        ]
    );
    assert_eq!(
        keys(&v["publication"]),
        [
            "all_tables",
            "exists",
            "includes_outbox_table",
            "name",
            "publish",
            "tables"
        ]
    );
    if let Some(lsn) = v["slot"]["confirmed_flush_lsn"].as_str() {
        assert!(lsn.contains('/'), "LSN not in X/Y form: {lsn}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_setup_status_teardown_round_trip() {
    let (pg, db, _admin) = fresh_db("cp_cli").await;
    let config = RelayConfig::new(&pg.url(&db), "127.0.0.1:9");
    let out = run_cmd(&["setup"], &config).await;
    assert!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
    let out = run_cmd(&["status", "--json"], &config).await;
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    let report: StatusReport = serde_json::from_slice(&out.stdout).expect("status --json parses as StatusReport");
    assert!(report.slot.exists && report.publication.includes_outbox_table);
    let out = run_cmd(&["teardown", "--yes"], &config).await;
    assert!(
        out.status.success(),
        "teardown: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    finish(pg, &db).await;
}

// ------------------------------------------------------------------ server configuration

/// One dedicated cluster walks through wal_level (reload is not enough, restart is) and a
/// slot invalidated by max_slot_wal_keep_size, which setup must refuse rather than recreate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_level_needs_restart_and_invalidated_slots_are_never_recreated() {
    let Some(pg) = PgCluster::start_dedicated(&[("wal_level", "replica"), ("max_slot_wal_keep_size", "1MB")]).await
    else {
        return;
    };
    let db = unique_name("cp_wal");
    pg.create_database(&db).await;
    let admin = pg.client(&db).await;
    create_schema_a(&admin).await;
    let cfg = Cfg::schema_a(&pg.url(&db));
    let settings = cfg.settings();

    let err = expect_err(&settings).await;
    assert!(matches!(err, ControlError::WalLevel { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("'replica'") && msg.contains("RESTART") && msg.contains("wal_level = logical"),
        "{msg}"
    );
    let status = control::status(&settings)
        .await
        .expect("status works with wal_level = replica");
    assert_eq!(status.server.wal_level, "replica");

    // One statement per call: ALTER SYSTEM refuses to run inside a multi-statement batch.
    admin
        .batch_execute("ALTER SYSTEM SET wal_level = logical")
        .await
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let err = expect_err(&settings).await;
    assert!(
        matches!(err, ControlError::WalLevel { .. }),
        "a reload must not be enough: {err:?}"
    );

    drop(admin);
    pg.restart().await;
    let admin = pg.client(&db).await;
    control::setup(&settings).await.expect("setup after restart");

    // Push WAL past the slot's restart_lsn until a checkpoint invalidates it.
    let lost = invalidate_slot(&admin, &cfg.slot, Duration::from_secs(60)).await;
    assert!(lost, "slot was not invalidated");

    let status = control::status(&settings).await.unwrap();
    assert_eq!(status.slot.wal_status.as_deref(), Some("lost"), "{status}");
    let err = expect_err(&settings).await;
    assert!(matches!(err, ControlError::SlotInvalidated { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("never recreates") && msg.contains("teardown"), "{msg}");
    assert_eq!(
        slot_row(&admin, &cfg.slot).await.unwrap().wal_status.as_deref(),
        Some("lost"),
        "slot was touched"
    );

    // The operator's way out: teardown, then setup makes a fresh slot.
    control::teardown(&settings)
        .await
        .expect("teardown of an invalidated slot");
    let report = control::setup(&settings).await.expect("setup after teardown");
    assert!(matches!(report.slot, SlotOutcome::Created { .. }), "{report}");
}
