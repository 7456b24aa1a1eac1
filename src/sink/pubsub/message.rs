//! A record as a Pub/Sub message: the payload as `data`, the aggregate key as the ordering key,
//! and the attributes `id` (the event id), `key` (the aggregate key), then the record's headers
//! and the caller's extra ones — checked against Pub/Sub's limits before anything is sent, so a
//! message the service would refuse is refused on sight (`relay.on_bad_event` decides).
//!
//! Limits (https://cloud.google.com/pubsub/quotas#resource_limits): a message of at most
//! 10 MB (data, attributes and ordering key), at most 100 attributes, an attribute name of at
//! most 256 bytes not starting with `goog`, a value of at most 1,024 bytes, an ordering key of
//! at most 1,024 bytes. Attributes are text: a header whose value is not UTF-8 is refused, and a
//! NULL header is left out (Pub/Sub has no null value).
//!
//! Ordering keys above 1,024 bytes (or not UTF-8) are hashed, as Sequin does:
//! `sha256:<64 hex digits>` of the key's bytes. The same key always gives the same hash, so the
//! aggregate's order holds; the `key` attribute then carries the same hashed form (it has the
//! same 1,024-byte limit), and consumers find the aggregate in the payload.
//!
//! CloudEvents (the Pub/Sub protocol binding): in binary mode each `ce_<attr>` header of the
//! record becomes the attribute `ce-<attr>`, and `content-type` stays `content-type` (the
//! binding's `datacontenttype`); structured mode needs nothing (the envelope is the data).

use std::collections::HashMap;

use crate::config::cloudevents::CloudEventsMode;
use crate::sink::SinkRecord;

/// Attribute holding the event id (consumers deduplicate on it).
pub(crate) const ID_ATTRIBUTE: &str = "id";
/// Attribute holding the aggregate key (or its hashed form, module docs).
pub(crate) const KEY_ATTRIBUTE: &str = "key";
/// Pub/Sub's largest message (data, attributes and ordering key), 10 MB.
pub(crate) const MAX_MESSAGE_BYTES: usize = 10_000_000;
/// Pub/Sub's most attributes per message.
pub(crate) const MAX_ATTRIBUTES: usize = 100;
/// Pub/Sub's longest attribute name.
pub(crate) const MAX_ATTRIBUTE_NAME: usize = 256;
/// Pub/Sub's longest attribute value, and longest ordering key.
pub(crate) const MAX_ATTRIBUTE_VALUE: usize = 1024;
/// The prefix of an ordering key too long (or not text) to send as it is.
pub(crate) const HASHED_KEY_PREFIX: &str = "sha256:";

/// One message, owning everything, for its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outgoing {
    /// The topic id (the routed name).
    pub(crate) topic: String,
    pub(crate) data: Vec<u8>,
    pub(crate) ordering_key: String,
    pub(crate) attributes: HashMap<String, String>,
}

/// The ordering key of `key`: itself when it is UTF-8 text of at most 1,024 bytes, else its
/// hashed form (module docs).
pub(crate) fn ordering_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if key.len() <= MAX_ATTRIBUTE_VALUE => text.to_owned(),
        _ => {
            let digest = ring::digest::digest(&ring::digest::SHA256, key);
            let mut out = String::with_capacity(HASHED_KEY_PREFIX.len() + 64);
            out.push_str(HASHED_KEY_PREFIX);
            for b in digest.as_ref() {
                out.push_str(&format!("{b:02x}"));
            }
            out
        }
    }
}

