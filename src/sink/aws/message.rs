//! A record as an SQS or SNS message (docs/sink-sqs.md, "What a consumer gets"; docs/sink-sns.md):
//! the payload is the body, and message attributes carry the event id (`id`), the aggregate key
//! (`key`) and the record's headers — each header an attribute of its own (`headers =
//! "attributes"`), or all of them in one JSON attribute `headers` (`"json"`). FIFO queues and
//! topics get the key as the message group (hashed when the service would not take it) and a
//! deduplication id: the relay's source position in exactly-once mode, else the event id. The
//! two services share the message model (SNS delivers to SQS subscribers what SQS would take),
//! so one encoder serves both; [`Service`] holds what differs (names, words, name limits).
//!
//! Invariant: everything the service would refuse for what the message *is* — its size counted
//! as the service counts it, more than 10 attributes, a body or attribute that is not text it
//! accepts, an attribute name it forbids, a routed name it cannot have — is refused here,
//! before sending, with the fix in the words.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::sink::aws::config::HeaderMode;
use crate::sink::aws::exchange::Encode;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use tracing::debug;

use crate::sink::aws::client;
use crate::sink::batch::{BatchEntry, CallError, EntryAnswer};
use crate::sink::Handover;

/// What differs between the services that take these messages.
#[derive(Debug)]
pub(crate) struct Service {
    /// `"SQS"`.
    pub(crate) name: &'static str,
    /// The sink's name for people, in errors and logs: `"Amazon SQS"`.
    pub(crate) sink: &'static str,
    /// The config section, `"sqs"` (also its `[sink] kind`).
    pub(crate) section: &'static str,
    /// What a routed name names: `"queue"`.
    pub(crate) destination: &'static str,
    /// How the relay hands it a message: `"sends to"`.
    pub(crate) verb: &'static str,
    /// Who reads what it stores: `"consumers"`.
    pub(crate) readers: &'static str,
    /// The longest routed name, a FIFO one's `.fifo` included (SQS: 80, SNS: 256).
    pub(crate) max_name: usize,
    /// Why at most 10 attributes: "SQS allows 10".
    pub(crate) attribute_limit: &'static str,
    /// Where a limit above `max_message_bytes` comes from: "the queue's MaximumMessageSize".
    pub(crate) size_limit: &'static str,
}

/// The attribute holding the event id.
pub(crate) const ID_ATTRIBUTE: &str = "id";
/// The attribute holding the aggregate key.
pub(crate) const KEY_ATTRIBUTE: &str = "key";
/// `headers = "json"`: the attribute holding every header as one JSON object.
pub(crate) const HEADERS_ATTRIBUTE: &str = "headers";
/// SQS's limit of message attributes per message (and what SNS delivers to SQS subscribers).
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// The services' limit on a message group id and a deduplication id.
pub(crate) const MAX_ID_CHARS: usize = 128;
/// The services' limit on an attribute name.
const MAX_ATTRIBUTE_NAME: usize = 256;

/// One attribute value and its data type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// `String`: UTF-8 text SQS accepts.
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

    /// The data type's name, as the service counts it in the size.
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
    /// The routed name: the queue or topic.
    pub(crate) destination: String,
    pub(crate) body: String,
    /// By name (neither service keeps an order among attributes).
    pub(crate) attributes: BTreeMap<String, Value>,
    /// FIFO queues and topics: the message group (the aggregate key) and the deduplication id.
    pub(crate) group: Option<String>,
    pub(crate) dedup: Option<String>,
    /// The size as the services count it against their limit: body, and each attribute's name, data type
    /// and value.
    pub(crate) size: usize,
}

/// The shared batcher (`sink/batch.rs`) groups messages by queue or topic.
impl BatchEntry for Message {
    fn destination(&self) -> &str {
        &self.destination
    }

    fn size(&self) -> usize {
        self.size
    }
}

/// How records become messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoder {
    pub(crate) service: &'static Service,
    pub(crate) fifo: bool,
    pub(crate) headers: HeaderMode,
    pub(crate) max_message_bytes: usize,
}

impl Encode for Encoder {
    type Entry = Message;

