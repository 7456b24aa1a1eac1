//! The local servers of the cloud sinks (`--sinks pubsub,sqs,sns,kinesis`): Google's Pub/Sub
//! emulator and moto in server mode (Amazon SQS, SNS and Kinesis, one server for the three), each started by the benchmark on a free loopback port for the
//! whole run — or, when `PUBSUB_EMULATOR_HOST` (host:port) / `BENCH_MOTO_URL` (`http://host:port`)
//! is set, the server found there, which the benchmark neither starts nor stops.
//!
//! Both are single-process development servers (a JVM, a Python WSGI server): what the relay
//! achieves against them is bounded by the server, not by the relay, so their rows are emulator
//! figures (docs/benchmarks.md). A started server is tied to the benchmark by a watchdog (killed
//! when the benchmark dies), and stopped by [`stop_all`] at the end of a run.
//!
//! Invariant: every relay the benchmark starts gets [`relay_env`]: the emulator's address in
//! `PUBSUB_EMULATOR_HOST` (Google's convention; the Pub/Sub sink has no endpoint key) and test
//! credentials for moto (it accepts any; the endpoint itself is in the sink's `endpoint_url`), so
//! nothing the benchmark runs reaches a real cloud account.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::sinks::Sink;

/// The project the Pub/Sub relays publish into (the emulator accepts any id).
pub const PUBSUB_PROJECT: &str = "outbox-relay-bench";
/// The region of the AWS relays and clients (moto accepts any).
pub const AWS_REGION: &str = "us-east-1";
/// Credentials for moto (it accepts any; never real ones).
const AWS_TEST_KEY: &str = "testing";

/// Where the Debian package `google-cloud-cli-pubsub-emulator` installs the emulator
/// (`scripts/ensure-pubsub-emulator.sh`); `PUBSUB_EMULATOR_BIN` overrides it.
const PUBSUB_EMULATOR_BIN: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";
/// How long a started server may take to answer (a JVM on a busy machine).
const START_LIMIT: Duration = Duration::from_secs(90);

/// One server of a cloud sink: its address and, when the benchmark started it, the process.
pub struct LocalServer {
    /// `host:port`.
    pub host: String,
    pub port: u16,
    /// Started by the benchmark: the server and its watchdog (`None`: given by the environment).
    processes: Mutex<Option<(Child, Child)>>,
}

impl LocalServer {
    /// `http://host:port`: the REST (Pub/Sub) or query API (SQS) base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.host)
    }

    /// Whether the benchmark started it (the report says which).
    pub fn started(&self) -> bool {
        self.processes.lock().is_ok_and(|p| p.is_some())
    }

    fn stop(&self) {
        if let Some((mut server, mut watchdog)) = self.processes.lock().ok().and_then(|mut p| p.take()) {
            let _ = server.kill();
            let _ = server.wait();
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

static PUBSUB: OnceLock<LocalServer> = OnceLock::new();
static MOTO: OnceLock<LocalServer> = OnceLock::new();

fn slot(sink: Sink) -> Option<&'static OnceLock<LocalServer>> {
    match sink {
        Sink::PubSub => Some(&PUBSUB),
        // moto serves SQS, SNS and Kinesis on one server.
        Sink::Sqs | Sink::Sns | Sink::Kinesis => Some(&MOTO),
        _ => None,
    }
}

/// The server of `sink` once [`ensure`] found or started it.
pub fn server(sink: Sink) -> Option<&'static LocalServer> {
    slot(sink).and_then(OnceLock::get)
}

/// Finds (environment) or starts the server of `sink`; a no-op for the other sinks and when it
/// runs already.
pub fn ensure(sink: Sink) -> Result<()> {
    let Some(slot) = slot(sink) else { return Ok(()) };
    if slot.get().is_some() {
        return Ok(());
    }
    let server = match sink {
        Sink::PubSub => match std::env::var("PUBSUB_EMULATOR_HOST") {
            Ok(host) if !host.trim().is_empty() => given(host.trim()),
            _ => start_pubsub()?,
        },
        Sink::Sqs | Sink::Sns | Sink::Kinesis => match std::env::var("BENCH_MOTO_URL") {
            Ok(url) if !url.trim().is_empty() => given(url.trim().trim_start_matches("http://").trim_end_matches('/')),
            _ => start_moto()?,
        },
        _ => return Ok(()),
    };
    let _ = slot.set(server);
    Ok(())
}

/// Stops the servers the benchmark started (the end of a run, success or not).
pub fn stop_all() {
    for s in [&PUBSUB, &MOTO] {
        if let Some(server) = s.get() {
            server.stop();
        }
    }
}

/// The environment of every relay process: see the module's invariant.
pub fn relay_env() -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(p) = PUBSUB.get() {
        env.push(("PUBSUB_EMULATOR_HOST", p.host.clone()));
    }
    if MOTO.get().is_some() {
        env.push(("AWS_ACCESS_KEY_ID", AWS_TEST_KEY.to_owned()));
        env.push(("AWS_SECRET_ACCESS_KEY", AWS_TEST_KEY.to_owned()));
    }
    env
}

fn given(host: &str) -> LocalServer {
    let port = host.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
    LocalServer {
        host: host.to_owned(),
        port,
        processes: Mutex::new(None),
    }
}

