//! The idle relay: `outbox-relay run` (CDC, Kafka, the steady runs' config) with no events at
//! all for a window (`--idle-secs`; 60 s, 15 s with `--quick`) after a warm-up that published
//! events (so every connection, producer and timer is live). What a sidecar relay costs next to a
//! quiet database: CPU as a share of one core and seconds per minute, its threads, each thread's
//! CPU over the window (`/proc/<pid>/task/*`: `schedstat` nanoseconds, `comm` names), and context
//! switches per second (voluntary + involuntary, every thread) as the count of wake-ups. The
//! walsender serving it is measured beside it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::consumer::TopicConsumer;
use super::load::{self, LoadSpec, Producers};
use super::pg::{self, RELAY_ROLE};
use super::procfs::{self, ThreadStat};
use super::relay::{self, Mode, RelayChild, RelayConf, Trace};
use super::steady::{wait_for, Ctx, SCHEMA};

const DB: &str = "bench_idle";
const TOPIC: &str = "bench-idle";
const WARMUP_RATE: f64 = 100.0;
const STATUS_INTERVAL_MS: u64 = 1000;
/// After the warm-up's last event arrived, before the window opens: the last acknowledgements'
/// confirmation and status update go out.
const SETTLE: Duration = Duration::from_secs(2);

/// One thread name's share of the idle window (threads of the same name summed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadCpu {
    pub name: String,
    pub threads: usize,
    pub cpu_ms: f64,
    pub switches_per_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleOutcome {
    pub seconds: f64,
    pub warmup_events: u64,
    pub status_interval_ms: u64,
    /// Relay CPU over the window: seconds, percent of one core, seconds per minute.
    pub cpu_s: f64,
    pub cpu_pct_core: f64,
    pub cpu_s_per_min: f64,
    pub threads: usize,
    pub per_thread: Vec<ThreadCpu>,
    pub voluntary_switches_per_s: f64,
    pub nonvoluntary_switches_per_s: f64,
    pub rss_mib: Option<f64>,
    /// The walsender serving the relay, percent of one core over the same window.
    pub walsender_cpu_pct_core: Option<f64>,
}

pub async fn run(ctx: &Ctx<'_>, warmup: Duration, window: Duration, phase: &ProgressBar) -> Result<IdleOutcome> {
    let admin = pg::connect(&ctx.pg.url("postgres", "postgres")).await?;
    pg::recreate_database(&admin, DB).await?;
    let outcome = measure(ctx, &admin, warmup, window, phase).await;
    pg::drop_database(&admin, DB).await?;
    outcome
}