    /// `dedup_key` (exactly-once) becomes a FIFO message's `MessageDeduplicationId`.
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Message, String> {
        Encoder::encode(self, handover)
    }
}

/// The characters SQS accepts in a body and a `String` attribute, and so what SNS may deliver
/// (SQS's API reference: `#x9 | #xA | #xD | #x20` to `#xD7FF | #xE000` to `#xFFFD | #x10000` to `#x10FFFF`).
fn allowed_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Whether the service takes `id` as a message group or deduplication id as it is: 1 to 128 ASCII
/// letters, digits and punctuation.
fn usable_id(id: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation())
}

/// `raw` as an id the services take: itself when it can, else `sha256:` and its SHA-256 in hex (the
/// same input always gives the same id, so a group or a replay's deduplication is kept).
pub(crate) fn aws_id(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(text) if usable_id(text) => text.to_owned(),
        _ => {
            let digest = ring::digest::digest(&ring::digest::SHA256, raw);
            let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            format!("sha256:{hex}")
        }
    }
}

/// An attribute name the services accept: letters, digits, `_ - .`; no leading, trailing or doubled
/// `.`; not starting with `AWS.` or `Amazon.` (any case); at most 256 characters.
fn check_attribute_name(service: &Service, name: &str) -> Result<(), String> {
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
            "header {:?} cannot be an {} message attribute name (letters, digits, _ - . only, at most 256, no \
             AWS./Amazon. prefix); rename the header column, or set [{}] headers = \"json\" to send headers in one \
             JSON attribute",
            name.chars().take(64).collect::<String>(),
            service.name,
            service.section
        ))
    }
}

impl Encoder {
    /// The message of `record`; `Err`: why the service would refuse it (a bad event).
    pub(crate) fn encode(&self, handover: Handover<'_, '_>) -> Result<Message, String> {
        let record = handover.record;
        let service = self.service;
        let name = service.name;
        let body = match record.value.as_deref() {
            // A NULL payload (jsonb) is JSON null: there are no empty message bodies.
            None => "null".to_owned(),
            Some([]) => {
                return Err(format!(
                    "the payload is empty, and {name} takes no empty message bodies"
                ))
            }
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) if text.chars().all(allowed_char) => text.to_owned(),
                Ok(_) => {
                    return Err(format!(
                        "the payload has characters {name} does not accept in a message body (control characters \
                         other than tab and line breaks)"
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "the payload is not UTF-8 text, and {name} message bodies are text"
                    ))
                }
            },
        };
        let mut attributes = BTreeMap::new();
        match self.headers {
            HeaderMode::Attributes => {
                for (name, value) in record.headers_with(handover.extra) {
                    // No empty attribute values: a null or empty header is left out.
                    let Some(value) = value.filter(|v| !v.is_empty()) else {
                        continue;
                    };
                    check_attribute_name(service, name)?;
                    attributes.insert(name.to_owned(), Value::of(value));
                }
            }
            HeaderMode::Json => {
                let mut object = serde_json::Map::new();
                for (name, value) in record.headers_with(handover.extra) {
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
                        return Err(format!(
                            "a header value has characters {name} does not accept in an attribute"
                        ));
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
                "the message would have {} attributes (id, key and {} headers); {}: set [{}] headers = \"json\" to \
                 send the headers in one JSON attribute, or map fewer header columns",
                attributes.len(),
                attributes.len() - 2,
                service.attribute_limit,
                service.section
            ));
        }
        let size = body.len()
            + attributes
                .iter()
                .map(|(name, value)| name.len() + value.data_type().len() + value.len())
                .sum::<usize>();
        if size > self.max_message_bytes {
            return Err(format!(
                "the message is {size} bytes (body and attributes), larger than [{}] max_message_bytes = {} ({name} \
                 counts the body and every attribute's name, type and value); raise max_message_bytes up to {}, or \
                 keep large payloads elsewhere and send a reference",
                service.section, self.max_message_bytes, service.size_limit
            ));
        }
        let (group, dedup) = if self.fifo {
            let dedup = match handover.dedup_key {
                Some(position) => aws_id(position.as_bytes()),
                None => aws_id(record.event_id),
            };
            (Some(aws_id(&record.key)), Some(dedup))
        } else {
            (None, None)
        };
        Ok(Message {
            destination: record.destination.clone().into_owned(),
            body,
            attributes,
            group,
            dedup,
            size,
        })
    }
}

