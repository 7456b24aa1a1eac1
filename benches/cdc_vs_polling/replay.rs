//! Replay beside a running relay (`--replay`): `outbox-relay replay` re-publishing a journal of
//! `--replay-rows` rows (1,000,000; `--quick`: 100,000) while `outbox-relay run` streams a
//! steady 1,000 events/s — the replay's throughput and CPU, and what it costs the stream.
//!
//! The journal is inserted before `setup` creates the slot (in transactions of
//! [`FILL_PER_TXN`] rows, then `VACUUM ANALYZE`, as a day-old table would be): the stream never
//! sees those rows, so its topic carries only the live load and its latencies are the stream's
//! alone, not a backlog drain's. Their `type` routes them to a topic of their own
//! ([`HISTORY_TOPIC`]); the first replay sends them there (routed, as an incident's replay
//! would), the rate-limited one (`--replay-rate`, 10,000/s; 0: none) to one topic of its own by
//! `--to-topic` — so every topic is counted on its own.
//!
//! Sequence, one relay and one load for the whole run: relay started → load at 1,000 events/s →
//! warm-up → **baseline window** (`--replay-baseline-secs`: 30 s; `--quick`: 10 s) → the replay
//! started as a process of its own (`outbox-relay replay --since id:1 --until id:<rows + 1>`, same
//! config file as the relay, under `/usr/bin/time` for its exact CPU and peak RSS) → **replay
//! window** until it exits → a **control window** as long (at most [`CONTROL_MAX`]) with no
//! replay → the rate-limited replay's window and its control window → the load stops, every
//! stream event is awaited. The control windows tell the replay's effect on the stream's tail
//! from the shared machine's noise of the same minutes (other processes' bursts land in any
//! window). The stream's commit→consumer latencies are split by the event's
//! commit instant into those windows (same run, same relay: the ratio is the figure). Each replay
//! topic is then read back by a consumer (every record's `id` header): all rows must be there.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::consumer::TopicConsumer;
use super::drain::{committed_records, FILL_CHUNK, FILL_PROCEDURE};
use super::load::{self, Commit, LoadSpec, Producers};
use super::pg::{self, RELAY_ROLE};
use super::procfs;
use super::relay::{self, Mode, RelayChild, RelayConf, Trace};
use super::stats::{self, Delivery, Percentiles};
use super::steady::{wait_for, Ctx, SCHEMA};

const DB: &str = "bench_replay";
/// The live load's `type`, so the stream's topic.
const STREAM_TOPIC: &str = "bench-replay-stream";
/// The journal rows' `type`: the routed replay's topic.
const HISTORY_TOPIC: &str = "bench-replay-history";
/// The rate-limited replay's `--to-topic`.
const RATE_TOPIC: &str = "bench-replay-rate";
const PARTITIONS: i32 = 4;
/// Journal rows per transaction when seeding (the shape does not matter to a replay, which
/// reads the table, and big transactions seed faster).
const FILL_PER_TXN: i32 = 10_000;
const STREAM_RATE: f64 = 1_000.0;
/// The load runs in chunks this long (a new chunk starts within ~50 ms of the last one's end).
const LOAD_CHUNK: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_secs(5);
/// The longest control window after a replay.
const CONTROL_MAX: Duration = Duration::from_secs(30);
/// A replay that takes longer than this is stopped and reported as failed.
const REPLAY_LIMIT: Duration = Duration::from_secs(1200);

pub struct ReplaySpec {
    pub rows: u64,
    pub baseline: Duration,
    /// `--rate` of the second replay; `None`: only the unlimited one.
    pub rate: Option<u32>,
}

/// One window of the stream (commit instants inside it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamWindow {
    pub label: String,
    pub seconds: f64,
    pub delivery: Delivery,
    /// The relay's own commit→ack window (`GET /latency`) over the same span.
    pub ack: Option<Percentiles>,
    /// The running relay's CPU over the window: share of one core, and µs per stream event.
    pub relay_cpu_core_share: f64,
    pub relay_cpu_us_per_event: f64,
    /// Every PostgreSQL process, share of one core.
    pub pg_cpu_core_share: f64,
    /// The broker's JVM, share of one core (`--broker kafka` only).
    pub broker_cpu_core_share: Option<f64>,
}

