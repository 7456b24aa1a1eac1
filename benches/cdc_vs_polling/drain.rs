//! Backlog drain: N outbox rows pending in the slot (a relay outage during normal traffic: one
//! order and one event per transaction), published by the relay, against `pg_recvlogical`
//! draining a second slot with the same contents to `/dev/null` — the walsender's own limit, as
//! pgoutput decoding and the replication protocol allow, with no Kafka at all.
//!
//! Both slots are created before the fill, so they hold the same transactions. The relay's time
//! runs from process start until the slot's `confirmed_flush_lsn` reached the end of the fill
//! (the relay confirms only what Kafka acknowledged; `status_interval_ms = 100` bounds the
//! confirmation delay). `pg_recvlogical` stops by itself at that LSN (`--endpos`). Optionally the
//! polling relayer drains the same rows too (they are still pending in its terms).
//!
//! With `--with-debezium`, Debezium + Kafka Connect standalone (`debezium.rs`) reads a third slot,
//! also created before the fill, into a topic of its own (`dbz-` + the relay's topic). Its time
//! runs from the moment its connector started streaming (the JVM's start-up is reported apart)
//! until every record is in its topic (the partitions' high watermarks: Debezium confirms the slot
//! only when Connect flushes offsets, every 60 s by default, so the slot cannot tell); its CPU is
//! the JVM's over that window, its peak RSS the JVM's VmHWM. The fill is one event per
//! transaction, or `events_per_txn` per transaction (the batched shape).
//!
//! Every other broker of `--sinks` (NATS JetStream, RabbitMQ, Redis Streams) gets a relay of its
//! own on a slot of its own, also created before the fill, timed like the Kafka relay (process
//! start until the slot confirmed the end of the fill), one after the other. Then every event is
//! checked to be there exactly once: NATS and Redis keep what was published, so an ordered
//! consumer (NATS) or `XREAD` (Redis) reads the whole stream after the timed drain, beside the
//! stream's own count; a RabbitMQ exchange keeps nothing, so its consumer (an exclusive queue
//! bound before the relay starts, `basic.consume`) reads during the drain — its CPU then shares
//! the two cores with the relay and the broker, which the other brokers' drains do not have to.
//! The broker server's CPU over the drain window is taken from `/proc` (its process is the one
//! listening on its port): the broker's share of the work, and where a slow drain spends it.
//!
//! Exactly-once drains the same backlog twice per strategy, each on a slot of its own: once
//! uninterrupted, once SIGKILLed when half of it was confirmed and restarted. Read-back's topics
//! are counted by their offsets; Kafka transactions' (on a real broker) by a `read_committed`
//! consumer reading every record and its `id`, since a transactional topic's offsets also count
//! aborted records and commit markers.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::debezium::{ConnectChild, ConnectorConf, Install, Tuning};
use super::pg::{self, BenchPg, RELAY_ROLE};
use super::procfs;
use super::relay::{self, Mode, RelayChild, RelayConf, Trace};
use super::sinks::{Sink, SinkTarget};
use super::steady::{Ctx, SCHEMA};

const DB: &str = "bench_drain";
const RECV_SLOT: &str = "bench_drain_recv";
const DBZ_SLOT: &str = "bench_drain_dbz";
/// The relay in exactly-once mode, uninterrupted (its topics prefixed `eo.`) and SIGKILLed half-way
/// then restarted (`eoc.`), each on a slot of its own over the same WAL.
const EO_SLOT: &str = "bench_drain_eo";
const EO_CRASH_SLOT: &str = "bench_drain_eoc";
/// The same two with Kafka transactions (`tx.`, `txc.`).
const TX_SLOT: &str = "bench_drain_tx";
const TX_CRASH_SLOT: &str = "bench_drain_txc";
/// The events' `type`, so the relay's topic; one per drain shape (a topic outlives its drain).
fn topic(per_txn: u64) -> String {
    format!("bench-drain-{per_txn}")
}
const DBZ_TOPIC_PREFIX: &str = "dbz-";
pub const FILL_CHUNK: u64 = 20_000;
const LIMIT: Duration = Duration::from_secs(1800);

