//! Configuration: a TOML file plus environment overrides, validated into [`Settings`].
//!
//! Loading is two-step. The file is parsed into the raw `*Section` structs (serde with
//! `deny_unknown_fields`, so a typo is an error, never a silently ignored key); environment
//! variables named `OUTBOX_RELAY__<SECTION>__<KEY>` are applied on top; then every value is
//! checked and turned into typed settings (identifiers parsed and quoted, the routing regex
//! compiled, durability-critical Kafka properties enforced). Everything the relay needs to reject
//! is rejected here, before any connection is opened.
//!
//! Environment overrides: section and key are upper-cased with `__` between them, e.g.
//! `OUTBOX_RELAY__POSTGRES__URL`, `OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT`. In the `kafka` section the
//! key's `_` become `.`: `OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS` sets `bootstrap.servers`.
//! `OUTBOX_RELAY__OUTBOX__HEADER_COLUMNS` takes a TOML inline table (`{ tenant = "x-tenant" }`).
//! Values are strings; numeric settings accept numeric strings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod ha;
pub mod http;
pub mod ident;
pub mod poll;
pub mod secret;

use self::ident::{Ident, IdentError, SimpleName, TableName};
use self::secret::{is_secret_key, Secret};
use crate::outbox::bad_event::BadEventPolicy;
use crate::outbox::routing::TopicRouter;

/// Prefix of environment variables that override file settings.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}. Pass an existing file with --config")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var} is not usable: {message}")]
    Env { var: String, message: String },
    #[error("config key {key}: {message}")]
    Invalid { key: &'static str, message: String },
    #[error("config key {key}: {source}")]
    Name { key: &'static str, source: IdentError },
}

// ---------------------------------------------------------------- raw sections (file format)

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub postgres: PostgresSection,
    #[serde(default)]
    pub outbox: OutboxSection,
    #[serde(default)]
    pub route: RouteSection,
    #[serde(default)]
    pub kafka: BTreeMap<String, KafkaValue>,
    #[serde(default)]
    pub relay: RelaySection,
    #[serde(default)]
    pub poll: crate::config::poll::PollSection,
    #[serde(default)]
    pub http: crate::config::http::HttpSection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSection {
    pub url: Secret,
    #[serde(default = "default_slot")]
    pub slot: String,
    #[serde(default = "default_slot")]
    pub publication: String,
    /// CA bundle (PEM) to verify the server certificate against; enables verify-full.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxSection {
    pub table: String,
    pub id_column: String,
    pub key_column: String,
    pub route_by_column: String,
    pub payload_column: String,
    pub timestamp_column: Option<String>,
    pub header_columns: BTreeMap<String, String>,
    /// Transactional `pg_logical_emit_message` events with this prefix are outbox events too.
    pub message_prefix: Option<String>,
}

impl Default for OutboxSection {
    fn default() -> Self {
        OutboxSection {
            table: "public.events_outbox".into(),
            id_column: "id".into(),
            key_column: "aggregate_id".into(),
            route_by_column: "type".into(),
            payload_column: "payload".into(),
            timestamp_column: None,
            header_columns: BTreeMap::new(),
            message_prefix: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteSection {
    pub topic_regex: String,
    pub topic_replacement: String,
}

impl Default for RouteSection {
    fn default() -> Self {
        RouteSection {
            topic_regex: crate::outbox::routing::DEFAULT_TOPIC_REGEX.into(),
            topic_replacement: crate::outbox::routing::DEFAULT_TOPIC_REPLACEMENT.into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySection {
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub max_in_flight: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub max_in_flight_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub status_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub shutdown_timeout_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub reconnect_backoff_initial_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub reconnect_backoff_max_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub connect_timeout_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub standby_poll_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub takeover_after_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub slot_check_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub retained_wal_warn_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub heartbeat_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub receive_timeout_ms: u64,
    /// `fail` | `dead-letter` | `skip` (see `bad_event.rs`).
    pub on_bad_event: String,
    pub dead_letter_topic: Option<String>,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            status_interval_ms: 1_000,
            shutdown_timeout_ms: 30_000,
            reconnect_backoff_initial_ms: 500,
            reconnect_backoff_max_ms: 30_000,
            connect_timeout_ms: 10_000,
            standby_poll_ms: 2_000,
            takeover_after_ms: 0,
            slot_check_interval_ms: 10_000,
            retained_wal_warn_bytes: 1 << 30,
            heartbeat_interval_ms: 0,
            receive_timeout_ms: 30_000,
            on_bad_event: "fail".into(),
            dead_letter_topic: None,
        }
    }
}

/// A librdkafka property value: TOML strings, integers, floats and booleans are all accepted
/// and passed to librdkafka as their text form.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaValue(pub String);

impl<'de> Deserialize<'de> for KafkaValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Scalar {
            S(String),
            I(i64),
            F(f64),
            B(bool),
        }
        Ok(KafkaValue(match Scalar::deserialize(d)? {
            Scalar::S(s) => s,
            Scalar::I(i) => i.to_string(),
            Scalar::F(f) => f.to_string(),
            Scalar::B(b) => b.to_string(),
        }))
    }
}

pub(crate) fn number_or_numeric_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        N(u64),
        S(String),
    }
    match Num::deserialize(d)? {
        Num::N(n) => Ok(n),
        Num::S(s) => s
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("expected a non-negative whole number, got {s:?}"))),
    }
}

