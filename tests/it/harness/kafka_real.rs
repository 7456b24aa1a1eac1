//! Real Apache Kafka: KRaft clusters of the broker that `scripts/install-kafka.sh` installs,
//! on loopback, started by the tests themselves.
//!
//! * [`shared_kafka`]: one combined broker+controller for the fast suites, started on first
//!   use and shared by every test of the binary. Tests keep apart by topic: each takes a
//!   [`KafkaNs`] (a unique topic prefix the relay's routing and the harness's readers both
//!   apply), so two tests routing to `order` never read each other's records.
//! * [`replicated_kafka`]: a dedicated controller and three brokers (RF 3,
//!   `min.insync.replicas = 2`, `acks=all` on the relay's side) for the replication suite,
//!   also started once; a test that kills or stops brokers holds its [`ReplicatedLease`], so
//!   those tests run one at a time and each leaves every broker running.
//! * [`KafkaCluster::start`]: a cluster of its own, for the settings a shared broker must
//!   not have (no topic auto-creation, SASL/SCRAM over TLS, ACLs).
//!
//! Where the broker is: `$KAFKA_HOME` (a directory with `libs/*.jar`), else
//! `~/.cache/outbox-relay/kafka-<KAFKA_VERSION>`. When it is missing the functions return
//! `None` after a loud SKIPPING line ([`super::needs::missing`]); under CI (which installs it
//! first, `.ci/run`) a missing broker fails the test instead.
//!
//! Every broker is a `java` child process tied to the test binary by a [`Watchdog`], with
//! its data in a temp dir removed on drop; every wait here is bounded.

use std::fs;
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
use tokio::sync::{Mutex as AsyncMutex, MutexGuard, OnceCell};

use super::consumer::{collect_isolated, collect_with, Received, Topics, DEFAULT_GRACE};
use super::process::{send_signal, Watchdog};
use super::util::{free_port, unique_name};

/// The Apache Kafka version `scripts/install-kafka.sh` installs (keep the two equal).
pub const KAFKA_VERSION: &str = "4.3.1";
/// Overrides where the broker's jars are (`$KAFKA_HOME/libs/*.jar`).
pub const KAFKA_HOME_ENV: &str = "KAFKA_HOME";
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The installed broker's directory, if there is one.
pub fn kafka_home() -> Option<PathBuf> {
    let dir = match std::env::var_os(KAFKA_HOME_ENV) {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
            cache.join("outbox-relay").join(format!("kafka-{KAFKA_VERSION}"))
        }
    };
    let broker_jar = dir.join("libs").join(format!("kafka_2.13-{KAFKA_VERSION}.jar"));
    (broker_jar.is_file() || std::env::var_os(KAFKA_HOME_ENV).is_some()).then_some(dir)
}

/// The broker's directory, or [`super::needs::missing`] (a loud SKIPPING line; a failure under CI).
fn skip_message() -> Option<PathBuf> {
    let home = kafka_home();
    if home.is_none() {
        let detail = format!("Apache Kafka {KAFKA_VERSION} is not installed");
        super::needs::missing(super::needs::KAFKA, "", &detail);
    }
    home
}

/// What a cluster looks like.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Brokers (node ids 1..=brokers). With one broker the node is also the controller;
    /// with more, a dedicated controller (node id 100) runs beside them, so a broker
    /// killed takes no part of the metadata quorum with it.
    pub brokers: usize,
    /// Extra `server.properties` lines for every broker (`auto.create.topics.enable`, …).
    pub broker_props: Vec<(String, String)>,
    /// A second client listener `SASL_SSL` with SCRAM-SHA-512 and this TLS material, and
    /// these SCRAM users created at format time (name, password).
    pub sasl_ssl: Option<SaslSsl>,
    /// A third client listener `RELAY`, bound on 127.0.0.1 at the port given and advertised
    /// as the `host:port` given (single broker only): the relay reaches the broker through an
    /// address of its own (a proxy, a network namespace's link, `net_fault.rs`) while the
    /// harness's readers keep the plaintext listener on 127.0.0.1.
    pub relay_listener: Option<(u16, String)>,
}

#[derive(Clone, Debug)]
pub struct SaslSsl {
    pub cert_pem: String,
    pub key_pem: String,
    pub users: Vec<(String, String)>,
    /// Turns on the StandardAuthorizer: `User:ANONYMOUS` (the plaintext listener, the
    /// harness's own) and `User:admin` are super users, everyone else needs ACLs.
    pub authorizer: bool,
}

