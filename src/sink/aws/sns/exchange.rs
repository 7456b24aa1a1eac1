//! [`SnsBatches`]: the shared batcher's SNS part (`sink/batch.rs`; the driver runs it as every
//! AWS sink, `aws/exchange.rs`, one message per aggregate key on the wire): one `PublishBatch`
//! call of up to 10 entries for one topic, their bodies and attributes summing to at most
//! `max_message_bytes` (SNS's limit on a batch equals its limit on a message), at most
//! `max_requests` calls on the wire.
//!
//! **Failures.** SNS answers each entry: published, or failed with `SenderFault`. A sender
//! fault about the message (size, attributes, parameters) is a refusal — `relay.on_bad_event`
//! decides; throttling, authorization and KMS failures, and everything else, are retried by the
//! batcher with backoff for as long as it takes (only the unpublished entries; the WAL position
//! is held meanwhile). A call refused for its content as a whole is split into single entries
//! so only the bad one is refused. A topic that does not exist refuses its messages, as a
//! missing queue does; a topic deleted since its ARN was cached is looked up again first.
//!
//! **Order.** The driver keeps at most one message per key on the wire, so a batch holds one
//! entry per key and nothing of a key is published past a failed entry.

use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::client::SnsClient;
use super::{SERVICE, SINK};
use crate::sink::aws::message::{FailedEntry, Message, Value};
use crate::sink::batch::{BatchSend, CallError, EntryAnswer};

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
    pub(crate) sns: SnsClient,
}

impl BatchSend for SnsBatches {
    type Entry = Message;

    const NAME: &'static str = SINK;

    async fn send_batch(&self, topic: &str, messages: &[&Message]) -> Result<Vec<EntryAnswer>, CallError> {
        let arn = self.sns.topic_arn(topic).await.found()?;
        let entries = messages.iter().enumerate().map(|(i, m)| entry(i, m)).collect();
        let out = self
            .sns
            .client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(|e| SERVICE.call_error(&e, topic, &["NotFound"], CONTENT_CODES, || self.sns.forget(topic)))?;
        let failed = out.failed().iter().map(|f| FailedEntry {
            id: f.id(),
            sender_fault: f.sender_fault(),
            code: f.code(),
            message: f.message().unwrap_or_default(),
        });
        Ok(SERVICE.answers(
            topic,
            messages.len(),
            out.successful().iter().filter_map(|ok| ok.id()),
            failed,
            entry_refused,
        ))
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
