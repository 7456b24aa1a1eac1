//! [`SqsBatches`]: the shared batcher's SQS part (`sink/batch.rs`; the driver runs it as every
//! AWS sink, `aws/exchange.rs`, one message per aggregate key on the wire): one
//! `SendMessageBatch` call.
//!
//! **Batches.** Up to 10 entries for one queue, their bodies and attributes summing to at most
//! `max_message_bytes` (SQS's limit on a batch equals its limit on a message), with at most
//! `max_requests` calls on the wire (`sink/batch.rs` gathers and retries).
//!
//! **Failures, per entry.** SQS answers each entry: stored, or failed with `SenderFault`. A
//! sender fault (the message itself is wrong: size, attributes, characters) is a refusal —
//! `relay.on_bad_event` decides. Every other failure (throttling, a KMS or internal error),
//! and a failed call (network, timeout, 5xx, throttling, credentials), is retried by the
//! batcher with backoff for as long as it takes, only the entries not yet stored: the WAL
//! position stays held meanwhile. A call refused for its content as a whole (an entry SQS
//! rejects for the batch) is split and each entry sent alone, so only the bad one is refused.
//! A queue that does not exist refuses its messages (the routed name is wrong).
//!
//! **Order.** The driver keeps at most one message per key on the wire, so a batch holds one
//! entry per key and nothing of a key is sent past a failed entry: the next message of the key
//! is handed over only once this one was stored, or after the relay decided about its refusal.

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::client::SqsClient;
use super::{SERVICE, SINK};
use crate::sink::aws::message::{FailedEntry, Message, Value};
use crate::sink::batch::{BatchSend, CallError, EntryAnswer};

/// The batcher's SQS part: one `SendMessageBatch` to one queue.
pub(crate) struct SqsBatches {
    pub(crate) sqs: SqsClient,
}

impl BatchSend for SqsBatches {
    type Entry = Message;

    const NAME: &'static str = SINK;

    async fn send_batch(&self, queue: &str, messages: &[&Message]) -> Result<Vec<EntryAnswer>, CallError> {
        let url = self.sqs.queue_url(queue).await.found()?;
        let entries = messages.iter().enumerate().map(|(i, m)| entry(i, m)).collect();
        let out = self
            .sqs
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| SERVICE.call_error(&e, queue, GONE_CODES, CONTENT_CODES, || self.sqs.forget(queue)))?;
        let failed = out.failed().iter().map(|f| FailedEntry {
            id: f.id(),
            sender_fault: f.sender_fault(),
            code: f.code(),
            message: f.message().unwrap_or_default(),
        });
        Ok(SERVICE.answers(
            queue,
            messages.len(),
            out.successful().iter().map(|ok| ok.id()),
            failed,
            entry_refused,
        ))
    }
}

/// The error codes SQS answers a batch with when the queue is gone (deleted since its URL was
/// cached).
const GONE_CODES: &[&str] = &["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"];

/// The error codes SQS answers a batch with when an entry's content is wrong.
const CONTENT_CODES: &[&str] = &[
    "InvalidParameterValue",
    "InvalidMessageContents",
    "BatchRequestTooLong",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "MessageTooLong",
];

/// Whether a failed entry's code is about the message (a refusal) rather than SQS or the
/// relay's permissions (which retrying or an operator fixes).
fn entry_refused(sender_fault: bool, code: &str) -> bool {
    sender_fault && !code.contains("Throttl") && !code.contains("AccessDenied") && !code.starts_with("Kms")
}

fn attribute(value: &Value) -> MessageAttributeValue {
    let builder = MessageAttributeValue::builder().data_type(value.data_type());
    let builder = match value {
        Value::Text(t) => builder.string_value(t.clone()),
        Value::Bytes(b) => builder.binary_value(Blob::new(b.clone())),
    };
    builder.build().expect("the data type is set")
}

fn entry(id: usize, m: &Message) -> SendMessageBatchRequestEntry {
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(id.to_string())
        .message_body(m.body.clone())
        .set_message_group_id(m.group.clone())
        .set_message_deduplication_id(m.dedup.clone());
    for (name, value) in &m.attributes {
        builder = builder.message_attributes(name.clone(), attribute(value));
    }
    builder.build().expect("id and body are set")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_failures_refuse_only_what_the_message_is() {
        assert!(entry_refused(true, "InvalidParameterValue"));
        assert!(!entry_refused(false, "InternalError"));
        assert!(!entry_refused(true, "ThrottlingException"));
        assert!(!entry_refused(true, "KmsAccessDenied"));
        assert!(!entry_refused(true, "AccessDenied"));
    }
}
