//! Talking to the relay's HTTP endpoints (`[http] listen`): a minimal HTTP/1.1 GET over a
//! plain TCP socket, and a parser for the Prometheus text format good enough to assert on
//! counters, gauges and histogram series.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `config` with `[http] listen` on a free loopback port, and that address.
pub fn with_http(config: &super::RelayConfig) -> (super::RelayConfig, String) {
    let addr = format!("127.0.0.1:{}", super::free_port());
    (config.clone().set("http", "listen", addr.clone()), addr)
}

/// The relay's exact commit-to-ack window (`GET /latency`, with `?reset=true` when `reset`).
pub async fn latency_window(addr: &str, reset: bool) -> serde_json::Value {
    let path = if reset { "/latency?reset=true" } else { "/latency" };
    let (code, body) = http_get(addr, path).await.expect("/latency answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/latency is not JSON ({e}): {body}"))
}

/// `GET http://{addr}{path}` → (status code, body). `None` if nothing answered within 5 s.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_string()
        };
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One scrape: series (name plus sorted labels) → value, and the `# TYPE` lines.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub series: BTreeMap<String, f64>,
    pub types: BTreeMap<String, String>,
    pub text: String,
}

impl Metrics {
    /// Parses Prometheus text exposition format.
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics {
            text: text.to_string(),
            ..Metrics::default()
        };
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    m.types.insert(name.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or(f64::NAN),
            };
            m.series.insert(normalize(key), value);
        }
        m
    }

    /// Fetches and parses `http://{addr}/metrics`.
    pub async fn scrape(addr: &str) -> Option<Metrics> {
        match http_get(addr, "/metrics").await? {
            (200, body) => Some(Metrics::parse(&body)),
            _ => None,
        }
    }

    /// The value of `name{labels}` (labels in any order), if exported.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series.get(&series_key(name, labels)).copied()
    }

    /// Like [`get`](Self::get), 0 when the series is absent (counters not yet incremented).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Every `name{label=…}` series' label value and value, e.g. per topic.
    pub fn by_label(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let prefix = format!("{name}{{");
        let needle = format!("{label}=\"");
        self.series
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, v)| {
                let start = k.find(&needle)? + needle.len();
                let end = start + k[start..].find('"')?;
                Some((k[start..end].to_string(), *v))
            })
            .collect()
    }

    /// Sum over all series of `name` (any labels).
    pub fn sum(&self, name: &str) -> f64 {
        self.series
            .iter()
            .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| *v)
            .sum()
    }
}

fn series_key(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let mut sorted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    sorted.sort();
    format!("{name}{{{}}}", sorted.join(","))
}

/// `name{b="2",a="1"}` → `name{a="1",b="2"}` so lookups do not depend on label order.
fn normalize(key: &str) -> String {
    let Some((name, rest)) = key.split_once('{') else {
        return key.to_string();
    };
    let inner = rest.trim_end_matches('}');
    let mut labels: Vec<&str> = split_labels(inner);
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// Splits `a="x",b="y,z"` at the commas outside quotes.
fn split_labels(inner: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in inner.char_indices() {
        match c {
            '\\' if quoted && !escaped => escaped = true,
            '"' if !escaped => quoted = !quoted,
            ',' if !quoted => {
                out.push(&inner[start..i]);
                start = i + 1;
            }
            _ => escaped = false,
        }
        if c != '\\' {
            escaped = false;
        }
    }
    if start < inner.len() {
        out.push(&inner[start..]);
    }
    out
}
