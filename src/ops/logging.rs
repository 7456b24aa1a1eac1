//! Log output: human text (default) or one JSON object per line, always on stderr so that
//! `status --json` on stdout stays machine-readable. `RUST_LOG` overrides the level filter.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

pub(crate) fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            // lapin logs every message RabbitMQ returns (unroutable), body included: the relay
            // reports those as bad events itself, without the payload.
            "{default_level},rdkafka=warn,librdkafka=warn,lapin::returned_messages=error"
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
}
