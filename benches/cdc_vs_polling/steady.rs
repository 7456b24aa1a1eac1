//! One steady-state run: a fresh database, one relay (or none: the baseline), a fixed arrival
//! rate (or the maximum), and everything measured over one window.
//!
//! Sequence: create database and schema → `setup` (CDC) or `setup --poll` → start the relay and
//! the consumer → warm-up load (delivered, not measured) → snapshot counters → measured load →
//! wait until every measured event arrived and at least [`TAIL`] passed → snapshot again. All
//! per-event figures divide the counter differences by the measured events, so the relay's idle
//! work between events (empty polls, keepalives) is part of its cost.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::broker::Broker;
use super::consumer::TopicConsumer;
use super::debezium::{ConnectChild, ConnectorConf, Install};
use super::load::{self, LoadSpec, Producers};
use super::otlp::{OtlpCounts, OtlpReceiver};
use super::pg::{self, BenchPg, RELAY_ROLE};
use super::procfs;
use super::relay::{self, Mode, RelayChild, RelayConf, Trace};
use super::sinks::{Sink, SinkTarget};
use super::stats::{self, Delivery, Percentiles};

/// Every window lasts at least this long past the end of the load, for every mode alike.
pub const TAIL: Duration = Duration::from_millis(1500);
const PARTITIONS: i32 = 4;
const CATCH_UP_LIMIT: Duration = Duration::from_secs(180);

pub const SCHEMA: &str = "
CREATE TABLE orders (id uuid PRIMARY KEY, customer_id uuid, total_cents bigint, status text);
CREATE TABLE events_outbox (
    id bigserial PRIMARY KEY,
    aggregate_id uuid NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz,
    -- W3C trace context: written only by the tracing rows' load (NULL elsewhere: no cost).
    traceparent text
);
CREATE INDEX events_outbox_pending_idx ON events_outbox (created_at) WHERE dispatched_at IS NULL;
";

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Rate {
    Fixed(f64),
    Max,
}

#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// `None`: no relay at all — the database's own cost of the load, subtracted from the others.
    #[serde(serialize_with = "serialize_mode")]
    pub mode: Option<Mode>,
    pub rate: Rate,
    pub events_per_txn: usize,
    pub warmup: Duration,
    pub measure: Duration,
    /// The broker the relay publishes to (Kafka for every run but the other sinks' CDC rows).
    #[serde(skip)]
    pub sink: Sink,
    /// Trace context and span export (the tracing rows; `Off` everywhere else).
    #[serde(skip)]
    pub trace: Trace,
}

/// A run that could not be measured for a reason outside the benchmark (a relay without
/// `[tracing]`): reported as skipped, with the reason, not as a failure.
#[derive(Debug)]
pub struct Skipped(pub String);

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skipped {}

fn serialize_mode<S: serde::Serializer>(m: &Option<Mode>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&m.map_or("baseline".into(), Mode::label))
}

impl Scenario {
    /// The relay, with the tracing dimension when on ("CDC + OTLP 100 %").
    pub fn mode_label(&self) -> String {
        let mode = self.mode.map_or("no relay".into(), Mode::label);
        match self.trace.label() {
            Some(trace) => format!("{mode} + {trace}"),
            None => mode,
        }
    }

    /// "<relay> at <rate>", with the broker when it is not Kafka: what `--only` matches.
    pub fn label(&self) -> String {
        match self.sink {
            Sink::Kafka => format!("{} at {}", self.mode_label(), self.rate_label()),
            other => format!("{} → {} at {}", self.mode_label(), other.name(), self.rate_label()),
        }
    }

    pub fn rate_label(&self) -> String {
        let batch = if self.events_per_txn > 1 {
            format!(" (×{} per txn)", self.events_per_txn)
        } else {
            String::new()
        };
        match self.rate {
            Rate::Fixed(r) => format!("{r:.0}/s{batch}"),
            Rate::Max => format!("max{batch}"),
        }
    }

