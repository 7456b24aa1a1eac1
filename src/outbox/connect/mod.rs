//! Records in Debezium's format (`[debezium]`): an [`OutboxEvent`](super::event::OutboxEvent)
//! becomes the record Debezium 3.6's PostgreSQL connector, its Outbox EventRouter and Kafka
//! Connect's converters write for the same row — key, value, headers and partition, byte for
//! byte (the conformance suite, `tests/it/debezium.rs`, compares them with Debezium's own).
//!
//! - [`schema`] — Connect's schemas and values, `JsonConverter` / `StringConverter` / the binary
//!   converters;
//! - [`json`] — JSON text as Jackson writes it;
//! - [`expand`] — the `table.expand.json.payload` option;
//! - this file: the columns' Connect schemas ([`ConnectLayout`], built once per table shape from
//!   the column types and NOT NULL flags) and the EventRouter's record ([`ConnectLayout::render`]).
//!
//! Debezium's column schemas: `uuid` → string `io.debezium.data.Uuid`; `json`/`jsonb` → string
//! `io.debezium.data.Json`; `text`/`varchar`/`char` → string; `smallint`/`integer`/`bigint` →
//! int16/32/64; `boolean`; `bytea` → bytes. Optional unless the column is NOT NULL. Columns of
//! other types cannot be rendered through converters (a clear error when the layout is built).
//!
//! Invariant: without `[debezium]` there is no `ConnectLayout` and nothing here runs.

pub(crate) mod expand;
pub(crate) mod json;
pub(crate) mod schema;

use std::borrow::Cow;
use std::sync::Mutex;

use crate::config::debezium::{ConverterClass, DebeziumFormat, JsonNulls, Placement};
use crate::config::ident::{Ident, TableName};
use crate::config::outbox::OutboxMapping;
use crate::outbox::bad_event::BadEvent;

use self::expand::{Expanded, NullBehavior};
use self::schema::{Converter, DataError, Kind, Schema, Value};

/// What the layout needs to know of a column: its type (a domain's base type) and whether it is
/// NOT NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnFacts {
    pub(crate) type_oid: u32,
    pub(crate) not_null: bool,
}

/// A column's Connect schema, by `pg_type` OID; `None` for types Debezium renders in ways the
/// relay does not reproduce (timestamps, numerics, arrays, …).
fn column_schema(facts: ColumnFacts) -> Option<Schema> {
    let optional = !facts.not_null;
    Some(match facts.type_oid {
        16 => Schema::new(Kind::Boolean, optional),
        17 => Schema::new(Kind::Bytes, optional),
        20 => Schema::new(Kind::Int64, optional),
        21 => Schema::new(Kind::Int16, optional),
        23 => Schema::new(Kind::Int32, optional),
        25 | 1042 | 1043 => Schema::new(Kind::String, optional),
        114 | 3802 => Schema::named(Kind::String, optional, "io.debezium.data.Json", 1),
        2950 => Schema::named(Kind::String, optional, "io.debezium.data.Uuid", 1),
        _ => return None,
    })
}

/// Why a table's columns cannot be rendered in the configured format: fatal at session start,
/// naming the column and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[debezium]: column {column:?} of {table} ({role}): {problem}")]
pub struct ConnectLayoutError {
    /// The outbox table, as `"schema"."table"` (several may be configured).
    pub(crate) table: String,
    pub(crate) column: String,
    pub(crate) role: &'static str,
    pub(crate) problem: String,
}

#[derive(Debug)]
struct Column {
    name: String,
    schema: Schema,
}

/// How the events of one outbox table shape become Debezium's records.
#[derive(Debug)]
pub(crate) struct ConnectLayout {
    format: DebeziumFormat,
    key: Column,
    payload: Column,
    /// `mapping.placed`, in that order.
    placed: Vec<Column>,
    /// `<topic.prefix>.<schema>.<table>.`: the envelope schema's name before the routed value.
    envelope_prefix: String,
    /// Debezium names an envelope schema after the route-by value of the first event with that
    /// payload schema since its task started, and caches it: the same here, per session.
    envelope_names: Mutex<Vec<(Schema, String)>>,
}