fn default_slot() -> String {
    "outbox_relay".into()
}

// ---------------------------------------------------------------- validated settings

/// Everything the relay runs with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres: PostgresSettings,
    pub outbox: OutboxMapping,
    pub router: TopicRouter,
    pub kafka: KafkaProperties,
    pub relay: RelaySettings,
    /// Only `outbox-relay poll` reads it.
    pub poll: crate::config::poll::PollSettings,
    /// `[http]`: metrics and health endpoints.
    pub http: crate::config::http::HttpSettings,
}

#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// The URL as configured (password inside; prints redacted).
    pub url: Secret,
    pub connection: tokio_postgres::Config,
    pub slot: SimpleName,
    pub publication: SimpleName,
    pub sslrootcert: Option<PathBuf>,
}

/// Which outbox columns carry which part of the Kafka record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMapping {
    pub table: TableName,
    pub id: Ident,
    pub key: Ident,
    pub route_by: Ident,
    pub payload: Ident,
    pub timestamp: Option<Ident>,
    /// (column, header name), in a stable order.
    pub headers: Vec<(Ident, String)>,
    /// Prefix of `pg_logical_emit_message` events (`None`: messages are not events).
    pub message_prefix: Option<String>,
}

impl OutboxMapping {
    /// Every mapped column with the config key that names it, for preflight checks.
    pub fn columns(&self) -> Vec<(&'static str, &Ident)> {
        let mut cols = vec![
            ("outbox.id_column", &self.id),
            ("outbox.key_column", &self.key),
            ("outbox.route_by_column", &self.route_by),
            ("outbox.payload_column", &self.payload),
        ];
        if let Some(ts) = &self.timestamp {
            cols.push(("outbox.timestamp_column", ts));
        }
        for (col, _) in &self.headers {
            cols.push(("outbox.header_columns", col));
        }
        cols
    }
}

/// librdkafka properties with the durability-critical ones enforced.
#[derive(Clone, PartialEq)]
pub struct KafkaProperties(pub BTreeMap<String, String>);

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in &self.0 {
            if is_secret_key(k) {
                m.entry(k, &"********");
            } else {
                m.entry(k, v);
            }
        }
        m.finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySettings {
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub status_interval: Duration,
    pub shutdown_timeout: Duration,
    pub reconnect_backoff_initial: Duration,
    pub reconnect_backoff_max: Duration,
    pub connect_timeout: Duration,
    /// How often a standby retries the busy slot (takeover latency).
    pub standby_poll: Duration,
    /// Terminate a slot holder whose walsender heard no status update for this long (opt-in).
    pub takeover_after: Option<Duration>,
    /// How often `pg_replication_slots` is read for slot health.
    pub slot_check_interval: Duration,
    /// Warn when the slot retains more WAL than this (`None`: never).
    pub retained_wal_warn_bytes: Option<u64>,
    /// Emit `pg_logical_emit_message` heartbeats this often while streaming (`None`: off).
    pub heartbeat_interval: Option<Duration>,
    /// Silence from the server (while reading) after which the connection counts as dead;
    /// also the replication socket's `TCP_USER_TIMEOUT`.
    pub receive_timeout: Duration,
    /// What to do with an event that can never be published.
    pub on_bad_event: BadEventPolicy,
}