    fn connections(&self) -> usize {
        match self.rate {
            Rate::Fixed(r) if r <= 200.0 => 2,
            Rate::Fixed(r) if r <= 2_000.0 => 4,
            _ => 8,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub mode: String,
    pub rate: String,
    /// The broker (`Sink::name`); results.json files from before the sinks have Kafka only.
    #[serde(default = "kafka_name")]
    pub sink: String,
    pub offered_per_s: f64,
    pub events: u64,
    pub achieved_per_s: f64,
    pub window_s: f64,
    pub delivery: Option<Delivery>,
    /// The relay's exact commit-to-ack window over the measured load (`GET /latency`): events
    /// and percentiles. CDC measures from the WAL commit timestamp, polling from `created_at`.
    pub ack: Option<(u64, Percentiles)>,
    pub relay_cpu_us_per_event: Option<f64>,
    pub relay_rss_mib: Option<f64>,
    pub relay_peak_rss_mib: Option<f64>,
    pub pg_cpu_us_per_event: f64,
    /// Server CPU outside the producers' own sessions: the relay's backend or walsender, and
    /// background work (WAL writer, autovacuum, checkpointer) — what a relay can add.
    pub pg_cpu_besides_producers_us_per_event: f64,
    /// CPU of the relay's own server processes (walsender, or the polling backend).
    pub pg_relay_backends_us_per_event: Option<f64>,
    pub statements_per_event: Option<f64>,
    /// CPU of the broker server's process per event (NATS, RabbitMQ, Redis: a process of its own
    /// on this machine; Kafka's mock cluster lives in the benchmark process: none).
    #[serde(default)]
    pub broker_cpu_us_per_event: Option<f64>,
    /// The tracing dimension's label ("traceparent", "OTLP 1 %"); `None` for every other row.
    #[serde(default)]
    pub tracing: Option<String>,
    /// What the OTLP receiver got over the whole run (warm-up and measured load, through the
    /// relay's shutdown flush), and the events the consumer received over the same span.
    #[serde(default)]
    pub otlp: Option<(OtlpCounts, u64)>,
}

fn kafka_name() -> String {
    Sink::Kafka.name().to_owned()
}

impl Outcome {
    /// A run of the main tables (Kafka), as opposed to another sink's row.
    pub fn is_kafka(&self) -> bool {
        self.sink == Sink::Kafka.name()
    }
}

struct Counters {
    at: Instant,
    relay_cpu: Option<f64>,
    pg_cpu: f64,
    producers_cpu: f64,
    backends_cpu: Option<f64>,
    statements: i64,
    broker_cpu: Option<f64>,
}

pub struct Ctx<'a> {
    pub pg: &'a BenchPg,
    pub broker: &'a Broker,
    pub workdir: &'a Path,
    /// `--kafka KEY=VALUE` properties for every relay.
    pub kafka: &'a [(String, String)],
    /// Java and the Debezium jars, checked at start-up (`--with-debezium`).
    pub debezium: Option<&'a Install>,
    /// This benchmark run's id: in the names it creates on the shared brokers.
    pub run_id: &'a str,
    /// The non-Kafka brokers of `--sinks` (checked reachable at start-up).
    pub sinks: &'a [Sink],
}

/// What reads the slot or polls the table in a run: the relay, or Debezium + Kafka Connect.
enum Contender {
    Relay(RelayChild),
    Connect(ConnectChild),
}

impl Contender {
    fn pid(&self) -> u32 {
        match self {
            Contender::Relay(r) => r.pid(),
            Contender::Connect(c) => c.pid(),
        }
    }

