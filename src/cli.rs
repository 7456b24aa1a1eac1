//! Command-line interface. Every subcommand but `demo` and `import-debezium` reads the same TOML
//! file (`--config`), with `OUTBOX_RELAY__<SECTION>__<KEY>` environment overrides (see
//! `src/config/`).
//!
//! Exit codes: 0 success; 1 a runtime failure (connection, fatal relay error); 2 a usage or
//! configuration error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::{error, info};

use crate::config::Settings;
use crate::ops::logging::{self, LogFormat};
use crate::{control, relay};

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional-outbox relay: PostgreSQL WAL (pgoutput) to Kafka or another sink, confirmed only after the sink acknowledged"
)]
pub(crate) struct Cli {
    /// The TOML configuration file (see config/outbox-relay.toml).
    #[arg(long, short = 'c', global = true, env = "OUTBOX_RELAY_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "OUTBOX_RELAY_LOG_FORMAT"
    )]
    pub(crate) log_format: LogFormat,
    /// Default log level (RUST_LOG overrides it).
    #[arg(long, global = true, default_value = "info", env = "OUTBOX_RELAY_LOG_LEVEL")]
    pub(crate) log_level: String,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Check the database and create the publication and logical slot (idempotent).
    Setup {
        /// Migrating from a polling relayer: create the slot with an exported snapshot and first
        /// publish the rows still pending in it (`[poll] dispatched_column` IS NULL). Refused if
        /// the slot exists. See docs/migrating-from-polling.md.
        #[arg(long)]
        backfill: bool,
        /// With --backfill, recovering a lost slot (a failover on PostgreSQL 14-16): publish every
        /// outbox row whose id is greater than N (an integer id column) instead of the
        /// undispatched ones. See docs/operations.md, "Failover on PostgreSQL 14-16".
        #[arg(long, value_name = "N", requires = "backfill", conflicts_with = "since")]
        since_id: Option<i64>,
        /// With --backfill, recovering a lost slot: publish every outbox row created at or after
        /// TIMESTAMP (e.g. '2024-05-01T12:00:00Z'), by the creation-time column retention ages
        /// rows by (retention.timestamp_column, else outbox.timestamp_column, else created_at).
        #[arg(long, value_name = "TIMESTAMP", requires = "backfill")]
        since: Option<String>,
        /// For `poll` mode instead: check the outbox table (no wal_level, slot or publication
        /// needed) and create the partial index claims read, `(created_at) WHERE <[poll]
        /// dispatched_column> IS NULL`, if missing.
        #[arg(long, conflicts_with = "backfill")]
        poll: bool,
        /// A dry run: make every check setup makes — what `run` would refuse, the database and
        /// the outbox tables, [retention] against each table, the sink's reachability — and
        /// create or change nothing. Exits 1 on the first problem, with the message setup or
        /// `run` would print. See docs/configuration.md, "Checking a configuration".
        #[arg(long, conflicts_with_all = ["backfill", "poll"])]
        check: bool,
    },
    /// Stream outbox inserts to the configured sink until SIGINT/SIGTERM.
    Run,
    /// The classic polling relayer (claim rows with FOR UPDATE SKIP LOCKED, publish, mark them
    /// dispatched) until SIGINT/SIGTERM. See the [poll] config section.
    Poll,
    /// Show the slot, its lag and retained WAL, and the publication.
    Status {
        /// Print JSON (stable schema: src/control/status.rs, docs/operations.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// See it work: a throwaway PostgreSQL, an embedded Kafka (unless --bootstrap), producers,
    /// the relay and a consumer, with live progress and a summary. Needs no --config.
    #[cfg(feature = "demo")]
    Demo(crate::demo::DemoArgs),
    /// Print the outbox-relay config equivalent to a Debezium PostgreSQL connector config with the
    /// Outbox EventRouter (Kafka Connect's JSON or a .properties file); options with no
    /// counterpart are listed, with the reason, as comments at the end. Needs no --config and
    /// connects to nothing. See docs/migrating-from-debezium.md.
    ImportDebezium {
        /// The connector config: `{"name": …, "config": {…}}`, the bare config object, or properties.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Re-publish rows still in the outbox table(s): the same records `run` wrote, with an
    /// `outbox-relay-replay` header. Never touches the slot; runs beside a running relay. See
    /// docs/operations.md, "Replaying events".
    Replay(ReplayCli),
    /// Drop the slot and the publication.
    Teardown {
        /// Confirm: dropping the slot discards the WAL position of undelivered events.
        #[arg(long)]
        yes: bool,
    },
}

/// `replay`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayCli {
    /// Rows from here on (inclusive): an RFC 3339 time (2026-05-01T12:00:00Z), a duration back
    /// from now (24h, 90m, 7d) or an id (id:41).
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Rows before this (exclusive), same forms as --since. Default: rows created before the
    /// replay started. Times are compared with the creation-time column retention ages rows by
    /// (retention.timestamp_column, else outbox.timestamp_column, else created_at).
    #[arg(long, value_name = "WHEN")]
    until: Option<String>,
    /// Only rows whose route-by value matches this glob (`*`, `?`); repeatable (any of them).
    #[arg(long = "type", value_name = "GLOB")]
    types: Vec<String>,
    /// Only rows of this aggregate id (the key column); repeatable (any of them).
    #[arg(long = "aggregate", value_name = "ID")]
    aggregates: Vec<String>,
    /// Only this outbox table (one of outbox.table).
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// Count the selected rows and show the first ones; send nothing.
    #[arg(long)]
    dry_run: bool,
    /// At most N events per second.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// Send every record to this destination (topic, subject, routing key, stream) instead of
    /// the routed one.
    #[arg(long, value_name = "NAME")]
    to_topic: Option<String>,
    /// Continue an interrupted replay with the same arguments, after what was acknowledged.
    #[arg(long)]
    resume: bool,
    /// Directory of the replay's state file (default: the config file's directory).
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

/// The subcommands that read `--config` (all but `demo` and `import-debezium`).
enum Configured {
    Setup {
        backfill: bool,
        poll: bool,
        since_id: Option<i64>,
        since: Option<String>,
        check: bool,
    },
    Run,
    Poll,
    Status {
        json: bool,
    },
    Teardown {
        yes: bool,
    },
    Replay(ReplayCli),
}

/// Every registered sink's client log targets, for the log filter (set before the
/// configuration is read, so it covers whichever sink is chosen).
fn client_log_targets() -> Vec<logging::ClientTarget> {
    crate::sink::client_log_targets()
        .into_iter()
        .map(|t| logging::ClientTarget {
            target: t.target,
            fixed: t.fixed,
        })
        .collect()
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            // The demo's progress line is the interesting output; the relay's info logs would bury it.
            let level = if cli.log_level == "info" {
                "warn"
            } else {
                &cli.log_level
            };
            logging::init(cli.log_format, level, &client_log_targets());
            return crate::demo::main(args);
        }
        Command::ImportDebezium { file } => return import_debezium(&file),
        Command::Setup {
            backfill,
            poll,
            since_id,
            since,
            check,
        } => Configured::Setup {
            backfill,
            poll,
            since_id,
            since,
            check,
        },
        Command::Run => Configured::Run,
        Command::Poll => Configured::Poll,
        Command::Status { json } => Configured::Status { json },
        Command::Teardown { yes } => Configured::Teardown { yes },
        Command::Replay(args) => Configured::Replay(args),
    };
    logging::init(cli.log_format, &cli.log_level, &client_log_targets());
    let Some(path) = cli.config.clone() else {
        eprintln!("error: --config FILE is required (or set OUTBOX_RELAY_CONFIG); see config/outbox-relay.toml for an example");
        return ExitCode::from(2);
    };
    let settings = match Settings::load(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // One worker for the side tasks (HTTP, slot monitor, heartbeats, signals; the stream has its
    // own thread, and librdkafka brings its own threads). With two workers, every socket or channel wake-up also woke the idle worker to
    // look for work to steal — twice the context switches, which dominated the relay's CPU per
    // event (benches/cdc_vs_polling: 41 → 20 µs per event draining a backlog).
    let runtime = match crate::ops::runtime(1) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(dispatch(command, &path, settings))
}