pub const FILL_PROCEDURE: &str = "
CREATE PROCEDURE bench_fill(n int, topic text, per_txn int) LANGUAGE plpgsql AS $$
DECLARE i int := 0; o uuid;
BEGIN
  WHILE i < n LOOP
    o := gen_random_uuid();
    INSERT INTO orders VALUES (o, gen_random_uuid(), 1000 + i % 90000, 'placed');
    INSERT INTO events_outbox (aggregate_id, type, payload)
      VALUES (o, topic, jsonb_build_object('order_id', o, 'customer_id', gen_random_uuid(),
              'total_cents', 1000 + i % 90000, 'currency', 'EUR',
              'items', jsonb_build_array(jsonb_build_object('sku', 'sku-' || i % 977, 'qty', 1 + i % 3))));
    i := i + 1;
    IF i % per_txn = 0 THEN COMMIT; END IF;
  END LOOP;
  COMMIT;
END $$;
";

/// Debezium + Kafka Connect on the same slot contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DebeziumDrain {
    /// JVM start to the connector streaming.
    pub startup_s: f64,
    /// Streaming start to the last record in the topic.
    pub seconds: f64,
    pub per_s: f64,
    /// The JVM's CPU over `seconds`.
    pub cpu_s: f64,
    pub cpu_us_per_event: f64,
    pub pg_cpu_s: f64,
    pub peak_rss_mib: f64,
    pub published: u64,
}

/// The relay with `relay.delivery = "exactly-once"` on the same slot contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExactlyOnceDrain {
    pub seconds: f64,
    pub per_s: f64,
    pub cpu_s: f64,
    pub cpu_us_per_event: f64,
    pub peak_rss_mib: f64,
    pub published: u64,
    /// SIGKILLed once half the backlog was confirmed, then restarted: what the restart's
    /// read-back did.
    pub restart_read_back_ms: u64,
    pub restart_partitions_read_back: u64,
    pub restart_skipped: u64,
    /// Records in the crashed relay's topic at the end (`rows`: no duplicate).
    pub crash_published: u64,
    /// Kafka transactions: distinct event ids among `crash_published` (`rows`: none lost).
    #[serde(default)]
    pub crash_distinct: Option<u64>,
}

/// The relay draining the same backlog into another broker (`--sinks`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkDrain {
    /// `Sink::name`.
    pub sink: String,
    pub seconds: f64,
    pub per_s: f64,
    pub pg_cpu_s: f64,
    pub cpu_s: f64,
    pub cpu_us_per_event: f64,
    pub peak_rss_mib: f64,
    /// The broker server's CPU over the drain window (`None`: its process was not found).
    pub broker_cpu_s: Option<f64>,
    /// Messages the broker holds at the end (NATS stream count, Redis XLEN; RabbitMQ: none).
    pub stored: Option<u64>,
    /// Messages the check's consumer read, and how many distinct events among them.
    pub received: u64,
    pub distinct: u64,
    /// Events of the backlog never read / read more than once.
    pub missing: u64,
    pub duplicates: u64,
    /// The consumer read during the drain (RabbitMQ) rather than after it.
    pub consumed_during_drain: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainOutcome {
    pub rows: u64,
    pub events_per_txn: u64,
    pub wal_mib: f64,
    pub fill_s: f64,
    pub recvlogical_s: f64,
    pub recvlogical_per_s: f64,
    pub recvlogical_pg_cpu_s: f64,
    pub relay_s: f64,
    pub relay_per_s: f64,
    pub relay_pg_cpu_s: f64,
    pub relay_cpu_s: f64,
    pub relay_cpu_us_per_event: f64,
    pub relay_peak_rss_mib: f64,
    pub published: u64,
    /// (seconds, events/s) of the polling relayer (interval 10 ms, batch 100) on the same rows.
    pub poll: Option<(f64, f64)>,
    pub debezium: Option<DebeziumDrain>,
    pub exactly_once: Option<ExactlyOnceDrain>,
    /// The same with `[kafka] exactly_once = "transactions"` (real brokers only; the
    /// restart's read-back fields are 0: it reads the checkpoint instead).
    #[serde(default)]
    pub transactions: Option<ExactlyOnceDrain>,
    /// The other brokers of `--sinks`, in that order (absent in results from before them).
    #[serde(default)]
    pub sinks: Vec<SinkDrain>,
}

