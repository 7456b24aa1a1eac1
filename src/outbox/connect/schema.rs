//! The part of Kafka Connect's data model a Debezium outbox record uses: schemas (type,
//! optional, name, version; struct fields, array items) and values, and how `JsonConverter` and
//! `StringConverter` serialize them.
//!
//! Invariant: a value is only ever serialized with the schema it was built for; the JSON of a
//! schema and of a value is byte-identical to Connect 4.3's (`JsonConverter.asJsonSchema` /
//! `convertToJson`), which the conformance suite checks against Debezium itself.

use std::borrow::Cow;

use super::json;

/// A Connect schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Schema {
    pub(crate) kind: Kind,
    pub(crate) optional: bool,
    /// Logical or struct name (`io.debezium.data.Json`, a struct's name).
    pub(crate) name: Option<String>,
    pub(crate) version: Option<i32>,
}

/// A Connect schema type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Int16,
    Int32,
    Int64,
    Float64,
    Boolean,
    String,
    Bytes,
    Array(Box<Schema>),
    /// Fields in order: (name, schema).
    Struct(Vec<(String, Schema)>),
}

impl Schema {
    pub(crate) const fn new(kind: Kind, optional: bool) -> Schema {
        Schema {
            kind,
            optional,
            name: None,
            version: None,
        }
    }

    /// A schema with a logical name and version (Debezium's semantic types).
    pub(crate) fn named(kind: Kind, optional: bool, name: &str, version: i32) -> Schema {
        Schema {
            kind,
            optional,
            name: Some(name.to_owned()),
            version: Some(version),
        }
    }

    fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Int16 => "int16",
            Kind::Int32 => "int32",
            Kind::Int64 => "int64",
            Kind::Float64 => "float64",
            Kind::Boolean => "boolean",
            Kind::String => "string",
            Kind::Bytes => "bytes",
            Kind::Array(_) => "array",
            Kind::Struct(_) => "struct",
        }
    }

    /// Appends the schema's JSON as `JsonConverter.asJsonSchema` writes it; `field` is the
    /// field name when the schema is a struct field's (written last, as Connect does).
    pub(crate) fn write_json(&self, out: &mut Vec<u8>, field: Option<&str>) {
        out.extend_from_slice(b"{\"type\":");
        json::string(out, self.type_name());
        match &self.kind {
            Kind::Struct(fields) => {
                out.extend_from_slice(b",\"fields\":[");
                for (i, (name, schema)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    schema.write_json(out, Some(name));
                }
                out.push(b']');
            }
            Kind::Array(items) => {
                out.extend_from_slice(b",\"items\":");
                items.write_json(out, None);
            }
            _ => {}
        }
        out.extend_from_slice(if self.optional {
            b",\"optional\":true"
        } else {
            b",\"optional\":false"
        });
        if let Some(name) = &self.name {
            out.extend_from_slice(b",\"name\":");
            json::string(out, name);
        }
        if let Some(version) = self.version {
            out.extend_from_slice(format!(",\"version\":{version}").as_bytes());
        }
        if let Some(field) = field {
            out.extend_from_slice(b",\"field\":");
            json::string(out, field);
        }
        out.push(b'}');
    }
}

/// A Connect value, shaped by its [`Schema`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    Null,
    Boolean(bool),
    /// Any of the integer types.
    Int(i64),
    Float64(f64),
    String(Cow<'a, str>),
    Bytes(Cow<'a, [u8]>),
    Array(Vec<Value<'a>>),
    /// Field values in the schema's field order (`Null` for a field the value lacks).
    Struct(Vec<Value<'a>>),
}

/// Why Connect refuses to serialize a value (its task would fail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DataError(pub(crate) String);

impl Value<'_> {
    /// Appends the value's JSON as `JsonConverter.convertToJson` writes it for `schema`.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>, schema: &Schema) -> Result<(), DataError> {
        match (self, &schema.kind) {
            (Value::Null, _) if schema.optional => out.extend_from_slice(b"null"),
            (Value::Null, _) => {
                return Err(DataError(
                    "Conversion error: null value for field that is required and has no default value".into(),
                ))
            }
            (Value::Boolean(b), Kind::Boolean) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            (Value::Int(i), Kind::Int16 | Kind::Int32 | Kind::Int64) => out.extend_from_slice(i.to_string().as_bytes()),
            (Value::Float64(f), Kind::Float64) => json::double(out, *f),
            (Value::String(s), Kind::String) => json::string(out, s),
            (Value::Bytes(b), Kind::Bytes) => json::base64(out, b),
            (Value::Array(items), Kind::Array(item_schema)) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_json(out, item_schema)?;
                }
                out.push(b']');
            }
            (Value::Struct(values), Kind::Struct(fields)) => {
                out.push(b'{');
                for (i, ((name, field_schema), value)) in fields.iter().zip(values).enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    json::string(out, name);
                    out.push(b':');
                    value.write_json(out, field_schema)?;
                }
                out.push(b'}');
            }
            (value, _) => {
                return Err(DataError(format!(
                    "Invalid type for {}: {}",
                    schema.type_name().to_uppercase(),
                    value.java_class()
                )))
            }
        }
        Ok(())
    }

    fn java_class(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Boolean(_) => "class java.lang.Boolean",
            Value::Int(_) => "class java.lang.Long",
            Value::Float64(_) => "class java.lang.Double",
            Value::String(_) => "class java.lang.String",
            Value::Bytes(_) => "class [B",
            Value::Array(_) => "class java.util.ArrayList",
            Value::Struct(_) => "class org.apache.kafka.connect.data.Struct",
        }
    }
}

