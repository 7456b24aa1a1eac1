//! A record as an SNS message (docs/sink-sns.md, "What a subscriber gets"): the payload is the
//! message, and message attributes carry the event id (`id`), the aggregate key (`key`) and the
//! record's headers — each header an attribute of its own (`[sns] headers = "attributes"`), or
//! all of them in one JSON attribute `headers` (`"json"`). FIFO topics get the key as the
//! message group (hashed when SNS would not take it) and a deduplication id: the relay's source
//! position in exactly-once mode, else the event id.
//!
//! Invariant: everything SNS would refuse for what the message *is* — its size (body and
//! attributes), more than 10 attributes (what SNS delivers to SQS subscribers), text SNS does
//! not accept, an attribute name SNS forbids — is refused here, before sending, with the fix.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::config::aws::HeaderMode;
use crate::sink::SinkRecord;

/// The attribute holding the event id.
pub(crate) const ID_ATTRIBUTE: &str = "id";
/// The attribute holding the aggregate key.
pub(crate) const KEY_ATTRIBUTE: &str = "key";
/// `headers = "json"`: the attribute holding every header as one JSON object.
pub(crate) const HEADERS_ATTRIBUTE: &str = "headers";
/// The attributes SNS delivers to an SQS subscriber (SQS's own limit per message).
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// SNS's limit on a message group id and a deduplication id.
const MAX_ID_CHARS: usize = 128;
/// SNS's limit on an attribute name.
const MAX_ATTRIBUTE_NAME: usize = 256;
/// SNS's limit on a topic name (a FIFO topic's `.fifo` included).
const MAX_TOPIC_NAME: usize = 256;

/// One attribute value and its SNS data type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// `String`: UTF-8 text SNS accepts.
    Text(String),
    /// `Binary`: anything else.
    Bytes(Vec<u8>),
}

impl Value {
    fn of(bytes: &[u8]) -> Value {
        match std::str::from_utf8(bytes) {
            Ok(text) if text.chars().all(allowed_char) => Value::Text(text.to_owned()),
            _ => Value::Bytes(bytes.to_vec()),
        }
    }

    pub(crate) fn data_type(&self) -> &'static str {
        match self {
            Value::Text(_) => "String",
            Value::Bytes(_) => "Binary",
        }
    }

    fn len(&self) -> usize {
        match self {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
        }
    }
}

/// One message, owning everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// The routed name: the topic.
    pub(crate) topic: String,
    pub(crate) body: String,
    pub(crate) attributes: BTreeMap<String, Value>,
    /// FIFO topics: the message group (the aggregate key) and the deduplication id.
    pub(crate) group: Option<String>,
    pub(crate) dedup: Option<String>,
    /// The size SNS counts against its limit: body, and each attribute's name, type and value.
    pub(crate) size: usize,
}

/// How records become messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoder {
    pub(crate) fifo: bool,
    pub(crate) headers: HeaderMode,
    pub(crate) max_message_bytes: usize,
}

/// The characters an SQS subscriber accepts (SNS forwards the message as it is): `#x9 | #xA |
/// #xD | #x20` to `#xD7FF | #xE000` to `#xFFFD | #x10000` to `#x10FFFF`.
fn allowed_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// `raw` as a group or deduplication id SNS takes (1 to 128 ASCII letters, digits and
/// punctuation): itself when it can, else `sha256:` and its SHA-256 in hex (the same input
/// always gives the same id, so a group or a replay's deduplication is kept).
pub(crate) fn sns_id(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(text)
            if (1..=MAX_ID_CHARS).contains(&text.len())
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation()) =>
        {
            text.to_owned()
        }
        _ => {
            let digest = ring::digest::digest(&ring::digest::SHA256, raw);
            let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            format!("sha256:{hex}")
        }
    }
}

/// An attribute name SNS accepts: letters, digits, `_ - .`; no leading, trailing or doubled
/// `.`; not starting with `AWS.` or `Amazon.` (any case); at most 256 characters.
fn check_attribute_name(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let fine = !name.is_empty()
        && name.len() <= MAX_ATTRIBUTE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.");
    if fine {
        Ok(())
    } else {
        Err(format!(
            "header {:?} cannot be an SNS message attribute name (letters, digits, _ - . only, at most 256, no \
             AWS./Amazon. prefix); rename the header column, or set [sns] headers = \"json\" to send headers in one \
             JSON attribute",
            name.chars().take(64).collect::<String>()
        ))
    }
}