async fn measure(
    ctx: &Ctx<'_>,
    admin: &tokio_postgres::Client,
    warmup: Duration,
    window: Duration,
    phase: &ProgressBar,
) -> Result<IdleOutcome> {
    let load_url = ctx.pg.url("postgres", DB);
    pg::connect(&load_url).await?.batch_execute(SCHEMA).await?;
    ctx.broker.create_topic(TOPIC, 4).await?;
    let conf = RelayConf {
        url: &ctx.pg.url(RELAY_ROLE, DB),
        slot: DB,
        bootstrap: ctx.broker.bootstrap(),
        mode: Mode::Cdc,
        // As in the steady runs: the HTTP server (metrics, /latency) is part of the relay.
        metrics_port: Some(pg::free_port()),
        status_interval_ms: STATUS_INTERVAL_MS,
        kafka: ctx.kafka,
        topic_prefix: "",
        sink: None,
        trace: Trace::Off,
        otlp_endpoint: None,
    };
    let path = conf.write(ctx.workdir)?;
    relay::setup(&path, false)?;
    let consumer = TopicConsumer::start(ctx.broker.bootstrap(), TOPIC, 4)?;
    let relay = RelayChild::start(&path, Mode::Cdc).await?;
    let pid = relay.pid();

    phase.set_message("idle relay: warm-up");
    phase.set_position(0);
    let producers = Producers::connect(&load_url, 2).await?;
    let warm = load::run(
        &producers,
        &LoadSpec {
            rate: Some(WARMUP_RATE),
            events_per_txn: 1,
            duration: warmup.max(Duration::from_secs(1)),
            event_type: TOPIC.to_owned(),
            traceparent: None,
        },
        phase,
    )
    .await?;
    drop(producers);
    let warmup_events = warm.commits.len() as u64;
    wait_for(&consumer, warmup_events, Duration::from_secs(60)).await;
    let arrived = consumer.count();
    drop(consumer.finish());
    if arrived < warmup_events {
        anyhow::bail!("idle run: only {arrived} of {warmup_events} warm-up events arrived");
    }
    tokio::time::sleep(SETTLE).await;

    let walsender: Option<u32> = admin
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
            &[&DB],
        )
        .await?
        .and_then(|r| r.get::<_, Option<i32>>(0))
        .map(|p| p as u32);
    phase.set_message(format!("idle relay: {} s without events", window.as_secs()));
    let before = procfs::threads(pid);
    let process_before = procfs::cpu_seconds(pid);
    let wal_before = walsender.and_then(procfs::cpu_seconds);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = procfs::threads(pid);
    let process_after = procfs::cpu_seconds(pid);
    let wal_after = walsender.and_then(procfs::cpu_seconds);
    let seconds = started.elapsed().as_secs_f64();
    let rss_mib = procfs::vm_kib(pid, "VmRSS").map(|k| k as f64 / 1024.0);
    relay.stop().await.context("stopping the idle relay")?;

    let (per_thread, totals) = per_thread(&before, &after, seconds);
    // The threads' nanoseconds; the process's own counter (clock ticks) when larger, which only
    // a thread that ended inside the window can make it.
    let threads_cpu_s = per_thread.iter().map(|t| t.cpu_ms).sum::<f64>() / 1000.0;
    let process_cpu_s = process_before.zip(process_after).map_or(0.0, |(b, a)| a - b);
    let cpu_s = if process_cpu_s > threads_cpu_s + 0.02 {
        process_cpu_s
    } else {
        threads_cpu_s
    };
    Ok(IdleOutcome {
        seconds,
        warmup_events,
        status_interval_ms: STATUS_INTERVAL_MS,
        cpu_s,
        cpu_pct_core: cpu_s / seconds * 100.0,
        cpu_s_per_min: cpu_s / seconds * 60.0,
        threads: after.len(),
        per_thread,
        voluntary_switches_per_s: totals.0 as f64 / seconds,
        nonvoluntary_switches_per_s: totals.1 as f64 / seconds,
        rss_mib,
        walsender_cpu_pct_core: wal_before.zip(wal_after).map(|(b, a)| (a - b) / seconds * 100.0),
    })
}

/// Each thread's CPU and switches between the snapshots (a thread born in the window counts from
/// zero), summed per name, busiest first; and the (voluntary, involuntary) switch totals.
fn per_thread(before: &[ThreadStat], after: &[ThreadStat], seconds: f64) -> (Vec<ThreadCpu>, (u64, u64)) {
    let mut by_name: BTreeMap<String, (usize, f64, u64)> = BTreeMap::new();
    let (mut voluntary, mut involuntary) = (0, 0);
    for t in after {
        let b = before.iter().find(|b| b.tid == t.tid);
        let cpu = t.cpu - b.map_or(0.0, |b| b.cpu);
        let v = t
            .voluntary_switches
            .saturating_sub(b.map_or(0, |b| b.voluntary_switches));
        let n = t
            .nonvoluntary_switches
            .saturating_sub(b.map_or(0, |b| b.nonvoluntary_switches));
        voluntary += v;
        involuntary += n;
        let e = by_name.entry(t.name.clone()).or_default();
        e.0 += 1;
        e.1 += cpu.max(0.0);
        e.2 += v + n;
    }
    let mut out: Vec<ThreadCpu> = by_name
        .into_iter()
        .map(|(name, (threads, cpu, switches))| ThreadCpu {
            name,
            threads,
            cpu_ms: cpu * 1000.0,
            switches_per_s: switches as f64 / seconds,
        })
        .collect();
    out.sort_by(|a, b| b.cpu_ms.total_cmp(&a.cpu_ms));
    (out, (voluntary, involuntary))
}
