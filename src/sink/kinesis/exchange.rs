//! [`KinesisExchange`]: the Kinesis sink as the shared driver runs it (`sink/driver.rs`, one
//! record per partition key on the wire). `encode` makes the Kinesis record (`record.rs`), `send`
//! hands it to the shared batcher (`sink/batch.rs`) and returns its reply, `classify` reads the
//! reply. [`KinesisBatches`] is the batcher's Kinesis part: one `PutRecords` call.
//!
//! **Batches.** Up to 500 records for one stream, their data and partition keys summing to at
//! most 5 MiB (Kinesis's limits on a `PutRecords` call), with at most `max_requests` calls on
//! the wire (`sink/batch.rs` gathers and retries).
//!
//! **Failures, per record.** Kinesis answers each record of a call: stored (a sequence number
//! and shard), or failed with an error code — `ProvisionedThroughputExceededException` (the
//! shard's write limit), `InternalFailure`, or a KMS code (`KMSThrottlingException`, …) for
//! encrypted streams. None says the record itself is wrong (a wrong record fails the whole
//! call), so every failed record is retried, with the other unstored ones only, with backoff,
//! for as long as it takes: the WAL position stays held meanwhile.
//!
//! **Failures, per call.** A stream that does not exist (`ResourceNotFoundException`) refuses
//! its records, as the SQS sink does for a missing queue: the routed name is wrong for this
//! account and region (`relay.on_bad_event` decides). A call refused for its content
//! (`ValidationException`, `InvalidArgumentException`) is split and each record sent alone, so
//! only the bad one is refused. Everything else — throttling
//! (`ProvisionedThroughputExceededException`, `LimitExceededException`), KMS and access errors an
//! operator fixes, 5xx, timeouts, the network — is retried.
//!
//! **Order.** `PutRecords` does not keep order within a call, and a failed record does not stop
//! the next one of the call. The driver keeps at most one record per key on the wire, so a call
//! holds one record per partition key and nothing of a key is stored after a failed one: the
//! next record of the key is handed over only once this one was stored (docs/sink-kinesis.md
//! measures this against sending a key's records together).
//!
//! Invariant: `close` aborts the batcher, so nothing of an abandoned sink is sent late.

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use super::client::{words, Kinesis};
use super::record::{Encoder, Record};
use super::SINK;
use crate::sink::batch::{Answer, BatchEntry, BatchLimits, BatchSend, Batcher, CallError, EntryAnswer};
use crate::sink::driver::{Exchange, Outcome, ReplyFuture};
use crate::sink::SinkRecord;

/// Kinesis's limit of records per `PutRecords`.
pub(crate) const MAX_BATCH: usize = 500;
/// Kinesis's limit on a `PutRecords` call: the records' data and partition keys together.
pub(crate) const MAX_BATCH_BYTES: usize = 5 * 1024 * 1024;

/// What the driver runs for the Kinesis sink.
pub(crate) struct KinesisExchange {
    encoder: Encoder,
    batcher: Batcher<KinesisBatches>,
}

impl KinesisExchange {
    /// Starts the batcher on the current runtime.
    pub(crate) fn start(kinesis: Kinesis, encoder: Encoder, max_requests: usize) -> KinesisExchange {
        let limits = BatchLimits {
            max_entries: MAX_BATCH,
            max_bytes: MAX_BATCH_BYTES,
            max_calls: max_requests,
        };
        KinesisExchange {
            encoder,
            batcher: Batcher::start(KinesisBatches { kinesis }, limits),
        }
    }
}

impl Exchange for KinesisExchange {
    type Request = Record;
    type Reply = Answer;

