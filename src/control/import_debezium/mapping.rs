//! From Debezium's options to outbox-relay's sections. Every option of the connector config ends
//! up in exactly one place: a setting, the `[debezium]` section (record-format options kept
//! verbatim), or the closing list of options with no counterpart and why
//! ([`NO_COUNTERPART`] holds those reasons; docs/migrating-from-debezium.md says the same).

use std::collections::{BTreeMap, BTreeSet};

use crate::config::debezium::{BINARY_DATA_CONVERTER, BYTE_ARRAY_CONVERTER, JSON_CONVERTER, STRING_CONVERTER};

use crate::config::ident::{quote_ident, SimpleName};
use crate::config::outbox::{TopicRoute, DEFAULT_TOPIC_REGEX};

use super::parse::ConnectorConfig;
use super::render::{self, Line};
use super::server;
use super::ImportError;

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// Kafka Connect's worker default for `key.converter` and `value.converter`.
const WORKER_DEFAULT_CONVERTER: &str = JSON_CONVERTER;
/// Converters whose output the relay's `[debezium]` section reproduces.
const SUPPORTED_CONVERTERS: &[&str] = &[
    STRING_CONVERTER,
    JSON_CONVERTER,
    BINARY_DATA_CONVERTER,
    BYTE_ARRAY_CONVERTER,
];
/// EventRouter options copied verbatim into `[debezium]`, with Debezium's defaults (written out
/// when unset, so the record bytes do not depend on whose default applies).
const ROUTER_RECORD_OPTIONS: &[(&str, Option<&str>)] = &[
    ("table.expand.json.payload", Some("false")),
    ("table.json.payload.null.behavior", Some("ignore")),
    ("route.tombstone.on.empty.payload", Some("false")),
    ("table.fields.additional.placement", None),
];
/// `producer.override.*` properties librdkafka knows under the same name and meaning.
const PRODUCER_PASS_THROUGH: &[&str] = &[
    "bootstrap.servers",
    "client.id",
    "compression.type",
    "linger.ms",
    "batch.size",
    "request.timeout.ms",
    "delivery.timeout.ms",
    "retry.backoff.ms",
    "security.protocol",
    "sasl.mechanism",
    "ssl.endpoint.identification.algorithm",
    "acks",
    "enable.idempotence",
];

/// Where an entry of [`NO_COUNTERPART`] applies: a connector option, or an option of the
/// EventRouter transform (written without its `transforms.<name>.` prefix).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Connector,
    Router,
}

