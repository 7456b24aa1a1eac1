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
//! [`Webhook`] is the sink's plugin; [`exchange::HttpExchange`] is what the shared driver
//! (`sink/driver.rs`) runs: order per aggregate comes from it — at most one request per key on
//! the wire, up to `max_concurrency` keys at once, a key whose request was refused fenced until
//! the relay decided about it. A request's reply future retries transient failures itself, for
//! as long as it takes, so the driver only ever sees "delivered" or "refused"; the WAL position
//! stays held meanwhile. Exactly-once is not offered ([`NO_EXACTLY_ONCE`]).
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface, and never prints a secret (the signing keys,
//! the static header values, the URL's query).

pub(crate) mod client;
pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod exchange;
pub(crate) mod request;
pub(crate) mod signature;

use std::sync::Arc;
use std::time::Duration;

use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::driver;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{WebhookSettings, NO_EXACTLY_ONCE, SINK};

/// The webhook sink's plugin (`src/sink/registry.rs`).
pub(crate) struct Webhook;

impl SinkPlugin for Webhook {
    type Config = WebhookSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    /// OpenTelemetry has no `messaging.system` for plain HTTP: the sink's kind names it.
    const MESSAGING_SYSTEM: &'static str = "webhook";

    /// reqwest and hyper's client pool log connection churn; the relay reports failures itself.
    const LOG_TARGETS: &'static [ClientLogTarget] =
        &[ClientLogTarget::debug("reqwest"), ClientLogTarget::debug("hyper_util")];

    /// The routed-name rule (`${topic}` takes URL-safe names only; without it any name) and
    /// `[webhook] max_body_bytes`.
    fn limits(&self, settings: &WebhookSettings) -> SinkLimits {
        SinkLimits {
            check_name: if settings.url.is_templated() {
                request::check_templated_name
            } else {
                request::check_any_name
            },
            max_message_bytes: settings.max_body_bytes,
        }
    }

    fn exactly_once(&self, _: &WebhookSettings) -> ExactlyOnce {
        ExactlyOnce::Unsupported(NO_EXACTLY_ONCE.into())
    }

    /// `setup`: a webhook has nothing to create.
    async fn prepare(&self, settings: &WebhookSettings) -> Result<Vec<String>, SinkError> {
        Ok(vec![format!(
            "HTTP webhook {}: nothing to create (events are POSTed as they come)",
            settings.url
        )])
    }

    /// `status`: the endpoint answers HTTP (any status: an `OPTIONS` request only shows it is up).
    async fn probe(&self, settings: &WebhookSettings) -> Result<String, SinkError> {
        let http = client::Client::new(settings)?;
        let url = settings.url.for_topic("status");
        let shown = settings.url.shown_for("status");
        let started = std::time::Instant::now();
        match tokio::time::timeout(
            settings.requests.timeout + Duration::from_millis(500),
            http.options(&url),
        )
        .await
        {
            Ok(Ok(status)) => Ok(format!(
                "HTTP webhook {shown} answers (OPTIONS: HTTP {status} in {} ms); {} signing key(s), up to {} aggregates \
                 at once",
                started.elapsed().as_millis(),
                settings.keys.len(),
                settings.requests.max_concurrency
            )),
            Ok(Err(cause)) => Err(SinkError {
                sink: SINK,
                cause: format!("{shown}: {cause}; is the receiver up and [webhook] url right?"),
                transient: true,
            }),
            Err(_) => Err(SinkError {
                sink: SINK,
                cause: format!(
                    "{shown} did not answer within {} ms",
                    settings.requests.timeout.as_millis()
                ),
                transient: true,
            }),
        }
    }

    async fn create<Tag: SinkTag>(&self, config: &WebhookSettings, cx: &SinkContext) -> Created<Tag> {
        let exchange = exchange::HttpExchange::new(config, cx.cloudevents)?;
        // The reply future bounds each attempt (timeout_ms) and retries for as long as the
        // receiver fails; a key waits behind its retried request as long as the receiver is
        // down, and its records are not stale for that (the receiver deduplicates a replay).
        let options = config.requests.per_key(cx);
        Ok(boxed(driver::start(Arc::new(exchange), options)))
    }
}

#[cfg(test)]
mod tests;
