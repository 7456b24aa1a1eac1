//! PostgreSQL for integration tests: the library's throwaway cluster
//! ([`outbox_relay::demo::postgres::ThrowawayPostgres`], which owns initdb, ports, the watchdog,
//! start, stop and cleanup) configured the way the tests need it, or an external server.
//!
//! See the `harness` module docs for the overview. What this layer adds is test policy:
//! * one lazily started cluster per test binary ([`shared_cluster`]; never dropped — the
//!   library's watchdog removes it when the test process exits) and private ones
//!   ([`PgCluster::start_dedicated`]) for tests that stop, kill or reconfigure the server;
//! * the test settings (128 slots, 64 senders, `wal_sender_timeout = 5s`, …), TLS with a
//!   throwaway CA ([`PgCluster::ca_cert_path`]), the TLS-only SCRAM superuser [`SCRAM_USER`]
//!   and the `pg_hba.conf` that enforces it;
//! * the external-server mode ([`EXTERNAL_PG_ENV`]), in which no local cluster is started;
//! * async waiting (a restart never blocks the test's runtime while the server comes up) and
//!   slot/LSN helpers.
//!
//! Invariant: every local cluster is started with the same [`Options`], so a test sees the
//! same server whether it shares the cluster or has its own (plus its own settings).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use outbox_relay::demo::postgres::{Options, Readiness, Shutdown, ThrowawayPostgres, START_TIMEOUT};
use tokio::sync::OnceCell;
use tokio_postgres::{Client, NoTls};

use super::tls::generate_server_tls;
use super::util::wait_until;

/// Where Debian puts the PostgreSQL 15 server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Set to a superuser `postgres://` URL to run tests against an existing server.
pub const EXTERNAL_PG_ENV: &str = "OUTBOX_RELAY_TEST_PG_URL";
/// The password-authenticated (SCRAM-SHA-256), TLS-only superuser of local clusters.
pub const SCRAM_USER: &str = "relay_scram";
pub const SCRAM_PASSWORD: &str = "scram-Secret-42";

/// Settings of every local cluster, on top of the library's defaults (`wal_level = logical`,
/// `fsync = off`, loopback only); a test's own settings come after these.
const TEST_SETTINGS: &[(&str, &str)] = &[
    ("max_replication_slots", "128"),
    ("max_wal_senders", "64"),
    ("wal_sender_timeout", "5s"),
    ("max_connections", "200"),
    ("shared_buffers", "32MB"),
    ("password_encryption", "scram-sha-256"),
];

/// A PostgreSQL server the tests may use: a local throwaway cluster, or the external
/// server named by [`EXTERNAL_PG_ENV`].
pub struct PgCluster {
    inner: Inner,
}

enum Inner {
    Local(ThrowawayPostgres),
    External { base_url: String, port: u16 },
}

static SHARED: OnceCell<PgCluster> = OnceCell::const_new();

/// The process-wide cluster, started on first use (or the external server).
/// Tests sharing it must create their own database ([`unique_name`](super::unique_name)).
pub async fn shared_cluster() -> &'static PgCluster {
    SHARED
        .get_or_init(|| async {
            match std::env::var(EXTERNAL_PG_ENV) {
                Ok(url) if !url.trim().is_empty() => PgCluster::external(url.trim()).await,
                _ => PgCluster::start_local(&[]).await,
            }
        })
        .await
}

impl PgCluster {
    /// Starts a private cluster with `settings` appended to the defaults (later wins),
    /// e.g. `&[("wal_level", "replica")]`. Returns `None` (loudly) when the tests are
    /// pointed at an external server, where no local cluster may be started.
    pub async fn start_dedicated(settings: &[(&str, &str)]) -> Option<PgCluster> {
        if std::env::var(EXTERNAL_PG_ENV).is_ok_and(|v| !v.trim().is_empty()) {
            eprintln!(
                "\n!!!!! SKIPPING: this test needs a dedicated local PostgreSQL cluster, but \
                 {EXTERNAL_PG_ENV} is set. !!!!!\n"
            );
            return None;
        }
        Some(PgCluster::start_local(settings).await)
    }