/// Options with no counterpart, and why. A name ending in `.` is a prefix. The reasons are those
/// of docs/migrating-from-debezium.md.
const NO_COUNTERPART: &[(Scope, &str, &str)] = &[
    (Scope::Connector, "tasks.max", "one process; run a second one for failover (it stands by)"),
    (Scope::Connector, "topic.", "Debezium's raw change topics; the outbox topics come from routing only"),
    (Scope::Connector, "table.exclude.list", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "table.blacklist", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "schema.include.list", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "schema.exclude.list", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "schema.whitelist", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "schema.blacklist", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "column.", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "message.key.columns", "only the mapped columns of the outbox table are read"),
    (Scope::Connector, "database.sslcert", "client certificates are not supported; use password (SCRAM) authentication over TLS"),
    (Scope::Connector, "database.sslkey", "client certificates are not supported; use password (SCRAM) authentication over TLS"),
    (Scope::Connector, "database.sslpassword", "client certificates are not supported; use password (SCRAM) authentication over TLS"),
    (Scope::Connector, "database.sslfactory", "TLS is built in (rustls); postgres.sslrootcert turns on verification"),
    (Scope::Connector, "database.initial.statements", "the session settings the relay needs are pinned (DateStyle, TimeZone, …)"),
    (Scope::Connector, "database.tcpKeepAlive", "always on, plus relay.receive_timeout_ms for dead connections"),
    (Scope::Connector, "database.", "a connection option outside postgres.url's user, host, port, database and sslmode"),
    (Scope::Connector, "slot.stream.params", "the relay sets proto_version, publication_names and messages itself"),
    (Scope::Connector, "slot.max.retries", "a busy slot means \"stand by\" (relay.standby_poll_ms); other errors reconnect with backoff (relay.reconnect_backoff_*)"),
    (Scope::Connector, "slot.retry.delay.ms", "a busy slot means \"stand by\" (relay.standby_poll_ms); other errors reconnect with backoff (relay.reconnect_backoff_*)"),
    (Scope::Connector, "publish.via.partition.root", "automatic: set for a partitioned outbox table"),
    (Scope::Connector, "snapshot.", "no table snapshot; see snapshot.mode"),
    (Scope::Connector, "incremental.snapshot.", "no table snapshot; see snapshot.mode"),
    (Scope::Connector, "signal.", "no table snapshot, so no snapshot signals; see snapshot.mode"),
    (Scope::Connector, "heartbeat.action.query", "the relay writes a tiny logical message itself (no heartbeat table needed)"),
    (Scope::Connector, "heartbeat.topics.prefix", "no heartbeat topic"),
    (Scope::Connector, "status.update.interval.ms", "the relay reports its position every relay.status_interval_ms (default 1000)"),
    (Scope::Connector, "max.batch.size", "backpressure: relay.max_in_flight and relay.max_in_flight_bytes; WAL reading pauses while Kafka owes acknowledgements"),
    (Scope::Connector, "max.queue.size", "backpressure: relay.max_in_flight and relay.max_in_flight_bytes; WAL reading pauses while Kafka owes acknowledgements"),
    (Scope::Connector, "max.queue.size.in.bytes", "backpressure: relay.max_in_flight and relay.max_in_flight_bytes; WAL reading pauses while Kafka owes acknowledgements"),
    (Scope::Connector, "poll.interval.ms", "backpressure: relay.max_in_flight and relay.max_in_flight_bytes; WAL reading pauses while Kafka owes acknowledgements"),
    (Scope::Connector, "tombstones.on.delete", "deletes are not events"),
    (Scope::Connector, "skipped.operations", "updates, deletes and truncates are always skipped"),
    (Scope::Connector, "provide.transaction.metadata", "not imported: set [transactions] topic = \"<topic.prefix>.transaction\" for BEGIN/END markers in Debezium's format, and headers = true for the per-event transaction id and order (docs/configuration.md)"),
    (Scope::Connector, "decimal.handling.mode", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "time.precision.mode", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "interval.handling.mode", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "hstore.handling.mode", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "binary.handling.mode", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "money.fraction.digits", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "include.unknown.datatypes", "values travel as PostgreSQL's own text rendering; nothing is converted"),
    (Scope::Connector, "errors.", "Kafka Connect's error handling; relay.on_bad_event (fail, skip, dead-letter) decides what happens to an event that cannot be published"),
    (Scope::Connector, "offset.", "the slot's confirmed_flush_lsn is the only offset, advanced after Kafka's acknowledgements"),
    (Scope::Connector, "header.converter", "no converters: a header is the column's text, what SimpleHeaderConverter writes for a string"),
    (Scope::Connector, "key.converter.", "an option of the key converter; see key.converter in [debezium]"),
    (Scope::Connector, "value.converter.", "an option of the value converter; see value.converter in [debezium]"),
    (Scope::Connector, "xmin.fetch.interval.ms", "the relay tracks no xmin; its position is the slot's confirmed LSN"),
    (Scope::Connector, "lsn.flush.timeout.ms", "the relay confirms LSNs itself, after Kafka's acknowledgements"),
    (Scope::Connector, "predicates", "the relay reads the outbox table only"),
    (Scope::Connector, "predicates.", "the relay reads the outbox table only"),
    (Scope::Connector, "producer.override.", "a Java producer property with no librdkafka counterpart of that name; set the librdkafka equivalent in [kafka] if you need it"),
    (Scope::Connector, "consumer.override.", "Kafka Connect's own clients; the relay has none"),
    (Scope::Connector, "admin.override.", "Kafka Connect's own clients; the relay has none"),
    (Scope::Connector, "schema.history.internal.", "schema history is not used for PostgreSQL, nor by the relay"),
    (Scope::Connector, "message.prefix.", "Debezium's logical-message events; outbox.message_prefix makes one prefix's transactional messages outbox events"),
    (Scope::Connector, "transforms.", "another transform: the relay applies only the EventRouter's routing, so records are what the EventRouter alone produced — check that consumers do not depend on this one"),
    (Scope::Router, "table.field.event.payload.id", "only fed Debezium's envelope; use outbox.header_columns if consumers read it"),
    (Scope::Router, "table.field.payload.id", "only fed Debezium's envelope; use outbox.header_columns if consumers read it"),
    (Scope::Router, "table.field.event.schema.version", "Connect schema versions; records carry no Connect schema"),
    (Scope::Router, "table.field.schema.version", "Connect schema versions; records carry no Connect schema"),
    (Scope::Router, "table.fields.additional.error.on.missing", "always an error: setup and run refuse a mapped column that does not exist, naming the table's columns"),
    (Scope::Router, "table.op.invalid.behavior", "updates and deletes of the outbox are not even decoded (the publication publishes inserts only)"),
    (Scope::Router, "debezium.op.invalid.behavior", "updates and deletes of the outbox are not even decoded (the publication publishes inserts only)"),
    (Scope::Router, "tracing.", "no spans are created (an OTLP exporter is planned); the relay forwards a W3C traceparent column instead: outbox.trace_column = \"traceparent\" (a text column holding 00-<trace-id>-<parent-id>-<flags>, not a serialized java.util.Properties), see docs/migrating-from-debezium.md"),
    (Scope::Router, "predicate", "the relay reads the outbox table only"),
    (Scope::Router, "negate", "the relay reads the outbox table only"),
];

/// The reason `option` has no counterpart: the exact entry, else the longest prefix.
fn reason(scope: Scope, option: &str) -> &'static str {
    let entries = || NO_COUNTERPART.iter().filter(|(s, _, _)| *s == scope);
    if let Some((_, _, r)) = entries().find(|(_, name, _)| *name == option) {
        return r;
    }
    entries()
        .filter(|(_, name, _)| name.ends_with('.') && option.starts_with(name))
        .max_by_key(|(_, name, _)| name.len())
        .map_or(
            match scope {
                Scope::Connector => "no counterpart known to this import; check whether the relay needs an equivalent",
                Scope::Router => "an EventRouter option with no counterpart known to this import",
            },
            |(_, _, r)| r,
        )
}