    fn name(&self) -> &'static str {
        SINK
    }

    fn reply_name(&self) -> &'static str {
        "PutRecords answer"
    }

    /// Kinesis does not deduplicate (exactly-once is refused): `dedup_key` is never set.
    fn encode(&self, record: &SinkRecord<'_>, extra: &[(&str, &[u8])], _: Option<&str>) -> Result<Record, String> {
        self.encoder.encode(record, extra)
    }

    /// Hands the record to the batcher; the reply is its answer.
    async fn send(&self, record: Record) -> Result<ReplyFuture<Answer>, String> {
        self.batcher.submit(record)
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

impl BatchEntry for Record {
    fn destination(&self) -> &str {
        &self.stream
    }

    fn size(&self) -> usize {
        Record::size(self)
    }
}

/// The batcher's Kinesis part: one `PutRecords` to one stream.
pub(crate) struct KinesisBatches {
    kinesis: Kinesis,
}

impl BatchSend for KinesisBatches {
    type Entry = Record;

    fn name(&self) -> &'static str {
        SINK
    }

    async fn send_batch(&self, stream: &str, records: &[&Record]) -> Result<Vec<EntryAnswer>, CallError> {
        let entries = records
            .iter()
            .map(|r| {
                PutRecordsRequestEntry::builder()
                    .partition_key(r.partition_key.clone())
                    .data(Blob::new(r.data.clone()))
                    .build()
                    .expect("data and partition key are set")
            })
            .collect();
        match self
            .kinesis
            .client
            .put_records()
            .stream_name(stream)
            .set_records(Some(entries))
            .send()
            .await
        {
            Ok(out) => Ok(record_answers(&out, records.len())),
            Err(e) => Err(call_error(&e, stream, &self.kinesis.shown)),
        }
    }
}

/// Each record's answer, in the order of the call's records (Kinesis answers in that order):
/// stored, or retried — no per-record code says the record itself is wrong (module docs). A
/// record the answer does not mention (a shorter list than the call's) is retried.
pub(crate) fn record_answers(out: &PutRecordsOutput, records: usize) -> Vec<EntryAnswer> {
    let mut answers: Vec<EntryAnswer> = out
        .records()
        .iter()
        .take(records)
        .map(|r| match r.error_code() {
            None if r.sequence_number().is_some() => EntryAnswer::Stored,
            None => EntryAnswer::Retry("the answer has neither a sequence number nor an error code".into()),
            Some(code) => EntryAnswer::Retry(format!("{code}: {}", r.error_message().unwrap_or("(no message)"))),
        })
        .collect();
    answers.resize(
        records,
        EntryAnswer::Retry("the answer did not mention the record".into()),
    );
    answers
}

/// The codes Kinesis answers a call with when a record's content is wrong.
const CONTENT_CODES: &[&str] = &["ValidationException", "InvalidArgumentException"];