impl ClusterSpec {
    pub fn single() -> ClusterSpec {
        ClusterSpec {
            brokers: 1,
            broker_props: Vec::new(),
            sasl_ssl: None,
            relay_listener: None,
        }
    }

    pub fn replicated() -> ClusterSpec {
        ClusterSpec {
            brokers: 3,
            broker_props: Vec::new(),
            sasl_ssl: None,
            relay_listener: None,
        }
    }

    pub fn prop(mut self, key: &str, value: &str) -> Self {
        self.broker_props.push((key.into(), value.into()));
        self
    }
}

struct Node {
    id: i32,
    /// Plaintext client port (brokers only).
    port: u16,
    /// SASL_SSL client port, when the spec has one.
    sasl_port: Option<u16>,
    controller_port: u16,
    roles: &'static str,
    props: PathBuf,
    log: PathBuf,
    proc: Mutex<Option<(Child, Watchdog)>>,
}

/// A running KRaft cluster. Dropping it kills every node and removes its data.
pub struct KafkaCluster {
    home: PathBuf,
    dir: TempDir,
    nodes: Vec<Node>,
    spec: ClusterSpec,
}

impl KafkaCluster {
    /// Formats and starts a cluster; `None` (after a loud line) when Kafka is not installed.
    /// Panics with the broker's log when it does not come up within 90 s.
    pub async fn start(spec: ClusterSpec) -> Option<KafkaCluster> {
        let home = skip_message()?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-kafka-")
            .tempdir()
            .expect("kafka tempdir");
        let combined = spec.brokers == 1;
        let mut nodes = Vec::new();
        let controller_id = if combined { 1 } else { 100 };
        let controller_port = free_port();
        if !combined {
            nodes.push(Node::new(dir.path(), 100, "controller", 0, None, controller_port));
        }
        for id in 1..=spec.brokers as i32 {
            let roles = if combined { "broker,controller" } else { "broker" };
            let sasl = spec.sasl_ssl.as_ref().map(|_| free_port());
            let cport = if combined { controller_port } else { 0 };
            nodes.push(Node::new(dir.path(), id, roles, free_port(), sasl, cport));
        }
        let voters = format!("{controller_id}@127.0.0.1:{controller_port}");
        let cluster = KafkaCluster { home, dir, nodes, spec };
        for node in &cluster.nodes {
            cluster.write_props(node, &voters);
        }
        let cluster_id = cluster.java("kafka.tools.StorageTool", &["random-uuid"]);
        let cluster_id = cluster_id.trim().to_string();
        for node in &cluster.nodes {
            let mut args = vec!["format", "-t", &cluster_id, "-c"];
            let props = node.props.to_string_lossy().into_owned();
            args.push(&props);
            let scram: Vec<String> = cluster
                .spec
                .sasl_ssl
                .iter()
                .flat_map(|s| s.users.iter())
                .map(|(u, p)| format!("SCRAM-SHA-512=[name={u},password={p}]"))
                .collect();
            for s in &scram {
                args.push("--add-scram");
                args.push(s);
            }
            cluster.java("kafka.tools.StorageTool", &args);
        }
        for node in &cluster.nodes {
            cluster.spawn(node);
        }
        cluster.wait_ready().await;
        Some(cluster)
    }