pub struct DrainSpec<'a> {
    pub rows: u64,
    /// 1: one order and one event per transaction; more: that many per transaction.
    pub events_per_txn: u64,
    pub with_poll: bool,
    /// The exactly-once strategies' drains too (read-back; Kafka transactions where the broker
    /// has them).
    pub exactly_once: bool,
    pub debezium: Option<&'a Install>,
}

pub async fn run(ctx: &Ctx<'_>, spec: &DrainSpec<'_>, phase: &ProgressBar) -> Result<DrainOutcome> {
    let admin = pg::connect(&ctx.pg.url("postgres", "postgres")).await?;
    pg::recreate_database(&admin, DB).await?;
    let per_txn = spec.events_per_txn.max(1);
    let targets: Vec<SinkTarget> = ctx
        .sinks
        .iter()
        .filter_map(|s| SinkTarget::new(*s, ctx.run_id, &format!("drain{per_txn}")))
        .collect();
    let outcome = drain(ctx, &admin, spec, &targets, phase).await;
    for t in &targets {
        if let Err(e) = t.cleanup(&topic(per_txn)).await {
            phase.println(format!("cleaning up after the {} drain: {e:#}", t.sink.name()));
        }
    }
    pg::drop_database(&admin, DB).await?;
    outcome
}

/// The slot of the relay publishing to `sink` in the drain.
fn sink_slot(sink: Sink) -> String {
    format!("{DB}_{}", sink.word())
}

