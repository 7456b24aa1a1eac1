//! The HTTP webhook sink (`[sink] kind = "webhook"`): one POST per event to `[webhook] url`
//! (`${topic}` replaced by the routed name), signed per Standard Webhooks when a secret is set.
//! docs/sink-webhook.md describes what a receiver gets and the guarantees.
//!
//! * `request.rs` — a record as a request (body, headers, the CloudEvents HTTP binding);
//! * `signature.rs` — the Standard Webhooks signature of each attempt;
//! * `client.rs` — sending one request until the receiver answered it for good: 2xx delivered,
//!   408/429/5xx/timeouts/connection errors retried with backoff (`Retry-After` honoured), any
//!   other 4xx refused (`relay.on_bad_event` decides).
//!
//! Order per aggregate comes from the shared driver: at most one request per key on the wire,
//! up to `max_concurrency` keys at once, and a key whose request was refused stays fenced until
//! the relay decided about it. Exactly-once is not offered ([`NO_EXACTLY_ONCE`]).
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface, and never prints a secret (the signing keys,
//! the static header values, the URL's query).

pub(crate) mod client;
pub(crate) mod request;
pub(crate) mod signature;

use std::time::Duration;

use crate::config::webhook::WebhookSettings;
use crate::sink::{SinkError, SinkLimits};

/// The sink's name in errors and logs.
pub(crate) const SINK: &str = "HTTP webhook";

/// Why `relay.delivery = "exactly-once"` is refused with this sink.
pub(crate) const NO_EXACTLY_ONCE: &str = "HTTP has no deduplication on the wire: a request whose reply was lost is \
     sent again, and only the receiver can tell. Use relay.delivery = \"at-least-once\" and deduplicate on the \
     Idempotency-Key (or webhook-id) header, the event id (docs/sink-webhook.md)";

/// The routed-name rule (`${topic}` takes URL-safe names only; without it any name) and
/// `[webhook] max_body_bytes`.
pub(crate) fn limits(settings: &WebhookSettings) -> SinkLimits {
    SinkLimits {
        check_name: if settings.url.is_templated() {
            request::check_templated_name
        } else {
            request::check_any_name
        },
        max_message_bytes: settings.max_body_bytes,
    }
}

/// `setup`: a webhook has nothing to create.
pub(crate) fn prepare(settings: &WebhookSettings) -> Vec<String> {
    vec![format!(
        "HTTP webhook {}: nothing to create (events are POSTed as they come)",
        settings.url
    )]
}

/// `status`: the endpoint answers HTTP (any status: an `OPTIONS` request only shows it is up).
pub(crate) async fn probe(settings: &WebhookSettings) -> Result<String, SinkError> {
    let http = client::Client::new(settings)?;
    let url = settings.url.for_topic("status");
    let shown = settings.url.shown_for("status");
    let started = std::time::Instant::now();
    match tokio::time::timeout(settings.timeout + Duration::from_millis(500), http.options(&url)).await {
        Ok(Ok(status)) => Ok(format!(
            "HTTP webhook {shown} answers (OPTIONS: HTTP {status} in {} ms); {} signing key(s), up to {} aggregates \
             at once",
            started.elapsed().as_millis(),
            settings.keys.len(),
            settings.max_concurrency
        )),
        Ok(Err(cause)) => Err(SinkError {
            sink: SINK,
            cause: format!("{shown}: {cause}; is the receiver up and [webhook] url right?"),
            transient: true,
        }),
        Err(_) => Err(SinkError {
            sink: SINK,
            cause: format!("{shown} did not answer within {} ms", settings.timeout.as_millis()),
            transient: true,
        }),
    }
}

#[cfg(test)]
mod tests;
