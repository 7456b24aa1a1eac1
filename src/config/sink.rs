//! `[sink]`: which broker the relay publishes to. Each broker has a section of its own
//! (`[kafka]`, …); only the chosen one may be present.

use serde::Deserialize;

use crate::config::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SinkSection {
    /// See [`SinkKind`].
    pub(crate) kind: String,
}

impl Default for SinkSection {
    fn default() -> Self {
        SinkSection { kind: "kafka".into() }
    }
}

/// The broker events are published to (`[sink] kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// `[kafka]`: librdkafka properties.
    Kafka,
    /// `[redis]`: Redis Streams (docs/sink-redis.md).
    Redis,
    /// `[rabbitmq]`: an AMQP 0-9-1 broker's URL and exchange (docs/sink-rabbitmq.md).
    RabbitMq,
    /// `[nats]`: NATS JetStream (docs/sink-nats.md).
    Nats,
}

/// Every kind, as written in the config: the one list `[sink] kind` is checked against.
const KINDS: &[(&str, SinkKind)] = &[
    ("kafka", SinkKind::Kafka),
    ("nats", SinkKind::Nats),
    ("rabbitmq", SinkKind::RabbitMq),
    ("redis", SinkKind::Redis),
];

impl SinkKind {
    /// The broker's name for people, in log lines.
    pub(crate) fn broker_name(self) -> &'static str {
        match self {
            SinkKind::Kafka => "Kafka",
            SinkKind::Redis => "Redis",
            SinkKind::RabbitMq => "RabbitMQ",
            SinkKind::Nats => "NATS JetStream",
        }
    }

    /// The config word for this kind, which is also its section's name.
    pub(crate) fn label(self) -> &'static str {
        KINDS.iter().find(|(_, k)| *k == self).map_or("kafka", |(name, _)| name)
    }
}

impl SinkSection {
    pub(crate) fn validate(self) -> Result<SinkKind, ConfigError> {
        let kind = self.kind.trim();
        KINDS
            .iter()
            .find(|(name, _)| *name == kind)
            .map(|(_, k)| *k)
            .ok_or_else(|| ConfigError::Invalid {
                key: "sink.kind",
                message: format!(
                    "{kind:?} is not a sink this relay has; use one of {}",
                    KINDS
                        .iter()
                        .map(|(n, _)| format!("\"{n}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_is_the_default_and_unknown_kinds_name_the_choices() {
        assert_eq!(SinkSection::default().validate().unwrap(), SinkKind::Kafka);
        assert_eq!(SinkKind::Kafka.label(), "kafka");
        let err = SinkSection { kind: "kinesis".into() }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sink.kind") && err.contains("\"kinesis\"") && err.contains("\"kafka\""),
            "{err}"
        );
    }
}