async fn drain(
    ctx: &Ctx<'_>,
    admin: &Client,
    spec: &DrainSpec<'_>,
    targets: &[SinkTarget],
    phase: &ProgressBar,
) -> Result<DrainOutcome> {
    let rows = spec.rows;
    let per_txn = spec.events_per_txn.max(1);
    let db = pg::connect(&ctx.pg.url("postgres", DB)).await?;
    db.batch_execute(SCHEMA).await?;
    db.batch_execute(FILL_PROCEDURE).await?;
    let conf = RelayConf {
        url: &ctx.pg.url(RELAY_ROLE, DB),
        slot: DB,
        bootstrap: ctx.broker.bootstrap(),
        mode: Mode::Cdc,
        metrics_port: None,
        status_interval_ms: 100,
        kafka: ctx.kafka,
        topic_prefix: "",
        sink: None,
        trace: Trace::Off,
        otlp_endpoint: None,
    };
    let config = conf.write(ctx.workdir)?;
    relay::setup(&config, false)?;
    // `setup` creates each broker's stream / exchange with the slot, before the fill.
    let slots: Vec<String> = targets.iter().map(|t| sink_slot(t.sink)).collect();
    let mut sink_paths = Vec::new();
    for (t, slot) in targets.iter().zip(&slots) {
        let c = RelayConf {
            slot,
            topic_prefix: &t.prefix,
            sink: Some(t),
            ..conf
        };
        let path = c.write(ctx.workdir)?;
        relay::setup(&path, false)?;
        sink_paths.push(path);
    }
    let mut eo_strategies = Vec::new();
    if spec.exactly_once {
        eo_strategies.push(Strategy::READ_BACK);
    }
    if spec.exactly_once && ctx.broker.has_transactions() {
        eo_strategies.push(Strategy::TRANSACTIONS);
    }
    let mut eo_paths = Vec::new();
    for strategy in &eo_strategies {
        let mut paths = Vec::new();
        for (slot, prefix) in [
            (strategy.slot, strategy.prefix),
            (strategy.crash_slot, strategy.crash_prefix),
        ] {
            let c = RelayConf {
                slot,
                mode: strategy.mode,
                topic_prefix: prefix,
                ..conf
            };
            let path = c.write(ctx.workdir)?;
            relay::setup(&path, false)?;
            paths.push(path);
        }
        eo_paths.push(paths);
    }
    // A logical slot belongs to the database it was created from.
    db.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&RECV_SLOT],
    )
    .await?;
    if spec.debezium.is_some() {
        db.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&DBZ_SLOT],
        )
        .await?;
    }

    phase.set_message(format!(
        "drain: inserting {rows} pending events ({per_txn} per transaction)"
    ));
    phase.set_length(rows);
    phase.set_position(0);
    let start_lsn = current_lsn(&db).await?;
    let fill_started = Instant::now();
    let mut filled = 0;
    while filled < rows {
        let n = FILL_CHUNK.min(rows - filled);
        db.execute(
            "CALL bench_fill($1, $2, $3)",
            &[&(n as i32), &topic(per_txn), &(per_txn as i32)],
        )
        .await?;
        filled += n;
        phase.set_position(filled);
    }
    let fill_s = fill_started.elapsed().as_secs_f64();
    let end_lsn = current_lsn(&db).await?;
    let wal_bytes: i64 = db
        .query_one(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::int8",
            &[&end_lsn, &start_lsn],
        )
        .await?
        .get(0);
    let postmaster = ctx.pg.postmaster_pid()?;

    phase.set_message("drain: pg_recvlogical → /dev/null");
    phase.set_length(0);
    let pg_cpu = procfs::postgres_cpu(postmaster);
    let started = Instant::now();
    let status = Command::new(BenchPg::tool("pg_recvlogical"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &ctx.pg.port().to_string(),
            "-U",
            RELAY_ROLE,
            "-d",
            DB,
        ])
        .args([
            "--slot",
            RECV_SLOT,
            "--start",
            "--endpos",
            &end_lsn,
            "--no-loop",
            "-F",
            "0",
            "-f",
            "/dev/null",
        ])
        .args(["-o", "proto_version=1", "-o", &format!("publication_names={DB}")])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting pg_recvlogical")?
        .wait_with_output()?;
    let recvlogical_s = started.elapsed().as_secs_f64();
    // Let the walsender exit and be reaped: an exiting process's CPU shows up in the
    // postmaster's cutime only then.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let recvlogical_pg_cpu_s = procfs::postgres_cpu(postmaster) - pg_cpu;
    if !status.status.success() {
        bail!("pg_recvlogical failed: {}", String::from_utf8_lossy(&status.stderr));
    }

    phase.set_message("drain: outbox-relay run → Kafka");
    ctx.broker.create_topic(&topic(per_txn), 4).await?;
    let pg_cpu = procfs::postgres_cpu(postmaster);
    let started = Instant::now();
    let mut child = RelayChild::start(&config, Mode::Cdc).await?;
    let pid = child.pid();
    wait_confirmed(admin, &mut child, DB, &end_lsn, started).await?;
    let relay_s = started.elapsed().as_secs_f64();
    let relay_pg_cpu_s = procfs::postgres_cpu(postmaster) - pg_cpu;
    let relay_cpu_s = procfs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let relay_peak_rss_mib = procfs::vm_kib(pid, "VmHWM").unwrap_or(0) as f64 / 1024.0;
    child.stop().await?;
    let published = published(ctx.broker.bootstrap(), &topic(per_txn))?;

    let mut sinks = Vec::new();
    for ((t, slot), path) in targets.iter().zip(&slots).zip(&sink_paths) {
        let job = SinkJob {
            target: t,
            slot,
            config: path,
            rows,
            topic: &topic(per_txn),
            end_lsn: &end_lsn,
            postmaster,
        };
        match sink_drain(admin, &db, &job, phase).await {
            Ok(d) => sinks.push(d),
            Err(e) => phase.println(format!("FAILED backlog drain into {}: {e:#}", t.sink.name())),
        }
    }

    let mut eo_drains = Vec::new();
    for (strategy, paths) in eo_strategies.iter().zip(&eo_paths) {
        let job = ExactlyOnceJob {
            strategy,
            configs: paths,
            rows,
            per_txn,
            start_lsn: &start_lsn,
            end_lsn: &end_lsn,
        };
        eo_drains.push(exactly_once_drain(ctx, admin, &job, phase).await?);
    }
    let mut eo_drains = eo_drains.into_iter();
    let exactly_once = eo_drains.next();
    let transactions = eo_drains.next();

    // Before the polling relayer: its UPDATEs would add WAL behind the backlog.
    let debezium = match spec.debezium {
        Some(install) => Some(debezium_drain(ctx, install, rows, &topic(per_txn), postmaster, phase).await?),
        None => None,
    };
    let poll = if spec.with_poll {
        Some(poll_drain(ctx, &db, &config, rows, phase).await?)
    } else {
        None
    };
    Ok(DrainOutcome {
        rows,
        events_per_txn: per_txn,
        wal_mib: wal_bytes as f64 / (1024.0 * 1024.0),
        fill_s,
        recvlogical_s,
        recvlogical_per_s: rows as f64 / recvlogical_s,
        recvlogical_pg_cpu_s,
        relay_s,
        relay_per_s: rows as f64 / relay_s,
        relay_pg_cpu_s,
        relay_cpu_s,
        relay_cpu_us_per_event: relay_cpu_s * 1e6 / rows as f64,
        relay_peak_rss_mib,
        published,
        poll,
        debezium,
        exactly_once,
        transactions,
        sinks,
    })
}

