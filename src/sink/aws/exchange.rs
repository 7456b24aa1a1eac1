//! [`Batched`]: an AWS sink as the shared driver runs it (`sink/driver.rs`, one entry per
//! aggregate key on the wire). `encode` makes the service's entry (an SQS or SNS message,
//! `message.rs`; a Kinesis record, `kinesis/record.rs`), `send` hands it to the shared batcher
//! (`sink/batch.rs`) and returns its answer as the reply, `classify` reads the answer. The
//! service's own part is its [`BatchSend`]: one batch call (`SendMessageBatch`, `PublishBatch`,
//! `PutRecords`), each entry's failure refused or retried.
//!
//! Invariant: `close` aborts the batcher, so nothing of an abandoned sink is sent late.

use crate::sink::batch::{Answer, BatchEntry, BatchLimits, BatchSend, Batcher};
use crate::sink::driver::{Exchange, Outcome, Protocol, ReplyFuture};
use crate::sink::Handover;

/// How records become a service's batch entries.
pub(crate) trait Encode: Send + Sync + 'static {
    type Entry: BatchEntry;

    /// The entry of `record`; `Err`: why the service would refuse it (a bad event). `dedup_key`
    /// (exactly-once) is for a service that deduplicates.
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Self::Entry, String>;
}

/// What the driver runs for an AWS sink: `encoder`'s entries through a batcher of `B`'s calls.
pub(crate) struct Batched<B: BatchSend, E> {
    /// What a reply is called in a timeout's cause: `"SendMessageBatch answer"`.
    reply_name: &'static str,
    encoder: E,
    batcher: Batcher<B>,
}

impl<B: BatchSend, E: Encode<Entry = B::Entry>> Batched<B, E> {
    /// Starts the batcher on the current runtime.
    pub(crate) fn start(batches: B, encoder: E, limits: BatchLimits, reply_name: &'static str) -> Batched<B, E> {
        Batched {
            reply_name,
            encoder,
            batcher: Batcher::start(batches, limits),
        }
    }
}

impl<B: BatchSend, E: Encode<Entry = B::Entry>> Protocol for Batched<B, E> {
    type Request = B::Entry;
    type Reply = Answer;

    const NAME: &'static str = B::NAME;

    fn reply_name(&self) -> &'static str {
        self.reply_name
    }

    fn encode(&self, handover: Handover<'_, '_>) -> Result<B::Entry, String> {
        self.encoder.encode(handover)
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

impl<B: BatchSend, E: Encode<Entry = B::Entry>> Exchange for Batched<B, E> {
    /// Hands the entry to the batcher; the reply is its answer.
    async fn send(&self, entry: B::Entry) -> Result<ReplyFuture<Answer>, String> {
        self.batcher.submit(entry)
    }
}
