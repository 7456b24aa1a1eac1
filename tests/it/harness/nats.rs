//! NATS JetStream for the NATS sink's tests: the shared server ([`SHARED_NATS`], 127.0.0.1:4222
//! with JetStream, started by CI), a server of a test's own ([`NatsServer`], which a test may
//! stop and restart; never stop the shared one), streams unique to a test ([`NatsStream`]) and
//! reading a stream back as [`Received`] records (subject → `topic`, stream sequence →
//! `offset`, the `key` header → `key`, the `timestamp` header → `timestamp_ms`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;

use super::consumer::Received;
use super::process::{wait_child, Watchdog};
use super::util::{free_port, unique_name};

pub const SHARED_NATS: &str = "nats://127.0.0.1:4222";

/// A stream of a test's own: name `IT_…`, subjects `<prefix>.>`.
pub struct NatsStream {
    pub url: String,
    pub name: String,
    /// Every subject of the stream starts with `<prefix>.`.
    pub prefix: String,
}

async fn js(url: &str) -> jetstream::Context {
    let client = tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url))
        .await
        .unwrap_or_else(|_| panic!("connect {url} timed out"))
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    jetstream::new(client)
}

impl NatsStream {
    /// Creates a fresh stream on the server at `url`.
    pub async fn create(url: &str) -> NatsStream {
        let prefix = unique_name("it");
        let name = unique_name("IT").to_uppercase();
        tokio::time::timeout(
            Duration::from_secs(20),
            js(url).await.create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            }),
        )
        .await
        .expect("create stream in time")
        .expect("create stream");
        NatsStream {
            url: url.to_owned(),
            name,
            prefix,
        }
    }

    /// The `[nats]` keys for [`super::RelayConfig::sink`].
    pub fn section(&self) -> Vec<(&str, &str)> {
        vec![("url", self.url.as_str()), ("stream", self.name.as_str())]
    }

    /// How many messages the stream holds.
    pub async fn messages(&self) -> u64 {
        let mut stream = js(&self.url).await.get_stream(&self.name).await.expect("stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Waits (at most `timeout`) until the stream holds at least `n` messages, then reads them
    /// all, in stream order. Panics when they do not arrive in time.
    pub async fn collect(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let have = self.messages().await;
            if have as usize >= n {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "stream {} holds {have} of {n} messages after {timeout:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.read_all().await
    }

    /// Every message the stream holds, in stream order.
    pub async fn read_all(&self) -> Vec<Received> {
        let mut stream = js(&self.url).await.get_stream(&self.name).await.expect("stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut out = Vec::with_capacity(state.messages as usize);
        for seq in state.first_sequence..=state.last_sequence {
            let m = match stream.get_raw_message(seq).await {
                Ok(m) => m,
                Err(_) => continue, // deleted
            };
            let mut headers = Vec::new();
            for (name, values) in m.headers.iter() {
                for v in values {
                    headers.push((name.to_string(), v.as_str().as_bytes().to_vec()));
                }
            }
            // `id` first, as the Kafka consumer returns it (HeaderMap keeps no order by name).
            headers.sort_by_key(|(n, _)| n != "id");
            let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
            out.push(Received {
                topic: m.subject.to_string(),
                partition: 0,
                offset: m.sequence as i64,
                key: get("key"),
                payload: Some(m.payload.to_vec()),
                timestamp_ms: get("timestamp").and_then(|t| String::from_utf8(t).ok()?.parse().ok()),
                headers,
            });
        }
        out
    }

    pub async fn delete(&self) {
        let _ = js(&self.url).await.delete_stream(&self.name).await;
    }
}

/// A `nats-server -js` of a test's own on a free port, storing in a temporary directory that
/// outlives restarts.
pub struct NatsServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<(Child, Watchdog)>,
}

impl NatsServer {
    pub async fn start() -> NatsServer {
        let mut s = NatsServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
        };
        s.restart().await;
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Starts the server (again, on the same port and store) and waits until it listens.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server on PATH");
        let watchdog = Watchdog::guard(child.id());
        self.child = Some((child, watchdog));
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen on {}", self.port);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|(c, _)| c.id())
    }

    /// Waits (bounded) for a server that was sent a signal to exit; SIGKILLs it after `timeout`.
    pub async fn wait_stopped(&mut self, timeout: Duration) {
        if let Some((mut child, _watchdog)) = self.child.take() {
            if wait_child(&mut child, timeout).await.is_none() {
                let _ = child.kill();
                let _ = wait_child(&mut child, Duration::from_secs(10)).await;
            }
        }
    }

    /// SIGKILLs the server.
    pub async fn kill(&mut self) {
        if let Some((mut child, _watchdog)) = self.child.take() {
            let _ = child.kill();
            let _ = wait_child(&mut child, Duration::from_secs(10)).await;
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