/// The generated file's sections and the options left behind.
#[derive(Debug, Default)]
pub(crate) struct Imported {
    pub(crate) connector: Option<String>,
    pub(crate) postgres: Vec<Line>,
    pub(crate) outbox: Vec<Line>,
    pub(crate) route: Vec<Line>,
    /// `[sink]` (Debezium Server files: its sink type; empty otherwise, Kafka being the default).
    pub(crate) sink: Vec<Line>,
    pub(crate) kafka: Vec<Line>,
    /// A Debezium Server sink other than Kafka: its section's name and lines.
    pub(crate) broker: Option<(&'static str, Vec<Line>)>,
    pub(crate) debezium: Vec<Line>,
    pub(crate) relay: Vec<Line>,
    /// (option as written in the connector config, why it has no counterpart).
    pub(crate) not_carried_over: Vec<(String, String)>,
}

impl Imported {
    /// The whole TOML file.
    pub(crate) fn render(&self, source: &str) -> String {
        let mut out = String::new();
        let name = self.connector.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default();
        render::comment(
            &mut out,
            &format!(
                "outbox-relay configuration imported from Debezium connector{name} ({source}).\n\
                 Review it, then run `outbox-relay setup --config FILE`; options without a counterpart\n\
                 are listed at the end. See docs/migrating-from-debezium.md for the switch-over."
            ),
        );
        let no_lines = Vec::new();
        let (broker, broker_lines) = self.broker.as_ref().map_or(("", &no_lines), |(n, l)| (*n, l));
        for (name, lines) in [
            ("postgres", &self.postgres),
            ("outbox", &self.outbox),
            ("route", &self.route),
            ("sink", &self.sink),
            ("kafka", &self.kafka),
            (broker, broker_lines),
            ("debezium", &self.debezium),
            ("relay", &self.relay),
        ] {
            // Empty sections are not written: a sink other than Kafka has no [kafka] section.
            render::section(&mut out, name, lines);
        }
        if !self.not_carried_over.is_empty() {
            out.push('\n');
            render::comment(
                &mut out,
                "Not carried over (no counterpart in outbox-relay, or a different one):",
            );
            for (option, why) in &self.not_carried_over {
                render::comment(&mut out, &format!("  {option}: {why}"));
            }
        }
        out
    }
}

/// The options of a config, each taken at most once; what is left at the end has no counterpart.
struct Options<'a> {
    all: &'a BTreeMap<String, String>,
    taken: BTreeSet<String>,
}

impl<'a> Options<'a> {
    fn get(&mut self, key: &str) -> Option<&'a str> {
        let v = self.all.get(key)?;
        self.taken.insert(key.to_owned());
        Some(v.as_str())
    }

    /// The first of `keys` that is set (current name first, legacy names after).
    fn first(&mut self, keys: &[&str]) -> Option<(&'a str, &'a str)> {
        let found = keys.iter().find_map(|k| self.all.get_key_value(*k))?;
        for k in keys {
            if self.all.contains_key(*k) {
                self.taken.insert((*k).to_owned());
            }
        }
        Some((found.0.as_str(), found.1.as_str()))
    }
}

/// Maps a parsed connector config — Kafka Connect's, or a Debezium Server file with its sink
/// (`server.rs`); `Err` when it is not something the relay can replace.
pub(crate) fn map(config: &ConnectorConfig, source: &str) -> Result<Imported, ImportError> {
    let Some(server) = server::split(&config.options) else {
        return map_connector(config, source);
    };
    let connector = ConnectorConfig {
        name: config.name.clone().or_else(|| server.connector.get("name").cloned()),
        options: server.connector.clone(),
    };
    let mut out = map_connector(&connector, source)?;
    // Debezium Server has no Kafka Connect worker: the [kafka] lines written for one go, and the
    // connector options it never sees (producer.override.*) with them.
    let sink = server::map_sink(&server, source)?;
    out.sink = sink.sink;
    match sink.broker {
        Some(("kafka", lines)) => out.kafka = lines,
        other => {
            out.kafka.clear();
            out.broker = other;
        }
    }
    out.not_carried_over.extend(sink.not_carried_over);
    out.not_carried_over.sort();
    Ok(out)
}

fn map_connector(config: &ConnectorConfig, source: &str) -> Result<Imported, ImportError> {
    let mut opts = Options {
        all: &config.options,
        taken: BTreeSet::new(),
    };
    opts.get("name");
    match opts.get("connector.class") {
        Some(POSTGRES_CONNECTOR) => {}
        Some(other) => {
            return Err(ImportError::Unsupported(format!(
                "{source}: connector.class is {other:?}; outbox-relay replaces the Debezium PostgreSQL connector ({POSTGRES_CONNECTOR}) with its Outbox EventRouter only"
            )))
        }
        None => {
            return Err(ImportError::Unsupported(format!(
                "{source}: has no connector.class; expected a Debezium PostgreSQL connector config ({POSTGRES_CONNECTOR})"
            )))
        }
    }
    let router = find_router(&mut opts, source)?;
    let mut out = Imported {
        connector: config.name.clone(),
        ..Imported::default()
    };
    let mut notes = Vec::new();
    map_postgres(&mut opts, &mut out, &mut notes, source)?;
    map_outbox(&mut opts, &router, &mut out, &mut notes, source)?;
    map_route(&mut opts, &router, &mut out);
    map_kafka(&mut opts, &mut out, &mut notes);
    map_debezium(&mut opts, &router, &mut out, &mut notes);
    map_relay(&mut opts, &mut out, &mut notes);
    out.not_carried_over = notes;
    let router_prefix = format!("transforms.{}.", router.name);
    for key in config.options.keys() {
        if opts.taken.contains(key) {
            continue;
        }
        let why = match key.strip_prefix(&router_prefix) {
            Some(option) => reason(Scope::Router, option),
            None => reason(Scope::Connector, key),
        };
        out.not_carried_over.push((key.clone(), why.to_owned()));
    }
    // Connector options with a counterpart that differs (notes) and those with none, one list in
    // option order.
    out.not_carried_over.sort();
    Ok(out)
}