/// `replay`: exit 2 for arguments it cannot use, 1 for a runtime failure or an interruption
/// (the message says how to resume).
async fn replay(args: ReplayCli, config: &std::path::Path, settings: Settings) -> ExitCode {
    use crate::control::replay::selection::{Bound, Criteria};
    let bound = |flag: &str, text: Option<String>| text.map(|t| Bound::parse(flag, &t)).transpose();
    let (since, until) = match (bound("--since", args.since), bound("--until", args.until)) {
        (Ok(since), Ok(until)) => (since, until),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let state_dir = args.state.unwrap_or_else(|| match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let replay_args = control::replay::ReplayArgs {
        criteria: Criteria {
            since,
            until,
            types: args.types,
            aggregates: args.aggregates,
            table: args.table,
        },
        dry_run: args.dry_run,
        rate: args.rate,
        to_topic: args.to_topic,
        resume: args.resume,
        state_dir,
    };
    let (tx, rx) = watch::channel(false);
    tokio::spawn(forward_signals(tx));
    match control::replay::replay(&settings, &replay_args, rx).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

async fn dispatch(command: Configured, config: &std::path::Path, settings: Settings) -> ExitCode {
    match command {
        Configured::Setup { check: true, .. } => report(control::check(&settings).await.map(|r| r.to_string())),
        Configured::Setup { poll: true, .. } => {
            report(crate::poll::setup::setup(&settings).await.map(|r| r.to_string()))
        }
        Configured::Setup { backfill: false, .. } => report(control::setup(&settings).await.map(|r| r.to_string())),
        Configured::Setup {
            backfill: true,
            since_id,
            since,
            ..
        } => {
            let selection = match (since_id, since.as_deref()) {
                (Some(id), _) => control::backfill::Selection::AfterId(id),
                (None, Some(ts)) => control::backfill::Selection::Since(ts),
                (None, None) => control::backfill::Selection::Undispatched(&settings.poll.dispatched),
            };
            report(
                control::setup_with_backfill(&settings, selection)
                    .await
                    .map(|r| r.to_string()),
            )
        }
        Configured::Status { json } => report(control::status(&settings).await.map(|r| {
            if json {
                serde_json::to_string_pretty(&r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
            } else {
                r.to_string()
            }
        })),
        Configured::Teardown { yes } => {
            if !yes {
                eprintln!(
                    "error: teardown drops slot {:?} and publication {:?}; events not yet delivered can then be lost. Re-run with --yes",
                    settings.postgres.slot.as_str(),
                    settings.postgres.publication.as_str()
                );
                return ExitCode::from(2);
            }
            report(control::teardown(&settings).await.map(|r| r.to_string()))
        }
        Configured::Run => run(settings).await,
        Configured::Replay(args) => replay(args, config, settings).await,
        Configured::Poll => run_poll(settings).await,
    }
}

/// Prints the imported config on stdout (so `> relay.toml` captures exactly the file) and the
/// summary on stderr. An unusable connector config is a usage error (2).
fn import_debezium(file: &std::path::Path) -> ExitCode {
    match control::import_debezium::import_debezium(file) {
        Ok(imported) => {
            print!("{}", imported.toml);
            eprintln!("{}", imported.summary);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn report<E: std::fmt::Display>(result: Result<String, E>) -> ExitCode {
    match result {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The `[http]` endpoints, if configured; `Err` (already logged) when they cannot start.
async fn start_http(
    settings: &Settings,
    health: &std::sync::Arc<crate::ops::health::RelayHealth>,
) -> Result<Option<crate::ops::http::HttpServer>, ()> {
    crate::ops::http::start(&settings.http, std::sync::Arc::clone(health))
        .await
        .map_err(|e| error!("{e}"))
}

async fn run(settings: Settings) -> ExitCode {
    info!(
        version = env!("CARGO_PKG_VERSION"),
        postgres = %settings.postgres.url,
        slot = %settings.postgres.slot,
        publication = %settings.postgres.publication,
        tables = %settings.outbox.tables_display(),
        "outbox-relay starting"
    );
    let (tx, rx) = watch::channel(false);
    tokio::spawn(forward_signals(tx));
    let health = std::sync::Arc::new(crate::ops::health::RelayHealth::default());
    // Kept alive until the relay returns, so probes keep answering while it drains.
    let Ok(_http) = start_http(&settings, &health).await else {
        return ExitCode::from(1);
    };
    // The stream itself runs on a thread of its own (`relay::run`); this task only waits for it.
    let slot = settings.postgres.slot.clone();
    let relay = tokio::spawn(async move { relay::run(&settings, rx, health).await });
    match relay.await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        // The one line that says why the relay stopped: nothing below logs it again.
        Ok(Err(e)) => {
            error!(slot = %slot, "fatal: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            error!("the relay task failed: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run_poll(settings: Settings) -> ExitCode {
    info!(version = env!("CARGO_PKG_VERSION"), postgres = %settings.postgres.url, tables = %settings.outbox.tables_display(), "outbox-relay poll starting");
    let (tx, rx) = watch::channel(false);
    tokio::spawn(forward_signals(tx));
    let health = std::sync::Arc::new(crate::ops::health::RelayHealth::default());
    let Ok(_http) = start_http(&settings, &health).await else {
        return ExitCode::from(1);
    };
    match crate::poll::run(&settings, &health, rx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Turns the first SIGINT or SIGTERM into a shutdown request.
async fn forward_signals(tx: watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        error!("cannot install signal handlers; stop the relay with SIGKILL only as a last resort");
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(signal = name, "shutdown requested: draining in-flight events");
    let _ = tx.send(true);
}
