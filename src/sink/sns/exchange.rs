//! [`SnsExchange`]: the SNS sink as the shared driver runs it (`sink/driver.rs`, one message per
//! aggregate key on the wire). `encode` makes the message (`message.rs`), `send` hands it to the
//! shared batcher (`sink/batch.rs`), `classify` reads the answer. [`SnsBatches`] is the
//! batcher's SNS part: one `PublishBatch` call of up to 10 entries for one topic, their bodies
//! and attributes summing to at most `max_message_bytes` (SNS's limit on a batch equals its
//! limit on a message), at most `max_requests` calls on the wire.
//!
//! **Failures.** SNS answers each entry: published, or failed with `SenderFault`. A sender
//! fault about the message (size, attributes, parameters) is a refusal — `relay.on_bad_event`
//! decides; throttling, authorization and KMS failures, and everything else, are retried by the
//! batcher with backoff for as long as it takes (only the unpublished entries; the WAL position
//! is held meanwhile). A call refused for its content as a whole is split into single entries
//! so only the bad one is refused. A topic that does not exist refuses its messages, as SQS's
//! missing queue does; a topic deleted since its ARN was cached is looked up again first.
//!
//! **Order.** The driver keeps at most one message per key on the wire, so a batch holds one
//! entry per key and nothing of a key is published past a failed entry.
//!
//! Invariant: `close` aborts the batcher, so nothing of an abandoned sink is published late.

use aws_sdk_sns::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use tracing::debug;

use super::client::{words, Sns, TopicArn};
use super::SINK;
use crate::sink::aws_message::{Encoder, Message, Value};
use crate::sink::batch::{Answer, BatchLimits, BatchSend, Batcher, CallError, EntryAnswer};
use crate::sink::driver::{Exchange, Outcome, ReplyFuture};
use crate::sink::SinkRecord;

/// SNS's limit of entries per `PublishBatch`.
pub(crate) const MAX_BATCH: usize = 10;

/// What the driver runs for the SNS sink.
pub(crate) struct SnsExchange {
    encoder: Encoder,
    batcher: Batcher<SnsBatches>,
}

impl SnsExchange {
    /// Starts the batcher on the current runtime.
    pub(crate) fn start(sns: Sns, encoder: Encoder, max_requests: usize) -> SnsExchange {
        let limits = BatchLimits {
            max_entries: MAX_BATCH,
            max_bytes: encoder.max_message_bytes,
            max_calls: max_requests,
        };
        SnsExchange {
            encoder,
            batcher: Batcher::start(SnsBatches { sns }, limits),
        }
    }
}

impl Exchange for SnsExchange {
    type Request = Message;
    type Reply = Answer;

    fn name(&self) -> &'static str {
        SINK
    }

    fn reply_name(&self) -> &'static str {
        "PublishBatch answer"
    }

    /// `dedup_key` (exactly-once) becomes a FIFO message's `MessageDeduplicationId`.
    fn encode(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
    ) -> Result<Message, String> {
        self.encoder.encode(record, extra, dedup_key)
    }

    async fn send(&self, message: Message) -> Result<ReplyFuture<Answer>, String> {
        self.batcher.submit(message)
    }

    fn classify(&self, answer: Answer) -> Outcome {
        match answer {
            Answer::Stored => Outcome::Acknowledged,
            Answer::Refused(cause) => Outcome::Refused(cause),
            Answer::Lost(cause) => Outcome::Transient(cause),
        }
    }

    async fn close(&self) {
        self.batcher.close();
    }
}

/// The error codes SNS answers a whole call with when an entry's content is wrong.
const CONTENT_CODES: &[&str] = &[
    "InvalidParameter",
    "InvalidParameterValue",
    "ParameterValueInvalid",
    "BatchRequestTooLong",
    "ValidationError",
];