impl Encoder {
    /// The message of `record`; `Err`: why SNS would refuse it (a bad event).
    pub(crate) fn encode(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
    ) -> Result<Message, String> {
        let body = match record.value.as_deref() {
            // A NULL payload (jsonb) is JSON null: SNS has no empty messages.
            None => "null".to_owned(),
            Some([]) => return Err("the payload is empty, and SNS does not publish empty messages".into()),
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) if text.chars().all(allowed_char) => text.to_owned(),
                Ok(_) => {
                    return Err(
                        "the payload has characters SNS subscribers (SQS) do not accept (control characters \
                                other than tab and line breaks)"
                            .into(),
                    )
                }
                Err(_) => return Err("the payload is not UTF-8 text, and SNS messages are text".into()),
            },
        };
        let mut attributes = BTreeMap::new();
        match self.headers {
            HeaderMode::Attributes => {
                for (name, value) in record.headers_with(extra) {
                    // SNS has no empty attribute values: a null or empty header is left out.
                    let Some(value) = value.filter(|v| !v.is_empty()) else {
                        continue;
                    };
                    check_attribute_name(name)?;
                    attributes.insert(name.to_owned(), Value::of(value));
                }
            }
            HeaderMode::Json => {
                let mut object = serde_json::Map::new();
                for (name, value) in record.headers_with(extra) {
                    let value = match value {
                        None => serde_json::Value::Null,
                        Some(v) => match std::str::from_utf8(v) {
                            Ok(text) => serde_json::Value::String(text.to_owned()),
                            Err(_) => serde_json::json!({
                                "base64": base64::engine::general_purpose::STANDARD.encode(v)
                            }),
                        },
                    };
                    object.insert(name.to_owned(), value);
                }
                if !object.is_empty() {
                    let text = serde_json::Value::Object(object).to_string();
                    if !text.chars().all(allowed_char) {
                        return Err("a header value has characters SNS does not accept in an attribute".into());
                    }
                    attributes.insert(HEADERS_ATTRIBUTE.to_owned(), Value::Text(text));
                }
            }
        }
        // The relay's own attributes win over a header of the same name.
        attributes.insert(ID_ATTRIBUTE.to_owned(), Value::of(record.event_id));
        if !record.key.is_empty() {
            attributes.insert(KEY_ATTRIBUTE.to_owned(), Value::of(&record.key));
        }
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(format!(
                "the message would have {} attributes (id, key and {} headers); SNS delivers at most \
                 {MAX_ATTRIBUTES} to SQS subscribers: set [sns] headers = \"json\" to send the headers in one JSON \
                 attribute, or map fewer header columns",
                attributes.len(),
                attributes.len() - 2
            ));
        }
        let size = body.len()
            + attributes
                .iter()
                .map(|(name, value)| name.len() + value.data_type().len() + value.len())
                .sum::<usize>();
        if size > self.max_message_bytes {
            return Err(format!(
                "the message is {size} bytes (body and attributes), larger than [sns] max_message_bytes = {} (SNS \
                 counts the body and every attribute's name, type and value, 256 KiB at most); keep large payloads \
                 elsewhere and send a reference",
                self.max_message_bytes
            ));
        }
        let (group, dedup) = if self.fifo {
            let dedup = match dedup_key {
                Some(position) => sns_id(position.as_bytes()),
                None => sns_id(record.event_id),
            };
            (Some(sns_id(&record.key)), Some(dedup))
        } else {
            (None, None)
        };
        Ok(Message {
            topic: record.destination.clone().into_owned(),
            body,
            attributes,
            group,
            dedup,
            size,
        })
    }
}

/// The rule for a routed name with standard topics: 1 to 256 letters, digits, `-` and `_`.
pub(crate) fn check_standard_name(name: &str) -> Result<(), String> {
    if name.ends_with(".fifo") {
        return Err(format!(
            "{name:?} is a FIFO topic's name, and [sns] fifo = false publishes to standard topics; set fifo = true \
             (every routed topic then is a FIFO topic)"
        ));
    }
    check_base(name, name, MAX_TOPIC_NAME)
}

/// The rule for a routed name with FIFO topics: a standard name followed by `.fifo`, 256
/// characters in all.
pub(crate) fn check_fifo_name(name: &str) -> Result<(), String> {
    match name.strip_suffix(".fifo") {
        Some(base) => check_base(name, base, MAX_TOPIC_NAME - ".fifo".len()),
        None => Err(format!(
            "{name:?} is not a FIFO topic's name (they end in .fifo), and [sns] fifo = true publishes to FIFO topics \
             only; route to \"{name}.fifo\" or set fifo = false"
        )),
    }
}

