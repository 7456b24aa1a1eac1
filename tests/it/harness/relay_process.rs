//! The relay binary as a child process, the TOML config it reads, and a database made
//! ready for it (`prepared`: schema, `pg_walinspect`, `setup` done).
//!
//! Each process gets its own temp dir holding `relay.toml` and `relay.log` (stdout and
//! stderr appended). `RUST_LOG` defaults to `info` so tests can wait on log lines. When a
//! test panics while a [`RelayProcess`] is alive, the tail of its log is printed on drop.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use tempfile::TempDir;
use tokio_postgres::Client;
use toml::{Table, Value};

use super::postgres::{shared_cluster, PgCluster};
use super::process::{send_signal, wait_child, Watchdog};
use super::util::{unique_name, wait_until};
use super::workload::{create_schema, OutboxSchema};

/// Path of the relay binary built by cargo for this test run.
pub const RELAY_BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");
/// Default bound for one-shot commands.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);

/// The relay's configuration. Defaults match schema A (`public.events_outbox`); the slot
/// and publication default to fresh [`unique_name`]s because slots are cluster-wide and
/// tests share a cluster. Fields are public; the chainable setters are shorthand.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub postgres_url: String,
    pub slot: String,
    pub publication: String,
    pub sslrootcert: Option<PathBuf>,
    pub table: String,
    pub id_column: String,
    pub key_column: String,
    pub route_by_column: String,
    pub payload_column: String,
    pub timestamp_column: Option<String>,
    /// Rendered verbatim as `[outbox] header_columns`.
    pub header_columns: BTreeMap<String, String>,
    pub topic_regex: String,
    pub topic_replacement: String,
    /// Put before `[route] topic_replacement` when rendering: a test's topic namespace on a
    /// shared real broker ([`super::kafka_real::KafkaNs`]); empty elsewhere.
    pub topic_prefix: String,
    /// librdkafka properties, rendered verbatim under `[kafka]`.
    pub kafka: BTreeMap<String, String>,
    pub max_in_flight: i64,
    pub status_interval_ms: i64,
    /// Anything else: (section, key, value), set after the fields above (so it can also
    /// override them, or add keys the harness does not know about).
    pub extra: Vec<(String, String, Value)>,
}

impl RelayConfig {
    /// Schema A defaults, reading `postgres_url` and producing to `bootstrap_servers`.
    pub fn new(postgres_url: &str, bootstrap_servers: &str) -> RelayConfig {
        let mut kafka = BTreeMap::new();
        kafka.insert("bootstrap.servers".to_string(), bootstrap_servers.to_string());
        RelayConfig {
            postgres_url: postgres_url.to_string(),
            slot: unique_name("slot"),
            publication: unique_name("pub"),
            sslrootcert: None,
            table: "public.events_outbox".into(),
            id_column: "id".into(),
            key_column: "aggregate_id".into(),
            route_by_column: "type".into(),
            payload_column: "payload".into(),
            timestamp_column: Some("created_at".into()),
            header_columns: BTreeMap::new(),
            topic_regex: "(?<routedByValue>.*)".into(),
            topic_replacement: "${routedByValue}".into(),
            topic_prefix: String::new(),
            kafka,
            max_in_flight: 10_000,
            status_interval_ms: 1000,
            extra: Vec::new(),
        }
    }

    /// Defaults for either outbox schema (B routes by `aggregate_type`, like Debezium).
    pub fn for_schema(schema: OutboxSchema, postgres_url: &str, bootstrap: &str) -> Self {
        let mut c = RelayConfig::new(postgres_url, bootstrap);
        c.table = schema.qualified_table().to_string();
        if schema == OutboxSchema::B {
            c.route_by_column = "aggregate_type".into();
        }
        c
    }

    pub fn slot(mut self, slot: &str) -> Self {
        self.slot = slot.into();
        self
    }

    pub fn publication(mut self, publication: &str) -> Self {
        self.publication = publication.into();
        self
    }

    pub fn sslrootcert(mut self, path: &Path) -> Self {
        self.sslrootcert = Some(path.to_path_buf());
        self
    }

    pub fn kafka(mut self, key: &str, value: &str) -> Self {
        self.kafka.insert(key.into(), value.into());
        self
    }

