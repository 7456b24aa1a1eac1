//! `[rabbitmq]`: where the RabbitMQ (AMQP 0-9-1) sink publishes — the broker's URL and the
//! exchange every event is published to, with its routed destination as the routing key.
//! docs/sink-rabbitmq.md has the whole story.

use serde::Deserialize;

use crate::config::secret::Secret;
use crate::config::sink::SinkSection;
use crate::config::ConfigError;
use crate::sink::plugin::{Absent, SectionSpec};

/// Longest AMQP short string: exchange names and routing keys.
pub(crate) const MAX_SHORT_STRING: usize = 255;

/// The section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RabbitMqSection {
    /// `amqp://user:password@host:port/vhost` (`%2f` is the default vhost `/`); `amqps://` for TLS.
    pub(crate) url: Option<Secret>,
    /// The durable topic exchange events are published to; `outbox-relay setup` declares it.
    pub(crate) exchange: Option<String>,
}

/// `[rabbitmq]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitMqSettings {
    /// Holds a password: printed only redacted.
    pub(crate) url: Secret,
    pub(crate) exchange: String,
}

impl RabbitMqSection {
    pub(crate) fn validate(self) -> Result<RabbitMqSettings, ConfigError> {
        let url = self.url.ok_or_else(|| ConfigError::Invalid {
            key: "rabbitmq.url",
            message: "missing: set the broker's URL, e.g. url = \"amqp://user:password@127.0.0.1:5672/%2f\"".into(),
        })?;
        let text = url.expose();
        if !(text.starts_with("amqp://") || text.starts_with("amqps://")) {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.url",
                message: format!(
                    "{url} is not an AMQP URL: write amqp://user:password@host:5672/vhost (amqps:// for TLS)"
                ),
            });
        }
        if let Err(e) = text.parse::<lapin::uri::AMQPUri>() {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.url",
                message: format!(
                    "{url} cannot be read ({}); write amqp://user:password@host:5672/vhost, with the vhost \
                     URL-encoded (%2f for \"/\")",
                    crate::config::secret::redact_connection_string(&e)
                ),
            });
        }
        let exchange = self.exchange.unwrap_or_default();
        let exchange = exchange.trim();
        if exchange.is_empty() {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.exchange",
                message: "missing or empty: name the topic exchange events are published to, e.g. exchange = \
                          \"outbox\" (the default exchange \"\" cannot be used: it routes by queue name only)"
                    .into(),
            });
        }
        if exchange.starts_with("amq.") {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.exchange",
                message: format!(
                    "{exchange:?}: names starting with \"amq.\" are reserved by the broker; choose another name"
                ),
            });
        }
        if exchange.len() > MAX_SHORT_STRING {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.exchange",
                message: format!("{} bytes long; AMQP allows at most {MAX_SHORT_STRING}", exchange.len()),
            });
        }
        if let Some(bad) = exchange
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
        {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.exchange",
                message: format!(
                    "{exchange:?} contains {bad:?}; exchange names allow letters, digits, '-', '_', '.' and ':'"
                ),
            });
        }
        Ok(RabbitMqSettings {
            url,
            exchange: exchange.to_owned(),
        })
    }
}

/// The sink's name for people, in errors and logs (the section's `name`).
pub(crate) const SINK: &str = "RabbitMQ";

/// The config half of `[rabbitmq]`, `[sink] kind = "rabbitmq"` (required).
pub(crate) const SECTION: SectionSpec<RabbitMqSection, RabbitMqSettings> = SectionSpec {
    kind: "rabbitmq",
    name: SINK,
    absent: Absent::Refused(
        "[sink] kind = \"rabbitmq\" needs a [rabbitmq] section: add one with url = \
         \"amqp://user:password@host:5672/%2f\" and exchange = \"outbox\"",
    ),
    validate: RabbitMqSection::validate,
    binary_refused: None,
};

impl SinkSection for RabbitMqSettings {}

