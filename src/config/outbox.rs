//! `[outbox]` and `[route]`: which outbox tables are relayed and which of their columns carry
//! which part of the Kafka record ([`OutboxMapping`]), and the compiled topic-routing rule
//! ([`TopicRoute`]).
//!
//! `outbox.table` is one table or a list of them (Debezium's `table.include.list` with several
//! outbox tables, e.g. one per schema of a modular monolith). Invariant: every table shares the
//! one column mapping (as Debezium's EventRouter requires), the list is never empty and names
//! each table once; [`OutboxMapping::tables`] is the list every module iterates and
//! [`OutboxMapping::table_of`] tells which configured table a relation or row belongs to.
//!
//! Routing has the semantics of Debezium's Outbox EventRouter. Debezium takes the route-by
//! column's value (`routedByValue`) and feeds it through Kafka Connect's `RegexRouter`: if
//! `route.topic.regex` matches the *whole* value, the topic is the value with that match replaced
//! by `route.topic.replacement` (named groups are available as `${name}`); if it does not match,
//! the value itself is the topic. We reproduce exactly that: the regex is anchored at both ends to
//! emulate Java's `Matcher.matches()`, and the Java-style named group `(?<name>…)` is accepted (the
//! `regex` crate understands it).
//!
//! Differences from Java regexes worth knowing: no look-around or back-references, and a literal
//! `$` in the replacement is written `$$`. Whether the routed name is a legal Kafka topic is
//! checked per event (`outbox::routing`, outside this module), since it depends on the value.

use std::borrow::Cow;
use std::collections::BTreeMap;

use regex::Regex;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::config::debezium::{DebeziumFormat, Placement};
use crate::config::ident::{Ident, TableName};
use crate::config::{named, ConfigError};

pub(crate) const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
pub(crate) const DEFAULT_TOPIC_REPLACEMENT: &str = "${routedByValue}";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct OutboxSection {
    pub(crate) table: TableList,
    pub(crate) id_column: String,
    pub(crate) key_column: String,
    pub(crate) route_by_column: String,
    pub(crate) payload_column: String,
    pub(crate) timestamp_column: Option<String>,
    pub(crate) header_columns: BTreeMap<String, String>,
    /// Transactional `pg_logical_emit_message` events with this prefix are outbox events too.
    pub(crate) message_prefix: Option<String>,
    /// A text column holding a W3C `traceparent` to pass on.
    pub(crate) trace_column: Option<String>,
    /// A text column holding the W3C `tracestate` (only with `trace_column`).
    pub(crate) tracestate_column: Option<String>,
}

impl Default for OutboxSection {
    fn default() -> Self {
        OutboxSection {
            table: TableList(vec!["public.events_outbox".into()]),
            id_column: "id".into(),
            key_column: "aggregate_id".into(),
            route_by_column: "type".into(),
            payload_column: "payload".into(),
            timestamp_column: None,
            header_columns: BTreeMap::new(),
            message_prefix: None,
            trace_column: None,
            tracestate_column: None,
        }
    }
}