/// The EventRouter transform: its name in `transforms` and its options, prefix stripped.
struct Router {
    name: String,
    options: BTreeMap<String, String>,
}

impl Router {
    fn key(&self, option: &str) -> String {
        format!("transforms.{}.{option}", self.name)
    }
}

fn find_router(opts: &mut Options<'_>, source: &str) -> Result<Router, ImportError> {
    let listed: Vec<String> = opts
        .get("transforms")
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let routers: Vec<&String> = listed
        .iter()
        .filter(|t| opts.all.get(&format!("transforms.{t}.type")).map(|s| s.trim()) == Some(EVENT_ROUTER))
        .collect();
    match routers.as_slice() {
        [one] => {
            let prefix = format!("transforms.{one}.");
            let options = opts
                .all
                .iter()
                .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|o| (o.to_owned(), v.clone())))
                .collect();
            opts.taken.insert(format!("{prefix}type"));
            Ok(Router {
                name: (*one).clone(),
                options,
            })
        }
        [] => {
            let what = if listed.is_empty() {
                "`transforms` is not set".to_owned()
            } else {
                let named: Vec<String> = listed
                    .iter()
                    .map(|t| {
                        let ty = opts
                            .all
                            .get(&format!("transforms.{t}.type"))
                            .map_or("no type", String::as_str);
                        format!("{t} ({ty})")
                    })
                    .collect();
                format!("`transforms` lists {}", named.join(", "))
            };
            Err(ImportError::Unsupported(format!(
                "{source}: has no Outbox EventRouter transform ({what}); outbox-relay replaces the connector together with its EventRouter ({EVENT_ROUTER}), so there is nothing to import"
            )))
        }
        many => Err(ImportError::Unsupported(format!(
            "{source}: has {} EventRouter transforms ({}); one relay replaces one EventRouter (on one or several outbox tables of one column mapping)",
            many.len(),
            many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// A Kafka Connect config-provider reference (`${file:/path:key}`, `${env:VAR}`), which Connect
/// resolves and the relay does not.
fn is_provider_reference(value: &str) -> bool {
    value.find("${").is_some_and(|at| {
        value[at..]
            .find('}')
            .is_some_and(|end| value[at..at + end].contains(':'))
    })
}

fn s(v: &str) -> toml::Value {
    toml::Value::String(v.to_owned())
}

fn map_postgres(
    opts: &mut Options<'_>,
    out: &mut Imported,
    notes: &mut Vec<(String, String)>,
    source: &str,
) -> Result<(), ImportError> {
    fn required<'a>(opts: &mut Options<'a>, key: &str, source: &str) -> Result<&'a str, ImportError> {
        opts.get(key).map(str::trim).filter(|v| !v.is_empty()).ok_or_else(|| {
            ImportError::Unsupported(format!(
                "{source}: {key} is not set; Debezium needs it too, so this config cannot have worked"
            ))
        })
    }
    let host = required(opts, "database.hostname", source)?;
    let user = required(opts, "database.user", source)?;
    let dbname = required(opts, "database.dbname", source)?;
    let port = opts
        .get("database.port")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .unwrap_or("5432");
    for (key, value) in [
        ("database.hostname", host),
        ("database.user", user),
        ("database.dbname", dbname),
        ("database.port", port),
    ] {
        if is_provider_reference(value) {
            notes.push((key.to_owned(), "a Kafka Connect config-provider reference, which the relay does not resolve: write the value into postgres.url".to_owned()));
        }
    }
    let host_part = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let mut url = format!(
        "postgres://{}@{host_part}:{port}/{}",
        percent_encode(user),
        percent_encode(dbname)
    );
    let mut lines = Vec::new();
    let root_cert = opts.get("database.sslrootcert").filter(|c| !c.trim().is_empty());
    if let Some(mode) = opts.get("database.sslmode").map(str::trim) {
        let relay_mode = match mode {
            "disable" | "prefer" | "require" => mode,
            "allow" => {
                lines.push(Line::Comment(
                    "database.sslmode=allow (plain first, TLS if refused) has no equivalent; prefer tries TLS first."
                        .into(),
                ));
                "prefer"
            }
            "verify-ca" | "verify-full" => {
                lines.push(Line::Comment(if root_cert.is_some() {
                    format!("database.sslmode={mode}: with postgres.sslrootcert the relay verifies the certificate and the host name (verify-full).")
                } else {
                    format!("database.sslmode={mode} needs a CA: set postgres.sslrootcert, without it TLS encrypts but does not verify the server.")
                }));
                "require"
            }
            other => {
                notes.push((
                    "database.sslmode".into(),
                    format!("{other:?} is not a PostgreSQL sslmode; sslmode left at the relay's default (prefer)"),
                ));
                ""
            }
        };
        if !relay_mode.is_empty() {
            url.push_str(&format!("?sslmode={relay_mode}"));
        }
    }
    // The password stays out of the file (and out of anything printed): the URL names the user,
    // the secret comes from the environment.
    let password_note = match opts.get("database.password") {
        Some(p) if is_provider_reference(p) => {
            " Kafka Connect read database.password from a config provider; it is not copied."
        }
        Some(_) => " database.password is not copied.",
        None => "",
    };
    lines.insert(
        0,
        Line::Comment(format!(
            "The password is never written here.{password_note} Set the full URL with the password in\n\
             OUTBOX_RELAY__POSTGRES__URL (postgres://{user}:PASSWORD@{host_part}:{port}/{dbname}), or embed it below."
        )),
    );
    lines.push(Line::Set("url".into(), s(&url)));

    let plugin = opts.get("plugin.name").map(str::trim).unwrap_or("decoderbufs");
    let slot = opts.get("slot.name").map(str::trim).unwrap_or("debezium");
    if plugin == "pgoutput" {
        lines.push(Line::Comment(
            "Debezium's slot and publication. For the overlap switch-over (docs/migrating-from-debezium.md)\n\
             give the relay its own instead, e.g. slot = \"outbox_relay\" and publication = \"outbox_relay\"."
                .into(),
        ));
        simple_name(&mut lines, notes, "slot", "slot.name", slot);
    } else {
        // A slot of another plugin cannot be read with pgoutput; setup would refuse it.
        lines.push(Line::Comment(format!(
            "Debezium's slot {slot:?} uses the {plugin} plugin (plugin.name{}); the relay only speaks pgoutput,\n\
             so it needs a new slot of its own.",
            if opts.all.contains_key("plugin.name") {
                ""
            } else {
                " unset: Debezium's default"
            }
        )));
        lines.push(Line::Set("slot".into(), s("outbox_relay")));
    }
    let publication = opts.get("publication.name").map(str::trim).unwrap_or("dbz_publication");
    simple_name(&mut lines, notes, "publication", "publication.name", publication);
    if let Some(mode) = opts.get("publication.autocreate.mode") {
        let why = match mode.trim() {
            "disabled" => "the publication must then exist already: setup checks that it includes the outbox table and never alters it unless the role owns it",
            _ => "setup creates the publication FOR TABLE <outbox> WITH (publish = 'insert') (like filtered, inserts only); an existing publication is checked, never narrowed",
        };
        notes.push(("publication.autocreate.mode".into(), why.into()));
    }
    if let Some(cert) = root_cert {
        lines.push(Line::Set("sslrootcert".into(), s(cert.trim())));
    }
    if let Some(mode) = opts.get("snapshot.mode") {
        let why = match mode.trim() {
            "never" | "no_data" => "the relay starts at the slot's creation (setup), like this mode".to_owned(),
            m => format!(
                "{m}: the relay takes no table snapshot; setup starts at the slot's creation (≈ never). Rows Debezium never published can be sent with setup --backfill (pending = [poll] dispatched_column IS NULL; docs/migrating-from-polling.md)"
            ),
        };
        notes.push(("snapshot.mode".into(), why));
    }
    if opts.get("slot.drop.on.stop").is_some() {
        notes.push((
            "slot.drop.on.stop".into(),
            "never: the slot is the relay's durable position; `teardown --yes` drops it deliberately".into(),
        ));
    }
    out.postgres = lines;
    Ok(())
}

/// A slot or publication name, if the relay accepts it; otherwise the relay's default and a note.
fn simple_name(lines: &mut Vec<Line>, notes: &mut Vec<(String, String)>, key: &'static str, option: &str, value: &str) {
    if SimpleName::parse("name", value).is_ok() {
        lines.push(Line::Set(key.into(), s(value)));
    } else {
        notes.push((
            option.into(),
            format!("{value:?} is not a name the relay accepts (lower-case letters, digits, underscores); postgres.{key} set to \"outbox_relay\""),
        ));
        lines.push(Line::Set(key.into(), s("outbox_relay")));
    }
}

/// `%`-encodes what may not appear as is in a URL's user or path.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A column or table name as Debezium has it (the catalog's exact, case-sensitive name) in the
/// relay's SQL-identifier syntax, where unquoted names fold to lower case.
fn sql_name(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if plain {
        name.to_owned()
    } else {
        quote_ident(name)
    }
}

/// `table.include.list` names tables by regular expression; the relay needs the outbox tables
/// by name. Every entry must be a plain `schema.table` (several entries: several outbox tables,
/// which share the one column mapping, as the EventRouter requires); a pattern is refused, since
/// what it matches depends on the database's tables at the time, which an import does not see.
fn outbox_tables(opts: &mut Options<'_>, source: &str) -> Result<Vec<String>, ImportError> {
    let Some((key, list)) = opts.first(&["table.include.list", "table.whitelist"]) else {
        return Err(ImportError::Unsupported(format!(
            "{source}: table.include.list is not set (Debezium then captures every table); outbox-relay relays the outbox tables it is given: set table.include.list to them, e.g. public.outbox"
        )));
    };
    let entries: Vec<&str> = list.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Err(ImportError::Unsupported(format!(
            "{source}: {key} is empty; set it to the outbox table(s), e.g. public.outbox"
        )));
    }
    let mut tables: Vec<String> = Vec::with_capacity(entries.len());
    for entry in entries {
        // The dot of schema.table is written plain or escaped (`\.`); any other regex syntax
        // makes the entry a pattern.
        let unescaped = entry.replace("\\.", "\u{0}").replace('.', "\u{0}");
        if unescaped.chars().any(|c| "\\^$|?*+()[]{}".contains(c)) {
            return Err(ImportError::Unsupported(format!(
                "{source}: {key} entry {entry:?} is a pattern; outbox-relay needs the outbox tables by name: replace it \
                 with the tables it matches, each as schema.table, separated by commas (e.g. sales.outbox,billing.outbox)"
            )));
        }
        let mut parts = unescaped.split('\u{0}');
        let name = match (parts.next(), parts.next(), parts.next()) {
            (Some(table), None, _) => sql_name(table),
            (Some(schema), Some(table), None) => format!("{}.{}", sql_name(schema), sql_name(table)),
            _ => {
                return Err(ImportError::Unsupported(format!(
                    "{source}: {key} entry {entry:?} is not schema.table"
                )))
            }
        };
        // Debezium matches each table once, however many entries match it.
        if !tables.contains(&name) {
            tables.push(name);
        }
    }
    Ok(tables)
}