fn log_path(name: &str) -> PathBuf {
    let file: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!("outbox-relay-bench-{file}-{}.log", std::process::id()))
}

/// Kills `child` when this process is gone (a benchmark killed outright leaves no server).
fn watchdog(child: u32) -> Result<Child> {
    Command::new("sh")
        .arg("-c")
        .arg(
            "P=$1; C=$2\nwhile [ -d /proc/$P ] && [ -d /proc/$C ]; do sleep 0.5; done\n\
             if [ ! -d /proc/$P ] && [ -d /proc/$C ]; then kill -KILL $C 2>/dev/null; fi",
        )
        .arg("watchdog")
        .arg(std::process::id().to_string())
        .arg(child.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the server's watchdog")
}

/// Starts `command` on a free port (up to five ports: another process may take one first) and
/// waits until `ready(log text, port)` says it serves.
fn start(name: &str, command: impl Fn(u16) -> Command, ready: impl Fn(&str, u16) -> bool) -> Result<LocalServer> {
    let log = log_path(name);
    for _ in 0..5 {
        let port = super::pg::free_port();
        let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = command(port)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting the {name}"))?;
        let mut guard = watchdog(child.id())?;
        let deadline = Instant::now() + START_LIMIT;
        let mut up = false;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if ready(&text, port) && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                up = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if up {
            return Ok(LocalServer {
                host: format!("127.0.0.1:{port}"),
                port,
                processes: Mutex::new(Some((child, guard))),
            });
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = guard.kill();
        let _ = guard.wait();
    }
    bail!(
        "the {name} did not start on a free port in 5 attempts; its log: {}",
        log.display()
    )
}

fn start_pubsub() -> Result<LocalServer> {
    let bin = std::env::var("PUBSUB_EMULATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(PUBSUB_EMULATOR_BIN));
    if !bin.is_file() {
        bail!(
            "the Pub/Sub emulator is not installed ({}): run scripts/ensure-pubsub-emulator.sh, or give a running one \
             with PUBSUB_EMULATOR_HOST=host:port",
            bin.display()
        );
    }
    start(
        "Pub/Sub emulator",
        |port| {
            let mut c = Command::new(&bin);
            c.arg("--host=127.0.0.1")
                .arg(format!("--port={port}"))
                .env("CLOUD_PUBSUB_EMULATOR_OPTS", "-Xmx768m");
            c
        },
        |log, port| log.contains(&format!("listening on {port}")),
    )
}

/// `moto_server` from the venv of `scripts/ensure-moto.sh`.
fn moto_binary() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let bin = cache.join("outbox-relay/venv-moto/bin/moto_server");
    bin.is_file().then_some(bin)
}

/// moto's version, from its venv's package metadata.
pub fn moto_version() -> Option<String> {
    let lib = moto_binary()?.parent()?.parent()?.join("lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|python| {
        std::fs::read_dir(python.path().join("site-packages"))
            .ok()?
            .flatten()
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("moto-")?
                    .strip_suffix(".dist-info")
                    .map(str::to_owned)
            })
    })
}

fn start_moto() -> Result<LocalServer> {
    let Some(bin) = moto_binary() else {
        bail!(
            "moto is not installed (~/.cache/outbox-relay/venv-moto/bin/moto_server): run scripts/ensure-moto.sh, or \
             give a running moto with BENCH_MOTO_URL=http://host:port"
        );
    };
    start(
        "moto server",
        |port| {
            let mut c = Command::new(&bin);
            c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            c
        },
        |log, port| log.contains(&format!("127.0.0.1:{port}")),
    )
}

/// A plain HTTP client for the Pub/Sub emulator's REST API (loopback, no proxy).
pub fn pubsub_http() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// `<emulator>/v1/projects/<project>/<path>`.
pub fn pubsub_url(path: &str) -> Result<String> {
    let server = server(Sink::PubSub).context("the Pub/Sub emulator was not started")?;
    Ok(format!("{}/v1/projects/{PUBSUB_PROJECT}/{path}", server.url()))
}

/// The AWS SDK configuration of the benchmark's moto (SQS, SNS and Kinesis alike): its endpoint,
/// the region, the test credentials, rustls with ring like the relay.
fn moto_config() -> Result<aws_config::SdkConfig> {
    let server = MOTO.get().context("moto was not started")?;
    Ok(aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(AWS_REGION))
        .endpoint_url(server.url())
        .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
            aws_credential_types::Credentials::new(AWS_TEST_KEY, AWS_TEST_KEY, None, None, "bench"),
        ))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build())
}

/// An SQS client of the benchmark's moto with the test credentials.
pub fn sqs_client() -> Result<aws_sdk_sqs::Client> {
    Ok(aws_sdk_sqs::Client::new(&moto_config()?))
}

/// An SNS client of the benchmark's moto.
pub fn sns_client() -> Result<aws_sdk_sns::Client> {
    Ok(aws_sdk_sns::Client::new(&moto_config()?))
}

/// A Kinesis client of the benchmark's moto.
pub fn kinesis_client() -> Result<aws_sdk_kinesis::Client> {
    Ok(aws_sdk_kinesis::Client::new(&moto_config()?))
}
