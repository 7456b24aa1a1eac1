//! The benchmark's own throwaway PostgreSQL 15 cluster: the demo's
//! ([`outbox_relay::demo::postgres::ThrowawayPostgres`]: initdb into a temporary directory, a
//! free loopback port, run as the `postgres` user when root, a watchdog that stops the server and
//! deletes the directory if the benchmark dies) with the benchmark's settings on top.
//!
//! Settings are production-like where they matter for the comparison: autovacuum on (polling's
//! dead row versions are cleaned up, and that work is counted), `synchronous_commit` on, and
//! `pg_stat_statements` preloaded to count the statements each relay runs. One exception:
//! `fsync = off`, because this class of VM disk takes milliseconds per `fdatasync` (3.3 ms
//! measured with `pg_test_fsync`), which would make WAL flushes — not the relays — the subject of
//! the measurement (the walsender only sends flushed WAL, and every polling batch commits). WAL is
//! still written and read exactly as with `fsync = on`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use outbox_relay::demo::postgres::ThrowawayPostgres;
use tokio_postgres::{Client, NoTls};

pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The role the relays (and pg_recvlogical) connect as; statements are counted per role.
pub const RELAY_ROLE: &str = "bench_relay";

const SETTINGS: &str = "
# outbox-relay benchmark
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
log_min_messages = warning
";

pub struct BenchPg {
    cluster: ThrowawayPostgres,
}

impl BenchPg {
    /// initdb, configure, start (stopped and deleted on drop). Blocking.
    pub fn start() -> Result<BenchPg> {
        if !Path::new(PG_BIN).join("postgres").exists() {
            bail!("PostgreSQL 15 server binaries not found in {PG_BIN}; install postgresql-15");
        }
        let cluster = ThrowawayPostgres::start_with(Path::new(PG_BIN), SETTINGS, "outbox-relay-bench-pg-")
            .context("starting the benchmark's PostgreSQL")?;
        Ok(BenchPg { cluster })
    }

    pub fn log_path(&self) -> PathBuf {
        self.cluster.log_path()
    }

    pub fn port(&self) -> u16 {
        self.cluster.port()
    }

    pub fn url(&self, user: &str, db: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port())
    }

    /// A client tool (pg_recvlogical, …) by absolute path.
    pub fn tool(name: &str) -> PathBuf {
        Path::new(PG_BIN).join(name)
    }

    /// The postmaster's pid, from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> Result<u32> {
        self.cluster
            .postmaster_pid()
            .context("reading the postmaster's pid from postmaster.pid")
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
