//! [`SqsExchange`]: the SQS sink as the shared driver runs it (`sink/driver.rs`, one message per
//! aggregate key on the wire). `encode` makes the message (`message.rs`), `send` hands it to the
//! shared batcher (`sink/batch.rs`) and returns its reply, `classify` reads the reply.
//! [`SqsBatches`] is the batcher's SQS part: one `SendMessageBatch` call.
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
//!
//! Invariant: `close` aborts the batcher, so nothing of an abandoned sink is sent late.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use tracing::debug;

use super::client::{words, QueueUrl, Sqs};
use super::SINK;
use crate::sink::aws_message::{Encoder, Message, Value};
use crate::sink::batch::{Answer, BatchLimits, BatchSend, Batcher, CallError, EntryAnswer};
use crate::sink::driver::{Exchange, Outcome, ReplyFuture};
use crate::sink::SinkRecord;

/// SQS's limit of entries per `SendMessageBatch`.
pub(crate) const MAX_BATCH: usize = 10;

/// What the driver runs for the SQS sink.
pub(crate) struct SqsExchange {
    encoder: Encoder,
    batcher: Batcher<SqsBatches>,
}

impl SqsExchange {
    /// Starts the batcher on the current runtime.
    pub(crate) fn start(sqs: Sqs, encoder: Encoder, max_requests: usize) -> SqsExchange {
        let limits = BatchLimits {
            max_entries: MAX_BATCH,
            max_bytes: encoder.max_message_bytes,
            max_calls: max_requests,
        };
        SqsExchange {
            encoder,
            batcher: Batcher::start(SqsBatches { sqs }, limits),
        }
    }
}

impl Exchange for SqsExchange {
    type Request = Message;
    type Reply = Answer;

    fn name(&self) -> &'static str {
        SINK
    }

    fn reply_name(&self) -> &'static str {
        "SendMessageBatch answer"
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

    /// Hands the message to the batcher; the reply is its answer.
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

/// The batcher's SQS part: one `SendMessageBatch` to one queue.
pub(crate) struct SqsBatches {
    sqs: Sqs,
}

impl BatchSend for SqsBatches {
    type Entry = Message;

    fn name(&self) -> &'static str {
        SINK
    }

    async fn send_batch(&self, queue: &str, messages: &[&Message]) -> Result<Vec<EntryAnswer>, CallError> {
        let url = match self.sqs.queue_url(queue).await {
            QueueUrl::Missing(cause) => return Err(CallError::Missing(cause)),
            QueueUrl::Failed(cause) => return Err(CallError::Transient(cause)),
            QueueUrl::Found(url) => url,
        };
        let entries = messages.iter().enumerate().map(|(i, m)| entry(i, m)).collect();
        let out = match self
            .sqs
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                return Err(match call_failure(&e) {
                    CallFailure::NoQueue(cause) => {
                        // Deleted since its URL was cached: the next attempt resolves it again
                        // (and refuses the entries if it is really gone).
                        debug!(queue = %queue, %cause, "SQS: queue gone, resolving its URL again");
                        self.sqs.forget(queue);
                        CallError::Transient(cause)
                    }
                    CallFailure::Content(cause) => {
                        CallError::Refused(format!("SQS refused the message for queue {queue:?}: {cause}"))
                    }
                    CallFailure::Transient(cause) => CallError::Transient(cause),
                });
            }
        };
        let mut answers: Vec<Option<EntryAnswer>> = vec![None; messages.len()];
        for ok in out.successful() {
            if let Some(slot) = ok.id().parse::<usize>().ok().and_then(|i| answers.get_mut(i)) {
                *slot = Some(EntryAnswer::Stored);
            }
        }
        for failed in out.failed() {
            if let Some(slot) = failed.id().parse::<usize>().ok().and_then(|i| answers.get_mut(i)) {
                let (code, message) = (failed.code(), failed.message().unwrap_or_default());
                *slot = Some(if entry_refused(failed.sender_fault(), code) {
                    EntryAnswer::Refused(format!(
                        "SQS refused the message for queue {queue:?}: {code}: {message}"
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

/// What a failed call means for its entries.
enum CallFailure {
    /// The queue is gone: resolve its URL again.
    NoQueue(String),
    /// SQS refused the request for its content: each entry alone tells which is bad.
    Content(String),
    /// Anything else: retry.
    Transient(String),
}

/// The error codes SQS answers a batch with when an entry's content is wrong.
const CONTENT_CODES: &[&str] = &[
    "InvalidParameterValue",
    "InvalidMessageContents",
    "BatchRequestTooLong",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "MessageTooLong",
];

fn call_failure<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> CallFailure {
    let code = match e {
        SdkError::ServiceError(s) => s.err().code().unwrap_or_default(),
        _ => "",
    };
    if code == "AWS.SimpleQueueService.NonExistentQueue" || code == "QueueDoesNotExist" {
        CallFailure::NoQueue(words(e))
    } else if CONTENT_CODES.contains(&code) {
        CallFailure::Content(words(e))
    } else {
        CallFailure::Transient(words(e))
    }
}

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
    use std::collections::BTreeMap;

    use super::*;
    use crate::sink::batch::BatchEntry;

    #[test]
    fn a_message_is_batched_by_its_queue_and_its_size_as_sqs_counts_it() {
        let m = Message {
            destination: "orders.fifo".into(),
            body: "x".into(),
            attributes: BTreeMap::new(),
            group: None,
            dedup: None,
            size: 17,
        };
        assert_eq!((m.destination(), BatchEntry::size(&m)), ("orders.fifo", 17));
    }

    #[test]
    fn entry_failures_refuse_only_what_the_message_is() {
        assert!(entry_refused(true, "InvalidParameterValue"));
        assert!(!entry_refused(false, "InternalError"));
        assert!(!entry_refused(true, "ThrottlingException"));
        assert!(!entry_refused(true, "KmsAccessDenied"));
        assert!(!entry_refused(true, "AccessDenied"));
    }
}