fn map_outbox(
    opts: &mut Options<'_>,
    router: &Router,
    out: &mut Imported,
    notes: &mut Vec<(String, String)>,
    source: &str,
) -> Result<(), ImportError> {
    let tables = outbox_tables(opts, source)?;
    // One table stays a string, as every config written before lists existed.
    let table = match tables.as_slice() {
        [one] => s(one),
        many => toml::Value::Array(many.iter().map(|t| s(t)).collect()),
    };
    let mut lines = vec![Line::Set("table".into(), table)];
    let mut take = |names: &[&str]| -> Option<(String, String)> {
        let found = names
            .iter()
            .find_map(|n| router.options.get(*n).map(|v| ((*n).to_owned(), v.trim().to_owned())));
        for n in names {
            if router.options.contains_key(*n) {
                opts.taken.insert(router.key(n));
            }
        }
        found
    };
    lines.push(Line::Comment(
        "Every column is written out: Debezium's defaults (id, aggregateid, aggregatetype, payload)\n\
         differ from the relay's (id, aggregate_id, type, payload)."
            .into(),
    ));
    let id = take(&["table.field.event.id"]).map_or("id".to_owned(), |(_, v)| v);
    lines.push(Line::Set("id_column".into(), s(&sql_name(&id))));
    // Debezium 1.x keyed records by table.field.payload.id (default aggregateid) when
    // table.field.event.key was unset; that legacy option only counts as the key then.
    let key = match take(&["table.field.event.key"]) {
        Some((_, v)) => v,
        None => match take(&["table.field.event.payload.id", "table.field.payload.id"]) {
            Some((name, v)) => {
                lines.push(Line::Comment(format!(
                    "The key: {name} (table.field.event.key unset), as Debezium 1.x keyed records."
                )));
                v
            }
            None => "aggregateid".to_owned(),
        },
    };
    lines.push(Line::Set("key_column".into(), s(&sql_name(&key))));
    let route_by = take(&["route.by.field"]).map_or("aggregatetype".to_owned(), |(_, v)| v);
    lines.push(Line::Set("route_by_column".into(), s(&sql_name(&route_by))));
    let payload = take(&["table.field.event.payload", "table.field.payload"]).map_or("payload".to_owned(), |(_, v)| v);
    lines.push(Line::Set("payload_column".into(), s(&sql_name(&payload))));
    if let Some((_, ts)) = take(&["table.field.event.timestamp"]) {
        lines.push(Line::Set("timestamp_column".into(), s(&sql_name(&ts))));
    }
    let mut headers = toml::Table::new();
    if let Some((_, ty)) = take(&["table.field.event.type"]) {
        lines.push(Line::Comment(format!(
            "{} (Debezium 1.x put the event type into the record as eventType): forwarded as a header.",
            router.key("table.field.event.type")
        )));
        headers.insert(sql_name(&ty), s("eventType"));
    }
    if let Some(placements) = router.options.get("table.fields.additional.placement") {
        let option = router.key("table.fields.additional.placement");
        for placement in placements.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let parts: Vec<&str> = placement.split(':').map(str::trim).collect();
            let (column, place, alias) = match parts.as_slice() {
                [c, p] => (*c, *p, *c),
                [c, p, a] => (*c, *p, *a),
                _ => {
                    return Err(ImportError::Unsupported(format!(
                        "{source}: {option} entry {placement:?} is not column:placement[:alias]"
                    )))
                }
            };
            match place.to_ascii_lowercase().as_str() {
                "header" if alias.eq_ignore_ascii_case("id") => notes.push((
                    option.clone(),
                    format!("{placement}: the id header is the event id (outbox.id_column); another column cannot take its name"),
                )),
                // Written as they are into [debezium] (map_debezium), which converts each placed
                // value as Kafka Connect does; header_columns would write the column's raw text.
                "header" | "envelope" | "partition" => {
                    let _ = (column, alias);
                }
                other => notes.push((option.clone(), format!("{placement}: unknown placement {other:?}"))),
            }
        }
    }
    lines.push(Line::Set("header_columns".into(), toml::Value::Table(headers)));
    out.outbox = lines;
    Ok(())
}

