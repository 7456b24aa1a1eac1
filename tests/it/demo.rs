//! `outbox-relay demo`: the one-command newcomer path works, and nothing it started outlives it —
//! whether it ends by `--duration`, by Ctrl-C, or is killed outright.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::process::{send_signal, wait_child, Watchdog};
use crate::harness::{wait_until, RELAY_BIN};

/// Generous: the demo starts a cluster (initdb) and a debug-build relay on a shared machine.
const DEMO_TIMEOUT: Duration = Duration::from_secs(240);

struct Demo {
    child: Child,
    _watchdog: Watchdog,
    dir: tempfile::TempDir,
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(RELAY_BIN);
        // Its own process group, like a job in a terminal, so a test can send "Ctrl-C" to the group.
        child.process_group(0);
        child
            .arg("demo")
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.path().join("stdout")).expect("stdout file"))
            .stderr(fs::File::create(dir.path().join("stderr")).expect("stderr file"));
        let child = child.spawn().expect("spawn outbox-relay demo");
        let watchdog = Watchdog::guard(child.id());
        Demo {
            child,
            _watchdog: watchdog,
            dir,
        }
    }

    fn stdout(&self) -> String {
        fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    async fn wait_for_stderr(&self, needle: &str) -> bool {
        wait_until(DEMO_TIMEOUT, Duration::from_millis(100), || async {
            self.stderr().contains(needle)
        })
        .await
    }

    /// [`finish`](Self::finish), which must be a success; what the demo printed on stdout.
    async fn finish_ok(&mut self) -> String {
        let status = self.finish().await;
        let stdout = self.stdout();
        assert!(
            status.success(),
            "demo failed ({status}); stdout:\n{stdout}\nstderr:\n{}",
            self.stderr()
        );
        stdout
    }

    async fn finish(&mut self) -> std::process::ExitStatus {
        match wait_child(&mut self.child, DEMO_TIMEOUT).await {
            Some(status) => status,
            None => {
                let _ = self.child.kill();
                panic!(
                    "demo did not finish within {DEMO_TIMEOUT:?}; stderr:\n{}",
                    self.stderr()
                );
            }
        }
    }

    /// The throwaway cluster's directory, from the demo's "PostgreSQL is up" line.
    fn cluster_dir(&self) -> PathBuf {
        let text = self.stderr();
        let line = text
            .lines()
            .find(|l| l.contains("cluster directory"))
            .expect("cluster directory line");
        let dir = line.rsplit("cluster directory ").next().unwrap().trim_end_matches(')');
        PathBuf::from(dir)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose command line mentions `dir` (the postmaster runs with `-D <dir>/data`; its
/// watchdog script gets the directory as an argument).
fn processes_using(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !entry.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&needle) {
                found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

async fn assert_cleaned_up(dir: &Path) {
    let gone = wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
        !dir.exists() && processes_using(dir).is_empty()
    })
    .await;
    assert!(
        gone,
        "left behind: directory exists = {}, processes = {:?}",
        dir.exists(),
        processes_using(dir)
    );
}

fn summary_number(stdout: &str, label: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("{label} line in:\n{stdout}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("number in {line:?}"))
}

/// The duplicate count of the summary's "consumed" line.
fn duplicates(stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("consumed"))
        .expect("consumed line");
    let part = line.split(", ").nth(1).expect("duplicates part");
    part.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("duplicates number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_for_its_duration_and_everything_is_consumed() {
    let mut demo = Demo::start(&["--duration", "5", "--rate", "200"]);
    let status = demo.finish().await;
    let (stdout, stderr) = (demo.stdout(), demo.stderr());
    assert!(
        status.success(),
        "demo failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("result          OK: all"), "summary:\n{stdout}");
    let produced = summary_number(&stdout, "produced");
    // 5 s at 200/s; a loaded machine may fall behind the target rate, but not to nothing.
    assert!(produced >= 100, "only {produced} orders produced:\n{stdout}");
    // At-least-once: a relay reconnect on a loaded machine may publish some events twice.
    assert_eq!(
        summary_number(&stdout, "published"),
        produced + duplicates(&stdout),
        "{stdout}"
    );
    assert_eq!(summary_number(&stdout, "consumed"), produced, "{stdout}");
    assert!(stdout.contains(" 0 missing"), "{stdout}");
    assert!(stdout.contains("p50 ") && stdout.contains("p99 "), "{stdout}");
    assert!(
        stderr.contains("produced") && stderr.contains("| lag "),
        "no progress line:\n{stderr}"
    );
    let dir = demo.cluster_dir();
    assert!(
        stdout.contains(&format!("PostgreSQL stopped and {} removed", dir.display())),
        "{stdout}"
    );
    assert_cleaned_up(&dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_demo_drains_and_cleans_up() {
    let mut demo = Demo::start(&["--rate", "100"]);
    assert!(
        demo.wait_for_stderr("running until Ctrl-C").await,
        "demo did not start:\n{}",
        demo.stderr()
    );
    let dir = demo.cluster_dir();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // What Ctrl-C in a terminal does: SIGINT to the whole foreground process group.
    let group = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", demo.child.id())])
        .status();
    assert!(group.is_ok_and(|s| s.success()), "SIGINT to the demo's process group");
    let stdout = demo.finish_ok().await;
    assert!(stdout.contains("interrupted (Ctrl-C)"), "{stdout}");
    // PostgreSQL (its own process group) outlived the Ctrl-C until the demo stopped it in order:
    // the slot's position could still be read after the drain.
    assert!(!stdout.contains("confirmed up to ?"), "{stdout}");
    assert!(stdout.contains("result          OK: all"), "{stdout}");
    assert!(summary_number(&stdout, "produced") > 0, "{stdout}");
    assert_cleaned_up(&dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_demo_still_leaves_no_postgres_behind() {
    let mut demo = Demo::start(&["--rate", "50"]);
    assert!(
        demo.wait_for_stderr("cluster directory").await,
        "demo did not start:\n{}",
        demo.stderr()
    );
    let dir = demo.cluster_dir();
    assert!(dir.exists());
    assert!(send_signal(demo.child.id(), "KILL"), "SIGKILL");
    let _ = demo.finish().await;
    // No destructor ran: the server's watchdog notices the demo is gone and cleans up.
    assert_cleaned_up(&dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_uses_a_given_broker_and_counts_only_its_own_events() {
    // A real Apache Kafka broker of its own (the demo writes the fixed topic order.placed).
    let Some(kafka) = crate::harness::KafkaCluster::start(crate::harness::ClusterSpec::single()).await else {
        return;
    };
    let bootstrap = kafka.bootstrap_servers();
    // The topic already holds a record from "an earlier run": it must count neither as published
    // nor as consumed.
    crate::harness::produce(
        &bootstrap,
        "order.placed",
        Some(b"old"),
        b"{\"run\": \"old\"}",
        &[("id", b"1")],
    )
    .await;
    let mut demo = Demo::start(&["--duration", "3", "--rate", "100", "--bootstrap", &bootstrap]);
    let stdout = demo.finish_ok().await;
    assert!(
        stdout.contains(&format!("to topic order.placed on {bootstrap}")),
        "{stdout}"
    );
    let produced = summary_number(&stdout, "produced");
    assert!(produced > 0, "{stdout}");
    // Exactly the records this run put there (replays included), not the one that was there before.
    assert_eq!(
        summary_number(&stdout, "published"),
        produced + duplicates(&stdout),
        "{stdout}"
    );
    assert_eq!(summary_number(&stdout, "consumed"), produced, "{stdout}");
    assert_cleaned_up(&demo.cluster_dir()).await;
    // The topic was there before the run: left as it was.
    assert!(
        stdout.contains(&format!("Kafka topic order.placed on {bootstrap} left as it was")),
        "{stdout}"
    );
    assert!(
        topic_exists(&bootstrap, "order.placed"),
        "the earlier topic was removed"
    );

    // Without the topic, the run creates it before publishing (durations take units, as
    // everywhere else) and deletes it at the end, saying so.
    delete_topic(&bootstrap, "order.placed").await;
    let stdout = Demo::start(&["--duration", "3s", "--rate", "100", "--bootstrap", &bootstrap])
        .finish_ok()
        .await;
    assert!(
        stdout.contains(&format!(
            "Kafka topic order.placed on {bootstrap} deleted (the run created it)"
        )),
        "{stdout}"
    );
    assert!(
        !topic_exists(&bootstrap, "order.placed"),
        "the run's topic is left behind: {stdout}"
    );
}

/// Whether the broker lists `topic`.
fn topic_exists(bootstrap: &str, topic: &str) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("broker metadata");
    metadata.topics().iter().any(|t| t.name() == topic)
}

/// Deletes `topic` and waits (bounded) until the broker no longer lists it.
async fn delete_topic(bootstrap: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    admin
        .delete_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("delete the topic");
    let (b, t) = (bootstrap.to_owned(), topic.to_owned());
    let gone = wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
        let (b, t) = (b.clone(), t.clone());
        async move { !tokio::task::spawn_blocking(move || topic_exists(&b, &t)).await.unwrap() }
    })
    .await;
    assert!(gone, "topic {topic} still listed after deletion");
}

/// `demo --sink <sink>` against the broker CI runs on 127.0.0.1: every event consumed, the
/// broker's counts add up, and what the run created on the broker is removed.
async fn demo_with_sink(sink: &str, cleaned: &str) {
    demo_with_sink_at(sink, &[], cleaned).await;
}

/// [`demo_with_sink`] with more arguments (`--sink-url` of a server of the test's own); returns
/// the summary.
async fn demo_with_sink_at(sink: &str, more: &[&str], cleaned: &str) -> String {
    let mut args = vec!["--duration", "3", "--rate", "50", "--sink", sink];
    args.extend_from_slice(more);
    let mut demo = Demo::start(&args);
    let status = demo.finish().await;
    let (stdout, stderr) = (demo.stdout(), demo.stderr());
    assert!(
        status.success(),
        "demo failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("result          OK: all"), "summary:\n{stdout}");
    let produced = summary_number(&stdout, "produced");
    assert!(produced > 0, "{stdout}");
    assert_eq!(
        summary_number(&stdout, "published"),
        produced + duplicates(&stdout),
        "{stdout}"
    );
    assert_eq!(summary_number(&stdout, "consumed"), produced, "{stdout}");
    assert!(stdout.contains(" 0 missing"), "{stdout}");
    assert!(stdout.contains(cleaned), "{stdout}");
    assert_cleaned_up(&demo.cluster_dir()).await;
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_nats_consumes_everything() {
    demo_with_sink("nats", "cleaned up      NATS stream OUTBOX_RELAY_DEMO_").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_rabbitmq_consumes_everything() {
    demo_with_sink("rabbitmq", "cleaned up      RabbitMQ exchange outbox-relay-demo-").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_redis_consumes_everything() {
    demo_with_sink("redis", "cleaned up      Redis stream outbox-relay-demo:").await;
}

/// `demo --sink webhook`: the demo's own receiver gets every event, each signature verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_webhook_consumes_everything_signed() {
    demo_with_sink("webhook", " 0 failed signature verification").await;
}

/// `demo --sink pubsub` on a Pub/Sub emulator of the test's own (`--sink-url host:port`): the
/// topic `setup` made and the demo's subscription are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_pubsub_consumes_everything() {
    let Some(emulator) = crate::harness::pubsub::PubSubEmulator::start("demo_with_pubsub_consumes_everything").await
    else {
        return;
    };
    let host = emulator.host();
    let stdout = demo_with_sink_at("pubsub", &["--sink-url", &host], "Pub/Sub subscription subscriptions/").await;
    assert!(stdout.contains(&format!("the Pub/Sub emulator at {host}")), "{stdout}");
    let topic = stdout
        .lines()
        .find_map(|l| l.split("Pub/Sub topic topics/").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the topic's cleanup line in:\n{stdout}"))
        .to_owned();
    assert!(
        !emulator.topic_exists(&topic).await,
        "topic {topic} left behind:\n{stdout}"
    );
}

/// `demo --sink sqs` on a moto of the test's own (`--sink-url http://127.0.0.1:<port>`): the run's
/// FIFO queue is gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_sqs_consumes_everything() {
    let Some(moto) = crate::harness::moto::Moto::start("demo_with_sqs_consumes_everything").await else {
        return;
    };
    let endpoint = moto.endpoint();
    let stdout = demo_with_sink_at("sqs", &["--sink-url", &endpoint], "SQS queue outbox-relay-demo-").await;
    assert!(stdout.contains(&format!("moto (Amazon SQS) at {endpoint}")), "{stdout}");
    let left = moto.client.list_queues().send().await.expect("ListQueues");
    assert!(
        left.queue_urls().is_empty(),
        "queues left behind: {:?}\n{stdout}",
        left.queue_urls()
    );
}

/// `demo --sink sns` on a moto of the test's own: the run's FIFO topic and its subscribed FIFO
/// queue are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_sns_consumes_everything() {
    let Some(moto) = crate::harness::moto::Moto::start("demo_with_sns_consumes_everything").await else {
        return;
    };
    let endpoint = moto.endpoint();
    let stdout = demo_with_sink_at("sns", &["--sink-url", &endpoint], "SNS topic outbox-relay-demo-").await;
    assert!(stdout.contains(&format!("moto (Amazon SNS) at {endpoint}")), "{stdout}");
    assert!(stdout.contains("SQS queue outbox-relay-demo-"), "{stdout}");
    let topics = crate::harness::moto_sns::sns_client(&endpoint)
        .list_topics()
        .send()
        .await
        .expect("ListTopics");
    assert!(
        topics.topics().is_empty(),
        "topics left behind: {:?}\n{stdout}",
        topics.topics()
    );
    let left = moto.client.list_queues().send().await.expect("ListQueues");
    assert!(
        left.queue_urls().is_empty(),
        "queues left behind: {:?}\n{stdout}",
        left.queue_urls()
    );
}

/// `demo --sink kinesis` on a moto of the test's own: the run's stream is gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_kinesis_consumes_everything() {
    let Some(moto) = crate::harness::moto::Moto::start("demo_with_kinesis_consumes_everything").await else {
        return;
    };
    let endpoint = moto.endpoint();
    let stdout = demo_with_sink_at(
        "kinesis",
        &["--sink-url", &endpoint],
        "Kinesis stream outbox-relay-demo-",
    )
    .await;
    assert!(
        stdout.contains(&format!("moto (Amazon Kinesis) at {endpoint}")),
        "{stdout}"
    );
    let streams = moto.kinesis().list_streams().send().await.expect("ListStreams");
    assert!(
        streams.stream_names().is_empty(),
        "streams left behind: {:?}\n{stdout}",
        streams.stream_names()
    );
}

/// With no emulator or moto at `--sink-url`, the demo stops before it starts anything, saying
/// how to start one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_an_unreachable_local_cloud_server_says_how_to_start_it() {
    // A port nothing listens on: bound, then released.
    let port = crate::harness::util::free_port();
    for (sink, url, how) in [
        (
            "pubsub",
            format!("127.0.0.1:{port}"),
            "gcloud beta emulators pubsub start --host-port=127.0.0.1:8085",
        ),
        (
            "sqs",
            format!("http://127.0.0.1:{port}"),
            "venv-moto/bin/moto_server -p 5000` (after scripts/ensure-moto.sh)",
        ),
        (
            "sns",
            format!("http://127.0.0.1:{port}"),
            "venv-moto/bin/moto_server -p 5000` (after scripts/ensure-moto.sh)",
        ),
        (
            "kinesis",
            format!("http://127.0.0.1:{port}"),
            "venv-moto/bin/moto_server -p 5000` (after scripts/ensure-moto.sh)",
        ),
    ] {
        let mut demo = Demo::start(&["--duration", "3", "--sink", sink, "--sink-url", &url]);
        let status = demo.finish().await;
        let stderr = demo.stderr();
        assert_eq!(status.code(), Some(1), "{sink}: {stderr}");
        assert!(
            stderr.contains(&format!("answers at {url}")) && stderr.contains(how),
            "{sink}: {stderr}"
        );
        // Stopped before anything started: no PostgreSQL was made.
        assert!(!stderr.contains("cluster directory"), "{sink}: {stderr}");
    }
}
