//! The sink as a dimension (`--sinks kafka,nats,rabbitmq,redis,webhook`): the relay publishing to
//! NATS JetStream, RabbitMQ, Redis Streams or an HTTP endpoint instead of Kafka, on the servers
//! already running on this machine (NATS 127.0.0.1:4222 with JetStream, RabbitMQ 127.0.0.1:5672
//! guest/guest, Redis 127.0.0.1:6379), the webhook on a receiver of this process
//! (`webhook.rs`: answers 200 at once, HTTP/1.1 keep-alive).
//!
//! The servers are shared with whatever else runs on the machine, so every run writes to names of
//! its own and removes them afterwards: a JetStream stream `OUTBOX_RELAY_BENCH_<run>_<tag>` with
//! the subjects `obench.<run>.<tag>.>` (the relay's `[route]` prefixes the routed topic with
//! `obench.<run>.<tag>.`), a RabbitMQ topic exchange `outbox-relay-bench-<run>-<tag>` (routing key:
//! the routed topic itself), a Redis stream key `outbox-relay-bench:<run>:<tag>:<topic>`. `setup`
//! creates the stream and declares the exchange, as for a user.
//!
//! The cloud sinks run against local development servers the benchmark starts itself
//! (`emulators.rs`): Google Cloud Pub/Sub on Google's emulator (a topic `obench-<run>-<tag>.<topic>`
//! and an ordered subscription on it, made before the relay publishes), Amazon SQS on moto (a FIFO
//! queue `obench-<run>-<tag>-<topic>.fifo`, the queue type docs/sink-sqs.md recommends), Amazon
//! SNS on the same moto (a FIFO topic `obench-<run>-<tag>-<topic>.fifo` and a FIFO queue of the
//! same name subscribed with raw message delivery, read like SQS's), Amazon Kinesis on the same
//! moto (a stream `obench-<run>-<tag>-<topic>` of `KINESIS_SHARDS` shards). Their figures are the
//! emulator's as much as the relay's (`Sink::emulated`).

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use lapin::options::ExchangeDeleteOptions;
use lapin::{Connection, ConnectionProperties};

use super::consumer::TopicConsumer;
use super::emulators::{self, PUBSUB_PROJECT};
use super::sink_consumer::AsyncSource;

pub const NATS_URL: &str = "nats://127.0.0.1:4222";
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub use super::webhook::Receiver as WebhookReceiver;

/// The shards of a benchmark's Kinesis stream: more than one, so the consumer reads several
/// shards as a Kinesis consumer does (an aggregate's records stay on one shard).
pub const KINESIS_SHARDS: i32 = 2;

/// One call to a broker (connect, create, delete, count) takes at most this long.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Kafka,
    Nats,
    RabbitMq,
    Redis,
    Webhook,
    PubSub,
    Sqs,
    Sns,
    Kinesis,
}

impl Sink {
    /// Every sink `--sinks` knows.
    pub const ALL: [Sink; 9] = [
        Sink::Kafka,
        Sink::Nats,
        Sink::RabbitMq,
        Sink::Redis,
        Sink::Webhook,
        Sink::PubSub,
        Sink::Sqs,
        Sink::Sns,
        Sink::Kinesis,
    ];
    /// Without `--sinks`: the brokers of this machine and the webhook; the emulated cloud sinks
    /// are asked for by name (their rows measure the emulator, and take minutes each).
    pub const DEFAULT: [Sink; 5] = [Sink::Kafka, Sink::Nats, Sink::RabbitMq, Sink::Redis, Sink::Webhook];

