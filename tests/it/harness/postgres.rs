//! Throwaway PostgreSQL 15 clusters (or an external server) for integration tests.
//!
//! See the `harness` module docs for the overview. Design notes:
//! * Postgres refuses to run as root, so when the tests run as root every server
//!   command goes through `runuser -u postgres` and the cluster directory is chowned.
//! * The postmaster is started by a small `sh` script that also watches this test
//!   process through `/proc/<pid>`; when the test process disappears (even by SIGKILL,
//!   and always for the never-dropped shared cluster) the script sends SIGQUIT
//!   (immediate shutdown) and deletes the cluster directory.
//! * All settings go into `postgresql.conf` rather than `-c` flags so that `ALTER SYSTEM`
//!   followed by [`PgCluster::restart`] still works.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::sync::OnceCell;
use tokio_postgres::{Client, NoTls};

use super::process::{run_bounded, running_as_root};
use super::tls::generate_server_tls;
use super::util::{free_port, wait_until};

/// Where Debian puts the PostgreSQL 15 server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Set to a superuser `postgres://` URL to run tests against an existing server.
pub const EXTERNAL_PG_ENV: &str = "OUTBOX_RELAY_TEST_PG_URL";
/// The password-authenticated (SCRAM-SHA-256), TLS-only superuser of local clusters.
pub const SCRAM_USER: &str = "relay_scram";
pub const SCRAM_PASSWORD: &str = "scram-Secret-42";

const START_TIMEOUT: Duration = Duration::from_secs(60);
const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// A PostgreSQL server the tests may use: a local throwaway cluster, or the external
/// server named by [`EXTERNAL_PG_ENV`].
pub struct PgCluster {
    inner: Inner,
}

enum Inner {
    Local(LocalPg),
    External { base_url: String, port: u16 },
}

struct LocalPg {
    dir: TempDir,
    port: AtomicU16,
    as_postgres: bool,
    /// The watchdog script that runs the postmaster (via `runuser` when root).
    server: Mutex<Option<Child>>,
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
        let settings: Vec<(String, String)> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let local = tokio::task::spawn_blocking(move || LocalPg::init(&settings))
            .await
            .expect("initdb task");
        let pg = PgCluster {
            inner: Inner::Local(local),
        };
        pg.start_with_port_retries().await;
        pg.create_scram_user().await;
        pg
    }

    async fn start_with_port_retries(&self) {
        let local = self.local("start");
        for attempt in 0..3 {
            local.spawn_server();
            if self.wait_ready().await {
                return;
            }
            let _ = local.wait_server_exit(Duration::from_secs(10));
            let log = self.log_text();
            let port_clash = log.contains("could not bind") || log.contains("already in use");
            if attempt < 2 && port_clash {
                local.set_port(free_port());
                continue;
            }
            panic!("postgres did not become ready; log:\n{}", tail(&log, 4000));
        }
    }

    async fn wait_ready(&self) -> bool {
        let local = self.local("start");
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if !local.server_running() {
                return false;
            }
            if let Ok(c) = self.try_client(&self.admin_db()).await {
                // Another cluster may have grabbed the same port first; make sure we
                // are talking to ours.
                let dir = c.query_one("SELECT current_setting('data_directory')", &[]).await;
                let ours = local.data_dir();
                return dir.is_ok_and(|r| Path::new(r.get::<_, &str>(0)) == ours);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    async fn create_scram_user(&self) {
        let c = self.client("postgres").await;
        // Superuser so TLS e2e tests can run `setup` (publication on a table it does
        // not own); tests about missing privileges create their own roles.
        c.batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE {SCRAM_USER} LOGIN SUPERUSER REPLICATION PASSWORD '{SCRAM_PASSWORD}';"
        ))
        .await
        .expect("create scram user");
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
            Inner::Local(_) => format!("postgres://postgres@127.0.0.1:{}/{db}", self.port()),
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
            Inner::Local(l) => Some(l.dir.path().join("ca.crt")),
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
        self.local("stop").pg_ctl_stop("fast");
    }

    /// Immediate shutdown: no checkpoint, crash recovery on the next start.
    pub fn kill(&self) {
        self.local("kill").pg_ctl_stop("immediate");
    }

    /// Starts a stopped/killed cluster again on the same port and data directory.
    pub async fn start(&self) {
        let local = self.local("start");
        local.spawn_server();
        if !self.wait_ready().await {
            panic!("postgres did not come back; log:\n{}", tail(&self.log_text(), 4000));
        }
    }

    /// [`stop`](Self::stop) (fast) then [`start`](Self::start).
    pub async fn restart(&self) {
        self.stop();
        self.start().await;
    }

    fn local(&self, what: &str) -> &LocalPg {
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
        if let Inner::Local(l) = &self.inner {
            l.pg_ctl_stop("immediate");
        }
    }
}

