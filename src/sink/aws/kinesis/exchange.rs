//! [`KinesisBatches`]: the shared batcher's Kinesis part (`sink/batch.rs`; the driver runs it as
//! every AWS sink, `aws/exchange.rs`, one record per partition key on the wire, each encoded by
//! `record.rs`): one `PutRecords` call.
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

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::put_records::PutRecordsOutput;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use super::client::Kinesis;
use super::record::{Encoder, Record};
use super::SINK;
use crate::sink::aws::client::{self, words};
use crate::sink::aws::exchange::{Batched, Encode};
use crate::sink::batch::{BatchEntry, BatchLimits, BatchSend, CallError, EntryAnswer};
use crate::sink::Handover;

/// Kinesis's limit of records per `PutRecords`.
pub(crate) const MAX_BATCH: usize = 500;
/// Kinesis's limit on a `PutRecords` call: the records' data and partition keys together.
pub(crate) const MAX_BATCH_BYTES: usize = 5 * 1024 * 1024;

/// What the driver runs for the Kinesis sink: its records through `PutRecords` batches.
pub(crate) type KinesisExchange = Batched<KinesisBatches, Encoder>;

/// Starts the Kinesis batcher on the current runtime: up to 500 records and 5 MiB a call, at
/// most `max_requests` calls on the wire.
pub(crate) fn start(kinesis: Kinesis, encoder: Encoder, max_requests: usize) -> KinesisExchange {
    let limits = BatchLimits {
        max_entries: MAX_BATCH,
        max_bytes: MAX_BATCH_BYTES,
        max_calls: max_requests,
    };
    Batched::start(KinesisBatches { kinesis }, encoder, limits, "PutRecords answer")
}

/// Kinesis does not deduplicate (exactly-once is refused): `dedup_key` is never set.
impl Encode for Encoder {
    type Entry = Record;

