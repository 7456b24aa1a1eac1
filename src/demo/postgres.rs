//! The one throwaway PostgreSQL cluster of this repository: the demo's (`outbox-relay demo`),
//! the benchmark's (`benches/cdc_vs_polling`, through [`ThrowawayPostgres::start_with`]) and the
//! integration tests' (`tests/it/harness/postgres.rs`, which adds TLS, a SCRAM user and its own
//! `pg_hba.conf` through [`Options`]). `initdb` into a temporary directory, one server on a free
//! loopback port (never 5432) with `wal_level = logical`; it can be stopped (fast or immediate)
//! and started again on the same port and data, and is finally stopped and deleted.
//!
//! Invariants:
//! * **Nothing outlives its owner.** [`ThrowawayPostgres::stop`] (also run on drop) stops the
//!   server with `pg_ctl stop -m fast` and removes the directory. And because the owning process
//!   can die without running destructors (SIGKILL, a closed terminal, a test binary that never
//!   drops a shared cluster), the postmaster is started by a small `sh` watchdog that notices
//!   when the owner is gone and then shuts the server down (SIGQUIT) and deletes the directory
//!   itself.
//! * **Ready means ours.** A start counts as done only when the server this value spawned says
//!   `ready` in its own `postmaster.pid` for its own port — never because some other server
//!   answers on that port.
//! * **Every wait is bounded**: the start (60 s), each `initdb`/`pg_ctl`/`chown` run (120 s), the
//!   stop (`pg_ctl -t 60`, then 30 s for the watchdog before it is killed).
//! * PostgreSQL refuses to run as root, so when the owner runs as root every server command goes
//!   through `runuser -u postgres --` and the directory is handed to that user.
//! * All settings live in `postgresql.conf` (appended after the defaults, later lines win) rather
//!   than `-c` flags, so `ALTER SYSTEM` followed by a restart behaves as on a real server.

use std::fs;
use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::DemoError;

/// How long a start may take until the server is ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on each `initdb`, `pg_ctl stop`, single-user or `chown` run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the watchdog may take to exit after its postmaster was stopped.
const WATCHDOG_EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the postmaster and watches the owner's pid; see the module docs.
const WATCHDOG: &str = r#"P=$1; ROOT=$2; DATA=$3; LOG=$4; BIN=$5
"$BIN/postgres" -D "$DATA" >>"$LOG" 2>&1 &
PG=$!
( while [ -d /proc/$P ]; do sleep 0.5; done
  kill -QUIT $PG 2>/dev/null ) &
W=$!
wait $PG
if [ -d /proc/$P ]; then kill $W 2>/dev/null; else rm -rf "$ROOT"; fi
exit 0"#;

/// What a cluster gets besides the defaults (`listen_addresses = '127.0.0.1'`,
/// `wal_level = logical`, 10 slots and senders, `fsync = off`, `trust` for everyone).
/// `Options::default()` is the demo's cluster.
#[derive(Debug, Clone)]
pub struct Options {
    prefix: String,
    settings: String,
    /// Server certificate and key, PEM.
    tls: Option<(String, String)>,
    hba: Option<String>,
    /// (name, password) of SCRAM superusers.
    roles: Vec<(String, String)>,
    port: Option<u16>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            prefix: "outbox-relay-demo-".into(),
            settings: String::new(),
            tls: None,
            hba: None,
            roles: Vec::new(),
            port: None,
        }
    }
}

impl Options {
    /// The temporary directory's name starts with `prefix`.
    pub fn prefix(mut self, prefix: &str) -> Options {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// `postgresql.conf` lines, appended after the defaults (later lines win).
    pub(crate) fn settings(mut self, text: &str) -> Options {
        self.settings.push_str(text);
        if !text.is_empty() && !text.ends_with('\n') {
            self.settings.push('\n');
        }
        self
    }

    /// One setting, `name = 'value'` (the value quoted for `postgresql.conf`), after the
    /// defaults and any earlier settings.
    pub fn setting(self, name: &str, value: &str) -> Options {
        let line = format!("{name} = '{}'\n", value.replace('\'', "''"));
        self.settings(&line)
    }

    /// TLS with this server certificate (chain) and private key, both PEM: they become
    /// `server.crt` and `server.key` (mode 0600) in the data directory, with `ssl = on`.
    /// Whether a client must use TLS is for `pg_hba.conf` ([`hba`](Self::hba)) to say.
    pub fn tls(mut self, cert_pem: &str, key_pem: &str) -> Options {
        self.tls = Some((cert_pem.to_owned(), key_pem.to_owned()));
        self
    }

    /// Replaces `pg_hba.conf` (by default `trust` for every local and loopback connection).
    pub fn hba(mut self, text: &str) -> Options {
        self.hba = Some(text.to_owned());
        self
    }

    /// A `LOGIN SUPERUSER REPLICATION` role whose password is stored as a SCRAM-SHA-256
    /// verifier, created in single-user mode before the server first starts (so no
    /// `pg_hba.conf` line has to admit the creator). Name and password are single lines.
    pub fn password_superuser(mut self, name: &str, password: &str) -> Options {
        self.roles.push((name.to_owned(), password.to_owned()));
        self
    }

    /// Listen on `port`, and fail rather than move elsewhere when it is taken. By default
    /// the cluster takes a free port (never 5432), and another if that one is taken meanwhile.
    pub fn port(mut self, port: u16) -> Options {
        self.port = Some(port);
        self
    }
}

/// How [`ThrowawayPostgres::stop_server`] shuts the server down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Clean: sessions ended, a shutdown checkpoint, walsenders send what is left.
    Fast,
    /// A crash: no checkpoint, crash recovery on the next start.
    Immediate,
}

