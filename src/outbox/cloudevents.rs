//! An event as a CloudEvent 1.0 (`[cloudevents]`), in the Kafka protocol binding's binary or
//! structured content mode.
//!
//! Attributes: `specversion` 1.0, `id` the event id, `source` per table (configured or
//! `/outbox-relay/<database>/<schema>.<table>`), `type` the route-by value, `subject` the key,
//! `time` the timestamp column's time or else the commit time (omitted when neither is known: a
//! polled row without a timestamp column), `datacontenttype` configured or derived from the
//! payload ([`content_type`]), the configured extensions (a NULL column omits its attribute), and
//! the Distributed Tracing extension's `traceparent`/`tracestate` from `outbox.trace_column` (a
//! `tracestate` only with a `traceparent`, as W3C Trace Context has it).
//!
//! * **binary**: the value is the payload, untouched; attributes are `ce_<name>` headers and the
//!   content type is `content-type`.
//! * **structured**: the value is one `application/cloudevents+json` object (attributes, then
//!   `data`: a JSON payload inline, other text as a JSON string, binary as `data_base64`); the
//!   `traceparent`/`tracestate` also stay plain headers, where tracing instrumentations look.
//!
//! Invariant: pure; the same event and settings give the same bytes (the JSON is written here,
//! field by field in a fixed order, not through a map). Only reached when `[cloudevents]` is set:
//! a relay without it pays nothing.

use std::borrow::Cow;

use crate::config::cloudevents::{CloudEventsMode, CloudEventsSettings};
use crate::config::ident::TableName;
use crate::ops::units::civil_from_days;
use crate::outbox::payload::PayloadFormat;
use crate::sink::RecordHeader;

/// The content type header of a structured-mode record (the JSON event format's media type).
pub(crate) const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
const SPEC_VERSION: &str = "1.0";
const JSON: &str = "application/json";
const OCTET_STREAM: &str = "application/octet-stream";
const TEXT: &str = "text/plain; charset=utf-8";

/// A record's value and headers as a CloudEvent; the `id` header and the destination are the
/// caller's, as for every record.
#[derive(Debug)]
pub(crate) struct Rendered<'r> {
    pub(crate) value: Option<Cow<'r, [u8]>>,
    /// The CloudEvents headers, then the event's `header_columns`.
    pub(crate) headers: Vec<RecordHeader<'r>>,
}

/// What a CloudEvent is made of: an outbox event's values, borrowed
/// (`crate::outbox::event::OutboxEvent::record` lends them). Its own type so this file needs
/// nothing of `event.rs`, which calls it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'r> {
    pub(crate) id: &'r [u8],
    pub(crate) key: &'r [u8],
    pub(crate) route_value: &'r str,
    pub(crate) payload: Option<&'r [u8]>,
    pub(crate) payload_format: PayloadFormat,
    pub(crate) timestamp_ms: Option<i64>,
    pub(crate) commit_time_us: Option<i64>,
    pub(crate) table: Option<&'r TableName>,
    pub(crate) headers: &'r [RecordHeader<'r>],
    pub(crate) traceparent: Option<&'r [u8]>,
    pub(crate) tracestate: Option<&'r [u8]>,
    /// In `CloudEventsSettings::extensions` order (`None` = NULL: left out).
    pub(crate) extensions: &'r [Option<Cow<'r, [u8]>>],
}

