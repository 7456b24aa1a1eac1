//! Redis for the Redis Streams sink's tests: the shared server CI starts on 127.0.0.1:6379
//! ([`SHARED_REDIS`], never stopped by a test), private `redis-server`s on free ports
//! ([`PrivateRedis`], for tests that stop or restart the broker), and reading a stream back
//! as [`Received`] records so the Kafka checks (`check_delivered`, `check_order`) apply.
//!
//! A stream entry maps to a record as the sink writes it (docs/sink-redis.md): `topic` = the
//! stream key, `offset` = the entry's index in the stream, `key` = field `key`, `payload` =
//! field `payload`, `timestamp_ms` = field `timestamp`, and every field (`id` first) as a header.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::consumer::Received;
use super::process::{send_signal, Watchdog};
use super::util::free_port;

pub const SHARED_REDIS: &str = "redis://127.0.0.1:6379";

pub async fn connect(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).expect("redis URL");
    // The client's default answer timeout (500 ms) is shorter than a loaded two-core machine
    // takes to XRANGE a 20,000-entry stream.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    tokio::time::timeout(
        Duration::from_secs(10),
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .expect("connect within 10 s")
    .unwrap_or_else(|e| panic!("Redis at {url} is not reachable: {e}"))
}

/// Every entry of `stream`, in stream order.
pub async fn read_stream(url: &str, stream: &str) -> Vec<Received> {
    let mut c = connect(url).await;
    // A private server just restarted answers LOADING until its data is back: wait for it
    // (bounded), as a consumer would.
    let deadline = Instant::now() + Duration::from_secs(60);
    let v: Value = loop {
        match redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
        {
            Ok(v) => break v,
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("XRANGE {stream} on {url}: {e}"),
        }
    };
    let Value::Array(entries) = v else { return Vec::new() };
    entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let Value::Array(mut parts) = e else {
                panic!("entry {e:?}")
            };
            let Value::Array(fields) = parts.remove(1) else {
                panic!("fields")
            };
            let headers: Vec<(String, Vec<u8>)> = fields
                .chunks(2)
                .map(|p| {
                    (
                        redis::from_redis_value_ref::<String>(&p[0]).unwrap(),
                        redis::from_redis_value_ref::<Vec<u8>>(&p[1]).unwrap(),
                    )
                })
                .collect();
            let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
            Received {
                topic: stream.to_owned(),
                partition: 0,
                offset: i as i64,
                key: get("key"),
                payload: get("payload"),
                timestamp_ms: get("timestamp").and_then(|t| String::from_utf8(t).ok()?.parse().ok()),
                headers,
            }
        })
        .collect()
}

/// Reads the `streams` until at least `want` entries are there in all (or `timeout`).
pub async fn read_streams_until(url: &str, streams: &[String], want: usize, timeout: Duration) -> Vec<Received> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut all = Vec::new();
        for s in streams {
            all.extend(read_stream(url, s).await);
        }
        if all.len() >= want || Instant::now() > deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes `keys` and their dedup sets.
pub async fn delete(url: &str, keys: &[String]) {
    let mut c = connect(url).await;
    for k in keys {
        let _: () = redis::cmd("DEL")
            .arg(k)
            .arg(format!("{k}:outbox-relay-dedup"))
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

/// A `redis-server` of the test's own on a free port, data in `dir`; killed on drop.
pub struct PrivateRedis {
    child: Option<Child>,
    _watchdog: Option<Watchdog>,
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl PrivateRedis {
    /// `extra`: server options, e.g. `["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start(extra: &[&str]) -> PrivateRedis {
        let mut r = PrivateRedis {
            child: None,
            _watchdog: None,
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            args: extra.iter().map(|s| s.to_string()).collect(),
        };
        r.launch();
        r
    }

    /// A server with TLS on [`PrivateRedis::tls_port`] (certificate for 127.0.0.1 signed by the
    /// CA in `ca_pem`, written to [`PrivateRedis::ca_path`]) and plain TCP on `port`.
    pub fn start_tls() -> (PrivateRedis, u16) {
        let tls = super::tls::generate_server_tls();
        let certs = tempfile::tempdir().unwrap();
        std::fs::write(certs.path().join("ca.pem"), &tls.ca_pem).unwrap();
        std::fs::write(certs.path().join("server.pem"), &tls.cert_pem).unwrap();
        std::fs::write(certs.path().join("server.key"), &tls.key_pem).unwrap();
        let tls_port = free_port();
        let path = |f: &str| certs.path().join(f).to_string_lossy().into_owned();
        let (cert, key, ca) = (path("server.pem"), path("server.key"), path("ca.pem"));
        let mut r = PrivateRedis {
            child: None,
            _watchdog: None,
            port: free_port(),
            dir: certs,
            args: vec![
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                cert,
                "--tls-key-file".into(),
                key,
                "--tls-ca-cert-file".into(),
                ca,
                "--tls-auth-clients".into(),
                "no".into(),
            ],
        };
        r.launch();
        (r, tls_port)
    }

    /// The CA of a [`PrivateRedis::start_tls`] server.
    pub fn ca_path(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self._watchdog = Some(Watchdog::guard(child.id()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server on {} did not start", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGTERM (a clean shutdown: the AOF is flushed) and waits for the exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self._watchdog = None;
    }

    /// Starts the server again on the same port, with the same data directory.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