impl Shutdown {
    fn mode(self) -> &'static str {
        match self {
            Shutdown::Fast => "fast",
            Shutdown::Immediate => "immediate",
        }
    }
}

/// Where a started server is, without waiting ([`ThrowawayPostgres::readiness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Running, not yet accepting connections (starting up, or in crash recovery).
    Starting,
    /// Accepting connections on [`ThrowawayPostgres::port`].
    Ready,
    /// Not running: stopped, never started, or it exited (see the log).
    Exited,
}

pub struct ThrowawayPostgres {
    /// `None` once stopped and removed.
    dir: Option<PathBuf>,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    /// The watchdog that runs the postmaster; `None` while stopped.
    server: Mutex<Option<Child>>,
}

impl ThrowawayPostgres {
    /// initdb + start with [`Options::default`]; blocking (run it on a blocking thread).
    pub(crate) fn start(bin: &Path) -> Result<ThrowawayPostgres, DemoError> {
        ThrowawayPostgres::start_with_options(bin, &Options::default())
    }

    /// Like [`start`](Self::start), with `settings` appended to `postgresql.conf` after the
    /// defaults (later lines win) and the temporary directory named with `prefix`.
    pub fn start_with(bin: &Path, settings: &str, prefix: &str) -> Result<ThrowawayPostgres, DemoError> {
        ThrowawayPostgres::start_with_options(bin, &Options::default().prefix(prefix).settings(settings))
    }

    /// initdb, configure as `options` say, start, and wait until ready ([`START_TIMEOUT`]);
    /// blocking. On an error nothing is left behind.
    pub fn start_with_options(bin: &Path, options: &Options) -> Result<ThrowawayPostgres, DemoError> {
        for tool in ["initdb", "postgres", "pg_ctl"] {
            if !bin.join(tool).is_file() {
                return Err(DemoError::NoPostgres(format!("{} has no {tool}", bin.display())));
            }
        }
        let multi_line = |s: &String| s.contains(['\n', '\r']);
        if options
            .roles
            .iter()
            .any(|(name, password)| multi_line(name) || multi_line(password))
        {
            return Err(DemoError::PostgresStart(
                "role names and passwords must be single lines".into(),
            ));
        }
        let mut pg = ThrowawayPostgres::create_dir(bin, options)?;
        pg.init(options)?;
        pg.start_on_port(options)?;
        Ok(pg)
    }