    fn write_props(&self, node: &Node, voters: &str) {
        let data = self.dir.path().join(format!("data-{}", node.id));
        let mut lines = vec![
            format!("process.roles={}", node.roles),
            format!("node.id={}", node.id),
            format!("controller.quorum.voters={voters}"),
            "controller.listener.names=CONTROLLER".to_string(),
            format!("log.dirs={}", data.display()),
        ];
        let is_broker = node.roles.contains("broker");
        let mut listeners = Vec::new();
        let mut advertised = Vec::new();
        let mut map = vec!["CONTROLLER:PLAINTEXT".to_string(), "PLAINTEXT:PLAINTEXT".to_string()];
        if is_broker {
            listeners.push(format!("PLAINTEXT://127.0.0.1:{}", node.port));
            advertised.push(format!("PLAINTEXT://127.0.0.1:{}", node.port));
            if let Some(p) = node.sasl_port {
                listeners.push(format!("SASL_SSL://127.0.0.1:{p}"));
                advertised.push(format!("SASL_SSL://127.0.0.1:{p}"));
                map.push("SASL_SSL:SASL_SSL".to_string());
            }
            if let Some((port, advertised_at)) = &self.spec.relay_listener {
                assert_eq!(self.spec.brokers, 1, "relay_listener: single broker only");
                listeners.push(format!("RELAY://127.0.0.1:{port}"));
                advertised.push(format!("RELAY://{advertised_at}"));
                map.push("RELAY:PLAINTEXT".to_string());
            }
            lines.push("inter.broker.listener.name=PLAINTEXT".to_string());
        }
        if node.roles.contains("controller") {
            listeners.push(format!("CONTROLLER://127.0.0.1:{}", node.controller_port));
        }
        lines.push(format!("listeners={}", listeners.join(",")));
        if !advertised.is_empty() {
            lines.push(format!("advertised.listeners={}", advertised.join(",")));
        }
        lines.push(format!("listener.security.protocol.map={}", map.join(",")));
        let rf = self.spec.brokers.min(3);
        let min_isr = if rf >= 3 { 2 } else { 1 };
        lines.extend([
            format!("default.replication.factor={rf}"),
            format!("min.insync.replicas={min_isr}"),
            format!("offsets.topic.replication.factor={rf}"),
            format!("transaction.state.log.replication.factor={rf}"),
            format!("transaction.state.log.min.isr={min_isr}"),
            // Small internal topics: created on the first group or transaction, they cost
            // start-up time per partition on a 2-core machine.
            "offsets.topic.num.partitions=4".to_string(),
            "transaction.state.log.num.partitions=4".to_string(),
            "group.initial.rebalance.delay.ms=0".to_string(),
            // Auto-created topics look like the mock cluster's (4 partitions).
            "num.partitions=4".to_string(),
            "auto.create.topics.enable=true".to_string(),
            "unclean.leader.election.enable=false".to_string(),
            "log.segment.bytes=16777216".to_string(),
            "num.network.threads=2".to_string(),
            "num.io.threads=4".to_string(),
        ]);
        if let (Some(s), Some(_)) = (&self.spec.sasl_ssl, node.sasl_port) {
            // The TLS material inline (PEM in the properties), nothing written beside them.
            lines.extend([
                "sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;".to_string(),
                "ssl.keystore.type=PEM".to_string(),
                format!("ssl.keystore.certificate.chain={}", pem_one_line(&s.cert_pem)),
                format!("ssl.keystore.key={}", pem_one_line(&s.key_pem)),
            ]);
        }
        // Every node, the controller too, authorizes alike.
        if self.spec.sasl_ssl.as_ref().is_some_and(|s| s.authorizer) {
            lines.extend([
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".to_string(),
                "super.users=User:ANONYMOUS;User:admin".to_string(),
            ]);
        }
        for (k, v) in &self.spec.broker_props {
            lines.push(format!("{k}={v}"));
        }
        fs::write(&node.props, lines.join("\n") + "\n").expect("write server.properties");
    }

    fn classpath(&self) -> String {
        format!("{}/libs/*", self.home.display())
    }

    fn log4j_arg(&self) -> String {
        format!(
            "-Dlog4j2.configurationFile={}",
            self.home.join("log4j2.properties").display()
        )
    }