/// The key or value converter of a Debezium deployment (`key.converter` / `value.converter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Converter {
    /// `org.apache.kafka.connect.storage.StringConverter`: the value's text, UTF-8.
    String,
    /// `org.apache.kafka.connect.json.JsonConverter`, with `schemas.enable`.
    Json { schemas: bool },
    /// `io.debezium.converters.BinaryDataConverter` / `org.apache.kafka.connect.converters.ByteArrayConverter`:
    /// a bytes value as it is.
    Bytes,
}

impl Converter {
    /// `converter.fromConnectData(topic, headers, schema, value)`: the record bytes, `None` for a
    /// null value where Connect writes none.
    pub(crate) fn serialize(self, schema: Option<&Schema>, value: &Value<'_>) -> Result<Option<Vec<u8>>, DataError> {
        match self {
            Converter::String => match value {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s.as_bytes().to_vec())),
                Value::Int(i) => Ok(Some(i.to_string().into_bytes())),
                Value::Boolean(b) => Ok(Some(b.to_string().into_bytes())),
                other => Err(DataError(format!(
                    "StringConverter writes Java's toString() of a {}, which is not a usable record: use JsonConverter",
                    other.java_class()
                ))),
            },
            Converter::Bytes => match value {
                Value::Null => Ok(None),
                Value::Bytes(b) => Ok(Some(b.to_vec())),
                other => Err(DataError(format!(
                    "the binary converter only accepts bytes, not a {} (a bytea payload column is required)",
                    other.java_class()
                ))),
            },
            Converter::Json { schemas } => {
                let Some(schema) = schema else {
                    if matches!(value, Value::Null) {
                        return Ok(None);
                    }
                    return Err(DataError("a value without a schema".into()));
                };
                let mut out = Vec::with_capacity(64);
                if schemas {
                    out.extend_from_slice(b"{\"schema\":");
                    schema.write_json(&mut out, None);
                    out.extend_from_slice(b",\"payload\":");
                    value.write_json(&mut out, schema)?;
                    out.push(b'}');
                } else {
                    value.write_json(&mut out, schema)?;
                }
                Ok(Some(out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: Option<Vec<u8>>) -> String {
        String::from_utf8(b.unwrap()).unwrap()
    }

    #[test]
    fn json_converter_envelopes_as_connect() {
        let key = Schema::new(Kind::String, false);
        let v = Value::String("a1".into());
        assert_eq!(
            text(Converter::Json { schemas: false }.serialize(Some(&key), &v).unwrap()),
            "\"a1\""
        );
        assert_eq!(
            text(Converter::Json { schemas: true }.serialize(Some(&key), &v).unwrap()),
            r#"{"schema":{"type":"string","optional":false},"payload":"a1"}"#
        );
        let json = Schema::named(Kind::String, true, "io.debezium.data.Json", 1);
        assert_eq!(
            text(
                Converter::Json { schemas: true }
                    .serialize(Some(&json), &Value::Null)
                    .unwrap()
            ),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#
        );
        let envelope = Schema {
            kind: Kind::Struct(vec![
                ("payload".into(), json.clone()),
                ("etype".into(), Schema::new(Kind::String, false)),
            ]),
            optional: false,
            name: Some("p.public.outbox.order.Value".into()),
            version: None,
        };
        let value = Value::Struct(vec![Value::String("{}".into()), Value::String("created".into())]);
        assert_eq!(
            text(
                Converter::Json { schemas: true }
                    .serialize(Some(&envelope), &value)
                    .unwrap()
            ),
            r#"{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},{"type":"string","optional":false,"field":"etype"}],"optional":false,"name":"p.public.outbox.order.Value"},"payload":{"payload":"{}","etype":"created"}}"#
        );
    }

    #[test]
    fn null_values() {
        let s = Schema::new(Kind::String, true);
        assert_eq!(Converter::String.serialize(Some(&s), &Value::Null).unwrap(), None);
        assert_eq!(
            Converter::Json { schemas: false }
                .serialize(None, &Value::Null)
                .unwrap(),
            None
        );
        assert_eq!(
            text(
                Converter::Json { schemas: false }
                    .serialize(Some(&s), &Value::Null)
                    .unwrap()
            ),
            "null"
        );
        let required = Schema::new(Kind::String, false);
        assert!(Converter::Json { schemas: false }
            .serialize(Some(&required), &Value::Null)
            .is_err());
    }

    #[test]
    fn mismatched_value_is_a_data_error() {
        let array = Schema::new(Kind::Array(Box::new(Schema::new(Kind::Int32, true))), true);
        let err = Converter::Json { schemas: false }
            .serialize(Some(&array), &Value::String("[1, 2]".into()))
            .unwrap_err();
        assert_eq!(err.0, "Invalid type for ARRAY: class java.lang.String");
    }
}