/// The message of `record`; `Err`: why Pub/Sub would refuse it.
pub(crate) fn encode(
    record: &SinkRecord<'_>,
    extra: &[(&str, &[u8])],
    cloudevents: Option<CloudEventsMode>,
) -> Result<Outgoing, String> {
    let ordering_key = ordering_key(&record.key);
    let event_id = std::str::from_utf8(record.event_id)
        .map_err(|_| "the event id is not UTF-8 text, so it cannot be a Pub/Sub attribute".to_owned())?;
    let mut attributes: HashMap<String, String> = HashMap::new();
    for (name, value) in record.headers_with(extra) {
        let name = match (cloudevents, name.strip_prefix("ce_")) {
            (Some(CloudEventsMode::Binary), Some(attribute)) => format!("ce-{attribute}"),
            _ => name.to_owned(),
        };
        // Pub/Sub has no null: a NULL header is left out (an absent attribute reads as null).
        let Some(value) = value else { continue };
        let value = std::str::from_utf8(value).map_err(|_| {
            format!("header {name:?} is not UTF-8 text; Pub/Sub attributes are strings (send it in the payload)")
        })?;
        attributes.insert(name, value.to_owned());
    }
    // The relay's own attributes win over a header of the same name.
    attributes.insert(ID_ATTRIBUTE.to_owned(), event_id.to_owned());
    attributes.insert(KEY_ATTRIBUTE.to_owned(), ordering_key.clone());
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(format!(
            "{} attributes (id, key and {} headers); Pub/Sub allows at most {MAX_ATTRIBUTES} per message: send fewer \
             header columns",
            attributes.len(),
            attributes.len() - 2
        ));
    }
    let mut size = ordering_key.len();
    for (name, value) in &attributes {
        if name.len() > MAX_ATTRIBUTE_NAME {
            return Err(format!(
                "attribute name {:?}… is {} bytes; Pub/Sub allows at most {MAX_ATTRIBUTE_NAME}",
                name.chars().take(32).collect::<String>(),
                name.len()
            ));
        }
        if name.starts_with("goog") {
            return Err(format!(
                "attribute name {name:?} starts with \"goog\", which Pub/Sub reserves; rename the header"
            ));
        }
        if value.len() > MAX_ATTRIBUTE_VALUE {
            return Err(format!(
                "attribute {name:?} is {} bytes; Pub/Sub allows at most {MAX_ATTRIBUTE_VALUE} per value: send it in the \
                 payload",
                value.len()
            ));
        }
        size += name.len() + value.len();
    }
    let data = record.value.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
    size += data.len();
    if size > MAX_MESSAGE_BYTES {
        return Err(format!(
            "the message is {size} bytes (data, attributes and ordering key); Pub/Sub allows at most \
             {MAX_MESSAGE_BYTES} (10 MB): the event is larger than Pub/Sub accepts"
        ));
    }
    Ok(Outgoing {
        topic: record.destination.clone().into_owned(),
        data,
        ordering_key,
        attributes,
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn record<'a>(key: &'a [u8], value: &'a [u8], headers: Vec<crate::sink::RecordHeader<'a>>) -> SinkRecord<'a> {
        SinkRecord {
            destination: Cow::Borrowed("orders"),
            key: Cow::Borrowed(key),
            value: Some(Cow::Borrowed(value)),
            event_id: b"4f0c8f5e-1111-4222-8333-944444444444",
            timestamp_ms: Some(1),
            headers: Cow::Owned(headers),
            partition: None,
        }
    }

    /// The header `name = value`.
    fn header<'a>(name: &'a str, value: &'a [u8]) -> crate::sink::RecordHeader<'a> {
        (Cow::Borrowed(name), Some(Cow::Borrowed(value)))
    }

    #[test]
    fn id_key_and_headers_become_attributes_and_the_key_orders() {
        let headers = vec![
            header("type", b"OrderCreated"),
            header("id", b"spoofed"),
            (Cow::Borrowed("empty"), None),
        ];
        let r = record(b"agg-1", b"{\"a\":1}", headers);
        let m = encode(&r, &[("extra", b"x")], None).unwrap();
        assert_eq!(m.topic, "orders");
        assert_eq!(m.ordering_key, "agg-1");
        assert_eq!(m.data, b"{\"a\":1}");
        assert_eq!(
            m.attributes["id"], "4f0c8f5e-1111-4222-8333-944444444444",
            "the relay's id wins"
        );
        assert_eq!(m.attributes["key"], "agg-1");
        assert_eq!(m.attributes["type"], "OrderCreated");
        assert!(!m.attributes.contains_key("empty"), "a NULL header is left out");
        assert_eq!(m.attributes["extra"], "x");
        assert_eq!(m.attributes.len(), 4);
    }

    #[test]
    fn long_or_binary_keys_are_hashed_the_same_way_each_time() {
        let long = vec![b'k'; MAX_ATTRIBUTE_VALUE + 1];
        let a = ordering_key(&long);
        assert!(
            a.starts_with(HASHED_KEY_PREFIX) && a.len() == HASHED_KEY_PREFIX.len() + 64,
            "{a}"
        );
        assert_eq!(a, ordering_key(&long));
        assert_ne!(a, ordering_key(&long[1..]));
        assert_eq!(ordering_key(&long[1..]), String::from_utf8(long[1..].to_vec()).unwrap());
        assert!(ordering_key(&[0xff, 0xfe]).starts_with(HASHED_KEY_PREFIX));
        let m = encode(&record(&long, b"x", vec![]), &[], None).unwrap();
        assert_eq!(
            (m.ordering_key.as_str(), m.attributes["key"].as_str()),
            (a.as_str(), a.as_str())
        );
    }

    #[test]
    fn what_pubsub_refuses_is_refused_on_sight() {
        let names: Vec<String> = (0..MAX_ATTRIBUTES - 1).map(|i| format!("h{i}")).collect();
        let headers = names.iter().map(|n| header(n, b"v")).collect();
        let err = encode(&record(b"k", b"x", headers), &[], None).unwrap_err();
        assert!(err.contains("101 attributes") && err.contains("at most 100"), "{err}");
        let big = vec![b'x'; MAX_MESSAGE_BYTES];
        let err = encode(&record(b"k", &big, vec![]), &[], None).unwrap_err();
        assert!(err.contains("at most 10000000"), "{err}");
        /// Why a record whose one header is `name = value` is refused.
        fn refusal_with_header(name: &str, value: &[u8]) -> String {
            encode(&record(b"k", b"x", vec![header(name, value)]), &[], None).unwrap_err()
        }
        let long_value = vec![b'v'; MAX_ATTRIBUTE_VALUE + 1];
        let err = refusal_with_header("h", &long_value);
        assert!(err.contains("\"h\" is 1025 bytes"), "{err}");
        let err = refusal_with_header("googx", b"v");
        assert!(err.contains("reserves"), "{err}");
        let err = refusal_with_header("bin", &[0xff]);
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn cloudevents_binary_attributes_follow_the_pubsub_binding() {
        let headers = vec![
            header("ce_type", b"OrderCreated"),
            header("content-type", b"application/json"),
        ];
        let r = record(b"k", b"{}", headers);
        let m = encode(&r, &[], Some(CloudEventsMode::Binary)).unwrap();
        assert_eq!(m.attributes["ce-type"], "OrderCreated");
        assert_eq!(m.attributes["content-type"], "application/json");
        let plain = encode(&r, &[], None).unwrap();
        assert_eq!(plain.attributes["ce_type"], "OrderCreated");
    }
}
