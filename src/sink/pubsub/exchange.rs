//! [`PubSubExchange`]: the Pub/Sub sink as the shared driver runs it (`sink/driver.rs`) — a
//! record becomes a message (`message.rs`), sending it hands it to the official client's
//! `Publisher` of its topic (one per routed topic, sharing one gRPC connection pool), whose
//! future is the reply, and the reply is classified.
//!
//! **Order and the key fence.** The driver runs in per-key mode: at most one message of an
//! ordering key in flight, so a failed publish of key K can never leave K's next message stored
//! ahead of it. The client pauses K after a failed publish (it refuses K's later messages
//! until `resume_publish`); the driver's fence does the same one level up — a refused record
//! fences K until the relay decided (`relay.on_bad_event`), a transient one stops the sink and
//! the relay replays from the confirmed position. So the reply future resumes K in the client
//! as soon as it has the failure: from then on, the driver alone holds K back, until the relay
//! has decided, and the client never refuses a replayed or released record as "paused".
//!
//! **Errors.** The client retries what Google lists as retryable (UNAVAILABLE,
//! DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN, connection failures) for
//! up to `[pubsub] retry_timeout_ms`; what is left:
//! * INVALID_ARGUMENT → refused (the message itself is wrong: `relay.on_bad_event` decides);
//! * NOT_FOUND → transient, with the topic named and the fix (`outbox-relay setup` with the
//!   topic in `[pubsub] topics`, or `gcloud pubsub topics create`): the WAL position is held
//!   and the relay retries with backoff, so a topic created later (by Terraform, by a person)
//!   resumes the relay without a restart and without a lost event;
//! * PERMISSION_DENIED, UNAUTHENTICATED → transient with the fix (grant
//!   `roles/pubsub.publisher`, check Application Default Credentials): fixable outside the
//!   relay, which then resumes;
//! * everything else (retries exhausted, the client shut down) → transient.

use std::collections::HashMap;
use std::sync::Mutex;

use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::{BasePublisher, Publisher};
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::model::Message;
use tracing::debug;

use super::config::PubSubSettings;
use super::message::{self, Outgoing};
use super::SINK;
use crate::config::cloudevents::CloudEventsMode;
use crate::sink::driver::{Exchange, Outcome, Protocol, ReplyFuture};
use crate::sink::Handover;

/// How long a publisher waits to batch messages of different ordering keys into one request.
/// One message per key is in flight at a time (the driver), so a batch gathers keys; the
/// client's default (10 ms) would add 10 ms to every event's latency.
pub(crate) const BATCH_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// What the driver runs for the Pub/Sub sink.
pub(crate) struct PubSubExchange {
    base: BasePublisher,
    settings: PubSubSettings,
    cloudevents: Option<CloudEventsMode>,
    /// One publisher per topic id, created at the topic's first message.
    publishers: Mutex<HashMap<String, Publisher>>,
}

/// A publish's answer, with what its words need.
pub(crate) struct Reply {
    topic: String,
    result: Result<String, PublishError>,
}

#[cfg(test)]
impl Reply {
    pub(crate) fn for_test(topic: &str, result: Result<String, PublishError>) -> Reply {
        Reply {
            topic: topic.to_owned(),
            result,
        }
    }
}

impl PubSubExchange {
    pub(crate) fn new(base: BasePublisher, settings: &PubSubSettings, cloudevents: Option<CloudEventsMode>) -> Self {
        PubSubExchange {
            base,
            settings: settings.clone(),
            cloudevents,
            publishers: Mutex::new(HashMap::new()),
        }
    }

    fn publisher(&self, topic: &str) -> Publisher {
        let mut publishers = self.publishers.lock().unwrap_or_else(|e| e.into_inner());
        publishers
            .entry(topic.to_owned())
            .or_insert_with(|| {
                self.base
                    .publisher(self.settings.topic_name(topic))
                    .set_delay_threshold(BATCH_DELAY)
                    .build()
            })
            .clone()
    }
}

impl Protocol for PubSubExchange {
    type Request = Outgoing;
    type Reply = Reply;

    const NAME: &'static str = SINK;

    /// Pub/Sub does not deduplicate publishes: `dedup_key` is unused (exactly-once is refused
    /// by the config).
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Outgoing, String> {
        message::encode(handover.record, handover.extra, self.cloudevents)
    }

    fn classify(&self, reply: Reply) -> Outcome {
        let Reply { topic, result } = reply;
        let error = match result {
            Ok(_) => return Outcome::Acknowledged,
            Err(PublishError::Rpc(error)) => error,
            Err(other) => return Outcome::Transient(format!("topic {topic:?}: {other}")),
        };
        let name = self.settings.topic_name(&topic);
        match error.status().map(|s| (s.code, s.message.as_str())) {
            Some((Code::InvalidArgument, message)) => {
                Outcome::Refused(format!("Pub/Sub refused the message for topic {name}: {message}"))
            }
            Some((Code::NotFound, message)) => Outcome::Transient(format!(
                "topic {name} does not exist ({message}): create it — list it in [pubsub] topics and run \
                 `outbox-relay setup`, or `gcloud pubsub topics create {topic} --project {}` — the relay holds \
                 the WAL position and retries until it exists",
                self.settings.project
            )),
            Some((Code::PermissionDenied | Code::Unauthenticated, message)) => Outcome::Transient(format!(
                "not allowed to publish to {name} ({message}): grant the relay's identity roles/pubsub.publisher on \
                 the topic, and check Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the \
                 metadata server)"
            )),
            Some((code, message)) => Outcome::Transient(format!(
                "publishing to {name} failed after the client's retries ({}): {code:?}: {message}",
                humantime(self.settings.requests.timeout)
            )),
            None => Outcome::Transient(format!("publishing to {name} failed: {error}")),
        }
    }

    /// Drops the publishers. Nothing is flushed: what the driver cancelled must not reach the
    /// topic after the relay started its replay.
    async fn close(&self) {
        self.publishers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        debug!("Pub/Sub publishers closed");
    }
}

impl Exchange for PubSubExchange {
    /// Hands the message to its topic's publisher (which batches and sends it in its own task);
    /// the reply future awaits the client's answer.
    async fn send(&self, out: Outgoing) -> Result<ReplyFuture<Reply>, String> {
        let publisher = self.publisher(&out.topic);
        let Outgoing {
            topic,
            data,
            ordering_key,
            attributes,
        } = out;
        let answer = publisher.publish(
            Message::new()
                .set_data(data)
                .set_ordering_key(ordering_key.clone())
                .set_attributes(attributes),
        );
        Ok(Box::pin(async move {
            let result = answer.await;
            if result.is_err() {
                // The driver holds the key from here on (module docs).
                publisher.resume_publish(ordering_key);
            }
            Reply { topic, result }
        }))
    }
}

fn humantime(d: std::time::Duration) -> String {
    format!("retried up to {} ms", d.as_millis())
}
