//! The relay under test, as a child process of the release binary, so its CPU and memory are
//! its own in `/proc`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use super::debezium::Tuning;
use super::sinks::SinkTarget;

/// Built by cargo for this bench (the bench profile inherits `release`).
const RELAY_BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// The relay binary under test: [`RELAY_BIN`], or another build named by
/// `OUTBOX_RELAY_BENCH_BIN` (`scripts/profile/compare_builds.sh` runs the benchmark with two
/// builds in turn, to compare them in one session on one machine).
pub fn relay_bin() -> std::ffi::OsString {
    std::env::var_os("OUTBOX_RELAY_BENCH_BIN").unwrap_or_else(|| RELAY_BIN.into())
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// The streaming relay (`outbox-relay run`).
    Cdc,
    /// The streaming relay with `relay.delivery = "exactly-once"` (position headers; the
    /// replay check costs nothing in steady state).
    CdcExactlyOnce,
    /// The streaming relay with `relay.delivery = "exactly-once"` through Kafka transactions
    /// (`[kafka] exactly_once = "transactions"`, `transactional.id` = the slot's name): one
    /// Kafka transaction per batch of source transactions, committed before it is confirmed.
    CdcKafkaTransactions,
    /// The polling relayer (`outbox-relay poll`), batch size 100, one worker.
    Poll { interval_ms: u64 },
    /// Debezium + Kafka Connect standalone on the relay's slot and publication (`debezium.rs`;
    /// `--with-debezium`).
    Debezium(Tuning),
}

/// The tracing dimension of a CDC run (Kafka, 1,000 events/s): what the relay does with W3C
/// trace context. `Off` is the plain CDC row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trace {
    Off,
    /// The rows carry a `traceparent`, `[outbox] trace_column` reads it into a header; no export.
    Traceparent,
    /// As `Traceparent`, and `[tracing]` exports a PRODUCER span per sampled event over
    /// OTLP/HTTP (protobuf) to the benchmark's receiver (`otlp.rs`), sampling `ratio` of them.
    Otlp {
        ratio: f64,
    },
}

impl Trace {
    /// What the row's relay label adds ("CDC + …"); `None` for `Off`.
    pub fn label(self) -> Option<String> {
        match self {
            Trace::Off => None,
            Trace::Traceparent => Some("traceparent".into()),
            Trace::Otlp { ratio } => Some(format!("OTLP {} %", ratio * 100.0)),
        }
    }

    /// The load writes a random valid `traceparent` per row.
    pub fn writes_traceparent(self) -> bool {
        self != Trace::Off
    }

    /// The share of rows whose `traceparent` is sampled: the producing service samples as the
    /// relay's `sampling_ratio` says (a relay follows a valid parent's flag, so writing `01`
    /// everywhere would export every span whatever the ratio); `None`: no `traceparent`.
    pub fn sampled_share(self) -> Option<f64> {
        match self {
            Trace::Off => None,
            Trace::Traceparent => Some(1.0),
            Trace::Otlp { ratio } => Some(ratio),
        }
    }
}

/// Whether a relay's refusal (setup's stderr, run's log) is about `[tracing]`: a relay built
/// before that section exists refuses it as an unknown field, a newer one names its keys.
pub fn refuses_tracing(text: &str) -> bool {
    text.contains("`tracing`") || text.contains("[tracing]") || text.contains("tracing.")
}

impl Mode {
    /// `outbox-relay run`, in either delivery mode.
    pub fn is_cdc(self) -> bool {
        matches!(self, Mode::Cdc | Mode::CdcExactlyOnce | Mode::CdcKafkaTransactions)
    }

    pub fn label(self) -> String {
        match self {
            Mode::Cdc => "CDC".into(),
            Mode::CdcExactlyOnce => "CDC exactly-once".into(),
            Mode::CdcKafkaTransactions => "CDC Kafka transactions".into(),
            Mode::Poll { interval_ms } if interval_ms >= 1000 => format!("poll {} s", interval_ms / 1000),
            Mode::Poll { interval_ms } => format!("poll {interval_ms} ms"),
            Mode::Debezium(Tuning::Defaults) => "Debezium (defaults)".into(),
            Mode::Debezium(Tuning::Latency) => "Debezium (poll 10 ms)".into(),
        }
    }

    /// Reads the slot (`outbox-relay run` or Debezium); `setup` without `--poll` prepares it.
    pub fn streams(self) -> bool {
        matches!(
            self,
            Mode::Cdc | Mode::CdcExactlyOnce | Mode::CdcKafkaTransactions | Mode::Debezium(_)
        )
    }
}

pub struct RelayConf<'a> {
    pub url: &'a str,
    pub slot: &'a str,
    pub bootstrap: &'a str,
    pub mode: Mode,
    /// `[http] listen` port for the relay's `/latency` (exact commit-to-ack window).
    pub metrics_port: Option<u16>,
    pub status_interval_ms: u64,
    /// Extra `[kafka]` properties (`--kafka KEY=VALUE`), the same for every relay.
    pub kafka: &'a [(String, String)],
    /// Prepended to every topic (`[route] topic_replacement`), so relays on the same rows can
    /// write topics of their own; `""`: the route-by value itself.
    pub topic_prefix: &'a str,
    /// The broker when not Kafka (`[sink]` and its section instead of `[kafka]`).
    pub sink: Option<&'a SinkTarget>,
    pub trace: Trace,
    /// The receiver's `http://127.0.0.1:<port>` for `Trace::Otlp`.
    pub otlp_endpoint: Option<&'a str>,
}