    /// `[sink] kind`, and the word of `--sinks`.
    pub fn word(self) -> &'static str {
        match self {
            Sink::Kafka => "kafka",
            Sink::Nats => "nats",
            Sink::RabbitMq => "rabbitmq",
            Sink::Redis => "redis",
            Sink::Webhook => "webhook",
            Sink::PubSub => "pubsub",
            Sink::Sqs => "sqs",
            Sink::Sns => "sns",
            Sink::Kinesis => "kinesis",
        }
    }

    /// For people: tables and messages.
    pub fn name(self) -> &'static str {
        match self {
            Sink::Kafka => "Kafka",
            Sink::Nats => "NATS JetStream",
            Sink::RabbitMq => "RabbitMQ",
            Sink::Redis => "Redis Streams",
            Sink::Webhook => "HTTP webhook",
            Sink::PubSub => "Google Cloud Pub/Sub (emulator)",
            Sink::Sqs => "Amazon SQS FIFO (moto)",
            Sink::Sns => "Amazon SNS FIFO → SQS FIFO (moto)",
            Sink::Kinesis => "Amazon Kinesis (moto)",
        }
    }

    /// Whether the server is a local stand-in for a cloud service (a single-process development
    /// server): its rows bound the relay's rate by the emulator's, and the report says so.
    pub fn emulated(self) -> bool {
        matches!(self, Sink::PubSub | Sink::Sqs | Sink::Sns | Sink::Kinesis)
    }

    /// Whether the drain's check reads during the drain rather than after it: an exchange and an
    /// endpoint keep nothing, a Pub/Sub subscription keeps only what arrives after it was made
    /// (and moto's FIFO receive slows down with the queue's length, so SQS — and SNS's subscribed
    /// queue — is read as it fills). A Kinesis stream keeps everything: read after the drain.
    pub fn read_during_drain(self) -> bool {
        matches!(
            self,
            Sink::RabbitMq | Sink::Webhook | Sink::PubSub | Sink::Sqs | Sink::Sns
        )
    }

    /// `--sinks` text: comma-separated words, each at most once.
    pub fn parse_list(text: &str) -> Result<Vec<Sink>> {
        let mut out = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let sink = Sink::ALL.into_iter().find(|s| s.word() == word).with_context(|| {
                let words: Vec<&str> = Sink::ALL.iter().map(|s| s.word()).collect();
                format!("--sinks: unknown sink {word:?}; use some of {}", words.join(","))
            })?;
            if !out.contains(&sink) {
                out.push(sink);
            }
        }
        Ok(out)
    }

    fn url(self) -> String {
        match self {
            Sink::Kafka | Sink::Webhook => String::new(),
            Sink::Nats => NATS_URL.to_owned(),
            Sink::RabbitMq => RABBITMQ_URL.to_owned(),
            Sink::Redis => REDIS_URL.to_owned(),
            Sink::PubSub | Sink::Sqs | Sink::Sns | Sink::Kinesis => {
                emulators::server(self).map_or_else(|| "a free loopback port".to_owned(), |s| s.url())
            }
        }
    }

    /// The server's port on 127.0.0.1 (its process is found through it, for its CPU).
    pub fn port(self) -> Option<u16> {
        match self {
            Sink::Kafka | Sink::Webhook => None,
            Sink::Nats => Some(4222),
            Sink::RabbitMq => Some(5672),
            Sink::Redis => Some(6379),
            Sink::PubSub | Sink::Sqs | Sink::Sns | Sink::Kinesis => emulators::server(self).map(|s| s.port),
        }
    }

    fn how_to_start(self) -> &'static str {
        match self {
            Sink::Kafka | Sink::Webhook => "",
            Sink::Nats => "`nats-server -js -a 127.0.0.1 -p 4222` (JetStream on)",
            Sink::RabbitMq => "`rabbitmq-server` (user guest/guest on 127.0.0.1:5672)",
            Sink::Redis => "`redis-server --bind 127.0.0.1 --port 6379`",
            Sink::PubSub => {
                "scripts/ensure-pubsub-emulator.sh (the benchmark starts the emulator itself; or set \
                 PUBSUB_EMULATOR_HOST to a running one)"
            }
            Sink::Sqs | Sink::Sns | Sink::Kinesis => {
                "scripts/ensure-moto.sh (the benchmark starts moto_server itself; or set BENCH_MOTO_URL to a running \
                 one)"
            }
        }
    }

    /// The broker server's process (for its CPU), when it can be told.
    pub fn broker_pid(self) -> Option<u32> {
        self.port().and_then(super::procfs::listener_pid)
    }
}

/// `f`, bounded by [`BROKER_TIMEOUT`], its error naming the broker and what was being done.
pub async fn bounded<T, E: std::fmt::Display>(
    broker: &str,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(BROKER_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| anyhow!("{broker}, {what}: {e}")),
        Err(_) => Err(anyhow!("{broker}, {what}: no answer within {BROKER_TIMEOUT:?}")),
    }
}

