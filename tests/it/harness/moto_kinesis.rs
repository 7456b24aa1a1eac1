//! Kinesis Data Streams on a test's own moto ([`super::moto::Moto`]): streams created with the
//! AWS SDK ([`Moto::create_stream`]), and every shard read back from the start (`ListShards`,
//! `GetShardIterator` `TRIM_HORIZON`, `GetRecords` until the shard's end) as [`Received`]
//! records, so the Kafka checks (`check_delivered`, `check_order`) apply: topic = the stream,
//! partition = the shard's index, offset = the position in the shard, key and payload and
//! headers from the relay's envelope (`id` first, then the envelope's headers), plus
//! `kinesis:PartitionKey`, `kinesis:ShardId` and `kinesis:SequenceNumber`. A record whose data is
//! not an envelope (`[kinesis] format = "payload"`) keeps its data as the payload and its
//! partition key as the key, with no `id`.
//!
//! Reading never consumes anything (a Kinesis stream is a log), so [`Moto::read_streams`] may be
//! called while the relay still sends. moto keeps a shard's records in a Python dict and looks
//! for the last sequence number by listing every key on each put, so a shard slows down as it
//! fills (docs/sink-kinesis.md): the tests' workloads stay at a few thousand records.

use std::time::{Duration, Instant};

use aws_sdk_kinesis::types::{ShardIteratorType, StreamMode, StreamModeDetails};

use super::consumer::Received;
use super::moto::{Moto, REGION};

/// A Kinesis client of the moto at `endpoint` with the test credentials.
pub fn kinesis_client(endpoint: &str) -> aws_sdk_kinesis::Client {
    let config = aws_sdk_kinesis::Config::builder()
        .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
        .region(aws_sdk_kinesis::config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_kinesis::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build();
    aws_sdk_kinesis::Client::from_conf(config)
}

/// The relay's envelope (docs/sink-kinesis.md), as a consumer reads it.
#[derive(serde::Deserialize)]
struct Envelope {
    id: serde_json::Value,
    key: serde_json::Value,
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    payload: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    payload_base64: Option<String>,
}

/// A JSON value of the envelope as bytes: a string's text, or `{"base64": …}` decoded.
fn value_bytes(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    match v {
        serde_json::Value::String(s) => s.as_bytes().to_vec(),
        serde_json::Value::Object(o) => o
            .get("base64")
            .and_then(|b| b.as_str())
            .map(|b| base64::engine::general_purpose::STANDARD.decode(b).expect("base64"))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

impl Moto {
    pub fn kinesis(&self) -> aws_sdk_kinesis::Client {
        kinesis_client(&self.endpoint())
    }

    /// Creates stream `name` with `shards` shards (`0`: on-demand, which moto gives 4).
    pub async fn create_stream(&self, name: &str, shards: i32) {
        let mut req = self.kinesis().create_stream().stream_name(name);
        req = if shards == 0 {
            req.stream_mode_details(
                StreamModeDetails::builder()
                    .stream_mode(StreamMode::OnDemand)
                    .build()
                    .expect("mode"),
            )
        } else {
            req.shard_count(shards)
        };
        req.send()
            .await
            .unwrap_or_else(|e| panic!("create stream {name}: {e:?}"));
    }

    /// Every record of `name`, shard by shard, each shard in its order.
    pub async fn read_stream(&self, name: &str) -> Vec<Received> {
        let client = self.kinesis();
        let shards = client
            .list_shards()
            .stream_name(name)
            .send()
            .await
            .unwrap_or_else(|e| panic!("list shards of {name}: {e:?}"));
        let mut out = Vec::new();
        for (index, shard) in shards.shards().iter().enumerate() {
            let mut iterator = client
                .get_shard_iterator()
                .stream_name(name)
                .shard_id(shard.shard_id())
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .expect("shard iterator")
                .shard_iterator()
                .map(str::to_owned);
            let mut offset = 0i64;
            while let Some(it) = iterator {
                let got = client
                    .get_records()
                    .shard_iterator(it)
                    .limit(10_000)
                    .send()
                    .await
                    .expect("get records");
                for r in got.records() {
                    out.push(received(name, index as i32, offset, shard.shard_id(), r));
                    offset += 1;
                }
                // moto: the shard's end is an empty page with nothing behind.
                if got.records().is_empty() && got.millis_behind_latest().unwrap_or(0) == 0 {
                    break;
                }
                iterator = got.next_shard_iterator().map(str::to_owned);
            }
        }
        out
    }

    /// How many distinct events `names` hold together: distinct `id`s of envelopes, and every
    /// record without one (`format = "payload"`). A retried call whose first attempt was stored
    /// too adds duplicates, which must not count as the events still missing.
    pub async fn stream_count(&self, names: &[String]) -> usize {
        let mut ids = std::collections::HashSet::new();
        let mut others = 0;
        for name in names {
            for r in self.read_stream(name).await {
                match r.header("id") {
                    Some(id) => {
                        ids.insert(id.to_vec());
                    }
                    None => others += 1,
                }
            }
        }
        ids.len() + others
    }

    /// Waits (at most `timeout`) until `names` hold `n` distinct events together
    /// ([`Moto::stream_count`]), waits `settle` more for stragglers (duplicates), then reads
    /// every record. Panics when they do not arrive, with `context()` (the relay's log) in the
    /// message.
    pub async fn read_streams(
        &self,
        names: &[String],
        n: usize,
        timeout: Duration,
        settle: Duration,
        context: impl Fn() -> String,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let have = self.stream_count(names).await;
            if have >= n {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "streams {names:?} hold {have} of {n} events after {timeout:?}; {}",
                context()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tokio::time::sleep(settle).await;
        let mut out = Vec::new();
        for name in names {
            out.extend(self.read_stream(name).await);
        }
        out
    }
}

fn received(stream: &str, partition: i32, offset: i64, shard: &str, r: &aws_sdk_kinesis::types::Record) -> Received {
    let data = r.data().as_ref();
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    let (key, payload) = match serde_json::from_slice::<Envelope>(data) {
        Ok(envelope) => {
            headers.push(("id".into(), value_bytes(&envelope.id)));
            for (name, value) in &envelope.headers {
                headers.push((name.clone(), value_bytes(value)));
            }
            let payload = match (&envelope.payload, &envelope.payload_base64) {
                (Some(raw), _) if raw.get() != "null" => Some(raw.get().as_bytes().to_vec()),
                (_, Some(b64)) => {
                    use base64::Engine as _;
                    Some(base64::engine::general_purpose::STANDARD.decode(b64).expect("base64"))
                }
                _ => None,
            };
            (Some(value_bytes(&envelope.key)), payload)
        }
        Err(_) => (
            Some(r.partition_key().unwrap_or_default().as_bytes().to_vec()),
            Some(data.to_vec()),
        ),
    };
    headers.push((
        "kinesis:PartitionKey".into(),
        r.partition_key().unwrap_or_default().as_bytes().to_vec(),
    ));
    headers.push(("kinesis:ShardId".into(), shard.as_bytes().to_vec()));
    headers.push(("kinesis:SequenceNumber".into(), r.sequence_number().as_bytes().to_vec()));
    Received {
        topic: stream.to_owned(),
        partition,
        offset,
        key,
        payload,
        headers,
        timestamp_ms: r.approximate_arrival_timestamp().map(|t| t.to_millis().unwrap_or(0)),
    }
}
