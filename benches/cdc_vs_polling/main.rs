//! CDC versus polling: the streaming relay (`outbox-relay run`) against the classic polling
//! relayer (`outbox-relay poll`) on the same machine, database, broker and load, in one run.
//!
//! ```text
//! cargo bench --bench cdc_vs_polling -- [--quick] [--broker mock|tansu|HOST:PORT]
//!     [--measure-secs N] [--drain-rows N] [--no-drain] [--drain-poll] [--out-dir DIR]
//!     [--with-debezium]
//! ```
//!
//! It starts its own PostgreSQL 15 cluster and (by default) librdkafka's mock Kafka cluster in
//! this process, then for every rate (100, 1,000 and 5,000 events/s and the maximum; `--quick`:
//! 100, 1,000 and the maximum) runs the load with no relay (the database's own cost), with CDC,
//! and with polling at 10 ms, 100 ms and 1 s intervals (batch 100), plus a batched-producer
//! maximum (100 events per transaction). Each run gets a fresh database (see `steady.rs` for what
//! is measured and how). Then the backlog drain: 1,000,000 pending events (`--quick`: 100,000)
//! published by the relay, beside `pg_recvlogical` draining the same slot contents to /dev/null.
//!
//! `--with-debezium` adds Debezium + Kafka Connect standalone (`debezium.rs`; needs
//! `scripts/install-debezium.sh`): at 1,000 events/s with Debezium's defaults and with
//! `poll.interval.ms=10`, and in the drain, which then runs twice — one event per transaction and
//! `BATCHED_DRAIN_TXN` events per transaction — with the relay, `pg_recvlogical` and Debezium each on
//! its own slot over the same WAL.
//!
//! Results: `docs/benchmarks.md` (a generated block; the analysis around it is kept) and
//! `docs/benchmarks-latency.svg`; `--quick` writes to `target/cdc_vs_polling/` instead. Raw
//! numbers go to `target/cdc_vs_polling/results.json`; `--report-from FILE` writes the docs again
//! from such a file without measuring (after a change to the report or the targets). A full run takes about 15 minutes on two
//! cores (about 20 with `--with-debezium --drain-poll`); run it on an otherwise idle machine.
//!
//! Not part of `cargo test`: without cargo bench's `--bench` argument it only prints how to run.

mod broker;
mod consumer;
mod debezium;
mod drain;
mod load;
mod pg;
mod plot;
mod procfs;
mod relay;
mod report;
mod stats;
mod steady;
mod targets;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use relay::{Mode, Tuning};
use steady::{Rate, Scenario};

struct Options {
    quick: bool,
    broker: String,
    warmup: Duration,
    measure: Duration,
    drain_rows: u64,
    drain: bool,
    drain_poll: bool,
    out_dir: PathBuf,
    /// Only runs whose "<relay> at <rate>" label contains this (for profiling one run).
    only: Option<String>,
    /// Extra librdkafka properties for every relay, e.g. `linger.ms=0`.
    kafka: Vec<(String, String)>,
    /// Debezium + Kafka Connect beside the relay (steady 1,000/s and both drains).
    with_debezium: bool,
    /// Measure nothing: write the docs again from a run's saved `results.json` (after a change
    /// to the report or the targets).
    report_from: Option<PathBuf>,
}

/// Events per transaction of the batched drain (`--with-debezium`).
const BATCHED_DRAIN_TXN: u64 = 1_000;
/// Debezium's warm-up at least this long: a JVM compiles its hot paths in the first seconds.
const DEBEZIUM_WARMUP: Duration = Duration::from_secs(10);

const USAGE: &str = "usage: cargo bench --bench cdc_vs_polling -- [--quick] [--broker mock|tansu|HOST:PORT] \
                     [--measure-secs N] [--drain-rows N] [--no-drain] [--drain-poll] [--out-dir DIR] [--only TEXT] [--kafka KEY=VALUE]… [--with-debezium] [--report-from results.json]";