/// One broker's drain: what it needs from [`drain`].
struct SinkJob<'a> {
    target: &'a SinkTarget,
    slot: &'a str,
    config: &'a std::path::Path,
    rows: u64,
    topic: &'a str,
    end_lsn: &'a str,
    postmaster: u32,
}

/// How long the check's consumer may take to read the whole backlog (bounded, generous).
fn read_limit(rows: u64) -> Duration {
    Duration::from_secs(60 + rows / 2_000)
}

async fn sink_drain(admin: &Client, db: &Client, job: &SinkJob<'_>, phase: &ProgressBar) -> Result<SinkDrain> {
    let sink = job.target.sink;
    phase.set_message(format!("drain: outbox-relay run → {}", sink.name()));
    // An exchange and an endpoint keep nothing (and see `Sink::read_during_drain` for the
    // others read during the drain).
    let during = sink.read_during_drain();
    let mut consumer = if during {
        Some(tokio::task::block_in_place(|| job.target.consumer(job.topic))?)
    } else {
        job.target.prepare(job.topic).await?;
        None
    };
    let broker_pid = sink.broker_pid();
    let broker_cpu = broker_pid.and_then(procfs::cpu_seconds);
    let pg_cpu = procfs::postgres_cpu(job.postmaster);
    let started = Instant::now();
    let mut child = RelayChild::start(job.config, Mode::Cdc).await?;
    let pid = child.pid();
    wait_confirmed(admin, &mut child, job.slot, job.end_lsn, started).await?;
    let seconds = started.elapsed().as_secs_f64();
    let pg_cpu_s = procfs::postgres_cpu(job.postmaster) - pg_cpu;
    let cpu_s = procfs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let broker_cpu_s = broker_cpu
        .zip(broker_pid.and_then(procfs::cpu_seconds))
        .map(|(b, a)| a - b);
    let peak_rss_mib = procfs::vm_kib(pid, "VmHWM").unwrap_or(0) as f64 / 1024.0;
    child.stop().await?;

    phase.set_message(format!("drain: checking every event in {}", sink.name()));
    if consumer.is_none() {
        consumer = Some(tokio::task::block_in_place(|| job.target.consumer(job.topic))?);
    }
    let consumer = consumer.context("no consumer")?;
    let (first, last, count): (i64, i64, i64) = {
        let row = db
            .query_one(
                "SELECT coalesce(min(id), 0)::int8, coalesce(max(id), 0)::int8, count(*)::int8 FROM events_outbox",
                &[],
            )
            .await?;
        (row.get(0), row.get(1), row.get(2))
    };
    super::steady::wait_for(&consumer, count as u64, read_limit(job.rows)).await;
    // A little longer: a duplicate would arrive after the last new event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let receipts = consumer.finish();
    let stored = job.target.stored(job.topic).await?;
    let mut ids: Vec<i64> = receipts.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    let received = ids.len() as u64;
    ids.dedup();
    let distinct = ids.len() as u64;
    let in_backlog = ids.iter().filter(|id| (first..=last).contains(*id)).count() as u64;
    Ok(SinkDrain {
        sink: sink.name().to_owned(),
        seconds,
        per_s: job.rows as f64 / seconds,
        pg_cpu_s,
        cpu_s,
        cpu_us_per_event: cpu_s * 1e6 / job.rows as f64,
        peak_rss_mib,
        broker_cpu_s,
        stored,
        received,
        distinct,
        missing: (count as u64).saturating_sub(in_backlog),
        duplicates: received - distinct,
        consumed_during_drain: during,
    })
}

