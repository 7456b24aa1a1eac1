//! A throwaway PostgreSQL cluster for the demo (and the benchmark, `benches/cdc_vs_polling`,
//! which adds its own settings through [`ThrowawayPostgres::start_with`]): `initdb` into a
//! temporary directory, one server on a free loopback port (never 5432) with
//! `wal_level = logical`, stopped and deleted again.
//!
//! Invariants:
//! * **Nothing outlives the demo.** [`ThrowawayPostgres::stop`] (also run on drop) stops the
//!   server with `pg_ctl stop -m fast` and removes the directory. And because a demo can die
//!   without running destructors (SIGKILL, a closed terminal), the postmaster is started by a
//!   small `sh` watchdog that notices when the demo process is gone and then shuts the server
//!   down (SIGQUIT) and deletes the directory itself.
//! * PostgreSQL refuses to run as root, so when the demo runs as root every server command goes
//!   through `runuser -u postgres --` and the directory is handed to that user.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::DemoError;

/// Runs the postmaster and watches the demo's pid; see the module docs.
const WATCHDOG: &str = r#"P=$1; ROOT=$2; DATA=$3; LOG=$4; BIN=$5
"$BIN/postgres" -D "$DATA" >>"$LOG" 2>&1 &
PG=$!
( while [ -d /proc/$P ]; do sleep 0.5; done
  kill -QUIT $PG 2>/dev/null ) &
W=$!
wait $PG
if [ -d /proc/$P ]; then kill $W 2>/dev/null; else rm -rf "$ROOT"; fi
exit 0"#;

pub struct ThrowawayPostgres {
    /// `None` once stopped and removed.
    dir: Option<PathBuf>,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    server: Option<Child>,
}

impl ThrowawayPostgres {
    /// initdb + start; blocking (run it on a blocking thread).
    pub fn start(bin: &Path) -> Result<ThrowawayPostgres, DemoError> {
        ThrowawayPostgres::start_with(bin, "", "outbox-relay-demo-")
    }

    /// Like [`start`](Self::start), with `settings` appended to `postgresql.conf` after the
    /// demo's own (later lines win) and the temporary directory named with `prefix`.
    pub fn start_with(bin: &Path, settings: &str, prefix: &str) -> Result<ThrowawayPostgres, DemoError> {
        for tool in ["initdb", "postgres", "pg_ctl"] {
            if !bin.join(tool).is_file() {
                return Err(DemoError::NoPostgres(format!("{} has no {tool}", bin.display())));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(|e| DemoError::Io("creating the temporary directory".into(), e))?
            .keep();
        let mut pg = ThrowawayPostgres {
            dir: Some(dir),
            bin: bin.to_owned(),
            port: 0,
            as_postgres: running_as_root(),
            server: None,
        };
        pg.init()?;
        pg.append_conf(settings)?;
        // Another process can take the free port between our check and the server's bind.
        for _ in 0..3 {
            pg.port = free_port()?;
            pg.append_conf(&format!("port = {}\n", pg.port))?;
            pg.spawn_server()?;
            if pg.wait_ready(Duration::from_secs(60)) {
                return Ok(pg);
            }
            pg.stop_server("immediate");
            if !pg.log_tail().contains("could not bind") {
                break;
            }
        }
        Err(DemoError::PostgresStart(pg.log_tail()))
    }

    /// The superuser URL (trust authentication on loopback) for `db`.
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

    /// The temporary directory (data directory and server log), while it exists.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Stops the server (fast shutdown) and removes the directory. Idempotent.
    pub fn stop(&mut self) -> Result<(), DemoError> {
        self.stop_server("fast");
        if let Some(dir) = self.dir.take() {
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(|e| DemoError::Io(format!("removing {}", dir.display()), e))?;
            }
        }
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.root().join("data")
    }

    fn root(&self) -> &Path {
        self.dir.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    fn init(&self) -> Result<(), DemoError> {
        if self.as_postgres {
            self.chown()?;
        }
        let out = self
            .command(&self.bin.join("initdb"))
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| DemoError::Io("running initdb".into(), e))?;
        if !out.status.success() {
            return Err(DemoError::PostgresStart(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // A throwaway cluster: durability of the demo's own data does not matter (fsync off),
        // the relay's correctness does not depend on it either way.
        self.append_conf(&format!(
            "\n# outbox-relay demo\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\nfsync = off\n\
             logging_collector = off\n",
            self.root().display()
        ))?;
        if self.as_postgres {
            self.chown()?;
        }
        Ok(())
    }

    fn append_conf(&self, text: &str) -> Result<(), DemoError> {
        use std::io::Write as _;
        let path = self.data_dir().join("postgresql.conf");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| DemoError::Io(format!("opening {}", path.display()), e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| DemoError::Io(format!("writing {}", path.display()), e))
    }

    fn spawn_server(&mut self) -> Result<(), DemoError> {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", WATCHDOG]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", WATCHDOG]);
            c
        };
        // Its own process group: a Ctrl-C in the terminal signals the demo's foreground group,
        // and must reach the demo (which then stops everything in order), not the postmaster
        // (which would shut down under the relay's feet).
        cmd.process_group(0);
        cmd.arg("demo-postgres")
            .arg(std::process::id().to_string())
            .arg(self.root())
            .arg(self.data_dir())
            .arg(self.log_path())
            .arg(&self.bin)
            .current_dir(self.root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.server = Some(cmd.spawn().map_err(|e| DemoError::Io("starting postgres".into(), e))?);
        Ok(())
    }

    /// Ready = accepting TCP connections on our port while our server is running.
    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.server.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None))) {
                return false;
            }
            let ready = self
                .command(&self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-d", "postgres"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            match ready {
                Ok(s) if s.success() => return true,
                // No pg_isready: fall back to the socket.
                Err(_) if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() => return true,
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn stop_server(&mut self, mode: &str) {
        let Some(mut server) = self.server.take() else { return };
        if self.data_dir().join("postmaster.pid").exists() {
            let _ = self
                .command(&self.bin.join("pg_ctl"))
                .arg("stop")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", mode, "-w", "-t", "60"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // The watchdog exits once the postmaster has; never leave it behind.
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(server.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(server.try_wait(), Ok(None)) {
            let _ = server.kill();
            let _ = server.wait();
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = log.len().saturating_sub(2000);
        let start = (start..log.len())
            .find(|i| log.is_char_boundary(*i))
            .unwrap_or(log.len());
        log[start..].to_owned()
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
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(self.root())
            .status()
            .map_err(|e| DemoError::Io("running chown".into(), e))?;
        if status.success() {
            Ok(())
        } else {
            Err(DemoError::PostgresStart(format!(
                "running as root, but cannot hand {} to the postgres OS user (chown failed); create that user or run \
                 the demo as an ordinary user",
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
pub fn find_bin_dir(explicit: Option<&Path>) -> Result<PathBuf, DemoError> {
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