    async fn stop(self) -> Result<()> {
        match self {
            Contender::Relay(r) => r.stop().await,
            Contender::Connect(c) => c.stop().await,
        }
    }
}

pub async fn run(ctx: &Ctx<'_>, sc: &Scenario, index: usize, phase: &ProgressBar) -> Result<Outcome> {
    let db = format!("bench_{index}");
    let admin = pg::connect(&ctx.pg.url("postgres", "postgres")).await?;
    pg::recreate_database(&admin, &db).await?;
    let load_url = ctx.pg.url("postgres", &db);
    pg::connect(&load_url).await?.batch_execute(SCHEMA).await?;
    let topic = format!("bench-{index}");
    let target = SinkTarget::new(sc.sink, ctx.run_id, &index.to_string());
    let outcome = measure(ctx, sc, &db, &topic, target.as_ref(), &admin, phase).await;
    // A relay that refuses `[tracing]` (built before that section): skipped, not failed.
    let outcome = match outcome {
        Err(e) if matches!(sc.trace, Trace::Otlp { .. }) && relay::refuses_tracing(&format!("{e:#}")) => {
            let why = format!("{e:#}");
            // The refusal's own words, without the temporary config path and the list of sections.
            let detail = match why.find("unknown field `tracing`") {
                Some(_) => "unknown field `tracing`".to_owned(),
                None => why
                    .lines()
                    .find(|l| relay::refuses_tracing(l))
                    .unwrap_or("the relay refused [tracing]")
                    .trim()
                    .to_owned(),
            };
            Err(anyhow::Error::new(Skipped(format!(
                "this outbox-relay refuses the [tracing] section ({detail}); the OTLP rows need a relay with the \
                 OTLP span exporter"
            ))))
        }
        other => other,
    };
    if let Some(t) = &target {
        if let Err(e) = t.cleanup(&topic).await {
            phase.println(format!("cleaning up after {}: {e:#}", sc.label()));
        }
    }
    pg::drop_database(&admin, &db).await?;
    outcome
}

async fn measure(
    ctx: &Ctx<'_>,
    sc: &Scenario,
    db: &str,
    topic: &str,
    target: Option<&SinkTarget>,
    admin: &Client,
    phase: &ProgressBar,
) -> Result<Outcome> {
    let load_url = ctx.pg.url("postgres", db);
    // The relay's own commit-to-ack window; Debezium has none.
    let metrics_port = sc
        .mode
        .filter(|m| !matches!(m, Mode::Debezium(_)))
        .map(|_| pg::free_port());
    let mut relay_child = None;
    let mut consumer = None;
    // The span sink of the OTLP rows, for the whole run (the exporter may flush at shutdown).
    let receiver = match sc.trace {
        Trace::Otlp { .. } => Some(OtlpReceiver::start().context("starting the OTLP receiver")?),
        _ => None,
    };
    let otlp_endpoint = receiver.as_ref().map(OtlpReceiver::endpoint);
    if let Some(mode) = sc.mode {
        phase.set_message(format!("{}: setup", mode.label()));
        if target.is_none() {
            ctx.broker.create_topic(topic, PARTITIONS).await?;
        }
        let conf = RelayConf {
            url: &ctx.pg.url(RELAY_ROLE, db),
            slot: db,
            bootstrap: ctx.broker.bootstrap(),
            mode,
            metrics_port,
            status_interval_ms: 1000,
            kafka: ctx.kafka,
            topic_prefix: target.map_or("", |t| t.prefix.as_str()),
            sink: target,
            trace: sc.trace,
            otlp_endpoint: otlp_endpoint.as_deref(),
        };
        let path = conf.write(ctx.workdir)?;
        relay::setup(&path, !mode.streams())?;
        // Before the relay publishes: a RabbitMQ message no queue is bound for is a bad event.
        consumer = Some(match target {
            Some(t) => tokio::task::block_in_place(|| t.consumer(topic))?,
            None => TopicConsumer::start(ctx.broker.bootstrap(), topic, PARTITIONS)?,
        });
        relay_child = Some(match mode {
            Mode::Debezium(tuning) => {
                let install = ctx
                    .debezium
                    .context("a Debezium run needs --with-debezium's installation check")?;
                let dbz = ConnectorConf {
                    name: db,
                    pg_port: ctx.pg.port(),
                    user: RELAY_ROLE,
                    db,
                    // The relay's setup created both, named after the database.
                    slot: db,
                    publication: db,
                    bootstrap: ctx.broker.bootstrap(),
                    topic_prefix: "",
                    tuning,
                };
                Contender::Connect(ConnectChild::start(install, &dbz, ctx.workdir).await?)
            }
            _ => Contender::Relay(RelayChild::start(&path, mode).await?),
        });
    }
    let broker_pid = sc.sink.broker_pid();
    let producers = Producers::connect(&load_url, sc.connections()).await?;
    let producer_pids = session_pids(admin, db, load::APPLICATION_NAME).await?;
    let spec = |duration| LoadSpec {
        rate: match sc.rate {
            Rate::Fixed(r) => Some(r),
            Rate::Max => None,
        },
        events_per_txn: sc.events_per_txn,
        duration,
        event_type: topic.to_owned(),
        traceparent: sc.trace.sampled_share(),
    };

    phase.set_message(format!("{} {}: warm-up", sc.mode_label(), sc.rate_label()));
    phase.set_position(0);
    let warm = load::run(&producers, &spec(sc.warmup), phase).await?;
    if let Some(c) = &consumer {
        wait_for(c, warm.commits.len() as u64, CATCH_UP_LIMIT).await;
    }
    let backends = relay_backends(admin, db, sc.mode).await?;
    let relay_pid = relay_child.as_ref().map(Contender::pid);
    // Opens the measured window: every warm-up event is acknowledged by now (the consumer has it).
    if let Some(port) = metrics_port {
        relay::latency_window(port, true).context("the relay's /latency endpoint did not answer")?;
    }
    let before = counters(ctx, admin, db, relay_pid, broker_pid, &backends, &producer_pids).await?;

    phase.set_message(format!("{} {}: measuring", sc.mode_label(), sc.rate_label()));
    phase.set_position(0);
    let measured = load::run(&producers, &spec(sc.measure), phase).await?;
    let load_end = Instant::now();
    if let Some(c) = &consumer {
        phase.set_message(format!(
            "{} {}: waiting for the relay",
            sc.mode_label(),
            sc.rate_label()
        ));
        wait_for(c, (warm.commits.len() + measured.commits.len()) as u64, CATCH_UP_LIMIT).await;
    }
    let tail_end = load_end + TAIL;
    if tail_end > Instant::now() {
        tokio::time::sleep_until(tail_end.into()).await;
    }
    let after = counters(ctx, admin, db, relay_pid, broker_pid, &backends, &producer_pids).await?;
    let ack = metrics_port
        .and_then(|port| relay::latency_window(port, false))
        .and_then(|w| {
            Some((
                w.count,
                Percentiles {
                    p50: w.p50_ms?,
                    p90: w.p90_ms?,
                    p99: w.p99_ms?,
                    max: w.max_ms?,
                },
            ))
        });
    let relay_rss = relay_pid
        .and_then(|p| procfs::vm_kib(p, "VmRSS"))
        .map(|k| k as f64 / 1024.0);
    let relay_peak = relay_pid
        .and_then(|p| procfs::vm_kib(p, "VmHWM"))
        .map(|k| k as f64 / 1024.0);
    if let Some(r) = relay_child {
        r.stop().await?;
    }
    let run_events = consumer.as_ref().map_or(0, TopicConsumer::count);
    let otlp = receiver.as_ref().map(|r| (r.counts(), run_events));
    let delivery = consumer.map(|c| stats::delivery(&measured.commits, &c.finish()));
    let events = delivery.as_ref().map_or(measured.commits.len() as u64, |d| d.delivered);
    if events == 0 {
        bail!("no event was delivered in {} {}", sc.mode_label(), sc.rate_label());
    }
    let per_event_us = |seconds: f64| seconds * 1e6 / events as f64;
    let achieved = match &delivery {
        Some(d) if d.span_seconds > 0.0 => d.delivered as f64 / d.span_seconds,
        _ => measured.events_per_second(),
    };
    Ok(Outcome {
        mode: sc.mode_label(),
        rate: sc.rate_label(),
        sink: sc.sink.name().to_owned(),
        offered_per_s: measured.events_per_second(),
        events,
        achieved_per_s: achieved,
        window_s: after.at.duration_since(before.at).as_secs_f64(),
        delivery,
        ack,
        relay_cpu_us_per_event: before.relay_cpu.zip(after.relay_cpu).map(|(b, a)| per_event_us(a - b)),
        relay_rss_mib: relay_rss,
        relay_peak_rss_mib: relay_peak,
        pg_cpu_us_per_event: per_event_us(after.pg_cpu - before.pg_cpu),
        pg_cpu_besides_producers_us_per_event: per_event_us(
            (after.pg_cpu - after.producers_cpu) - (before.pg_cpu - before.producers_cpu),
        ),
        pg_relay_backends_us_per_event: before
            .backends_cpu
            .zip(after.backends_cpu)
            .map(|(b, a)| per_event_us(a - b)),
        statements_per_event: sc
            .mode
            .map(|_| (after.statements - before.statements) as f64 / events as f64),
        broker_cpu_us_per_event: before
            .broker_cpu
            .zip(after.broker_cpu)
            .map(|(b, a)| per_event_us(a - b)),
        tracing: sc.trace.label(),
        otlp,
    })
}

pub async fn wait_for(consumer: &TopicConsumer, count: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while consumer.count() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The server processes serving the relay: its walsender (CDC) or its polling backend.
async fn relay_backends(admin: &Client, db: &str, mode: Option<Mode>) -> Result<Vec<u32>> {
    let rows =
        match mode {
            None => return Ok(Vec::new()),
            Some(Mode::Cdc | Mode::CdcExactlyOnce | Mode::CdcKafkaTransactions | Mode::Debezium(_)) => {
                admin
                    .query(
                        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
                        &[&db],
                    )
                    .await?
            }
            Some(Mode::Poll { .. }) => admin
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'outbox-relay poll'",
                    &[&db],
                )
                .await?,
        };
    Ok(rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect())
}

/// Server processes of the sessions in `db` with this `application_name`.
async fn session_pids(admin: &Client, db: &str, application_name: &str) -> Result<Vec<u32>> {
    let rows = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
            &[&db, &application_name],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect())
}