/// One failed entry of a batch call's result, as SQS and SNS report it.
pub(crate) struct FailedEntry<'a> {
    /// The id the call gave the entry: its index.
    pub(crate) id: &'a str,
    pub(crate) sender_fault: bool,
    pub(crate) code: &'a str,
    pub(crate) message: &'a str,
}

impl Service {
    /// Why the service refused a message for `destination`, in words for the bad event.
    pub(crate) fn refusal(&self, destination: &str, cause: &str) -> String {
        format!(
            "{} refused the message for {} {destination:?}: {cause}",
            self.name, self.destination
        )
    }

    /// What a failed batch call to `destination` means for its entries: the destination deleted
    /// since it was resolved (a `gone` code: `forget` it, and the call is retried, its next
    /// attempt resolving the name again and refusing the entries if it is really gone), the
    /// request refused for its content (a `content` code: the batcher splits the batch, each
    /// entry alone telling which is bad), anything else retried.
    pub(crate) fn call_error<E, R>(
        &self,
        e: &SdkError<E, R>,
        destination: &str,
        gone: &[&str],
        content: &[&str],
        forget: impl FnOnce(),
    ) -> CallError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let (code, cause) = (client::code(e), client::words(e));
        if gone.contains(&code) {
            debug!(%destination, %cause, "{}: {} gone, resolving it again", self.name, self.destination);
            forget();
            CallError::Transient(cause)
        } else if content.contains(&code) {
            CallError::Refused(self.refusal(destination, &cause))
        } else {
            CallError::Transient(cause)
        }
    }

    /// Each of `entries` entries' answer in a batch call's result, whose entries are named by
    /// their index: stored, refused when `refused` says the failure is the message's own (with
    /// the service's words), else retried; one the result does not mention is retried.
    pub(crate) fn answers<'a>(
        &self,
        destination: &str,
        entries: usize,
        stored: impl IntoIterator<Item = &'a str>,
        failed: impl IntoIterator<Item = FailedEntry<'a>>,
        refused: fn(sender_fault: bool, code: &str) -> bool,
    ) -> Vec<EntryAnswer> {
        let mut answers: Vec<Option<EntryAnswer>> = vec![None; entries];
        let index = |id: &str| id.parse::<usize>().ok();
        for id in stored {
            if let Some(slot) = index(id).and_then(|i| answers.get_mut(i)) {
                *slot = Some(EntryAnswer::Stored);
            }
        }
        for f in failed {
            if let Some(slot) = index(f.id).and_then(|i| answers.get_mut(i)) {
                let cause = format!("{}: {}", f.code, f.message);
                *slot = Some(if refused(f.sender_fault, f.code) {
                    EntryAnswer::Refused(self.refusal(destination, &cause))
                } else {
                    EntryAnswer::Retry(cause)
                });
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| EntryAnswer::Retry("the answer did not mention the entry".into())))
            .collect()
    }
}

impl Service {
    /// The rule for a routed name with standard queues / topics: letters, digits, `-` and `_`.
    pub(crate) fn check_standard_name(&self, name: &str) -> Result<(), String> {
        if name.ends_with(".fifo") {
            return Err(format!(
                "{name:?} is a FIFO {d}'s name, and [{s}] fifo = false {v} standard {d}s; set fifo = true (every routed \
                 {d} then is a FIFO {d})",
                d = self.destination,
                s = self.section,
                v = self.verb
            ));
        }
        self.check_base(name, name, self.max_name)
    }

    /// The rule for a routed name with FIFO queues / topics: a standard name followed by `.fifo`.
    pub(crate) fn check_fifo_name(&self, name: &str) -> Result<(), String> {
        match name.strip_suffix(".fifo") {
            Some(base) => self.check_base(name, base, self.max_name - ".fifo".len()),
            None => Err(format!(
                "{name:?} is not a FIFO {d}'s name (they end in .fifo), and [{s}] fifo = true {v} FIFO {d}s only; \
                 route to \"{name}.fifo\" or set fifo = false",
                d = self.destination,
                s = self.section,
                v = self.verb
            )),
        }
    }