impl ConnectLayout {
    /// The layout for the outbox table `table`, whose mapped columns have `facts` (looked up by name).
    pub(crate) fn new(
        format: &DebeziumFormat,
        mapping: &OutboxMapping,
        table: &TableName,
        facts: impl Fn(&Ident) -> Option<ColumnFacts>,
    ) -> Result<ConnectLayout, ConnectLayoutError> {
        // Errors name the table: with several outbox tables, one may be the one that does not fit.
        Self::build(format, mapping, table, facts).map_err(|e| ConnectLayoutError {
            table: table.to_string(),
            ..e
        })
    }

    fn build(
        format: &DebeziumFormat,
        mapping: &OutboxMapping,
        table: &TableName,
        facts: impl Fn(&Ident) -> Option<ColumnFacts>,
    ) -> Result<ConnectLayout, ConnectLayoutError> {
        let column = |ident: &Ident, role: &'static str| -> Result<Column, ConnectLayoutError> {
            let err = |problem: String| ConnectLayoutError {
                table: String::new(),
                column: ident.as_str().to_owned(),
                role,
                problem,
            };
            let f = facts(ident).ok_or_else(|| err("not in the table".into()))?;
            let schema = column_schema(f).ok_or_else(|| {
                err(format!(
                    "its type (OID {}) is not one Debezium's converters render as the relay reproduces \
                     (text, varchar, char, uuid, json, jsonb, smallint, integer, bigint, boolean, bytea)",
                    f.type_oid
                ))
            })?;
            Ok(Column {
                name: ident.as_str().to_owned(),
                schema,
            })
        };
        let id = column(&mapping.id, "event id")?;
        if !matches!(id.schema.kind, Kind::String | Kind::Int16 | Kind::Int32 | Kind::Int64) {
            return Err(ConnectLayoutError {
                table: String::new(),
                column: id.name,
                role: "event id",
                problem: "Connect's header converter renders this type differently from PostgreSQL; use a text, uuid or integer id".into(),
            });
        }
        let key = column(&mapping.key, "message key")?;
        let payload = column(&mapping.payload, "payload")?;
        let placed = mapping
            .placed
            .iter()
            .map(|c| column(c, "table.fields.additional.placement"))
            .collect::<Result<Vec<_>, _>>()?;
        check_converter(format.key, &key, "key.converter")?;
        if format.envelope().next().is_none() {
            check_converter(format.value, &payload, "value.converter")?;
        }
        for f in &format.additional {
            let col = placed
                .iter()
                .find(|c| c.name == f.column.as_str())
                .ok_or_else(|| ConnectLayoutError {
                    table: String::new(),
                    column: f.column.as_str().to_owned(),
                    role: "table.fields.additional.placement",
                    problem: "not read (internal: placed columns out of sync)".into(),
                })?;
            let problem = match (f.placement, &col.schema.kind) {
                (Placement::Partition, Kind::Int32) => None,
                (Placement::Partition, _) => {
                    Some("a partition placement needs an integer (int4) column, as Debezium reads it with getInt32")
                }
                (_, Kind::Bytes) => {
                    Some("a bytea column cannot be placed (Connect renders it as base64); place a text column")
                }
                _ => None,
            };
            if let Some(problem) = problem {
                return Err(ConnectLayoutError {
                    table: String::new(),
                    column: col.name.clone(),
                    role: "table.fields.additional.placement",
                    problem: problem.into(),
                });
            }
        }
        // Each outbox table has its own envelope names, as Debezium's per-table schemas do.
        let envelope_prefix = format!(
            "{}.{}.{}.",
            format.topic_prefix.as_deref().unwrap_or_default(),
            table.schema.as_str(),
            table.name.as_str()
        );
        Ok(ConnectLayout {
            format: format.clone(),
            key,
            payload,
            placed,
            envelope_prefix,
            envelope_names: Mutex::new(Vec::new()),
        })
    }

    /// Debezium's record of an event whose key, payload and placed columns are `key`, `payload`
    /// (`None` for NULL) and `placed` (in `mapping.placed` order, `None` for NULL), routed by
    /// `route_value`. An event Debezium's task would fail on is a [`BadEvent::Debezium`].
    pub(crate) fn render(
        &self,
        key: &[u8],
        payload: Option<&[u8]>,
        placed: &[Option<Cow<'_, [u8]>>],
        route_value: &str,
    ) -> Result<Rendered, BadEvent> {
        let bad = |e: DataError| BadEvent::Debezium(e.0);
        let key_value = text_value(&self.key, Some(key))?;
        let key = converter(self.format.key)
            .serialize(Some(&self.key.schema), &key_value)
            .map_err(bad)?
            .unwrap_or_default();
        let placed_values = self
            .placed
            .iter()
            .zip(placed)
            .map(|(c, v)| text_value(c, v.as_deref()))
            .collect::<Result<Vec<_>, _>>()?;
        let value_of = |column: &Ident| {
            self.placed
                .iter()
                .position(|c| c.name == column.as_str())
                .map(|i| (&self.placed[i], &placed_values[i]))
        };

        let mut headers = Vec::new();
        let mut partition = None;
        for f in &self.format.additional {
            let Some((_, v)) = value_of(&f.column) else { continue };
            match f.placement {
                Placement::Header => headers.push((f.alias.clone(), header_bytes(v))),
                Placement::Partition => {
                    if let Value::Int(p) = v {
                        partition = i32::try_from(*p).ok();
                    }
                }
                Placement::Envelope => {}
            }
        }

        let (payload_schema, payload_value) = self.payload_value(payload)?;
        let is_delete = match &payload_value {
            Value::Null => true,
            Value::String(s) => s.trim_matches(|c: char| c <= ' ').is_empty(),
            _ => false,
        };
        let value = if is_delete && self.format.tombstone_on_empty_payload {
            None
        } else if self.format.envelope().next().is_none() {
            converter(self.format.value)
                .serialize(payload_schema.as_ref(), &payload_value)
                .map_err(bad)?
        } else {
            let payload_schema = payload_schema.ok_or_else(|| {
                BadEvent::Debezium(
                    "Debezium cannot build an envelope around a payload whose schema its expansion dropped (`[]`)"
                        .into(),
                )
            })?;
            let mut fields = vec![("payload".to_owned(), payload_schema.clone())];
            let mut values = vec![payload_value];
            for f in self.format.envelope() {
                if let Some((c, v)) = value_of(&f.column) {
                    fields.push((f.alias.clone(), c.schema.clone()));
                    values.push(v.clone());
                }
            }
            let schema = Schema {
                kind: Kind::Struct(fields),
                optional: false,
                name: Some(self.envelope_name(&payload_schema, route_value)),
                version: None,
            };
            converter(self.format.value)
                .serialize(Some(&schema), &Value::Struct(values))
                .map_err(bad)?
        };
        Ok(Rendered {
            key,
            value,
            headers,
            partition,
        })
    }

    /// The payload's schema and value, expanded when configured.
    fn payload_value<'p>(&self, payload: Option<&'p [u8]>) -> Result<(Option<Schema>, Value<'p>), BadEvent> {
        let value = text_value(&self.payload, payload)?;
        let column_schema = Some(self.payload.schema.clone());
        let Value::String(text) = &value else {
            return Ok((column_schema, value));
        };
        if !self.format.expand_json_payload {
            return Ok((column_schema, value));
        }
        let nulls = match self.format.json_nulls {
            JsonNulls::Ignore => NullBehavior::Ignore,
            JsonNulls::OptionalBytes => NullBehavior::OptionalBytes,
        };
        let text: &'p str = match text {
            Cow::Borrowed(t) => t,
            Cow::Owned(_) => return Ok((column_schema, value)),
        };
        match expand::expand(text, &self.payload.name, nulls) {
            Expanded::Struct(schema, v) => Ok((Some(schema), v)),
            Expanded::Kept { schema_lost: false } => Ok((column_schema, value)),
            Expanded::Kept { schema_lost: true } => Ok((None, value)),
            Expanded::Fails(why) => Err(BadEvent::Debezium(format!(
                "\"table.expand.json.payload\": {why}; Debezium's Connect task stops on this payload"
            ))),
        }
    }

    fn envelope_name(&self, payload_schema: &Schema, route_value: &str) -> String {
        let mut names = self.envelope_names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, name)) = names.iter().find(|(s, _)| s == payload_schema) {
            return name.clone();
        }
        let name = format!("{}{route_value}.Value", self.envelope_prefix);
        names.push((payload_schema.clone(), name.clone()));
        name
    }
}

