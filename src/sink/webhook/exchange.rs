//! [`HttpExchange`]: the webhook sink as the shared driver runs it (`sink/driver.rs`) — a
//! record becomes a [`Request`] (`request.rs`), sending it starts one reply future that sends
//! and retries until the receiver answered for good (`client.rs`), and that answer is
//! classified: delivered, or refused (`relay.on_bad_event`).
//!
//! Invariant: the reply future never ends in a transient failure — it retries those itself, so
//! the driver never stops the sink because a receiver was briefly down (which would replay
//! every other aggregate too); it is dropped (cancelled) only when the sink is abandoned. It
//! ends in a fatal one (the receiver's TLS certificate rejected) only where no retry can help:
//! the driver's verdict then stops the relay with the fix.

use super::config::{WebhookSettings, WebhookUrl};
use crate::config::cloudevents::CloudEventsMode;
use crate::sink::driver::{Exchange, Outcome, Protocol, ReplyFuture};
use crate::sink::Handover;
use crate::sink::SinkError;

use super::client::{Client, Undeliverable};
use super::request::{Encoder, Request};

/// What the driver runs for the webhook sink.
pub(crate) struct HttpExchange {
    encoder: Encoder,
    client: Client,
    url: WebhookUrl,
}

impl HttpExchange {
    pub(crate) fn new(settings: &WebhookSettings, cloudevents: Option<CloudEventsMode>) -> Result<Self, SinkError> {
        let encoder = Encoder::new(settings, cloudevents).map_err(|cause| SinkError {
            sink: super::SINK,
            cause,
            transient: false,
        })?;
        Ok(HttpExchange {
            encoder,
            client: Client::new(settings)?,
            url: settings.url.clone(),
        })
    }
}

/// A request and the URL as logs show it (query masked).
pub(crate) struct Outgoing {
    request: Request,
    shown_url: String,
}

impl Protocol for HttpExchange {
    type Request = Outgoing;
    type Reply = Result<(), Undeliverable>;

    const NAME: &'static str = super::SINK;

    /// HTTP does not deduplicate: `dedup_key` is unused (exactly-once is refused by the config).
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Outgoing, String> {
        let Handover { record, extra, .. } = handover;
        Ok(Outgoing {
            request: self.encoder.encode(record, extra)?,
            shown_url: self.url.shown_for(&record.destination),
        })
    }

    fn classify(&self, reply: Self::Reply) -> Outcome {
        match reply {
            Ok(()) => Outcome::Acknowledged,
            Err(Undeliverable::Refused(cause)) => Outcome::Refused(cause),
            Err(Undeliverable::Fatal(cause)) => Outcome::Fatal(cause),
        }
    }
}

impl Exchange for HttpExchange {
    /// Nothing to hand over first: the request goes out (and is retried) in the reply future.
    async fn send(&self, out: Outgoing) -> Result<ReplyFuture<Self::Reply>, String> {
        let client = self.client.clone();
        Ok(Box::pin(
            async move { client.deliver(&out.request, &out.shown_url).await },
        ))
    }
}