    fn check_base(&self, name: &str, base: &str, max: usize) -> Result<(), String> {
        if base.is_empty()
            || base.len() > max
            || !base
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "{:?} is not an {} {} name (1 to {} characters: letters, digits, - and _, a FIFO {}'s ending in .fifo)",
                name.chars().take(100).collect::<String>(),
                self.name,
                self.destination,
                self.max_name,
                self.destination
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::sink::{RecordHeader, SinkRecord};

    /// The headers the AWS sinks' encoder tests give a record: text, null and binary.
    pub(crate) const HEADERS: [RecordHeader<'static>; 3] = [
        (Cow::Borrowed("tenant"), Some(Cow::Borrowed(b"t1"))),
        (Cow::Borrowed("none"), None),
        (Cow::Borrowed("raw"), Some(Cow::Borrowed(&[0xff, 0x00]))),
    ];

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

    // The services as their sinks describe them.
    use crate::sink::aws::sns::SERVICE as SNS;
    use crate::sink::aws::sqs::SERVICE as SQS;

    const FIFO: Encoder = Encoder {
        service: &SQS,
        fifo: true,
        headers: HeaderMode::Attributes,
        max_message_bytes: 1000,
    };

    #[test]
    fn a_message_is_batched_by_its_destination_and_its_size_as_the_services_count_it() {
        let m = Message {
            destination: "orders.fifo".into(),
            body: "x".into(),
            attributes: BTreeMap::new(),
            group: None,
            dedup: None,
            size: 17,
        };
        assert_eq!((m.destination(), BatchEntry::size(&m)), ("orders.fifo", 17));
    }

    #[test]
    fn batch_answers_by_entry_index() {
        let failed = |id, sender_fault, code| FailedEntry {
            id,
            sender_fault,
            code,
            message: "m",
        };
        let refused = |sender_fault: bool, code: &str| sender_fault && code != "Throttled";
        let answers = SQS.answers(
            "orders.fifo",
            5,
            ["0", "x", "9"],
            [
                failed("1", true, "InvalidParameterValue"),
                failed("2", true, "Throttled"),
            ],
            refused,
        );
        assert_eq!(answers[0], EntryAnswer::Stored);
        assert_eq!(
            answers[1],
            EntryAnswer::Refused("SQS refused the message for queue \"orders.fifo\": InvalidParameterValue: m".into())
        );
        assert_eq!(answers[2], EntryAnswer::Retry("Throttled: m".into()));
        for unmentioned in &answers[3..] {
            assert_eq!(
                *unmentioned,
                EntryAnswer::Retry("the answer did not mention the entry".into())
            );
        }
    }

    #[test]
    fn body_attributes_group_and_dedup() {
        let m = FIFO
            .encode(
                Handover::of(&record(&HEADERS, Some(b"{\"a\":1}")))
                    .with_extra(&[("pos", b"0/1")])
                    .with_dedup_key(Some("src/0/16B/2")),
            )
            .unwrap();
        assert_eq!(m.body, "{\"a\":1}");
        let names: Vec<&str> = m.attributes.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["id", "key", "pos", "raw", "tenant"],
            "null headers are left out"
        );
        assert_eq!(m.attributes["raw"], Value::Bytes(vec![0xff, 0]));
        assert_eq!(m.attributes["id"], Value::Text("42".into()));
        assert_eq!(m.group.as_deref(), Some("agg-1"));
        assert_eq!(m.dedup.as_deref(), Some("src/0/16B/2"));
        assert_eq!(
            m.size,
            7 + (2 + 6 + 2) + (3 + 6 + 5) + (3 + 6 + 3) + (3 + 6 + 2) + (6 + 6 + 2)
        );
        // At-least-once: the event id deduplicates; a NULL payload is JSON null.
        let m = FIFO.encode(Handover::of(&record(&[], None))).unwrap();
        assert_eq!((m.body.as_str(), m.dedup.as_deref()), ("null", Some("42")));
        let standard = Encoder { fifo: false, ..FIFO };
        let m = standard.encode(Handover::of(&record(&[], Some(b"1")))).unwrap();
        assert_eq!((m.group, m.dedup), (None, None));
    }