impl Settings {
    /// Reads `path`, applies `OUTBOX_RELAY__*` variables from the process environment, validates.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text, path, env)
    }

    pub fn from_toml_str(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: path.to_owned(),
            message,
        };
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        apply_env_overrides(&mut table, env)?;
        let file: FileConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        Settings::validate(file)
    }

    pub fn validate(file: FileConfig) -> Result<Settings, ConfigError> {
        let name = |key: &'static str| move |source| ConfigError::Name { key, source };
        let connection: tokio_postgres::Config =
            file.postgres.url.expose().parse().map_err(|e: tokio_postgres::Error| ConfigError::Invalid {
                key: "postgres.url",
                message: format!(
                    "{} is not a PostgreSQL connection URL ({e}); expected e.g. postgres://user:password@host:5432/dbname",
                    file.postgres.url
                ),
            })?;
        if connection.get_hosts().is_empty() {
            return Err(ConfigError::Invalid {
                key: "postgres.url",
                message: "names no host; add one, e.g. postgres://user@127.0.0.1:5432/app".into(),
            });
        }
        if connection.get_user().is_none() {
            return Err(ConfigError::Invalid {
                key: "postgres.url",
                message: "names no user; add one, e.g. postgres://relay@127.0.0.1:5432/app".into(),
            });
        }
        if let Some(ca) = &file.postgres.sslrootcert {
            if !ca.is_file() {
                return Err(ConfigError::Invalid {
                    key: "postgres.sslrootcert",
                    message: format!(
                        "{} is not a readable file; point it at the server's CA certificate (PEM)",
                        ca.display()
                    ),
                });
            }
        }
        let postgres = PostgresSettings {
            url: file.postgres.url,
            connection,
            slot: SimpleName::parse("postgres.slot", &file.postgres.slot).map_err(name("postgres.slot"))?,
            publication: SimpleName::parse("postgres.publication", &file.postgres.publication)
                .map_err(name("postgres.publication"))?,
            sslrootcert: file.postgres.sslrootcert,
        };

        let o = file.outbox;
        let col = |key: &'static str, v: &str| Ident::parse(key, v).map_err(name(key));
        let mut headers = Vec::with_capacity(o.header_columns.len());
        for (column, header) in &o.header_columns {
            if header.is_empty() || header.eq_ignore_ascii_case("id") {
                return Err(ConfigError::Invalid {
                    key: "outbox.header_columns",
                    message: format!(
                        "column {column:?} maps to header {header:?}; header names must be non-empty and not \"id\" (the event id header)"
                    ),
                });
            }
            headers.push((col("outbox.header_columns", column)?, header.clone()));
        }
        let outbox =
            OutboxMapping {
                table: TableName::parse("outbox.table", &o.table).map_err(name("outbox.table"))?,
                id: col("outbox.id_column", &o.id_column)?,
                key: col("outbox.key_column", &o.key_column)?,
                route_by: col("outbox.route_by_column", &o.route_by_column)?,
                payload: col("outbox.payload_column", &o.payload_column)?,
                timestamp: o
                    .timestamp_column
                    .as_deref()
                    .map(|c| col("outbox.timestamp_column", c))
                    .transpose()?,
                headers,
                message_prefix: match o.message_prefix {
                    Some(p) if p.is_empty() => return Err(ConfigError::Invalid {
                        key: "outbox.message_prefix",
                        message:
                            "is empty; remove the key, or set the prefix your services pass to pg_logical_emit_message"
                                .into(),
                    }),
                    p => p,
                },
            };

        let router = TopicRouter::new(&file.route.topic_regex, &file.route.topic_replacement).map_err(|message| {
            ConfigError::Invalid {
                key: "route.topic_regex",
                message,
            }
        })?;

        let kafka = kafka_properties(file.kafka)?;
        let r = file.relay;
        let positive = |key: &'static str, v: u64| {
            if v == 0 {
                Err(ConfigError::Invalid {
                    key,
                    message: "must be greater than zero".into(),
                })
            } else {
                Ok(v)
            }
        };
        let relay = RelaySettings {
            max_in_flight: positive("relay.max_in_flight", r.max_in_flight)? as usize,
            max_in_flight_bytes: positive("relay.max_in_flight_bytes", r.max_in_flight_bytes)? as usize,
            status_interval: Duration::from_millis(positive("relay.status_interval_ms", r.status_interval_ms)?),
            shutdown_timeout: Duration::from_millis(r.shutdown_timeout_ms),
            reconnect_backoff_initial: Duration::from_millis(positive(
                "relay.reconnect_backoff_initial_ms",
                r.reconnect_backoff_initial_ms,
            )?),
            reconnect_backoff_max: Duration::from_millis(
                r.reconnect_backoff_max_ms.max(r.reconnect_backoff_initial_ms),
            ),
            connect_timeout: Duration::from_millis(positive("relay.connect_timeout_ms", r.connect_timeout_ms)?),
            standby_poll: Duration::from_millis(r.standby_poll_ms),
            takeover_after: (r.takeover_after_ms > 0).then(|| Duration::from_millis(r.takeover_after_ms)),
            slot_check_interval: Duration::from_millis(r.slot_check_interval_ms),
            retained_wal_warn_bytes: (r.retained_wal_warn_bytes > 0).then_some(r.retained_wal_warn_bytes),
            heartbeat_interval: (r.heartbeat_interval_ms > 0).then(|| Duration::from_millis(r.heartbeat_interval_ms)),
            receive_timeout: Duration::from_millis(r.receive_timeout_ms),
            on_bad_event: BadEventPolicy::from_config(&r.on_bad_event, r.dead_letter_topic.as_deref()).map_err(
                |message| ConfigError::Invalid {
                    key: "relay.on_bad_event",
                    message,
                },
            )?,
        };
        crate::config::ha::validate(&relay)?;
        let poll = file.poll.validate()?;
        let http = file.http.validate()?;
        Ok(Settings {
            postgres,
            outbox,
            router,
            kafka,
            relay,
            poll,
            http,
        })
    }
}

