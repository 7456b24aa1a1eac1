//! `outbox-relay demo`: the whole pipeline on one machine in one command.
//!
//! It starts a throwaway PostgreSQL with `wal_level = logical` ([`postgres`]), creates the
//! first seed's schema, runs `setup`, then runs, all in this process, producers placing orders at
//! `--rate` ([`producer`]), the relay itself (`relay::run`, the same code as `outbox-relay run`),
//! and a consumer, with a live progress line ([`stats`]); at the end (`--duration`, or Ctrl-C) it
//! stops the producers, lets the relay and the consumer drain, stops the relay, and prints a
//! summary.
//!
//! What is particular to the sink — `--sink NAME`, one of the registered kinds, the default
//! kind's unless given — is its demo half's answer (`crate::sink::demo`, each sink's own
//! `demo.rs`): the server it needs (embedded unless `--bootstrap` gives one, running at
//! `--sink-url`, or a receiver of the demo's own), what its client reads from the environment,
//! the run's configuration section, what the summary says of it, and the consumer that makes what
//! the run reads from before the relay starts, counts by event id (so duplicates show), and
//! removes what the run made at the end (best effort). The demo never reaches a cloud account:
//! a cloud sink's demo goes to a local stand-in (an emulator, moto), checked to answer before
//! anything starts. This module names no sink.
//!
//! Cleanup invariant: whatever happens after PostgreSQL started — success, an error, Ctrl-C —
//! the server is stopped and its temporary directory removed before the demo exits; a demo
//! killed outright is covered by the server's watchdog (see [`postgres`]).

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
use crate::sink::demo::{self as sink_demo, DemoRun, DemoTarget, LocalServer, Server, SinkDemo};
use postgres::ThrowawayPostgres;
use stats::{ProgressLine, RunTally, Stats, Summary};

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
    /// Stop after this long (default: run until Ctrl-C): a duration as the config writes them
    /// ("30s", "2m", "1m30s"); a bare number is seconds.
    #[arg(long, value_name = "DURATION", value_parser = demo_duration)]
    pub(crate) duration: Option<Duration>,
    /// The sink the relay publishes to: one of the registered `[sink] kind`s, each with the
    /// server its demo needs — embedded (unless `--bootstrap` gives one), running at
    /// `--sink-url`, or a receiver of the demo's own.
    #[arg(long, default_value = default_kind(), value_parser = kinds())]
    pub(crate) sink: String,
    /// The server of a `--sink` that runs already (default: the server's usual address on
    /// 127.0.0.1; a local stand-in of a cloud service is checked to answer before anything
    /// starts).
    #[arg(long, value_name = "URL", conflicts_with = "bootstrap")]
    pub(crate) sink_url: Option<String>,
    /// Use this server (host:port[,host:port…]) instead of the one a `--sink` embeds.
    #[arg(long, value_name = "SERVERS")]
    pub(crate) bootstrap: Option<String>,
    /// Directory of the PostgreSQL server binaries (initdb, postgres, pg_ctl); found
    /// automatically when unset.
    #[arg(long, value_name = "DIR", env = "OUTBOX_RELAY_PG_BIN")]
    pub(crate) pg_bin: Option<PathBuf>,
}

/// `--duration`: the config's duration parser (`crate::config::retention::parse_duration`), so
/// `20s` works here as everywhere else; a bare number stays seconds, as the flag always read it.
fn demo_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("{text:?} is too many seconds"));
    }
    crate::config::retention::parse_duration(text).map_err(|e| format!("{text:?} {e}"))
}

/// The registered kinds, for `--sink` (with what each sink's demo says of itself in `--help`).
fn kinds() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(sink_demo::sinks().into_iter().map(|(kind, demo)| {
        let value = clap::builder::PossibleValue::new(kind);
        match demo.help {
            Some(help) => value.help(help),
            None => value,
        }
    }))
}

/// `--sink`'s default: the default `[sink] kind` (the first registered).
fn default_kind() -> &'static str {
    sink_demo::sinks().first().map_or("", |(kind, _)| *kind)
}

/// The kinds whose server `server` picks, for messages: `nats|rabbitmq|redis`.
fn kinds_with(server: impl Fn(Server) -> bool) -> String {
    sink_demo::sinks()
        .into_iter()
        .filter(|(_, demo)| server(demo.server))
        .map(|(kind, _)| kind)
        .collect::<Vec<_>>()
        .join("|")
}

/// The server `--sink` is given: `--bootstrap` for one the sink otherwise embeds, `--sink-url`
/// (or its default) for one that runs already, none for the demo's own.
fn address(args: &DemoArgs, server: Server) -> Option<String> {
    match server {
        Server::Own(_) => None,
        Server::Embedded(_) => args.bootstrap.clone(),
        Server::Running { default_url, .. } => Some(args.sink_url.clone().unwrap_or_else(|| default_url.to_owned())),
    }
}

