//! CDC versus polling: the streaming relay (`outbox-relay run`) against the classic polling
//! relayer (`outbox-relay poll`) on the same machine, database, broker and load, in one run — and
//! the streaming relay into each broker it supports.
//!
//! ```text
//! cargo bench --bench cdc_vs_polling -- [--quick] [--broker mock|kafka|tansu|HOST:PORT]
//!     [--measure-secs N] [--drain-rows N] [--no-drain] [--drain-poll] [--at-least-once-drain] [--batched-drain] [--out-dir DIR]
//!     [--only TEXT] [--kafka KEY=VALUE]… [--with-debezium]
//!     [--sinks kafka,nats,rabbitmq,redis,webhook,pubsub,sqs,sns,kinesis] [--idle-secs N] [--no-tracing] [--report-from results.json]
//! cargo bench --bench cdc_vs_polling -- --replay [--quick] [--broker kafka] [--replay-rows N]
//!     [--replay-rate N] [--replay-baseline-secs N] [--out-dir DIR]
//! ```
//!
//! It starts its own PostgreSQL 15 cluster and (by default) librdkafka's mock Kafka cluster in
//! this process, then for every rate (10, 100, 1,000 and 5,000 events/s and the maximum;
//! `--quick`: 10, 100, 1,000 and the maximum) runs the load with no relay (the database's own
//! cost), with CDC (at-least-once and exactly-once), and with polling at 10 ms, 100 ms and 1 s
//! intervals (batch 100), plus a batched-producer maximum (100 events per transaction). Each run
//! gets a fresh database (see `steady.rs` for what is measured and how).
//!
//! **Sinks** (`--sinks`, default all five; `sinks.rs`): Kafka's runs are the main tables and always
//! run; every other sink listed — NATS JetStream, RabbitMQ, Redis Streams, the servers running
//! on this machine's usual ports, and an HTTP webhook into a receiver of this process — gets a CDC run at 1,000 events/s (same columns, a consumer of
//! that broker, and the broker server's CPU per event) and a drain of the same backlog (below).
//! A listed broker that does not answer stops the benchmark before anything is measured, naming
//! it, how to start it, and `--sinks` to leave it out. Each run writes to a stream, exchange or
//! key of its own and deletes it afterwards (the servers are shared).
//! The cloud sinks are asked for by name (`--sinks kafka,pubsub,sqs,sns,kinesis`; not in the
//! default): Google Cloud Pub/Sub, Amazon SQS (FIFO queues), SNS (FIFO topics, read through a
//! subscribed FIFO queue) and Kinesis against Google's emulator and moto (one server for the three
//! AWS services), which the
//! benchmark starts on free loopback ports (`emulators.rs`; or uses the ones `PUBSUB_EMULATOR_HOST`
//! / `BENCH_MOTO_URL` name). Their rows are marked as emulator figures: a single-process
//! development server bounds what the relay can be seen to do.
//!
//! **Idle** (`idle.rs`): the CDC relay on Kafka with no events for `--idle-secs` (60 s; `--quick`:
//! 15 s; 0: skipped) after a warm-up: CPU share of a core, CPU seconds per minute, threads, CPU per
//! thread, context switches per second.
//!
//! **Backlog drain** (`drain.rs`): 1,000,000 pending events (`--quick`: 100,000; `--drain-rows`)
//! published by the relay into Kafka, at-least-once and exactly-once (with a SIGKILL half-way),
//! and into every other broker of `--sinks`, beside `pg_recvlogical` draining the same slot
//! contents to /dev/null.
//!
//! **Tracing** (`otlp.rs`): beside the CDC row at 1,000 events/s on Kafka (trace context off,
//! the baseline), three rows of the same run: `CDC + traceparent` (every row carries a random
//! valid `traceparent`, `[outbox] trace_column` reads it, no export), `CDC + OTLP 100 %` and
//! `CDC + OTLP 1 %` (plus `[tracing]` exporting OTLP/HTTP protobuf spans, sampled 100 % and 1 %,
//! to a small receiver in this process that counts requests, bytes and spans; the rows' own
//! `traceparent` flags are sampled in the same share, as the producing service's head sampling
//! would set them, since the relay follows a valid parent's flag). Included by
//! default (about a minute in a full run, 30 s with `--quick`); `--no-tracing` leaves them out. A
//! relay that refuses `[tracing]` (built before the exporter) skips the OTLP rows with the reason.
//! `--only` takes comma-separated alternatives: `--only "CDC at 1000/s,CDC +"` runs the four.
//!
//! **Kafka transactions** (`[kafka] exactly_once = "transactions"`): on a real broker
//! (`--broker kafka` or an address), a `CDC Kafka transactions` row at every rate beside the
//! read-back exactly-once one, and the same two drains (uninterrupted; SIGKILLed half-way and
//! restarted), counted by a `read_committed` consumer (a transactional topic's offsets also hold
//! aborted records and commit markers).
//!
//! `--with-debezium` adds Debezium + Kafka Connect standalone (`debezium.rs`; needs
//! `scripts/install-debezium.sh`): at 1,000 events/s with Debezium's defaults and with
//! `poll.interval.ms=10`, and in the drain, which then runs twice — one event per transaction and
//! `BATCHED_DRAIN_TXN` events per transaction — with the relay, `pg_recvlogical` and Debezium each on
//! its own slot over the same WAL. `--batched-drain` runs that second shape without Debezium.
//!
//! Results: `docs/benchmarks.md` (a generated block; the analysis around it is kept) and
//! `docs/benchmarks-latency.svg`; `--quick` writes to `target/cdc_vs_polling/` instead. Raw
//! numbers go to `target/cdc_vs_polling/results.json`; `--report-from FILE` writes the docs again
//! from such a file without measuring (after a change to the report or the targets; files from
//! before the sinks and the idle run simply lack those rows). A full run takes about 20 minutes
//! on two cores (about 25 with `--with-debezium --drain-poll`): the 10 ev/s rate, the other
//! brokers' runs and drains and the idle minute add a few minutes to the earlier 15; `--quick`
//! takes about 8. Run it on an otherwise idle machine.
//!
//! **Replay** (`--replay`, `replay.rs`; runs that section alone): `outbox-relay replay`
//! re-publishing a journal of 1,000,000 rows (`--quick`: 100,000; `--replay-rows`) beside the
//! relay streaming 1,000 events/s — the replay's events/s (counted by a consumer), its CPU and
//! peak RSS, and the stream's commit→consumer p50/p99 and the relay's CPU in a baseline window
//! against the replay's window and a control window after it (same run); then again with `--rate 10000` (`--replay-rate`; 0:
//! none). Meant for `--broker kafka`. Its block in `docs/benchmarks.md` has markers of its own
//! (`--quick`: `target/cdc_vs_polling/benchmarks-replay-quick.md`); the raw numbers go to
//! `target/cdc_vs_polling/replay.json`. A full run takes about 5 minutes, `--quick` about 1.
//!
//! Not part of `cargo test`: without cargo bench's `--bench` argument it only prints how to run.

