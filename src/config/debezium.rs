//! `[debezium]`: write records byte for byte as a Debezium 3.6 PostgreSQL connector with the
//! Outbox EventRouter and Kafka Connect's converters writes them, for consumers that read what
//! Debezium wrote.
//!
//! Keys are Debezium / Kafka Connect property names verbatim (quoted TOML keys), so they are
//! pasted from the connector config (`outbox-relay import-debezium` writes them):
//!
//! ```toml
//! [debezium]
//! "key.converter" = "org.apache.kafka.connect.storage.StringConverter"
//! "value.converter" = "org.apache.kafka.connect.json.JsonConverter"
//! "value.converter.schemas.enable" = false
//! "table.expand.json.payload" = true
//! ```
//!
//! Without the section nothing changes: the record is the columns' text. With it, a converter
//! left out is Kafka Connect's usual worker default, `JsonConverter` with schemas enabled.
//! Combinations whose Debezium output is not a usable record (Java's `toString()` of a struct or
//! a byte array) are refused here, naming the option to change; those that depend on column
//! types are checked when the outbox table's columns are known (`outbox::connect`).

use std::collections::BTreeMap;

use crate::config::ident::Ident;
use crate::config::{named, ConfigError};

const KEY: &str = "debezium";

/// The keys this section understands, with what they do (for the unknown-key error).
const KNOWN: &[&str] = &[
    "key.converter",
    "key.converter.schemas.enable",
    "value.converter",
    "value.converter.schemas.enable",
    "header.converter",
    "table.expand.json.payload",
    "table.json.payload.null.behavior",
    "table.fields.additional.placement",
    "route.tombstone.on.empty.payload",
    "topic.prefix",
];

pub(crate) const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
pub(crate) const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
pub(crate) const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";
pub(crate) const BYTE_ARRAY_CONVERTER: &str = "org.apache.kafka.connect.converters.ByteArrayConverter";
const SIMPLE_HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";

/// A `key.converter` / `value.converter` class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConverterClass {
    /// `StringConverter`.
    String,
    /// `JsonConverter`, with `schemas.enable`.
    Json { schemas: bool },
    /// `BinaryDataConverter` or `ByteArrayConverter`: bytes as they are.
    Bytes,
}

/// Where an additional column goes (`table.fields.additional.placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A header named by the alias.
    Header,
    /// A field of the value, beside `payload` (the value becomes a struct).
    Envelope,
    /// The record's partition (an `integer` column).
    Partition,
}

/// One `column:placement[:alias]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdditionalField {
    pub(crate) column: Ident,
    pub(crate) placement: Placement,
    /// The header or envelope field name (the column's name unless given).
    pub(crate) alias: String,
}

/// `table.json.payload.null.behavior`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum JsonNulls {
    #[default]
    Ignore,
    OptionalBytes,
}

/// The validated `[debezium]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebeziumFormat {
    pub(crate) key: ConverterClass,
    pub(crate) value: ConverterClass,
    pub(crate) expand_json_payload: bool,
    pub(crate) json_nulls: JsonNulls,
    pub(crate) additional: Vec<AdditionalField>,
    pub(crate) tombstone_on_empty_payload: bool,
    /// The connector's `topic.prefix`: Debezium names an envelope value's schema
    /// `<topic.prefix>.<schema>.<table>.<routed value>.Value`.
    pub(crate) topic_prefix: Option<String>,
}

impl DebeziumFormat {
    /// The envelope placements (the value is a struct when there is one).
    pub(crate) fn envelope(&self) -> impl Iterator<Item = &AdditionalField> {
        self.additional.iter().filter(|f| f.placement == Placement::Envelope)
    }

    /// The columns the placements read, each once, in placement order.
    pub(crate) fn columns(&self) -> Vec<Ident> {
        let mut out: Vec<Ident> = Vec::new();
        for f in &self.additional {
            if !out.contains(&f.column) {
                out.push(f.column.clone());
            }
        }
        out
    }
}

