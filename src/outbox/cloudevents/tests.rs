//! `[cloudevents]` rendering tested on events as every source makes them. A file of its own so
//! that `cloudevents.rs` needs nothing of `event.rs` (which calls it).

use proptest::prelude::*;

use super::*;
use crate::config::test_support::settings;
use crate::outbox::event::{OutboxEvent, RowFormat};

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
    let rendered = render(e.cloud_event(), ce);
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
    let rendered = render(e.cloud_event(), ce);
    let v: serde_json::Value = serde_json::from_slice(rendered.value.as_deref().unwrap()).unwrap();
    assert_eq!(v["data_base64"], "AP8Q");
    assert_eq!(v["datacontenttype"], "application/octet-stream");
    assert!(v.get("data").is_none() && v.get("traceparent").is_none());
    assert_eq!(header(&rendered.headers, "traceparent"), None);

    let text = values("not \"json\"\n", None);
    let e = event(&s, &text, PayloadFormat::Text);
    let rendered = render(e.cloud_event(), ce);
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
    let rendered = render(e.cloud_event(), ce);
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
    let rendered = render(polled.cloud_event(), ce);
    assert_eq!(header(&rendered.headers, "ce_time"), None);
    assert_eq!(
        header(&rendered.headers, "content-type"),
        Some(&b"application/vnd.acme+json"[..])
    );
    let streamed = polled.with_commit_time(1_714_566_600_123_456);
    let rendered = render(streamed.cloud_event(), ce);
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
        let rendered = render(e.cloud_event(), ce);
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