mod broker;
mod consumer;
mod debezium;
mod drain;
mod emulators;
mod idle;
#[path = "../shared/latency_window.rs"]
mod latency_window;
mod load;
mod otlp;
mod pg;
mod plot;
mod procfs;
mod relay;
mod replay;
mod report;
mod sink_consumer;
mod sinks;
mod stats;
mod steady;
mod targets;
mod webhook;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use relay::{Mode, Trace, Tuning};
use sinks::Sink;
use steady::{Rate, Scenario};

struct Options {
    quick: bool,
    broker: String,
    warmup: Duration,
    measure: Duration,
    drain_rows: u64,
    drain: bool,
    drain_poll: bool,
    /// `--at-least-once-drain`: the drains without their exactly-once strategies (read-back and
    /// Kafka transactions), e.g. to compare builds whose exactly-once keys differ.
    drain_exactly_once: bool,
    /// The drain with 1,000 events per transaction too, without Debezium (it always runs with it).
    batched_drain: bool,
    out_dir: PathBuf,
    /// Only runs whose "<relay> at <rate>" label contains one of these (comma-separated on the
    /// command line; for profiling one run, or a few to compare).
    only: Option<Vec<String>>,
    /// Extra librdkafka properties for every relay, e.g. `linger.ms=0`.
    kafka: Vec<(String, String)>,
    /// Debezium + Kafka Connect beside the relay (steady 1,000/s and both drains).
    with_debezium: bool,
    /// Measure nothing: write the docs again from a run's saved `results.json` (after a change
    /// to the report or the targets).
    report_from: Option<PathBuf>,
    /// The brokers (`--sinks`); Kafka's runs are the main tables and always measured.
    sinks: Vec<Sink>,
    /// The idle relay's window (`--idle-secs`; zero: no idle run).
    idle: Duration,
    /// The tracing rows (on unless `--no-tracing`).
    tracing: bool,
    /// Only the replay section (`--replay`).
    replay: bool,
    replay_rows: u64,
    /// The second replay's `--rate` (`--replay-rate`; 0: no second replay).
    replay_rate: Option<u32>,
    replay_baseline: Duration,
}