impl LocalPg {
    /// initdb plus config files; blocking.
    fn init(settings: &[(String, String)]) -> LocalPg {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-pg-")
            .tempdir()
            .expect("tempdir");
        let as_postgres = running_as_root();
        if as_postgres {
            chown_postgres(dir.path());
        }
        let local = LocalPg {
            dir,
            port: AtomicU16::new(free_port()),
            as_postgres,
            server: Mutex::new(None),
        };
        let data = local.data_dir();
        let out = run_bounded(
            local
                .pg_command("initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
                .args(["--no-sync", "--no-instructions"]),
            CMD_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        let tls = generate_server_tls();
        write(&local.dir.path().join("ca.crt"), &tls.ca_pem, 0o644);
        write(&data.join("server.crt"), &tls.cert_pem, 0o644);
        write(&data.join("server.key"), &tls.key_pem, 0o600);
        write(&data.join("pg_hba.conf"), HBA, 0o600);

        let mut conf = format!(
            "\n# --- outbox-relay test harness ---\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{sock}'\n\
             wal_level = logical\n\
             max_replication_slots = 64\n\
             max_wal_senders = 64\n\
             wal_sender_timeout = '5s'\n\
             fsync = off\n\
             max_connections = 200\n\
             shared_buffers = '32MB'\n\
             logging_collector = off\n\
             ssl = on\n\
             ssl_cert_file = 'server.crt'\n\
             ssl_key_file = 'server.key'\n\
             password_encryption = 'scram-sha-256'\n",
            port = local.port(),
            sock = local.dir.path().display(),
        );
        for (k, v) in settings {
            conf.push_str(&format!("{k} = '{}'\n", v.replace('\'', "''")));
        }
        append(&data.join("postgresql.conf"), &conf);
        if as_postgres {
            chown_postgres(local.dir.path());
        }
        local
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn port(&self) -> u16 {
        self.port.load(Ordering::Relaxed)
    }

    /// Before the first successful start only, when another process took the port.
    fn set_port(&self, port: u16) {
        // A later `port =` line overrides the earlier one.
        append(&self.data_dir().join("postgresql.conf"), &format!("port = {port}\n"));
        self.port.store(port, Ordering::Relaxed);
    }

    fn pg_command(&self, program: &str) -> Command {
        let bin = Path::new(PG_BIN).join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        }
    }

    fn spawn_server(&self) {
        let script = r#"P=$1; ROOT=$2; DATA=$3; LOG=$4; BIN=$5
"$BIN/postgres" -D "$DATA" >>"$LOG" 2>&1 &
PG=$!
( while [ -d /proc/$P ]; do sleep 0.5; done
  kill -QUIT $PG 2>/dev/null ) &
W=$!
wait $PG
if [ -d /proc/$P ]; then kill $W 2>/dev/null; else rm -rf "$ROOT"; fi
exit 0"#;
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", script]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            c
        };
        cmd.arg("pg-watchdog")
            .arg(std::process::id().to_string())
            .arg(self.dir.path())
            .arg(self.data_dir())
            .arg(self.log_path())
            .arg(PG_BIN)
            // Not the test's stdout/stderr: cargo waits for those pipes to close.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawn postgres watchdog");
        let old = self.server.lock().unwrap().replace(child);
        if let Some(mut old) = old {
            let _ = old.wait();
        }
    }

    fn server_running(&self) -> bool {
        let mut guard = self.server.lock().unwrap();
        match guard.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn wait_server_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.server.lock().unwrap();
        let Some(child) = guard.as_mut() else {
            return true;
        };
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                *guard = None;
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pg_ctl_stop(&self, mode: &str) {
        if self.data_dir().join("postmaster.pid").exists() {
            let out = run_bounded(
                self.pg_command("pg_ctl")
                    .arg("stop")
                    .arg("-D")
                    .arg(self.data_dir())
                    .args(["-m", mode, "-w", "-t", "60"]),
                CMD_TIMEOUT,
            );
            if !out.status.success() {
                eprintln!(
                    "pg_ctl stop -m {mode}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        if !self.wait_server_exit(Duration::from_secs(30)) {
            if let Some(mut c) = self.server.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
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

fn write(path: &Path, text: &str, mode: u32) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes()).expect("append");
}

fn chown_postgres(path: &Path) {
    let out = run_bounded(
        Command::new("chown").args(["-R", "postgres:postgres"]).arg(path),
        CMD_TIMEOUT,
    );
    assert!(out.status.success(), "chown -R postgres {}", path.display());
}

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
