//! Log output: human text (default) or one JSON object per line, always on stderr so that
//! `status --json` on stdout stays machine-readable. `RUST_LOG` overrides the level filter.
//!
//! Invariant: the operator reads each failure once, in the relay's words (what failed and what
//! to do). The broker clients' own log lines say the same thing again in the client's terms — a
//! refused RabbitMQ login arrived as lapin's `io_loop: Connection closed …` and `Connection
//! error …` ERROR lines before the relay's own message — so they count as DEBUG: shown only when
//! the relay logs at DEBUG or finer. librdkafka's are routed to DEBUG by its log callback
//! (`src/sink/kafka/logs.rs`), which keeps what it calls critical at WARN.

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// The broker clients that log through `tracing` on their own (the tracing targets of
/// lapin, async-nats and redis), and whose failures the relay reports itself.
const CLIENT_TARGETS: &[&str] = &["lapin", "async_nats", "redis"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The filter for `--log-level` when `RUST_LOG` is unset.
fn default_filter(default_level: &str) -> String {
    // A level finer than INFO lets the clients' lines through (at that level); anything else,
    // including a composite `--log-level` directive, keeps them out.
    let clients = match default_level.trim().parse::<LevelFilter>() {
        Ok(level) if level >= LevelFilter::DEBUG => level.to_string().to_lowercase(),
        _ => "off".to_owned(),
    };
    let mut filter = format!("{default_level},rdkafka=warn,librdkafka=warn");
    for target in CLIENT_TARGETS {
        filter.push_str(&format!(",{target}={clients}"));
    }
    // lapin logs every message RabbitMQ returns (unroutable), body included: the relay reports
    // those as bad events itself, without the payload — never shown, even at DEBUG.
    filter.push_str(",lapin::returned_messages=error");
    filter
}

pub(crate) fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter(default_level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
    fn a_composite_log_level_keeps_the_clients_out() {
        let filter = default_filter("info,outbox_relay=debug");
        assert!(filter.contains(",lapin=off"), "{filter}");
        assert!(filter.starts_with("info,outbox_relay=debug,"), "{filter}");
    }
}
