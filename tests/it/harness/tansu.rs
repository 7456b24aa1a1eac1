//! A standalone Kafka-compatible broker: tansu (https://crates.io/crates/tansu) with
//! in-memory storage, one process per test.
//!
//! Installed by `scripts/install-tansu.sh` (a ~11 minute `cargo install`). When the binary
//! is missing, [`Tansu::start`] prints a loud skip message and returns `None`.
//!
//! Observed with tansu 0.6.0:
//! * Topics are NOT auto-created: metadata answers UNKNOWN_TOPIC_OR_PART and a producer
//!   retries until `message.timeout.ms` (MessageTimedOut). Call [`Tansu::create_topic`]
//!   (CreateTopics admin API, which tansu implements, partition count honoured) first.
//! * Idempotent producers (`enable.idempotence=true`, `acks=all`) and lz4 compression
//!   work; keyed records spread over partitions as with Kafka.
//! * Startup to "ready" takes milliseconds; the binary (~60 MB) takes 11–50 minutes to
//!   build depending on machine load.

use std::fs::OpenOptions;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use tempfile::TempDir;

use super::process::{send_signal, Watchdog};
use super::util::free_port;

/// Env var naming the tansu binary explicitly (overrides PATH and ~/.cargo/bin).
pub const TANSU_BIN_ENV: &str = "TANSU_BIN";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Tansu {
    child: Mutex<Child>,
    pid: u32,
    _watchdog: Watchdog,
    port: u16,
    dir: TempDir,
}

impl Tansu {
    /// Where the tansu binary is, if installed.
    pub fn find_binary() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(TANSU_BIN_ENV) {
            let p = PathBuf::from(p);
            return p.is_file().then_some(p);
        }
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .map(|d| d.join("tansu"));
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
            .map(|d| d.join("bin").join("tansu"));
        on_path.chain(cargo_home).find(|p| p.is_file())
    }

    /// Starts a broker on a free 127.0.0.1 port and waits (bounded) until it answers a
    /// Metadata request. `None` after a loud message when tansu is not installed.
    pub async fn start() -> Option<Tansu> {
        let Some(bin) = Tansu::find_binary() else {
            eprintln!("\n!!!!! SKIPPING tansu test: tansu not installed; run scripts/install-tansu.sh !!!!!\n");
            return None;
        };
        for attempt in 0..3 {
            let t = Tansu::spawn(&bin);
            if t.wait_ready().await {
                return Some(t);
            }
            let log = t.log_text();
            if attempt < 2 && log.contains("in use") {
                continue; // port race: try another one
            }
            panic!("tansu did not become ready; log:\n{log}");
        }
        unreachable!()
    }

    fn spawn(bin: &Path) -> Tansu {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-tansu-")
            .tempdir()
            .expect("tempdir");
        let port = free_port();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("tansu.log"))
            .expect("tansu log");
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .arg("broker")
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .env("RUST_LOG", std::env::var("TANSU_LOG").unwrap_or("warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let watchdog = Watchdog::guard(child.id());
        Tansu {
            pid: child.id(),
            child: Mutex::new(child),
            _watchdog: watchdog,
            port,
            dir,
        }
    }

    async fn wait_ready(&self) -> bool {
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect(&addr).is_ok() {
                break;
            }
            if !self.running() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let bootstrap = self.bootstrap_servers();
        while Instant::now() < deadline {
            let b = bootstrap.clone();
            let ok = tokio::task::spawn_blocking(move || metadata_ok(&b))
                .await
                .unwrap_or(false);
            if ok {
                return true;
            }
            if !self.running() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    fn running(&self) -> bool {
        matches!(self.child.lock().unwrap().try_wait(), Ok(None))
    }

    pub fn bootstrap_servers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("tansu.log")
    }

    pub fn log_text(&self) -> String {
        std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Creates `topic` through the CreateTopics admin API (tansu does not auto-create).
    /// An already existing topic is fine.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let bootstrap = self.bootstrap_servers();
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("admin client");
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let res = tokio::time::timeout(Duration::from_secs(30), admin.create_topics([&new], &opts))
            .await
            .unwrap_or_else(|_| panic!("create_topics {topic} timed out"))
            .unwrap_or_else(|e| panic!("create_topics {topic}: {e}"));
        for r in res {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, e)) => panic!("create topic {t}: {e}"),
            }
        }
    }

    /// SIGSTOP/SIGCONT the broker, to simulate an unresponsive Kafka.
    pub fn pause(&self) -> bool {
        send_signal(self.pid, "STOP")
    }

    pub fn resume(&self) -> bool {
        send_signal(self.pid, "CONT")
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Blocking: does the broker answer a Metadata request?
fn metadata_ok(bootstrap: &str) -> bool {
    let consumer: Result<BaseConsumer, _> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create();
    consumer
        .map(|c| {
            c.fetch_metadata(None, Duration::from_secs(2))
                .map(|m| !m.brokers().is_empty())
                .unwrap_or(false)
        })
        .unwrap_or(false)
}
