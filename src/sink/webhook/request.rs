//! A record as one HTTP POST ([`Encoder::encode`]): the URL with `${topic}` replaced by the
//! routed name, the payload bytes as the body, and the headers —
//!
//! * `Content-Type`: the record's `content-type` (CloudEvents) or else `application/json` when
//!   the body is JSON, `application/octet-stream` otherwise;
//! * `id` (the event id), `key` (the aggregate key) and `Idempotency-Key` (the event id again:
//!   what receivers deduplicate on — a retry or a replay sends the same one);
//! * the record's headers in order (`header_columns`, `traceparent`/`tracestate`, a dead
//!   letter's `outbox-relay-*`), then the caller's extra ones;
//! * `[webhook] headers`, the operator's (a bearer token, …).
//!
//! **CloudEvents** (`[cloudevents]`, the HTTP protocol binding 1.0.2): the record arrives with
//! the Kafka binding's names. Binary mode: each `ce_<attr>` header becomes `ce-<attr>` and
//! `content-type` the `Content-Type` (the `datacontenttype`); the Distributed Tracing
//! extension's `ce_traceparent`/`ce_tracestate` also go out as the W3C `traceparent`/`tracestate`
//! headers, where HTTP tracing looks. Structured mode: the body is the event's JSON and
//! `Content-Type` is `application/cloudevents+json; charset=UTF-8`.
//!
//! The signature headers are not here: they are made per attempt (`signature.rs`).
//!
//! Invariant: a record that cannot be one valid request (a header name or value HTTP does not
//! allow, a body over `max_body_bytes`, a name the URL cannot carry) is refused before anything
//! is sent, with the reason.

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

use super::config::{WebhookSettings, WebhookUrl, OWN_HEADERS};
use crate::config::cloudevents::CloudEventsMode;
use crate::sink::SinkRecord;

/// The header the event id travels in (as on every sink).
pub(crate) const ID_HEADER: &str = "id";
/// The header the aggregate key travels in.
pub(crate) const KEY_HEADER: &str = "key";
/// The header receivers deduplicate on (the IETF draft's name, which payment APIs use).
pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
const JSON: &str = "application/json";
const OCTET_STREAM: &str = "application/octet-stream";
/// The prefix of a CloudEvents attribute's header in the record (the Kafka binding's).
const CE_RECORD_PREFIX: &str = "ce_";
/// The prefix of a CloudEvents attribute's header in the HTTP binary content mode.
const CE_HTTP_PREFIX: &str = "ce-";

/// One POST, ready to sign and send.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) url: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The event id as text: `webhook-id`, and what failures name.
    pub(crate) event_id: String,
}

/// What turns records into requests: the parts of `[webhook]` and `[cloudevents]` it needs.
#[derive(Debug, Clone)]
pub(crate) struct Encoder {
    url: WebhookUrl,
    /// `[webhook] headers`, checked once.
    fixed: Vec<(HeaderName, HeaderValue)>,
    max_body_bytes: usize,
    cloudevents: Option<CloudEventsMode>,
}