/// Whether a failed entry's code is about the message (a refusal) rather than SNS, KMS or the
/// relay's permissions (which retrying or an operator fixes).
fn entry_refused(sender_fault: bool, code: &str) -> bool {
    let lower = code.to_ascii_lowercase();
    sender_fault
        && !lower.contains("throttl")
        && !lower.contains("accessdenied")
        && !lower.contains("authorization")
        && !lower.starts_with("kms")
}

fn attribute(value: &Value) -> MessageAttributeValue {
    let builder = MessageAttributeValue::builder().data_type(value.data_type());
    let builder = match value {
        Value::Text(t) => builder.string_value(t.clone()),
        Value::Bytes(b) => builder.binary_value(Blob::new(b.clone())),
    };
    builder.build().expect("the data type is set")
}

fn entry(id: usize, m: &Message) -> PublishBatchRequestEntry {
    let mut builder = PublishBatchRequestEntry::builder()
        .id(id.to_string())
        .message(m.body.clone())
        .set_message_group_id(m.group.clone())
        .set_message_deduplication_id(m.dedup.clone());
    for (name, value) in &m.attributes {
        builder = builder.message_attributes(name.clone(), attribute(value));
    }
    builder.build().expect("id and message are set")
}

/// The batcher's SNS part: one `PublishBatch` to one topic.
pub(crate) struct SnsBatches {
    sns: Sns,
}

impl BatchSend for SnsBatches {
    type Entry = Message;

    fn name(&self) -> &'static str {
        SINK
    }

    async fn send_batch(&self, topic: &str, messages: &[&Message]) -> Result<Vec<EntryAnswer>, CallError> {
        let arn = match self.sns.topic_arn(topic).await {
            TopicArn::Missing(cause) => return Err(CallError::Missing(cause)),
            TopicArn::Failed(cause) => return Err(CallError::Transient(cause)),
            TopicArn::Found(arn) => arn,
        };
        let entries = messages.iter().enumerate().map(|(i, m)| entry(i, m)).collect();
        let out = match self
            .sns
            .client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                let code = match &e {
                    SdkError::ServiceError(s) => s.err().code().unwrap_or_default(),
                    _ => "",
                };
                let cause = words(&e);
                return Err(if code == "NotFound" {
                    // Deleted since its ARN was cached: the next attempt looks it up again (and
                    // refuses the entries if it is really gone).
                    debug!(topic = %topic, %cause, "SNS: topic gone, looking its ARN up again");
                    self.sns.forget(topic);
                    CallError::Transient(cause)
                } else if CONTENT_CODES.contains(&code) {
                    CallError::Refused(format!("SNS refused the message for topic {topic:?}: {cause}"))
                } else {
                    CallError::Transient(cause)
                });
            }
        };
        let mut answers: Vec<Option<EntryAnswer>> = vec![None; messages.len()];
        for ok in out.successful() {
            if let Some(slot) = ok
                .id()
                .and_then(|id| id.parse::<usize>().ok())
                .and_then(|i| answers.get_mut(i))
            {
                *slot = Some(EntryAnswer::Stored);
            }
        }
        for failed in out.failed() {
            if let Some(slot) = failed.id().parse::<usize>().ok().and_then(|i| answers.get_mut(i)) {
                let (code, message) = (failed.code(), failed.message().unwrap_or_default());
                *slot = Some(if entry_refused(failed.sender_fault(), code) {
                    EntryAnswer::Refused(format!(
                        "SNS refused the message for topic {topic:?}: {code}: {message}"
                    ))
                } else {
                    EntryAnswer::Retry(format!("{code}: {message}"))
                });
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| EntryAnswer::Retry("the answer did not mention the entry".into())))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_failures_refuse_only_what_the_message_is() {
        assert!(entry_refused(true, "InvalidParameter"));
        assert!(!entry_refused(false, "InternalError"));
        assert!(!entry_refused(true, "Throttled"));
        assert!(!entry_refused(true, "KMSAccessDenied"));
        assert!(!entry_refused(true, "KMSDisabled"));
        assert!(!entry_refused(true, "AuthorizationError"));
    }
}