impl Options {
    /// Whether `--only` (if given) selects a run of this label.
    fn selects(&self, label: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| label.contains(o.as_str())))
    }

    /// Whether the Kafka-transactions rows run: on a real Apache Kafka (`kafka` or an address),
    /// not on the mock cluster or tansu (which hands aborted records to `read_committed`).
    fn transactions(&self) -> bool {
        !matches!(self.broker.as_str(), "mock" | "tansu")
    }
}

/// Events per transaction of the batched drain (`--with-debezium` or `--batched-drain`).
const BATCHED_DRAIN_TXN: u64 = 1_000;
/// Debezium's warm-up at least this long: a JVM compiles its hot paths in the first seconds.
const DEBEZIUM_WARMUP: Duration = Duration::from_secs(10);

const USAGE: &str = "usage: cargo bench --bench cdc_vs_polling -- [--quick] [--broker mock|kafka|tansu|HOST:PORT] \
                     [--measure-secs N] [--drain-rows N] [--no-drain] [--drain-poll] [--batched-drain] [--out-dir DIR] [--only TEXT] [--kafka KEY=VALUE]… [--with-debezium] [--sinks kafka,nats,rabbitmq,redis,webhook,pubsub,sqs,sns,kinesis] [--idle-secs N] [--no-tracing] [--report-from results.json]\n\
                     or: --replay [--quick] [--broker kafka] [--replay-rows N] [--replay-rate N (0: none)] [--replay-baseline-secs N] [--out-dir DIR]\n\
                     --only TEXT[,TEXT…]: runs whose label contains one of them, e.g. --only \"CDC at 1000/s,CDC +\" for \
                     the tracing rows beside their baseline; the tracing rows (CDC + traceparent / OTLP 100 % / OTLP 1 % at \
                     1000/s, Kafka) run by default, --no-tracing leaves them out";

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
        drain_exactly_once: true,
        batched_drain: false,
        out_dir: if quick {
            root.join("target/cdc_vs_polling")
        } else {
            root.join("docs")
        },
        only: None,
        kafka: Vec::new(),
        with_debezium: false,
        report_from: None,
        sinks: Sink::DEFAULT.to_vec(),
        idle: Duration::from_secs(if quick { 15 } else { 60 }),
        tracing: true,
        replay: false,
        replay_rows: if quick { 100_000 } else { 1_000_000 },
        replay_rate: Some(10_000),
        replay_baseline: Duration::from_secs(if quick { 10 } else { 30 }),
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
            "--at-least-once-drain" => o.drain_exactly_once = false,
            "--batched-drain" => o.batched_drain = true,
            "--with-debezium" => o.with_debezium = true,
            "--report-from" => o.report_from = Some(PathBuf::from(value()?)),
            "--out-dir" => o.out_dir = PathBuf::from(value()?),
            "--only" => o.only = Some(value()?.split(',').map(str::to_owned).collect()),
            "--no-tracing" => o.tracing = false,
            "--replay" => o.replay = true,
            "--replay-rows" => o.replay_rows = value()?.replace('_', "").parse()?,
            "--replay-rate" => o.replay_rate = Some(value()?.replace('_', "").parse()?).filter(|r| *r > 0),
            "--replay-baseline-secs" => o.replay_baseline = Duration::from_secs(value()?.parse()?),
            "--sinks" => o.sinks = Sink::parse_list(value()?)?,
            "--idle-secs" => o.idle = Duration::from_secs(value()?.parse()?),
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
        &[Rate::Fixed(10.0), Rate::Fixed(100.0), Rate::Fixed(1_000.0), Rate::Max]
    } else {
        &[
            Rate::Fixed(10.0),
            Rate::Fixed(100.0),
            Rate::Fixed(1_000.0),
            Rate::Fixed(5_000.0),
            Rate::Max,
        ]
    };
    let mut modes = vec![
        None,
        Some(Mode::Cdc),
        Some(Mode::CdcExactlyOnce),
        Some(Mode::Poll { interval_ms: 10 }),
        Some(Mode::Poll { interval_ms: 100 }),
        Some(Mode::Poll { interval_ms: 1000 }),
    ];
    if o.transactions() {
        modes.insert(3, Some(Mode::CdcKafkaTransactions));
    }
    let scenario = |mode, rate, events_per_txn| Scenario {
        mode,
        rate,
        events_per_txn,
        warmup: o.warmup,
        measure: o.measure,
        sink: Sink::Kafka,
        trace: Trace::Off,
    };
    let mut out: Vec<Scenario> = rates
        .iter()
        .flat_map(|rate| modes.iter().map(move |mode| (*mode, *rate)))
        .map(|(m, r)| scenario(m, r, 1))
        .collect();
    for mode in [None, Some(Mode::Cdc), Some(Mode::Poll { interval_ms: 10 })] {
        out.push(scenario(mode, Rate::Max, 100));
    }
    // The other brokers: CDC at 1,000 events/s, beside Kafka's row of the same rate.
    for sink in o.sinks.iter().filter(|s| **s != Sink::Kafka) {
        out.push(Scenario {
            sink: *sink,
            ..scenario(Some(Mode::Cdc), Rate::Fixed(1_000.0), 1)
        });
    }
    // Trace context and span export, beside the CDC row at 1,000 events/s (the "off" baseline).
    if o.tracing {
        for trace in [
            Trace::Traceparent,
            Trace::Otlp { ratio: 1.0 },
            Trace::Otlp { ratio: 0.01 },
        ] {
            out.push(Scenario {
                trace,
                ..scenario(Some(Mode::Cdc), Rate::Fixed(1_000.0), 1)
            });
        }
    }
    if o.with_debezium {
        for tuning in [Tuning::Defaults, Tuning::Latency] {
            out.push(Scenario {
                warmup: o.warmup.max(DEBEZIUM_WARMUP),
                ..scenario(Some(Mode::Debezium(tuning)), Rate::Fixed(1_000.0), 1)
            });
        }
    }
    out.retain(|s| o.selects(&s.label()));
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
    let outcome = runtime.block_on(run(options));
    // The emulators this run started (the watchdogs would also stop them once it exits).
    emulators::stop_all();
    outcome
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
    if o.replay {
        return run_replay(&o).await;
    }
    // A broker that is not there fails the run now, not after the Kafka runs.
    let sink_versions = sinks::check_reachable(&o.sinks).await?;
    let other_sinks: Vec<Sink> = o.sinks.iter().copied().filter(|s| *s != Sink::Kafka).collect();
    let run_id = format!(
        "{}{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() % 100_000)
    );
    let scenarios = scenarios(&o);
    let with_idle = !o.idle.is_zero() && o.selects(IDLE_LABEL);
    // The receiver's counts are in the report: check it before a run relies on them.
    if scenarios.iter().any(|s| matches!(s.trace, Trace::Otlp { .. })) {
        otlp::self_check().context("the benchmark's OTLP receiver failed its self-check")?;
    }
    let drains = match (o.drain, o.with_debezium || o.batched_drain) {
        (false, _) => Vec::new(),
        (true, false) => vec![1],
        (true, true) => vec![1, BATCHED_DRAIN_TXN],
    };
    let progress = MultiProgress::new();
    let overall = progress.add(ProgressBar::new(
        (scenarios.len() + drains.len() + usize::from(with_idle)) as u64,
    ));
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
        run_id: &run_id,
        sinks: &other_sinks,
    };
    let version: String = pg::connect(&pg.url("postgres", "postgres"))
        .await?
        .query_one("SHOW server_version", &[])
        .await?
        .get(0);

    let mut steady_results = Vec::new();
    let mut skipped = Vec::new();
    for (i, sc) in scenarios.iter().enumerate() {
        overall.set_message(sc.label());
        match steady::run(&ctx, sc, i, &phase).await {
            Ok(outcome) => {
                say(&progress, summary(&outcome));
                steady_results.push(outcome);
            }
            Err(e) => match e.downcast_ref::<steady::Skipped>() {
                Some(why) => {
                    say(&progress, format!("SKIPPED {}: {why}", sc.label()));
                    skipped.push((sc.label(), why.to_string()));
                }
                None => say(&progress, format!("FAILED {}: {e:#}", sc.label())),
            },
        }
        overall.inc(1);
    }
    let mut idle = None;
    if with_idle {
        overall.set_message(IDLE_LABEL);
        match idle::run(&ctx, o.warmup, o.idle, &phase).await {
            Ok(i) => {
                say(&progress, idle_summary(&i));
                idle = Some(i);
            }
            Err(e) => say(&progress, format!("FAILED {IDLE_LABEL}: {e:#}")),
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
            exactly_once: o.drain_exactly_once,
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

    let mut environment = report::Environment::collect(
        version,
        broker.describe(),
        o.kafka.clone(),
        o.warmup.as_secs_f64(),
        o.measure.as_secs_f64(),
        debezium.as_ref().map(debezium::Install::describe),
    );
    environment.sinks = sink_versions;
    environment.idle_s = with_idle.then_some(o.idle.as_secs_f64());
    let results = report::Results {
        environment,
        steady: steady_results,
        drain,
        batched_drain,
        idle,
        skipped,
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
    let sinks: String = d
        .sinks
        .iter()
        .map(|x| {
            format!(
                "; → {} {:.0} ev/s ({:.2}×, {} missing, {} dup)",
                x.sink,
                x.per_s,
                x.per_s / d.recvlogical_per_s,
                x.missing,
                x.duplicates
            )
        })
        .collect();
    format!(
        "drain {} events ({} per txn): relay {:.0} ev/s, pg_recvlogical {:.0} ev/s ({:.2}×), relay peak RSS {:.0} MiB{dbz}{sinks}",
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
    let mode = if o.is_kafka() {
        o.mode.clone()
    } else {
        format!("{} → {}", o.mode, o.sink)
    };
    let spans = o.otlp.map_or_else(String::new, |(c, events)| {
        format!(" {} spans for {events} events ({} requests),", c.spans, c.requests)
    });
    format!(
        "{:>14} {:>12}: {:>6.0} ev/s,{latency}{cpu}{spans} PG {:.1} µs/ev",
        mode, o.rate, o.achieved_per_s, o.pg_cpu_us_per_event
    )
}

/// What `--only` matches for the idle run.
const IDLE_LABEL: &str = "CDC idle";

fn idle_summary(i: &idle::IdleOutcome) -> String {
    format!(
        "{IDLE_LABEL}: {:.0} s without events: {:.3} % of a core ({:.2} s CPU per minute), {} threads, {:.1} context switches/s",
        i.seconds,
        i.cpu_pct_core,
        i.cpu_s_per_min,
        i.threads,
        i.voluntary_switches_per_s + i.nonvoluntary_switches_per_s
    )
}

/// `--replay`: the replay section alone (`replay.rs`), its own block in the docs.
async fn run_replay(o: &Options) -> Result<()> {
    if o.broker == "mock" {
        eprintln!("note: --replay on librdkafka's mock cluster; the figures for the docs come from --broker kafka");
    }
    let phase = ProgressBar::new(0);
    phase.set_style(ProgressStyle::with_template(
        "  {spinner} [{elapsed_precise}] {msg}  {pos}",
    )?);
    phase.enable_steady_tick(Duration::from_millis(120));
    phase.set_message("starting PostgreSQL and Kafka");
    let pg = tokio::task::spawn_blocking(pg::BenchPg::start).await??;
    pg.ready().await?;
    let broker = broker::Broker::start(&o.broker)?;
    let workdir = tempfile::Builder::new().prefix("outbox-relay-bench-").tempdir()?;
    let run_id = std::process::id().to_string();
    let ctx = steady::Ctx {
        pg: &pg,
        broker: &broker,
        workdir: workdir.path(),
        kafka: &o.kafka,
        debezium: None,
        run_id: &run_id,
        sinks: &[],
    };
    let spec = replay::ReplaySpec {
        rows: o.replay_rows,
        baseline: o.replay_baseline,
        rate: o.replay_rate,
    };
    let outcome = replay::run(&ctx, &spec, &phase).await;
    phase.finish_and_clear();
    let outcome = outcome?;
    let raw_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/cdc_vs_polling");
    std::fs::create_dir_all(&raw_dir)?;
    std::fs::write(raw_dir.join("replay.json"), serde_json::to_string_pretty(&outcome)?)?;
    let block = replay::markdown(&outcome);
    let md = o.out_dir.join(if o.quick {
        "benchmarks-replay-quick.md"
    } else {
        "benchmarks.md"
    });
    report::write_block(&md, replay::BEGIN, replay::END, &block)?;
    println!(
        "{block}\nwrote {} and {}",
        md.display(),
        raw_dir.join("replay.json").display()
    );
    Ok(())
}
