//! `outbox-relay demo`: the whole pipeline on one machine in one command.
//!
//! It starts a throwaway PostgreSQL with `wal_level = logical` ([`postgres`]) and, unless
//! `--bootstrap` names a broker, an embedded Kafka (librdkafka's mock cluster, [`kafka`]);
//! creates the first seed's schema; runs `setup`; then runs, all in this process, producers
//! placing orders at `--rate` ([`producer`]), the relay itself (`relay::run`, the same code as
//! `outbox-relay run`), and a consumer ([`consumer`]), with a live progress line ([`stats`]).
//! With `--sink nats|rabbitmq|redis` the relay publishes to a running server (`--sink-url`)
//! instead: `setup` creates the run's NATS stream or RabbitMQ exchange, the matching consumer
//! ([`consumer_nats`], [`consumer_rabbitmq`], [`consumer_redis`]) reads the run's events, and
//! removes the stream, exchange or Redis key at the end (best effort). With `--sink pubsub|sqs`
//! the relay publishes to a running Pub/Sub emulator or moto server (`--sink-url`; the demo
//! checks it answers before anything starts, and says how to start one): `setup` creates the
//! run's Pub/Sub topic, the consumer ([`consumer_pubsub`], [`consumer_sqs`]) makes the run's
//! ordered subscription or FIFO queue before the relay starts, reads, and deletes them at the end
//! (best effort). With `--sink sns|kinesis` the relay publishes to the same moto: the consumer
//! ([`consumer_sns`], [`consumer_kinesis`]) makes the run's FIFO topic with a FIFO queue
//! subscribed to it, or the run's stream, before the relay starts, reads, and deletes them at the
//! end (best effort). The demo never reaches a cloud account: Pub/Sub goes to the emulator's
//! address (`PUBSUB_EMULATOR_HOST`, set for this process), SQS, SNS and Kinesis to `--sink-url`
//! with test credentials. With `--sink webhook` the
//! relay POSTs to a receiver of the demo's own ([`consumer_webhook`]: signatures verified,
//! duplicates acknowledged and not counted twice), signed with a secret made for the run.
//! At the end (`--duration`, or Ctrl-C) it stops the producers, lets the relay and the consumer
//! drain, stops the relay, and prints a summary.
//!
//! Cleanup invariant: whatever happens after PostgreSQL started — success, an error, Ctrl-C —
//! the server is stopped and its temporary directory removed before the demo exits; a demo
//! killed outright is covered by the server's watchdog (see [`postgres`]).

pub(crate) mod consumer;
pub(crate) mod consumer_kinesis;
pub(crate) mod consumer_nats;
pub(crate) mod consumer_pubsub;
pub(crate) mod consumer_rabbitmq;
pub(crate) mod consumer_redis;
pub(crate) mod consumer_sns;
pub(crate) mod consumer_sqs;
pub(crate) mod consumer_webhook;
pub(crate) mod kafka;
pub mod postgres;
pub(crate) mod producer;
pub(crate) mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{ConfigError, Settings};
use crate::control::ControlError;
use crate::ops::health::{Mode, RelayHealth};
use crate::relay::RelayError;
use consumer::DemoConsumer;
use kafka::EmbeddedKafka;
use postgres::ThrowawayPostgres;
use stats::{ProgressLine, Stats, Summary};