pub async fn rabbitmq_connection(name: &str) -> Result<Connection> {
    let properties = ConnectionProperties::default()
        .with_connection_name(name.into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    bounded("RabbitMQ", "connecting", Connection::connect(RABBITMQ_URL, properties)).await
}

pub async fn redis_connection() -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(REDIS_URL)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(BROKER_TIMEOUT))
        .set_response_timeout(Some(BROKER_TIMEOUT));
    bounded(
        "Redis",
        "connecting",
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
}

pub async fn nats_jetstream() -> Result<async_nats::jetstream::Context> {
    let client = bounded(
        "NATS",
        "connecting",
        async_nats::ConnectOptions::new()
            .connection_timeout(BROKER_TIMEOUT)
            .connect(NATS_URL),
    )
    .await?;
    Ok(async_nats::jetstream::new(client))
}

/// Fails, before anything is measured, when a requested broker does not answer; otherwise
/// describes each non-Kafka broker (name, version, where).
pub async fn check_reachable(sinks: &[Sink]) -> Result<Vec<String>> {
    let mut described = Vec::new();
    for &sink in sinks {
        let outcome: Result<String> = match sink {
            Sink::Kafka => continue,
            Sink::Webhook => Ok(
                "HTTP webhook: a receiver in the benchmark process (hyper, HTTP/1.1 keep-alive, \
                                 answers 200 at once; no signing secret)"
                    .to_owned(),
            ),
            Sink::Nats => {
                async {
                    let js = nats_jetstream().await?;
                    // A stream that does not exist: JetStream answers "not found"; without
                    // JetStream nothing answers ("no responders").
                    match tokio::time::timeout(BROKER_TIMEOUT, js.get_stream("OUTBOX_RELAY_BENCH_PROBE")).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) if e.to_string().contains("not found") => {}
                        Ok(Err(e)) => bail!("JetStream did not answer: {e}; is it enabled (`-js`)?"),
                        Err(_) => bail!("JetStream did not answer within {BROKER_TIMEOUT:?}; is it enabled (`-js`)?"),
                    }
                    Ok(format!(
                        "NATS server {} with JetStream (streams created by `setup`: file storage)",
                        js.client().server_info().version
                    ))
                }
                .await
            }
            Sink::RabbitMq => {
                async {
                    let c = rabbitmq_connection("outbox-relay-bench-check").await?;
                    let _ = tokio::time::timeout(BROKER_TIMEOUT, c.close(200, "checked")).await;
                    let version = std::fs::read_dir("/usr/lib/rabbitmq/lib")
                        .ok()
                        .and_then(|d| {
                            d.filter_map(|e| {
                                e.ok()?
                                    .file_name()
                                    .to_str()?
                                    .strip_prefix("rabbitmq_server-")
                                    .map(str::to_owned)
                            })
                            .next()
                        })
                        .unwrap_or_else(|| "(version unknown)".into());
                    Ok(format!(
                        "RabbitMQ {version} (publisher confirms; the consumer's queue exclusive, not durable)"
                    ))
                }
                .await
            }
            Sink::PubSub | Sink::Sqs | Sink::Sns | Sink::Kinesis => {
                async {
                    tokio::task::spawn_blocking(move || emulators::ensure(sink)).await??;
                    describe_emulator(sink).await
                }
                .await
            }
            Sink::Redis => {
                async {
                    let mut c = redis_connection().await?;
                    let info = bounded(
                        "Redis",
                        "INFO server",
                        redis::cmd("INFO").arg("server").query_async::<String>(&mut c),
                    )
                    .await?;
                    let version = info
                        .lines()
                        .find_map(|l| l.strip_prefix("redis_version:"))
                        .unwrap_or("(version unknown)")
                        .trim()
                        .to_owned();
                    let mut c2 = redis_connection().await?;
                    let aof = bounded(
                        "Redis",
                        "CONFIG GET appendonly",
                        redis::cmd("CONFIG")
                            .arg("GET")
                            .arg("appendonly")
                            .query_async::<Vec<String>>(&mut c2),
                    )
                    .await
                    .ok()
                    .and_then(|v| v.get(1).cloned())
                    .unwrap_or_else(|| "unknown".into());
                    Ok(format!("Redis {version} (appendonly {aof})"))
                }
                .await
            }
        };
        match outcome {
            Ok(d) => described.push(d),
            Err(e) => {
                bail!(
                "--sinks asks for {} but it is not reachable at {} ({e:#}): start it with {}, or leave `{}` out of \
                 --sinks (e.g. --sinks kafka)",
                sink.name(),
                sink.url().replace("guest:guest@", ""),
                    sink.how_to_start(),
                    sink.word()
                );
            }
        }
    }
    Ok(described)
}

