//! The relay's exact commit-to-ack window, read over HTTP by both benchmarks (`#[path]`-included:
//! bench targets share no crate of their own).

use std::io::{Read, Write};
use std::time::Duration;

use outbox_relay::ops::latency::LatencySummary;

/// `GET /latency` of the relay listening on `port` (HdrHistogram; see
/// `outbox_relay::ops::latency`); `reset` closes the window and opens a new one. `None` when the
/// endpoint does not answer.
pub fn latency_window(port: u16, reset: bool) -> Option<LatencySummary> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let path = if reset { "/latency?reset=true" } else { "/latency" };
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    serde_json::from_str(body.trim()).ok()
}
