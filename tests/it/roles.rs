//! The relay as a non-superuser, with exactly the role docs/operations.md ("The relay's role")
//! recommends: the block of SQL there is read from the docs and run, so the docs cannot list less
//! than `setup`, `setup --check`, `run`, a standby and `status` need. And what each command says
//! when the role lacks a privilege: the same refusal from `setup --check` as from `setup`, a
//! role without REPLICATION failing at once whether the slot is free or held, and a standby that
//! cannot see a holder's status updates (no `pg_read_all_stats`) never terminating it.
//! Run with `cargo test --test it roles`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::Client;

use crate::harness::workload::new_uuid;
use crate::harness::*;

const PASSWORD: &str = "pw-for-roles";

/// The role block of docs/operations.md, for `role` on database `db` (the docs' `relay`, `app`
/// and password replaced; comments dropped).
fn documented_role_sql(role: &str, db: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md");
    let text = std::fs::read_to_string(&path).expect("read docs/operations.md");
    let section = text
        .split("\n## The relay's role\n")
        .nth(1)
        .expect("docs/operations.md has a section \"The relay's role\"");
    let block = section
        .split("```sql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has a ```sql block");
    let sql: String = block
        .lines()
        .map(|l| l.split("--").next().unwrap_or_default())
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let sql = regex::Regex::new(r"\brelay\b").unwrap().replace_all(&sql, role);
    let sql = regex::Regex::new(r"\bapp\b").unwrap().replace_all(&sql, db);
    let sql = sql.replace("'change-me'", &format!("'{PASSWORD}'"));
    for needle in [
        "LOGIN REPLICATION",
        "GRANT pg_read_all_stats",
        "GRANT CREATE ON DATABASE",
        "GRANT SELECT",
    ] {
        assert!(sql.contains(needle), "the documented role lacks {needle}:\n{sql}");
    }
    assert!(!sql.to_uppercase().contains("SUPERUSER"), "{sql}");
    sql
}

/// A database with schema A on `pg`, a superuser client to it, and a role made by `sql_for(role,
/// db)`; returns the client, the database, the role and the config for that role (routing
/// `order.*` to topic `order`).
async fn with_role(
    pg: &PgCluster,
    prefix: &str,
    bootstrap: &str,
    sql_for: impl Fn(&str, &str) -> String,
) -> (Client, String, String, RelayConfig) {
    let db = unique_name(prefix);
    pg.create_database(&db).await;
    let admin = pg.client(&db).await;
    create_schema_a(&admin).await;
    let role = unique_name(prefix);
    admin
        .batch_execute(&sql_for(&role, &db))
        .await
        .unwrap_or_else(|e| panic!("creating role {role}: {e}"));
    let config = RelayConfig::new(&url_as(&pg.url(&db), &role, PASSWORD), bootstrap)
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("relay", "connect_timeout_ms", 15_000);
    (admin, db, role, config)
}

async fn wait_log(relay: &RelayProcess, needle: &str, within: Duration) {
    assert!(
        relay.wait_for_log(needle, within).await,
        "no {needle:?} in the relay log:\n{}",
        relay.log_text()
    );
}

async fn holder_pid(admin: &Client, slot: &str) -> Option<i32> {
    slot_row(admin, slot).await.and_then(|r| r.active_pid)
}

/// `outbox-relay <args>` must fail; its stderr.
async fn refused(args: &[&str], config: &RelayConfig) -> String {
    let out = run_cmd(args, config).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "`{}` should have failed:\n{stderr}",
        args.join(" ")
    );
    stderr
}

/// `run` must stop by itself, promptly and non-zero; its log.
async fn run_refused(config: &RelayConfig) -> String {
    let mut relay = RelayProcess::run(config);
    let status = relay.wait_exit(Duration::from_secs(20)).await;
    let log = relay.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "run did not fail at once ({status:?}):\n{log}"
    );
    log
}