impl RelayConf<'_> {
    fn render(&self) -> String {
        let sink = match self.sink {
            Some(target) => target.relay_sections(),
            None => {
                let mut kafka: String = self.kafka.iter().map(|(k, v)| format!("\"{k}\" = \"{v}\"\n")).collect();
                if self.mode == Mode::CdcKafkaTransactions {
                    // One id per slot: the relays of one run never fence each other.
                    kafka.push_str(&format!(
                        "\"transactional.id\" = \"{}\"\nexactly_once = \"transactions\"\n",
                        self.slot
                    ));
                }
                format!("[kafka]\n\"bootstrap.servers\" = \"{}\"\n{kafka}", self.bootstrap)
            }
        };
        let mut toml = format!(
            "[postgres]\nurl = \"{}\"\nslot = \"{}\"\npublication = \"{}\"\n\n\
             [outbox]\ntable = \"public.events_outbox\"\ntimestamp_column = \"created_at\"\n\n\
             {sink}\n\
             [relay]\nstatus_interval_ms = {}\n\n\
             [poll]\nbatch_size = 100\nworkers = 1\ndispatched_column = \"dispatched_at\"\n",
            self.url, self.slot, self.slot, self.status_interval_ms
        );
        let suffix = self.sink.map_or("", |t| t.suffix.as_str());
        if !self.topic_prefix.is_empty() || !suffix.is_empty() {
            toml.push_str(&format!(
                "\n[route]\ntopic_replacement = \"{}${{routedByValue}}{suffix}\"\n",
                self.topic_prefix
            ));
        }
        match self.mode {
            Mode::CdcExactlyOnce => toml = toml.replace("[relay]\n", "[relay]\ndelivery = \"exactly-once\"\n"),
            Mode::CdcKafkaTransactions => toml = toml.replace("[relay]\n", "[relay]\ndelivery = \"exactly-once\"\n"),
            _ => {}
        }
        if let Mode::Poll { interval_ms } = self.mode {
            toml.push_str(&format!("interval_ms = {interval_ms}\n"));
        }
        if let Some(port) = self.metrics_port {
            toml.push_str(&format!("\n[http]\nlisten = \"127.0.0.1:{port}\"\n"));
        }
        if self.trace.writes_traceparent() {
            toml = toml.replace("[outbox]\n", "[outbox]\ntrace_column = \"traceparent\"\n");
        }
        if let (Trace::Otlp { ratio }, Some(endpoint)) = (self.trace, self.otlp_endpoint) {
            toml.push_str(&format!(
                "\n[tracing]\notlp_endpoint = \"{endpoint}\"\nprotocol = \"http/protobuf\"\nsampling_ratio = {ratio:?}\n"
            ));
        }
        toml
    }

    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(format!("{}.toml", self.slot));
        fs::write(&path, self.render())?;
        Ok(path)
    }
}

/// `outbox-relay setup` (or `setup --poll`), bounded.
pub fn setup(config: &Path, poll: bool) -> Result<()> {
    let mut cmd = Command::new(relay_bin());
    cmd.arg("setup").arg("--config").arg(config);
    if poll {
        cmd.arg("--poll");
    }
    let out = cmd
        .envs(super::emulators::relay_env())
        .env("RUST_LOG", "warn")
        .output()
        .context("running outbox-relay setup")?;
    if !out.status.success() {
        bail!("outbox-relay setup failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub struct RelayChild {
    child: Child,
    log: PathBuf,
}

impl RelayChild {
    /// Starts `run` (CDC) or `poll` and waits until it reports that it is streaming/polling.
    pub async fn start(config: &Path, mode: Mode) -> Result<RelayChild> {
        let log = config.with_extension("log");
        let file = fs::File::create(&log)?;
        let subcommand = match mode {
            Mode::Cdc | Mode::CdcExactlyOnce | Mode::CdcKafkaTransactions => "run",
            Mode::Poll { .. } => "poll",
            Mode::Debezium(_) => bail!("{} is not a relay", mode.label()),
        };
        // For profiling: BENCH_RELAY_WRAPPER="valgrind --tool=callgrind" runs the relay under it.
        let wrapper = std::env::var("BENCH_RELAY_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(relay_bin());
                c
            }
            None => Command::new(relay_bin()),
        };
        let child = command
            .arg(subcommand)
            .arg("--config")
            .arg(config)
            .envs(super::emulators::relay_env())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting the relay")?;
        let mut relay = RelayChild { child, log };
        let ready = if mode.is_cdc() {
            "streaming started"
        } else {
            "polling started"
        };
        let deadline = Instant::now() + Duration::from_secs(if wrapper.is_empty() { 30 } else { 300 });
        while !relay.log_text().contains(ready) {
            // An exit at start (a refused configuration) is reported now, not at the deadline.
            if let Some(status) = relay.child.try_wait()? {
                bail!(
                    "the relay exited at start with {status}; log:\n{}",
                    tail(&relay.log_text())
                );
            }
            if Instant::now() >= deadline {
                bail!("the relay did not start in time; log:\n{}", relay.log_text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(relay)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error with the relay's exit status and log tail once it has exited (a fatal error:
    /// a missing destination, a refused event), so a wait on its progress ends now rather than
    /// at the wait's limit.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("the relay exited with {status}; log:\n{}", tail(&self.log_text())),
            None => Ok(()),
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait (bounded) for the exit; SIGKILL past that.
    pub async fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill").arg("-TERM").arg(self.pid().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("the relay exited with {status}; log:\n{}", tail(&self.log_text()));
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the relay did not stop within 40 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(4000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    &text[start..]
}

pub use crate::latency_window::latency_window;