/// Waits (bounded) until `slot` confirmed `lsn`.
async fn wait_confirmed(admin: &Client, relay: &mut RelayChild, slot: &str, lsn: &str, started: Instant) -> Result<()> {
    loop {
        let done: bool = admin
            .query_one(
                "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot, &lsn],
            )
            .await?
            .get::<_, Option<bool>>(0)
            .unwrap_or(false);
        if done {
            return Ok(());
        }
        relay
            .ensure_running()
            .with_context(|| format!("slot {slot} had not confirmed {lsn}"))?;
        if started.elapsed() > LIMIT {
            bail!("slot {slot} did not confirm {lsn} within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `key=value` number from the first log line containing `marker` (0 when absent).
fn summary_field(log: &str, marker: &str, key: &str) -> u64 {
    log.lines()
        .find(|l| l.contains(marker))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or(0)
}

/// One exactly-once strategy's drains: its relay mode, and its two slots and topic prefixes
/// (uninterrupted; SIGKILLed half-way and restarted).
struct Strategy {
    mode: Mode,
    slot: &'static str,
    prefix: &'static str,
    crash_slot: &'static str,
    crash_prefix: &'static str,
}

impl Strategy {
    const READ_BACK: Strategy = Strategy {
        mode: Mode::CdcExactlyOnce,
        slot: EO_SLOT,
        prefix: "eo.",
        crash_slot: EO_CRASH_SLOT,
        crash_prefix: "eoc.",
    };
    const TRANSACTIONS: Strategy = Strategy {
        mode: Mode::CdcKafkaTransactions,
        slot: TX_SLOT,
        prefix: "tx.",
        crash_slot: TX_CRASH_SLOT,
        crash_prefix: "txc.",
    };

    fn transactional(&self) -> bool {
        self.mode == Mode::CdcKafkaTransactions
    }
}

/// What [`exactly_once_drain`] needs besides the context.
struct ExactlyOnceJob<'a> {
    strategy: &'a Strategy,
    /// The uninterrupted relay's config, then the crashed one's.
    configs: &'a [PathBuf],
    rows: u64,
    per_txn: u64,
    start_lsn: &'a str,
    end_lsn: &'a str,
}

/// Records in `topic` and distinct event ids among them: with a transactional topic, what a
/// `read_committed` consumer reads (offsets count aborted records and markers too); otherwise
/// the offsets (`None` distinct: not read).
fn counted(bootstrap: &str, topic: &str, transactional: bool, rows: u64) -> Result<(u64, Option<u64>)> {
    if !transactional {
        return Ok((published(bootstrap, topic)?, None));
    }
    let (records, distinct) = committed_records(bootstrap, topic, rows)?;
    Ok((records, Some(distinct)))
}

/// The backlog drained by the relay in exactly-once mode by `job.strategy`: once uninterrupted
/// (rate, CPU, RSS beside at-least-once), once SIGKILLed half-way and restarted (what the restart
/// read back or skipped, and the records a consumer finds).
async fn exactly_once_drain(
    ctx: &Ctx<'_>,
    admin: &Client,
    job: &ExactlyOnceJob<'_>,
    phase: &ProgressBar,
) -> Result<ExactlyOnceDrain> {
    let s = job.strategy;
    let what = s.mode.label();
    phase.set_message(format!("drain: outbox-relay run, {what} → Kafka"));
    let topic_eo = format!("{}{}", s.prefix, topic(job.per_txn));
    let topic_crash = format!("{}{}", s.crash_prefix, topic(job.per_txn));
    ctx.broker.create_topic(&topic_eo, 4).await?;
    ctx.broker.create_topic(&topic_crash, 4).await?;
    let started = Instant::now();
    let mut child = RelayChild::start(&job.configs[0], s.mode).await?;
    let pid = child.pid();
    wait_confirmed(admin, &mut child, s.slot, job.end_lsn, started).await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_s = procfs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let peak_rss_mib = procfs::vm_kib(pid, "VmHWM").unwrap_or(0) as f64 / 1024.0;
    child.stop().await?;
    let (eo_published, _) = counted(ctx.broker.bootstrap(), &topic_eo, s.transactional(), job.rows)?;

    phase.set_message(format!("drain: {what}, SIGKILL half-way and restart"));
    let half: String = admin
        .query_one(
            "SELECT ($1::text::pg_lsn + pg_wal_lsn_diff($2::text::pg_lsn, $1::text::pg_lsn) / 2)::text",
            &[&job.start_lsn, &job.end_lsn],
        )
        .await?
        .get(0);
    let started = Instant::now();
    let mut first = RelayChild::start(&job.configs[1], s.mode).await?;
    wait_confirmed(admin, &mut first, s.crash_slot, &half, started).await?;
    // Dropping a running child SIGKILLs it: everything in flight is the replay window.
    drop(first);
    let mut second = RelayChild::start(&job.configs[1], s.mode).await?;
    wait_confirmed(admin, &mut second, s.crash_slot, job.end_lsn, started).await?;
    second.stop().await?;
    // Read after the stop: the transactions' summary is written when the session ends. The
    // restart wrote the log afresh (`RelayChild::start`).
    let log = std::fs::read_to_string(job.configs[1].with_extension("log")).unwrap_or_default();
    let (crash_published, crash_distinct) = counted(ctx.broker.bootstrap(), &topic_crash, s.transactional(), job.rows)?;
    let read_back = "exactly-once: replay window checked against the sink";
    Ok(ExactlyOnceDrain {
        seconds,
        per_s: job.rows as f64 / seconds,
        cpu_s,
        cpu_us_per_event: cpu_s * 1e6 / job.rows as f64,
        peak_rss_mib,
        published: eo_published,
        restart_read_back_ms: summary_field(&log, read_back, "read_back_ms"),
        restart_partitions_read_back: summary_field(&log, read_back, "partitions_read_back"),
        restart_skipped: if s.transactional() {
            summary_field(
                &log,
                "sink transactions: session summary",
                "skipped_at_or_below_checkpoint",
            )
        } else {
            summary_field(&log, read_back, "skipped_already_in_sink")
        },
        crash_published,
        crash_distinct,
    })
}

async fn debezium_drain(
    ctx: &Ctx<'_>,
    install: &Install,
    rows: u64,
    relay_topic: &str,
    postmaster: u32,
    phase: &ProgressBar,
) -> Result<DebeziumDrain> {
    phase.set_message("drain: Debezium + Kafka Connect → Kafka (starting the JVM)");
    let topic = format!("{DBZ_TOPIC_PREFIX}{relay_topic}");
    ctx.broker.create_topic(&topic, 4).await?;
    let conf = ConnectorConf {
        name: "bench_drain_dbz",
        pg_port: ctx.pg.port(),
        user: RELAY_ROLE,
        db: DB,
        slot: DBZ_SLOT,
        // The relay's setup created it (FOR TABLE events_outbox, publish = 'insert').
        publication: DB,
        bootstrap: ctx.broker.bootstrap(),
        topic_prefix: DBZ_TOPIC_PREFIX,
        tuning: Tuning::Defaults,
    };
    let mut connect = ConnectChild::start(install, &conf, ctx.workdir).await?;
    let started = Instant::now();
    let pid = connect.pid();
    let cpu_at_start = procfs::cpu_seconds(pid).unwrap_or(f64::NAN);
    let pg_cpu = procfs::postgres_cpu(postmaster);
    phase.set_message("drain: Debezium + Kafka Connect → Kafka");
    phase.set_length(rows);
    let counter: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", ctx.broker.bootstrap())
        .create()?;
    let published = loop {
        let n = topic_records(&counter, &topic, 4)?;
        phase.set_position(n);
        if n >= rows {
            break n;
        }
        connect.check_alive()?;
        if started.elapsed() > LIMIT {
            bail!("Debezium did not publish {rows} events within {LIMIT:?} ({n} so far)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    let cpu_s = procfs::cpu_seconds(pid).unwrap_or(f64::NAN) - cpu_at_start;
    let pg_cpu_s = procfs::postgres_cpu(postmaster) - pg_cpu;
    let peak_rss_mib = procfs::vm_kib(pid, "VmHWM").unwrap_or(0) as f64 / 1024.0;
    let startup_s = connect.startup_s;
    connect.stop().await?;
    Ok(DebeziumDrain {
        startup_s,
        seconds,
        per_s: rows as f64 / seconds,
        cpu_s,
        cpu_us_per_event: cpu_s * 1e6 / rows as f64,
        pg_cpu_s,
        peak_rss_mib,
        published,
    })
}

/// The sum of the high watermarks of `topic`'s partitions 0..`partitions`.
fn topic_records(consumer: &BaseConsumer, topic: &str, partitions: i32) -> Result<u64> {
    let mut total = 0;
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        total += high.max(0) as u64;
    }
    Ok(total)
}

async fn poll_drain(
    ctx: &Ctx<'_>,
    db: &Client,
    cdc_config: &std::path::Path,
    rows: u64,
    phase: &ProgressBar,
) -> Result<(f64, f64)> {
    phase.set_message("drain: outbox-relay poll (10 ms, batch 100) → Kafka");
    // Same rows, same topic: completion is measured in the table (no row left pending).
    db.batch_execute("ANALYZE events_outbox").await?;
    let conf = RelayConf {
        url: &ctx.pg.url(RELAY_ROLE, DB),
        slot: "bench_drain_poll",
        bootstrap: ctx.broker.bootstrap(),
        mode: Mode::Poll { interval_ms: 10 },
        metrics_port: None,
        status_interval_ms: 1000,
        kafka: ctx.kafka,
        topic_prefix: "",
        sink: None,
        trace: Trace::Off,
        otlp_endpoint: None,
    };
    let config = conf.write(cdc_config.parent().unwrap_or(ctx.workdir))?;
    relay::setup(&config, true)?;
    let started = Instant::now();
    let child = RelayChild::start(&config, conf.mode).await?;
    loop {
        let pending: i64 = db
            .query_one("SELECT count(*) FROM events_outbox WHERE dispatched_at IS NULL", &[])
            .await?
            .get(0);
        phase.set_position(rows.saturating_sub(pending as u64));
        if pending == 0 {
            break;
        }
        if started.elapsed() > LIMIT {
            bail!("the polling relayer did not drain {rows} events within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    child.stop().await?;
    Ok((secs, rows as f64 / secs))
}

async fn current_lsn(db: &Client) -> Result<String> {
    Ok(db.query_one("SELECT pg_current_wal_lsn()::text", &[]).await?.get(0))
}

/// Records in `topic`: the sum of its partitions' high watermarks.
/// Every record of `topic` as a `read_committed` consumer reads it, from the start of each
/// partition to its end: (records, distinct `id` headers). Bounded: `LIMIT` overall, and an
/// error if `expected` distinct ids are not all there after the partitions' ends were reached.
pub fn committed_records(bootstrap: &str, topic: &str, expected: u64) -> Result<(u64, u64)> {
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-count-{topic}"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len());
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p as i32, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let (mut records, mut ids, mut at_end) = (0u64, std::collections::HashSet::new(), std::collections::HashSet::new());
    let started = Instant::now();
    while at_end.len() < partitions {
        if started.elapsed() > LIMIT {
            bail!("reading {topic} back took longer than {LIMIT:?}");
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                records += 1;
                let id = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "id")
                        .and_then(|h| h.value.map(<[u8]>::to_vec))
                });
                ids.insert(id.unwrap_or_default());
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => bail!("reading {topic} back: {e}"),
            None => {}
        }
    }
    if (ids.len() as u64) < expected {
        bail!(
            "{topic} holds {} distinct events of {expected}: events were lost",
            ids.len()
        );
    }
    Ok((records, ids.len() as u64))
}

fn published(bootstrap: &str, topic: &str) -> Result<u64> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len());
    let mut total = 0;
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(10))?;
        total += high.max(0) as u64;
    }
    Ok(total)
}
