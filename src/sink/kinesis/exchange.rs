//! What a `PutRecords` answer means for each record, and a failed call for its records.
//!
//! **Per record.** Kinesis answers each record of a call: stored (a sequence number and shard),
//! or failed with an error code — `ProvisionedThroughputExceededException` (the shard's write
//! limit), `InternalFailure`, or a KMS code (`KMSThrottlingException`, …) for encrypted
//! streams. None says the record itself is wrong (a wrong record fails the whole call), so
//! every failed record is retried, alone with the other unstored ones, with backoff, for as long
//! as it takes: the WAL position stays held meanwhile.
//!
//! **Per call.** A stream that does not exist (`ResourceNotFoundException`) refuses its records,
//! as the SQS sink does for a missing queue: the routed name is wrong for this account and
//! region. A call refused for its content (`ValidationException`, `InvalidArgumentException`)
//! is split and each record sent alone, so only the bad one is refused. Everything else —
//! throttling (`ProvisionedThroughputExceededException`, `LimitExceededException`), KMS and
//! access errors an operator fixes, 5xx, timeouts, the network — is retried.

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;

use super::client::words;

/// What `PutRecords` said of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordAnswer {
    Stored,
    /// Not stored, for a reason that passes (the code and message): send it again.
    Retry(String),
}

/// Each record's answer, in the order of the call's records (Kinesis answers in that order).
/// A record the answer does not mention (a shorter list than the call's) is retried.
pub(crate) fn record_answers(out: &PutRecordsOutput, records: usize) -> Vec<RecordAnswer> {
    let mut answers: Vec<RecordAnswer> = out
        .records()
        .iter()
        .take(records)
        .map(|r| match r.error_code() {
            None if r.sequence_number().is_some() => RecordAnswer::Stored,
            None => RecordAnswer::Retry("the answer has neither a sequence number nor an error code".into()),
            Some(code) => RecordAnswer::Retry(format!("{code}: {}", r.error_message().unwrap_or("(no message)"))),
        })
        .collect();
    answers.resize(
        records,
        RecordAnswer::Retry("the answer did not mention the record".into()),
    );
    answers
}

/// What a failed call means for its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallFailure {
    /// The stream does not exist: its records are refused.
    NoStream(String),
    /// Kinesis refused the call for its content: each record alone tells which is bad.
    Content(String),
    /// Anything else: retry.
    Transient(String),
}

/// The codes Kinesis answers a call with when a record's content is wrong.
const CONTENT_CODES: &[&str] = &["ValidationException", "InvalidArgumentException"];

pub(crate) fn call_failure<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> CallFailure {
    let code = match e {
        SdkError::ServiceError(s) => s.err().code().unwrap_or_default(),
        _ => "",
    };
    if code == "ResourceNotFoundException" {
        CallFailure::NoStream(words(e))
    } else if CONTENT_CODES.contains(&code) {
        CallFailure::Content(words(e))
    } else {
        CallFailure::Transient(words(e))
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
        assert_eq!(answers[0], RecordAnswer::Stored);
        assert_eq!(answers[2], RecordAnswer::Stored);
        for (i, code) in [
            (1, "ProvisionedThroughputExceededException"),
            (3, "InternalFailure"),
            (4, "KMSThrottlingException"),
        ] {
            let RecordAnswer::Retry(cause) = &answers[i] else {
                panic!("{i}: {:?}", answers[i])
            };
            assert!(cause.starts_with(code) && cause.contains("Rate exceeded"), "{cause}");
        }
        assert!(
            matches!(&answers[5], RecordAnswer::Retry(c) if c.contains("neither")),
            "no sequence number is no proof of storage"
        );
        assert!(
            matches!(&answers[6], RecordAnswer::Retry(c) if c.contains("did not mention")),
            "a record the answer left out is sent again"
        );
        assert_eq!(record_answers(&output(vec![stored(1), stored(2)]), 1), [RecordAnswer::Stored]);
    }

    fn service_error(err: PutRecordsError) -> SdkError<PutRecordsError, HttpResponse> {
        SdkError::service_error(err, HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::empty()))
    }

    fn meta(code: &str) -> ErrorMetadata {
        ErrorMetadata::builder().code(code).message("m").build()
    }

    #[test]
    fn a_missing_stream_refuses_a_bad_call_splits_and_the_rest_is_retried() {
        let missing = service_error(PutRecordsError::ResourceNotFoundException(
            ResourceNotFoundException::builder()
                .message("Stream orders under account 123456789012 not found.")
                .meta(meta("ResourceNotFoundException"))
                .build(),
        ));
        assert!(matches!(call_failure(&missing), CallFailure::NoStream(c) if c.contains("not found")));
        let invalid = service_error(PutRecordsError::InvalidArgumentException(
            InvalidArgumentException::builder()
                .message("Records size exceeds 5 MB limit")
                .meta(meta("InvalidArgumentException"))
                .build(),
        ));
        assert!(matches!(call_failure(&invalid), CallFailure::Content(_)));
        let validation = service_error(PutRecordsError::generic(meta("ValidationException")));
        assert!(matches!(call_failure(&validation), CallFailure::Content(_)));
        for err in [
            PutRecordsError::ProvisionedThroughputExceededException(
                ProvisionedThroughputExceededException::builder()
                    .meta(meta("ProvisionedThroughputExceededException"))
                    .build(),
            ),
            PutRecordsError::KmsThrottlingException(
                KmsThrottlingException::builder()
                    .meta(meta("KMSThrottlingException"))
                    .build(),
            ),
            PutRecordsError::generic(meta("AccessDeniedException")),
            PutRecordsError::generic(meta("LimitExceededException")),
            PutRecordsError::generic(meta("InternalFailure")),
        ] {
            let e = service_error(err);
            assert!(matches!(call_failure(&e), CallFailure::Transient(_)), "{e:?}");
        }
        let timeout: SdkError<PutRecordsError, HttpResponse> = SdkError::timeout_error("attempt timeout");
        assert!(matches!(call_failure(&timeout), CallFailure::Transient(_)));
    }
}