/// Why the arguments do not go together (`--sink-url` for a sink that embeds its server or runs
/// its own, `--bootstrap` for one that does not embed it), in the words of the error.
fn misused(args: &DemoArgs, server: Server) -> Option<String> {
    let embedders = || {
        sink_demo::sinks()
            .into_iter()
            .filter_map(|(_, demo)| match demo.server {
                Server::Embedded(name) => Some(name),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" or ")
    };
    match (server, &args.bootstrap, &args.sink_url) {
        (Server::Embedded(name), _, Some(_)) => Some(format!(
            "--sink-url is for --sink {}; a {name} is given by --bootstrap",
            kinds_with(|s| matches!(s, Server::Running { .. }))
        )),
        (Server::Own(what), _, Some(_)) => Some(format!(
            "--sink {} runs its own {what}; leave --sink-url out",
            args.sink
        )),
        (Server::Running { .. } | Server::Own(_), Some(_), _) => Some(format!(
            "--bootstrap is for {}; give the server of --sink with --sink-url",
            embedders()
        )),
        _ => None,
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
    let Some(demo) = sink_demo::find(&args.sink) else {
        eprintln!("error: --sink {}: no such sink", args.sink);
        return ExitCode::from(2);
    };
    let server = demo.server;
    if let Some(why) = misused(&args, server) {
        eprintln!("error: {why}");
        return ExitCode::from(2);
    }
    // The relay runs in this process and its clients read their conventions from the
    // environment: set before the runtime's threads exist.
    if let Some(address) = address(&args, server).filter(|_| matches!(server, Server::Running { .. })) {
        (demo.point_clients_at)(&address);
    }
    let runtime = match crate::ops::runtime(2) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args, demo)) {
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

/// For a local stand-in of a cloud service: fails, before anything starts, when nothing answers
/// at `address` (`host:port`, or a URL), naming how to start the server.
async fn check_local_server(local: LocalServer, address: &str) -> Result<(), DemoError> {
    let LocalServer { name, start: how } = local;
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
pub(crate) async fn run(args: DemoArgs, demo: &'static SinkDemo) -> Result<Summary, DemoError> {
    let mut progress = ProgressLine::new();
    let interrupts = watch_interrupts();
    let server = demo.server;
    let address = address(&args, server);
    if let (Server::Running { local: Some(local), .. }, Some(address)) = (server, &address) {
        check_local_server(local, address).await?;
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
    let run = DemoRun {
        id: run_id,
        event_type: producer::EVENT_TYPE,
    };
    let target = match (demo.open)(address, &run) {
        Ok(target) => target,
        Err(e) => {
            let mut pg = pg;
            let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
            return Err(DemoError::Sink(e));
        }
    };

    let outcome = pipeline(&args, &pg, &*target, &run.id, interrupts, &mut progress).await;

    progress.finish();
    let mut pg = pg;
    let stopped = tokio::task::spawn_blocking(move || pg.stop()).await;
    // What the sink's demo holds (an embedded broker) stops after PostgreSQL, as the relay did.
    drop(target);
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
    target: &dyn DemoTarget,
    run_id: &str,
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

    let settings = demo_settings(&pg.url(DATABASE), &args.sink, target)?;
    let setup = crate::control::setup(&settings).await?;
    progress.message(&format!("demo: setup done\n{setup}"));

    let topic = settings.router.route(producer::EVENT_TYPE).into_owned();
    let stats = Arc::new(Stats::new());
    let consumer_stop = Arc::new(AtomicBool::new(false));
    // Started before the relay: what it reads from (a bound queue, a subscription) must exist
    // before anything is published.
    let tally = Arc::new(RunTally {
        stats: Arc::clone(&stats),
        run_id: run_id.to_owned(),
    });
    let consumer = target
        .consume(&topic, tally, Arc::clone(&consumer_stop))
        .await
        .map_err(DemoError::Sink)?;

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
            Some(d) => format!("running for {} (Ctrl-C stops early)", crate::config::retention::show(d)),
            None => "running until Ctrl-C".into(),
        }
    ));

    // Produce until the duration is up or Ctrl-C.
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
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
        sink: target.describe(&settings.sink),
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

/// The relay's configuration for the demo database, as a user would write it.
fn demo_settings(url: &str, kind: &str, target: &dyn DemoTarget) -> Result<Settings, DemoError> {
    let sink = target.config().text(kind);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duration_takes_units_like_every_other_duration() {
        assert_eq!(demo_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(demo_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(demo_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(demo_duration("30"), Ok(Duration::from_secs(30)));
        assert!(
            demo_duration("soon").unwrap_err().contains("with a unit"),
            "{:?}",
            demo_duration("soon")
        );
    }
}