/// Java regex constructs the `regex` crate lacks, for a precise message.
fn java_only_construct(regex: &str) -> Option<&'static str> {
    if ["(?=", "(?!", "(?<=", "(?<!"].iter().any(|p| regex.contains(p)) {
        return Some("look-around");
    }
    let bytes = regex.as_bytes();
    let backref = bytes.windows(2).enumerate().any(|(i, w)| {
        let escaped = bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1;
        w[0] == b'\\' && !escaped && (w[1].is_ascii_digit() && w[1] != b'0' || w[1] == b'k')
    });
    backref.then_some("back-references")
}

/// Java's replacement syntax in the relay's: `\x` stands for `x` (`$$` for a literal `$`), and
/// `$1` becomes `${1}` so a following letter cannot extend the group name.
fn replacement_for_rust(java: &str) -> String {
    let mut out = String::with_capacity(java.len());
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => {}
            },
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push_str("${");
                while let Some(d) = chars.next_if(char::is_ascii_digit) {
                    out.push(d);
                }
                out.push('}');
            }
            other => out.push(other),
        }
    }
    out
}

fn map_route(opts: &mut Options<'_>, router: &Router, out: &mut Imported) {
    let mut lines = Vec::new();
    let regex = router.options.get("route.topic.regex").map(|r| {
        opts.taken.insert(router.key("route.topic.regex"));
        r.trim().to_owned()
    });
    let replacement_java = router.options.get("route.topic.replacement").map(|r| {
        opts.taken.insert(router.key("route.topic.replacement"));
        r.trim().to_owned()
    });
    let replacement = replacement_java
        .as_deref()
        .map_or_else(|| "outbox.event.${routedByValue}".to_owned(), replacement_for_rust);
    let regex_text = regex.clone().unwrap_or_else(|| DEFAULT_TOPIC_REGEX.to_owned());
    let regex_ok = match TopicRoute::new(&regex_text, DEFAULT_TOPIC_REPLACEMENT_PROBE) {
        Ok(_) => true,
        Err(e) => {
            let why = java_only_construct(&regex_text).map_or_else(
                || format!("the regex crate refuses it: {e}"),
                |what| format!("it uses {what}, which Rust's regex crate does not support"),
            );
            lines.push(Line::Comment(format!(
                "route.topic.regex cannot be used as is ({why}); rewrite it without them.\n\
                 Until then the relay's default applies: (?<routedByValue>.*)."
            )));
            lines.push(Line::Disabled("topic_regex".into(), s(&regex_text)));
            false
        }
    };
    if regex_ok {
        if regex.is_none() {
            lines.push(Line::Comment(
                "Debezium's default regex (route.topic.regex unset).".into(),
            ));
        }
        lines.push(Line::Set("topic_regex".into(), s(&regex_text)));
    }
    let effective_regex = if regex_ok {
        regex_text.as_str()
    } else {
        DEFAULT_TOPIC_REGEX
    };
    match TopicRoute::new(effective_regex, &replacement) {
        Ok(_) => {
            if replacement_java.is_none() {
                lines.push(Line::Comment(
                    "Debezium's default topic (route.topic.replacement unset); the relay's own default would be ${routedByValue}.".into(),
                ));
            }
            lines.push(Line::Set("topic_replacement".into(), s(&replacement)));
        }
        Err(e) => {
            lines.push(Line::Comment(format!(
                "route.topic.replacement cannot be used as is: {e}"
            )));
            lines.push(Line::Disabled("topic_replacement".into(), s(&replacement)));
        }
    }
    out.route = lines;
}

