//! Configuration: a TOML file plus environment overrides, validated into [`Settings`].
//!
//! Loading is two-step. The file is parsed into the raw `*Section` structs (serde with
//! `deny_unknown_fields`, so a typo is an error, never a silently ignored key); environment
//! variables named `OUTBOX_RELAY__<SECTION>__<KEY>` are applied on top; then every section
//! validates itself into typed settings (identifiers parsed and quoted, the routing regex
//! compiled, the chosen sink's section checked by its own spec). Everything the relay needs to
//! reject is rejected here, before any connection is opened.
//!
//! This module is the leaf layer: it imports nothing from the rest of the crate. One file per
//! section ([`postgres`], [`outbox`] (with `[route]`), [`sink`], [`relay`], [`poll`], [`http`],
//! [`retention`], [`debezium`], [`cloudevents`], [`tracing`]), each owning its raw and validated
//! types; [`ident`] and [`secret`] are shared value types. A sink's own section lives in its
//! folder (`src/sink/<name>/config.rs`), handed to the loader as a spec by the sink registry
//! ([`sink::SinkSpecs`]): nothing here names a sink.
//!
//! Environment overrides: section and key are upper-cased with `__` between them, e.g.
//! `OUTBOX_RELAY__POSTGRES__URL`, `OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT`; a sink's section says how
//! its keys are written ([`sink::SinkSectionSpec::env_key`]: dotted property names take `.` for
//! `_`). `OUTBOX_RELAY__OUTBOX__HEADER_COLUMNS` and `OUTBOX_RELAY__CLOUDEVENTS__EXTENSIONS` take a
//! TOML inline table (`{ tenant = "x-tenant" }`).
//! Values are strings; numeric settings accept numeric strings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub(crate) mod cloudevents;
pub(crate) mod debezium;
pub(crate) mod filter;
pub(crate) mod http;
pub(crate) mod ident;
pub(crate) mod outbox;
pub(crate) mod poll;
pub(crate) mod postgres;
pub(crate) mod relay;
pub(crate) mod retention;
pub(crate) mod secret;
pub(crate) mod sink;
pub(crate) mod tracing;
pub(crate) mod transactions;

use self::cloudevents::{CloudEventsSection, CloudEventsSettings};
use self::debezium::DebeziumFormat;
use self::http::{HttpSection, HttpSettings};
use self::ident::{Ident, IdentError};
use self::outbox::{OutboxMapping, OutboxSection, RouteSection, TopicRoute};
use self::poll::{PollSection, PollSettings};
use self::postgres::{PostgresSection, PostgresSettings};
use self::relay::{RelaySection, RelaySettings};
use self::retention::{RetentionSection, RetentionSettings};
use self::sink::{SinkSettings, SinkSpecs, SinkTable};
use self::tracing::{TracingSection, TracingSettings};

/// Prefix of environment variables that override file settings.
pub(crate) const ENV_PREFIX: &str = "OUTBOX_RELAY__";

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

impl ConfigError {
    /// [`ConfigError::Invalid`]: the key, and what is wrong with it with the fix.
    pub(crate) fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key,
            message: message.into(),
        }
    }
}

/// Maps an identifier error to [`ConfigError::Name`] for `key`.
pub(crate) fn named(key: &'static str) -> impl FnOnce(IdentError) -> ConfigError {
    move |source| ConfigError::Name { key, source }
}

/// The file as parsed: one raw section per table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(crate) postgres: PostgresSection,
    #[serde(default)]
    pub(crate) outbox: OutboxSection,
    #[serde(default)]
    pub(crate) route: RouteSection,
    /// `[filter]`: absent = every event is published.
    pub(crate) filter: Option<filter::FilterSection>,
    /// `[transactions]`: absent = no transaction metadata.
    pub(crate) transactions: Option<transactions::TransactionsSection>,
    #[serde(default)]
    pub(crate) sink: SinkTable,
    /// The sinks' own sections by name, as written: each is
    /// validated by its sink's spec (the registered ones: [`SinkSpecs`]).
    #[serde(skip)]
    pub(crate) sink_sections: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub(crate) relay: RelaySection,
    #[serde(default)]
    pub(crate) poll: PollSection,
    #[serde(default)]
    pub(crate) http: HttpSection,
    /// `[retention]`: absent = every row is kept.
    pub(crate) retention: Option<RetentionSection>,
    /// Verbatim Debezium / Kafka Connect property names: validated by `debezium::validate`.
    pub(crate) debezium: Option<BTreeMap<String, toml::Value>>,
    /// `[cloudevents]`: absent = records are not CloudEvents.
    pub(crate) cloudevents: Option<CloudEventsSection>,
    /// `[tracing]`: absent = no spans are exported.
    pub(crate) tracing: Option<TracingSection>,
}

