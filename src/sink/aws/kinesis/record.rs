//! A relay record as a Kinesis record (docs/sink-kinesis.md, "What a consumer gets"): the
//! aggregate key is the partition key, and the data is either the envelope — one JSON object
//! holding the event id, the key, the headers and the payload — or the payload alone
//! (`[kinesis] format`). Kinesis records have nothing else: no attributes, no headers.
//!
//! Partition keys are 1 to 256 Unicode characters. A key Kinesis would not take as it is —
//! empty, longer than 256 characters (counted as UTF-16 code units, the stricter count), or
//! not UTF-8 — is replaced by `sha256:` and the SHA-256 of its bytes in hex (71 characters),
//! as the Pub/Sub sink does for ordering keys: the same key always gives the same partition
//! key, so all of an aggregate's records still go to one shard, in order.
//!
//! Invariant: everything Kinesis would refuse for what the record *is* — data and partition
//! key above `max_record_bytes` (1 MiB at most) — is refused here, before sending, with the fix
//! in the words.

use std::fmt::Write as _;

use base64::Engine as _;
use serde_json::value::RawValue;

use super::config::Format;
use crate::sink::SinkRecord;

/// Kinesis's limit on a partition key, in Unicode characters.
pub(crate) const MAX_PARTITION_KEY_CHARS: usize = 256;
/// The prefix of a partition key hashed because Kinesis would not take the key as it is.
pub(crate) const HASHED_KEY_PREFIX: &str = "sha256:";

/// One record, owning everything, for its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The routed name: the stream.
    pub(crate) stream: String,
    pub(crate) partition_key: String,
    pub(crate) data: Vec<u8>,
}

impl Record {
    /// What Kinesis counts against its per-record (1 MiB) and per-call (5 MiB) limits: the
    /// data and the partition key.
    pub(crate) fn size(&self) -> usize {
        self.data.len() + self.partition_key.len()
    }
}

/// How records become Kinesis records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoder {
    pub(crate) format: Format,
    pub(crate) max_record_bytes: usize,
}

/// The partition key of `key`: itself when Kinesis takes it, else its hashed form (module docs).
pub(crate) fn partition_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.is_empty() && text.encode_utf16().count() <= MAX_PARTITION_KEY_CHARS => text.to_owned(),
        _ => {
            let digest = ring::digest::digest(&ring::digest::SHA256, key);
            let mut out = String::with_capacity(HASHED_KEY_PREFIX.len() + 64);
            out.push_str(HASHED_KEY_PREFIX);
            for b in digest.as_ref() {
                let _ = write!(out, "{b:02x}");
            }
            out
        }
    }
}