fn check_base(name: &str, base: &str, max: usize) -> Result<(), String> {
    if base.is_empty()
        || base.len() > max
        || !base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "{:?} is not an SNS topic name (1 to 256 characters: letters, digits, - and _, a FIFO topic's ending in \
             .fifo)",
            name.chars().take(100).collect::<String>()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::sink::RecordHeader;

    fn record<'a>(headers: &'a [RecordHeader<'a>], value: Option<&'a [u8]>) -> SinkRecord<'a> {
        SinkRecord {
            destination: Cow::Borrowed("orders.fifo"),
            key: Cow::Borrowed(b"agg-1"),
            value: value.map(Cow::Borrowed),
            event_id: b"42",
            timestamp_ms: Some(1),
            headers: Cow::Borrowed(headers),
            partition: None,
        }
    }

    const FIFO: Encoder = Encoder {
        fifo: true,
        headers: HeaderMode::Attributes,
        max_message_bytes: 1000,
    };

    #[test]
    fn body_attributes_group_and_dedup() {
        let headers = [
            (Cow::Borrowed("tenant"), Some(Cow::Borrowed(&b"t1"[..]))),
            (Cow::Borrowed("none"), None),
            (Cow::Borrowed("raw"), Some(Cow::Borrowed(&[0xff, 0x00][..]))),
        ];
        let m = FIFO
            .encode(&record(&headers, Some(b"{\"a\":1}")), &[], Some("src/0/16B/2"))
            .unwrap();
        assert_eq!((m.topic.as_str(), m.body.as_str()), ("orders.fifo", "{\"a\":1}"));
        let names: Vec<&str> = m.attributes.keys().map(String::as_str).collect();
        assert_eq!(names, ["id", "key", "raw", "tenant"], "null headers are left out");
        assert_eq!(m.attributes["raw"], Value::Bytes(vec![0xff, 0]));
        assert_eq!(m.group.as_deref(), Some("agg-1"));
        assert_eq!(m.dedup.as_deref(), Some("src/0/16B/2"));
        assert_eq!(m.size, 7 + (2 + 6 + 2) + (3 + 6 + 5) + (3 + 6 + 2) + (6 + 6 + 2));
        let m = FIFO.encode(&record(&[], None), &[], None).unwrap();
        assert_eq!((m.body.as_str(), m.dedup.as_deref()), ("null", Some("42")));
        let standard = Encoder { fifo: false, ..FIFO };
        let m = standard.encode(&record(&[], Some(b"1")), &[], None).unwrap();
        assert_eq!((m.group, m.dedup), (None, None));
        assert!(sns_id(&[b'x'; 129]).starts_with("sha256:"));
        assert_eq!(sns_id(b"a-b/c:1"), "a-b/c:1");
    }

    #[test]
    fn what_sns_would_refuse_is_refused_with_the_fix() {
        let nine: Vec<RecordHeader> = (0..9)
            .map(|i| (Cow::Owned(format!("h{i}")), Some(Cow::Borrowed(&b"v"[..]))))
            .collect();
        let err = FIFO.encode(&record(&nine, Some(b"{}")), &[], None).unwrap_err();
        assert!(
            err.contains("11 attributes") && err.contains("headers = \"json\""),
            "{err}"
        );
        let json = Encoder {
            headers: HeaderMode::Json,
            ..FIFO
        };
        let m = json.encode(&record(&nine, Some(b"{}")), &[], None).unwrap();
        assert_eq!(m.attributes.len(), 3);
        let big = vec![b'x'; 1000];
        let err = FIFO.encode(&record(&[], Some(&big)), &[], None).unwrap_err();
        assert!(err.contains("max_message_bytes"), "{err}");
        assert!(FIFO
            .encode(&record(&[], Some(b"\xff")), &[], None)
            .unwrap_err()
            .contains("not UTF-8"));
        assert!(FIFO
            .encode(&record(&[], Some(b"a\x01b")), &[], None)
            .unwrap_err()
            .contains("control"));
        let bad_name = [(Cow::Borrowed("AWS.trace"), Some(Cow::Borrowed(&b"v"[..])))];
        let err = FIFO.encode(&record(&bad_name, Some(b"{}")), &[], None).unwrap_err();
        assert!(err.contains("attribute name"), "{err}");
    }

    #[test]
    fn topic_names() {
        assert!(check_fifo_name("orders.fifo").is_ok());
        assert!(check_fifo_name("orders").unwrap_err().contains("orders.fifo"));
        assert!(check_standard_name("orders-1_a").is_ok());
        assert!(check_standard_name("orders.fifo").unwrap_err().contains("fifo = true"));
        assert!(check_standard_name("a.b").is_err());
        assert!(check_standard_name(&"x".repeat(256)).is_ok());
        assert!(check_standard_name(&"x".repeat(257)).is_err());
        assert!(check_fifo_name(&format!("{}.fifo", "x".repeat(252))).is_err());
        assert!(check_fifo_name(&format!("{}.fifo", "x".repeat(251))).is_ok());
    }
}