/// Numbers may also be written as numeric strings (what environment overrides produce).
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

/// [`number_or_numeric_string`] for a key that may be left out
/// (`#[serde(default, deserialize_with = "crate::config::optional_number")]`).
pub(crate) fn optional_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    number_or_numeric_string(d).map(Some)
}

/// Everything the relay runs with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres: PostgresSettings,
    pub outbox: OutboxMapping,
    /// `[route]`: the topic of an event is `router.route(route-by value)`.
    pub router: TopicRoute,
    /// `[filter]`: `None` = every event is published.
    pub filter: Option<filter::EventFilter>,
    /// `[transactions]`: `None` = no transaction headers or markers.
    pub transactions: Option<transactions::TransactionMetadata>,
    /// `[sink] kind` and that sink's own section: the broker events are published to.
    pub sink: SinkSettings,
    pub relay: RelaySettings,
    /// Only `outbox-relay poll` reads it.
    pub poll: PollSettings,
    /// `[http]`: metrics and health endpoints.
    pub http: HttpSettings,
    /// `[retention]`: `None` = rows are never removed.
    pub retention: Option<RetentionSettings>,
    /// `[debezium]`: records written as Debezium + Kafka Connect write them; `None` = the
    /// columns' text as it is.
    pub debezium: Option<DebeziumFormat>,
    /// `[cloudevents]`: records written as CloudEvents; `None` = plain records.
    pub cloudevents: Option<CloudEventsSettings>,
    /// `[tracing]`: one OTLP PRODUCER span per event; `None` = no spans.
    pub tracing: Option<TracingSettings>,
}