const DATABASE: &str = "shop";
const SLOT: &str = "outbox_relay_demo";
/// How long the demo waits, after the producers stopped, for the last events to be consumed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(250);
/// How long the demo waits for the relay to start streaming before producing anyway.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// Orders per second the producers aim for.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) rate: u32,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) duration: Option<u64>,
    /// The broker the relay publishes to: the embedded (or `--bootstrap`) Kafka, a running
    /// NATS JetStream, RabbitMQ or Redis server, Pub/Sub emulator or moto (SQS, SNS, Kinesis)
    /// server (`--sink-url`), or (webhook) an HTTP receiver of the demo's own.
    #[arg(long, value_enum, default_value_t = DemoSink::Kafka)]
    pub(crate) sink: DemoSink,
    /// The server of `--sink nats|rabbitmq|redis|pubsub|sqs|sns|kinesis` (default: the server's
    /// usual port on 127.0.0.1; pubsub takes the emulator's host:port, sqs, sns and kinesis moto's
    /// http://host:port).
    #[arg(long, value_name = "URL", conflicts_with = "bootstrap")]
    pub(crate) sink_url: Option<String>,
    /// Use this Kafka (host:port[,host:port…]) instead of the embedded one.
    #[arg(long, value_name = "SERVERS")]
    pub(crate) bootstrap: Option<String>,
    /// Directory of the PostgreSQL server binaries (initdb, postgres, pg_ctl); found
    /// automatically when unset.
    #[arg(long, value_name = "DIR", env = "OUTBOX_RELAY_PG_BIN")]
    pub(crate) pg_bin: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DemoSink {
    Kafka,
    Nats,
    Rabbitmq,
    Redis,
    /// An HTTP receiver of the demo's own.
    Webhook,
    /// Google Cloud Pub/Sub, on a running emulator.
    Pubsub,
    /// Amazon SQS (a FIFO queue), on a running moto server.
    Sqs,
    /// Amazon SNS (a FIFO topic, read through a subscribed FIFO queue), on a running moto server.
    Sns,
    /// Amazon Kinesis Data Streams (a stream of two shards), on a running moto server.
    Kinesis,
}

impl DemoSink {
    /// `--sink-url`'s default.
    fn default_url(self) -> &'static str {
        match self {
            DemoSink::Kafka | DemoSink::Webhook => "",
            DemoSink::Nats => "nats://127.0.0.1:4222",
            DemoSink::Rabbitmq => "amqp://guest:guest@127.0.0.1:5672/%2f",
            DemoSink::Redis => "redis://127.0.0.1:6379",
            DemoSink::Pubsub => "127.0.0.1:8085",
            DemoSink::Sqs | DemoSink::Sns | DemoSink::Kinesis => "http://127.0.0.1:5000",
        }
    }

    /// For a local stand-in of a cloud service: its name and how to start it, said when it does
    /// not answer.
    fn local_server(self) -> Option<(&'static str, &'static str)> {
        match self {
            DemoSink::Pubsub => Some((
                "Pub/Sub emulator",
                "`gcloud beta emulators pubsub start --host-port=127.0.0.1:8085` (after \
                 scripts/ensure-pubsub-emulator.sh)",
            )),
            DemoSink::Sqs => Some(("moto server (Amazon SQS)", MOTO_START)),
            DemoSink::Sns => Some(("moto server (Amazon SNS)", MOTO_START)),
            DemoSink::Kinesis => Some(("moto server (Amazon Kinesis)", MOTO_START)),
            _ => None,
        }
    }
}

/// How to start moto, which serves SQS, SNS and Kinesis on one port.
const MOTO_START: &str = "`~/.cache/outbox-relay/venv-moto/bin/moto_server -p 5000` (after scripts/ensure-moto.sh)";

/// The project of the demo's Pub/Sub topic (the emulator accepts any).
const PUBSUB_PROJECT: &str = "outbox-relay-demo";

/// Where the relay publishes: the Kafka bootstrap servers, or another broker's URL and, for
/// NATS and RabbitMQ, the run's stream or exchange (created by `setup`, deleted at the end).
#[derive(Debug, Clone)]
struct SinkTarget {
    kind: DemoSink,
    /// Kafka: the bootstrap servers; otherwise the server URL.
    address: String,
    /// NATS: the stream; RabbitMQ: the exchange; unused otherwise.
    container: String,
    /// Webhook: the demo's receiver (its socket and the run's secret).
    endpoint: Option<Arc<consumer_webhook::Endpoint>>,
}

/// The running demo consumer: the Kafka one on its own thread, the others as tasks that clean
/// up what the run created and say so.
enum RunningConsumer {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<Vec<String>>),
}