/// Layouts are compared by identity: two events have the same format when they share one.
impl PartialEq for ConnectLayout {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for ConnectLayout {}

/// Key, value, placed headers and partition of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    pub(crate) key: Vec<u8>,
    /// `None`: a null value (a tombstone, or a NULL payload under `StringConverter`).
    pub(crate) value: Option<Vec<u8>>,
    /// After `id`, in placement order.
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) partition: Option<i32>,
}

fn converter(class: ConverterClass) -> Converter {
    match class {
        ConverterClass::String => Converter::String,
        ConverterClass::Json { schemas } => Converter::Json { schemas },
        ConverterClass::Bytes => Converter::Bytes,
    }
}

/// Refuses a converter that cannot write `column`'s values as a record (Debezium would write
/// `[B@1b6d3586` or fail every event).
fn check_converter(class: ConverterClass, column: &Column, option: &str) -> Result<(), ConnectLayoutError> {
    let problem = match (class, &column.schema.kind) {
        (ConverterClass::String, Kind::Bytes) => Some(format!(
            "{option} StringConverter writes Java's toString() of a byte array (`[B@1b6d3586`), not the bytes; \
             use io.debezium.converters.BinaryDataConverter"
        )),
        (ConverterClass::Bytes, kind) if *kind != Kind::Bytes => Some(format!(
            "{option} is a binary converter, which fails on a non-bytea column; make the column bytea or use \
             StringConverter / JsonConverter"
        )),
        _ => None,
    };
    match problem {
        Some(problem) => Err(ConnectLayoutError {
            table: String::new(),
            column: column.name.clone(),
            role: if option == "key.converter" {
                "message key"
            } else {
                "payload"
            },
            problem,
        }),
        None => Ok(()),
    }
}