impl Settings {
    /// Reads `path`, applies `OUTBOX_RELAY__*` variables from `env`, validates `[sink]` against
    /// `specs` (the registered sinks' sections, handed over by the caller: this module is a
    /// leaf and cannot name them; `Settings::load` and its siblings in `src/sink/registry.rs`
    /// hand over the registry's).
    pub(crate) fn read_with(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        specs: SinkSpecs,
    ) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_with(&text, path, env, specs)
    }

    /// [`Settings::read_with`] for a file's text (`path` names it in errors).
    pub(crate) fn parse_with(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        specs: SinkSpecs,
    ) -> Result<Settings, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: path.to_owned(),
            message,
        };
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
        let overrides = apply_env_overrides(&mut table, env, specs)?;
        let sink_sections: BTreeMap<String, toml::Value> = table
            .keys()
            .filter(|name| sink::is_sink_section(name, specs))
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|name| table.remove(&name).map(|v| (name, v)))
            .collect();
        if let Some(unknown) = table.keys().find(|name| !ROOT_SECTIONS.contains(&name.as_str())) {
            if let Some(o) = overrides.iter().find(|o| o.section == *unknown) {
                return Err(ConfigError::Env {
                    var: o.var.clone(),
                    message: format!(
                        "there is no [{unknown}] section; the sections are {}, and the chosen sink's own",
                        ROOT_SECTIONS.join(", ")
                    ),
                });
            }
            return Err(parse_err(format!(
                "unknown field `{unknown}`: the sections are {}, and the chosen sink's own: one of {}",
                ROOT_SECTIONS
                    .iter()
                    .map(|s| format!("[{s}]"))
                    .collect::<Vec<_>>()
                    .join(", "),
                specs
                    .iter()
                    .map(|s| format!("[{}]", s.kind()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut file: FileConfig = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| {
            match Override::blamed(&overrides, &e) {
                Some(o) => o.error(e.message()),
                None => parse_err(e.to_string()),
            }
        })?;
        file.sink_sections = sink_sections;
        Settings::validate(file, specs).map_err(|e| Override::blame(&overrides, e))
    }

    /// Validates every section, in file order; the first error wins.
    pub(crate) fn validate(file: FileConfig, specs: SinkSpecs) -> Result<Settings, ConfigError> {
        let mut outbox = file.outbox.validate()?;
        let debezium = file.debezium.as_ref().map(debezium::validate).transpose()?;
        if let Some(format) = &debezium {
            outbox.place_debezium_columns(format)?;
        }
        let postgres = file.postgres.validate()?;
        let router = file.route.validate()?;
        let sink_spec = file.sink.spec(specs)?;
        if router.key.is_some() && debezium.is_some() {
            return Err(ConfigError::Invalid {
                key: "route.key",
                message: "is set together with [debezium], whose record key is Debezium's rendering of the key \
                          column (table.field.event.key); remove route.key, or the [debezium] section"
                    .into(),
            });
        }
        outbox.routing_columns.clone_from(&router.columns);
        let mut filter = file.filter.map(filter::FilterSection::validate).transpose()?.flatten();
        if let Some(f) = &mut filter {
            f.place_columns(&mut outbox.routing_columns);
        }
        let cloudevents = match file.cloudevents {
            None => None,
            Some(section) => {
                let database = postgres
                    .connection
                    .get_dbname()
                    .or(postgres.connection.get_user())
                    .unwrap_or("postgres");
                let ce = section.validate(&cloudevents::Context {
                    sink: sink_spec,
                    debezium: debezium.is_some(),
                    database,
                    tables: &outbox.tables,
                    message_prefix: outbox.message_prefix.as_deref(),
                })?;
                if let Some((column, header)) = outbox.headers.iter().find(|(_, h)| {
                    let h = h.to_ascii_lowercase();
                    h == "content-type" || h.starts_with("ce_")
                }) {
                    return Err(ConfigError::Invalid {
                        key: "outbox.header_columns",
                        message: format!(
                            "column {column} maps to header {header:?}, a name [cloudevents] writes (content-type, \
                             ce_*); rename the header, or map the column as an extension: [cloudevents] extensions \
                             = {{ name = \"{}\" }}",
                            column.as_str()
                        ),
                    });
                }
                outbox.extensions = ce.extensions.iter().map(|e| e.column.clone()).collect();
                Some(ce)
            }
        };
        let relay = file.relay.validate()?;
        let sink = file
            .sink
            .validate(file.sink_sections, &sink::SectionContext::of(&relay), specs)?;
        let txn_metadata = match file.transactions {
            Some(section) => section.validate(relay.delivery)?,
            None => None,
        };
        Ok(Settings {
            postgres,
            outbox,
            router,
            filter,
            transactions: txn_metadata,
            sink,
            relay,
            poll: file.poll.validate()?,
            http: file.http.validate()?,
            retention: file.retention.map(RetentionSection::validate).transpose()?,
            debezium,
            cloudevents,
            tracing: match file.tracing {
                Some(section) => section.validate()?,
                None => None,
            },
        })
    }

    /// The column holding each row's creation time, with the config key that chose it: what
    /// everything that ages or selects rows by time reads — retention, `replay --since/--until`,
    /// `setup --backfill --since`, `status`'s oldest row, the poller's claim order.
    /// `retention.timestamp_column`, else `outbox.timestamp_column`, else `created_at`.
    ///
    /// Invariant: it never depends on whether the record carries a timestamp — leaving
    /// `outbox.timestamp_column` unset (exactly-once by read-back asks for it) still finds the
    /// rows' `created_at`.
    pub(crate) fn created_at_column(&self) -> (Ident, &'static str) {
        if let Some(c) = self.retention.as_ref().and_then(|r| r.timestamp_column.clone()) {
            return (c, "retention.timestamp_column");
        }
        match &self.outbox.timestamp {
            Some(c) => (c.clone(), "outbox.timestamp_column"),
            None => (
                Ident::parse("created_at", "created_at").expect("a plain literal identifier"),
                "the default: neither retention.timestamp_column nor outbox.timestamp_column is set",
            ),
        }
    }

    /// A warning for the operator about this configuration, logged when `run` starts.
    pub fn start_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(ce) = &self.cloudevents {
            let long = ce.long_names();
            if !long.is_empty() {
                warnings.push(format!(
                    "[cloudevents] extensions {long:?}: the CloudEvents spec recommends attribute names of at most \
                     {} characters (some consumers truncate or refuse longer ones); consider shorter names",
                    cloudevents::RECOMMENDED_NAME_LEN
                ));
            }
        }
        warnings.extend(self.sink.section_dyn().start_warnings());
        warnings
    }
}

/// The file's sections besides the sinks' own ([`FileConfig`]'s fields).
const ROOT_SECTIONS: &[&str] = &[
    "postgres",
    "outbox",
    "route",
    "filter",
    "transactions",
    "sink",
    "relay",
    "poll",
    "http",
    "retention",
    "debezium",
    "cloudevents",
    "tracing",
];

/// One `OUTBOX_RELAY__<SECTION>__<KEY>` variable applied over the file: what it set, so that an
/// error about that key names the variable (the file is blamed only for what the file says).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Override {
    var: String,
    /// The section and the key as the file names them (`relay`, `max_in_flight`).
    section: String,
    key: String,
    /// The file has no such section: this variable (with any others naming it) makes it.
    makes_section: bool,
}

impl Override {
    /// The variable whose value a deserialization error is about: the error's key path is the
    /// overridden key (a value of the wrong type), or its section when the key is one the
    /// section does not have (`unknown field`).
    fn blamed<'a>(overrides: &'a [Override], e: &toml::de::Error) -> Option<&'a Override> {
        // The error's text is its message, then "in `relay.max_in_flight`" when it knows the key
        // path (a value deserialized from a table rather than from the document's text).
        let text = e.to_string();
        let path = text
            .strip_prefix(e.message())
            .and_then(|rest| rest.trim().strip_prefix("in `"))
            .and_then(|rest| rest.strip_suffix('`'))?;
        overrides.iter().rev().find(|o| {
            path == format!("{}.{}", o.section, o.key)
                || (path == o.section && (o.makes_section || e.message().contains(&format!("`{}`", o.key))))
        })
    }

    /// A validation error about a key an override set, as that variable's error.
    fn blame(overrides: &[Override], e: ConfigError) -> ConfigError {
        let (key, detail) = match &e {
            ConfigError::Invalid { key, message } => (key.replace('"', ""), message.clone()),
            ConfigError::Name { key, source } => (key.replace('"', ""), source.to_string()),
            _ => return e,
        };
        // A sink section's serde error is keyed by the section, its text naming the key.
        let sink_key = |o: &Override| key == o.section && detail.contains(&format!("in `{}`", o.key));
        match overrides
            .iter()
            .rev()
            .find(|o| key == format!("{}.{}", o.section, o.key.replace('"', "")) || sink_key(o))
        {
            Some(o) => o.error(&detail),
            None => e,
        }
    }

    fn error(&self, message: &str) -> ConfigError {
        let made = if self.makes_section {
            format!(
                " (the file has no [{}] section: the environment makes it)",
                self.section
            )
        } else {
            String::new()
        };
        ConfigError::Env {
            var: self.var.clone(),
            message: format!("it sets {}.{}{made}: {}", self.section, self.key, message.trim()),
        }
    }
}