/// Librdkafka defaults this relay relies on. Users may override all but the two durability ones.
const KAFKA_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // The Java client's partitioner, so keys land where Debezium / Kafka Connect put them.
    ("partitioner", "murmur2_random"),
    ("linger.ms", "5"),
];

fn kafka_properties(raw: BTreeMap<String, KafkaValue>) -> Result<KafkaProperties, ConfigError> {
    let mut props: BTreeMap<String, String> = raw.into_iter().map(|(k, v)| (k, v.0)).collect();
    if !props.contains_key("bootstrap.servers") && !props.contains_key("metadata.broker.list") {
        return Err(ConfigError::Invalid {
            key: "kafka",
            message: "bootstrap.servers is missing; add `\"bootstrap.servers\" = \"host:9092\"` under [kafka]".into(),
        });
    }
    if let Some(v) = props.get("enable.idempotence") {
        if v != "true" {
            return Err(ConfigError::Invalid {
                key: "kafka",
                message: format!(
                    "enable.idempotence = {v:?} would allow reordering and duplicates inside one aggregate; remove the key (the relay sets true)"
                ),
            });
        }
    }
    if let Some(v) = props.get("acks").or_else(|| props.get("request.required.acks")) {
        if v != "all" && v != "-1" {
            return Err(ConfigError::Invalid {
                key: "kafka",
                message: format!(
                    "acks = {v:?} lets Kafka acknowledge events it can still lose, and the relay would confirm their WAL; remove the key (the relay sets all)"
                ),
            });
        }
    }
    if props.contains_key("transactional.id") {
        return Err(ConfigError::Invalid {
            key: "kafka",
            message: "transactional.id is not supported; the relay uses the idempotent producer. Remove the key".into(),
        });
    }
    for (k, v) in KAFKA_DEFAULTS {
        if !(*k == "acks" && props.contains_key("request.required.acks")) {
            props.entry((*k).to_owned()).or_insert_with(|| (*v).to_owned());
        }
    }
    Ok(KafkaProperties(props))
}

fn apply_env_overrides(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let mut vars: Vec<(String, String)> = env.into_iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
    vars.sort();
    for (var, value) in vars {
        let rest = &var[ENV_PREFIX.len()..];
        let Some((section, key)) = rest.split_once("__") else {
            return Err(ConfigError::Env {
                var,
                message: "expected OUTBOX_RELAY__<SECTION>__<KEY>, e.g. OUTBOX_RELAY__POSTGRES__URL".into(),
            });
        };
        let section = section.to_ascii_lowercase();
        let key = if section == "kafka" {
            key.to_ascii_lowercase().replace('_', ".")
        } else {
            key.to_ascii_lowercase()
        };
        let parsed = if section == "outbox" && key == "header_columns" {
            let doc: toml::Table = format!("v = {value}")
                .parse()
                .map_err(|e: toml::de::Error| ConfigError::Env {
                    var: var.clone(),
                    message: format!("expected a TOML inline table such as {{ tenant_id = \"x-tenant\" }}: {e}"),
                })?;
            doc.get("v").cloned().unwrap_or(toml::Value::String(value))
        } else {
            toml::Value::String(value)
        };
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key, parsed);
            }
            _ => {
                return Err(ConfigError::Env {
                    var,
                    message: format!("[{section}] in the file is not a table"),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
