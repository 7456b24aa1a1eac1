//! The Kafka side of the benchmark: librdkafka's in-process mock cluster (default), a tansu
//! broker (`--broker tansu`, when installed), or any external cluster (`--broker HOST:PORT`).
//!
//! The mock cluster lives in this process, so its CPU is never counted as the relay's. It acks
//! `acks=all` produce requests as soon as it appended them (replication is instant), which makes
//! it the cleanest way to see the relays' own latency; a real broker adds its own on top, equally
//! for both relays.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

type Job = Box<dyn FnOnce(&MockCluster<'static, DefaultProducerContext>) + Send>;

pub enum Broker {
    Mock {
        jobs: Option<mpsc::Sender<Job>>,
        thread: Option<JoinHandle<()>>,
        bootstrap: String,
    },
    Tansu {
        child: Child,
        bootstrap: String,
    },
    External {
        bootstrap: String,
    },
}

/// Brokers in the mock cluster; topics get replication factor 3, like a production cluster.
const MOCK_BROKERS: i32 = 3;

impl Broker {
    /// `mock`, `tansu`, or a bootstrap list.
    pub fn start(kind: &str) -> Result<Broker> {
        match kind {
            "mock" => Broker::mock(),
            "tansu" => Broker::tansu(),
            bootstrap => Ok(Broker::External {
                bootstrap: bootstrap.to_owned(),
            }),
        }
    }

    fn mock() -> Result<Broker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (boot_tx, boot_rx) = mpsc::channel();
        let thread = std::thread::Builder::new().name("mock-kafka".into()).spawn(move || {
            let cluster = match MockCluster::new(MOCK_BROKERS) {
                Ok(c) => c,
                Err(e) => {
                    let _ = boot_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = boot_tx.send(Ok(cluster.bootstrap_servers()));
            for job in rx {
                job(&cluster);
            }
        })?;
        let bootstrap = boot_rx
            .recv_timeout(Duration::from_secs(30))?
            .map_err(|e| anyhow!("mock cluster: {e}"))?;
        Ok(Broker::Mock {
            jobs: Some(tx),
            thread: Some(thread),
            bootstrap,
        })
    }

    fn tansu() -> Result<Broker> {
        let bin = find_tansu().context("tansu is not installed; run scripts/install-tansu.sh or use --broker mock")?;
        let port = super::pg::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(std::env::temp_dir().join("bench-tansu.log"))?;
        let child = Command::new(bin)
            .arg("broker")
            .args([
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() >= deadline {
                bail!("tansu did not listen on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Broker::Tansu {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
        })
    }

    /// librdkafka's mock cluster (Kafka's Java clients need `MockKafkaAgent` against it).
    pub fn is_mock(&self) -> bool {
        matches!(self, Broker::Mock { .. })
    }

    pub fn bootstrap(&self) -> &str {
        match self {
            Broker::Mock { bootstrap, .. } | Broker::Tansu { bootstrap, .. } | Broker::External { bootstrap } => {
                bootstrap
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Broker::Mock { .. } => {
                format!("librdkafka mock cluster ({MOCK_BROKERS} brokers, in the benchmark process)")
            }
            Broker::Tansu { .. } => "tansu (memory storage, one broker)".into(),
            Broker::External { bootstrap } => format!("external cluster at {bootstrap}"),
        }
    }

    /// Creates `topic` with `partitions` partitions (the mock has no CreateTopics API).
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        match self {
            Broker::Mock { jobs, .. } => {
                let (tx, rx) = mpsc::channel();
                let name = topic.to_owned();
                let job: Job = Box::new(move |c| {
                    let _ = tx.send(
                        c.create_topic(&name, partitions, MOCK_BROKERS.min(3))
                            .map_err(|e| e.to_string()),
                    );
                });
                jobs.as_ref()
                    .context("mock cluster stopped")?
                    .send(job)
                    .map_err(|_| anyhow!("mock thread gone"))?;
                rx.recv_timeout(Duration::from_secs(30))?
                    .map_err(|e| anyhow!("creating topic {topic}: {e}"))
            }
            Broker::Tansu { bootstrap, .. } | Broker::External { bootstrap } => {
                let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
                    .set("bootstrap.servers", bootstrap.as_str())
                    .create()?;
                let results = admin
                    .create_topics(
                        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
                    )
                    .await?;
                for r in results {
                    match r {
                        Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((t, code)) => bail!("creating topic {t}: {code}"),
                    }
                }
                Ok(())
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        match self {
            Broker::Mock { jobs, thread, .. } => {
                jobs.take();
                if let Some(t) = thread.take() {
                    let _ = t.join();
                }
            }
            Broker::Tansu { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Broker::External { .. } => {}
        }
    }
}

fn find_tansu() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let cargo = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    on_path.chain(cargo).map(|d| d.join("tansu")).find(|p| p.is_file())
}