/// One `outbox-relay replay` process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayRun {
    pub label: String,
    pub rate: Option<u32>,
    pub topic: String,
    /// Spawn to exit.
    pub wall_s: f64,
    /// Distinct event ids the consumer read from the topic, over `wall_s`.
    pub per_s: f64,
    pub records: u64,
    pub distinct: u64,
    /// What the replay printed (its own word, beside the consumer's count).
    pub summary: String,
    /// `/usr/bin/time`'s user + system seconds and peak RSS of the replay process.
    pub cpu_s: f64,
    pub cpu_us_per_event: f64,
    pub peak_rss_mib: f64,
    pub window: StreamWindow,
    /// The stream right after the replay, as long as its window (at most [`CONTROL_MAX`]).
    #[serde(default)]
    pub control: Option<StreamWindow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayOutcome {
    pub date_utc: String,
    pub command: String,
    pub git: String,
    pub broker: String,
    pub rows: u64,
    pub fill_s: f64,
    pub table_mib: f64,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures, at the start and the end of the measurement.
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub baseline: StreamWindow,
    pub replays: Vec<ReplayRun>,
    /// The stream's whole run: every event delivered, none lost.
    pub stream_total: Delivery,
    pub relay_rss_mib: Option<f64>,
    pub relay_peak_rss_mib: Option<f64>,
}

#[derive(Clone, Copy)]
struct Counters {
    at: Instant,
    relay: f64,
    pg: f64,
    broker: Option<f64>,
}

struct Probe {
    relay_pid: u32,
    postmaster: u32,
    broker_pid: Option<u32>,
    metrics_port: u16,
}

impl Probe {
    fn read(&self) -> Result<Counters> {
        Ok(Counters {
            at: Instant::now(),
            relay: procfs::cpu_seconds(self.relay_pid).context("the relay exited during the replay run")?,
            pg: procfs::postgres_cpu(self.postmaster),
            broker: self.broker_pid.and_then(procfs::cpu_seconds),
        })
    }

    /// The relay's commit→ack window since the last call, and a new one opened.
    fn ack(&self) -> Option<Percentiles> {
        let w = relay::latency_window(self.metrics_port, true)?;
        Some(Percentiles {
            p50: w.p50_ms?,
            p90: w.p90_ms?,
            p99: w.p99_ms?,
            max: w.max_ms?,
        })
    }
}

/// A window's bounds and counters, turned into figures once the stream's events are all in.
struct Span {
    label: String,
    from: Counters,
    to: Counters,
    ack: Option<Percentiles>,
}

impl Span {
    fn window(&self, commits: &[Commit], receipts: &[super::consumer::Receipt]) -> StreamWindow {
        let inside: Vec<Commit> = commits
            .iter()
            .copied()
            .filter(|(_, at)| *at >= self.from.at && *at < self.to.at)
            .collect();
        let delivery = stats::delivery(&inside, receipts);
        let seconds = self.to.at.duration_since(self.from.at).as_secs_f64();
        let relay = self.to.relay - self.from.relay;
        StreamWindow {
            label: self.label.clone(),
            seconds,
            relay_cpu_core_share: relay / seconds,
            relay_cpu_us_per_event: relay * 1e6 / delivery.delivered.max(1) as f64,
            pg_cpu_core_share: (self.to.pg - self.from.pg) / seconds,
            broker_cpu_core_share: self.from.broker.zip(self.to.broker).map(|(a, b)| (b - a) / seconds),
            ack: self.ack,
            delivery,
        }
    }
}

pub async fn run(ctx: &Ctx<'_>, spec: &ReplaySpec, phase: &ProgressBar) -> Result<ReplayOutcome> {
    let admin = pg::connect(&ctx.pg.url("postgres", "postgres")).await?;
    pg::recreate_database(&admin, DB).await?;
    let outcome = measure(ctx, spec, phase).await;
    pg::drop_database(&admin, DB).await?;
    outcome
}