    #[test]
    fn ids_the_services_would_refuse_are_hashed_the_same_way_each_time() {
        assert_eq!(aws_id(b"a-b/c:1"), "a-b/c:1");
        let long = aws_id(&[b'x'; 129]);
        assert!(long.starts_with("sha256:") && long.len() == 71, "{long}");
        assert_eq!(aws_id("schöne grüße".as_bytes()), aws_id("schöne grüße".as_bytes()));
        assert!(aws_id(b"with space").starts_with("sha256:"));
        assert!(aws_id(b"").starts_with("sha256:"));
    }

    #[test]
    fn what_the_service_would_refuse_is_refused_with_the_fix() {
        let eleven: Vec<RecordHeader> = (0..9)
            .map(|i| (Cow::Owned(format!("h{i}")), Some(Cow::Borrowed(&b"v"[..]))))
            .collect();
        let err = FIFO.encode(Handover::of(&record(&eleven, Some(b"{}")))).unwrap_err();
        assert!(
            err.contains("11 attributes") && err.contains("headers = \"json\""),
            "{err}"
        );
        let json = Encoder {
            headers: HeaderMode::Json,
            ..FIFO
        };
        let m = json.encode(Handover::of(&record(&eleven, Some(b"{}")))).unwrap();
        assert_eq!(m.attributes.len(), 3);
        let Value::Text(text) = &m.attributes["headers"] else {
            panic!()
        };
        let parsed: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(parsed["h8"], "v");
        let big = vec![b'x'; 1000];
        let err = FIFO.encode(Handover::of(&record(&[], Some(&big)))).unwrap_err();
        assert!(err.contains("max_message_bytes"), "{err}");
        let err = FIFO.encode(Handover::of(&record(&[], Some(b"\xff")))).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
        let err = FIFO.encode(Handover::of(&record(&[], Some(b"a\x01b")))).unwrap_err();
        assert!(err.contains("control characters"), "{err}");
        let bad_name = [(Cow::Borrowed("AWS.trace"), Some(Cow::Borrowed(&b"v"[..])))];
        let err = FIFO.encode(Handover::of(&record(&bad_name, Some(b"{}")))).unwrap_err();
        assert!(err.contains("attribute name"), "{err}");
    }

    #[test]
    fn the_service_is_named_in_the_fix() {
        let sns = Encoder { service: &SNS, ..FIFO };
        let bad_name = [(Cow::Borrowed("AWS.trace"), Some(Cow::Borrowed(&b"v"[..])))];
        let err = sns.encode(Handover::of(&record(&bad_name, Some(b"{}")))).unwrap_err();
        assert!(err.contains("SNS") && err.contains("[sns]"), "{err}");
        let err = sns.encode(Handover::of(&record(&[], Some(b"")))).unwrap_err();
        assert!(err.contains("SNS"), "{err}");
    }

    #[test]
    fn queue_and_topic_names() {
        assert!(SQS.check_fifo_name("orders.fifo").is_ok());
        assert!(SQS.check_fifo_name("orders").unwrap_err().contains("orders.fifo"));
        assert!(SQS.check_standard_name("orders-1_a").is_ok());
        assert!(SQS
            .check_standard_name("orders.fifo")
            .unwrap_err()
            .contains("fifo = true"));
        assert!(SQS.check_standard_name("a.b").is_err());
        assert!(SQS.check_standard_name(&"x".repeat(81)).is_err());
        assert!(SQS.check_fifo_name(&format!("{}.fifo", "x".repeat(76))).is_err());
        assert!(SQS.check_fifo_name(&format!("{}.fifo", "x".repeat(75))).is_ok());
        assert!(SNS.check_standard_name(&"x".repeat(256)).is_ok());
        assert!(SNS.check_standard_name(&"x".repeat(257)).is_err());
        assert!(SNS.check_fifo_name(&format!("{}.fifo", "x".repeat(251))).is_ok());
        assert!(SNS.check_fifo_name(&format!("{}.fifo", "x".repeat(252))).is_err());
        let err = SNS.check_fifo_name("orders").unwrap_err();
        assert!(err.contains("FIFO topic") && err.contains("[sns]"), "{err}");
    }
}
