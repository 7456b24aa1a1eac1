//! Log output: human text (default) or one JSON object per line, always on stderr so that
//! `status --json` on stdout stays machine-readable. `RUST_LOG` overrides the level filter. Text
//! carries ANSI colours only when stderr is a terminal (and `NO_COLOR` is unset): a file, a pipe
//! or a log collector gets plain text.
//!
//! Invariant: the operator reads each failure once, in the relay's words (what failed and what
//! to do). The broker clients' own log lines say the same thing again in the client's terms — a
//! refused RabbitMQ login arrived as lapin's `io_loop: Connection closed …` and `Connection
//! error …` ERROR lines before the relay's own message — so they count as DEBUG: shown only when
//! the relay logs at DEBUG or finer, whether the level comes from `--log-level` or `RUST_LOG`
//! (which may name a client's target to choose otherwise). librdkafka's are routed to DEBUG by its log callback
//! (`src/sink/kafka/logs.rs`), which keeps what it calls critical at WARN.

use std::io::IsTerminal as _;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// A broker client's log target, as the sink registry lists them (`sink::client_log_targets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientTarget {
    /// The `tracing` target: `lapin`.
    pub(crate) target: &'static str,
    /// `None`: at the relay's level when that is DEBUG or finer, off otherwise. `Some(level)`:
    /// always at that level (a target whose lines carry payloads; a client whose own callback
    /// routes its chatter).
    pub(crate) fixed: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The filter for `--log-level` when `RUST_LOG` is unset.
fn default_filter(default_level: &str, clients: &[ClientTarget]) -> String {
    with_client_directives(default_level, clients)
}

/// `filter` with the broker clients' targets at its own level when that is DEBUG or finer and
/// off otherwise — except a target `filter` names itself, which is the operator's choice. Also
/// applied to `RUST_LOG` (`RUST_LOG=info` is a common setting, and the clients' lines were the
/// problem there too; `RUST_LOG=info,lapin=debug` shows them).
fn with_client_directives(filter: &str, clients_of: &[ClientTarget]) -> String {
    let directives: Vec<&str> = filter.split(',').map(str::trim).collect();
    // The bare level (`info` in `info,outbox_relay=debug`); none, or a composite one, keeps the
    // clients out.
    let level = directives.iter().find(|d| !d.contains('=') && !d.is_empty());
    let clients = match level.map(|l| l.parse::<LevelFilter>()) {
        Some(Ok(level)) if level >= LevelFilter::DEBUG => level.to_string().to_lowercase(),
        _ => "off".to_owned(),
    };
    let names = |target: &str| {
        // Exact names only: EnvFilter lets a more specific directive (`lapin::io_loop=debug`)
        // win over the `lapin=off` added beside it.
        directives.iter().any(|d| d.split(['=', '[']).next() == Some(target))
    };
    let mut out = filter.to_owned();
    for client in clients_of {
        if !names(client.target) {
            out.push_str(&format!(",{}={}", client.target, client.fixed.unwrap_or(&clients)));
        }
    }
    out
}

/// Whether text logs carry ANSI colours: only on a terminal — a file, a pipe or a log collector
/// would store the escape codes as text — and never with `NO_COLOR` set to anything non-empty
/// (<https://no-color.org>).
fn colours(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the subscriber; `clients`: the broker clients' targets (every registered sink's).
pub(crate) fn init(format: LogFormat, default_level: &str, clients: &[ClientTarget]) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(operator) if !operator.trim().is_empty() => EnvFilter::try_new(with_client_directives(&operator, clients))
            .unwrap_or_else(|_| EnvFilter::new(default_filter(default_level, clients))),
        _ => EnvFilter::new(default_filter(default_level, clients)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR")))
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The registered sinks' client targets (`sink::client_log_targets`), as the CLI passes them.
    const CLIENTS: &[ClientTarget] = &[
        ClientTarget {
            target: "rdkafka",
            fixed: Some("warn"),
        },
        ClientTarget {
            target: "librdkafka",
            fixed: Some("warn"),
        },
        ClientTarget {
            target: "async_nats",
            fixed: None,
        },
        ClientTarget {
            target: "lapin",
            fixed: None,
        },
        ClientTarget {
            target: "lapin::returned_messages",
            fixed: Some("error"),
        },
        ClientTarget {
            target: "redis",
            fixed: None,
        },
    ];

    fn default_filter(level: &str) -> String {
        super::default_filter(level, CLIENTS)
    }

    fn with_client_directives(filter: &str) -> String {
        super::with_client_directives(filter, CLIENTS)
    }

    /// What a subscriber with `default_filter(level)` writes for a lapin ERROR (as lapin logs a
    /// refused login), a relay ERROR and a returned message.
    fn written(level: &str) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(default_filter(level)))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "lapin::channels", "Connection error");
            tracing::error!(target: "async_nats::connector", "authorization violation");
            tracing::error!(target: "outbox_relay::cli", "RabbitMQ refused the login");
            tracing::warn!(target: "lapin::returned_messages", "returned message with its body");
        });
        let text = buffer.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(text).unwrap_or_default()
    }

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".into())));
        assert!(!colours(true, Some("1".into())));
        assert!(!colours(false, None));
    }

    #[test]
    fn broker_clients_own_errors_are_shown_only_at_debug() {
        let info = written("info");
        assert!(info.contains("RabbitMQ refused the login"), "{info}");
        assert!(!info.contains("Connection error"), "{info}");
        assert!(!info.contains("authorization violation"), "{info}");
        let debug = written("debug");
        assert!(debug.contains("Connection error"), "{debug}");
        assert!(debug.contains("authorization violation"), "{debug}");
        for text in [&info, &debug, &written("trace")] {
            assert!(!text.contains("with its body"), "{text}");
        }
    }

    #[test]
    fn rust_log_keeps_the_clients_out_unless_it_names_them() {
        assert!(with_client_directives("info").contains(",lapin=off"));
        assert!(with_client_directives("debug").contains(",lapin=debug"));
        let named = with_client_directives("info,lapin=debug");
        assert!(!named.contains("lapin=off"), "{named}");
        assert!(named.contains(",async_nats=off"), "{named}");
        let returned = with_client_directives("warn,lapin::returned_messages=trace");
        assert!(!returned.contains("lapin::returned_messages=error"), "{returned}");
        assert!(returned.contains(",lapin=off"), "{returned}");
    }

    #[test]
    fn a_composite_log_level_keeps_the_clients_out() {
        let filter = default_filter("info,outbox_relay=debug");
        assert!(filter.contains(",lapin=off"), "{filter}");
        assert!(filter.starts_with("info,outbox_relay=debug,"), "{filter}");
    }
}
