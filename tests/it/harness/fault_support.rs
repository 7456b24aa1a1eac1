//! Fault-injection helpers shared by the failure and stream-shape suites (`failures.rs`,
//! `stream_shapes.rs`): commit LSNs from the WAL (pg_walinspect), "never confirmed past"
//! checks, logical messages, metrics and RSS probes, and the long-test switch.
//!
//! Invariant, like the rest of the harness: every wait here is bounded (a timeout or a
//! window), so a relay that misbehaves fails the test instead of hanging it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::{Client, GenericClient, Transaction};

use super::*;

/// The kill -9 loop of the crash suites: `w` runs against `db_url` while, `kills` times, a relay
/// is started (`start`), left `min_ms` plus up to `spread_ms` more, and SIGKILLed (the test fails
/// with its log if it was already gone); returns what the workload committed.
pub async fn sigkills_under_load(
    db_url: &str,
    w: Workload,
    kills: usize,
    (min_ms, spread_ms): (u64, u64),
    start: impl Fn() -> RelayProcess,
) -> Committed {
    let url = db_url.to_owned();
    let load = tokio::spawn(async move { run_workload(&url, &w).await });
    for _ in 0..kills {
        let relay = start();
        tokio::time::sleep(Duration::from_millis(min_ms + random_below(spread_ms))).await;
        assert!(relay.sigkill(), "{}", relay.log_text());
    }
    load.await.expect("workload")
}

/// Long variants (≥ 50 crashes, …) run only with `OUTBOX_RELAY_LONG_TESTS=1`.
pub fn long_tests() -> bool {
    std::env::var("OUTBOX_RELAY_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// A random number in `0..n` (uuid v4 is the randomness the harness already has).
pub fn random_below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(n.max(1))) as u64
}

/// Start and end LSN of the commit record of `xid` (pg_walinspect), searched in `from..to`.
/// The start is what the relay calls the transaction's commit LSN; the end is what it confirms.
/// `to` is capped at the flushed WAL: pg_walinspect refuses an end past it ("cannot accept
/// future end LSN"), and `pg_current_wal_lsn()` (the write position) can be ahead of it for a
/// moment while other sessions write; the commit record itself is flushed once it committed.
pub async fn commit_lsns(client: &Client, xid: i64, from: u64, to: u64) -> (u64, u64) {
    let row = client
        .query_one(
            "SELECT start_lsn::text, end_lsn::text
               FROM pg_get_wal_records_info($1::text::pg_lsn, LEAST($2::text::pg_lsn, pg_current_wal_flush_lsn()))
              WHERE resource_manager = 'Transaction' AND record_type IN ('COMMIT', 'COMMIT_PREPARED')
                AND xid::text = $3",
            &[&format_lsn(from), &format_lsn(to), &(xid as u32).to_string()],
        )
        .await
        .expect("find the commit record (is pg_walinspect installed in this database?)");
    (parse_lsn(row.get(0)).expect("lsn"), parse_lsn(row.get(1)).expect("lsn"))
}

/// One committed transaction: its commit LSN (start of the commit record) and end LSN.
#[derive(Debug, Clone, Copy)]
pub struct CommitPoint {
    pub commit_lsn: u64,
    pub end_lsn: u64,
}

/// Finds a transaction's [`CommitPoint`]: `start` inside the transaction, `finish` after commit.
pub struct TxnProbe {
    before: u64,
    xid: i64,
}

impl TxnProbe {
    pub async fn start(tx: &Transaction<'_>) -> TxnProbe {
        let row = tx
            .query_one("SELECT pg_current_wal_lsn()::text, txid_current()", &[])
            .await
            .expect("probe");
        TxnProbe {
            before: parse_lsn(row.get(0)).expect("lsn"),
            xid: row.get(1),
        }
    }

    pub async fn finish(self, client: &Client) -> CommitPoint {
        let after = current_wal_lsn(client).await;
        let (commit_lsn, end_lsn) = commit_lsns(client, self.xid, self.before, after).await;
        CommitPoint { commit_lsn, end_lsn }
    }
}

/// Waits until the slot's confirmed position reaches `lsn`; false on timeout.
pub async fn confirmed_reaches(client: &Client, slot: &str, lsn: u64, timeout: Duration) -> bool {
    wait_until(timeout, Duration::from_millis(100), || async move {
        confirmed_flush_lsn(client, slot).await.unwrap_or(0) >= lsn
    })
    .await
}

/// Asserts, for `window`, that the slot's confirmed position stays before `end_lsn` — the end
/// of a transaction whose events Kafka cannot have acknowledged during that window.
pub async fn assert_never_confirmed_past(client: &Client, slot: &str, end_lsn: u64, window: Duration, what: &str) {
    let deadline = tokio::time::Instant::now() + window;
    let mut polls = 0;
    while tokio::time::Instant::now() < deadline {
        let confirmed = confirmed_flush_lsn(client, slot).await.unwrap_or(0);
        assert!(
            confirmed < end_lsn,
            "{what}: confirmed_flush_lsn {} passed {} (the end of a transaction Kafka had not acknowledged)",
            format_lsn(confirmed),
            format_lsn(end_lsn)
        );
        polls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(polls > 3, "{what}: too few polls of confirmed_flush_lsn");
}

/// `GET path` over HTTP/1.0 (the relay's metrics endpoint); the response body.
pub async fn http_get(addr: &str, path: &str) -> String {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The value of the Prometheus sample `name{…}` whose labels include all of `labels`.
pub fn metric_value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    exposition.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let rest = series.strip_prefix(name)?;
        if !(rest.is_empty() || rest.starts_with('{')) {
            return None;
        }
        labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// Peak resident set size of a process (`VmHWM`, kB), while it runs.
pub fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `pg_logical_emit_message(transactional, prefix, content)` on `client`.
pub async fn emit_message(client: &impl GenericClient, transactional: bool, prefix: &str, content: &str) {
    client
        .execute(
            "SELECT pg_logical_emit_message($1, $2, $3::text)",
            &[&transactional, &prefix, &content],
        )
        .await
        .expect("pg_logical_emit_message");
}

/// The `id` header of a record as text.
pub fn id_of(r: &Received) -> String {
    String::from_utf8_lossy(r.header("id").expect("every record has an id header")).into_owned()
}

/// Installs pg_walinspect (for [`commit_lsns`]) in the database `client` is connected to.
pub async fn install_walinspect(client: &Client) {
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .await
        .expect("pg_walinspect");
}