    async fn external(url: &str) -> PgCluster {
        let port = url_port(url).unwrap_or(5432);
        let pg = PgCluster {
            inner: Inner::External {
                base_url: url.to_string(),
                port,
            },
        };
        let ok = pg.try_client(&pg.admin_db()).await.is_ok();
        assert!(ok, "cannot connect to {EXTERNAL_PG_ENV}={url}");
        pg
    }

    async fn start_local(settings: &[(&str, &str)]) -> PgCluster {
        assert!(
            Path::new(PG_BIN).join("postgres").exists(),
            "PostgreSQL 15 server binaries not found in {PG_BIN} (apt-get install postgresql-15)"
        );
        let tls = generate_server_tls();
        let options = TEST_SETTINGS.iter().chain(settings).fold(
            Options::default()
                .prefix("outbox-relay-pg-")
                .tls(&tls.cert_pem, &tls.key_pem)
                .hba(HBA)
                // Superuser so TLS e2e tests can run `setup` (publication on a table it does
                // not own); tests about missing privileges create their own roles.
                .password_superuser(SCRAM_USER, SCRAM_PASSWORD),
            |options, (name, value)| options.setting(name, value),
        );
        let start =
            move || ThrowawayPostgres::start_with_options(Path::new(PG_BIN), &options).map_err(|e| e.to_string());
        let cluster = tokio::task::spawn_blocking(start)
            .await
            .expect("initdb task")
            .unwrap_or_else(|e| panic!("{e}"));
        // The CA that signed the server's certificate, for clients that verify it; it goes
        // with the cluster's directory.
        let ca = cluster
            .dir()
            .expect("a running cluster has its directory")
            .join("ca.crt");
        fs::write(&ca, &tls.ca_pem).unwrap_or_else(|e| panic!("write {}: {e}", ca.display()));
        fs::set_permissions(&ca, fs::Permissions::from_mode(0o644)).expect("chmod ca.crt");
        PgCluster {
            inner: Inner::Local(cluster),
        }
    }

    /// Whether this is a throwaway local cluster (false for the external server).
    pub fn is_local(&self) -> bool {
        matches!(self.inner, Inner::Local(_))
    }

    pub fn port(&self) -> u16 {
        match &self.inner {
            Inner::Local(l) => l.port(),
            Inner::External { port, .. } => *port,
        }
    }

    /// Superuser URL for database `db` (`postgres` with trust auth on local clusters).
    pub fn url(&self, db: &str) -> String {
        match &self.inner {
            Inner::Local(l) => l.url(db),
            Inner::External { base_url, .. } => replace_url_db(base_url, db),
        }
    }

    /// URL for [`SCRAM_USER`] with its password and `sslmode=require`. Local clusters
    /// only. Pair it with [`ca_cert_path`](Self::ca_cert_path) to verify the server.
    pub fn scram_url(&self, db: &str) -> Option<String> {
        self.is_local().then(|| {
            format!(
                "postgres://{SCRAM_USER}:{SCRAM_PASSWORD}@127.0.0.1:{}/{db}?sslmode=require",
                self.port()
            )
        })
    }

    /// PEM file of the CA that signed the local server's certificate.
    pub fn ca_cert_path(&self) -> Option<PathBuf> {
        match &self.inner {
            Inner::Local(l) => l.dir().map(|dir| dir.join("ca.crt")),
            Inner::External { .. } => None,
        }
    }

    /// The server log (local clusters; empty path for the external server).
    pub fn log_path(&self) -> PathBuf {
        match &self.inner {
            Inner::Local(l) => l.log_path(),
            Inner::External { .. } => PathBuf::new(),
        }
    }