    pub fn header_column(mut self, key: &str, value: &str) -> Self {
        self.header_columns.insert(key.into(), value.into());
        self
    }

    pub fn route(mut self, topic_regex: &str, topic_replacement: &str) -> Self {
        self.topic_regex = topic_regex.into();
        self.topic_replacement = topic_replacement.into();
        self
    }

    /// Routes into `ns`'s topics on its (real, shared) broker: bootstrap and topic prefix.
    pub fn on_kafka(mut self, ns: &super::kafka_real::KafkaNs) -> Self {
        self.kafka.insert("bootstrap.servers".into(), ns.bootstrap_servers());
        self.topic_prefix = ns.topic_prefix().to_string();
        self
    }

    /// `[route] topic = <topic prefix><template>` (the test's namespace first) instead of the
    /// regex rule.
    pub fn topic_template(self, template: &str) -> Self {
        let topic = format!("{}{template}", self.topic_prefix);
        self.set("route", "topic", topic)
    }

    pub fn max_in_flight(mut self, n: i64) -> Self {
        self.max_in_flight = n;
        self
    }

    pub fn status_interval_ms(mut self, ms: i64) -> Self {
        self.status_interval_ms = ms;
        self
    }

    /// Publishes to another sink: `[sink] kind = kind`, no `[kafka]` section, and
    /// `[kind] key = value` for each of `section` (e.g. `("nats", &[("url", …), ("stream", …)])`).
    pub fn sink(mut self, kind: &str, section: &[(&str, &str)]) -> Self {
        self.kafka.clear();
        self = self.set("sink", "kind", kind);
        for (key, value) in section {
            self = self.set(kind, key, *value);
        }
        self
    }

    /// Sets `[section] key = value` (dotted `section` such as `outbox` only; one level).
    pub fn set(mut self, section: &str, key: &str, value: impl Into<Value>) -> Self {
        self.extra.push((section.into(), key.into(), value.into()));
        self
    }