/// The Connect value of a column's text (`None` = NULL). Text columns must be UTF-8.
fn text_value<'t>(column: &Column, text: Option<&'t [u8]>) -> Result<Value<'t>, BadEvent> {
    let Some(bytes) = text else { return Ok(Value::Null) };
    let as_str = || {
        std::str::from_utf8(bytes).map_err(|_| BadEvent::NotUtf8 {
            column: column.name.clone(),
            role: "converted by [debezium]",
        })
    };
    let unparsable = || {
        BadEvent::Debezium(format!(
            "column {:?}: {:?} is not a {:?}",
            column.name,
            String::from_utf8_lossy(bytes),
            column.schema.kind
        ))
    };
    Ok(match column.schema.kind {
        Kind::Bytes => Value::Bytes(Cow::Borrowed(bytes)),
        Kind::Boolean => match bytes {
            b"t" => Value::Boolean(true),
            b"f" => Value::Boolean(false),
            _ => return Err(unparsable()),
        },
        Kind::Int16 | Kind::Int32 | Kind::Int64 => Value::Int(as_str()?.parse().map_err(|_| unparsable())?),
        _ => Value::String(Cow::Borrowed(as_str()?)),
    })
}

/// A header's bytes as Connect's `SimpleHeaderConverter` writes a primitive.
fn header_bytes(v: &Value<'_>) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        Value::Boolean(b) => Some(b.to_string().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Float64(f) => {
            let mut out = Vec::new();
            json::double(&mut out, *f);
            Some(out)
        }
        Value::Bytes(b) => Some(b.to_vec()),
        Value::Array(_) | Value::Struct(_) => None,
    }
}

