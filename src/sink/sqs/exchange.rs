//! [`SqsExchange`]: the SQS sink as the shared driver runs it (`sink/driver.rs`, one message per
//! aggregate key on the wire). `encode` makes the message (`message.rs`), `send` hands it to the
//! batcher and returns its reply, `classify` reads the reply.
//!
//! **Batches.** The batcher task gathers handed-over messages into `SendMessageBatch` calls of up
//! to 10 entries for one queue, their bodies and attributes summing to at most
//! `max_message_bytes` (SQS's limit on a batch equals its limit on a message), with at most
//! `max_requests` calls on the wire: while all are busy, messages queue up and the next call
//! takes 10 at once, so batches fill under load without a linger timer and a lone message goes
//! out at once.
//!
//! **Failures, per entry.** SQS answers each entry: stored, or failed with `SenderFault`. A
//! sender fault (the message itself is wrong: size, attributes, characters) is a refusal —
//! `relay.on_bad_event` decides. Every other failure (throttling, a KMS or internal error),
//! and a failed call (network, timeout, 5xx, throttling, credentials), is retried by the batch
//! task with backoff (100 ms doubling to 5 s) for as long as it takes, only the entries not yet
//! stored: the WAL position stays held meanwhile, and the driver never sees a transient failure
//! that would replay every other aggregate. A call refused for its content as a whole (an
//! entry SQS rejects for the batch) is split and each entry sent alone, so only the bad one is
//! refused. A queue that does not exist refuses its messages (the routed name is wrong).
//!
//! **Order.** The driver keeps at most one message per key on the wire, so a batch holds one
//! entry per key and nothing of a key is sent past a failed entry: the next message of the key
//! is handed over only once this one was stored, or after the relay decided about its refusal.
//!
//! Invariant: a batch task ends when its entries are answered or every waiter is gone
//! (abandon); `close` aborts what is left, so nothing of an abandoned sink is sent late.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tracing::{debug, warn};

use super::client::{words, QueueUrl, Sqs};
use super::message::{Encoder, Message, Value};
use super::SINK;
use crate::sink::driver::{Exchange, Outcome, ReplyFuture};
use crate::sink::SinkRecord;

/// SQS's limit of entries per `SendMessageBatch`.
pub(crate) const MAX_BATCH: usize = 10;
const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How a message ended, for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Stored,
    Refused(String),
    /// The batch task ended without an answer (aborted): the driver stops, the relay replays.
    Lost(String),
}

/// A message waiting for its batch, and where its answer goes.
struct Pending {
    message: Message,
    answer: oneshot::Sender<Answer>,
}

/// The batch tasks still running, aborted on close.
#[derive(Default)]
struct Tasks(Mutex<Vec<AbortHandle>>);

impl Tasks {
    fn track(&self, handle: AbortHandle) {
        let mut tasks = self.0.lock().expect("batch tasks");
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    fn abort_all(&self) {
        for t in self.0.lock().expect("batch tasks").drain(..) {
            t.abort();
        }
    }
}

/// What the driver runs for the SQS sink.
pub(crate) struct SqsExchange {
    encoder: Encoder,
    batcher: mpsc::UnboundedSender<Pending>,
    tasks: Arc<Tasks>,
}

impl SqsExchange {
    /// Starts the batcher on the current runtime.
    pub(crate) fn start(sqs: Sqs, encoder: Encoder, max_requests: usize) -> SqsExchange {
        let (batcher, rx) = mpsc::unbounded_channel();
        let tasks = Arc::new(Tasks::default());
        let handle = tokio::spawn(batch_loop(
            rx,
            sqs,
            Arc::new(Semaphore::new(max_requests.max(1))),
            tasks.clone(),
            encoder.max_message_bytes,
        ));
        tasks.track(handle.abort_handle());
        SqsExchange {
            encoder,
            batcher,
            tasks,
        }
    }
}

impl Drop for SqsExchange {
    fn drop(&mut self) {
        self.tasks.abort_all();
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
        let (answer, reply) = oneshot::channel();
        self.batcher
            .send(Pending { message, answer })
            .map_err(|_| "the SQS batcher has stopped".to_owned())?;
        Ok(Box::pin(async move {
            // A batch task never drops an answer it owes, but an aborted one (close) does.
            reply
                .await
                .unwrap_or_else(|_| Answer::Lost("the SQS batch ended without an answer".into()))
        }))
    }