impl Encoder {
    pub(crate) fn new(settings: &WebhookSettings, cloudevents: Option<CloudEventsMode>) -> Result<Encoder, String> {
        let fixed = settings
            .headers
            .iter()
            .map(|h| {
                let name = HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|_| format!("[webhook] headers: {:?} is not a header name", h.name))?;
                let mut value = HeaderValue::from_str(h.expose())
                    .map_err(|_| format!("[webhook] headers: the value of {:?} is not a header value", h.name))?;
                // hyper keeps sensitive values out of HPACK tables and its own debug output.
                value.set_sensitive(true);
                Ok((name, value))
            })
            .collect::<Result<_, String>>()?;
        Ok(Encoder {
            url: settings.url.clone(),
            fixed,
            max_body_bytes: settings.max_body_bytes,
            cloudevents,
        })
    }

    /// The request of `record` (with the caller's `extra` headers), or why it can never be one.
    pub(crate) fn encode(&self, record: &SinkRecord<'_>, extra: &[(&str, &[u8])]) -> Result<Request, String> {
        let body = record.value.as_deref().unwrap_or_default();
        if body.len() > self.max_body_bytes {
            return Err(format!(
                "the body is {} bytes, more than [webhook] max_body_bytes ({})",
                body.len(),
                self.max_body_bytes
            ));
        }
        let event_id = std::str::from_utf8(record.event_id)
            .map_err(|_| "the event id is not UTF-8 text, which webhook-id and Idempotency-Key must be".to_owned())?;
        let mut headers = HeaderMap::with_capacity(8 + record.headers.len() + extra.len() + self.fixed.len());
        let id_value = value_of("id", record.event_id)?;
        headers.insert(HeaderName::from_static(ID_HEADER), id_value.clone());
        headers.insert(HeaderName::from_static(KEY_HEADER), value_of("key", &record.key)?);
        headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY_HEADER), id_value);
        let mut content_type: Option<HeaderValue> = None;
        for (name, value) in record.headers_with(extra) {
            let value = value.unwrap_or_default();
            if name.eq_ignore_ascii_case("content-type") && self.cloudevents.is_some() {
                content_type = Some(value_of(name, value)?);
                continue;
            }
            if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str())
                && !matches!(name, "traceparent" | "tracestate")
            {
                return Err(format!(
                    "the record has a header {name:?}, which the webhook sink writes itself; rename the column's \
                     header in outbox.header_columns"
                ));
            }
            match (self.cloudevents, name.strip_prefix(CE_RECORD_PREFIX)) {
                (Some(CloudEventsMode::Binary), Some(attribute)) => {
                    let header = header_name(&format!("{CE_HTTP_PREFIX}{attribute}"))?;
                    let value = value_of(name, value)?;
                    if matches!(attribute, "traceparent" | "tracestate") && !headers.contains_key(attribute) {
                        headers.insert(header_name(attribute)?, value.clone());
                    }
                    headers.append(header, value);
                }
                _ => {
                    let header = header_name(name)?;
                    // A trace header the CloudEvents mapping already wrote is not doubled.
                    if matches!(name, "traceparent" | "tracestate") && headers.contains_key(name) {
                        continue;
                    }
                    headers.append(header, value_of(name, value)?);
                }
            }
        }
        let content_type = match content_type {
            Some(ct) => ct,
            None if self.cloudevents.is_some() => HeaderValue::from_static(OCTET_STREAM),
            None if looks_like_json(body) => HeaderValue::from_static(JSON),
            None => HeaderValue::from_static(OCTET_STREAM),
        };
        headers.insert(CONTENT_TYPE, content_type);
        for (name, value) in &self.fixed {
            headers.insert(name.clone(), value.clone());
        }
        Ok(Request {
            url: self.url.for_topic(&record.destination),
            headers,
            body: Bytes::copy_from_slice(body),
            event_id: event_id.to_owned(),
        })
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        format!(
            "header {name:?} is not an HTTP header name (letters, digits, -, _); rename it in outbox.header_columns"
        )
    })
}

fn value_of(name: &str, value: &[u8]) -> Result<HeaderValue, String> {
    HeaderValue::from_bytes(value)
        .map_err(|_| format!("header {name:?} holds a line break or control character, which HTTP headers may not"))
}

/// Whether `body` is JSON (json/jsonb payloads always are; `bytea` and text may not be).
fn looks_like_json(body: &[u8]) -> bool {
    body.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|first| matches!(first, b'{' | b'[' | b'"'))
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// The name rule of a templated URL: the routed name becomes a path segment or query value
/// as it is, so it must be one that needs no escaping (RFC 3986 unreserved characters) and
/// cannot climb the path (`.`, `..`).
pub(crate) fn check_templated_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty; ${topic} in [webhook] url needs a name".into());
    }
    if name == "." || name == ".." {
        return Err("would climb the URL's path; route to another name".into());
    }
    if name.len() > 1024 {
        return Err("is longer than 1024 bytes".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')))
    {
        Some(c) => Err(format!(
            "contains {c:?}; a name put in [webhook] url's ${{topic}} may only hold letters, digits, '-', '.', '_' and '~'"
        )),
        None => Ok(()),
    }
}

/// The name rule of a URL without `${topic}`: every name goes to the same URL.
pub(crate) fn check_any_name(_name: &str) -> Result<(), String> {
    Ok(())
}