#[cfg(test)]
mod tests {
    //! The layout's checks and the EventRouter's record; byte-level agreement with Debezium
    //! itself is the conformance suite's (`tests/it/debezium.rs`).

    use super::*;
    use crate::config::test_support::settings;

    const UUID: u32 = 2950;
    const VARCHAR: u32 = 1043;
    const JSONB: u32 = 3802;
    const BYTEA: u32 = 17;
    const INT4: u32 = 23;
    const TIMESTAMPTZ: u32 = 1184;

    /// A Debezium sample table: uuid id, varchar key and route, jsonb payload, int4 shard.
    fn layout(section: &str, payload_type: u32) -> Result<ConnectLayout, ConnectLayoutError> {
        layout_of("public.outbox", section, payload_type)
    }

    /// [`layout`] for the outbox table `table` (as `outbox.table` writes it).
    fn layout_of(table: &str, section: &str, payload_type: u32) -> Result<ConnectLayout, ConnectLayoutError> {
        let s = settings(&format!(
            "[outbox]\ntable = \"{table}\"\nkey_column = \"aggregateid\"\nroute_by_column = \"aggregatetype\"\n\
             [debezium]\n{section}"
        ));
        let format = s.debezium.clone().expect("[debezium]");
        ConnectLayout::new(&format, &s.outbox, &s.outbox.tables[0], |c| {
            let (type_oid, not_null) = match c.as_str() {
                "id" => (UUID, true),
                "aggregateid" | "aggregatetype" | "type" => (VARCHAR, true),
                "payload" => (payload_type, false),
                "shard" => (INT4, false),
                "created_at" => (TIMESTAMPTZ, true),
                _ => return None,
            };
            Some(ColumnFacts { type_oid, not_null })
        })
    }

    fn render(
        l: &ConnectLayout,
        payload: Option<&str>,
        placed: &[Option<&str>],
        route: &str,
    ) -> Result<Rendered, BadEvent> {
        let placed: Vec<Option<Cow<'_, [u8]>>> =
            placed.iter().map(|p| p.map(|t| Cow::Borrowed(t.as_bytes()))).collect();
        l.render(b"a-1", payload.map(str::as_bytes), &placed, route)
    }

    fn text(b: &Option<Vec<u8>>) -> &str {
        std::str::from_utf8(b.as_deref().unwrap_or(b"<null>")).unwrap()
    }

    #[test]
    fn converters_that_cannot_write_a_column_are_refused_naming_it() {
        for (section, payload_type, named) in [
            (
                "\"value.converter\" = \"org.apache.kafka.connect.storage.StringConverter\"",
                BYTEA,
                "BinaryDataConverter",
            ),
            (
                "\"value.converter\" = \"io.debezium.converters.BinaryDataConverter\"",
                JSONB,
                "fails on a non-bytea column",
            ),
            (
                "\"table.fields.additional.placement\" = \"aggregatetype:partition\"",
                JSONB,
                "integer (int4)",
            ),
            (
                "\"table.fields.additional.placement\" = \"created_at:header\"",
                JSONB,
                "OID 1184",
            ),
            (
                "\"table.fields.additional.placement\" = \"nope:header\"",
                JSONB,
                "not in the table",
            ),
        ] {
            let err = layout(section, payload_type).unwrap_err();
            assert!(err.to_string().contains(named), "{section}: {err}");
        }
        let other = layout_of(
            "billing.outbox",
            "\"table.fields.additional.placement\" = \"nope:header\"",
            JSONB,
        )
        .unwrap_err();
        assert!(
            other.to_string().contains(r#"column "nope" of "billing"."outbox""#),
            "the error names the table: {other}"
        );
    }

    #[test]
    fn schemas_follow_column_types_and_not_null() {
        let l = layout("", JSONB).unwrap();
        let r = render(&l, Some("{\"a\": 1}"), &[], "order").unwrap();
        assert_eq!(
            text(&Some(r.key)),
            r#"{"schema":{"type":"string","optional":false},"payload":"a-1"}"#
        );
        assert_eq!(
            text(&r.value),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\": 1}"}"#
        );
        // A NULL payload is an event: the schema with a null payload.
        let null = render(&l, None, &[], "order").unwrap();
        assert_eq!(
            text(&null.value),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#
        );
    }