/// `outbox.table` as written: one string, or a list of strings (kept in the file's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableList(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for TableList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrMany;
        impl<'de> Visitor<'de> for OneOrMany {
            type Value = TableList;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a table name (\"schema.table\") or a list of them ([\"sales.outbox\", \"billing.outbox\"])",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TableList, E> {
                Ok(TableList(vec![v.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TableList, A::Error> {
                let mut tables = Vec::new();
                while let Some(t) = seq.next_element::<String>()? {
                    tables.push(t);
                }
                Ok(TableList(tables))
            }
        }
        deserializer.deserialize_any(OneOrMany)
    }
}

/// Which outbox tables are relayed, and which of their columns carry which part of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMapping {
    /// Every configured outbox table, in the configured order: never empty, each once. All share
    /// the column mapping below. Iterate this; never assume one table.
    pub(crate) tables: Vec<TableName>,
    pub(crate) id: Ident,
    pub(crate) key: Ident,
    pub(crate) route_by: Ident,
    pub(crate) payload: Ident,
    pub(crate) timestamp: Option<Ident>,
    /// (column, header name), in a stable order.
    pub(crate) headers: Vec<(Ident, String)>,
    /// Prefix of `pg_logical_emit_message` events (`None`: messages are not events).
    pub(crate) message_prefix: Option<String>,
    /// Columns read only for `[debezium]`'s `table.fields.additional.placement`, in placement
    /// order (each once); empty without that section.
    pub(crate) placed: Vec<Ident>,
    /// The W3C `traceparent` column (`outbox.trace_column`).
    pub(crate) traceparent: Option<Ident>,
    /// The W3C `tracestate` column; only with `traceparent`.
    pub(crate) tracestate: Option<Ident>,
    /// `[cloudevents]` extension columns, in `CloudEventsSettings::extensions` order; empty
    /// without that section.
    pub(crate) extensions: Vec<Ident>,
    /// Columns read besides the mapped ones, with the config key naming each: first those the
    /// `[route] topic` / `key` templates refer to ([`TopicRoute::columns`], same indices), then
    /// `[filter] where`'s; each once, empty without either.
    pub(crate) routing_columns: Vec<(Ident, &'static str)>,
}

impl OutboxMapping {
    /// The configured table `schema.name` is (`None`: not an outbox table), e.g. for a pgoutput
    /// Relation's namespace and name. Exact comparison: the names are as the catalog stores them.
    pub(crate) fn table_of(&self, schema: &str, name: &str) -> Option<&TableName> {
        self.tables
            .iter()
            .find(|t| t.schema.as_str() == schema && t.name.as_str() == name)
    }

    /// The tables for people: `"public"."outbox"` or `"a"."outbox", "b"."outbox"`.
    pub(crate) fn tables_display(&self) -> String {
        self.tables
            .iter()
            .map(TableName::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Reads the columns `[debezium]` places. A `header_columns` entry that a header placement
    /// repeats (same column, same header) is dropped: the placement writes that header, converted
    /// as Connect converts it. Any other header name used twice is an error.
    pub(crate) fn place_debezium_columns(&mut self, format: &DebeziumFormat) -> Result<(), ConfigError> {
        let placed_headers: Vec<(&Ident, &str)> = format
            .additional
            .iter()
            .filter(|f| f.placement == Placement::Header)
            .map(|f| (&f.column, f.alias.as_str()))
            .collect();
        self.headers
            .retain(|(c, h)| !placed_headers.iter().any(|(pc, ph)| *pc == c && *ph == h.as_str()));
        if let Some((c, h)) = self
            .headers
            .iter()
            .find(|(_, h)| placed_headers.iter().any(|(_, ph)| *ph == h.as_str()) || h.eq_ignore_ascii_case("id"))
        {
            return Err(ConfigError::Invalid {
                key: "outbox.header_columns",
                message: format!(
                    "column {c} maps to header {h:?}, which [debezium] \"table.fields.additional.placement\" \
                     also writes; keep the header in one place (the placement converts it as Kafka Connect does)"
                ),
            });
        }
        if let Some(f) = placed_headers.iter().find(|(_, h)| h.eq_ignore_ascii_case("id")) {
            return Err(ConfigError::Invalid {
                key: "debezium.\"table.fields.additional.placement\"",
                message: format!("column {} is placed as header \"id\", the event id header", f.0),
            });
        }
        self.placed = format.columns();
        Ok(())
    }

    /// Every mapped column with the config key that names it, for preflight checks.
    pub(crate) fn columns(&self) -> Vec<(&'static str, &Ident)> {
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
        for col in &self.placed {
            cols.push(("debezium.\"table.fields.additional.placement\"", col));
        }
        if let Some(col) = &self.traceparent {
            cols.push(("outbox.trace_column", col));
        }
        if let Some(col) = &self.tracestate {
            cols.push(("outbox.tracestate_column", col));
        }
        for col in &self.extensions {
            cols.push(("cloudevents.extensions", col));
        }
        for (col, key) in &self.routing_columns {
            cols.push((key, col));
        }
        cols
    }
}

impl OutboxSection {
    pub(crate) fn validate(self) -> Result<OutboxMapping, ConfigError> {
        let col = |key: &'static str, v: &str| Ident::parse(key, v).map_err(named(key));
        let mut headers = Vec::with_capacity(self.header_columns.len());
        for (column, header) in &self.header_columns {
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
        let message_prefix = match self.message_prefix {
            Some(p) if p.is_empty() => {
                return Err(ConfigError::Invalid {
                    key: "outbox.message_prefix",
                    message:
                        "is empty; remove the key, or set the prefix your services pass to pg_logical_emit_message"
                            .into(),
                })
            }
            p => p,
        };
        if self.trace_column.is_some() {
            if let Some((column, header)) = self
                .header_columns
                .iter()
                .find(|(_, h)| h.eq_ignore_ascii_case("traceparent") || h.eq_ignore_ascii_case("tracestate"))
            {
                return Err(ConfigError::Invalid {
                    key: "outbox.header_columns",
                    message: format!(
                        "column {column:?} maps to header {header:?}, which outbox.trace_column writes; remove the \
                         header_columns entry (map the column as trace_column or tracestate_column instead)"
                    ),
                });
            }
        }
        if self.tracestate_column.is_some() && self.trace_column.is_none() {
            return Err(ConfigError::Invalid {
                key: "outbox.tracestate_column",
                message: "is set without outbox.trace_column: a tracestate means nothing without its traceparent. \
                          Set trace_column too, or remove tracestate_column"
                    .into(),
            });
        }
        Ok(OutboxMapping {
            tables: parse_tables(&self.table)?,
            id: col("outbox.id_column", &self.id_column)?,
            key: col("outbox.key_column", &self.key_column)?,
            route_by: col("outbox.route_by_column", &self.route_by_column)?,
            payload: col("outbox.payload_column", &self.payload_column)?,
            timestamp: self
                .timestamp_column
                .as_deref()
                .map(|c| col("outbox.timestamp_column", c))
                .transpose()?,
            headers,
            message_prefix,
            placed: Vec::new(),
            traceparent: self
                .trace_column
                .as_deref()
                .map(|c| col("outbox.trace_column", c))
                .transpose()?,
            tracestate: self
                .tracestate_column
                .as_deref()
                .map(|c| col("outbox.tracestate_column", c))
                .transpose()?,
            extensions: Vec::new(),
            routing_columns: Vec::new(),
        })
    }
}

/// The configured tables, parsed: at least one, none twice (after case folding and the default
/// schema, so `outbox` and `public.OUTBOX` are the same table).
fn parse_tables(list: &TableList) -> Result<Vec<TableName>, ConfigError> {
    if list.0.is_empty() {
        return Err(ConfigError::Invalid {
            key: "outbox.table",
            message: "is an empty list; name at least one outbox table, e.g. table = \"public.outbox\" or \
                      table = [\"sales.outbox\", \"billing.outbox\"]"
                .into(),
        });
    }
    let mut tables: Vec<TableName> = Vec::with_capacity(list.0.len());
    for text in &list.0 {
        let table = TableName::parse("outbox.table", text).map_err(named("outbox.table"))?;
        if tables.contains(&table) {
            return Err(ConfigError::Invalid {
                key: "outbox.table",
                message: format!(
                    "lists {table} twice ({text:?} names it again); each outbox table is relayed once, remove the duplicate"
                ),
            });
        }
        tables.push(table);
    }
    Ok(tables)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RouteSection {
    pub(crate) topic_regex: String,
    pub(crate) topic_replacement: String,
    /// A template over outbox columns (`"${tenant}.${type}"`) that names the destination
    /// instead of the regex rule.
    pub(crate) topic: Option<String>,
    /// A template over outbox columns that is the record key instead of `outbox.key_column`.
    pub(crate) key: Option<String>,
}

impl Default for RouteSection {
    fn default() -> Self {
        RouteSection {
            topic_regex: DEFAULT_TOPIC_REGEX.into(),
            topic_replacement: DEFAULT_TOPIC_REPLACEMENT.into(),
            topic: None,
            key: None,
        }
    }
}

impl RouteSection {
    pub(crate) fn validate(self) -> Result<TopicRoute, ConfigError> {
        let mut route =
            TopicRoute::new(&self.topic_regex, &self.topic_replacement).map_err(|message| ConfigError::Invalid {
                key: "route.topic_regex",
                message,
            })?;
        if let Some(topic) = &self.topic {
            if self.topic_regex != DEFAULT_TOPIC_REGEX || self.topic_replacement != DEFAULT_TOPIC_REPLACEMENT {
                return Err(ConfigError::Invalid {
                    key: "route.topic",
                    message: format!(
                        "{topic:?} is set together with route.topic_regex / route.topic_replacement; both name the \
                         destination. Keep the template (write the regex's parts as columns, e.g. \
                         \"outbox.event.${{type}}\"), or remove route.topic to keep the Debezium rule"
                    ),
                });
            }
            route.topic = Some(ColumnTemplate::parse("route.topic", topic, &mut route.columns)?);
        }
        if let Some(key) = &self.key {
            route.key = Some(ColumnTemplate::parse("route.key", key, &mut route.columns)?);
        }
        Ok(route)
    }
}

/// One piece of a [`ColumnTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplatePart {
    Text(String),
    /// An index into [`TopicRoute::columns`].
    Column(usize),
}

/// `[route] topic` / `key`: text with `${column}` references to outbox columns (`$$` is one
/// `$`). A column is named as the catalog stores it (case and all, no quotes). Which columns
/// exist is the table's business: `setup`, `setup --check` and `run`'s start check them
/// against every outbox table (the config file alone cannot know them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnTemplate {
    parts: Vec<TemplatePart>,
}

impl ColumnTemplate {
    /// Parses `text`; each column it refers to is added to `columns` once (with `key`, the
    /// config key that names it in errors).
    fn parse(key: &'static str, text: &str, columns: &mut Vec<(Ident, &'static str)>) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { key, message };
        if text.is_empty() {
            return Err(invalid(
                "is empty; write a template over outbox columns, e.g. \"${tenant}.${type}\", or remove the key".into(),
            ));
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            literal.push_str(&rest[..at]);
            rest = &rest[at..];
            if let Some(after) = rest.strip_prefix("$$") {
                literal.push('$');
                rest = after;
                continue;
            }
            let Some(body) = rest.strip_prefix("${") else {
                return Err(invalid(format!(
                    "{text:?} has a `$` that starts no `${{column}}`; write a literal `$` as `$$`"
                )));
            };
            let Some(end) = body.find('}') else {
                return Err(invalid(format!(
                    "{text:?} has an unclosed `${{`; close it: `${{column}}`"
                )));
            };
            let name = &body[..end];
            let column = Ident::exact(key, name).map_err(|_| {
                invalid(format!(
                    "{text:?} refers to `${{{name}}}`, which names no column; write `${{column_name}}`"
                ))
            })?;
            if !literal.is_empty() {
                parts.push(TemplatePart::Text(std::mem::take(&mut literal)));
            }
            let idx = match columns.iter().position(|(c, _)| *c == column) {
                Some(i) => i,
                None => {
                    columns.push((column, key));
                    columns.len() - 1
                }
            };
            parts.push(TemplatePart::Column(idx));
            rest = &body[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(TemplatePart::Text(literal));
        }
        Ok(ColumnTemplate { parts })
    }

    /// The template with each column's text put in (`value(i)` is [`TopicRoute::columns`]'s
    /// `i`-th column of the event); `Err(i)`: column `i` is NULL, which gives no name.
    pub(crate) fn render<'v>(&self, value: impl Fn(usize) -> Option<&'v [u8]>) -> Result<Vec<u8>, usize> {
        let mut out = Vec::with_capacity(64);
        for part in &self.parts {
            match part {
                TemplatePart::Text(t) => out.extend_from_slice(t.as_bytes()),
                TemplatePart::Column(i) => out.extend_from_slice(value(*i).ok_or(*i)?),
            }
        }
        Ok(out)
    }
}

/// The compiled `[route]` rule: route-by value → topic name.
#[derive(Debug, Clone)]
pub struct TopicRoute {
    anchored: Regex,
    replacement: String,
    /// The default regex with a replacement whose only references are `${routedByValue}` (e.g.
    /// Debezium's `outbox.event.${routedByValue}`): the text around them, so that routing joins
    /// them with the value instead of running the regex, which otherwise costs about as much as
    /// decoding the row (6.7 % of the relay's instructions draining into NATS with such a rule;
    /// docs/benchmarks.md). The default rule is `["", ""]`: every value is its own topic.
    template: Option<Vec<String>>,
    /// `route.topic`: the destination from the event's columns; the regex rule is then unused.
    pub(crate) topic: Option<ColumnTemplate>,
    /// `route.key`: the record key from the event's columns instead of `outbox.key_column`.
    pub(crate) key: Option<ColumnTemplate>,
    /// The columns the templates refer to, each once, with the config key naming it
    /// (`OutboxMapping::routing_columns` is this list).
    pub(crate) columns: Vec<(Ident, &'static str)>,
}

impl TopicRoute {
    /// Compiles the route regex; the error is a sentence for the config file's author.
    pub(crate) fn new(topic_regex: &str, replacement: &str) -> Result<Self, String> {
        let anchored = Regex::new(&format!("^(?:{topic_regex})$")).map_err(|e| {
            format!("{topic_regex:?} is not a valid regular expression ({e}); the default is {DEFAULT_TOPIC_REGEX:?}")
        })?;
        for name in referenced_groups(replacement) {
            let known = name.parse::<usize>().map_or_else(
                |_| anchored.capture_names().flatten().any(|n| n == name),
                |idx| idx < anchored.captures_len(),
            );
            if !known {
                return Err(format!(
                    "route.topic_replacement {replacement:?} refers to group {name:?}, which route.topic_regex {topic_regex:?} does not define"
                ));
            }
        }
        let default_regex = topic_regex == DEFAULT_TOPIC_REGEX;
        Ok(TopicRoute {
            anchored,
            replacement: replacement.to_owned(),
            template: default_regex.then(|| whole_value_template(replacement)).flatten(),
            topic: None,
            key: None,
            columns: Vec::new(),
        })
    }

    /// The default rule, under which every value is its own topic.
    fn is_identity(&self) -> bool {
        matches!(self.template.as_deref(), Some([before, after]) if before.is_empty() && after.is_empty())
    }

    /// The topic for one route-by value (not yet checked against Kafka's naming rules).
    pub(crate) fn route<'a>(&self, routed_by_value: &'a str) -> Cow<'a, str> {
        if let Some(literals) = &self.template {
            // What the default regex does: `.` does not match a line break, so such a value
            // matches nothing and routes to itself; any other value is the whole group. Under
            // the default rule both give the value itself.
            if self.is_identity() || routed_by_value.as_bytes().contains(&b'\n') {
                return Cow::Borrowed(routed_by_value);
            }
            return Cow::Owned(literals.join(routed_by_value));
        }
        match self.anchored.captures(routed_by_value) {
            Some(caps) => {
                let mut topic = String::with_capacity(routed_by_value.len() + 16);
                caps.expand(&self.replacement, &mut topic);
                Cow::Owned(topic)
            }
            None => Cow::Borrowed(routed_by_value),
        }
    }
}

/// The replacement's text around its references, when every reference is `${routedByValue}` and
/// it has no other `$` (whose expansion rules the regex crate's `Captures::expand` owns).
fn whole_value_template(replacement: &str) -> Option<Vec<String>> {
    let literals: Vec<String> = replacement
        .split(DEFAULT_TOPIC_REPLACEMENT)
        .map(str::to_owned)
        .collect();
    (!literals.iter().any(|l| l.contains('$'))).then_some(literals)
}

/// Group names or numbers a replacement string refers to (`$name`, `${name}`, `$1`).
fn referenced_groups(replacement: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = replacement.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            i += 1;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'$') {
            i += 2;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'{') {
            if let Some(end) = replacement[i + 2..].find('}') {
                out.push(&replacement[i + 2..i + 2 + end]);
                i += 3 + end;
                continue;
            }
        }
        let start = i + 1;
        let len = replacement[start..]
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        if len > 0 {
            out.push(&replacement[start..start + len]);
        }
        i = start + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `regex` and `replacement` as a route, checked to route each value to its topic.
    fn routes(regex: &str, replacement: &str, topics: &[(&str, &str)]) -> TopicRoute {
        let r = TopicRoute::new(regex, replacement).unwrap();
        for (value, topic) in topics {
            assert_eq!(r.route(value), *topic, "{value:?}");
        }
        r
    }

    #[test]
    fn default_routes_to_the_type_itself() {
        let r = routes(
            DEFAULT_TOPIC_REGEX,
            DEFAULT_TOPIC_REPLACEMENT,
            &[("order.placed", "order.placed"), ("", "")],
        );
        assert!(r.is_identity());
        assert!(matches!(r.route("order.placed"), Cow::Borrowed(_)), "no copy per event");
    }

    #[test]
    fn prefix_before_first_dot() {
        routes(
            r"^(?<routedByValue>[^.]+)\..*$",
            "${routedByValue}",
            // No match: Debezium keeps the route value as the topic.
            &[("order.placed", "order"), ("orderplaced", "orderplaced")],
        );
    }

    #[test]
    fn debezium_default_replacement_prefix() {
        let r = routes(
            DEFAULT_TOPIC_REGEX,
            "outbox.event.${routedByValue}",
            // `.` does not match a line break: no match, the value is the topic (as through the regex).
            &[("Order", "outbox.event.Order"), ("a\nb", "a\nb")],
        );
        assert!(r.template.is_some(), "routed without the regex");
    }

    #[test]
    fn python_style_groups_and_numbers_work() {
        routes(
            r"(?P<agg>\w+)\.(\w+)",
            "events-$agg-${2}",
            &[("order.paid", "events-order-paid")],
        );
    }

    #[test]
    fn match_must_cover_the_whole_value() {
        // Java's matches() semantics: a partial match does not count.
        routes(
            "order",
            "orders",
            &[("order.placed", "order.placed"), ("order", "orders")],
        );
    }

    #[test]
    fn bad_regex_and_unknown_groups_are_config_errors() {
        assert!(TopicRoute::new("(unclosed", "x")
            .unwrap_err()
            .contains("not a valid regular expression"));
        assert!(TopicRoute::new("(?<a>.*)", "${b}").unwrap_err().contains("\"b\""));
        assert!(TopicRoute::new("(?<a>.*)", "$$literal-${a}").is_ok());
    }

    type Columns = Vec<(Ident, &'static str)>;

    fn template(text: &str) -> Result<(ColumnTemplate, Columns), ConfigError> {
        let mut columns = Vec::new();
        ColumnTemplate::parse("route.topic", text, &mut columns).map(|t| (t, columns))
    }

    #[test]
    fn templates_name_columns_once_and_render_their_text() {
        let (t, cols) = template("${tenant}.${type}.$$${tenant}").unwrap();
        let names: Vec<&str> = cols.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(names, ["tenant", "type"], "each column read once");
        let values: [&[u8]; 2] = [b"acme", b"order.placed"];
        assert_eq!(t.render(|i| Some(values[i])).unwrap(), b"acme.order.placed.$acme");
        assert_eq!(
            t.render(|i| (i == 0).then_some(values[0])),
            Err(1),
            "a NULL column gives no name"
        );
        // Case is kept: the column is named as the catalog stores it.
        let (_, cols) = template("x-${TenantId}").unwrap();
        assert_eq!(cols[0].0.as_str(), "TenantId");
        let (t, cols) = template("static").unwrap();
        assert!(cols.is_empty());
        assert_eq!(t.render(|_| None).unwrap(), b"static");
    }

    #[test]
    fn malformed_templates_say_how_to_write_them() {
        for (text, hint) in [
            ("", "is empty"),
            ("${tenant", "unclosed"),
            ("a$b", "`$$`"),
            ("${}", "names no column"),
        ] {
            let err = template(text).unwrap_err().to_string();
            assert!(err.contains("route.topic") && err.contains(hint), "{text:?}: {err}");
        }
    }

    proptest! {
        #[test]
        fn unmatched_values_route_to_themselves(value in "[a-z]{1,20}") {
            // The regex needs a dot; a value without one does not match and stays the topic.
            let r = TopicRoute::new(r"(?<routedByValue>[^.]+)\..+", "${routedByValue}").unwrap();
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }
    }

    proptest! {
        #[test]
        fn default_router_is_identity(value in ".*") {
            let r = TopicRoute::new(DEFAULT_TOPIC_REGEX, DEFAULT_TOPIC_REPLACEMENT).unwrap();
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }

        #[test]
        fn the_default_rule_through_the_regex_is_identity_too(value in "(?s).{0,40}") {
            // Spelled differently, so the regex runs: it must agree with the shortcut, line
            // breaks (where `.*` does not match, and the value is kept as is) included.
            let via_regex = TopicRoute::new(DEFAULT_TOPIC_REGEX, "$routedByValue").unwrap();
            prop_assert!(!via_regex.is_identity());
            let routed = via_regex.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }

        #[test]
        fn the_template_shortcut_agrees_with_the_regex(
            lits in proptest::collection::vec("[a-z.$_{}-]{0,6}", 1..4),
            value in "(?s).{0,30}",
        ) {
            let replacement = lits.join(DEFAULT_TOPIC_REPLACEMENT);
            // A stray `${name}` of an unknown group is a config error, not a route.
            let Ok(fast) = TopicRoute::new(DEFAULT_TOPIC_REGEX, &replacement) else {
                return Ok(());
            };
            let mut slow = fast.clone();
            slow.template = None;
            // The shortcut takes only replacements whose every `$` is `${routedByValue}`.
            prop_assert_eq!(fast.template.is_some(), !lits.iter().any(|l| l.contains('$')));
            prop_assert_eq!(fast.route(&value), slow.route(&value));
        }

        #[test]
        fn prefix_router_takes_text_before_first_dot(head in "[a-z]{1,10}", tail in "[a-z.]{0,10}") {
            let r = TopicRoute::new(r"^(?<routedByValue>[^.]+)\..*$", "${routedByValue}").unwrap();
            let value = format!("{head}.{tail}");
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), head.as_str());
        }

        #[test]
        fn routing_never_panics(regex_src in "[a-z().*?<>]{0,12}", repl in "[a-z${}]{0,12}", value in ".{0,20}") {
            if let Ok(r) = TopicRoute::new(&regex_src, &repl) {
                let _ = r.route(&value);
            }
        }
    }
}