    /// The TOML text (the `toml` crate does the quoting/escaping).
    pub fn render(&self) -> String {
        let s = |v: &str| Value::String(v.to_string());
        let mut pg = Table::new();
        pg.insert("url".into(), s(&self.postgres_url));
        pg.insert("slot".into(), s(&self.slot));
        pg.insert("publication".into(), s(&self.publication));
        if let Some(p) = &self.sslrootcert {
            pg.insert("sslrootcert".into(), s(&p.to_string_lossy()));
        }
        let mut outbox = Table::new();
        outbox.insert("table".into(), s(&self.table));
        outbox.insert("id_column".into(), s(&self.id_column));
        outbox.insert("key_column".into(), s(&self.key_column));
        outbox.insert("route_by_column".into(), s(&self.route_by_column));
        outbox.insert("payload_column".into(), s(&self.payload_column));
        if let Some(t) = &self.timestamp_column {
            outbox.insert("timestamp_column".into(), s(t));
        }
        let headers: Table = self.header_columns.iter().map(|(k, v)| (k.clone(), s(v))).collect();
        outbox.insert("header_columns".into(), Value::Table(headers));
        let mut route = Table::new();
        // A `[route] topic` template replaces the regex rule (the relay refuses both).
        if !self
            .extra
            .iter()
            .any(|(section, key, _)| section == "route" && key == "topic")
        {
            route.insert("topic_regex".into(), s(&self.topic_regex));
            route.insert(
                "topic_replacement".into(),
                s(&format!("{}{}", self.topic_prefix, self.topic_replacement)),
            );
        }
        let kafka: Table = self.kafka.iter().map(|(k, v)| (k.clone(), s(v))).collect();
        let mut relay = Table::new();
        relay.insert("max_in_flight".into(), Value::Integer(self.max_in_flight));
        relay.insert("status_interval_ms".into(), Value::Integer(self.status_interval_ms));

        let mut root = Table::new();
        root.insert("postgres".into(), Value::Table(pg));
        root.insert("outbox".into(), Value::Table(outbox));
        root.insert("route".into(), Value::Table(route));
        // Empty only after `sink(…)`: another broker's config must not have a [kafka] section.
        if !kafka.is_empty() {
            root.insert("kafka".into(), Value::Table(kafka));
        }
        root.insert("relay".into(), Value::Table(relay));
        for (section, key, value) in &self.extra {
            let entry = root
                .entry(section.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            match entry {
                Value::Table(t) => {
                    t.insert(key.clone(), value.clone());
                }
                _ => panic!("[{section}] is not a table"),
            }
        }
        toml::to_string(&root).expect("render relay config")
    }

    /// Writes the rendered config to `path`.
    pub fn write_to(&self, path: &Path) {
        fs::write(path, self.render()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// A running `outbox-relay run --config …`. Dropping it SIGKILLs the process.
pub struct RelayProcess {
    child: Child,
    _watchdog: Watchdog,
    dir: TempDir,
}

impl RelayProcess {
    /// `outbox-relay run --config <dir>/relay.toml`.
    pub fn run(config: &RelayConfig) -> RelayProcess {
        RelayProcess::run_with(config, &[], &[])
    }

    /// [`run`](Self::run), then waits (up to 30 s) for the stream to start; fails the test with
    /// the relay's log otherwise.
    pub async fn run_streaming(config: &RelayConfig) -> RelayProcess {
        let relay = RelayProcess::run(config);
        assert!(
            relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
            "{}",
            relay.log_text()
        );
        relay
    }

    /// Like [`run`](Self::run) with extra CLI args (after `--config FILE`) and env vars.
    pub fn run_with(config: &RelayConfig, extra_args: &[&str], env: &[(&str, &str)]) -> Self {
        RelayProcess::start("run", config, extra_args, env)
    }

    /// `outbox-relay poll --config <dir>/relay.toml` (the polling relayer).
    pub fn poll(config: &RelayConfig) -> RelayProcess {
        RelayProcess::start("poll", config, &[], &[])
    }

    /// Any long-running subcommand (`run`, `poll`) with extra args and env vars.
    pub fn start(subcommand: &str, config: &RelayConfig, extra_args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-run-")
            .tempdir()
            .expect("tempdir");
        let config_path = dir.path().join("relay.toml");
        config.write_to(&config_path);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("relay.log"))
            .expect("open relay log");
        let mut cmd = relay_command(env);
        cmd.arg(subcommand)
            .arg("--config")
            .arg(&config_path)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {RELAY_BIN}: {e}"));
        let watchdog = Watchdog::guard(child.id());
        RelayProcess {
            child,
            _watchdog: watchdog,
            dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("relay.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("relay.log")
    }

    /// Graceful shutdown request.
    pub fn sigterm(&self) -> bool {
        send_signal(self.pid(), "TERM")
    }

    /// Crash: no cleanup, no final LSN confirmation.
    pub fn sigkill(&self) -> bool {
        send_signal(self.pid(), "KILL")
    }

    /// Freeze (e.g. so Postgres' `wal_sender_timeout` fires), then thaw with `sigcont`.
    pub fn sigstop(&self) -> bool {
        send_signal(self.pid(), "STOP")
    }

    pub fn sigcont(&self) -> bool {
        send_signal(self.pid(), "CONT")
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(&mut self.child, timeout).await
    }

    /// The exit status if it already exited.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Polls the log until it contains `needle` or `timeout` passes.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(50), || async {
            self.log_text().contains(needle)
        })
        .await
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log_text();
            // The whole log outlives the temp dir, for the investigation of a failed run.
            let kept = std::env::temp_dir().join(format!(
                "outbox-relay-failed-{}-{}.log",
                std::process::id(),
                self.child.id()
            ));
            if std::fs::write(&kept, &log).is_ok() {
                eprintln!("relay log kept: {}", kept.display());
            }
            let start = log.len().saturating_sub(8000);
            let start = (start..log.len())
                .find(|i| log.is_char_boundary(*i))
                .unwrap_or(log.len());
            eprintln!(
                "----- relay log tail ({}) -----\n{}\n----- end relay log -----",
                self.log_path().display(),
                &log[start..]
            );
        }
    }
}

/// In the `env` of [`RelayProcess::run_with`] / [`run_cmd_with`]: not a variable, but "run
/// the relay where no DNS server is configured" — a mount namespace of its own with an empty
/// `/etc/resolv.conf` (glibc then asks 127.0.0.1:53, where nothing answers), so a test of an
/// unknown host sends no query off the machine. Needs root and `unshare` (CI has both).
pub const NO_DNS: &str = "outbox-relay-test:no-dns";

/// In the `env` of [`RelayProcess::run_with`]: not a variable, but "run the relay in this
/// network namespace" (`ip netns exec <value> …`, which execs the relay in place, so the pid the
/// watchdog guards is the relay's): the fault harness's namespaces (`net_fault.rs`).
pub const NETNS: &str = "outbox-relay-test:netns";

fn relay_command(env: &[(&str, &str)]) -> Command {
    let netns = env.iter().find(|(k, _)| *k == NETNS).map(|(_, v)| *v);
    let mut cmd = if let Some(ns) = netns {
        assert!(
            !env.iter().any(|(k, _)| *k == NO_DNS),
            "NETNS and NO_DNS together are not supported"
        );
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, RELAY_BIN]);
        c
    } else if env.iter().any(|(k, _)| *k == NO_DNS) {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind /dev/null /etc/resolv.conf && exec "$0" "$@""#)
            .arg(RELAY_BIN);
        c
    } else {
        Command::new(RELAY_BIN)
    };
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    cmd.env("NO_COLOR", "1");
    for (k, v) in env.iter().filter(|(k, _)| *k != NO_DNS && *k != NETNS) {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a one-shot subcommand: `outbox-relay <args…> --config FILE`, e.g.
/// `run_cmd(&["status", "--json"], &cfg)`. Bounded by [`CMD_TIMEOUT`] (panics past it).
pub async fn run_cmd(args: &[&str], config: &RelayConfig) -> Output {
    run_cmd_with(args, config, &[], CMD_TIMEOUT).await
}

/// [`run_cmd`] with env vars and an explicit timeout.
pub async fn run_cmd_with(args: &[&str], config: &RelayConfig, env: &[(&str, &str)], timeout: Duration) -> Output {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-cmd-")
        .tempdir()
        .expect("tempdir");
    let config_path = dir.path().join("relay.toml");
    config.write_to(&config_path);
    // Files instead of pipes: nothing to drain while we poll for exit.
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut cmd = relay_command(env);
    cmd.args(args)
        .arg("--config")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).expect("stdout file"))
        .stderr(fs::File::create(&err_path).expect("stderr file"));
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {RELAY_BIN}: {e}"));
    let _watchdog = Watchdog::guard(child.id());
    let status = match wait_child(&mut child, timeout).await {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`outbox-relay {}` did not exit within {timeout:?}; stderr:\n{}",
                args.join(" "),
                fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
    };
    Output {
        status,
        stdout: fs::read(&out_path).unwrap_or_default(),
        stderr: fs::read(&err_path).unwrap_or_default(),
    }
}