/// Applies the `OUTBOX_RELAY__*` variables of `env` to the file's `table`; returns what each set.
fn apply_env_overrides(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
    specs: SinkSpecs,
) -> Result<Vec<Override>, ConfigError> {
    let mut overrides = Vec::new();
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
        // `[debezium]` takes dotted property names; a sink's section says how it names keys.
        let key = if section == "debezium" {
            key.to_ascii_lowercase().replace('_', ".")
        } else if let Ok(spec) = sink::spec_of(&section, specs) {
            spec.env_key(key)
        } else {
            key.to_ascii_lowercase()
        };
        // `outbox.table` takes a TOML array for several tables: `["a.outbox", "b.outbox"]`.
        let parsed = if section == "outbox" && key == "table" && value.trim_start().starts_with('[') {
            toml_value(
                &var,
                value,
                "a TOML array of table names such as [\"a.outbox\", \"b.outbox\"]",
            )?
        } else if (section == "outbox" && key == "header_columns") || (section == "cloudevents" && key == "extensions")
        {
            toml_value(&var, value, "a TOML inline table such as { tenant_id = \"x-tenant\" }")?
        } else {
            toml::Value::String(value)
        };
        let makes_section = !table.contains_key(&section)
            || overrides
                .iter()
                .any(|o: &Override| o.section == section && o.makes_section);
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key.clone(), parsed);
            }
            _ => {
                return Err(ConfigError::Env {
                    var,
                    message: format!("[{section}] in the file is not a table"),
                });
            }
        }
        overrides.push(Override {
            var,
            section,
            key,
            makes_section,
        });
    }
    Ok(overrides)
}

/// The value of `var` read as TOML (`v = <value>`), for the keys that take an array or an inline
/// table; `expected` says which in the error.
fn toml_value(var: &str, value: String, expected: &str) -> Result<toml::Value, ConfigError> {
    let doc: toml::Table = format!("v = {value}")
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Env {
            var: var.to_owned(),
            message: format!("expected {expected}: {e}"),
        })?;
    Ok(doc.get("v").cloned().unwrap_or(toml::Value::String(value)))
}

#[cfg(test)]
mod tests;

/// Settings for unit tests anywhere in the crate.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    use super::{ConfigError, Settings};

    /// The smallest valid file: a database URL and a broker.
    pub(crate) const MINIMAL: &str =
        "[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n[kafka]\n\"bootstrap.servers\" = \"127.0.0.1:9092\"\n";

    /// [`MINIMAL`] followed by `extra`, with `env` as the environment overrides.
    pub(crate) fn load(extra: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_toml_str(
            &format!("{MINIMAL}{extra}"),
            Path::new("test.toml"),
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    /// [`MINIMAL`] followed by `extra`, which must be valid.
    pub(crate) fn settings(extra: &str) -> Settings {
        load(extra, &[]).expect("valid test settings")
    }

    /// What [`load`] refuses [`MINIMAL`] followed by `extra` (with `env`) with: the error's text,
    /// for the tests that check it names the key and the fix.
    pub(crate) fn refusal(extra: &str, env: &[(&str, &str)]) -> String {
        load(extra, env).unwrap_err().to_string()
    }
}