async fn measure(ctx: &Ctx<'_>, spec: &ReplaySpec, phase: &ProgressBar) -> Result<ReplayOutcome> {
    let db = pg::connect(&ctx.pg.url("postgres", DB)).await?;
    db.batch_execute(SCHEMA).await?;
    db.batch_execute(FILL_PROCEDURE).await?;

    // The journal, before the slot exists: the stream never sees it.
    phase.set_message(format!("replay: inserting the journal of {} rows", spec.rows));
    phase.set_length(spec.rows);
    phase.set_position(0);
    let fill_started = Instant::now();
    let mut filled = 0;
    while filled < spec.rows {
        let n = FILL_CHUNK.min(spec.rows - filled);
        db.execute(
            "CALL bench_fill($1, $2, $3)",
            &[&(n as i32), &HISTORY_TOPIC, &FILL_PER_TXN],
        )
        .await?;
        filled += n;
        phase.set_position(filled);
    }
    db.batch_execute("VACUUM ANALYZE events_outbox").await?;
    let fill_s = fill_started.elapsed().as_secs_f64();
    let (max_id, table_bytes): (i64, i64) = {
        let row = db
            .query_one(
                "SELECT max(id), pg_total_relation_size('events_outbox') FROM events_outbox",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    if max_id as u64 != spec.rows {
        bail!("the journal's ids end at {max_id}, not at {}", spec.rows);
    }
    phase.set_length(0);

    for topic in [STREAM_TOPIC, HISTORY_TOPIC, RATE_TOPIC] {
        ctx.broker.create_topic(topic, PARTITIONS).await?;
    }
    let metrics_port = pg::free_port();
    let conf = RelayConf {
        url: &ctx.pg.url(RELAY_ROLE, DB),
        slot: DB,
        bootstrap: ctx.broker.bootstrap(),
        mode: Mode::Cdc,
        metrics_port: Some(metrics_port),
        status_interval_ms: 1000,
        kafka: ctx.kafka,
        topic_prefix: "",
        sink: None,
        trace: Trace::Off,
        otlp_endpoint: None,
    };
    let config = conf.write(ctx.workdir)?;
    relay::setup(&config, false)?;
    let consumer = TopicConsumer::start(ctx.broker.bootstrap(), STREAM_TOPIC, PARTITIONS)?;
    let relay_child = RelayChild::start(&config, Mode::Cdc).await?;
    let probe = Probe {
        relay_pid: relay_child.pid(),
        postmaster: ctx.pg.postmaster_pid()?,
        broker_pid: ctx.broker.pid(),
        metrics_port,
    };
    let producers = Producers::connect(&ctx.pg.url("postgres", DB), 4).await?;

    // The load runs until `stop`, beside the driver that opens and closes the windows.
    let stop = AtomicBool::new(false);
    let load = async {
        let mut commits = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let chunk = LoadSpec {
                rate: Some(STREAM_RATE),
                events_per_txn: 1,
                duration: LOAD_CHUNK,
                event_type: STREAM_TOPIC.to_owned(),
                traceparent: None,
            };
            commits.extend(load::run(&producers, &chunk, phase).await?.commits);
        }
        anyhow::Ok(commits)
    };
    let driver = async {
        let result = drive(ctx, spec, &config, &probe, phase).await;
        stop.store(true, Ordering::Relaxed);
        result
    };
    let loadavg_start = loadavg();
    let (commits, driven) = tokio::join!(load, driver);
    let loadavg_end = loadavg();
    let commits = commits?;
    let (baseline, replays) = driven?;

    phase.set_message("replay: waiting for the stream's last events");
    wait_for(&consumer, commits.len() as u64, Duration::from_secs(120)).await;
    let relay_rss = procfs::vm_kib(probe.relay_pid, "VmRSS").map(|k| k as f64 / 1024.0);
    let relay_peak = procfs::vm_kib(probe.relay_pid, "VmHWM").map(|k| k as f64 / 1024.0);
    relay_child.stop().await?;
    let receipts = consumer.finish();
    let stream_total = stats::delivery(&commits, &receipts);
    let baseline = baseline.window(&commits, &receipts);

    let mut runs = Vec::new();
    for (mut run, span, control) in replays {
        phase.set_message(format!("replay: reading {} back", run.topic));
        let (bootstrap, topic, rows) = (ctx.broker.bootstrap().to_owned(), run.topic.clone(), spec.rows);
        let counted = tokio::task::spawn_blocking(move || committed_records(&bootstrap, &topic, rows)).await?;
        let (records, distinct) = counted.with_context(|| format!("counting what {} delivered", run.label))?;
        run.records = records;
        run.distinct = distinct;
        run.per_s = distinct as f64 / run.wall_s;
        run.cpu_us_per_event = run.cpu_s * 1e6 / distinct.max(1) as f64;
        run.window = span.window(&commits, &receipts);
        run.control = Some(control.window(&commits, &receipts));
        runs.push(run);
    }
    let env = super::report::Environment::collect(
        String::new(),
        ctx.broker.describe(),
        ctx.kafka.to_vec(),
        WARMUP.as_secs_f64(),
        spec.baseline.as_secs_f64(),
        None,
    );
    Ok(ReplayOutcome {
        date_utc: env.date_utc,
        command: env.command,
        git: env.git,
        broker: env.broker,
        rows: spec.rows,
        fill_s,
        table_mib: table_bytes as f64 / (1024.0 * 1024.0),
        loadavg_start,
        loadavg_end,
        baseline,
        replays: runs,
        stream_total,
        relay_rss_mib: relay_rss,
        relay_peak_rss_mib: relay_peak,
    })
}

/// Opens and closes the windows: warm-up, baseline, then each replay as a process of its own.
async fn drive(
    ctx: &Ctx<'_>,
    spec: &ReplaySpec,
    config: &Path,
    probe: &Probe,
    phase: &ProgressBar,
) -> Result<(Span, Vec<(ReplayRun, Span, Span)>)> {
    phase.set_message("replay: stream warm-up at 1,000 ev/s");
    tokio::time::sleep(WARMUP).await;
    probe.ack();
    let from = probe.read()?;
    phase.set_message(format!(
        "replay: stream baseline at 1,000 ev/s ({} s)",
        spec.baseline.as_secs()
    ));
    tokio::time::sleep(spec.baseline).await;
    let to = probe.read()?;
    let baseline = Span {
        label: "baseline (no replay)".into(),
        from,
        to,
        ack: probe.ack(),
    };
    let mut replays = Vec::new();
    let mut plan = vec![(None, None)];
    if let Some(rate) = spec.rate {
        plan.push((Some(rate), Some(RATE_TOPIC)));
    }
    for (rate, to_topic) in plan {
        let label = match rate {
            Some(r) => format!("replay --rate {r}"),
            None => "replay (no rate limit)".to_owned(),
        };
        phase.set_message(format!("replay: {label} of {} rows", spec.rows));
        let from = probe.read()?;
        let (run, to) = replay_process(ctx, spec, config, rate, to_topic, &label, probe).await?;
        let window = Span {
            label: label.clone(),
            from,
            to,
            ack: probe.ack(),
        };
        phase.set_message(format!("replay: control window after {label}"));
        tokio::time::sleep(Duration::from_secs_f64(run.wall_s).min(CONTROL_MAX)).await;
        let control = Span {
            label: format!("control after {label}"),
            from: to,
            to: probe.read()?,
            ack: probe.ack(),
        };
        replays.push((run, window, control));
    }
    Ok((baseline, replays))
}

/// `outbox-relay replay` under `/usr/bin/time`, until it exits (bounded).
async fn replay_process(
    ctx: &Ctx<'_>,
    spec: &ReplaySpec,
    config: &Path,
    rate: Option<u32>,
    to_topic: Option<&str>,
    label: &str,
    probe: &Probe,
) -> Result<(ReplayRun, Counters)> {
    let slug = to_topic.unwrap_or(HISTORY_TOPIC);
    let time_out = ctx.workdir.join(format!("{slug}.time"));
    let log = ctx.workdir.join(format!("{slug}.log"));
    let out = ctx.workdir.join(format!("{slug}.out"));
    let state = ctx.workdir.join(format!("{slug}.state"));
    std::fs::create_dir_all(&state)?;
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-o")
        .arg(&time_out)
        .args(["-f", "%U %S %M"])
        .arg(relay::relay_bin())
        .args(["replay", "--config"])
        .arg(config)
        .args([
            "--since",
            "id:1",
            "--until",
            &format!("id:{}", spec.rows + 1),
            "--state",
        ])
        .arg(&state);
    if let Some(r) = rate {
        cmd.args(["--rate", &r.to_string()]);
    }
    if let Some(t) = to_topic {
        cmd.args(["--to-topic", t]);
    }
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting outbox-relay replay under /usr/bin/time")?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > REPLAY_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{label} did not finish within {REPLAY_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall_s = started.elapsed().as_secs_f64();
    let to = probe.read()?;
    let summary = std::fs::read_to_string(&out).unwrap_or_default().trim().to_owned();
    if !status.success() {
        bail!(
            "{label} exited with {status}: {summary}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let timed = std::fs::read_to_string(&time_out)?;
    // The last line: `time` puts a note above it when the command failed.
    let fields: Vec<f64> = timed
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let [user, sys, rss_kib] = fields[..] else {
        bail!("/usr/bin/time wrote {timed:?}, not \"user sys maxrss\"");
    };
    let run = ReplayRun {
        label: label.to_owned(),
        rate,
        topic: slug.to_owned(),
        wall_s,
        per_s: 0.0,
        records: 0,
        distinct: 0,
        summary,
        cpu_s: user + sys,
        cpu_us_per_event: 0.0,
        peak_rss_mib: rss_kib / 1024.0,
        window: empty_window(),
        control: None,
    };
    Ok((run, to))
}

fn empty_window() -> StreamWindow {
    StreamWindow {
        label: String::new(),
        seconds: 0.0,
        delivery: stats::delivery(&[], &[]),
        ack: None,
        relay_cpu_core_share: 0.0,
        relay_cpu_us_per_event: 0.0,
        pg_cpu_core_share: 0.0,
        broker_cpu_core_share: None,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub const BEGIN: &str =
    "<!-- BEGIN replay results: generated by `cargo bench --bench cdc_vs_polling -- --replay`; edits inside are overwritten -->";
pub const END: &str = "<!-- END replay results -->";

fn ms(p: Option<Percentiles>, f: fn(&Percentiles) -> f64) -> String {
    p.map_or_else(|| "–".into(), |p| format!("{:.1}", f(&p)))
}

fn window_row(w: &StreamWindow, base: &StreamWindow) -> String {
    let d = &w.delivery;
    let ratio = match (d.latency, base.delivery.latency) {
        (Some(a), Some(b)) if b.p99 > 0.0 => format!("{:.2}×", a.p99 / b.p99),
        _ => "–".into(),
    };
    format!(
        "| {} | {:.1} | {} | {} | {} | {} | {ratio} | {} | {} / {} | {:.0} % | {:.1} | {:.0} % | {} |",
        w.label,
        w.seconds,
        d.delivered,
        ms(d.latency, |p| p.p50),
        ms(d.latency, |p| p.p99),
        ms(d.latency, |p| p.max),
        ms(w.ack, |p| p.p99),
        d.missing,
        d.duplicates,
        w.relay_cpu_core_share * 100.0,
        w.relay_cpu_us_per_event,
        w.pg_cpu_core_share * 100.0,
        w.broker_cpu_core_share
            .map_or_else(|| "–".into(), |b| format!("{:.0} %", b * 100.0)),
    )
}

/// The generated block (`BEGIN`…`END`).
pub fn markdown(r: &ReplayOutcome) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}\n");
    let _ = writeln!(
        s,
        "- **When / what:** {} — `{}` at commit {}; {}",
        r.date_utc, r.command, r.git, r.broker
    );
    let _ = writeln!(
        s,
        "- **Load average** (1/5/15 min) at the start of the stream: {}; at its end: {}",
        r.loadavg_start, r.loadavg_end
    );
    let _ = writeln!(
        s,
        "- **Journal:** {} rows ({:.0} MiB with indexes), inserted before the slot existed in {:.0} s; the stream: \
         1,000 events/s, one event per transaction, `outbox-relay run` at-least-once\n",
        r.rows, r.table_mib, r.fill_s
    );
    let _ = writeln!(
        s,
        "| Replay | Wall s | Consumer read (distinct / records) | Events/s | Replay CPU s | CPU µs/event | Peak RSS MiB |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for run in &r.replays {
        let _ = writeln!(
            s,
            "| {} → `{}` | {:.1} | {} / {} | {:.0} | {:.2} | {:.1} | {:.0} |",
            run.label,
            run.topic,
            run.wall_s,
            run.distinct,
            run.records,
            run.per_s,
            run.cpu_s,
            run.cpu_us_per_event,
            run.peak_rss_mib
        );
    }
    let _ = writeln!(
        s,
        "\nThe stream (1,000 events/s) in each window of the same run, by the event's commit instant (a control \
         window follows each replay: as long as the replay's window, up to 30 s, no replay running):\n"
    );
    let _ = writeln!(
        s,
        "| Window | s | Events | commit→consumer p50 ms | p99 ms | max ms | p99 / baseline | relay commit→ack p99 ms | \
         lost / dup | Relay CPU (of a core) | Relay µs/stream event | PG CPU (of a core) | Broker CPU |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(s, "{}", window_row(&r.baseline, &r.baseline));
    for run in &r.replays {
        let _ = writeln!(s, "{}", window_row(&run.window, &r.baseline));
        if let Some(control) = &run.control {
            let _ = writeln!(s, "{}", window_row(control, &r.baseline));
        }
    }
    let t = &r.stream_total;
    let _ = writeln!(
        s,
        "\nWhole stream: {} events delivered, {} lost, {} duplicated. The running relay's RSS at the end {} MiB, \
         peak {} MiB. The replays' own summaries:\n",
        t.delivered,
        t.missing,
        t.duplicates,
        r.relay_rss_mib.map_or_else(|| "–".into(), |v| format!("{v:.0}")),
        r.relay_peak_rss_mib.map_or_else(|| "–".into(), |v| format!("{v:.0}")),
    );
    for run in &r.replays {
        let _ = writeln!(s, "- {}: `{}`", run.label, run.summary.replace('\n', " "));
    }
    let _ = writeln!(s, "\n{END}");
    s
}
