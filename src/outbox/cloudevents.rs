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
use crate::outbox::event::OutboxEvent;
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

/// `event` as a CloudEvent under `ce`.
pub(crate) fn render<'r>(event: &'r OutboxEvent<'_>, ce: &'r CloudEventsSettings) -> Rendered<'r> {
    let source = ce.source_of(event.table.as_deref());
    let content_type = content_type(event, ce);
    let time = event
        .timestamp_ms
        .map(|ms| ms.saturating_mul(1000))
        .or(event.commit_time_us)
        .and_then(rfc3339);
    let extensions = ce
        .extensions
        .iter()
        .zip(&event.extensions)
        .filter_map(|(ext, value)| value.as_deref().map(|v| (ext, v)));
    match ce.mode {
        CloudEventsMode::Binary => {
            let mut headers: Vec<RecordHeader<'r>> = Vec::with_capacity(9 + ce.extensions.len() + event.headers.len());
            let mut put = |name: &'r str, value: Cow<'r, [u8]>| headers.push((Cow::Borrowed(name), Some(value)));
            put("ce_specversion", Cow::Borrowed(SPEC_VERSION.as_bytes()));
            put("ce_id", Cow::Borrowed(&event.id));
            put("ce_source", Cow::Borrowed(source.as_bytes()));
            put("ce_type", Cow::Borrowed(event.route_value.as_bytes()));
            if let Some(time) = time {
                put("ce_time", Cow::Owned(time.into_bytes()));
            }
            put("ce_subject", Cow::Borrowed(&event.key));
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
            if let Some(tp) = &event.traceparent {
                put("ce_traceparent", Cow::Borrowed(tp));
                if let Some(ts) = &event.tracestate {
                    put("ce_tracestate", Cow::Borrowed(ts));
                }
            }
            headers.extend(event.headers.iter().cloned());
            Rendered {
                value: event.payload.as_deref().map(Cow::Borrowed),
                headers,
            }
        }
        CloudEventsMode::Structured => {
            let payload_len = event.payload.as_ref().map_or(0, |p| p.len());
            let mut out = Vec::with_capacity(256 + payload_len * 4 / 3);
            out.extend_from_slice(b"{\"specversion\":\"1.0\"");
            field(&mut out, "id", &event.id);
            field(&mut out, "source", source.as_bytes());
            field(&mut out, "type", event.route_value.as_bytes());
            field(&mut out, "subject", &event.key);
            if let Some(time) = &time {
                field(&mut out, "time", time.as_bytes());
            }
            field(&mut out, "datacontenttype", content_type.as_bytes());
            for (ext, value) in extensions {
                field(&mut out, &ext.name, value);
            }
            if let Some(tp) = &event.traceparent {
                field(&mut out, "traceparent", tp);
                if let Some(ts) = &event.tracestate {
                    field(&mut out, "tracestate", ts);
                }
            }
            if let Some(payload) = event.payload.as_deref() {
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
            if let Some(tp) = &event.traceparent {
                headers.push((Cow::Borrowed("traceparent"), Some(Cow::Borrowed(tp))));
                if let Some(ts) = &event.tracestate {
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
pub(crate) fn content_type<'r>(event: &OutboxEvent<'_>, ce: &'r CloudEventsSettings) -> Cow<'r, str> {
    if let Some(ct) = &ce.content_type {
        return Cow::Borrowed(ct);
    }
    Cow::Borrowed(match (event.payload_format, event.payload.as_deref()) {
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

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::test_support::settings;
    use crate::outbox::event::RowFormat;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// Extension `tenant` from column `tenant`, a trace column pair and a header column.
    const CONFIG: &str = "[outbox]\ntimestamp_column = \"created_at\"\ntrace_column = \"tp\"\n\
        tracestate_column = \"ts\"\nheader_columns = { h = \"x-h\" }\n";

    fn settings_in(mode: &str) -> crate::config::Settings {
        settings(&format!(
            "{CONFIG}[cloudevents]\nmode = \"{mode}\"\nextensions = {{ tenant = \"tenant\", region = \"region\" }}\n"
        ))
    }

    /// Column values in `OutboxMapping::columns` order: id, key, type, payload, created_at, h,
    /// tp, ts, then the extensions by name (region, tenant).
    fn values<'a>(payload: &'a str, tp: Option<&'a str>) -> Vec<Option<&'a str>> {
        vec![
            Some("42"),
            Some("agg-1"),
            Some("order.placed"),
            Some(payload),
            Some("2024-05-01 12:30:00.25+00"),
            Some("hv"),
            tp,
            Some("vendor=x"),
            None,
            Some("acme"),
        ]
    }

    fn event<'a>(s: &'a crate::config::Settings, values: &[Option<&'a str>], format: PayloadFormat) -> OutboxEvent<'a> {
        let rows = RowFormat {
            payload: format,
            connect: None,
        };
        OutboxEvent::from_columns(&s.outbox, &s.outbox.tables[0], values, &rows).unwrap()
    }

    fn header<'h>(headers: &'h [RecordHeader<'_>], name: &str) -> Option<&'h [u8]> {
        headers.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    #[test]
    fn structured_mode_writes_the_documented_bytes() {
        let s = settings_in("structured");
        let ce = s.cloudevents.as_ref().unwrap();
        let values = values(r#"{"total": 42, "lines": ["a"]}"#, Some(TRACEPARENT));
        let e = event(&s, &values, PayloadFormat::Text);
        let rendered = render(&e, ce);
        let expected = concat!(
            r#"{"specversion":"1.0","id":"42","source":"/outbox-relay/app/public.events_outbox","#,
            r#""type":"order.placed","subject":"agg-1","time":"2024-05-01T12:30:00.250Z","#,
            r#""datacontenttype":"application/json","tenant":"acme","#,
            r#""traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","#,
            r#""tracestate":"vendor=x","data":{"total": 42, "lines": ["a"]}}"#
        );
        assert_eq!(
            std::str::from_utf8(rendered.value.as_deref().unwrap()).unwrap(),
            expected
        );
        let names: Vec<&str> = rendered.headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, ["content-type", "traceparent", "tracestate", "x-h"]);
        assert_eq!(
            header(&rendered.headers, "content-type"),
            Some(STRUCTURED_CONTENT_TYPE.as_bytes())
        );
        // The envelope is JSON that serde reads back to the same attributes.
        let v: serde_json::Value = serde_json::from_slice(rendered.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["data"]["total"], 42);
        assert!(v.get("region").is_none(), "a NULL extension column omits the attribute");
    }

    #[test]
    fn structured_mode_writes_binary_as_base64_and_text_as_a_string() {
        let s = settings_in("structured");
        let ce = s.cloudevents.as_ref().unwrap();
        let bytea = values(r"\x00ff10", None);
        let e = event(&s, &bytea, PayloadFormat::Bytea);
        let rendered = render(&e, ce);
        let v: serde_json::Value = serde_json::from_slice(rendered.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["data_base64"], "AP8Q");
        assert_eq!(v["datacontenttype"], "application/octet-stream");
        assert!(v.get("data").is_none() && v.get("traceparent").is_none());
        assert_eq!(header(&rendered.headers, "traceparent"), None);

        let text = values("not \"json\"\n", None);
        let e = event(&s, &text, PayloadFormat::Text);
        let rendered = render(&e, ce);
        let v: serde_json::Value = serde_json::from_slice(rendered.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["data"], "not \"json\"\n");
        assert_eq!(v["datacontenttype"], "text/plain; charset=utf-8");
    }

    #[test]
    fn binary_mode_keeps_the_payload_and_writes_ce_headers() {
        let s = settings_in("binary");
        let ce = s.cloudevents.as_ref().unwrap();
        let values = values(r#"{"a":1}"#, Some("not-a-traceparent"));
        let e = event(&s, &values, PayloadFormat::Text);
        let rendered = render(&e, ce);
        assert!(matches!(rendered.value, Some(Cow::Borrowed(p)) if p == br#"{"a":1}"#));
        let pairs: Vec<(&str, &str)> = rendered
            .headers
            .iter()
            .map(|(n, v)| (&**n, std::str::from_utf8(v.as_deref().unwrap()).unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("ce_specversion", "1.0"),
                ("ce_id", "42"),
                ("ce_source", "/outbox-relay/app/public.events_outbox"),
                ("ce_type", "order.placed"),
                ("ce_time", "2024-05-01T12:30:00.250Z"),
                ("ce_subject", "agg-1"),
                ("content-type", "application/json"),
                ("ce_tenant", "acme"),
                ("ce_traceparent", "not-a-traceparent"),
                ("ce_tracestate", "vendor=x"),
                ("x-h", "hv"),
            ]
        );
    }

    #[test]
    fn time_falls_back_to_the_commit_time_and_is_omitted_without_either() {
        let s = settings("[cloudevents]\ncontent_type = \"application/vnd.acme+json\"\n");
        let ce = s.cloudevents.as_ref().unwrap();
        let values = [Some("1"), Some("k"), Some("t"), Some("{}")];
        let polled = event(&s, &values, PayloadFormat::Text);
        let rendered = render(&polled, ce);
        assert_eq!(header(&rendered.headers, "ce_time"), None);
        assert_eq!(
            header(&rendered.headers, "content-type"),
            Some(&b"application/vnd.acme+json"[..])
        );
        let streamed = polled.with_commit_time(1_714_566_600_123_456);
        let rendered = render(&streamed, ce);
        assert_eq!(
            header(&rendered.headers, "ce_time"),
            Some(&b"2024-05-01T12:30:00.123456Z"[..])
        );
    }

    #[test]
    fn rfc3339_edges() {
        assert_eq!(rfc3339(0).as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(rfc3339(-1).as_deref(), Some("1969-12-31T23:59:59.999999Z"));
        assert_eq!(rfc3339(951_782_400_000_000).as_deref(), Some("2000-02-29T00:00:00Z"));
        assert_eq!(
            rfc3339(253_402_300_799_000_000).as_deref(),
            Some("9999-12-31T23:59:59Z")
        );
        assert_eq!(rfc3339(253_402_300_800_000_000), None);
        assert_eq!(rfc3339(i64::MIN), None);
    }

    #[test]
    fn base64_pads() {
        let enc = |b: &[u8]| {
            let mut out = Vec::new();
            base64(b, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(enc(b""), "");
        assert_eq!(enc(b"f"), "Zg==");
        assert_eq!(enc(b"fo"), "Zm8=");
        assert_eq!(enc(b"foobar"), "Zm9vYmFy");
    }

    proptest! {
        #[test]
        fn any_text_gives_a_json_envelope(id in "\\PC{0,12}", key in "(?s).{0,12}", payload in "(?s).{0,40}") {
            let s = settings("[cloudevents]\nmode = \"structured\"\n");
            let ce = s.cloudevents.as_ref().unwrap();
            let values = [Some(id.as_str()), Some(key.as_str()), Some("t"), Some(payload.as_str())];
            let e = event(&s, &values, PayloadFormat::Text);
            let rendered = render(&e, ce);
            let v: serde_json::Value = serde_json::from_slice(rendered.value.as_deref().unwrap()).unwrap();
            prop_assert_eq!(v["id"].as_str(), Some(id.as_str()));
            prop_assert_eq!(v["subject"].as_str(), Some(key.as_str()));
            match serde_json::from_str::<serde_json::Value>(&payload) {
                Ok(json) => prop_assert_eq!(&v["data"], &json),
                Err(_) => prop_assert_eq!(v["data"].as_str(), Some(payload.as_str())),
            }
        }

        #[test]
        // The parser takes 1970 on (Kafka timestamps); earlier instants are covered by `rfc3339_edges`.
        fn rfc3339_agrees_with_the_timestamp_parser(us in 0i64..253_402_300_799_999_999) {
            let text = rfc3339(us).unwrap();
            let pg = text.replace('T', " ").replace('Z', "+00");
            prop_assert_eq!(crate::outbox::timestamp::parse_timestamp_ms(pg.as_bytes()), Some(us.div_euclid(1000)));
        }
    }
}