async fn counters(
    ctx: &Ctx<'_>,
    admin: &Client,
    db: &str,
    relay_pid: Option<u32>,
    broker_pid: Option<u32>,
    backends: &[u32],
    producers: &[u32],
) -> Result<Counters> {
    let statements: i64 = admin
        .query_one(
            "SELECT coalesce(sum(s.calls), 0)::int8 FROM pg_stat_statements s \
             JOIN pg_roles r ON r.oid = s.userid JOIN pg_database d ON d.oid = s.dbid \
             WHERE r.rolname = $1 AND d.datname = $2",
            &[&RELAY_ROLE, &db],
        )
        .await?
        .get(0);
    let backends_cpu = if backends.is_empty() {
        None
    } else {
        backends.iter().map(|p| procfs::cpu_seconds(*p)).sum::<Option<f64>>()
    };
    Ok(Counters {
        at: Instant::now(),
        relay_cpu: relay_pid.and_then(procfs::cpu_seconds),
        pg_cpu: procfs::postgres_cpu(ctx.pg.postmaster_pid()?),
        // A producer session that ended would move its CPU into the postmaster's; they all live
        // until the run ends, so a missing one is a bug worth failing on.
        producers_cpu: producers
            .iter()
            .map(|p| procfs::cpu_seconds(*p))
            .sum::<Option<f64>>()
            .context("a producer session ended during the measurement")?,
        backends_cpu,
        statements,
        broker_cpu: broker_pid.and_then(procfs::cpu_seconds),
    })
}
