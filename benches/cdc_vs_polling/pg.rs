//! The benchmark's own throwaway PostgreSQL 15 cluster.
//!
//! Settings are production-like where they matter for the comparison: autovacuum on (polling's
//! dead row versions are cleaned up, and that work is counted), `synchronous_commit` on, and
//! `pg_stat_statements` preloaded to count the statements each relay runs. One exception:
//! `fsync = off`, because this class of VM disk takes milliseconds per `fdatasync` (3.3 ms
//! measured with `pg_test_fsync`), which would make WAL flushes — not the relays — the subject of
//! the measurement (the walsender only sends flushed WAL, and every polling batch commits). WAL is
//! still written and read exactly as with `fsync = on`. As in the test
//! harness, the postmaster runs under a `sh` watchdog that stops it and deletes the cluster
//! directory when the benchmark process disappears, and as the `postgres` user when root.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tempfile::TempDir;
use tokio_postgres::{Client, NoTls};

pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The role the relays (and pg_recvlogical) connect as; statements are counted per role.
pub const RELAY_ROLE: &str = "bench_relay";

const SETTINGS: &str = "
listen_addresses = '127.0.0.1'
wal_level = logical
fsync = off
max_replication_slots = 16
max_wal_senders = 16
max_connections = 100
shared_buffers = '256MB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track_utility = on
pg_stat_statements.max = 1000
jit = off
logging_collector = off
log_min_messages = warning
";

const WATCHDOG: &str = r#"P=$1; ROOT=$2; DATA=$3; LOG=$4; BIN=$5
"$BIN/postgres" -D "$DATA" >>"$LOG" 2>&1 &
PG=$!
( while [ -d /proc/$P ]; do sleep 0.5; done
  kill -QUIT $PG 2>/dev/null ) &
W=$!
wait $PG
if [ -d /proc/$P ]; then kill $W 2>/dev/null; else rm -rf "$ROOT"; fi
exit 0"#;

pub struct BenchPg {
    dir: TempDir,
    port: u16,
    as_postgres: bool,
    server: Option<Child>,
}

impl BenchPg {
    /// initdb, configure, start, create the relay role and `pg_stat_statements`. Blocking.
    pub fn start() -> Result<BenchPg> {
        if !Path::new(PG_BIN).join("postgres").exists() {
            bail!("PostgreSQL 15 server binaries not found in {PG_BIN}; install postgresql-15");
        }
        let dir = tempfile::Builder::new().prefix("outbox-relay-bench-pg-").tempdir()?;
        let as_postgres = running_as_root();
        let port = free_port();
        let mut pg = BenchPg {
            dir,
            port,
            as_postgres,
            server: None,
        };
        if as_postgres {
            pg.chown()?;
        }
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data_dir())
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            ])
            .output()?;
        check(&out, "initdb")?;
        let conf = format!(
            "{SETTINGS}port = {port}\nunix_socket_directories = '{}'\n",
            pg.dir.path().display()
        );
        let conf_path = pg.data_dir().join("postgresql.conf");
        let mut text = fs::read_to_string(&conf_path)?;
        text.push_str(&conf);
        fs::write(&conf_path, text)?;
        if as_postgres {
            pg.chown()?;
        }
        pg.spawn()?;
        Ok(pg)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, user: &str, db: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port)
    }

    /// A client tool (pg_recvlogical, …) by absolute path.
    pub fn tool(name: &str) -> PathBuf {
        Path::new(PG_BIN).join(name)
    }

    /// The postmaster's pid, from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> Result<u32> {
        let text = fs::read_to_string(self.data_dir().join("postmaster.pid")).context("reading postmaster.pid")?;
        Ok(text.lines().next().unwrap_or_default().trim().parse()?)
    }

    fn command(&self, program: &str) -> Command {
        let bin = Path::new(PG_BIN).join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        }
    }

    fn chown(&self) -> Result<()> {
        let out = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(self.dir.path())
            .output()?;
        check(&out, "chown")
    }

    fn spawn(&mut self) -> Result<()> {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", WATCHDOG]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", WATCHDOG]);
            c
        };
        cmd.arg("bench-pg-watchdog")
            .arg(std::process::id().to_string())
            .arg(self.dir.path())
            .arg(self.data_dir())
            .arg(self.log_path())
            .arg(PG_BIN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.server = Some(cmd.spawn().context("starting postgres")?);
        Ok(())
    }

    /// Waits until the server takes connections, then creates the relay role and the
    /// statement-statistics extension.
    pub async fn ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = loop {
            match connect(&self.url("postgres", "postgres")).await {
                Ok(c) => break c,
                Err(e) if Instant::now() >= deadline => {
                    let log = fs::read_to_string(self.log_path()).unwrap_or_default();
                    bail!("postgres did not start: {e}\n{log}");
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        client
            .batch_execute(&format!(
                "CREATE ROLE {RELAY_ROLE} LOGIN SUPERUSER REPLICATION; CREATE EXTENSION pg_stat_statements"
            ))
            .await?;
        Ok(())
    }

    pub fn stop(&mut self) {
        if self.data_dir().join("postmaster.pid").exists() {
            let _ = self
                .command("pg_ctl")
                .arg("stop")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", "fast", "-w", "-t", "60"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut c) = self.server.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for BenchPg {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Drops `db` (and its replication slots, which would block that) if it exists, then creates it.
pub async fn recreate_database(admin: &Client, db: &str) -> Result<()> {
    drop_database(admin, db).await?;
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await?;
    Ok(())
}

/// Drops `db` with its replication slots. `DROP DATABASE` refuses to run in a transaction, so
/// every statement goes alone.
pub async fn drop_database(admin: &Client, db: &str) -> Result<()> {
    admin
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1",
            &[&db],
        )
        .await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await?;
    Ok(())
}

pub async fn connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio::time::timeout(Duration::from_secs(15), tokio_postgres::connect(url, NoTls))
        .await
        .with_context(|| format!("connecting to {url} timed out"))??;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

fn check(out: &Output, what: &str) -> Result<()> {
    if !out.status.success() {
        bail!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A free TCP port on 127.0.0.1 (never the system server's 5432).
pub fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port());
        if let Ok(p) = port {
            if p != 5432 {
                return p;
            }
        }
    }
}