/// A route regex for [`RelayConfig::route`]: the topic is the routed-by value up to its first dot.
pub const PREFIX_REGEX: &str = r"^(?<routedByValue>[^.]+)\..*$";

/// A database on the shared cluster with the given outbox schema, pg_walinspect, and a relay
/// config for it with `setup` done.
pub async fn prepared(schema: OutboxSchema, bootstrap: &str) -> (String, Client, RelayConfig) {
    prepared_on(shared_cluster().await, "e2e", schema, bootstrap).await
}

/// Like [`prepared`], publishing into `ns` (a test's share of a real broker).
pub async fn prepared_ns(schema: OutboxSchema, ns: &super::kafka_real::KafkaNs) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared(schema, &ns.bootstrap_servers()).await;
    (db, client, config.on_kafka(ns))
}

/// Like [`prepared`], on `pg`, the database named after `prefix`.
pub async fn prepared_on(
    pg: &PgCluster,
    prefix: &str,
    schema: OutboxSchema,
    bootstrap: &str,
) -> (String, Client, RelayConfig) {
    let db = unique_name(prefix);
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    create_schema(&client, schema).await;
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .await
        .expect("pg_walinspect");
    let config = RelayConfig::for_schema(schema, &pg.url(&db), bootstrap);
    setup(&config).await;
    (db, client, config)
}

/// Runs `outbox-relay setup` for `config`; panics with its stderr when it fails.
pub async fn setup(config: &RelayConfig) {
    let out = run_cmd(&["setup"], config).await;
    assert!(
        out.status.success(),
        "setup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