/// A replacement that refers to no group, to check a regex on its own.
const DEFAULT_TOPIC_REPLACEMENT_PROBE: &str = "topic";

fn map_kafka(opts: &mut Options<'_>, out: &mut Imported, notes: &mut Vec<(String, String)>) {
    let mut lines = Vec::new();
    let mut properties: Vec<(String, String)> = Vec::new();
    for name in PRODUCER_PASS_THROUGH {
        let option = format!("producer.override.{name}");
        let Some(value) = opts.get(&option) else { continue };
        let value = value.trim();
        match *name {
            "acks" if value != "all" && value != "-1" => {
                notes.push((option, format!("{value}: the relay enforces acks=all (it confirms WAL only for events every in-sync replica has)")));
            }
            "enable.idempotence" if value != "true" => {
                notes.push((option, "the relay enforces enable.idempotence=true (retries must not duplicate or reorder an aggregate's events)".into()));
            }
            "acks" | "enable.idempotence" => {}
            // librdkafka's name (it knows sasl.mechanism as an alias, too).
            "sasl.mechanism" => properties.push(("sasl.mechanisms".into(), value.into())),
            _ => properties.push(((*name).to_owned(), value.to_owned())),
        }
    }
    if !properties.iter().any(|(k, _)| k == "bootstrap.servers") {
        lines.push(Line::Comment(
            "Kafka Connect's brokers live in the worker config, not the connector's: set them here\n\
             (or in OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS). librdkafka properties; acks=all and\n\
             idempotence are enforced."
                .into(),
        ));
        lines.push(Line::Set("bootstrap.servers".into(), s("localhost:9092")));
    } else {
        lines.push(Line::Comment(
            "librdkafka properties (from producer.override.*); acks=all and idempotence are enforced.".into(),
        ));
    }
    for (k, v) in properties {
        lines.push(Line::Set(k, s(&v)));
    }
    out.kafka = lines;
}