/// What a failed call to `stream` (at `shown`) means for its records (module docs).
pub(crate) fn call_error<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
    stream: &str,
    shown: &str,
) -> CallError {
    let code = match e {
        SdkError::ServiceError(s) => s.err().code().unwrap_or_default(),
        _ => "",
    };
    if code == "ResourceNotFoundException" {
        CallError::Missing(format!(
            "stream {stream:?} does not exist in {shown} (or the relay's credentials may not see it): {}; create it \
             (`outbox-relay setup` creates the streams listed in [kinesis] streams) or route the event elsewhere",
            words(e)
        ))
    } else if CONTENT_CODES.contains(&code) {
        CallError::Refused(format!("Kinesis refused the record for stream {stream:?}: {}", words(e)))
    } else {
        CallError::Transient(words(e))
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::operation::put_records::PutRecordsError;
    use aws_sdk_kinesis::types::error::{
        InvalidArgumentException, KmsThrottlingException, ProvisionedThroughputExceededException,
        ResourceNotFoundException,
    };
    use aws_sdk_kinesis::types::PutRecordsResultEntry;
    use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    fn stored(n: u32) -> PutRecordsResultEntry {
        PutRecordsResultEntry::builder()
            .sequence_number(format!("4959{n:04}"))
            .shard_id("shardId-000000000000")
            .build()
    }

    fn failed(code: &str) -> PutRecordsResultEntry {
        PutRecordsResultEntry::builder()
            .error_code(code)
            .error_message("Rate exceeded for shard shardId-000000000000")
            .build()
    }

    fn output(entries: Vec<PutRecordsResultEntry>) -> PutRecordsOutput {
        let failed = entries.iter().filter(|e| e.error_code().is_some()).count() as i32;
        PutRecordsOutput::builder()
            .failed_record_count(failed)
            .set_records(Some(entries))
            .build()
            .expect("records are set")
    }

    #[test]
    fn each_failed_record_is_retried_and_each_stored_one_answered() {
        let out = output(vec![
            stored(1),
            failed("ProvisionedThroughputExceededException"),
            stored(2),
            failed("InternalFailure"),
            failed("KMSThrottlingException"),
            PutRecordsResultEntry::builder().build(),
        ]);
        let answers = record_answers(&out, 7);
        assert_eq!(answers[0], EntryAnswer::Stored);
        assert_eq!(answers[2], EntryAnswer::Stored);
        for (i, code) in [
            (1, "ProvisionedThroughputExceededException"),
            (3, "InternalFailure"),
            (4, "KMSThrottlingException"),
        ] {
            let EntryAnswer::Retry(cause) = &answers[i] else {
                panic!("{i}: {:?}", answers[i])
            };
            assert!(cause.starts_with(code) && cause.contains("Rate exceeded"), "{cause}");
        }
        assert!(
            matches!(&answers[5], EntryAnswer::Retry(c) if c.contains("neither")),
            "no sequence number is no proof of storage"
        );
        assert!(
            matches!(&answers[6], EntryAnswer::Retry(c) if c.contains("did not mention")),
            "a record the answer left out is sent again"
        );
        assert_eq!(record_answers(&output(vec![stored(1), stored(2)]), 1), [EntryAnswer::Stored]);
    }

    fn service_error(err: PutRecordsError) -> SdkError<PutRecordsError, HttpResponse> {
        SdkError::service_error(err, HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::empty()))
    }

    fn meta(code: &str, message: &str) -> ErrorMetadata {
        ErrorMetadata::builder().code(code).message(message).build()
    }

    #[test]
    fn a_missing_stream_refuses_a_bad_call_splits_and_the_rest_is_retried() {
        let missing = service_error(PutRecordsError::ResourceNotFoundException(
            ResourceNotFoundException::builder()
                .meta(meta(
                    "ResourceNotFoundException",
                    "Stream orders under account 123456789012 not found.",
                ))
                .build(),
        ));
        let at = "http://127.0.0.1:5000 (region us-east-1)";
        assert!(
            matches!(call_error(&missing, "orders", at), CallError::Missing(c)
                if c.contains("\"orders\" does not exist") && c.contains("not found") && c.contains("[kinesis] streams"))
        );
        let invalid = service_error(PutRecordsError::InvalidArgumentException(
            InvalidArgumentException::builder()
                .meta(meta("InvalidArgumentException", "Records size exceeds 5 MB limit"))
                .build(),
        ));
        assert!(matches!(call_error(&invalid, "orders", at), CallError::Refused(c) if c.contains("5 MB")));
        let validation = service_error(PutRecordsError::generic(meta("ValidationException", "m")));
        assert!(matches!(call_error(&validation, "orders", at), CallError::Refused(_)));
        for err in [
            PutRecordsError::ProvisionedThroughputExceededException(
                ProvisionedThroughputExceededException::builder()
                    .meta(meta("ProvisionedThroughputExceededException", "m"))
                    .build(),
            ),
            PutRecordsError::KmsThrottlingException(
                KmsThrottlingException::builder()
                    .meta(meta("KMSThrottlingException", "m"))
                    .build(),
            ),
            PutRecordsError::generic(meta("AccessDeniedException", "m")),
            PutRecordsError::generic(meta("LimitExceededException", "m")),
            PutRecordsError::generic(meta("InternalFailure", "m")),
        ] {
            let e = service_error(err);
            assert!(matches!(call_error(&e, "orders", at), CallError::Transient(_)), "{e:?}");
        }
        let timeout: SdkError<PutRecordsError, HttpResponse> = SdkError::timeout_error("attempt timeout");
        assert!(matches!(call_error(&timeout, "orders", at), CallError::Transient(_)));
    }
}
