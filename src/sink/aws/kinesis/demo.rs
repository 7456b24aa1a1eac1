//! Amazon Kinesis's half of `outbox-relay demo`, on a running moto server (`--sink-url`,
//! `aws/demo.rs`): the relay writes to a stream of the run's own. The consumer makes it, of
//! [`SHARDS`] shards, made (and ACTIVE) before the relay starts (the relay writes to existing
//! streams only; the demo's config lists none for `setup` to create), every shard read from its
//! start with `GetRecords`; counts by the `id` of each record's JSON envelope (the relay's
//! default `format`, docs/sink-kinesis.md), the payload being the envelope's `payload`. A stream
//! keeps what it stored, so `published` is what was read. At the end it deletes the stream (best
//! effort).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::types::ShardIteratorType;
use serde_json::value::RawValue;

use crate::config::sink::SinkSettings;
use crate::sink::aws::demo::{moto_config, moto_demo, sdk_call, MotoRun, REGION};
use crate::sink::demo::{
    bounded, cleaned_up, parse_id, start, toml_string, DemoConfig, DemoConsumer, DemoRun, DemoTarget, SinkDemo,
    Starting, Tally,
};

const BROKER: &str = "moto (Amazon Kinesis)";
/// The shards of the demo's stream: more than one, so the demo reads as a Kinesis consumer does
/// (an aggregate's records stay on one shard, in order).
pub(crate) const SHARDS: i32 = 2;
/// How long a created stream may take to become ACTIVE.
const ACTIVE_LIMIT: Duration = Duration::from_secs(30);
/// The pause after a round of reads that returned nothing.
const IDLE: Duration = Duration::from_millis(100);

/// The part of the relay's envelope (`{"id","key","headers","payload"}`) the demo reads.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: &'a str,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

/// One shard: where its reading stands.
struct Shard {
    id: String,
    /// The next read's iterator (`None`: take a fresh one after `after`).
    iterator: Option<String>,
    /// The last sequence number read.
    after: Option<String>,
}

pub(crate) struct KinesisConsumer {
    client: aws_sdk_kinesis::Client,
    stream: String,
    shards: Vec<Shard>,
}

impl KinesisConsumer {
    /// Makes the stream `stream` at the moto `endpoint` and waits until it is ACTIVE.
    pub(crate) async fn new(endpoint: &str, stream: &str) -> Result<KinesisConsumer, String> {
        let client = aws_sdk_kinesis::Client::new(&moto_config(endpoint));
        sdk_call(
            BROKER,
            "creating the stream",
            client.create_stream().stream_name(stream).shard_count(SHARDS).send(),
        )
        .await?;
        // ListShards answers ResourceInUseException until the stream is ACTIVE (as the sink
        // tells; moto's DescribeStreamSummary timestamps are not RFC 3339, which the SDK refuses).
        let deadline = Instant::now() + ACTIVE_LIMIT;
        let listed = loop {
            let listed = bounded(BROKER, "listing the shards", async {
                Ok::<_, String>(client.list_shards().stream_name(stream).send().await)
            })
            .await?;
            match listed {
                Ok(listed) => break listed,
                Err(e)
                    if Instant::now() < deadline
                        && e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(format!(
                        "{BROKER}, listing the shards of {stream}: {}",
                        DisplayErrorContext(e)
                    ))
                }
            }
        };
        let shards = listed
            .shards()
            .iter()
            .map(|s| Shard {
                id: s.shard_id().to_owned(),
                iterator: None,
                after: None,
            })
            .collect();
        Ok(KinesisConsumer {
            client,
            stream: stream.to_owned(),
            shards,
        })
    }

    /// One `GetRecords` of shard `i` (a fresh iterator first when it has none), its records
    /// counted; returns how many it read.
    async fn read(&mut self, i: usize, tally: &dyn Tally) -> Result<usize, String> {
        let shard = &mut self.shards[i];
        let iterator = match shard.iterator.take() {
            Some(it) => it,
            None => {
                let request = self
                    .client
                    .get_shard_iterator()
                    .stream_name(&self.stream)
                    .shard_id(&shard.id);
                let request = match &shard.after {
                    Some(seq) => request
                        .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                        .starting_sequence_number(seq),
                    None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
                };
                let got = request
                    .send()
                    .await
                    .map_err(|e| format!("GetShardIterator: {}", DisplayErrorContext(e)))?;
                match got.shard_iterator() {
                    Some(it) => it.to_owned(),
                    // A closed shard (the demo never reshards): nothing more to read.
                    None => return Ok(0),
                }
            }
        };
        let got = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(1_000)
            .send()
            .await
            .map_err(|e| format!("GetRecords: {}", DisplayErrorContext(e)))?;
        for record in got.records() {
            let envelope = serde_json::from_slice::<Envelope<'_>>(record.data().as_ref()).ok();
            let id = envelope.as_ref().and_then(|e| parse_id(e.id.as_bytes()));
            let payload = envelope.as_ref().and_then(|e| e.payload).map(|p| p.get().as_bytes());
            tally.record(id, payload);
            shard.after = Some(record.sequence_number().to_owned());
        }
        shard.iterator = got.next_shard_iterator().map(str::to_owned);
        Ok(got.records().len())
    }
}

impl DemoConsumer for KinesisConsumer {
    /// Reads until `stop`, then deletes the stream; returns what it cleaned up.
    async fn run(mut self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        let mut reported = false;
        while !stop.load(Ordering::Relaxed) {
            let mut read = 0;
            let mut failed = None;
            for i in 0..self.shards.len() {
                match self.read(i, &*tally).await {
                    Ok(n) => read += n,
                    Err(e) => failed = Some(e),
                }
            }
            match failed {
                Some(e) => {
                    if !reported {
                        eprintln!("demo: Kinesis consumer: {e}; reading on");
                        reported = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => {
                    reported = false;
                    if read == 0 {
                        tokio::time::sleep(IDLE).await;
                    }
                }
            }
        }
        let deleted = sdk_call(
            BROKER,
            "deleting the stream",
            self.client
                .delete_stream()
                .stream_name(&self.stream)
                .enforce_consumer_deletion(true)
                .send(),
        )
        .await;
        vec![cleaned_up(deleted, format!("Kinesis stream {} deleted", self.stream))]
    }
}

/// Amazon Kinesis's answers to the demo.
pub(crate) const DEMO: SinkDemo = moto_demo(
    "moto server (Amazon Kinesis)",
    "Amazon Kinesis Data Streams (a stream of two shards), on a running moto server",
    open,
);

fn open(endpoint: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(KinesisTarget(MotoRun::of(endpoint, run))))
}

/// moto and the run's stream names.
struct KinesisTarget(MotoRun);

impl DemoTarget for KinesisTarget {
    /// A stream per run (made by the consumer with its shards); the default envelope format,
    /// which carries the event id the consumer counts by.
    fn config(&self) -> DemoConfig {
        let keys = format!(
            "region = \"{REGION}\"\nendpoint_url = {}\n",
            toml_string(&self.0.endpoint)
        );
        DemoConfig::routed(keys, &format!("{}.${{routedByValue}}", self.0.prefix))
    }

    fn describe(&self, _: &SinkSettings) -> String {
        format!(
            "moto (Amazon Kinesis) at {} (a stream of {SHARDS} shards)",
            self.0.endpoint
        )
    }

    fn consume<'a>(&'a self, stream: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(KinesisConsumer::new(&self.0.endpoint, stream), tally, stop)
    }
}