    /// Runs a Kafka tool class to completion (bounded); its stdout. Panics with its output
    /// when it fails.
    pub fn java(&self, class: &str, args: &[&str]) -> String {
        let out = Command::new("timeout")
            .arg("120")
            .arg("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg(self.log4j_arg())
            .arg("-cp")
            .arg(self.classpath())
            .arg(class)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run java {class}: {e}"));
        assert!(
            out.status.success(),
            "java {class} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn spawn(&self, node: &Node) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("kafka log");
        let heap = if node.roles == "controller" {
            "-Xmx256m"
        } else {
            "-Xmx512m"
        };
        let child = Command::new("java")
            .args([heap, "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"])
            .arg(self.log4j_arg())
            .arg("-cp")
            .arg(self.classpath())
            .arg("kafka.Kafka")
            .arg(&node.props)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start Kafka node {}: {e}", node.id));
        let dog = Watchdog::guard(child.id());
        *node.proc.lock().unwrap() = Some((child, dog));
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let bootstrap = self.bootstrap_servers();
        let want = self.spec.brokers;
        loop {
            let b = bootstrap.clone();
            let n = tokio::task::spawn_blocking(move || brokers_in_metadata(&b))
                .await
                .unwrap_or(0);
            if n >= want {
                return;
            }
            for node in &self.nodes {
                if !self.running(node.id) {
                    panic!(
                        "Kafka node {} exited while starting; log:\n{}",
                        node.id,
                        self.log_text(node.id)
                    );
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "Kafka cluster not ready within {READY_TIMEOUT:?} ({n} of {want} brokers); logs:\n{}",
                    self.nodes
                        .iter()
                        .map(|n| self.log_text(n.id))
                        .collect::<Vec<_>>()
                        .join("\n----\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn node(&self, id: i32) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no Kafka node {id}"))
    }

    /// Broker ids (1..=brokers).
    pub fn broker_ids(&self) -> Vec<i32> {
        (1..=self.spec.brokers as i32).collect()
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,…` of the plaintext listeners.
    pub fn bootstrap_servers(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| n.roles.contains("broker"))
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The SASL_SSL listeners, when the spec has them.
    pub fn sasl_ssl_bootstrap(&self) -> Option<String> {
        let v: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| n.sasl_port.map(|p| format!("127.0.0.1:{p}")))
            .collect();
        (!v.is_empty()).then(|| v.join(","))
    }

    pub fn log_text(&self, id: i32) -> String {
        fs::read(&self.node(id).log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn running(&self, id: i32) -> bool {
        let mut guard = self.node(id).proc.lock().unwrap();
        match guard.as_mut() {
            Some((child, _)) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn pid(&self, id: i32) -> Option<u32> {
        self.node(id).proc.lock().unwrap().as_ref().map(|(c, _)| c.id())
    }

    /// kill -9 broker `id` (no clean shutdown, no leadership hand-over).
    pub fn kill(&self, id: i32) {
        if let Some((mut child, _dog)) = self.node(id).proc.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts broker `id` again on its data and ports; waits (bounded) until the cluster's
    /// metadata lists it.
    pub async fn restart(&self, id: i32) {
        assert!(!self.running(id), "node {id} is running");
        self.spawn(self.node(id));
        let deadline = Instant::now() + READY_TIMEOUT;
        let port = self.node(id).port;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                self.running(id),
                "node {id} exited on restart; log:\n{}",
                self.log_text(id)
            );
            assert!(Instant::now() < deadline, "node {id} did not listen again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits (bounded) until every broker is in the metadata and every partition of `topic`
    /// has its full ISR again.
    pub async fn wait_healthy(&self, topic: &str, timeout: Duration) -> bool {
        let want = self.spec.brokers;
        let b = self.bootstrap_servers();
        let t = topic.to_string();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let (b, t) = (b.clone(), t.clone());
            let ok = tokio::task::spawn_blocking(move || {
                let c = metadata_client(&b)?;
                let md = c.fetch_metadata(Some(&t), Duration::from_secs(3)).ok()?;
                let brokers = md.brokers().len();
                let full = md.topics().iter().all(|tm| {
                    !tm.partitions().is_empty()
                        && tm
                            .partitions()
                            .iter()
                            .all(|p| p.isr().len() >= want.min(3) && p.leader() >= 0)
                });
                Some(brokers >= want && full)
            })
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
            if ok {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        false
    }

    /// The leader of `topic`'s `partition` now (None when unknown or leaderless).
    pub async fn leader_of(&self, topic: &str, partition: i32) -> Option<i32> {
        let (b, t) = (self.bootstrap_servers(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            let c = metadata_client(&b)?;
            let md = c.fetch_metadata(Some(&t), Duration::from_secs(5)).ok()?;
            let tm = md.topics().first()?;
            let p = tm.partitions().iter().find(|p| p.id() == partition)?;
            (p.leader() >= 0).then_some(p.leader())
        })
        .await
        .ok()
        .flatten()
    }

    /// Creates `topic` (replication `min(3, brokers)`), with topic-level `configs`. An
    /// existing topic is fine.
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        let rf = self.spec.brokers.min(3) as i32;
        create_topic_at(&self.bootstrap_servers(), rf, topic, partitions, configs).await
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.create_topic_with(topic, partitions, &[]).await
    }

    /// Runs Kafka's `AclCommand` against the plaintext listener (whose `User:ANONYMOUS` is
    /// a super user where an authorizer is on), e.g. `["--add", "--allow-principal",
    /// "User:relay", "--operation", "Write", "--topic", "t"]`.
    pub fn acl(&self, args: &[&str]) -> String {
        let bootstrap = self.bootstrap_servers();
        let mut all = vec!["--bootstrap-server", bootstrap.as_str()];
        all.extend_from_slice(args);
        all.push("--force");
        self.java("org.apache.kafka.tools.AclCommand", &all)
    }

    /// A fresh topic namespace on this cluster.
    pub fn own_ns(&self) -> KafkaNs {
        KafkaNs {
            bootstrap: self.bootstrap_servers(),
            prefix: format!("{}.", unique_name("k")),
            replication: self.spec.brokers.min(3) as i32,
        }
    }

    pub fn pause(&self, id: i32) -> bool {
        self.pid(id).is_some_and(|p| send_signal(p, "STOP"))
    }

    pub fn resume(&self, id: i32) -> bool {
        self.pid(id).is_some_and(|p| send_signal(p, "CONT"))
    }
}

impl Node {
    fn new(dir: &Path, id: i32, roles: &'static str, port: u16, sasl_port: Option<u16>, cport: u16) -> Node {
        Node {
            id,
            port,
            sasl_port,
            controller_port: cport,
            roles,
            props: dir.join(format!("server-{id}.properties")),
            log: dir.join(format!("kafka-{id}.log")),
            proc: Mutex::new(None),
        }
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failed test's brokers' logs outlive the temp directory, like its relays' logs.
            for node in &self.nodes {
                let kept = std::env::temp_dir().join(format!(
                    "outbox-relay-failed-kafka-{}-node{}.log",
                    std::process::id(),
                    node.id
                ));
                if fs::copy(&node.log, &kept).is_ok() {
                    eprintln!("Kafka node {} log kept: {}", node.id, kept.display());
                }
            }
        }
        for node in &self.nodes {
            if let Some((mut child, _dog)) = node.proc.lock().unwrap().take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// PEM text as one `server.properties` value (Kafka reads the PEM with its line breaks as
/// `\n` escapes, or joined by spaces; escapes keep it exact).
fn pem_one_line(pem: &str) -> String {
    pem.trim().replace('\n', "\\n")
}

/// Creates `topic` through the CreateTopics admin API and waits (bounded) until every
/// partition has a leader (producers would otherwise see it as unknown for a moment).
async fn create_topic_at(bootstrap: &str, rf: i32, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(rf));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let res = tokio::time::timeout(Duration::from_secs(60), admin.create_topics([&new], &opts))
        .await
        .unwrap_or_else(|_| panic!("create_topics {topic} timed out"))
        .unwrap_or_else(|e| panic!("create_topics {topic}: {e}"));
    for r in res {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("create topic {t}: {e}"),
        }
    }
    let ok = super::util::wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
        let (b, t) = (bootstrap.to_string(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            metadata_client(&b)
                .and_then(|c| {
                    let md = c.fetch_metadata(Some(&t), Duration::from_secs(3)).ok()?;
                    let tm = md.topics().first()?;
                    let led =
                        tm.partitions().len() == partitions as usize && tm.partitions().iter().all(|p| p.leader() >= 0);
                    // The metadata names a leader before that broker has made the partition's
                    // log; ListOffsets answers only once it has (a record produced in between
                    // is refused and retried by the client: docs/reliability.md, defect 5).
                    Some(led && (0..partitions).all(|p| c.fetch_watermarks(&t, p, Duration::from_secs(3)).is_ok()))
                })
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(ok, "topic {topic} has no leader for every partition after 30 s");
}

fn metadata_client(bootstrap: &str) -> Option<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()
        .ok()
}

/// Blocking: how many brokers the cluster's metadata lists (0 when it does not answer).
fn brokers_in_metadata(bootstrap: &str) -> usize {
    metadata_client(bootstrap)
        .and_then(|c| c.fetch_metadata(None, Duration::from_secs(3)).ok())
        .map(|m| m.brokers().len())
        .unwrap_or(0)
}

static SHARED: OnceCell<Option<KafkaCluster>> = OnceCell::const_new();
static REPLICATED: OnceCell<Option<KafkaCluster>> = OnceCell::const_new();
static REPLICATED_LOCK: AsyncMutex<()> = AsyncMutex::const_new(());

/// The one-broker cluster every fast suite shares (started on first use), and a fresh
/// topic namespace for the calling test. `None` after a loud line when Kafka is missing.
pub async fn shared_kafka() -> Option<KafkaNs> {
    Some(shared_cluster().await?.own_ns())
}

/// The cluster behind [`shared_kafka`] (to create a namespace's topics with partitions of
/// their own, or read its logs).
pub async fn shared_cluster() -> Option<&'static KafkaCluster> {
    SHARED
        .get_or_init(|| async { KafkaCluster::start(ClusterSpec::single()).await })
        .await
        .as_ref()
}

/// The three-broker cluster of the replication suite, held by the caller alone until the
/// lease is dropped. The holder must leave every broker running.
pub async fn replicated_kafka() -> Option<ReplicatedLease> {
    let cluster = REPLICATED
        .get_or_init(|| async { KafkaCluster::start(ClusterSpec::replicated()).await })
        .await
        .as_ref()?;
    let guard = REPLICATED_LOCK.lock().await;
    Some(ReplicatedLease {
        _guard: guard,
        cluster,
        ns: cluster.own_ns(),
    })
}

/// Exclusive use of [`replicated_kafka`]'s cluster, with a topic namespace.
pub struct ReplicatedLease {
    _guard: MutexGuard<'static, ()>,
    pub cluster: &'static KafkaCluster,
    pub ns: KafkaNs,
}

impl std::ops::Deref for ReplicatedLease {
    type Target = KafkaNs;
    fn deref(&self) -> &KafkaNs {
        &self.ns
    }
}

/// A test's share of a real cluster: its topics are `<prefix>.<name>`. The relay config
/// gets the prefix through `RelayConfig::on_kafka` ([`KafkaNs::topic_prefix`]); the
/// readers here take and return the names without it.
pub struct KafkaNs {
    bootstrap: String,
    prefix: String,
    /// Replication factor of the topics [`KafkaNs::create_topic`] makes.
    replication: i32,
}

impl KafkaNs {
    /// The whole of a broker of the test's own, without a prefix (the mock cluster).
    pub fn plain(bootstrap: &str) -> KafkaNs {
        KafkaNs {
            bootstrap: bootstrap.to_string(),
            prefix: String::new(),
            replication: 1,
        }
    }

    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }

    /// `<prefix>.` — what the relay's topic replacement starts with.
    pub fn topic_prefix(&self) -> &str {
        &self.prefix
    }

    /// The real topic of `name`.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Creates this namespace's topic `name` with `partitions` partitions (real brokers only:
    /// the mock cluster has no CreateTopics).
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        create_topic_at(&self.bootstrap, self.replication, &self.topic(name), partitions, &[]).await
    }

    /// [`super::consumer::collect`] over this namespace's `topics`; `Received::topic` without the prefix.
    pub async fn collect(&self, topics: &[&str], expected: usize, timeout: Duration) -> Vec<Received> {
        let list = Topics::List(topics.iter().map(|t| self.topic(t)).collect());
        self.unprefix(collect_with(&self.bootstrap_servers(), &list, expected, timeout, DEFAULT_GRACE).await)
    }

    /// [`KafkaNs::collect`] with `isolation.level = read_uncommitted`: records of aborted
    /// transactions too.
    pub async fn collect_uncommitted(&self, topics: &[&str], expected: usize, timeout: Duration) -> Vec<Received> {
        let list = Topics::List(topics.iter().map(|t| self.topic(t)).collect());
        self.unprefix(
            collect_isolated(
                &self.bootstrap_servers(),
                &list,
                expected,
                timeout,
                DEFAULT_GRACE,
                "read_uncommitted",
            )
            .await,
        )
    }

    /// Every topic of this namespace whose name (without the prefix) matches `regex`
    /// (anchored by the caller as it likes).
    pub async fn collect_matching(&self, regex: &str, expected: usize, timeout: Duration) -> Vec<Received> {
        let inner = regex.trim_start_matches('^');
        let sel = Topics::Regex(format!("^{}(?:{inner})", regex::escape(&self.prefix)));
        self.unprefix(collect_with(&self.bootstrap_servers(), &sel, expected, timeout, DEFAULT_GRACE).await)
    }

    fn unprefix(&self, mut records: Vec<Received>) -> Vec<Received> {
        for r in &mut records {
            if let Some(rest) = r.topic.strip_prefix(&self.prefix) {
                r.topic = rest.to_string();
            }
        }
        records
    }
}