fn invalid(key: &'static str, message: String) -> ConfigError {
    ConfigError::Invalid { key, message }
}

/// A string or boolean value as Connect reads one (`true`, `"true"`, case-insensitive).
fn boolean(key: &'static str, v: &toml::Value) -> Result<bool, ConfigError> {
    match v {
        toml::Value::Boolean(b) => Ok(*b),
        toml::Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Ok(true),
        toml::Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Ok(false),
        other => Err(invalid(key, format!("expected true or false, got {other}"))),
    }
}

fn string<'v>(key: &'static str, v: &'v toml::Value) -> Result<&'v str, ConfigError> {
    v.as_str()
        .map(str::trim)
        .ok_or_else(|| invalid(key, format!("expected a string, got {v}")))
}

fn converter(
    key: &'static str,
    class: Option<&toml::Value>,
    schemas_key: &'static str,
    schemas: Option<&toml::Value>,
) -> Result<ConverterClass, ConfigError> {
    let class = class.map(|v| string(key, v)).transpose()?.unwrap_or(JSON_CONVERTER);
    let schemas = schemas.map(|v| boolean(schemas_key, v)).transpose()?;
    let parsed = match class {
        JSON_CONVERTER => ConverterClass::Json {
            schemas: schemas.unwrap_or(true),
        },
        STRING_CONVERTER => ConverterClass::String,
        BINARY_DATA_CONVERTER | BYTE_ARRAY_CONVERTER => ConverterClass::Bytes,
        other => {
            return Err(invalid(
                key,
                format!(
                    "converter {other:?} is not supported; use one of {STRING_CONVERTER}, {JSON_CONVERTER}, \
                     {BINARY_DATA_CONVERTER} or {BYTE_ARRAY_CONVERTER} (schema-registry converters such as Avro \
                     or Protobuf need a registry the relay does not talk to)"
                ),
            ))
        }
    };
    if schemas.is_some() && !matches!(parsed, ConverterClass::Json { .. }) {
        return Err(invalid(
            schemas_key,
            format!("only JsonConverter has schemas; remove it or set the converter to {JSON_CONVERTER}"),
        ));
    }
    Ok(parsed)
}

/// `table.fields.additional.placement`: `column:placement[:alias]`, comma-separated, as
/// Debezium parses it (entries trimmed, placement case-insensitive).
fn placements(v: &toml::Value) -> Result<Vec<AdditionalField>, ConfigError> {
    const K: &str = "debezium.\"table.fields.additional.placement\"";
    let text = string(K, v)?;
    let mut out = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(invalid(
                K,
                format!("{entry:?} is not column:placement or column:placement:alias"),
            ));
        }
        // Debezium names columns by their exact name (Connect field names), not SQL identifiers.
        let column = Ident::exact(K, parts[0]).map_err(named(K))?;
        let placement = match parts[1].to_ascii_lowercase().as_str() {
            "header" => Placement::Header,
            "envelope" => Placement::Envelope,
            "partition" => Placement::Partition,
            other => {
                return Err(invalid(
                    K,
                    format!("{entry:?}: placement {other:?} is not header, envelope or partition"),
                ))
            }
        };
        let alias = parts.get(2).map_or_else(|| parts[0].to_owned(), |a| (*a).to_owned());
        if alias.is_empty() {
            return Err(invalid(K, format!("{entry:?}: the alias is empty")));
        }
        out.push(AdditionalField {
            column,
            placement,
            alias,
        });
    }
    if out.iter().filter(|f| f.placement == Placement::Partition).count() > 1 {
        return Err(invalid(K, "more than one column is placed as the partition".into()));
    }
    Ok(out)
}