/// A byte string as a JSON value: a string when it is UTF-8, else `{"base64": "…"}`.
fn bytes_value(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::Value::String(text.to_owned()),
        Err(_) => serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

/// Appends `"name":` and the JSON text of `value` to `out`.
fn field(out: &mut Vec<u8>, name: &str, value: &serde_json::Value) {
    // Writing JSON into a Vec cannot fail.
    serde_json::to_writer(&mut *out, name).expect("JSON into memory");
    out.push(b':');
    serde_json::to_writer(&mut *out, value).expect("JSON into memory");
}

/// The envelope of `record` (docs/sink-kinesis.md): `{"id", "key", "headers", "payload"}`,
/// the payload embedded as it is when it is JSON (an outbox payload is `jsonb`), as
/// `"payload_base64"` otherwise, `"payload": null` for a NULL payload.
fn envelope(record: &SinkRecord<'_>, extra: &[(&str, &[u8])]) -> Vec<u8> {
    let payload_len = record.value.as_ref().map_or(0, |v| v.len());
    let mut out = Vec::with_capacity(payload_len + 256);
    out.push(b'{');
    field(&mut out, "id", &bytes_value(record.event_id));
    out.push(b',');
    field(&mut out, "key", &bytes_value(&record.key));
    out.push(b',');
    let mut headers = serde_json::Map::new();
    for (name, value) in record.headers_with(extra) {
        headers.insert(name.to_owned(), value.map_or(serde_json::Value::Null, bytes_value));
    }
    field(&mut out, "headers", &serde_json::Value::Object(headers));
    out.push(b',');
    match record.value.as_deref() {
        None => out.extend_from_slice(b"\"payload\":null"),
        Some(bytes) => match serde_json::from_slice::<&RawValue>(bytes) {
            // Embedded byte for byte: the consumer reads back exactly the payload's text.
            Ok(raw) => {
                out.extend_from_slice(b"\"payload\":");
                out.extend_from_slice(raw.get().as_bytes());
            }
            Err(_) => field(
                &mut out,
                "payload_base64",
                &serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            ),
        },
    }
    out.push(b'}');
    out
}

impl Encoder {
    /// The Kinesis record of `record`; `Err`: why Kinesis would refuse it (a bad event).
    pub(crate) fn encode(&self, record: &SinkRecord<'_>, extra: &[(&str, &[u8])]) -> Result<Record, String> {
        let partition_key = partition_key(&record.key);
        let data = match self.format {
            Format::Envelope => envelope(record, extra),
            // A NULL payload is an empty record, as Debezium Server sends it.
            Format::Payload => record.value.as_deref().unwrap_or_default().to_vec(),
        };
        let record = Record {
            stream: record.destination.clone().into_owned(),
            partition_key,
            data,
        };
        if record.size() > self.max_record_bytes {
            return Err(format!(
                "the Kinesis record would be {} bytes (data {} + partition key {}{}), larger than [kinesis] \
                 max_record_bytes = {} (Kinesis's limit is 1 MiB per record, data and partition key); keep large \
                 payloads elsewhere (S3) and send a reference",
                record.size(),
                record.data.len(),
                record.partition_key.len(),
                match self.format {
                    Format::Envelope => ", the data being the JSON envelope of id, key, headers and payload",
                    Format::Payload => "",
                },
                self.max_record_bytes
            ));
        }
        Ok(record)
    }

    /// The largest payload a dead letter may carry so that its record still fits: the
    /// envelope may carry a cut (no longer JSON) payload as base64, a third larger.
    pub(crate) fn max_message_bytes(&self) -> usize {
        match self.format {
            Format::Envelope => (self.max_record_bytes / 4 * 3)
                .saturating_sub(4096)
                .max(self.max_record_bytes / 2),
            Format::Payload => self.max_record_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::sink::aws::message::tests::HEADERS;
    use crate::sink::RecordHeader;

    fn record<'a>(key: &'a [u8], headers: &'a [RecordHeader<'a>], value: Option<&'a [u8]>) -> SinkRecord<'a> {
        SinkRecord {
            destination: Cow::Borrowed("orders"),
            key: Cow::Borrowed(key),
            value: value.map(Cow::Borrowed),
            event_id: b"42",
            timestamp_ms: Some(1),
            headers: Cow::Borrowed(headers),
            partition: None,
        }
    }

    const ENVELOPE: Encoder = Encoder {
        format: Format::Envelope,
        max_record_bytes: 1 << 20,
    };

    #[test]
    fn the_envelope_carries_id_key_headers_and_the_payload_as_it_is() {
        let payload = b"{\"b\": 1,  \"a\": [1.50, \"\\u00e9\"]}";
        let r = ENVELOPE
            .encode(&record(b"agg-1", &HEADERS, Some(payload)), &[("pos", b"0/1")])
            .unwrap();
        assert_eq!((r.stream.as_str(), r.partition_key.as_str()), ("orders", "agg-1"));
        let text = std::str::from_utf8(&r.data).unwrap();
        assert!(
            text.starts_with("{\"id\":\"42\",\"key\":\"agg-1\",\"headers\":{"),
            "{text}"
        );
        assert!(
            text.ends_with(&format!("\"payload\":{}}}", std::str::from_utf8(payload).unwrap())),
            "the payload's text, byte for byte: {text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&r.data).unwrap();
        assert_eq!(v["headers"]["tenant"], "t1");
        assert_eq!(v["headers"]["none"], serde_json::Value::Null);
        assert_eq!(v["headers"]["raw"]["base64"], "/wA=");
        assert_eq!(v["headers"]["pos"], "0/1", "the caller's extra headers too");
        assert_eq!(r.size(), r.data.len() + 5);

        let r = ENVELOPE.encode(&record(b"k", &[], None), &[]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.data).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": "42", "key": "k", "headers": {}, "payload": null})
        );
        let r = ENVELOPE
            .encode(&record(b"k", &[], Some(b"not json \xff")), &[])
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.data).unwrap();
        assert_eq!(v["payload_base64"], "bm90IGpzb24g/w==");
        assert!(v.get("payload").is_none());
    }

    #[test]
    fn the_payload_format_sends_the_payload_alone() {
        let payload = Encoder {
            format: Format::Payload,
            ..ENVELOPE
        };
        let headers = [(Cow::Borrowed("tenant"), Some(Cow::Borrowed(&b"t1"[..])))];
        let r = payload
            .encode(&record(b"agg", &headers, Some(b"\x00bin")), &[])
            .unwrap();
        assert_eq!(r.data, b"\x00bin");
        assert_eq!(payload.encode(&record(b"agg", &[], None), &[]).unwrap().data, b"");
    }

    #[test]
    fn partition_keys_kinesis_would_refuse_are_hashed_the_same_way_each_time() {
        assert_eq!(partition_key(b"2b7e1a8c-0d3f-4c55"), "2b7e1a8c-0d3f-4c55");
        let at_limit = "ü".repeat(256);
        assert_eq!(
            partition_key(at_limit.as_bytes()),
            at_limit,
            "256 characters, 512 bytes"
        );
        let long = partition_key(&[b'x'; 257]);
        assert!(long.starts_with(HASHED_KEY_PREFIX) && long.len() == 71, "{long}");
        assert_eq!(long, partition_key(&[b'x'; 257]), "deterministic");
        assert_ne!(long, partition_key(&[b'x'; 258]));
        // 129 characters outside the BMP: 258 UTF-16 code units.
        assert!(partition_key("😀".repeat(129).as_bytes()).starts_with(HASHED_KEY_PREFIX));
        assert!(partition_key(b"").starts_with(HASHED_KEY_PREFIX));
        assert!(partition_key(b"\xff").starts_with(HASHED_KEY_PREFIX));
        let r = ENVELOPE.encode(&record(&[b'k'; 300], &[], Some(b"1")), &[]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.data).unwrap();
        assert_eq!(v["key"], "k".repeat(300), "the envelope keeps the real key");
    }

    #[test]
    fn a_record_over_the_limit_is_refused_with_the_fix() {
        let small = Encoder {
            format: Format::Payload,
            max_record_bytes: 1024,
        };
        assert!(small.encode(&record(b"abcd", &[], Some(&[b'x'; 1020])), &[]).is_ok());
        let err = small
            .encode(&record(b"abcde", &[], Some(&[b'x'; 1020])), &[])
            .unwrap_err();
        assert!(
            err.contains("1025 bytes") && err.contains("partition key 5") && err.contains("max_record_bytes"),
            "the partition key counts: {err}"
        );
        let err = Encoder {
            max_record_bytes: 1024,
            ..ENVELOPE
        }
        .encode(&record(b"k", &[], Some(&[b'1'; 1000])), &[])
        .unwrap_err();
        assert!(err.contains("envelope"), "{err}");
        assert!(ENVELOPE.max_message_bytes() / 3 * 4 < ENVELOPE.max_record_bytes);
        let smallest = Encoder {
            max_record_bytes: 1024,
            ..ENVELOPE
        };
        assert_eq!(smallest.max_message_bytes(), 512, "no underflow at the smallest limit");
    }
}
