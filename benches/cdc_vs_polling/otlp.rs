//! A tiny OTLP/HTTP trace receiver for the tracing rows: a std `TcpListener` on loopback whose
//! connection threads read HTTP/1.1 requests (headers, then a `Content-Length` body; keep-alive
//! connections carry many), count requests, body bytes and the spans inside
//! (`ExportTraceServiceRequest` walked at the protobuf wire level: resource_spans(1) →
//! scope_spans(2) → spans(2)) and answer `200 OK`, `application/x-protobuf`, empty body — an
//! empty `ExportTraceServiceResponse`, i.e. everything accepted.
//!
//! Invariant: answers at once and never refuses, so the relay's exporter never waits on the
//! receiver and its cost is the relay's alone. A request it cannot read (no `Content-Length`, a
//! compressed or malformed body) is answered all the same and counted in `unreadable`, so a span
//! count that is off shows up in the report instead of passing as a low number.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the receiver got so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OtlpCounts {
    pub requests: u64,
    pub bytes: u64,
    pub spans: u64,
    /// Requests whose spans could not be counted (see the module docs).
    pub unreadable: u64,
}

#[derive(Default)]
struct Shared {
    requests: AtomicU64,
    bytes: AtomicU64,
    spans: AtomicU64,
    unreadable: AtomicU64,
    stop: AtomicBool,
}

pub struct OtlpReceiver {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// A keep-alive connection the exporter left open is dropped after this long without a request
/// (the thread ends; the exporter reconnects if it has more).
const IDLE_CONNECTION: Duration = Duration::from_secs(30);

impl OtlpReceiver {
    pub fn start() -> std::io::Result<OtlpReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accepting.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = Arc::clone(&accepting);
                    let _ = std::thread::Builder::new()
                        .name("otlp-connection".into())
                        .spawn(move || serve(stream, &shared));
                }
            })?;
        Ok(OtlpReceiver {
            port,
            shared,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:<port>`: the `[tracing] otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn counts(&self) -> OtlpCounts {
        OtlpCounts {
            requests: self.shared.requests.load(Ordering::SeqCst),
            bytes: self.shared.bytes.load(Ordering::SeqCst),
            spans: self.shared.spans.load(Ordering::SeqCst),
            unreadable: self.shared.unreadable.load(Ordering::SeqCst),
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Requests on one connection until it closes, idles out or sends something that is not HTTP.
fn serve(stream: TcpStream, shared: &Shared) {
    if stream.set_read_timeout(Some(IDLE_CONNECTION)).is_err() {
        return;
    }
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match reader.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) if request_line.trim().is_empty() => continue,
            Ok(_) => {}
        }
        let mut length: Option<usize> = None;
        let mut plain = true;
        let mut close = false;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().ok(),
                "content-encoding" => plain = value.eq_ignore_ascii_case("identity"),
                "transfer-encoding" => plain = false,
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        shared.requests.fetch_add(1, Ordering::SeqCst);
        match length {
            Some(n) => {
                let mut body = vec![0u8; n];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                shared.bytes.fetch_add(n as u64, Ordering::SeqCst);
                match spans_in(&body).filter(|_| plain) {
                    Some(spans) => shared.spans.fetch_add(spans, Ordering::SeqCst),
                    None => shared.unreadable.fetch_add(1, Ordering::SeqCst),
                };
            }
            None => {
                // A chunked body cannot be skipped without reading it: count it and hang up.
                shared.unreadable.fetch_add(1, Ordering::SeqCst);
                close = true;
            }
        }
        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// The spans in an `ExportTraceServiceRequest`; `None` when it is not valid protobuf.
pub fn spans_in(request: &[u8]) -> Option<u64> {
    let mut spans = 0;
    for resource_spans in fields(request, 1)? {
        for scope_spans in fields(resource_spans, 2)? {
            spans += fields(scope_spans, 2)?.len() as u64;
        }
    }
    Some(spans)
}

/// The length-delimited values of field `number` in one protobuf message; every other field
/// is skipped by its wire type.
fn fields(mut message: &[u8], number: u64) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !message.is_empty() {
        let key = varint(&mut message)?;
        match key & 7 {
            0 => {
                varint(&mut message)?;
            }
            1 => message = message.get(8..)?,
            2 => {
                let len = usize::try_from(varint(&mut message)?).ok()?;
                let value = message.get(..len)?;
                message = &message[len..];
                if key >> 3 == number {
                    out.push(value);
                }
            }
            5 => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(out)
}

fn varint(input: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input.split_first()?;
        *input = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A length-delimited protobuf field (values under 128 bytes).
fn ld(number: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2, value.len() as u8];
    out.extend_from_slice(value);
    out
}

/// Checks the receiver before a run relies on its counts (the bench has no test harness): a
/// hand-made request of two resource_spans with 2 and 1 spans (beside a resource, a scope and a
/// fixed64 field), posted twice on one keep-alive connection, must be answered twice and counted
/// as 6 spans; a truncated message must not parse.
pub fn self_check() -> anyhow::Result<()> {
    use anyhow::{ensure, Context};
    let span = [ld(1, &[7; 16]), vec![(7 << 3) | 1, 1, 2, 3, 4, 5, 6, 7, 8]].concat();
    let scope_a = [ld(1, b"scope"), ld(2, &span), ld(2, &span)].concat();
    let body = [
        ld(1, &[ld(1, b"resource"), ld(2, &scope_a)].concat()),
        ld(1, &ld(2, &ld(2, &span))),
    ]
    .concat();
    ensure!(
        spans_in(&body) == Some(3),
        "the span counter miscounts: {:?}",
        spans_in(&body)
    );
    ensure!(
        spans_in(&[0x0a, 0x05, 1]).is_none(),
        "the span counter accepts a truncated message"
    );
    let receiver = OtlpReceiver::start().context("starting the OTLP receiver")?;
    let mut conn = TcpStream::connect(("127.0.0.1", receiver.port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    for _ in 0..2 {
        write!(
            conn,
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )?;
        conn.write_all(&body)?;
        let mut head = String::new();
        loop {
            let mut line = String::new();
            ensure!(reader.read_line(&mut line)? > 0, "the receiver hung up: {head:?}");
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        ensure!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.contains("Content-Length: 0"),
            "the receiver answered {head:?}"
        );
    }
    let expected = OtlpCounts {
        requests: 2,
        bytes: 2 * body.len() as u64,
        spans: 6,
        unreadable: 0,
    };
    ensure!(
        receiver.counts() == expected,
        "the receiver counted {:?}",
        receiver.counts()
    );
    Ok(())
}