/// `"true"`/`"false"` as a TOML boolean, anything else as the string it is.
fn bool_or_string(v: &str) -> toml::Value {
    match v.trim() {
        t if t.eq_ignore_ascii_case("true") => toml::Value::Boolean(true),
        t if t.eq_ignore_ascii_case("false") => toml::Value::Boolean(false),
        t => s(t),
    }
}

fn map_debezium(opts: &mut Options<'_>, router: &Router, out: &mut Imported, notes: &mut Vec<(String, String)>) {
    let mut lines = vec![Line::Comment(
        "Debezium / Kafka Connect options that decide the record bytes, by their own names.".into(),
    )];
    for side in ["key", "value"] {
        let option = format!("{side}.converter");
        let schemas_option = format!("{side}.converter.schemas.enable");
        let (class, explicit) = match opts.get(&option) {
            Some(c) => (c.trim(), true),
            None => (WORKER_DEFAULT_CONVERTER, false),
        };
        if !SUPPORTED_CONVERTERS.contains(&class) {
            notes.push((
                option.clone(),
                format!(
                    "{class} is not supported (a schema-registry format, or a converter the relay does not reproduce): StringConverter is written instead, so the relay writes the column's own text (for a bytea {side} column use io.debezium.converters.BinaryDataConverter), and consumers deserializing {side}s with this converter's format must change"
                ),
            ));
            lines.push(Line::Comment(format!(
                "{option} {class} is not supported: the column's own text instead (see the notes at the end)."
            )));
            lines.push(Line::Set(option, s(STRING_CONVERTER)));
            continue;
        }
        if !explicit {
            lines.push(Line::Comment(format!(
                "{option} is not set in the connector config: Kafka Connect's worker default (check the worker's {option})."
            )));
        }
        lines.push(Line::Set(option, s(class)));
        let schemas = opts.get(&schemas_option);
        if class == WORKER_DEFAULT_CONVERTER || schemas.is_some() {
            if schemas.is_none() {
                lines.push(Line::Comment(format!(
                    "{schemas_option} is not set: JsonConverter's default (true)."
                )));
            }
            lines.push(Line::Set(schemas_option, bool_or_string(schemas.unwrap_or("true"))));
        }
    }
    for (option, default) in ROUTER_RECORD_OPTIONS {
        let value = match (router.options.get(*option), default) {
            (Some(v), _) => {
                opts.taken.insert(router.key(option));
                v.clone()
            }
            (None, Some(d)) => {
                lines.push(Line::Comment(format!("{option} is not set: Debezium's default.")));
                (*d).to_owned()
            }
            (None, None) => continue,
        };
        let value = match *option {
            "table.fields.additional.placement" | "table.json.payload.null.behavior" => s(value.trim()),
            _ => bool_or_string(&value),
        };
        lines.push(Line::Set((*option).to_owned(), value));
    }
    // Names the schema of an envelope value (`<topic.prefix>.<schema>.<table>.<routed>.Value`).
    if let Some((_, prefix)) = opts.first(&["topic.prefix", "database.server.name"]) {
        lines.push(Line::Set("topic.prefix".into(), s(prefix.trim())));
    }
    out.debezium = lines;
}

fn map_relay(opts: &mut Options<'_>, out: &mut Imported, notes: &mut Vec<(String, String)>) {
    let mut lines = Vec::new();
    if let Some(ms) = opts.get("heartbeat.interval.ms") {
        match ms.trim().parse::<u64>() {
            Ok(0) => {}
            Ok(n) => {
                lines.push(Line::Comment(
                    "heartbeat.interval.ms: the relay writes a tiny logical message itself (no heartbeat table or topic).".into(),
                ));
                lines.push(Line::Set(
                    "heartbeat_interval_ms".into(),
                    toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX)),
                ));
            }
            Err(_) => notes.push((
                "heartbeat.interval.ms".into(),
                format!("{ms:?} is not a number of milliseconds"),
            )),
        }
    }
    if let Some(mode) = opts.get("event.processing.failure.handling.mode") {
        let relay = match mode.trim() {
            "fail" => Some("fail"),
            "warn" | "skip" | "ignore" => Some("skip"),
            _ => None,
        };
        match relay {
            Some(r) => {
                lines.push(Line::Comment(format!(
                    "event.processing.failure.handling.mode={}: an event that cannot be published (fail, skip, or dead-letter with dead_letter_topic).",
                    mode.trim()
                )));
                lines.push(Line::Set("on_bad_event".into(), s(r)));
            }
            None => notes.push((
                "event.processing.failure.handling.mode".into(),
                format!("{mode:?}: relay.on_bad_event takes fail, skip or dead-letter"),
            )),
        }
    }
    out.relay = lines;
}
