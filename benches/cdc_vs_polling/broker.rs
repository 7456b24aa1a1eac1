//! The Kafka side of the benchmark: librdkafka's in-process mock cluster (default), a real
//! Apache Kafka broker the benchmark starts (`--broker kafka`: one KRaft node from the jars
//! `scripts/install-kafka.sh` installs, data in a temp dir), a tansu broker (`--broker tansu`,
//! when installed), or any external cluster (`--broker HOST:PORT`).
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
    /// Apache Kafka: one combined broker+controller, its log and data in `dir`.
    Kafka {
        child: Child,
        bootstrap: String,
        _dir: tempfile::TempDir,
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
            "kafka" => Broker::kafka(),
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

    fn kafka() -> Result<Broker> {
        let home = kafka_home().context(
            "Apache Kafka is not installed; run scripts/install-kafka.sh (or set KAFKA_HOME) or use --broker mock",
        )?;
        let dir = tempfile::Builder::new().prefix("bench-kafka-").tempdir()?;
        let (port, controller) = (super::pg::free_port(), super::pg::free_port());
        let props = dir.path().join("server.properties");
        std::fs::write(
            &props,
            format!(
                "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:{controller}\n\
                 controller.listener.names=CONTROLLER\n\
                 listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
                 log.dirs={}\noffsets.topic.replication.factor=1\ntransaction.state.log.replication.factor=1\n\
                 transaction.state.log.min.isr=1\noffsets.topic.num.partitions=4\n\
                 group.initial.rebalance.delay.ms=0\nnum.partitions=4\n",
                dir.path().join("data").display()
            ),
        )?;
        let classpath = format!("{}/libs/*", home.display());
        let log4j = format!(
            "-Dlog4j2.configurationFile={}",
            home.join("log4j2.properties").display()
        );
        let id = Command::new("java")
            .args(["-cp", &classpath, "kafka.tools.StorageTool", "random-uuid"])
            .output()?;
        let id = String::from_utf8_lossy(&id.stdout).trim().to_owned();
        let format = Command::new("java")
            .args([
                &log4j,
                "-cp",
                &classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                &id,
                "-c",
            ])
            .arg(&props)
            .output()?;
        if !format.status.success() {
            bail!(
                "formatting the Kafka storage: {}",
                String::from_utf8_lossy(&format.stderr)
            );
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("kafka.log"))?;
        // A production-like heap; the broker's CPU is measured as the broker's, not the relay's.
        let child = Command::new("java")
            .args(["-Xmx1g", "-Xms1g", &log4j, "-cp", &classpath, "kafka.Kafka"])
            .arg(&props)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() >= deadline {
                bail!(
                    "Kafka did not listen on port {port} within 90 s; log in {}",
                    dir.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Broker::Kafka {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
            _dir: dir,
        })
    }

    /// librdkafka's mock cluster (Kafka's Java clients need `MockKafkaAgent` against it).
    pub fn is_mock(&self) -> bool {
        matches!(self, Broker::Mock { .. })
    }

    /// Kafka transactions can be measured: not on the mock cluster (partial transaction
    /// support) nor tansu (its fetch hands aborted records to `read_committed` consumers).
    pub fn has_transactions(&self) -> bool {
        !matches!(self, Broker::Mock { .. } | Broker::Tansu { .. })
    }

    /// The broker's own process (a real Kafka or tansu started here), for its CPU in `/proc`.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Broker::Tansu { child, .. } | Broker::Kafka { child, .. } => Some(child.id()),
            Broker::Mock { .. } | Broker::External { .. } => None,
        }
    }

    pub fn bootstrap(&self) -> &str {
        match self {
            Broker::Mock { bootstrap, .. }
            | Broker::Tansu { bootstrap, .. }
            | Broker::Kafka { bootstrap, .. }
            | Broker::External { bootstrap } => bootstrap,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Broker::Mock { .. } => {
                format!("librdkafka mock cluster ({MOCK_BROKERS} brokers, in the benchmark process)")
            }
            Broker::Tansu { .. } => "tansu (memory storage, one broker)".into(),
            Broker::Kafka { .. } => {
                "Apache Kafka 4.3 (one KRaft broker on loopback, started by the benchmark; replication factor 1)".into()
            }
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
            Broker::Tansu { bootstrap, .. } | Broker::Kafka { bootstrap, .. } | Broker::External { bootstrap } => {
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
            Broker::Tansu { child, .. } | Broker::Kafka { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Broker::External { .. } => {}
        }
    }
}

/// `$KAFKA_HOME`, else where scripts/install-kafka.sh puts Kafka (the harness's version).
fn kafka_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("KAFKA_HOME") {
        return Some(PathBuf::from(h));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let dir = cache.join("outbox-relay").join("kafka-4.3.1");
    dir.join("libs").is_dir().then_some(dir)
}

fn find_tansu() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let cargo = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    on_path.chain(cargo).map(|d| d.join("tansu")).find(|p| p.is_file())
}
