//! `table.expand.json.payload = true`: the payload's JSON text turned into a Connect struct the
//! way Debezium 3.6's EventRouter does it (Jackson's `readTree`, then `JsonSchemaData`), so that
//! `JsonConverter` writes the same bytes Debezium writes.
//!
//! What Debezium does, and so what this does:
//! - only text starting with `{` or `[` is parsed; anything else is kept as the string;
//! - numbers: an integer literal that fits 32 bits is `int32`, 64 bits `int64`; a bigger integer
//!   or any literal with a fraction or exponent is `float64` (a bigger integer's value then fails
//!   Connect's validation: Debezium's task stops — [`Expanded::Fails`]);
//! - object members keep their text order (a duplicate member: first position, last value); a
//!   member whose value is `null` or `[]` has no schema and is dropped (with
//!   `table.json.payload.null.behavior = optional_bytes` a `null` member is an optional bytes
//!   field holding null);
//! - struct names are the payload column's name, then `.member` per level;
//! - arrays must be homogeneous (same JSON type; numbers of the same Connect type; nulls
//!   skipped); an array of objects gets the union of its elements' fields; otherwise the
//!   expansion fails and Debezium keeps the string ([`Expanded::Kept`]) — unless the schema was
//!   built and only the value failed (a top-level array, a merged member of another type), where
//!   Debezium has already replaced the schema and its task stops ([`Expanded::Fails`]).
//!
//! One difference is unavoidable: for an array of objects whose elements have different member
//! sets, Debezium merges their schemas in `HashSet` order, which depends on the JVM's identity
//! hash codes and changes from run to run; the relay merges in order of appearance.
//!
//! Pure and panic-free on any text: recursion is bounded by Jackson's nesting limit (1000).

use std::borrow::Cow;

use super::schema::{Kind, Schema, Value};

/// Jackson 2.15+'s default `StreamReadConstraints`.
const MAX_DEPTH: usize = 1000;
const MAX_NUMBER_LEN: usize = 1000;

/// `table.json.payload.null.behavior`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum NullBehavior {
    /// `ignore` (Debezium's default): a `null` member has no field.
    #[default]
    Ignore,
    /// `optional_bytes`: a `null` member is an optional bytes field.
    OptionalBytes,
}

/// What expanding a payload gives.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expanded<'a> {
    /// The payload as a struct (or, for a top-level array, never: see `Fails`).
    Struct(Schema, Value<'a>),
    /// Expansion failed harmlessly: Debezium logs a warning and keeps the string. `schema_lost`:
    /// Debezium had already dropped the schema (a top-level `[]`), so the string goes without one.
    Kept { schema_lost: bool },
    /// Debezium's Connect task fails on this payload (it cannot be published in Debezium's format).
    Fails(String),
}

/// Expands `text` (the payload column's text; `column` its name, which names the struct).
pub(crate) fn expand<'a>(text: &'a str, column: &str, nulls: NullBehavior) -> Expanded<'a> {
    if !(text.starts_with('{') || text.starts_with('[')) {
        return Expanded::Kept { schema_lost: false };
    }
    let Ok(node) = Parser::new(text).document() else {
        return Expanded::Kept { schema_lost: false };
    };
    let infer = Infer { nulls };
    let schema = match infer.schema(Some(column), &node) {
        Ok(Some(schema)) => schema,
        // The schema became null (`[]`); building the value then fails and the string stays,
        // without a schema.
        Ok(None) => return Expanded::Kept { schema_lost: true },
        Err(()) => return Expanded::Kept { schema_lost: false },
    };
    // Debezium's value builder starts with `new Struct(schema)`.
    if !matches!(schema.kind, Kind::Struct(_)) {
        return Expanded::Fails(format!(
            "Debezium's expansion replaces the schema with an {} and then fails to build its value: \
             its task stops on a top-level JSON array",
            "array"
        ));
    }
    match value(node, &schema) {
        Ok(v) => Expanded::Struct(schema, v),
        Err(why) => Expanded::Fails(why),
    }
}