    fn classify(&self, answer: Answer) -> Outcome {
        match answer {
            Answer::Stored => Outcome::Acknowledged,
            Answer::Refused(cause) => Outcome::Refused(cause),
            Answer::Lost(cause) => Outcome::Transient(cause),
        }
    }

    async fn close(&self) {
        self.tasks.abort_all();
    }
}

/// Takes handed-over messages into batches while a call slot is free (module docs).
async fn batch_loop(
    mut rx: mpsc::UnboundedReceiver<Pending>,
    sqs: Sqs,
    slots: Arc<Semaphore>,
    tasks: Arc<Tasks>,
    max_batch_bytes: usize,
) {
    let mut queued: VecDeque<Pending> = VecDeque::new();
    loop {
        if queued.is_empty() {
            match rx.recv().await {
                Some(p) => queued.push_back(p),
                None => return,
            }
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        while let Ok(p) = rx.try_recv() {
            queued.push_back(p);
        }
        let batch = take_batch(&mut queued, max_batch_bytes);
        let handle = tokio::spawn(deliver(sqs.clone(), batch, slot));
        tasks.track(handle.abort_handle());
    }
}

/// The first queued message and up to 9 more for its queue, in order, within `max_bytes`.
fn take_batch(queued: &mut VecDeque<Pending>, max_bytes: usize) -> Vec<Pending> {
    let Some(first) = queued.pop_front() else {
        return Vec::new();
    };
    let mut bytes = first.message.size;
    let queue = first.message.queue.clone();
    let mut batch = vec![first];
    let mut rest = VecDeque::with_capacity(queued.len());
    while let Some(p) = queued.pop_front() {
        if batch.len() < MAX_BATCH && p.message.queue == queue && bytes + p.message.size <= max_bytes {
            bytes += p.message.size;
            batch.push(p);
        } else {
            rest.push_back(p);
        }
    }
    *queued = rest;
    batch
}

/// What `SendMessageBatch` said of one entry.
#[derive(Debug, Clone)]
enum EntryResult {
    Stored,
    Failed {
        sender_fault: bool,
        code: String,
        message: String,
    },
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

/// Sends `batch` (one queue) until each entry is stored or refused, or nobody waits anymore.
async fn deliver(sqs: Sqs, batch: Vec<Pending>, slot: OwnedSemaphorePermit) {
    let _slot = slot;
    let Some(queue) = batch.first().map(|p| p.message.queue.clone()) else {
        return;
    };
    let mut todo = batch;
    let mut backoff = RETRY_INITIAL;
    let mut attempt = 0u32;
    loop {
        // Abandoned entries (the driver dropped their replies) are not sent again.
        todo.retain(|p| !p.answer.is_closed());
        if todo.is_empty() {
            return;
        }
        let failure = match sqs.queue_url(&queue).await {
            QueueUrl::Missing(cause) => {
                for p in todo {
                    let _ = p.answer.send(Answer::Refused(cause.clone()));
                }
                return;
            }
            QueueUrl::Failed(cause) => cause,
            QueueUrl::Found(url) => {
                let entries = todo.iter().enumerate().map(|(i, p)| entry(i, &p.message)).collect();
                match sqs
                    .client
                    .send_message_batch()
                    .queue_url(url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                {
                    Ok(out) => {
                        let mut answers: Vec<Option<EntryResult>> = vec![None; todo.len()];
                        for ok in out.successful() {
                            if let Some(slot) = ok.id().parse::<usize>().ok().and_then(|i| answers.get_mut(i)) {
                                *slot = Some(EntryResult::Stored);
                            }
                        }
                        for failed in out.failed() {
                            if let Some(slot) = failed.id().parse::<usize>().ok().and_then(|i| answers.get_mut(i)) {
                                *slot = Some(EntryResult::Failed {
                                    sender_fault: failed.sender_fault(),
                                    code: failed.code().to_owned(),
                                    message: failed.message().unwrap_or_default().to_owned(),
                                });
                            }
                        }
                        let mut retry = Vec::new();
                        let mut cause = String::new();
                        for (p, answer) in todo.into_iter().zip(answers) {
                            match answer {
                                Some(EntryResult::Stored) => {
                                    let _ = p.answer.send(Answer::Stored);
                                }
                                Some(EntryResult::Failed {
                                    sender_fault,
                                    code,
                                    message,
                                }) if entry_refused(sender_fault, &code) => {
                                    let _ = p.answer.send(Answer::Refused(format!(
                                        "SQS refused the message for queue {queue:?}: {code}: {message}"
                                    )));
                                }
                                Some(EntryResult::Failed { code, message, .. }) => {
                                    cause = format!("{code}: {message}");
                                    retry.push(p);
                                }
                                None => {
                                    cause = "the answer did not mention the entry".into();
                                    retry.push(p);
                                }
                            }
                        }
                        todo = retry;
                        if todo.is_empty() {
                            return;
                        }
                        format!("{} of the batch's entries failed ({cause})", todo.len())
                    }
                    Err(e) => match call_failure(&e) {
                        CallFailure::NoQueue(cause) => {
                            // Deleted since its URL was cached: the next attempt resolves it again
                            // (and refuses the entries if it is really gone).
                            debug!(queue = %queue, %cause, "SQS: queue gone, resolving its URL again");
                            sqs.forget(&queue);
                            cause
                        }
                        CallFailure::Content(cause) if todo.len() == 1 => {
                            let p = todo.pop().expect("one entry");
                            let _ = p.answer.send(Answer::Refused(format!(
                                "SQS refused the message for queue {queue:?}: {cause}"
                            )));
                            return;
                        }
                        CallFailure::Content(cause) => {
                            debug!(queue = %queue, %cause, entries = todo.len(), "SQS refused a batch; sending each entry alone");
                            for p in todo {
                                Box::pin(deliver_alone(sqs.clone(), p)).await;
                            }
                            return;
                        }
                        CallFailure::Transient(cause) => cause,
                    },
                }
            }
        };
        attempt += 1;
        if attempt == 1 || attempt.is_power_of_two() {
            warn!(
                sink = SINK,
                queue = %queue,
                entries = todo.len(),
                attempt,
                cause = %failure,
                "SQS did not store a batch; retrying (the WAL position is held meanwhile)"
            );
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// One entry of a batch SQS refused as a whole, sent as a batch of its own.
async fn deliver_alone(sqs: Sqs, p: Pending) {
    // The slot is the parent batch's; this one needs none of its own.
    let slot = Arc::new(Semaphore::new(1))
        .acquire_owned()
        .await
        .expect("a fresh semaphore");
    deliver(sqs, vec![p], slot).await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn pending(queue: &str, size: usize) -> (Pending, oneshot::Receiver<Answer>) {
        let (answer, rx) = oneshot::channel();
        let message = Message {
            queue: queue.into(),
            body: "x".into(),
            attributes: BTreeMap::new(),
            group: None,
            dedup: None,
            size,
        };
        (Pending { message, answer }, rx)
    }

    #[test]
    fn batches_take_one_queue_ten_entries_and_the_byte_limit_in_order() {
        let mut queued = VecDeque::new();
        let mut keep = Vec::new();
        for i in 0..25 {
            let (p, rx) = pending(if i % 5 == 4 { "b" } else { "a" }, 10);
            queued.push_back(p);
            keep.push(rx);
        }
        let first = take_batch(&mut queued, 1000);
        assert_eq!(first.len(), 10);
        assert!(first.iter().all(|p| p.message.queue == "a"));
        assert_eq!(queued.len(), 15);
        assert_eq!(queued.front().unwrap().message.queue, "b", "the rest keep their order");
        let second = take_batch(&mut queued, 1000);
        assert_eq!(second.len(), 5, "every b");
        assert!(second.iter().all(|p| p.message.queue == "b"));
        let bytes = take_batch(&mut queued, 35);
        assert_eq!(bytes.len(), 3, "30 bytes fit in 35, 40 do not");
        let mut big = VecDeque::new();
        big.push_back(pending("a", 100).0);
        assert_eq!(
            take_batch(&mut big, 35).len(),
            1,
            "the first message goes alone even at the limit"
        );
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