impl RunningConsumer {
    /// Waits (bounded) for the consumer to stop; returns its cleanup lines.
    async fn join(self) -> Vec<String> {
        match self {
            RunningConsumer::Thread(t) => {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
                Vec::new()
            }
            RunningConsumer::Task(mut t) => match tokio::time::timeout(Duration::from_secs(20), &mut t).await {
                Ok(Ok(lines)) => lines,
                Ok(Err(e)) => vec![format!("FAILED: the demo consumer panicked: {e}")],
                Err(_) => {
                    t.abort();
                    vec!["FAILED: the demo consumer did not stop within 20 s".to_owned()]
                }
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(
        "PostgreSQL server binaries not found ({0}). Install PostgreSQL (e.g. apt-get install postgresql-15) or pass \
         --pg-bin DIR"
    )]
    NoPostgres(String),
    #[error("the throwaway PostgreSQL did not start: {0}")]
    PostgresStart(String),
    #[error("stopping the throwaway PostgreSQL: {0}")]
    PostgresStop(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("PostgreSQL, {context}: {source}")]
    Postgres {
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("Kafka: {0}")]
    Kafka(String),
    #[error("{0}")]
    Sink(String),
    #[error("demo configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("setup: {0}")]
    Setup(#[from] ControlError),
    #[error("the relay stopped: {0}")]
    Relay(#[from] RelayError),
}

impl DemoError {
    pub(crate) fn postgres(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> DemoError {
        move |source| DemoError::Postgres { context, source }
    }
}

/// Runs the demo; the exit code is 0 when every produced event was consumed.
pub(crate) fn main(args: DemoArgs) -> ExitCode {
    match (args.sink, &args.bootstrap, &args.sink_url) {
        (DemoSink::Kafka, _, Some(_)) => {
            eprintln!(
                "error: --sink-url is for --sink nats|rabbitmq|redis|pubsub|sqs|sns|kinesis; a Kafka is given by \
                 --bootstrap"
            );
            return ExitCode::from(2);
        }
        (DemoSink::Webhook, _, Some(_)) => {
            eprintln!("error: --sink webhook runs its own receiver; leave --sink-url out");
            return ExitCode::from(2);
        }
        (
            DemoSink::Nats
            | DemoSink::Rabbitmq
            | DemoSink::Redis
            | DemoSink::Webhook
            | DemoSink::Pubsub
            | DemoSink::Sqs
            | DemoSink::Sns
            | DemoSink::Kinesis,
            Some(_),
            _,
        ) => {
            eprintln!("error: --bootstrap is for Kafka; give the server of --sink with --sink-url");
            return ExitCode::from(2);
        }
        _ => {}
    }
    point_clients_at_local_server(&args);
    let runtime = match crate::ops::runtime(2) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(summary) => {
            println!("{summary}");
            if summary.all_consumed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The relay runs in this process and its cloud clients read their conventions from the
/// environment: the Pub/Sub client goes to `PUBSUB_EMULATOR_HOST` (the sink has no endpoint
/// key), the AWS SDK takes credentials from its chain. Set here, before the runtime's threads
/// exist, so the demo reaches the local server with test credentials and never a cloud
/// account.
fn point_clients_at_local_server(args: &DemoArgs) {
    match args.sink {
        DemoSink::Pubsub => {
            let host = args
                .sink_url
                .clone()
                .unwrap_or_else(|| args.sink.default_url().to_owned());
            std::env::set_var(crate::sink::registry::demo_sections::EMULATOR_HOST_VAR, host);
        }
        DemoSink::Sqs | DemoSink::Sns | DemoSink::Kinesis => {
            std::env::set_var("AWS_ACCESS_KEY_ID", consumer_sqs::TEST_KEY);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", consumer_sqs::TEST_KEY);
            std::env::remove_var("AWS_SESSION_TOKEN");
            std::env::remove_var("AWS_PROFILE");
        }
        _ => {}
    }
}

/// For a local stand-in of a cloud service: fails, before anything starts, when nothing answers
/// at `address` (`host:port`, or a URL), naming how to start the server.
async fn check_local_server(sink: DemoSink, address: &str) -> Result<(), DemoError> {
    let Some((name, how)) = sink.local_server() else {
        return Ok(());
    };
    let authority = address
        .split_once("://")
        .map_or(address, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let reached = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(&authority)).await;
    let cause = match reached {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 5 s".to_owned(),
    };
    Err(DemoError::Sink(format!(
        "no {name} answers at {address} ({cause}): start one with {how}, or give where it runs with --sink-url"
    )))
}

/// Everything, with cleanup guaranteed once PostgreSQL started.
pub(crate) async fn run(args: DemoArgs) -> Result<Summary, DemoError> {
    let mut progress = ProgressLine::new();
    let interrupts = watch_interrupts();
    if args.sink.local_server().is_some() {
        let address = args
            .sink_url
            .clone()
            .unwrap_or_else(|| args.sink.default_url().to_owned());
        check_local_server(args.sink, &address).await?;
    }
    let bin = postgres::find_bin_dir(args.pg_bin.as_deref())?;
    progress.message(&format!("demo: starting a throwaway PostgreSQL ({})", bin.display()));
    let pg = tokio::task::spawn_blocking(move || ThrowawayPostgres::start(&bin))
        .await
        .map_err(|e| DemoError::PostgresStart(e.to_string()))??;
    let dir = pg.dir().map(Path::to_path_buf).unwrap_or_default();
    progress.message(&format!(
        "demo: PostgreSQL is up at {} (cluster directory {})",
        pg.url(DATABASE),
        dir.display()
    ));
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let kafka = match (args.sink, &args.bootstrap) {
        (DemoSink::Kafka, None) => match EmbeddedKafka::start(producer::EVENT_TYPE) {
            Ok(k) => Some(k),
            Err(e) => {
                let mut pg = pg;
                let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
                return Err(e);
            }
        },
        _ => None,
    };
    let endpoint = match args.sink {
        DemoSink::Webhook => match consumer_webhook::Endpoint::bind() {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => {
                let mut pg = pg;
                let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
                return Err(e);
            }
        },
        _ => None,
    };
    let webhook_url = endpoint_url(&endpoint);
    let target = SinkTarget {
        endpoint,
        kind: args.sink,
        address: match args.sink {
            DemoSink::Kafka => args
                .bootstrap
                .clone()
                .or_else(|| kafka.as_ref().map(|k| k.bootstrap_servers().to_owned()))
                .unwrap_or_default(),
            DemoSink::Webhook => webhook_url,
            other => args.sink_url.clone().unwrap_or_else(|| other.default_url().to_owned()),
        },
        container: match args.sink {
            DemoSink::Nats => format!("OUTBOX_RELAY_DEMO_{run_id}"),
            _ => format!("outbox-relay-demo-{run_id}"),
        },
    };

    let outcome = pipeline(&args, &pg, &target, &run_id, kafka.is_some(), interrupts, &mut progress).await;

    progress.finish();
    let mut pg = pg;
    let stopped = tokio::task::spawn_blocking(move || pg.stop()).await;
    drop(kafka);
    let cleanup = match stopped {
        Ok(Ok(())) => format!("PostgreSQL stopped and {} removed", dir.display()),
        Ok(Err(e)) => format!("FAILED: {e}"),
        Err(e) => format!("FAILED: stopping PostgreSQL panicked: {e}"),
    };
    let cleanup = vec![cleanup];
    match outcome {
        Ok(mut summary) => {
            // The pipeline's own lines (the broker's stream, exchange or key) come after.
            let sink_lines = std::mem::replace(&mut summary.cleanup, cleanup);
            summary.cleanup.extend(sink_lines);
            Ok(summary)
        }
        Err(e) => {
            for line in cleanup {
                eprintln!("demo: cleaned up: {line}");
            }
            Err(e)
        }
    }
}

/// Schema, setup, consumer, relay and producers; then the orderly stop. Returns the summary.
async fn pipeline(
    args: &DemoArgs,
    pg: &ThrowawayPostgres,
    target: &SinkTarget,
    run_id: &str,
    embedded: bool,
    mut interrupts: watch::Receiver<u32>,
    progress: &mut ProgressLine,
) -> Result<Summary, DemoError> {
    let admin = producer::connect(&pg.url("postgres")).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await
        .map_err(DemoError::postgres("creating the demo database"))?;
    let db = producer::connect(&pg.url(DATABASE)).await?;
    db.batch_execute(producer::SCHEMA)
        .await
        .map_err(DemoError::postgres("creating the seed schema"))?;

    let settings = demo_settings(&pg.url(DATABASE), target, run_id)?;
    let setup = crate::control::setup(&settings).await?;
    progress.message(&format!("demo: setup done\n{setup}"));

    let topic = settings.router.route(producer::EVENT_TYPE).into_owned();
    let stats = Arc::new(Stats::new());
    let consumer_stop = Arc::new(AtomicBool::new(false));
    // Started before the relay: the RabbitMQ queue must be bound before anything is published.
    let consumer = start_consumer(target, &topic, run_id, &stats, &consumer_stop).await?;

    let (relay_stop, relay_stop_rx) = watch::channel(false);
    let relay_settings = settings.clone();
    let health = Arc::new(RelayHealth::default());
    let relay_health = Arc::clone(&health);
    let mut relay = tokio::spawn(async move { crate::relay::run(&relay_settings, relay_stop_rx, relay_health).await });
    // Orders placed before the relay streams would only wait in the WAL; start the clock when it streams.
    let streaming_deadline = Instant::now() + STREAMING_TIMEOUT;
    while health.mode() != Mode::Streaming && Instant::now() < streaming_deadline && !relay.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (producers_stop, producers_stop_rx) = watch::channel(false);
    let producers = producer::spawn(
        &pg.url(DATABASE),
        args.rate,
        run_id,
        Arc::clone(&stats),
        producers_stop_rx,
    )
    .await?;
    progress.message(&format!(
        "demo: placing {} orders/s; the relay publishes them to topic {topic}; {}",
        args.rate,
        match args.duration {
            Some(s) => format!("running for {s} s (Ctrl-C stops early)"),
            None => "running until Ctrl-C".into(),
        }
    ));

    // Produce until the duration is up or Ctrl-C.
    let started = Instant::now();
    let deadline = args.duration.map(|s| started + Duration::from_secs(s));
    let mut relay_result = None;
    loop {
        progress.update(&stats.snapshot(started.elapsed(), &relay_window()));
        if deadline.is_some_and(|d| Instant::now() >= d) || *interrupts.borrow() > 0 {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = interrupts.changed() => {}
            r = &mut relay => { relay_result = Some(r); break; }
        }
    }
    let production = started.elapsed();
    let _ = producers_stop.send(true);
    let mut producer_error = None;
    for task in producers {
        if let Ok(Err(e)) = task.await {
            producer_error.get_or_insert(e);
        }
    }

    // Drain: the relay publishes what is left, the consumer reads it. A second Ctrl-C skips it.
    let drain_deadline = Instant::now() + DRAIN_TIMEOUT;
    let skip_drain_at = *interrupts.borrow() + 1;
    while relay_result.is_none()
        && stats.consumed_distinct() < stats.produced.load(Ordering::Relaxed)
        && Instant::now() < drain_deadline
        && *interrupts.borrow() < skip_drain_at
    {
        progress.update(&stats.snapshot(production, &relay_window()));
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = interrupts.changed() => {}
            r = &mut relay => relay_result = Some(r),
        }
    }

    let _ = relay_stop.send(true);
    let relay_result = match relay_result {
        Some(r) => r,
        None => {
            match tokio::time::timeout(settings.relay.shutdown_timeout + Duration::from_secs(5), &mut relay).await {
                Ok(r) => r,
                Err(_) => {
                    relay.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    let confirmed_lsn = db
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .await
        .ok()
        .flatten()
        .and_then(|r| r.get::<_, Option<String>>(0));
    // Give the consumer a last look at what the broker reports published, then stop it.
    consumer_stop.store(true, Ordering::Relaxed);
    let sink_cleanup = consumer.join().await;
    let numbers = stats.snapshot(production, &relay_window());
    progress.update(&numbers);

    if let Ok(Err(e)) = relay_result {
        return Err(e.into());
    }
    if let Some(e) = producer_error {
        return Err(e);
    }
    Ok(Summary {
        numbers,
        rate: args.rate,
        topic,
        kafka: match target.kind {
            DemoSink::Kafka if embedded => format!("the embedded Kafka ({})", target.address),
            DemoSink::Kafka => target.address.clone(),
            // The URLs as the settings print them: any password masked.
            DemoSink::Nats => match settings
                .sink
                .section::<crate::sink::registry::demo_sections::NatsSettings>()
            {
                Some(n) => format!("NATS JetStream {} (stream {})", n.url, n.stream),
                None => "NATS JetStream".to_owned(),
            },
            DemoSink::Rabbitmq => match settings
                .sink
                .section::<crate::sink::registry::demo_sections::RabbitMqSettings>()
            {
                Some(r) => format!("RabbitMQ {} (exchange {})", r.url, r.exchange),
                None => "RabbitMQ".to_owned(),
            },
            DemoSink::Redis => match settings
                .sink
                .section::<crate::sink::registry::demo_sections::RedisSettings>()
            {
                Some(r) => format!("Redis {}", r.url),
                None => "Redis".to_owned(),
            },
            DemoSink::Webhook => format!(
                "the demo's webhook receiver {} (every request's signature verified)",
                target.address
            ),
            DemoSink::Pubsub => match settings
                .sink
                .section::<crate::sink::registry::demo_sections::PubSubSettings>()
            {
                Some(p) => format!("the Pub/Sub emulator at {} (project {})", target.address, p.project),
                None => format!("the Pub/Sub emulator at {}", target.address),
            },
            DemoSink::Sqs => format!("moto (Amazon SQS) at {} (a FIFO queue)", target.address),
            DemoSink::Sns => format!(
                "moto (Amazon SNS) at {} (a FIFO topic, read through a subscribed FIFO queue)",
                target.address
            ),
            DemoSink::Kinesis => format!(
                "moto (Amazon Kinesis) at {} (a stream of {} shards)",
                target.address,
                consumer_kinesis::SHARDS
            ),
        },
        slot: SLOT.to_owned(),
        confirmed_lsn,
        interrupted: *interrupts.borrow() > 0,
        cleanup: sink_cleanup,
    })
}

/// The relay's commit-to-acknowledgement window: the relay runs in this process and records
/// every acknowledgement there (what `GET /latency` serves).
fn relay_window() -> crate::ops::latency::LatencySummary {
    crate::ops::latency::commit_to_ack().summary(false)
}

/// Connects the consumer for `target` and starts it.
async fn start_consumer(
    target: &SinkTarget,
    topic: &str,
    run_id: &str,
    stats: &Arc<Stats>,
    stop: &Arc<AtomicBool>,
) -> Result<RunningConsumer, DemoError> {
    let (stats, stop) = (Arc::clone(stats), Arc::clone(stop));
    Ok(match target.kind {
        DemoSink::Kafka => {
            let (bootstrap, topic, run_id) = (target.address.clone(), topic.to_owned(), run_id.to_owned());
            let consumer = tokio::task::spawn_blocking(move || DemoConsumer::new(&bootstrap, &topic, &run_id))
                .await
                .map_err(|e| DemoError::Kafka(e.to_string()))??;
            RunningConsumer::Thread(
                consumer
                    .spawn(stats, stop)
                    .map_err(|e| DemoError::Io("starting the consumer thread".into(), e))?,
            )
        }
        DemoSink::Nats => {
            let c = consumer_nats::NatsConsumer::new(&target.address, &target.container, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Rabbitmq => {
            let c = consumer_rabbitmq::RabbitMqConsumer::new(&target.address, &target.container, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Redis => {
            let c = consumer_redis::RedisConsumer::new(&target.address, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Pubsub => {
            let c = consumer_pubsub::PubSubConsumer::new(&target.address, PUBSUB_PROJECT, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Sqs => {
            let c = consumer_sqs::SqsConsumer::new(&target.address, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Sns => {
            let c = consumer_sns::SnsConsumer::new(&target.address, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Kinesis => {
            let c = consumer_kinesis::KinesisConsumer::new(&target.address, topic, run_id).await?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
        DemoSink::Webhook => {
            let endpoint = target
                .endpoint
                .as_ref()
                .ok_or_else(|| DemoError::Sink("--sink webhook without its receiver".into()))?;
            let c = consumer_webhook::WebhookConsumer::new(endpoint, run_id)?;
            RunningConsumer::Task(tokio::spawn(c.run(stats, stop)))
        }
    })
}

/// The relay's configuration for the demo database, as a user would write it.
fn demo_settings(url: &str, target: &SinkTarget, run_id: &str) -> Result<Settings, DemoError> {
    let address = toml_string(&target.address);
    let container = &target.container;
    let sink = match target.kind {
        DemoSink::Kafka => format!("[kafka]\n\"bootstrap.servers\" = {address}\n"),
        // A subject per run, so the run's stream overlaps no other stream (a stream left by an
        // earlier, killed demo included); `setup` creates the stream from `subjects`.
        DemoSink::Nats => format!(
            r#"[sink]
kind = "nats"

[nats]
url = {address}
stream = "{container}"
subjects = ["demo.{run_id}.>"]

[route]
topic_regex = "(?<routedByValue>.*)"
topic_replacement = "demo.{run_id}.${{routedByValue}}"
"#
        ),
        // `setup` declares the run's exchange; the demo's queue binds the routed topic to it.
        DemoSink::Rabbitmq => format!(
            r#"[sink]
kind = "rabbitmq"

[rabbitmq]
url = {address}
exchange = "{container}"
"#
        ),
        // The stream key is the routed topic, one per run so nothing older is read.
        DemoSink::Redis => format!(
            r#"[sink]
kind = "redis"

[redis]
url = {address}

[route]
topic_regex = "(?<routedByValue>.*)"
topic_replacement = "outbox-relay-demo:{run_id}:${{routedByValue}}"
"#
        ),
        // The demo's own receiver; each event's topic is the last path segment.
        DemoSink::Webhook => format!(
            r#"[sink]
kind = "webhook"

[webhook]
url = "{address_raw}/hooks/${{topic}}"
secret = "{secret}"
"#,
            address_raw = target.address,
            secret = target.endpoint.as_ref().map(|e| e.whsec()).unwrap_or_default()
        ),
        // A topic per run, which `setup` creates; the emulator is PUBSUB_EMULATOR_HOST
        // (`point_clients_at_local_server`).
        DemoSink::Pubsub => format!(
            r#"[sink]
kind = "pubsub"

[pubsub]
project = "{PUBSUB_PROJECT}"
topics = ["{container}.{event_type}"]

[route]
topic_regex = "(?<routedByValue>.*)"
topic_replacement = "{container}.${{routedByValue}}"
"#,
            event_type = producer::EVENT_TYPE
        ),
        // A FIFO queue per run (made by the demo's consumer: `setup` creates no queues). Queue
        // names allow no `.` but the `.fifo` suffix: `order.placed` becomes `order-placed`.
        DemoSink::Sqs => format!(
            r#"[sink]
kind = "sqs"

[sqs]
region = "{region}"
endpoint_url = {address}
fifo = true

[route]
topic_regex = '(?<head>[^.]*)\.(?<tail>.*)'
topic_replacement = "{container}-${{head}}-${{tail}}.fifo"
"#,
            region = consumer_sqs::REGION
        ),
        // A FIFO topic per run, named as the SQS queue (made by the demo's consumer with its
        // subscribed queue: `setup` creates no topics).
        DemoSink::Sns => format!(
            r#"[sink]
kind = "sns"

[sns]
region = "{region}"
endpoint_url = {address}
fifo = true

[route]
topic_regex = '(?<head>[^.]*)\.(?<tail>.*)'
topic_replacement = "{container}-${{head}}-${{tail}}.fifo"
"#,
            region = consumer_sqs::REGION
        ),
        // A stream per run (made by the demo's consumer with its shards); the default envelope
        // format, which carries the event id the consumer counts by.
        DemoSink::Kinesis => format!(
            r#"[sink]
kind = "kinesis"

[kinesis]
region = "{region}"
endpoint_url = {address}

[route]
topic_regex = "(?<routedByValue>.*)"
topic_replacement = "{container}.${{routedByValue}}"
"#,
            region = consumer_sqs::REGION
        ),
    };
    let text = format!(
        r#"
[postgres]
url = "{url}"
slot = "{SLOT}"
publication = "{SLOT}"

[outbox]
table = "public.events_outbox"
timestamp_column = "created_at"

{sink}
[relay]
status_interval_ms = 500
shutdown_timeout_ms = 10000
reconnect_backoff_initial_ms = 200
"#
    );
    // The demo ignores OUTBOX_RELAY__* variables: it must not touch a real deployment.
    Ok(Settings::from_toml_str(&text, Path::new("<demo>"), std::iter::empty())?)
}

/// `value` as a TOML basic string.
fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Counts SIGINT/SIGTERM: the first stops the producers, a second skips the drain.
fn watch_interrupts() -> watch::Receiver<u32> {
    let (tx, rx) = watch::channel(0u32);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tx.send_modify(|n| *n += 1);
        }
    });
    rx
}

/// The demo receiver's base URL (empty without one).
fn endpoint_url(endpoint: &Option<Arc<consumer_webhook::Endpoint>>) -> String {
    endpoint.as_ref().map(|e| e.base_url()).unwrap_or_default()
}