fn options() -> Result<Option<Options>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("cdc_vs_polling is a benchmark; run it with: {USAGE}");
        return Ok(None);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut o = Options {
        quick,
        broker: "mock".into(),
        warmup: Duration::from_secs(if quick { 1 } else { 3 }),
        measure: Duration::from_secs(if quick { 4 } else { 15 }),
        drain_rows: if quick { 100_000 } else { 1_000_000 },
        drain: true,
        drain_poll: false,
        out_dir: if quick {
            root.join("target/cdc_vs_polling")
        } else {
            root.join("docs")
        },
        only: None,
        kafka: Vec::new(),
        with_debezium: false,
        report_from: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value; {USAGE}"));
        match arg.as_str() {
            "--bench" | "--quick" => {}
            "--broker" => o.broker = value()?.clone(),
            "--measure-secs" => o.measure = Duration::from_secs(value()?.parse()?),
            "--drain-rows" => o.drain_rows = value()?.replace('_', "").parse()?,
            "--no-drain" => o.drain = false,
            "--drain-poll" => o.drain_poll = true,
            "--with-debezium" => o.with_debezium = true,
            "--report-from" => o.report_from = Some(PathBuf::from(value()?)),
            "--out-dir" => o.out_dir = PathBuf::from(value()?),
            "--only" => o.only = Some(value()?.clone()),
            "--kafka" => {
                let pair = value()?;
                let (k, v) = pair
                    .split_once('=')
                    .with_context(|| format!("--kafka takes KEY=VALUE, got {pair:?}"))?;
                o.kafka.push((k.to_owned(), v.to_owned()));
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    Ok(Some(o))
}

fn scenarios(o: &Options) -> Vec<Scenario> {
    let rates: &[Rate] = if o.quick {
        &[Rate::Fixed(100.0), Rate::Fixed(1_000.0), Rate::Max]
    } else {
        &[
            Rate::Fixed(100.0),
            Rate::Fixed(1_000.0),
            Rate::Fixed(5_000.0),
            Rate::Max,
        ]
    };
    let modes = [
        None,
        Some(Mode::Cdc),
        Some(Mode::CdcExactlyOnce),
        Some(Mode::Poll { interval_ms: 10 }),
        Some(Mode::Poll { interval_ms: 100 }),
        Some(Mode::Poll { interval_ms: 1000 }),
    ];
    let scenario = |mode, rate, events_per_txn| Scenario {
        mode,
        rate,
        events_per_txn,
        warmup: o.warmup,
        measure: o.measure,
    };
    let mut out: Vec<Scenario> = rates
        .iter()
        .flat_map(|rate| modes.iter().map(move |mode| (*mode, *rate)))
        .map(|(m, r)| scenario(m, r, 1))
        .collect();
    for mode in [None, Some(Mode::Cdc), Some(Mode::Poll { interval_ms: 10 })] {
        out.push(scenario(mode, Rate::Max, 100));
    }
    if o.with_debezium {
        for tuning in [Tuning::Defaults, Tuning::Latency] {
            out.push(Scenario {
                warmup: o.warmup.max(DEBEZIUM_WARMUP),
                ..scenario(Some(Mode::Debezium(tuning)), Rate::Fixed(1_000.0), 1)
            });
        }
    }
    if let Some(only) = &o.only {
        out.retain(|s| format!("{} at {}", s.mode_label(), s.rate_label()).contains(only.as_str()));
    }
    out
}

/// Above the progress bars on a terminal; plain stderr otherwise (indicatif draws nothing then).
fn say(progress: &MultiProgress, line: String) {
    if progress.is_hidden() || progress.println(&line).is_err() {
        eprintln!("{line}");
    }
}

fn main() -> Result<()> {
    let Some(options) = options()? else { return Ok(()) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(options))
}

/// Writes `docs/benchmarks.md` (or the quick variant) and the latency plot from `results`.
fn publish(o: &Options, results: &report::Results) -> Result<()> {
    let targets = targets::table(results);
    let (md, svg) = if o.quick {
        (
            o.out_dir.join("benchmarks-quick.md"),
            o.out_dir.join("benchmarks-latency-quick.svg"),
        )
    } else {
        (
            o.out_dir.join("benchmarks.md"),
            o.out_dir.join("benchmarks-latency.svg"),
        )
    };
    std::fs::create_dir_all(&o.out_dir)?;
    report::write_markdown(&md, &report::markdown(results, &targets))?;
    plot::latency_vs_rate(&svg, &results.steady)?;
    println!("\n{targets}\nwrote {} and {}", md.display(), svg.display());
    Ok(())
}

async fn run(o: Options) -> Result<()> {
    if let Some(path) = &o.report_from {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let results: report::Results =
            serde_json::from_str(&text).with_context(|| format!("{} is not a results.json", path.display()))?;
        return publish(&o, &results);
    }
    let scenarios = scenarios(&o);
    let drains = match (o.drain, o.with_debezium) {
        (false, _) => Vec::new(),
        (true, false) => vec![1],
        (true, true) => vec![1, BATCHED_DRAIN_TXN],
    };
    let progress = MultiProgress::new();
    let overall = progress.add(ProgressBar::new((scenarios.len() + drains.len()) as u64));
    overall.set_style(ProgressStyle::with_template(
        "[{elapsed_precise}] {bar:32} {pos}/{len} runs  {msg}",
    )?);
    let phase = progress.add(ProgressBar::new(0));
    phase.set_style(ProgressStyle::with_template("  {spinner} {msg}  {pos} events")?);
    phase.enable_steady_tick(Duration::from_millis(120));

    overall.set_message("starting PostgreSQL and Kafka");
    let pg = tokio::task::spawn_blocking(pg::BenchPg::start).await??;
    pg.ready().await?;
    let broker = broker::Broker::start(&o.broker)?;
    let workdir = tempfile::Builder::new().prefix("outbox-relay-bench-").tempdir()?;
    // Checked before any run, so a missing Java or jar fails in seconds, not after the steady runs.
    let debezium = if o.with_debezium {
        Some(debezium::Install::find(workdir.path(), broker.is_mock())?)
    } else {
        None
    };
    let ctx = steady::Ctx {
        pg: &pg,
        broker: &broker,
        workdir: workdir.path(),
        kafka: &o.kafka,
        debezium: debezium.as_ref(),
    };
    let version: String = pg::connect(&pg.url("postgres", "postgres"))
        .await?
        .query_one("SHOW server_version", &[])
        .await?
        .get(0);

    let mut steady_results = Vec::new();
    for (i, sc) in scenarios.iter().enumerate() {
        overall.set_message(format!("{} at {}", sc.mode_label(), sc.rate_label()));
        match steady::run(&ctx, sc, i, &phase).await {
            Ok(outcome) => {
                say(&progress, summary(&outcome));
                steady_results.push(outcome);
            }
            Err(e) => say(
                &progress,
                format!("FAILED {} at {}: {e:#}", sc.mode_label(), sc.rate_label()),
            ),
        }
        overall.inc(1);
    }
    let (mut drain, mut batched_drain) = (None, None);
    for per_txn in drains {
        overall.set_message(format!("backlog drain, {per_txn} per transaction"));
        let spec = drain::DrainSpec {
            rows: o.drain_rows,
            events_per_txn: per_txn,
            // The polling relayer's drain is one row per claim either way: single-event shape only.
            with_poll: o.drain_poll && per_txn == 1,
            debezium: debezium.as_ref(),
        };
        let result = drain::run(&ctx, &spec, &phase).await;
        overall.inc(1);
        match result {
            Ok(d) => {
                say(&progress, drain_summary(&d));
                if per_txn == 1 {
                    drain = Some(d);
                } else {
                    batched_drain = Some(d);
                }
            }
            Err(e) => say(
                &progress,
                format!("FAILED backlog drain ({per_txn} per transaction): {e:#}"),
            ),
        }
    }
    phase.finish_and_clear();
    overall.finish_with_message("done");

    let environment = report::Environment::collect(
        version,
        broker.describe(),
        o.kafka.clone(),
        o.warmup.as_secs_f64(),
        o.measure.as_secs_f64(),
        debezium.as_ref().map(debezium::Install::describe),
    );
    let results = report::Results {
        environment,
        steady: steady_results,
        drain,
        batched_drain,
    };
    let raw_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/cdc_vs_polling");
    std::fs::create_dir_all(&raw_dir)?;
    std::fs::write(raw_dir.join("results.json"), serde_json::to_string_pretty(&results)?)?;
    println!("raw numbers: {}", raw_dir.join("results.json").display());
    publish(&o, &results)
}

fn drain_summary(d: &drain::DrainOutcome) -> String {
    let dbz = d.debezium.as_ref().map_or_else(String::new, |z| {
        format!(
            ", Debezium {:.0} ev/s (relay/Debezium {:.1}×, JVM peak RSS {:.0} MiB, start-up {:.1} s)",
            z.per_s,
            d.relay_per_s / z.per_s,
            z.peak_rss_mib,
            z.startup_s
        )
    });
    format!(
        "drain {} events ({} per txn): relay {:.0} ev/s, pg_recvlogical {:.0} ev/s ({:.2}×), relay peak RSS {:.0} MiB{dbz}",
        d.rows,
        d.events_per_txn,
        d.relay_per_s,
        d.recvlogical_per_s,
        d.relay_per_s / d.recvlogical_per_s,
        d.relay_peak_rss_mib
    )
}

fn summary(o: &steady::Outcome) -> String {
    let latency = o
        .delivery
        .as_ref()
        .and_then(|d| d.latency)
        .map_or_else(String::new, |l| format!(" p50 {:.1} ms p99 {:.1} ms,", l.p50, l.p99));
    let cpu = o
        .relay_cpu_us_per_event
        .map_or_else(String::new, |c| format!(" relay {c:.1} µs/ev,"));
    format!(
        "{:>14} {:>12}: {:>6.0} ev/s,{latency}{cpu} PG {:.1} µs/ev",
        o.mode, o.rate, o.achieved_per_s, o.pg_cpu_us_per_event
    )
}