/// A parsed JSON value with Jackson's number classification.
#[derive(Debug, Clone, PartialEq)]
enum Node<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Long(i64),
    /// An integer beyond 64 bits (Jackson's `BigIntegerNode`).
    BigInt,
    Double(f64),
    Str(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Members in first-appearance order, last value wins.
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl Node<'_> {
    /// Jackson's `JsonNodeType` (numbers are one type).
    fn type_tag(&self) -> u8 {
        match self {
            Node::Null => 0,
            Node::Bool(_) => 1,
            Node::Int(_) | Node::Long(_) | Node::BigInt | Node::Double(_) => 2,
            Node::Str(_) => 3,
            Node::Array(_) => 4,
            Node::Object(_) => 5,
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

type Parsed<T> = Result<T, ()>;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser { text, pos: 0 }
    }

    fn document(mut self) -> Parsed<Node<'a>> {
        let node = self.value(0)?;
        self.ws();
        // Jackson's readTree stops after the first value; PostgreSQL never stores trailing text.
        Ok(node)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> Parsed<()> {
        if self.text[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            Ok(())
        } else {
            Err(())
        }
    }

    /// After a member or an item: whitespace, then `,` (more follow: `false`) or `close` (the
    /// object or array ends: `true`), consumed; anything else is malformed.
    fn closes(&mut self, close: u8) -> Parsed<bool> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b) if b == close => {
                self.pos += 1;
                Ok(true)
            }
            _ => Err(()),
        }
    }

    fn value(&mut self, depth: usize) -> Parsed<Node<'a>> {
        if depth > MAX_DEPTH {
            return Err(());
        }
        self.ws();
        match self.peek().ok_or(())? {
            b'{' => {
                self.pos += 1;
                let mut members: Vec<(Cow<'a, str>, Node<'a>)> = Vec::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.pos += 1;
                    return Ok(Node::Object(members));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    self.eat(":")?;
                    let v = self.value(depth + 1)?;
                    match members.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = v,
                        None => members.push((key, v)),
                    }
                    if self.closes(b'}')? {
                        return Ok(Node::Object(members));
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Ok(Node::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.closes(b']')? {
                        return Ok(Node::Array(items));
                    }
                }
            }
            b'"' => Ok(Node::Str(self.string()?)),
            b't' => self.eat("true").map(|_| Node::Bool(true)),
            b'f' => self.eat("false").map(|_| Node::Bool(false)),
            b'n' => self.eat("null").map(|_| Node::Null),
            _ => self.number(),
        }
    }

    fn number(&mut self) -> Parsed<Node<'a>> {
        let start = self.pos;
        let mut float = false;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' | b'-' | b'+' => {}
                b'.' | b'e' | b'E' => float = true,
                _ => break,
            }
            self.pos += 1;
        }
        let lit = &self.text[start..self.pos];
        if lit.is_empty() || lit.len() > MAX_NUMBER_LEN {
            return Err(());
        }
        if float {
            return lit.parse::<f64>().map(Node::Double).map_err(|_| ());
        }
        let digits = lit.strip_prefix('-').unwrap_or(lit);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(());
        }
        Ok(match lit.parse::<i64>() {
            Ok(n) if i32::try_from(n).is_ok() => Node::Int(n),
            Ok(n) => Node::Long(n),
            Err(_) => Node::BigInt,
        })
    }

    fn string(&mut self) -> Parsed<Cow<'a, str>> {
        self.eat("\"")?;
        let start = self.pos;
        let bytes = self.text.as_bytes();
        // Fast path: no escapes.
        while let Some(&c) = bytes.get(self.pos) {
            match c {
                b'"' => {
                    let s = &self.text[start..self.pos];
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                b'\\' => break,
                _ => self.pos += 1,
            }
        }
        let mut out = String::from(&self.text[start..self.pos]);
        loop {
            let c = self.text[self.pos..].chars().next().ok_or(())?;
            self.pos += c.len_utf8();
            match c {
                '"' => return Ok(Cow::Owned(out)),
                '\\' => {
                    let e = self.peek().ok_or(())?;
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                self.eat("\\u")?;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(());
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            // A lone surrogate has no UTF-8 form: not expandable.
                            out.push(char::from_u32(c).ok_or(())?);
                        }
                        _ => return Err(()),
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let h = self.text.get(self.pos..self.pos + 4).ok_or(())?;
        self.pos += 4;
        u32::from_str_radix(h, 16).map_err(|_| ())
    }
}

/// `JsonSchemaData.toConnectSchema`.
struct Infer {
    nulls: NullBehavior,
}

/// `Err(())`: a `ConnectException` while building the schema (Debezium keeps the string).
type Inferred = Result<Option<Schema>, ()>;

fn optional(kind: Kind) -> Schema {
    Schema::new(kind, true)
}

impl Infer {
    fn schema(&self, key: Option<&str>, node: &Node<'_>) -> Inferred {
        Ok(match node {
            Node::Str(_) => Some(optional(Kind::String)),
            Node::Bool(_) => Some(optional(Kind::Boolean)),
            Node::Int(_) => Some(optional(Kind::Int32)),
            Node::Long(_) => Some(optional(Kind::Int64)),
            Node::BigInt | Node::Double(_) => Some(optional(Kind::Float64)),
            Node::Array(items) if items.is_empty() => None,
            Node::Array(items) => Some(optional(Kind::Array(Box::new(self.items(key, items)?)))),
            Node::Object(members) => {
                let mut fields: Vec<(String, Schema)> = Vec::with_capacity(members.len());
                for (name, value) in members {
                    // Connect refuses an empty field name (SchemaBuilderException).
                    if name.is_empty() {
                        return Err(());
                    }
                    let field_key = match key {
                        Some(k) if !k.trim().is_empty() => format!("{k}.{name}"),
                        _ => name.to_string(),
                    };
                    if let Some(s) = self.schema(Some(&field_key), value)? {
                        if !fields.iter().any(|(n, _)| n == name) {
                            fields.push((name.to_string(), s));
                        }
                    }
                }
                Some(Schema {
                    kind: Kind::Struct(fields),
                    optional: true,
                    name: key.map(str::to_owned),
                    version: None,
                })
            }
            Node::Null => match self.nulls {
                NullBehavior::OptionalBytes => Some(optional(Kind::Bytes)),
                NullBehavior::Ignore => None,
            },
        })
    }

    /// `toConnectSchemaWithCycles`: the schema of a non-empty array's items.
    fn items(&self, key: Option<&str>, items: &[Node<'_>]) -> Result<Schema, ()> {
        let sample = self.first_element(items)?;
        if let Node::Object(_) = sample {
            let mut merged: Option<Schema> = None;
            let mut seen: Vec<Schema> = Vec::new();
            for item in items.iter().filter(|i| matches!(i, Node::Object(_))) {
                let Some(s) = self.schema(key, item)? else { continue };
                if !seen.contains(&s) {
                    merged = Some(match merged {
                        None => s.clone(),
                        Some(left) => merge(left, &s),
                    });
                    seen.push(s);
                }
            }
            merged.ok_or(())
        } else {
            self.schema(None, sample)?.ok_or(())
        }
    }

    /// `getFirstArrayElement`: the first non-null item, all non-null items of its JSON type
    /// (numbers of its Connect type); `Null` when all are null.
    fn first_element<'n, 'a>(&self, items: &'n [Node<'a>]) -> Result<&'n Node<'a>, ()> {
        static NULL: Node<'static> = Node::Null;
        let mut reference: Option<&Node<'_>> = None;
        for item in items.iter().filter(|i| !matches!(i, Node::Null)) {
            let r = *reference.get_or_insert(item);
            if item.type_tag() != r.type_tag() {
                return Err(());
            }
            if r.type_tag() == 2 && self.schema(None, r)? != self.schema(None, item)? {
                return Err(());
            }
        }
        Ok(reference.unwrap_or(&NULL))
    }
}

/// `mergeSchema`: `left`'s fields, then `right`'s new ones; a bytes field (a `null` member) gives
/// way to a typed one. Connect's `copySchemaBasics` keeps name and version but not `optional`:
/// a merged struct is required.
fn merge(left: Schema, right: &Schema) -> Schema {
    let (Kind::Struct(mut fields), Kind::Struct(more)) = (left.kind.clone(), &right.kind) else {
        return left;
    };
    for (name, schema) in more {
        match fields.iter_mut().find(|(n, _)| n == name) {
            None => fields.push((name.clone(), schema.clone())),
            Some(slot) => {
                if slot.1 != *schema && slot.1.kind == Kind::Bytes && schema.kind != Kind::Bytes {
                    slot.1 = schema.clone();
                }
            }
        }
    }
    Schema {
        kind: Kind::Struct(fields),
        optional: false,
        ..left
    }
}

/// `toConnectData` with `Struct.put`'s validation: the value of `node` under `schema`; `Err` says
/// why Connect refuses it (Debezium's task fails).
fn value<'a>(node: Node<'a>, schema: &Schema) -> Result<Value<'a>, String> {
    let Node::Object(members) = node else {
        return Err("Not a struct".into());
    };
    struct_value(members, schema)
}