/// Checks that the started (or given) emulator answers, and describes it for the report.
async fn describe_emulator(sink: Sink) -> Result<String> {
    let server = emulators::server(sink).context("not started")?;
    let how = if server.started() {
        format!("started by the benchmark on {}", server.host)
    } else {
        format!("given at {}", server.host)
    };
    match sink {
        Sink::PubSub => {
            let http = emulators::pubsub_http()?;
            let r = bounded(
                "Pub/Sub emulator",
                "listing topics",
                http.get(emulators::pubsub_url("topics")?).send(),
            )
            .await?;
            if !r.status().is_success() {
                bail!("the Pub/Sub emulator answered {} to a topic list", r.status());
            }
            let version = std::process::Command::new("dpkg-query")
                .args(["-W", "-f=${Version}", "google-cloud-cli-pubsub-emulator"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_else(|| "(version unknown)".into());
            Ok(format!(
                "Google Cloud Pub/Sub emulator {version} ({how}; one JVM, -Xmx768m, in memory; topics made per run, \
                 ordered subscriptions pulled over REST)"
            ))
        }
        Sink::Sqs => {
            let client = emulators::sqs_client()?;
            bounded("moto", "ListQueues", client.list_queues().send()).await?;
            Ok(format!(
                "moto {} in server mode for Amazon SQS ({how}; one Python process, in memory; a FIFO queue per run)",
                emulators::moto_version().unwrap_or_else(|| "(version unknown)".into())
            ))
        }
        Sink::Sns => {
            let client = emulators::sns_client()?;
            bounded("moto", "ListTopics", client.list_topics().send()).await?;
            Ok(format!(
                "moto {} in server mode for Amazon SNS ({how}; one Python process, in memory; a FIFO topic per run, \
                 a FIFO queue subscribed with raw message delivery, read like SQS's)",
                emulators::moto_version().unwrap_or_else(|| "(version unknown)".into())
            ))
        }
        Sink::Kinesis => {
            let client = emulators::kinesis_client()?;
            bounded("moto", "ListStreams", client.list_streams().send()).await?;
            Ok(format!(
                "moto {} in server mode for Amazon Kinesis ({how}; one Python process, in memory; a stream of \
                 {KINESIS_SHARDS} shards per run, every shard polled with GetRecords)",
                emulators::moto_version().unwrap_or_else(|| "(version unknown)".into())
            ))
        }
        _ => Ok(String::new()),
    }
}

/// Where one run of the relay publishes on a non-Kafka broker: names of its own on the shared
/// server (see the module docs).
#[derive(Debug, Clone)]
pub struct SinkTarget {
    pub sink: Sink,
    /// NATS: the stream; RabbitMQ: the exchange; Redis: unused.
    pub container: String,
    /// Put before the routed topic by the relay's `[route]` (NATS subject, Redis key).
    pub prefix: String,
    /// Put after it (an SQS FIFO queue's `.fifo`).
    pub suffix: String,
    /// The webhook's receiver (the other sinks: `None`).
    pub receiver: Option<std::sync::Arc<WebhookReceiver>>,
}

impl SinkTarget {
    /// `None` for Kafka (its topics are made per run already). `run`: this benchmark run's id;
    /// `tag`: the run within it.
    pub fn new(sink: Sink, run: &str, tag: &str) -> Option<SinkTarget> {
        let (container, prefix, suffix) = match sink {
            Sink::Kafka => return None,
            // Pub/Sub topic ids and SQS queue names: letters, digits, `-` (and `.` / `_`).
            Sink::PubSub => (String::new(), format!("obench-{run}-{tag}."), String::new()),
            // SNS FIFO topics as SQS FIFO queues (the subscribed queue has the topic's name).
            Sink::Sqs | Sink::Sns => (String::new(), format!("obench-{run}-{tag}-"), ".fifo".to_owned()),
            Sink::Kinesis => (String::new(), format!("obench-{run}-{tag}-"), String::new()),
            Sink::Nats => (
                format!("OUTBOX_RELAY_BENCH_{run}_{tag}"),
                format!("obench.{run}.{tag}."),
                String::new(),
            ),
            Sink::RabbitMq => (format!("outbox-relay-bench-{run}-{tag}"), String::new(), String::new()),
            Sink::Redis => (String::new(), format!("outbox-relay-bench:{run}:{tag}:"), String::new()),
            Sink::Webhook => (String::new(), String::new(), String::new()),
        };
        let receiver = if sink == Sink::Webhook {
            match WebhookReceiver::start() {
                Ok(r) => Some(std::sync::Arc::new(r)),
                Err(e) => {
                    eprintln!("cannot start the webhook receiver: {e:#}");
                    return None;
                }
            }
        } else {
            None
        };
        Some(SinkTarget {
            sink,
            container,
            prefix,
            suffix,
            receiver,
        })
    }

    /// Where the events of `topic` (the routed value) land: subject, routing key, stream key,
    /// Pub/Sub topic id, SQS queue name, SNS topic name, Kinesis stream name.
    pub fn destination(&self, topic: &str) -> String {
        format!("{}{topic}{}", self.prefix, self.suffix)
    }

    /// The relay's `[sink]` and broker section.
    pub fn relay_sections(&self) -> String {
        match self.sink {
            Sink::Kafka => String::new(),
            Sink::Nats => format!(
                "[sink]\nkind = \"nats\"\n\n[nats]\nurl = \"{NATS_URL}\"\nstream = \"{}\"\nsubjects = [\"{}>\"]\n",
                self.container, self.prefix
            ),
            Sink::RabbitMq => format!(
                "[sink]\nkind = \"rabbitmq\"\n\n[rabbitmq]\nurl = \"{RABBITMQ_URL}\"\nexchange = \"{}\"\n",
                self.container
            ),
            Sink::Redis => format!("[sink]\nkind = \"redis\"\n\n[redis]\nurl = \"{REDIS_URL}\"\n"),
            // The shipped defaults (16 aggregates at once, 10 s timeout).
            Sink::Webhook => format!(
                "[sink]\nkind = \"webhook\"\n\n[webhook]\nurl = \"{}\"\n",
                self.receiver.as_ref().map(|r| r.url()).unwrap_or_default()
            ),
            // The shipped defaults; the emulator's address is the relay's PUBSUB_EMULATOR_HOST
            // (`emulators::relay_env`).
            Sink::PubSub => format!("[sink]\nkind = \"pubsub\"\n\n[pubsub]\nproject = \"{PUBSUB_PROJECT}\"\n"),
            // FIFO queues (docs/sink-sqs.md's recommendation), the shipped defaults otherwise.
            Sink::Sqs => format!(
                "[sink]\nkind = \"sqs\"\n\n[sqs]\nregion = \"{}\"\nendpoint_url = \"{}\"\nfifo = true\n",
                emulators::AWS_REGION,
                emulators::server(Sink::Sqs).map(|s| s.url()).unwrap_or_default()
            ),
            // FIFO topics, as SQS; the shipped defaults otherwise.
            Sink::Sns => format!(
                "[sink]\nkind = \"sns\"\n\n[sns]\nregion = \"{}\"\nendpoint_url = \"{}\"\nfifo = true\n",
                emulators::AWS_REGION,
                emulators::server(Sink::Sns).map(|s| s.url()).unwrap_or_default()
            ),
            // The envelope format (docs/sink-kinesis.md), which the consumer reads the event id
            // from; one call at a time: moto numbers a shard's records without a lock, and two
            // concurrent `PutRecords` overwrite each other's records while both answer "stored"
            // (docs/sink-kinesis.md, "What moto does not reproduce"). The shipped 8 (`max_requests`)
            // would make the check count moto's losses as the relay's.
            Sink::Kinesis => format!(
                "[sink]\nkind = \"kinesis\"\n\n[kinesis]\nregion = \"{}\"\nendpoint_url = \"{}\"\nmax_requests = 1\n",
                emulators::AWS_REGION,
                emulators::server(Sink::Kinesis).map(|s| s.url()).unwrap_or_default()
            ),
        }
    }

    /// A consumer of `topic`'s events from the start (RabbitMQ: from now on, its queue bound
    /// before this returns; Pub/Sub: the topic and an ordered subscription made before this
    /// returns; SQS: the FIFO queue made; SNS: the FIFO topic and its subscribed queue made;
    /// Kinesis: the stream made and ACTIVE — start these before the relay publishes).
    pub fn consumer(&self, topic: &str) -> Result<TopicConsumer> {
        let destination = self.destination(topic);
        let container = self.container.clone();
        match self.sink {
            Sink::Kafka => bail!("the Kafka consumer is TopicConsumer::start"),
            Sink::Nats => TopicConsumer::start_async("nats", move || AsyncSource::nats(container)),
            Sink::RabbitMq => {
                TopicConsumer::start_async("rabbitmq", move || AsyncSource::rabbitmq(container, destination))
            }
            Sink::Redis => TopicConsumer::start_async("redis", move || AsyncSource::redis(destination)),
            Sink::PubSub => TopicConsumer::start_async("pubsub", move || AsyncSource::pubsub(destination)),
            Sink::Sqs => TopicConsumer::start_async("sqs", move || AsyncSource::sqs(destination)),
            Sink::Sns => TopicConsumer::start_async("sns", move || AsyncSource::sns(destination)),
            Sink::Kinesis => {
                TopicConsumer::start_async("kinesis", move || AsyncSource::kinesis(destination, KINESIS_SHARDS))
            }
            Sink::Webhook => {
                let receiver = self.receiver.clone().context("the webhook target has no receiver")?;
                TopicConsumer::start_async("webhook", move || async move { Ok(AsyncSource::Webhook { receiver }) })
            }
        }
    }

    /// Makes `topic`'s destination where the relay cannot publish before it exists and the
    /// consumer that would make it is started only after the relay ran (the drain's Kinesis
    /// stream: read after the drain, `Sink::read_during_drain`).
    pub async fn prepare(&self, topic: &str) -> Result<()> {
        if self.sink == Sink::Kinesis {
            let client = emulators::kinesis_client()?;
            super::sink_consumer::kinesis_stream(&client, &self.destination(topic), KINESIS_SHARDS).await?;
        }
        Ok(())
    }

    /// Messages the broker holds for `topic`: the stream's count (NATS), the key's XLEN (Redis);
    /// `None` for RabbitMQ (an exchange keeps nothing: the consumer's queue is the count).
    pub async fn stored(&self, topic: &str) -> Result<Option<u64>> {
        match self.sink {
            Sink::Kafka | Sink::RabbitMq | Sink::Webhook | Sink::PubSub | Sink::Sqs | Sink::Sns | Sink::Kinesis => {
                Ok(None)
            }
            Sink::Nats => {
                let js = nats_jetstream().await?;
                let mut stream = bounded("NATS", "opening the stream", js.get_stream(&self.container)).await?;
                let info = bounded("NATS", "stream info", stream.info()).await?;
                Ok(Some(info.state.messages))
            }
            Sink::Redis => {
                let mut c = redis_connection().await?;
                let n = bounded(
                    "Redis",
                    "XLEN",
                    redis::cmd("XLEN")
                        .arg(self.destination(topic))
                        .query_async::<u64>(&mut c),
                )
                .await?;
                Ok(Some(n))
            }
        }
    }

    /// Deletes what the run created on the shared server (the stream, the exchange, the key).
    pub async fn cleanup(&self, topic: &str) -> Result<()> {
        match self.sink {
            Sink::Kafka | Sink::Webhook => Ok(()),
            Sink::PubSub => {
                let http = emulators::pubsub_http()?;
                let destination = self.destination(topic);
                for path in [
                    format!("subscriptions/{destination}-sub"),
                    format!("topics/{destination}"),
                ] {
                    let r = bounded(
                        "Pub/Sub emulator",
                        "deleting",
                        http.delete(emulators::pubsub_url(&path)?).send(),
                    )
                    .await?;
                    // 404: never made (the run failed before its consumer).
                    if !r.status().is_success() && r.status() != reqwest::StatusCode::NOT_FOUND {
                        bail!("Pub/Sub emulator, deleting {path}: {}", r.status());
                    }
                }
                Ok(())
            }
            Sink::Sqs => delete_queue(&self.destination(topic)).await,
            Sink::Sns => {
                let name = self.destination(topic);
                let client = emulators::sns_client()?;
                // moto's ARNs: `arn:aws:sns:<region>:<account>:<name>`; found by name.
                let topics = bounded("moto", "ListTopics", client.list_topics().send()).await?;
                for arn in topics.topics().iter().filter_map(|t| t.topic_arn()) {
                    if arn.rsplit(':').next() == Some(name.as_str()) {
                        bounded("moto", "DeleteTopic", client.delete_topic().topic_arn(arn).send()).await?;
                    }
                }
                delete_queue(&name).await
            }
            Sink::Kinesis => {
                let name = self.destination(topic);
                let client = emulators::kinesis_client()?;
                match tokio::time::timeout(BROKER_TIMEOUT, client.delete_stream().stream_name(&name).send()).await {
                    Ok(Ok(_)) => Ok(()),
                    // Never made (the run failed before its consumer).
                    Ok(Err(e))
                        if e.as_service_error()
                            .is_some_and(|e| e.is_resource_not_found_exception()) =>
                    {
                        Ok(())
                    }
                    Ok(Err(e)) => Err(anyhow!(
                        "moto, deleting stream {name}: {}",
                        aws_sdk_kinesis::error::DisplayErrorContext(&e)
                    )),
                    Err(_) => Err(anyhow!("moto, deleting stream {name}: no answer")),
                }
            }
            Sink::Nats => {
                let js = nats_jetstream().await?;
                match tokio::time::timeout(BROKER_TIMEOUT, js.delete_stream(&self.container)).await {
                    Ok(Ok(_)) => Ok(()),
                    // Never created (the run failed before `setup`).
                    Ok(Err(e)) if e.to_string().contains("not found") => Ok(()),
                    Ok(Err(e)) => Err(anyhow!("NATS, deleting stream {}: {e}", self.container)),
                    Err(_) => Err(anyhow!("NATS, deleting stream {}: no answer", self.container)),
                }
            }
            Sink::RabbitMq => {
                let c = rabbitmq_connection("outbox-relay-bench-cleanup").await?;
                let channel = bounded("RabbitMQ", "opening a channel", c.create_channel()).await?;
                let deleted = bounded(
                    "RabbitMQ",
                    "deleting the exchange",
                    channel.exchange_delete(&self.container, ExchangeDeleteOptions::default()),
                )
                .await;
                let _ = tokio::time::timeout(BROKER_TIMEOUT, c.close(200, "cleaned up")).await;
                deleted
            }
            Sink::Redis => {
                let mut c = redis_connection().await?;
                bounded(
                    "Redis",
                    "DEL",
                    redis::cmd("DEL")
                        .arg(self.destination(topic))
                        .query_async::<u64>(&mut c),
                )
                .await?;
                Ok(())
            }
        }
    }
}

/// The moto SQS queue `name` deleted (none: never made, the run failed before its consumer).
async fn delete_queue(name: &str) -> Result<()> {
    let client = emulators::sqs_client()?;
    match tokio::time::timeout(BROKER_TIMEOUT, client.get_queue_url().queue_name(name).send()).await {
        Ok(Ok(url)) => {
            let url = url.queue_url().unwrap_or_default().to_owned();
            bounded("moto", "DeleteQueue", client.delete_queue().queue_url(url).send()).await?;
            Ok(())
        }
        Ok(Err(_)) => Ok(()),
        Err(_) => Err(anyhow!("moto, looking up queue {name}: no answer")),
    }
}