/// An AMQP routing key: at most 255 bytes (any bytes; a topic exchange matches dot-separated words).
pub(crate) fn validate_routing_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the routed routing key is empty".into());
    }
    if key.len() > MAX_SHORT_STRING {
        return Err(format!(
            "the routed routing key is {} bytes; AMQP allows at most {MAX_SHORT_STRING}",
            key.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(url: Option<&str>, exchange: Option<&str>) -> RabbitMqSection {
        RabbitMqSection {
            url: url.map(Secret::new),
            exchange: exchange.map(str::to_owned),
        }
    }

    #[test]
    fn a_url_and_an_exchange_are_enough() {
        let s = section(Some("amqp://guest:guest@127.0.0.1:5672/%2f"), Some("outbox"))
            .validate()
            .unwrap();
        assert_eq!(s.exchange, "outbox");
        assert_eq!(s.url.expose(), "amqp://guest:guest@127.0.0.1:5672/%2f");
        let shown = format!("{s:?}");
        assert!(!shown.contains("guest@"), "{shown}");
    }

    #[test]
    fn errors_name_the_key_and_the_fix_without_the_password() {
        let err = section(None, Some("outbox")).validate().unwrap_err().to_string();
        assert!(err.contains("rabbitmq.url") && err.contains("amqp://"), "{err}");
        let err = section(Some("http://u:hunter2@h/"), Some("outbox"))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("rabbitmq.url") && !err.contains("hunter2"), "{err}");
        let err = section(Some("amqp://u:hunter2@h:notaport/%2f"), Some("outbox"))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("rabbitmq.url") && !err.contains("hunter2"), "{err}");
        for bad in [None, Some(""), Some("amq.topic"), Some("a b")] {
            let err = section(Some("amqp://127.0.0.1"), bad)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains("rabbitmq.exchange"), "{err}");
        }
        let long = "x".repeat(256);
        assert!(section(Some("amqp://127.0.0.1"), Some(&long)).validate().is_err());
    }

    #[test]
    fn routing_keys_are_short_strings() {
        assert!(validate_routing_key("orders.created").is_ok());
        assert!(validate_routing_key(&"k".repeat(255)).is_ok());
        let err = validate_routing_key(&"k".repeat(256)).unwrap_err();
        assert!(err.contains("255"), "{err}");
        assert!(validate_routing_key("").is_err());
    }
}

#[cfg(test)]
mod file_tests {
    use std::path::Path;

    use super::RabbitMqSettings;
    use crate::config::Settings;

    const PG: &str = "[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n";

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Settings, String> {
        Settings::from_toml_str(
            text,
            Path::new("t.toml"),
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_comes_with_its_kind_only_and_env_overrides_it() {
        let text = format!(
            "{PG}[sink]\nkind = \"rabbitmq\"\n[rabbitmq]\nurl = \"amqp://u:pw@h:5672/%2f\"\nexchange = \"outbox\"\n"
        );
        let s = load(&text, &[]).unwrap();
        assert_eq!(s.sink.label(), "rabbitmq");
        assert_eq!(s.sink.section::<RabbitMqSettings>().unwrap().exchange, "outbox");
        let s = load(&text, &[("OUTBOX_RELAY__RABBITMQ__URL", "amqp://u:other@h2:5672/v")]).unwrap();
        assert_eq!(
            s.sink.section::<RabbitMqSettings>().unwrap().url.expose(),
            "amqp://u:other@h2:5672/v"
        );

        let err = load(&format!("{PG}[sink]\nkind = \"rabbitmq\"\n"), &[]).unwrap_err();
        assert!(err.contains("[rabbitmq]") && err.contains("exchange"), "{err}");
        let err = load(
            &format!("{PG}[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n[rabbitmq]\nexchange = \"x\"\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            err.contains("remove the section") && err.contains("kind = \"rabbitmq\""),
            "{err}"
        );
        let err = load(&format!("{text}typo = 1\n"), &[]).unwrap_err();
        assert!(err.contains("typo"), "{err}");
        let err = load(
            &format!("{PG}[sink]\nkind = \"rabbitmq\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n[rabbitmq]\nurl = \"amqp://h\"\nexchange = \"x\"\n"),
            &[],
        )
        .unwrap_err();
        assert!(err.contains("[kafka]"), "{err}");
        let s = load(&format!("{PG}[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n"), &[]).unwrap();
        assert!(s.sink.section::<RabbitMqSettings>().is_none());
    }
}