fn struct_value<'a>(mut members: Vec<(Cow<'a, str>, Node<'a>)>, schema: &Schema) -> Result<Value<'a>, String> {
    let Kind::Struct(fields) = &schema.kind else {
        return Err("Struct schemas do not match.".into());
    };
    let mut values = Vec::with_capacity(fields.len());
    for (name, field_schema) in fields {
        let v = match members.iter_mut().find(|(k, _)| k == name) {
            Some((_, node)) => field_value(std::mem::replace(node, Node::Null), field_schema, name)?,
            None => Value::Null,
        };
        values.push(v);
    }
    Ok(Value::Struct(values))
}

/// `getStructFieldValue` then Connect's `validateValue` for `schema`.
fn field_value<'a>(node: Node<'a>, schema: &Schema, field: &str) -> Result<Value<'a>, String> {
    let mismatch = |java: &str| {
        Err(format!(
            "Invalid Java object for schema with type {:?}: class {java} for field: \"{field}\"",
            schema.kind
        ))
    };
    Ok(match (node, &schema.kind) {
        (Node::Null, _) => Value::Null,
        (Node::Str(s), Kind::String) => Value::String(s),
        (Node::Bool(b), Kind::Boolean) => Value::Boolean(b),
        (Node::Int(n), Kind::Int32) | (Node::Long(n), Kind::Int64) => Value::Int(n),
        (Node::Double(f), Kind::Float64) => Value::Float64(f),
        (Node::Array(items), Kind::Array(item_schema)) => Value::Array(
            items
                .into_iter()
                .map(|i| field_value(i, item_schema, field))
                .collect::<Result<_, _>>()?,
        ),
        (Node::Object(members), Kind::Struct(_)) => struct_value(members, schema)?,
        (Node::BigInt, _) => return mismatch("java.math.BigDecimal"),
        (Node::Str(_), _) => return mismatch("java.lang.String"),
        (Node::Bool(_), _) => return mismatch("java.lang.Boolean"),
        (Node::Int(_), _) => return mismatch("java.lang.Integer"),
        (Node::Long(_), _) => return mismatch("java.lang.Long"),
        (Node::Double(_), _) => return mismatch("java.lang.Double"),
        (Node::Array(_), _) => return mismatch("java.util.ArrayList"),
        (Node::Object(_), _) => return mismatch("org.apache.kafka.connect.data.Struct"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::schema::Converter;
    use super::*;

    fn json(text: &str, nulls: NullBehavior, schemas: bool) -> String {
        match expand(text, "payload", nulls) {
            Expanded::Struct(schema, value) => String::from_utf8(
                Converter::Json { schemas }
                    .serialize(Some(&schema), &value)
                    .unwrap()
                    .unwrap(),
            )
            .unwrap(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn objects_expand_compacted_with_nulls_dropped() {
        assert_eq!(
            json(
                r#"{"b": 1, "a": "x", "c": null, "d": [], "e": {"f": true}}"#,
                NullBehavior::Ignore,
                false
            ),
            r#"{"b":1,"a":"x","e":{"f":true}}"#
        );
        assert_eq!(
            json(r#"{"c": null}"#, NullBehavior::OptionalBytes, true),
            r#"{"schema":{"type":"struct","fields":[{"type":"bytes","optional":true,"field":"c"}],"optional":true,"name":"payload"},"payload":{"c":null}}"#
        );
        assert_eq!(
            json(r#"{"n": {"m": 1}}"#, NullBehavior::Ignore, true),
            r#"{"schema":{"type":"struct","fields":[{"type":"struct","fields":[{"type":"int32","optional":true,"field":"m"}],"optional":true,"name":"payload.n","field":"n"}],"optional":true,"name":"payload"},"payload":{"n":{"m":1}}}"#
        );
    }

    #[test]
    fn numbers_follow_jackson() {
        assert_eq!(
            json(
                r#"{"i": 2147483647, "l": 2147483648, "d": 0.00000000025, "p": 3.14159265358979323846264338327950288, "e": 1E2}"#,
                NullBehavior::Ignore,
                false
            ),
            r#"{"i":2147483647,"l":2147483648,"d":2.5E-10,"p":3.141592653589793,"e":100.0}"#
        );
        assert!(matches!(
            expand(r#"{"big": 12345678901234567890123}"#, "payload", NullBehavior::Ignore),
            Expanded::Fails(_)
        ));
    }

    #[test]
    fn arrays() {
        assert_eq!(
            json(r#"{"a": [1, null, 2]}"#, NullBehavior::Ignore, false),
            r#"{"a":[1,null,2]}"#
        );
        // Mixed number types, mixed JSON types, only nulls: Debezium keeps the string.
        for kept in [r#"{"a": [1, 2.5]}"#, r#"{"a": [1, "x"]}"#, r#"{"a": [null]}"#] {
            assert_eq!(
                expand(kept, "payload", NullBehavior::Ignore),
                Expanded::Kept { schema_lost: false },
                "{kept}"
            );
        }
        assert_eq!(
            json(
                r#"{"a": [{"x": 1}, {"y": "s"}, {"x": 2}]}"#,
                NullBehavior::Ignore,
                false
            ),
            r#"{"a":[{"x":1,"y":null},{"x":null,"y":"s"},{"x":2,"y":null}]}"#
        );
        // A member of another type in a later element: the value fails after the schema was built.
        assert!(matches!(
            expand(r#"{"a": [{"x": 1}, {"x": "s"}]}"#, "payload", NullBehavior::Ignore),
            Expanded::Fails(_)
        ));
        assert!(matches!(
            expand("[1, 2]", "payload", NullBehavior::Ignore),
            Expanded::Fails(_)
        ));
        assert_eq!(
            expand("[]", "payload", NullBehavior::Ignore),
            Expanded::Kept { schema_lost: true }
        );
    }

    #[test]
    fn text_that_is_not_an_object_or_array_is_kept() {
        for kept in ["\"s\"", "1", "null", "true", " {}", "{", "{\"a\": \"\\ud800\"}"] {
            assert_eq!(
                expand(kept, "payload", NullBehavior::Ignore),
                Expanded::Kept { schema_lost: false },
                "{kept}"
            );
        }
    }

    #[test]
    fn duplicate_members_keep_first_position_last_value() {
        assert_eq!(
            json(r#"{"a": 1, "b": 2, "a": 3}"#, NullBehavior::Ignore, false),
            r#"{"a":3,"b":2}"#
        );
    }

    #[test]
    fn escapes_and_unicode_round_trip_as_jackson_writes_them() {
        assert_eq!(
            json(r#"{"s": "\u00e9\n\"\/😀\ud83d\ude00"}"#, NullBehavior::Ignore, false),
            "{\"s\":\"é\\n\\\"/\\uD83D\\uDE00\\uD83D\\uDE00\"}"
        );
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(
            expand(&deep, "payload", NullBehavior::Ignore),
            Expanded::Kept { schema_lost: false }
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in ".{0,200}") {
            let _ = expand(&text, "payload", NullBehavior::Ignore);
            let _ = expand(&format!("{{{text}"), "payload", NullBehavior::OptionalBytes);
        }
    }
}