    #[test]
    fn tombstones_for_null_and_blank_payloads_only_when_asked() {
        let l = layout(
            "\"value.converter\" = \"org.apache.kafka.connect.storage.StringConverter\"\n\
             \"route.tombstone.on.empty.payload\" = true",
            JSONB,
        )
        .unwrap();
        assert_eq!(render(&l, None, &[], "order").unwrap().value, None);
        assert_eq!(render(&l, Some(" \t"), &[], "order").unwrap().value, None);
        assert_eq!(text(&render(&l, Some("{}"), &[], "order").unwrap().value), "{}");
    }

    #[test]
    fn placements_headers_partition_and_an_envelope_named_after_the_first_routed_value() {
        let l = layout(
            "\"table.fields.additional.placement\" = \"type:header:eventType,type:envelope:etype,shard:partition\"\n\
             \"value.converter.schemas.enable\" = false\n",
            JSONB,
        )
        .unwrap();
        let r = render(&l, Some("{}"), &[Some("created"), Some("3")], "order").unwrap();
        assert_eq!(r.headers, [("eventType".to_owned(), Some(b"created".to_vec()))]);
        assert_eq!(r.partition, Some(3));
        assert_eq!(text(&r.value), r#"{"payload":"{}","etype":"created"}"#);
        // A NULL partition column leaves the partition to the partitioner.
        assert_eq!(
            render(&l, Some("{}"), &[Some("created"), None], "order")
                .unwrap()
                .partition,
            None
        );
        // NULL in a NOT NULL envelope field: Connect refuses it, as Debezium's task would.
        assert_eq!(
            render(&l, Some("{}"), &[None, None], "order").unwrap_err().label(),
            "debezium_format"
        );

        let named = layout(
            "\"table.fields.additional.placement\" = \"type:envelope\"\n\"topic.prefix\" = \"shop\"\n",
            JSONB,
        )
        .unwrap();
        let name_of = |route: &str| {
            let r = render(&named, Some("{}"), &[Some("x")], route).unwrap();
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            v["schema"]["name"].as_str().unwrap().to_owned()
        };
        // Debezium caches the envelope schema per payload schema, named after the first event.
        assert_eq!(name_of("order"), "shop.public.outbox.order.Value");
        assert_eq!(name_of("customer"), "shop.public.outbox.order.Value");

        // Each outbox table names its envelopes after itself, as Debezium's per-table schemas do.
        for table in ["sales.outbox", "billing.outbox"] {
            let of_table = layout_of(
                table,
                "\"table.fields.additional.placement\" = \"type:envelope\"\n\"topic.prefix\" = \"shop\"\n",
                JSONB,
            )
            .unwrap();
            let r = render(&of_table, Some("{}"), &[Some("x")], "order").unwrap();
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            assert_eq!(v["schema"]["name"], format!("shop.{table}.order.Value"));
        }
    }

    #[test]
    fn rows_debeziums_task_stops_on_are_bad_events() {
        let l = layout("\"table.expand.json.payload\" = true", JSONB).unwrap();
        for payload in ["[1, 2]", "{\"big\": 12345678901234567890123}"] {
            let err = render(&l, Some(payload), &[], "order").unwrap_err();
            assert_eq!(err.label(), "debezium_format", "{payload}: {err}");
        }
        // Kept as a string where Debezium keeps it.
        let kept = render(&l, Some("{\"m\": [1, \"x\"]}"), &[], "order").unwrap();
        assert!(
            text(&kept.value).contains(r#""payload":"{\"m\": [1, \"x\"]}""#),
            "{}",
            text(&kept.value)
        );
    }
}