/// Validates the raw `[debezium]` table (keys as written, verbatim property names).
pub(crate) fn validate(section: &BTreeMap<String, toml::Value>) -> Result<DebeziumFormat, ConfigError> {
    if let Some(unknown) = section.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(invalid(
            KEY,
            format!(
                "unknown key {unknown:?}; supported keys are {} (quote them: \"key.converter\" = …). \
                 Connector options with no effect on the record bytes belong elsewhere: \
                 `outbox-relay import-debezium` maps a whole connector config",
                KNOWN.join(", ")
            ),
        ));
    }
    let get = |k: &str| section.get(k);
    if let Some(h) = get("header.converter") {
        if string("debezium.\"header.converter\"", h)? != SIMPLE_HEADER_CONVERTER {
            return Err(invalid(
                "debezium.\"header.converter\"",
                format!("only {SIMPLE_HEADER_CONVERTER} (Kafka Connect's default) is supported"),
            ));
        }
    }
    let key = converter(
        "debezium.\"key.converter\"",
        get("key.converter"),
        "debezium.\"key.converter.schemas.enable\"",
        get("key.converter.schemas.enable"),
    )?;
    let value = converter(
        "debezium.\"value.converter\"",
        get("value.converter"),
        "debezium.\"value.converter.schemas.enable\"",
        get("value.converter.schemas.enable"),
    )?;
    let expand_json_payload = get("table.expand.json.payload")
        .map(|v| boolean("debezium.\"table.expand.json.payload\"", v))
        .transpose()?
        .unwrap_or(false);
    let json_nulls = match get("table.json.payload.null.behavior")
        .map(|v| string("debezium.\"table.json.payload.null.behavior\"", v))
        .transpose()?
    {
        None => JsonNulls::Ignore,
        Some(s) if s.eq_ignore_ascii_case("ignore") => JsonNulls::Ignore,
        Some(s) if s.eq_ignore_ascii_case("optional_bytes") => JsonNulls::OptionalBytes,
        Some(other) => {
            return Err(invalid(
                "debezium.\"table.json.payload.null.behavior\"",
                format!("{other:?} is not ignore or optional_bytes"),
            ))
        }
    };
    let additional = get("table.fields.additional.placement")
        .map(placements)
        .transpose()?
        .unwrap_or_default();
    let tombstone_on_empty_payload = get("route.tombstone.on.empty.payload")
        .map(|v| boolean("debezium.\"route.tombstone.on.empty.payload\"", v))
        .transpose()?
        .unwrap_or(false);
    let topic_prefix = get("topic.prefix")
        .map(|v| string("debezium.\"topic.prefix\"", v).map(str::to_owned))
        .transpose()?;
    let format = DebeziumFormat {
        key,
        value,
        expand_json_payload,
        json_nulls,
        additional,
        tombstone_on_empty_payload,
        topic_prefix,
    };
    refuse_unusable(&format)?;
    Ok(format)
}