/// `event` as a CloudEvent under `ce`.
pub(crate) fn render<'r>(event: Source<'r>, ce: &'r CloudEventsSettings) -> Rendered<'r> {
    let source = ce.source_of(event.table);
    let content_type = content_type(&event, ce);
    let time = event
        .timestamp_ms
        .map(|ms| ms.saturating_mul(1000))
        .or(event.commit_time_us)
        .and_then(rfc3339);
    let extensions = ce
        .extensions
        .iter()
        .zip(event.extensions)
        .filter_map(|(ext, value)| value.as_deref().map(|v| (ext, v)));
    match ce.mode {
        CloudEventsMode::Binary => {
            let mut headers: Vec<RecordHeader<'r>> = Vec::with_capacity(9 + ce.extensions.len() + event.headers.len());
            let mut put = |name: &'r str, value: Cow<'r, [u8]>| headers.push((Cow::Borrowed(name), Some(value)));
            put("ce_specversion", Cow::Borrowed(SPEC_VERSION.as_bytes()));
            put("ce_id", Cow::Borrowed(event.id));
            put("ce_source", Cow::Borrowed(source.as_bytes()));
            put("ce_type", Cow::Borrowed(event.route_value.as_bytes()));
            if let Some(time) = time {
                put("ce_time", Cow::Owned(time.into_bytes()));
            }
            put("ce_subject", Cow::Borrowed(event.key));
            put(
                "content-type",
                match content_type {
                    Cow::Borrowed(ct) => Cow::Borrowed(ct.as_bytes()),
                    Cow::Owned(ct) => Cow::Owned(ct.into_bytes()),
                },
            );
            for (ext, value) in extensions {
                put(&ext.header, Cow::Borrowed(value));
            }
            if let Some(tp) = event.traceparent {
                put("ce_traceparent", Cow::Borrowed(tp));
                if let Some(ts) = event.tracestate {
                    put("ce_tracestate", Cow::Borrowed(ts));
                }
            }
            headers.extend(event.headers.iter().cloned());
            Rendered {
                value: event.payload.map(Cow::Borrowed),
                headers,
            }
        }
        CloudEventsMode::Structured => {
            let payload_len = event.payload.map_or(0, <[u8]>::len);
            let mut out = Vec::with_capacity(256 + payload_len * 4 / 3);
            out.extend_from_slice(b"{\"specversion\":\"1.0\"");
            field(&mut out, "id", event.id);
            field(&mut out, "source", source.as_bytes());
            field(&mut out, "type", event.route_value.as_bytes());
            field(&mut out, "subject", event.key);
            if let Some(time) = &time {
                field(&mut out, "time", time.as_bytes());
            }
            field(&mut out, "datacontenttype", content_type.as_bytes());
            for (ext, value) in extensions {
                field(&mut out, &ext.name, value);
            }
            if let Some(tp) = event.traceparent {
                field(&mut out, "traceparent", tp);
                if let Some(ts) = event.tracestate {
                    field(&mut out, "tracestate", ts);
                }
            }
            if let Some(payload) = event.payload {
                if is_json_type(&content_type) && is_json(payload) {
                    out.extend_from_slice(b",\"data\":");
                    out.extend_from_slice(payload);
                } else if event.payload_format == PayloadFormat::Text && std::str::from_utf8(payload).is_ok() {
                    field(&mut out, "data", payload);
                } else {
                    out.extend_from_slice(b",\"data_base64\":\"");
                    base64(payload, &mut out);
                    out.push(b'"');
                }
            }
            out.push(b'}');
            let mut headers: Vec<RecordHeader<'r>> = Vec::with_capacity(3 + event.headers.len());
            headers.push((
                Cow::Borrowed("content-type"),
                Some(Cow::Borrowed(STRUCTURED_CONTENT_TYPE.as_bytes())),
            ));
            if let Some(tp) = event.traceparent {
                headers.push((Cow::Borrowed("traceparent"), Some(Cow::Borrowed(tp))));
                if let Some(ts) = event.tracestate {
                    headers.push((Cow::Borrowed("tracestate"), Some(Cow::Borrowed(ts))));
                }
            }
            headers.extend(event.headers.iter().cloned());
            Rendered {
                value: Some(Cow::Owned(out)),
                headers,
            }
        }
    }
}

/// The `datacontenttype`: configured, else from the payload — `application/octet-stream` for a
/// `bytea` column, `application/json` for text that is JSON (json/jsonb always are), plain text
/// otherwise.
pub(crate) fn content_type<'r>(event: &Source<'_>, ce: &'r CloudEventsSettings) -> Cow<'r, str> {
    if let Some(ct) = &ce.content_type {
        return Cow::Borrowed(ct);
    }
    Cow::Borrowed(match (event.payload_format, event.payload) {
        (PayloadFormat::Bytea, _) => OCTET_STREAM,
        (PayloadFormat::Text, Some(p)) if is_json(p) => JSON,
        (PayloadFormat::Text, _) => TEXT,
    })
}

/// A JSON media type: `application/json`, `text/json` or a `+json` structured suffix, with or
/// without parameters (the JSON event format's rule for inlining `data`).
fn is_json_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// One JSON value (whitespace around it allowed): may be inlined as `data` byte for byte.
fn is_json(payload: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok()
}

/// `,"name":"value"`, the value as a JSON string (lossy for bytes that are not UTF-8, which
/// column text never is).
fn field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(b',');
    json_string(out, name);
    out.push(b':');
    json_string(out, &String::from_utf8_lossy(value));
}

/// `s` as a JSON string, escaped as serde_json escapes (quote, backslash, control characters).
fn json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x00..=0x1F => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xF)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Standard base64 with padding (RFC 4648 §4), as `data_base64` requires.
fn base64(bytes: &[u8], out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(chunk.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(chunk.get(2).copied().unwrap_or(0));
        let sextet = |shift: u32| ALPHABET[((n >> shift) & 0x3F) as usize];
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { b'=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { b'=' });
    }
}

/// Unix microseconds as RFC 3339 in UTC (`2024-05-01T12:30:00.250Z`): the fraction as short as
/// it is exact (none, milliseconds or microseconds). `None` outside years 0001–9999, which RFC
/// 3339 cannot write.
pub(crate) fn rfc3339(unix_us: i64) -> Option<String> {
    let secs = unix_us.div_euclid(1_000_000);
    let micros = unix_us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    if !(1..=9999).contains(&year) {
        return None;
    }
    let (h, m, s) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    let fraction = if micros == 0 {
        String::new()
    } else if micros % 1000 == 0 {
        format!(".{:03}", micros / 1000)
    } else {
        format!(".{micros:06}")
    };
    Some(format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}{fraction}Z"))
}

#[cfg(test)]
mod tests;
