//! Small helpers shared by the harness modules: names, ports, bounded waiting.

use std::future::Future;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A name unique within this machine for the life of this test process:
/// `<prefix>_<pid>_<counter>`, lowercased, with anything outside `[a-z0-9_]` replaced by
/// `_`, so it is valid unquoted as a database, slot, publication or topic name.
///
/// The pid keeps concurrent test binaries (and a shared external server) apart; the
/// counter keeps tests within one binary apart.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let raw = format!("{prefix}_{}_{n}", std::process::id());
    let mut s: String = raw
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Identifiers must not start with a digit; Postgres truncates past 63 bytes.
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 't');
    }
    if s.len() > 63 {
        s = s[s.len() - 63..].to_string();
    }
    s
}

/// A TCP port on 127.0.0.1 that was free a moment ago. There is an unavoidable race with
/// other processes; callers that bind retry with a fresh port on failure.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        // The system Postgres owns 5432; the ephemeral range never yields it, but be sure.
        if port != 5432 {
            return port;
        }
    }
}

/// Polls `cond` every `poll` until it returns true or `timeout` elapses.
/// Returns whether the condition became true. The condition runs at least once.
pub async fn wait_until<F, Fut>(timeout: Duration, poll: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        // A condition that itself hangs (e.g. a query to a stopped server) must not
        // stretch the deadline.
        match tokio::time::timeout(remaining.max(Duration::from_millis(1)), cond()).await {
            Ok(true) => return true,
            Ok(false) => {}
            Err(_) => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(poll.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}