/// The suite the docs promise: setup (and its check), run, a standby and status as the
/// documented role — no superuser — on a real Kafka broker; the standby leaves a healthy holder
/// alone with `takeover_after_ms` set, and takes a frozen one over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_documented_role_sets_up_streams_stands_by_and_reads_status() {
    let Some(kafka) = shared_kafka().await else { return };
    // wal_sender_timeout far above takeover_after_ms: only the standby can free the slot in time.
    let Some(pg) = PgCluster::start_dedicated(&[("wal_sender_timeout", "60s")]).await else {
        return;
    };
    let (admin, _db, role, config) = with_role(&pg, "roles_doc", &kafka.bootstrap_servers(), documented_role_sql).await;
    let config = config
        .on_kafka(&kafka)
        .status_interval_ms(300)
        .set("relay", "takeover_after_ms", 1500)
        .set("relay", "standby_poll_ms", 300);
    let superuser: bool = admin
        .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role])
        .await
        .unwrap()
        .get(0);
    assert!(!superuser);

    let out = run_cmd(&["setup", "--check"], &config).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("check passed"),
        "setup --check as {role}: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    setup(&config).await;

    let a = RelayProcess::run(&config);
    wait_log(&a, "streaming started", Duration::from_secs(30)).await;
    let agg = new_uuid();
    let first = insert_multi_row(&admin, OutboxSchema::A, &agg, 0, 10).await;
    let records = kafka.collect(&["order"], first.len(), Duration::from_secs(60)).await;
    check_delivered(&first, &records, |_| "order".to_owned());

    let b = RelayProcess::run(&config);
    wait_log(&b, "standing by", Duration::from_secs(30)).await;
    let pid_a = holder_pid(&admin, &config.slot).await.expect("A holds the slot");
    // Many polls past takeover_after_ms: the healthy holder is left alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.log_text().contains("terminated the slot holder"), "{}", b.log_text());
    assert_eq!(holder_pid(&admin, &config.slot).await, Some(pid_a));
    assert!(b.log_text().contains("last status update"), "{}", b.log_text());

    let out = run_cmd(&["status", "--json"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(status["slot"]["active_pid"], pid_a, "{status}");
    assert_eq!(status["publication"]["includes_outbox_table"], true, "{status}");
    let last = status["health"]["last_status_update_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("the documented role sees the holder's replies: {status}"));
    assert!(last < 5.0, "{status}");
    assert!(status["health"]["details_hidden"].is_null(), "{status}");

    assert!(a.sigstop());
    let frozen = Instant::now();
    wait_log(&b, "streaming started", Duration::from_secs(15)).await;
    assert!(frozen.elapsed() < Duration::from_secs(10), "{:?}", frozen.elapsed());
    assert!(
        b.log_text().contains("terminated the slot holder's walsender"),
        "{}",
        b.log_text()
    );
    let second = insert_multi_row(&admin, OutboxSchema::A, &agg, 10, 10).await;
    let all: Vec<ExpectedEvent> = first.iter().chain(&second).cloned().collect();
    let records = kafka.collect(&["order"], all.len(), Duration::from_secs(60)).await;
    check_delivered(&all, &records, |_| "order".to_owned());
    assert!(a.sigcont());
}

/// The documented role minus `pg_read_all_stats`.
fn without_stats(role: &str, db: &str) -> String {
    documented_role_sql(role, db)
        .lines()
        .filter(|l| !l.contains("pg_read_all_stats"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 44, 1: without `pg_read_all_stats` the server hides `reply_time`; `takeover_after_ms`
/// is refused by `setup --check`, `setup` and `run` with the GRANT, and a standby that goes blind
/// while it runs (the grant revoked) never terminates the holder — live or frozen — until it can
/// see again, and then takes the frozen one over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_that_cannot_see_replies_never_terminates_the_holder() {
    let Some(kafka) = shared_kafka().await else { return };
    let Some(pg) = PgCluster::start_dedicated(&[("wal_sender_timeout", "60s")]).await else {
        return;
    };
    let (admin, _db, role, config) = with_role(&pg, "roles_blind", &kafka.bootstrap_servers(), without_stats).await;
    let config = config.on_kafka(&kafka);
    let grant = format!(r#"GRANT pg_read_all_stats TO "{role}";"#);

    // No takeover asked for: the grant is not needed.
    let out = run_cmd(&["setup", "--check"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config = config
        .status_interval_ms(300)
        .set("relay", "takeover_after_ms", 1500)
        .set("relay", "standby_poll_ms", 300);
    let check = refused(&["setup", "--check"], &config).await;
    assert!(
        check.contains(&grant) && check.contains("takeover_after_ms = 1500"),
        "{check}"
    );
    assert_eq!(
        refused(&["setup"], &config).await,
        check,
        "setup refuses as its check does"
    );
    let log = run_refused(&config).await;
    assert!(log.contains(&grant), "{log}");

    // With the grant: a holder and a standby; then the grant goes while both run.
    admin.batch_execute(&grant).await.unwrap();
    setup(&config).await;
    let a = RelayProcess::run(&config);
    wait_log(&a, "streaming started", Duration::from_secs(30)).await;
    let b = RelayProcess::run(&config);
    wait_log(&b, "standing by", Duration::from_secs(30)).await;
    let pid_a = holder_pid(&admin, &config.slot).await.expect("A holds the slot");
    admin
        .batch_execute(&format!(r#"REVOKE pg_read_all_stats FROM "{role}""#))
        .await
        .unwrap();
    wait_log(
        &b,
        "cannot see whether the slot holder replies",
        Duration::from_secs(10),
    )
    .await;
    assert!(b.log_text().contains(&grant), "{}", b.log_text());

    // `status` as the role: the last reply is unknown, naming the grant — not a growing age.
    let out = run_cmd(&["status", "--json"], &config).await;
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert!(status["health"]["last_status_update_seconds"].is_null(), "{status}");
    let hidden = status["health"]["details_hidden"].as_str().unwrap_or_default();
    assert!(hidden.contains(&grant), "{status}");
    let out = run_cmd(&["status"], &config).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("last status update from the relay: unknown") && text.contains(&grant),
        "{text}"
    );

    // Live holder, and then frozen: each time well past takeover_after_ms, never terminated.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.sigstop());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!b.log_text().contains("terminated the slot holder"), "{}", b.log_text());
    assert_eq!(holder_pid(&admin, &config.slot).await, Some(pid_a));

    // Seeing again, the standby finds the frozen holder silent and takes over.
    admin.batch_execute(&grant).await.unwrap();
    wait_log(&b, "streaming started", Duration::from_secs(15)).await;
    assert!(
        b.log_text().contains("terminated the slot holder's walsender"),
        "{}",
        b.log_text()
    );
    let events = insert_multi_row(&admin, OutboxSchema::A, &new_uuid(), 0, 5).await;
    let records = kafka.collect(&["order"], events.len(), Duration::from_secs(60)).await;
    check_delivered(&events, &records, |_| "order".to_owned());
    assert!(a.sigcont());
}

/// Issue 44, 3: a role without CREATE on the database gets the same refusal from
/// `setup --check` as from `setup`, naming the GRANT; with it both pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_check_refuses_a_role_without_create_as_setup_does() {
    let pg = shared_cluster().await;
    let without_create = |role: &str, db: &str| {
        documented_role_sql(role, db)
            .lines()
            .filter(|l| !l.contains("GRANT CREATE ON DATABASE"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (admin, db, role, config) = with_role(pg, "roles_create", "127.0.0.1:9", without_create).await;
    let check = refused(&["setup", "--check"], &config).await;
    assert!(
        check.contains(&format!(r#"GRANT CREATE ON DATABASE "{db}" TO "{role}";"#)),
        "{check}"
    );
    assert_eq!(refused(&["setup"], &config).await, check);
    assert!(slot_row(&admin, &config.slot).await.is_none(), "nothing was created");
    admin
        .batch_execute(&format!(r#"GRANT CREATE ON DATABASE "{db}" TO "{role}""#))
        .await
        .unwrap();
    let out = run_cmd(&["setup", "--check"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    setup(&config).await;
}

/// The same for the row filter setup writes into an existing publication: another role's
/// publication and `[filter]` set — `setup --check` refuses as `setup` does, naming the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_check_refuses_a_row_filter_change_setup_could_not_make() {
    let pg = shared_cluster().await;
    let reader = |role: &str, _db: &str| {
        format!(
            "CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{PASSWORD}'; GRANT SELECT ON public.events_outbox TO {role};"
        )
    };
    let (admin, _db, role, config) = with_role(pg, "roles_filter", "127.0.0.1:9", reader).await;
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE events_outbox WITH (publish = 'insert')",
            config.publication
        ))
        .await
        .unwrap();
    let out = run_cmd(&["setup", "--check"], &config).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let filtered = config.set("filter", "include", vec!["order.*".to_owned()]);
    let check = refused(&["setup", "--check"], &filtered).await;
    assert!(
        check.contains(&format!("role {role} lacks ownership of publication")) && check.contains("ADD TABLE"),
        "{check}"
    );
    assert_eq!(refused(&["setup"], &filtered).await, check);
}

/// Issue 44, 10: a role without REPLICATION fails at once with the ALTER ROLE to run — when the
/// slot is free, and when another instance holds it (it used to stand by forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_without_replication_fails_at_once_free_slot_or_busy() {
    let pg = shared_cluster().await;
    let kafka = MockKafka::new(1);
    let no_replication = |role: &str, db: &str| documented_role_sql(role, db).replace("LOGIN REPLICATION", "LOGIN");
    let (_admin, db, role, config) = with_role(pg, "roles_norepl", &kafka.bootstrap_servers(), no_replication).await;
    let fix = format!(r#"ALTER ROLE "{role}" REPLICATION;"#);
    // The superuser sets up and holds the slot; the role's instance finds it busy.
    let holder = RelayConfig {
        postgres_url: pg.url(&db),
        ..config.clone()
    };
    let check = refused(&["setup", "--check"], &config).await;
    assert!(check.contains(&fix), "{check}");
    let free = run_refused(&config).await;
    assert!(free.contains(&fix) && free.contains("REPLICATION attribute"), "{free}");
    setup(&holder).await;
    let a = RelayProcess::run(&holder);
    wait_log(&a, "streaming started", Duration::from_secs(30)).await;
    let busy = run_refused(&config).await;
    assert!(busy.contains(&fix), "{busy}");
    assert!(!busy.contains("standing by"), "{busy}");
}