    fn encode(&self, handover: Handover<'_, '_>) -> Result<Record, String> {
        Encoder::encode(self, handover.record, handover.extra)
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

    const NAME: &'static str = SINK;

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
    let code = client::code(e);
    if code == "ResourceNotFoundException" {
        CallError::Missing(format!(
            "stream {stream:?} does not exist in {shown} (or the relay's credentials may not see it): {}; create it \
             (`outbox-relay setup` creates the streams listed in [kinesis] streams) or route the event elsewhere",
            words(e)
        ))
    } else if CONTENT_CODES.contains(&code) {
        CallError::Refused(format!(
            "Kinesis refused the record for stream {stream:?}: {}",
            words(e)
        ))
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
        assert_eq!(
            record_answers(&output(vec![stored(1), stored(2)]), 1),
            [EntryAnswer::Stored]
        );
    }

    fn service_error(err: PutRecordsError) -> SdkError<PutRecordsError, HttpResponse> {
        SdkError::service_error(
            err,
            HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::empty()),
        )
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
        assert!(matches!(call_error(&missing, "orders", at), CallError::Missing(c)
                if c.contains("\"orders\" does not exist") && c.contains("not found") && c.contains("[kinesis] streams")));
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

    /// What a fake Kinesis saw: each record sent (its event id and partition key), in order,
    /// and whether it was stored.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String, bool)>>>;

    /// A fake Kinesis on a loopback port speaking the AWS JSON 1.1 protocol of `PutRecords`: a
    /// call to stream `gone` answers `ResourceNotFoundException`; every record fails with
    /// `ProvisionedThroughputExceededException` the first time its event id is seen (a shard
    /// over its write limit) and is stored the second time. moto never fails a record; this is
    /// the SDK's own parsing, the batcher and the driver on such an answer.
    async fn fake_kinesis(seen: Seen) -> String {
        use base64::Engine as _;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut conn = BufReader::new(socket);
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            if let Some((name, value)) = line.split_once(':') {
                                if name.eq_ignore_ascii_case("content-length") {
                                    length = value.trim().parse().unwrap();
                                }
                            }
                        }
                        let mut body = vec![0; length];
                        conn.read_exact(&mut body).await.unwrap();
                        let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let (status, answer) = if request["StreamName"] == "gone" {
                            (
                                "400 Bad Request",
                                serde_json::json!({"__type": "ResourceNotFoundException",
                                    "message": "Stream gone under account 123456789012 not found."}),
                            )
                        } else {
                            let mut seen = seen.lock().unwrap();
                            let mut failed = 0;
                            let records: Vec<serde_json::Value> = request["Records"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .map(|r| {
                                    let data = base64::engine::general_purpose::STANDARD
                                        .decode(r["Data"].as_str().unwrap())
                                        .unwrap();
                                    let envelope: serde_json::Value = serde_json::from_slice(&data).unwrap();
                                    let id = envelope["id"].as_str().unwrap().to_owned();
                                    let key = r["PartitionKey"].as_str().unwrap().to_owned();
                                    let first = !seen.iter().any(|(i, _, _)| *i == id);
                                    seen.push((id, key, !first));
                                    if first {
                                        failed += 1;
                                        serde_json::json!({"ErrorCode": "ProvisionedThroughputExceededException",
                                            "ErrorMessage": "Rate exceeded for shard shardId-000000000000"})
                                    } else {
                                        serde_json::json!({"SequenceNumber": format!("{}", seen.len()),
                                            "ShardId": "shardId-000000000000"})
                                    }
                                })
                                .collect();
                            (
                                "200 OK",
                                serde_json::json!({"FailedRecordCount": failed, "Records": records}),
                            )
                        };
                        let body = answer.to_string();
                        let head = format!(
                            "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.1\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        let socket = conn.get_mut();
                        if socket.write_all(head.as_bytes()).await.is_err()
                            || socket.write_all(body.as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        endpoint
    }

    /// A client of `endpoint` with static credentials (no credential chain in a unit test).
    fn kinesis_at(endpoint: &str) -> Kinesis {
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(aws_sdk_kinesis::config::Credentials::new("k", "s", None, None, "test"))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build();
        Kinesis {
            client: aws_sdk_kinesis::Client::from_conf(config),
            shown: endpoint.to_owned(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn throttled_records_are_retried_and_nothing_of_a_key_is_sent_past_an_unstored_one() {
        use std::sync::Arc;
        use std::time::Duration;

        use crate::sink::aws::kinesis::config::Format;
        use crate::sink::driver::{self, Concurrency, DriverOptions};
        use crate::sink::{FailureKind, Sink};

        let seen: Seen = Arc::default();
        let endpoint = fake_kinesis(seen.clone()).await;
        let encoder = Encoder {
            format: Format::Envelope,
            max_record_bytes: 1 << 20,
        };
        let exchange = start(kinesis_at(&endpoint), encoder, 4);
        let (sink, mut completions) = driver::start::<_, String>(
            Arc::new(exchange),
            DriverOptions::for_tests(Concurrency::PerKey { max_keys: 16 }),
        );
        let mut sent = Vec::new();
        for i in 0..12 {
            let key = ["a", "b", "c"][i % 3];
            let stream = if i == 11 { "gone" } else { "orders" };
            let id = format!("{key}{}", i / 3);
            let record = crate::sink::memory::record(stream, key.as_bytes(), b"{}", id.as_bytes());
            sink.send(Handover::of(&record), Box::new(id.clone())).unwrap();
            sent.push(id);
        }
        let mut outcomes = std::collections::HashMap::new();
        for _ in 0..sent.len() {
            let c = tokio::time::timeout(Duration::from_secs(30), completions.recv())
                .await
                .expect("a completion within 30 s")
                .expect("the driver runs");
            outcomes.insert(*c.tag, c.outcome);
        }
        Box::new(sink).abandon(Duration::from_secs(1));
        for id in &sent[..11] {
            assert!(outcomes[id].is_ok(), "{id} stored after its retry: {:?}", outcomes[id]);
        }
        let gone = outcomes["c3"].as_ref().unwrap_err();
        assert_eq!(gone.kind, FailureKind::Refused, "a missing stream refuses: {gone:?}");
        assert!(gone.cause.contains("\"gone\" does not exist"), "{}", gone.cause);
        let seen = seen.lock().unwrap().clone();
        for key in ["a", "b", "c"] {
            let of_key: Vec<(String, bool)> = seen
                .iter()
                .filter(|(_, k, _)| k == key)
                .map(|(id, _, stored)| (id.clone(), *stored))
                .collect();
            let ids: Vec<&String> = sent[..11].iter().filter(|id| id.starts_with(key)).collect();
            let want: Vec<(String, bool)> = ids
                .iter()
                .flat_map(|id| [((*id).clone(), false), ((*id).clone(), true)])
                .collect();
            assert_eq!(
                of_key, want,
                "key {key}: each record failed once, retried and stored before the next was sent"
            );
        }
    }

    /// The choice docs/sink-kinesis.md reports: one record per key on the wire (the driver's
    /// `PerKey`, shipped) against several records of a key per call (`Pipelined`, calls one at a
    /// time so that a key's records stay in order while nothing fails — under a partial failure
    /// this variant would store a key's later records past its failed one, which is why it is
    /// not shipped). A drain of N events with many aggregates, and with one hot aggregate; each
    /// run's stream read back (every event once, each key in order). Needs a running moto:
    /// `KINESIS_MEASURE_ENDPOINT=http://127.0.0.1:5000 AWS_ACCESS_KEY_ID=testing
    /// AWS_SECRET_ACCESS_KEY=testing cargo test --lib kinesis::exchange::tests::measure --
    /// --ignored --nocapture` (`KINESIS_MEASURE_EVENTS`, default 3000).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement against a running moto (KINESIS_MEASURE_ENDPOINT), reported in docs/sink-kinesis.md"]
    async fn measure_one_record_per_key_against_several_per_call() {
        use std::collections::HashMap;
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        use aws_sdk_kinesis::types::ShardIteratorType;

        use crate::sink::aws::kinesis::config::{Format, KinesisSection};
        use crate::sink::driver::{self, Concurrency, DriverOptions};
        use crate::sink::Sink;

        let Ok(endpoint) = std::env::var("KINESIS_MEASURE_ENDPOINT") else {
            eprintln!("SKIPPING the measurement: set KINESIS_MEASURE_ENDPOINT to a running moto's URL");
            return;
        };
        let n: usize = std::env::var("KINESIS_MEASURE_EVENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000);
        let section: KinesisSection =
            toml::from_str(&format!("region = \"us-east-1\"\nendpoint_url = \"{endpoint}\"")).unwrap();
        let settings = section.validate().unwrap();
        let kinesis = Kinesis::connect(&settings, Duration::from_secs(10)).await.unwrap();
        let encoder = Encoder {
            format: Format::Envelope,
            max_record_bytes: settings.max_record_bytes,
        };
        let payload = format!(
            "{{\"order\": {{\"lines\": [{}]}}}}",
            ["{\"sku\": \"A-1\", \"qty\": 2}"; 6].join(", ")
        );
        let variants = [
            (
                "one record per key, 8 calls at once (shipped)",
                Concurrency::PerKey { max_keys: 500 },
                8,
            ),
            (
                "one record per key, 1 call at a time",
                Concurrency::PerKey { max_keys: 500 },
                1,
            ),
            ("several records per key, 1 call at a time", Concurrency::Pipelined, 1),
        ];
        let tag = std::process::id();
        for (workload, aggregates) in [("1,000 aggregates", 1000usize), ("one hot aggregate", 1)] {
            for (v, (variant, concurrency, calls)) in variants.iter().enumerate() {
                let mut times = Vec::new();
                for run in 0..3 {
                    let stream = format!("measure-{tag}-{aggregates}-{v}-{run}");
                    kinesis
                        .client
                        .create_stream()
                        .stream_name(&stream)
                        .shard_count(4)
                        .send()
                        .await
                        .unwrap();
                    let exchange = start(kinesis.clone(), encoder, *calls);
                    let (sink, mut completions) = driver::start::<_, usize>(
                        Arc::new(exchange),
                        DriverOptions {
                            max_in_flight: 10_000,
                            max_in_flight_bytes: 64 << 20,
                            ..DriverOptions::for_tests(*concurrency)
                        },
                    );
                    let started = Instant::now();
                    for i in 0..n {
                        let key = format!("agg-{}", i % aggregates);
                        let id = i.to_string();
                        let record =
                            crate::sink::memory::record(&stream, key.as_bytes(), payload.as_bytes(), id.as_bytes());
                        sink.send(Handover::of(&record), Box::new(i)).unwrap();
                    }
                    for _ in 0..n {
                        let c = tokio::time::timeout(Duration::from_secs(300), completions.recv())
                            .await
                            .expect("a completion within 300 s")
                            .expect("the driver runs");
                        assert!(c.outcome.is_ok(), "event {}: {:?}", c.tag, c.outcome.err());
                    }
                    times.push(started.elapsed());
                    Box::new(sink).abandon(Duration::from_secs(1));
                    // Read back: every event once, each key's events in order within its shard.
                    let shards = kinesis.client.list_shards().stream_name(&stream).send().await.unwrap();
                    let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
                    for shard in shards.shards() {
                        let mut it = kinesis
                            .client
                            .get_shard_iterator()
                            .stream_name(&stream)
                            .shard_id(shard.shard_id())
                            .shard_iterator_type(ShardIteratorType::TrimHorizon)
                            .send()
                            .await
                            .unwrap()
                            .shard_iterator()
                            .map(str::to_owned);
                        while let Some(i) = it {
                            let got = kinesis
                                .client
                                .get_records()
                                .shard_iterator(i)
                                .limit(10_000)
                                .send()
                                .await
                                .unwrap();
                            for r in got.records() {
                                let v: serde_json::Value = serde_json::from_slice(r.data().as_ref()).unwrap();
                                let id: usize = v["id"].as_str().unwrap().parse().unwrap();
                                by_key
                                    .entry(v["key"].as_str().unwrap().to_owned())
                                    .or_default()
                                    .push(id);
                            }
                            if got.records().is_empty() {
                                break;
                            }
                            it = got.next_shard_iterator().map(str::to_owned);
                        }
                    }
                    let stored: usize = by_key.values().map(Vec::len).sum();
                    assert_eq!(stored, n, "{variant}: every event once");
                    for (key, ids) in &by_key {
                        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{variant}: {key} in order");
                    }
                }
                times.sort();
                let median = times[1];
                eprintln!(
                    "MEASURE {workload:>17} | {variant:<46} | median {:>7.0} ms ({:.0} ev/s) | runs {:?} ms",
                    median.as_secs_f64() * 1000.0,
                    n as f64 / median.as_secs_f64(),
                    times.iter().map(|t| t.as_millis()).collect::<Vec<_>>()
                );
            }
        }
    }
}