    pub fn log_text(&self) -> String {
        fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn data_dir(&self) -> Option<PathBuf> {
        match &self.inner {
            Inner::Local(l) => Some(l.data_dir()),
            Inner::External { .. } => None,
        }
    }

    fn admin_db(&self) -> String {
        match &self.inner {
            Inner::Local(_) => "postgres".to_string(),
            Inner::External { base_url, .. } => url_db(base_url).unwrap_or("postgres".into()),
        }
    }

    /// Connects as superuser to `db`, spawning the connection task on the current runtime.
    pub async fn client(&self, db: &str) -> Client {
        self.try_client(db)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url(db)))
    }

    pub async fn try_client(&self, db: &str) -> Result<Client, tokio_postgres::Error> {
        let url = self.url(db);
        let connect = tokio_postgres::connect(&url, NoTls);
        let (client, conn) = match tokio::time::timeout(Duration::from_secs(15), connect).await {
            Ok(r) => r?,
            Err(_) => panic!("connecting to {url} timed out"),
        };
        tokio::spawn(async move {
            // Errors here mean the server went away, which restart/kill tests cause on
            // purpose; the client's own calls report it.
            let _ = conn.await;
        });
        Ok(client)
    }

    /// `CREATE DATABASE name` (name should come from `unique_name`).
    pub async fn create_database(&self, name: &str) {
        let c = self.client(&self.admin_db()).await;
        c.batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
    }

    /// Drops a database and the replication slots in it (terminating their users).
    /// Mostly for the external server, where nothing is thrown away for us.
    pub async fn drop_database(&self, name: &str) {
        let c = self.client(&self.admin_db()).await;
        let _ = c
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                 WHERE database = $1 AND active_pid IS NOT NULL",
                &[&name],
            )
            .await;
        let dropped = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
            let c = &c;
            async move {
                c.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                     WHERE database = $1 AND NOT active",
                    &[&name],
                )
                .await
                .is_ok()
                    && c.query_one(
                        "SELECT count(*) FROM pg_replication_slots WHERE database = $1",
                        &[&name],
                    )
                    .await
                    .map(|r| r.get::<_, i64>(0) == 0)
                    .unwrap_or(false)
            }
        })
        .await;
        assert!(dropped, "slots of database {name} could not be dropped");
        c.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await
            .unwrap_or_else(|e| panic!("drop database {name}: {e}"));
    }

    /// Fast shutdown (clean: checkpoint, walsenders flushed). Local clusters only.
    pub fn stop(&self) {
        report(self.local("stop").stop_server(Shutdown::Fast));
    }

    /// Immediate shutdown: no checkpoint, crash recovery on the next start.
    pub fn kill(&self) {
        report(self.local("kill").stop_server(Shutdown::Immediate));
    }

    /// Starts a stopped/killed cluster again on the same port and data directory.
    pub async fn start(&self) {
        let local = self.local("start");
        local.spawn_server().unwrap_or_else(|e| panic!("{e}"));
        // Polled here rather than with the library's blocking `wait_ready`, so the test's
        // runtime keeps running its other tasks meanwhile.
        let deadline = Instant::now() + START_TIMEOUT;
        let ready = loop {
            match local.readiness() {
                Readiness::Ready => break true,
                Readiness::Exited => break false,
                Readiness::Starting if Instant::now() >= deadline => break false,
                Readiness::Starting => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        if !ready {
            panic!("postgres did not come back; log:\n{}", tail(&self.log_text(), 4000));
        }
    }

    /// [`stop`](Self::stop) (fast) then [`start`](Self::start).
    pub async fn restart(&self) {
        self.stop();
        self.start().await;
    }

    fn local(&self, what: &str) -> &ThrowawayPostgres {
        match &self.inner {
            Inner::Local(l) => l,
            Inner::External { .. } => {
                panic!("PgCluster::{what} needs a local cluster (use start_dedicated)")
            }
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // A crash stop, quicker than the library's own fast one on drop (which then only
        // removes the directory).
        if let Inner::Local(l) = &self.inner {
            report(l.stop_server(Shutdown::Immediate));
        }
    }
}

/// `pg_ctl stop` failures are worth a line in the test output, not a failure of their own:
/// the server is stopped either way (or the test notices when it talks to it).
fn report(stopped: Result<(), outbox_relay::demo::DemoError>) {
    if let Err(e) = stopped {
        eprintln!("{e}");
    }
}

const HBA: &str = "\
# outbox-relay test harness. First match wins.
local     all          all                          trust
local     replication  all                          trust
hostssl   all          relay_scram   127.0.0.1/32   scram-sha-256
hostssl   replication  relay_scram   127.0.0.1/32   scram-sha-256
host      replication  relay_scram   127.0.0.1/32   scram-sha-256
hostnossl all          relay_scram   127.0.0.1/32   reject
hostssl   all          postgres      127.0.0.1/32   trust
hostssl   replication  postgres      127.0.0.1/32   trust
host      all          postgres      127.0.0.1/32   trust
host      replication  postgres      127.0.0.1/32   trust
# Roles that tests create themselves authenticate with a password.
host      all          all           127.0.0.1/32   scram-sha-256
host      replication  all           127.0.0.1/32   scram-sha-256
";

fn tail(s: &str, max: usize) -> &str {
    let start = s.len().saturating_sub(max);
    let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
    &s[start..]
}

/// `postgres://user@host:port/db?x=y` → the same URL with `db` replaced.
pub fn replace_url_db(url: &str, db: &str) -> String {
    let (before_query, query) = match url.find('?') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let authority_start = before_query.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match before_query[authority_start..].find('/') {
        Some(i) => &before_query[..authority_start + i],
        None => before_query,
    };
    format!("{base}/{db}{query}")
}

fn url_db(url: &str) -> Option<String> {
    let before_query = url.split('?').next()?;
    let authority_start = before_query.find("://")? + 3;
    let path = &before_query[authority_start..];
    let db = &path[path.find('/')? + 1..];
    (!db.is_empty()).then(|| db.to_string())
}

pub fn url_port(url: &str) -> Option<u16> {
    let before_query = url.split('?').next()?;
    let rest = &before_query[before_query.find("://")? + 3..];
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit('@').next()?;
    host_port.rsplit_once(':')?.1.parse().ok()
}

/// Parses Postgres' `X/Y` LSN text (two hex halves) into a u64.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    (hi <= u32::MAX as u64 && lo <= u32::MAX as u64).then_some((hi << 32) | lo)
}

/// Renders a u64 the way Postgres prints an LSN (`16/B374D848`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// `confirmed_flush_lsn` of `slot`; `None` if the slot does not exist (or has none yet).
pub async fn confirmed_flush_lsn(client: &Client, slot: &str) -> Option<u64> {
    slot_row(client, slot).await?.confirmed_flush_lsn
}

/// `pg_current_wal_lsn()`.
pub async fn current_wal_lsn(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("pg_current_wal_lsn");
    parse_lsn(row.get(0)).expect("parse current lsn")
}

/// One row of `pg_replication_slots`, LSNs parsed.
#[derive(Debug, Clone)]
pub struct SlotRow {
    pub slot_name: String,
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub temporary: bool,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub restart_lsn: Option<u64>,
    pub confirmed_flush_lsn: Option<u64>,
    /// `reserved`, `extended`, `unreserved` or `lost` (the last after
    /// `max_slot_wal_keep_size` was exceeded).
    pub wal_status: Option<String>,
}

pub async fn slot_row(client: &Client, slot: &str) -> Option<SlotRow> {
    let row = client
        .query_opt(
            "SELECT slot_name::text, plugin::text, slot_type, database::text, temporary,
                    active, active_pid, restart_lsn::text, confirmed_flush_lsn::text, wal_status
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("query pg_replication_slots")?;
    let lsn = |i: usize| row.get::<_, Option<&str>>(i).and_then(parse_lsn);
    Some(SlotRow {
        slot_name: row.get(0),
        plugin: row.get(1),
        slot_type: row.get(2),
        database: row.get(3),
        temporary: row.get(4),
        active: row.get(5),
        active_pid: row.get(6),
        restart_lsn: lsn(7),
        confirmed_flush_lsn: lsn(8),
        wal_status: row.get(9),
    })
}