    /// A physical standby (or any cluster made from a base backup): the data directory is a
    /// copy of `source` taken between `pg_backup_start` and `pg_backup_stop` (the caller's
    /// session runs both), without its WAL, slots and pid file; `files` (e.g. `backup_label`
    /// from `pg_backup_stop`, an empty `standby.signal`) are written into it, then `options`'
    /// settings (`primary_conninfo`, `primary_slot_name`, …) are appended to its configuration,
    /// and it starts on a port of its own. Blocking; ready as soon as it accepts connections
    /// (a hot standby: once consistent). `options`' TLS, `pg_hba.conf` and roles come with the
    /// copy and are not applied again.
    pub fn start_from_copy(
        bin: &Path,
        source: &Path,
        files: &[(&str, &str)],
        options: &Options,
    ) -> Result<ThrowawayPostgres, DemoError> {
        let mut pg = ThrowawayPostgres::create_dir(bin, options)?;
        if pg.as_postgres {
            pg.chown()?;
        }
        let data = pg.data_dir();
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(source).arg(&data);
        let out = run_bounded(&mut cp, None)?;
        if !out.status.success() {
            return Err(DemoError::PostgresStart(format!(
                "copying {}: {}",
                source.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // What a base backup leaves out: the source's running state, its WAL (the standby
        // streams what it needs from the primary) and its replication slots.
        for file in ["postmaster.pid", "postmaster.opts", "backup_label.old"] {
            let _ = fs::remove_file(data.join(file));
        }
        for dir in ["pg_wal", "pg_replslot"] {
            for entry in fs::read_dir(data.join(dir)).into_iter().flatten().flatten() {
                let path = entry.path();
                let _ = if path.is_dir() && entry.file_name() != "archive_status" && entry.file_name() != "summaries" {
                    fs::remove_dir_all(&path)
                } else if path.is_file() {
                    fs::remove_file(&path)
                } else {
                    Ok(())
                };
            }
        }
        for (name, text) in files {
            write_file(&data.join(name), text, 0o600)?;
        }
        pg.append_conf(&format!(
            "\n# outbox-relay: copy of {}\nunix_socket_directories = '{}'\n",
            source.display(),
            pg.root().display()
        ))?;
        pg.append_conf(&options.settings)?;
        if pg.as_postgres {
            pg.chown()?;
        }
        pg.start_on_port(options)?;
        Ok(pg)
    }

    /// Promotes a standby (`pg_ctl promote`, waiting up to 60 s until it accepts writes). Blocking.
    pub fn promote(&self) -> Result<(), DemoError> {
        let mut pg_ctl = self.command(&self.bin.join("pg_ctl"));
        pg_ctl
            .arg("promote")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60"]);
        let out = run_bounded(&mut pg_ctl, None)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(DemoError::PostgresStart(format!(
                "pg_ctl promote: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// The binaries' directory this cluster runs.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The temporary directory, before anything is in it; dropping the value removes it.
    fn create_dir(bin: &Path, options: &Options) -> Result<ThrowawayPostgres, DemoError> {
        let dir = tempfile::Builder::new()
            .prefix(&options.prefix)
            .tempdir()
            .map_err(|e| DemoError::Io("creating the temporary directory".into(), e))?
            .keep();
        Ok(ThrowawayPostgres {
            dir: Some(dir),
            bin: bin.to_owned(),
            port: 0,
            as_postgres: running_as_root(),
            server: Mutex::new(None),
        })
    }

    /// Picks the port, starts the server and waits until it is ready.
    fn start_on_port(&mut self, options: &Options) -> Result<(), DemoError> {
        let pg = self;
        // Another process can take a free port between our check and the server's bind.
        let attempts = if options.port.is_some() { 1 } else { 3 };
        for _ in 0..attempts {
            pg.port = match options.port {
                Some(port) => port,
                None => free_port()?,
            };
            pg.append_conf(&format!("port = {}\n", pg.port))?;
            pg.spawn_server()?;
            if pg.wait_ready(START_TIMEOUT) {
                return Ok(());
            }
            let _ = pg.stop_server(Shutdown::Immediate);
            let log = pg.log_tail();
            if !(log.contains("could not bind") || log.contains("already in use")) {
                break;
            }
        }
        Err(DemoError::PostgresStart(pg.log_tail()))
    }

    /// The superuser URL (no password; `trust` on loopback unless [`Options::hba`] says
    /// otherwise) for `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server log (inside the temporary directory).
    pub fn log_path(&self) -> PathBuf {
        self.root().join("postgres.log")
    }

    /// The postmaster's pid, from `postmaster.pid` (its first line).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The temporary directory (data directory and server log), while it exists. Files the
    /// owner puts here (a CA certificate for clients, say) go with it.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The data directory (`data` in the temporary directory).
    pub fn data_dir(&self) -> PathBuf {
        self.root().join("data")
    }

    /// Stops the server (fast shutdown) and removes the directory. Idempotent.
    pub(crate) fn stop(&mut self) -> Result<(), DemoError> {
        // Whatever pg_ctl said, the watchdog is gone now; removing the directory is what counts.
        let _ = self.stop_server(Shutdown::Fast);
        if let Some(dir) = self.dir.take() {
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(|e| DemoError::Io(format!("removing {}", dir.display()), e))?;
            }
        }
        Ok(())
    }

    /// Stops the server and keeps the directory, so that [`spawn_server`](Self::spawn_server)
    /// can start it again on the same data and port. Blocking. An error carries what
    /// `pg_ctl stop` said; the watchdog is stopped in any case.
    pub fn stop_server(&self, how: Shutdown) -> Result<(), DemoError> {
        let mut result = Ok(());
        if self.data_dir().join("postmaster.pid").exists() {
            let mut pg_ctl = self.command(&self.bin.join("pg_ctl"));
            pg_ctl
                .arg("stop")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", how.mode(), "-w", "-t", "60"]);
            result = match run_bounded(&mut pg_ctl, None) {
                Ok(out) if out.status.success() => Ok(()),
                Ok(out) => Err(DemoError::PostgresStop(format!(
                    "pg_ctl stop -m {}: {}{}",
                    how.mode(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ))),
                Err(e) => Err(e),
            };
        }
        // The watchdog exits once the postmaster has; never leave it behind.
        let mut server = self.server();
        if let Some(mut watchdog) = server.take() {
            let deadline = Instant::now() + WATCHDOG_EXIT_TIMEOUT;
            while matches!(watchdog.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(watchdog.try_wait(), Ok(None)) {
                let _ = watchdog.kill();
            }
            let _ = watchdog.wait();
        }
        result
    }

    /// Starts the stopped server (same data directory, same port) under a new watchdog, without
    /// waiting for it: see [`readiness`](Self::readiness) and [`wait_ready`](Self::wait_ready).
    pub fn spawn_server(&self) -> Result<(), DemoError> {
        let mut server = self.server();
        if let Some(old) = server.as_mut() {
            if matches!(old.try_wait(), Ok(None)) {
                return Err(DemoError::PostgresStart("the server is already running".into()));
            }
        }
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", WATCHDOG]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", WATCHDOG]);
            c
        };
        // Its own process group: a Ctrl-C in the terminal signals the owner's foreground group,
        // and must reach the owner (the demo then stops everything in order), not the
        // postmaster (which would shut down under the relay's feet).
        cmd.process_group(0);
        cmd.arg("throwaway-postgres")
            .arg(std::process::id().to_string())
            .arg(self.root())
            .arg(self.data_dir())
            .arg(self.log_path())
            .arg(&self.bin)
            .current_dir(self.root())
            // Not the owner's stdout/stderr: `cargo test` waits for those pipes to close.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        *server = Some(cmd.spawn().map_err(|e| DemoError::Io("starting postgres".into(), e))?);
        Ok(())
    }

    /// Where the server is, without waiting. Ready means: the server this value spawned is
    /// running, and its `postmaster.pid` (whose postmaster is alive) says `ready` (or, for a hot
    /// standby, `standby`) for our port.
    pub fn readiness(&self) -> Readiness {
        let running = self
            .server()
            .as_mut()
            .is_some_and(|watchdog| matches!(watchdog.try_wait(), Ok(None)));
        if !running {
            return Readiness::Exited;
        }
        // postmaster.pid: pid, data directory, start time, port, socket directory, listen
        // address, shared memory key, status (what `pg_ctl start -w` waits on).
        let text = fs::read_to_string(self.data_dir().join("postmaster.pid")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let ours = lines.get(3).is_some_and(|port| *port == self.port.to_string())
            && lines.first().is_some_and(|pid| Path::new("/proc").join(pid).is_dir());
        // A hot standby says `standby` once it accepts (read-only) connections.
        if ours && matches!(lines.get(7), Some(&"ready") | Some(&"standby")) {
            Readiness::Ready
        } else {
            Readiness::Starting
        }
    }

    /// Blocks until the server is ready (true), or has exited or `timeout` passed (false).
    pub(crate) fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.readiness() {
                Readiness::Ready => return true,
                Readiness::Exited => return false,
                Readiness::Starting if Instant::now() >= deadline => return false,
                Readiness::Starting => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The last 2000 bytes of the server log.
    pub(crate) fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = log.len().saturating_sub(2000);
        let start = (start..log.len())
            .find(|i| log.is_char_boundary(*i))
            .unwrap_or(log.len());
        log[start..].to_owned()
    }

    fn root(&self) -> &Path {
        self.dir.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    fn server(&self) -> MutexGuard<'_, Option<Child>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn init(&self, options: &Options) -> Result<(), DemoError> {
        if self.as_postgres {
            self.chown()?;
        }
        let mut initdb = self.command(&self.bin.join("initdb"));
        initdb.arg("-D").arg(self.data_dir()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let out = run_bounded(&mut initdb, None)?;
        if !out.status.success() {
            return Err(DemoError::PostgresStart(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // A throwaway cluster: durability of its own data does not matter (fsync off), the
        // relay's correctness does not depend on it either way.
        self.append_conf(&format!(
            "\n# outbox-relay throwaway cluster\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\nfsync = off\n\
             logging_collector = off\n",
            self.root().display()
        ))?;
        if let Some((cert, key)) = &options.tls {
            write_file(&self.data_dir().join("server.crt"), cert, 0o644)?;
            write_file(&self.data_dir().join("server.key"), key, 0o600)?;
            self.append_conf("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")?;
        }
        if let Some(hba) = &options.hba {
            write_file(&self.data_dir().join("pg_hba.conf"), hba, 0o600)?;
        }
        self.append_conf(&options.settings)?;
        if self.as_postgres {
            self.chown()?;
        }
        self.create_roles(&options.roles)
    }

    /// Creates the roles in single-user mode (the server is not running yet); any error ends
    /// the session with a failure (`exit_on_error`).
    fn create_roles(&self, roles: &[(String, String)]) -> Result<(), DemoError> {
        if roles.is_empty() {
            return Ok(());
        }
        let mut sql = String::from("SET password_encryption = 'scram-sha-256';\n");
        for (name, password) in roles {
            sql.push_str(&format!(
                "CREATE ROLE \"{}\" LOGIN SUPERUSER REPLICATION PASSWORD '{}';\n",
                name.replace('"', "\"\""),
                password.replace('\'', "''")
            ));
        }
        let mut single = self.command(&self.bin.join("postgres"));
        single
            .args(["--single", "-D"])
            .arg(self.data_dir())
            .args(["-c", "exit_on_error=on", "postgres"]);
        let out = run_bounded(&mut single, Some(&sql))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(DemoError::PostgresStart(format!(
                "creating roles in single-user mode failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    fn append_conf(&self, text: &str) -> Result<(), DemoError> {
        if text.is_empty() {
            return Ok(());
        }
        let path = self.data_dir().join("postgresql.conf");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| DemoError::Io(format!("opening {}", path.display()), e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| DemoError::Io(format!("writing {}", path.display()), e))
    }

    fn command(&self, program: &Path) -> Command {
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        // The caller's directory may be unreadable for the postgres user.
        c.current_dir(self.root());
        // Out of the terminal's foreground group, like the server (see `spawn_server`).
        c.process_group(0);
        c
    }

    fn chown(&self) -> Result<(), DemoError> {
        let mut chown = Command::new("chown");
        chown.args(["-R", "postgres:postgres"]).arg(self.root());
        let status = run_bounded(&mut chown, None)?.status;
        if status.success() {
            Ok(())
        } else {
            Err(DemoError::PostgresStart(format!(
                "running as root, but cannot hand {} to the postgres OS user (chown failed); create that user or run \
                 as an ordinary user",
                self.root().display()
            )))
        }
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
/// Where the PostgreSQL server binaries are: `--pg-bin`, else `pg_config --bindir`, else the
/// newest `/usr/lib/postgresql/<version>/bin` (Debian/Ubuntu), else the directory of `initdb` on
/// the PATH.
pub(crate) fn find_bin_dir(explicit: Option<&Path>) -> Result<PathBuf, DemoError> {
    if let Some(dir) = explicit {
        return Ok(dir.to_owned());
    }
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").stderr(Stdio::null()).output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    Err(DemoError::NoPostgres(
        "no initdb and postgres found (pg_config, /usr/lib/postgresql/*/bin, PATH)".into(),
    ))
}

fn free_port() -> Result<u16, DemoError> {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| DemoError::Io("finding a free port".into(), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| DemoError::Io("finding a free port".into(), e))?
            .port();
        // Leave a PostgreSQL that may run on the default port alone.
        if port != 5432 {
            return Ok(port);
        }
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), DemoError> {
    let io = |e| DemoError::Io(format!("writing {}", path.display()), e);
    fs::write(path, text).map_err(io)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io)
}

/// Runs `cmd` to completion with `input` on its stdin, killing it after [`COMMAND_TIMEOUT`].
fn run_bounded(cmd: &mut Command, input: Option<&str>) -> Result<Output, DemoError> {
    let what = format!("{cmd:?}");
    let io = |e| DemoError::Io(format!("running {what}"), e);
    let mut child = cmd
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io)?;
    // Feed and drain the pipes on threads, so a chatty command cannot block on a full pipe.
    let stdin = child.stdin.take();
    let input = input.unwrap_or_default().to_owned();
    let writer = std::thread::spawn(move || {
        if let Some(mut stdin) = stdin {
            let _ = stdin.write_all(input.as_bytes());
        }
    });
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait().map_err(io)? {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                // The pipe threads may wait on a grandchild that holds the pipes: leave them.
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("did not finish within {COMMAND_TIMEOUT:?}"),
                )));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let _ = writer.join();
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}