/// Combinations where Debezium writes Java's `toString()` of a struct, or cannot write at all.
fn refuse_unusable(f: &DebeziumFormat) -> Result<(), ConfigError> {
    let envelope = f.envelope().next().is_some();
    match f.value {
        ConverterClass::String if f.expand_json_payload => Err(invalid(
            "debezium.\"value.converter\"",
            "StringConverter with \"table.expand.json.payload\" = true makes Debezium write Connect's \
             Struct.toString() (`Struct{a=1}`), not JSON; use JsonConverter, or turn expansion off"
                .into(),
        )),
        ConverterClass::String | ConverterClass::Bytes if envelope => Err(invalid(
            "debezium.\"table.fields.additional.placement\"",
            "an envelope placement makes the value a struct, which only JsonConverter writes as a record \
             (StringConverter writes Struct.toString(), the binary converters fail); use JsonConverter for \
             the value or place the columns as headers"
                .into(),
        )),
        ConverterClass::Json { schemas: true } if envelope && f.topic_prefix.is_none() => Err(invalid(
            "debezium.\"topic.prefix\"",
            "an envelope placement with schemas enabled names the value's schema after the connector's \
             topic.prefix (`<topic.prefix>.<schema>.<table>.<routed value>.Value`): copy \"topic.prefix\" \
             from the connector config"
                .into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::load;

    use super::*;

    fn format(body: &str) -> Result<DebeziumFormat, String> {
        load(&format!("[debezium]\n{body}"), &[])
            .map(|s| s.debezium.expect("section present"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn absent_section_changes_nothing() {
        assert!(load("", &[]).unwrap().debezium.is_none());
    }

    #[test]
    fn defaults_are_connects_json_converter_with_schemas() {
        let f = format("").unwrap();
        assert_eq!(f.key, ConverterClass::Json { schemas: true });
        assert_eq!(f.value, ConverterClass::Json { schemas: true });
        assert!(!f.expand_json_payload && !f.tombstone_on_empty_payload);
        assert_eq!(f.json_nulls, JsonNulls::Ignore);
    }

    #[test]
    fn verbatim_keys_parse() {
        let f = format(
            "\"key.converter\" = \"org.apache.kafka.connect.storage.StringConverter\"\n\
             \"value.converter\" = \"org.apache.kafka.connect.json.JsonConverter\"\n\
             \"value.converter.schemas.enable\" = \"false\"\n\
             \"table.expand.json.payload\" = true\n\
             \"table.json.payload.null.behavior\" = \"OPTIONAL_BYTES\"\n\
             \"route.tombstone.on.empty.payload\" = \"true\"\n\
             \"table.fields.additional.placement\" = \"type:header:eventType, aggregatetype:envelope , shard:PARTITION\"\n",
        )
        .unwrap();
        assert_eq!(f.key, ConverterClass::String);
        assert_eq!(f.value, ConverterClass::Json { schemas: false });
        assert!(f.expand_json_payload && f.tombstone_on_empty_payload);
        assert_eq!(f.json_nulls, JsonNulls::OptionalBytes);
        let placed: Vec<(&str, Placement, &str)> = f
            .additional
            .iter()
            .map(|a| (a.column.as_str(), a.placement, a.alias.as_str()))
            .collect();
        assert_eq!(
            placed,
            [
                ("type", Placement::Header, "eventType"),
                ("aggregatetype", Placement::Envelope, "aggregatetype"),
                ("shard", Placement::Partition, "shard"),
            ]
        );
    }

    #[test]
    fn environment_overrides_take_the_dotted_name_with_underscores() {
        let s = load(
            "[debezium]\n",
            &[
                ("OUTBOX_RELAY__DEBEZIUM__VALUE_CONVERTER_SCHEMAS_ENABLE", "false"),
                ("OUTBOX_RELAY__DEBEZIUM__TABLE_EXPAND_JSON_PAYLOAD", "true"),
            ],
        )
        .unwrap();
        let f = s.debezium.unwrap();
        assert_eq!(f.value, ConverterClass::Json { schemas: false });
        assert!(f.expand_json_payload);
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        let cases = [
            ("\"value.converter\" = \"io.confluent.connect.avro.AvroConverter\"", "not supported"),
            ("\"key.converter.schema.enable\" = false", "unknown key \"key.converter.schema.enable\""),
            (
                "\"value.converter\" = \"org.apache.kafka.connect.storage.StringConverter\"\n\"value.converter.schemas.enable\" = true",
                "only JsonConverter has schemas",
            ),
            (
                "\"value.converter\" = \"org.apache.kafka.connect.storage.StringConverter\"\n\"table.expand.json.payload\" = true",
                "Struct.toString()",
            ),
            ("\"table.fields.additional.placement\" = \"type:envelope\"", "topic.prefix"),
            ("\"table.fields.additional.placement\" = \"type:body\"", "not header, envelope or partition"),
            ("\"table.fields.additional.placement\" = \"a:partition,b:partition\"", "more than one"),
            ("\"table.expand.json.payload\" = \"yes\"", "expected true or false"),
            ("\"table.json.payload.null.behavior\" = \"keep\"", "not ignore or optional_bytes"),
            ("\"header.converter\" = \"x.Y\"", "SimpleHeaderConverter"),
        ];
        for (body, want) in cases {
            let err = format(body).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
    }
}
