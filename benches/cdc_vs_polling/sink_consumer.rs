//! The consumers of the non-Kafka brokers, each recording per message the event id and the
//! instant the client handed the message over (see `consumer.rs` for the thread they run on):
//!
//! * NATS JetStream: an ordered push consumer on the run's stream (ephemeral, flow-controlled, the
//!   server pushes each message as soon as it is stored); the id is the `id` header.
//! * RabbitMQ: an exclusive, auto-delete queue bound to the run's exchange with the routed key,
//!   `basic.consume` without acknowledgements (the broker pushes); the id is `message_id`.
//! * Redis Streams: `XREAD BLOCK` on the stream key from its start, up to `REDIS_BATCH` entries
//!   per read; the id is the entry's `id` field.
//! * HTTP webhook: the receiver (`webhook.rs`) stamps each request as it arrives; this source
//!   only collects its receipts (so how often it looks does not change a latency).
//! * Google Cloud Pub/Sub (emulator): an ordered subscription on the run's topic, made before the
//!   relay publishes; one pull at a time over REST (up to `PUBSUB_BATCH`; an empty one returns at
//!   once and the next follows after `PUBSUB_IDLE`), acknowledged in the background; the id is
//!   the `id` attribute. No waiting pulls: one the client gives up on may already hold messages,
//!   which the emulator hands out again only after the acknowledgement deadline.
//! * Amazon SQS (moto): the run's FIFO queue, made before the relay publishes; `SQS_RECEIVERS`
//!   long polls (`WaitTimeSeconds` 1, 10 messages each, the SQS maximum) at once, each batch
//!   deleted in the background; the id is the `id` message attribute.
//! * Amazon SNS (moto): the run's FIFO topic and a FIFO queue of the same name subscribed to it
//!   with raw message delivery (the queue's messages are the published ones, attributes
//!   included), made before the relay publishes, read as SQS's queue.
//! * Amazon Kinesis (moto): the run's stream, made (and ACTIVE) before the relay publishes; a
//!   task per shard reads it from its start with `GetRecords` (up to `KINESIS_BATCH` records; an
//!   empty read is followed by the next after `KINESIS_IDLE`); the id is the `id` of the record's
//!   JSON envelope (docs/sink-kinesis.md).

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use async_nats::jetstream::consumer::push;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::consumer::Receipt;
use super::emulators;
use super::sinks::{bounded, nats_jetstream, rabbitmq_connection, redis_connection, BROKER_TIMEOUT};

/// How long one read waits for messages before the consumer looks at its stop flag again.
const WAIT: Duration = Duration::from_millis(100);
const REDIS_BATCH: usize = 1_000;
/// Messages one Pub/Sub pull may return.
const PUBSUB_BATCH: usize = 1_000;
/// The pause after an empty Pub/Sub pull (bounds what polling adds to a latency).
const PUBSUB_IDLE: Duration = Duration::from_millis(2);
/// SQS long polls at once: one returns at most 10 messages, so one at a time would cap the
/// consumer near 10 messages per round trip to moto.
const SQS_RECEIVERS: usize = 4;
/// Records one Kinesis `GetRecords` may return.
const KINESIS_BATCH: i32 = 10_000;
/// The pause after an empty Kinesis read of a shard (bounds what polling adds to a latency;
/// moto has no per-shard read limit, a Kinesis shard allows 5 reads a second).
const KINESIS_IDLE: Duration = Duration::from_millis(10);
/// How long a created Kinesis stream may take to become ACTIVE.
const KINESIS_ACTIVE_LIMIT: Duration = Duration::from_secs(30);

// One value per consumer thread, for the thread's whole life: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum AsyncSource {
    Nats {
        messages: push::Ordered,
    },
    RabbitMq {
        // Kept open for as long as the consumer reads.
        _connection: lapin::Connection,
        _channel: lapin::Channel,
        consumer: lapin::Consumer,
    },
    Redis {
        connection: redis::aio::MultiplexedConnection,
        key: String,
        /// The last entry id read (`0-0`: from the start).
        last: String,
    },
    Webhook {
        receiver: std::sync::Arc<super::sinks::WebhookReceiver>,
    },
    PubSub {
        http: reqwest::Client,
        subscription: String,
    },
    /// Receiver tasks of the run's destination (SQS and SNS: long polls of the queue; Kinesis: a
    /// reader per shard).
    Receivers {
        /// For messages: "SQS", "Kinesis".
        service: &'static str,
        /// What the receiver tasks got, stamped on arrival.
        receipts: tokio::sync::mpsc::UnboundedReceiver<Result<Receipt, String>>,
        /// Aborted when the source is dropped.
        receivers: Vec<tokio::task::AbortHandle>,
    },
}

impl Drop for AsyncSource {
    fn drop(&mut self) {
        if let AsyncSource::Receivers { receivers, .. } = self {
            for r in receivers {
                r.abort();
            }
        }
    }
}

fn parse_id(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

impl AsyncSource {
    pub async fn nats(stream: String) -> Result<AsyncSource> {
        let js = nats_jetstream().await?;
        let stream = bounded("NATS", "opening the stream", js.get_stream(&stream)).await?;
        let consumer = bounded(
            "NATS",
            "creating the ordered consumer",
            stream.create_consumer(push::OrderedConfig {
                deliver_subject: js.client().new_inbox(),
                ..Default::default()
            }),
        )
        .await?;
        let messages = bounded("NATS", "subscribing", consumer.messages()).await?;
        Ok(AsyncSource::Nats { messages })
    }

    pub async fn rabbitmq(exchange: String, routing_key: String) -> Result<AsyncSource> {
        let connection = rabbitmq_connection("outbox-relay-bench-consumer").await?;
        let channel = bounded("RabbitMQ", "opening a channel", connection.create_channel()).await?;
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let queue = bounded(
            "RabbitMQ",
            "declaring the queue",
            channel.queue_declare("", options, FieldTable::default()),
        )
        .await?
        .name()
        .as_str()
        .to_owned();
        bounded(
            "RabbitMQ",
            "binding the queue",
            channel.queue_bind(
                &queue,
                &exchange,
                &routing_key,
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        let consumer = bounded(
            "RabbitMQ",
            "basic.consume",
            channel.basic_consume(
                &queue,
                "outbox-relay-bench",
                BasicConsumeOptions {
                    no_ack: true,
                    exclusive: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await?;
        Ok(AsyncSource::RabbitMq {
            _connection: connection,
            _channel: channel,
            consumer,
        })
    }

    pub async fn redis(key: String) -> Result<AsyncSource> {
        let connection = redis_connection().await?;
        Ok(AsyncSource::Redis {
            connection,
            key,
            last: "0-0".into(),
        })
    }

    /// Creates `topic` and an ordered subscription `<topic>-sub` on the emulator.
    pub async fn pubsub(topic: String) -> Result<AsyncSource> {
        let http = emulators::pubsub_http()?;
        let subscription = format!("{topic}-sub");
        let created = |what: &str, r: reqwest::Response| {
            // 409: made already (by an earlier consumer of the same run).
            if r.status().is_success() || r.status() == reqwest::StatusCode::CONFLICT {
                Ok(())
            } else {
                Err(anyhow!("Pub/Sub emulator, creating {what}: {}", r.status()))
            }
        };
        let r = bounded(
            "Pub/Sub emulator",
            "creating the topic",
            http.put(emulators::pubsub_url(&format!("topics/{topic}"))?).send(),
        )
        .await?;
        created(&format!("topic {topic}"), r)?;
        let body = serde_json::json!({
            "topic": format!("projects/{}/topics/{topic}", emulators::PUBSUB_PROJECT),
            "enableMessageOrdering": true,
            "ackDeadlineSeconds": 60,
        });
        let r = bounded(
            "Pub/Sub emulator",
            "creating the subscription",
            http.put(emulators::pubsub_url(&format!("subscriptions/{subscription}"))?)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send(),
        )
        .await?;
        created(&format!("subscription {subscription}"), r)?;
        Ok(AsyncSource::PubSub { http, subscription })
    }

    /// Creates the FIFO queue `name` on moto and starts the receivers.
    pub async fn sqs(name: String) -> Result<AsyncSource> {
        let client = emulators::sqs_client()?;
        let url = create_fifo_queue(&client, &name).await?;
        Ok(AsyncSource::sqs_receivers(client, url))
    }

    /// `SQS_RECEIVERS` long polls of the queue at `url`.
    fn sqs_receivers(client: aws_sdk_sqs::Client, url: String) -> AsyncSource {
        let (tx, receipts) = tokio::sync::mpsc::unbounded_channel();
        let receivers = (0..SQS_RECEIVERS)
            .map(|_| tokio::spawn(sqs_receiver(client.clone(), url.clone(), tx.clone())).abort_handle())
            .collect();
        AsyncSource::Receivers {
            service: "SQS",
            receipts,
            receivers,
        }
    }

    /// Creates the FIFO topic `name` on moto and a FIFO queue of the same name subscribed to it
    /// with raw message delivery, and starts the queue's receivers.
    pub async fn sns(name: String) -> Result<AsyncSource> {
        let sns = emulators::sns_client()?;
        let topic = bounded(
            "moto",
            "CreateTopic",
            sns.create_topic().name(&name).attributes("FifoTopic", "true").send(),
        )
        .await?
        .topic_arn()
        .context("CreateTopic returned no topic ARN")?
        .to_owned();
        let sqs = emulators::sqs_client()?;
        let url = create_fifo_queue(&sqs, &name).await?;
        let queue_arn = bounded(
            "moto",
            "GetQueueAttributes",
            sqs.get_queue_attributes()
                .queue_url(&url)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
                .send(),
        )
        .await?
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn).cloned())
        .context("GetQueueAttributes returned no queue ARN")?;
        bounded(
            "moto",
            "Subscribe",
            sns.subscribe()
                .topic_arn(&topic)
                .protocol("sqs")
                .endpoint(queue_arn)
                .attributes("RawMessageDelivery", "true")
                .send(),
        )
        .await?;
        Ok(AsyncSource::sqs_receivers(sqs, url))
    }

    /// Creates the stream `name` of `shards` shards on moto, waits until it is ACTIVE, and starts
    /// a reader per shard.
    pub async fn kinesis(name: String, shards: i32) -> Result<AsyncSource> {
        let client = emulators::kinesis_client()?;
        let listed = kinesis_stream(&client, &name, shards).await?;
        let (tx, receipts) = tokio::sync::mpsc::unbounded_channel();
        let receivers = listed
            .shards()
            .iter()
            .map(|shard| {
                let reader = kinesis_reader(client.clone(), name.clone(), shard.shard_id().to_owned(), tx.clone());
                tokio::spawn(reader).abort_handle()
            })
            .collect();
        Ok(AsyncSource::Receivers {
            service: "Kinesis",
            receipts,
            receivers,
        })
    }

    /// Reads what arrived (waiting at most about [`WAIT`]) into `out`.
    pub async fn poll(&mut self, out: &mut Vec<Receipt>) -> Result<()> {
        match self {
            AsyncSource::Nats { messages } => match tokio::time::timeout(WAIT, messages.next()).await {
                Ok(Some(Ok(m))) => {
                    let at = Instant::now();
                    let id = m
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("id"))
                        .and_then(|v| parse_id(v.as_str().as_bytes()));
                    if let Some(id) = id {
                        out.push((id, at));
                    }
                    Ok(())
                }
                Ok(Some(Err(e))) => Err(anyhow!("NATS consumer: {e}")),
                Ok(None) => Err(anyhow!("NATS consumer: the subscription ended")),
                Err(_) => Ok(()),
            },
            AsyncSource::RabbitMq { consumer, .. } => match tokio::time::timeout(WAIT, consumer.next()).await {
                Ok(Some(Ok(delivery))) => {
                    let at = Instant::now();
                    if let Some(id) = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|m| parse_id(m.as_str().as_bytes()))
                    {
                        out.push((id, at));
                    }
                    Ok(())
                }
                Ok(Some(Err(e))) => Err(anyhow!("RabbitMQ consumer: {e}")),
                Ok(None) => Err(anyhow!("RabbitMQ consumer: the consumer was cancelled")),
                Err(_) => Ok(()),
            },
            AsyncSource::Webhook { receiver } => {
                let taken = receiver.take();
                if taken.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                out.extend(taken);
                Ok(())
            }
            AsyncSource::PubSub { http, subscription } => {
                let pull = http
                    .post(emulators::pubsub_url(&format!("subscriptions/{subscription}:pull"))?)
                    .header("content-type", "application/json")
                    .body(serde_json::json!({ "maxMessages": PUBSUB_BATCH, "returnImmediately": true }).to_string())
                    .send();
                let reply = pull.await.map_err(|e| anyhow!("Pub/Sub pull: {e}"))?;
                if !reply.status().is_success() {
                    return Err(anyhow!("Pub/Sub pull: {}", reply.status()));
                }
                let bytes = reply.bytes().await.map_err(|e| anyhow!("Pub/Sub pull: {e}"))?;
                let body: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| anyhow!("Pub/Sub pull: {e}"))?;
                let at = Instant::now();
                let mut ack_ids = Vec::new();
                for m in body["receivedMessages"].as_array().into_iter().flatten() {
                    if let Some(ack) = m["ackId"].as_str() {
                        ack_ids.push(ack.to_owned());
                    }
                    if let Some(id) = m["message"]["attributes"]["id"]
                        .as_str()
                        .and_then(|v| parse_id(v.as_bytes()))
                    {
                        out.push((id, at));
                    }
                }
                if ack_ids.is_empty() {
                    tokio::time::sleep(PUBSUB_IDLE).await;
                } else {
                    // In the background: the next pull does not wait for it.
                    let ack = http
                        .post(emulators::pubsub_url(&format!(
                            "subscriptions/{subscription}:acknowledge"
                        ))?)
                        .header("content-type", "application/json")
                        .body(serde_json::json!({ "ackIds": ack_ids }).to_string())
                        .send();
                    tokio::spawn(async move {
                        if let Err(e) = ack.await {
                            eprintln!("bench consumer (pubsub): acknowledge: {e}");
                        }
                    });
                }
                Ok(())
            }
            AsyncSource::Receivers { service, receipts, .. } => match tokio::time::timeout(WAIT, receipts.recv()).await
            {
                Ok(Some(first)) => {
                    out.push(first.map_err(|e| anyhow!("{service} receive: {e}"))?);
                    while let Ok(next) = receipts.try_recv() {
                        out.push(next.map_err(|e| anyhow!("{service} receive: {e}"))?);
                    }
                    Ok(())
                }
                Ok(None) => Err(anyhow!("{service} consumer: every receiver stopped")),
                Err(_) => Ok(()),
            },
            AsyncSource::Redis { connection, key, last } => {
                let reply: Option<redis::streams::StreamReadReply> = bounded(
                    "Redis",
                    "XREAD",
                    redis::cmd("XREAD")
                        .arg("COUNT")
                        .arg(REDIS_BATCH)
                        .arg("BLOCK")
                        .arg(WAIT.as_millis() as u64)
                        .arg("STREAMS")
                        .arg(&*key)
                        .arg(&*last)
                        .query_async(connection),
                )
                .await?;
                let at = Instant::now();
                for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                    let id = entry
                        .map
                        .get("id")
                        .and_then(|v| redis::from_redis_value_ref::<Vec<u8>>(v).ok())
                        .and_then(|b| parse_id(&b));
                    if let Some(id) = id {
                        out.push((id, at));
                    }
                    *last = entry.id;
                }
                Ok(())
            }
        }
    }
}

/// One SQS long-poll loop: receives, stamps, deletes in the background; reports an error once
/// per failure and polls on (a lost message shows as lost).
async fn sqs_receiver(
    client: aws_sdk_sqs::Client,
    url: String,
    out: tokio::sync::mpsc::UnboundedSender<Result<Receipt, String>>,
) {
    loop {
        let got = client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(60)
            .message_attribute_names("All")
            .send()
            .await;
        let at = Instant::now();
        let messages = match got {
            Ok(r) => r.messages.unwrap_or_default(),
            Err(e) => {
                if out
                    .send(Err(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()))
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut delete = client.delete_message_batch().queue_url(&url);
        for (i, m) in messages.iter().enumerate() {
            let id = m
                .message_attributes()
                .and_then(|a| a.get("id"))
                .and_then(|v| v.string_value())
                .and_then(|v| parse_id(v.as_bytes()));
            if let Some(id) = id {
                if out.send(Ok((id, at))).is_err() {
                    return;
                }
            }
            if let Some(handle) = m.receipt_handle() {
                if let Ok(entry) = aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(handle)
                    .build()
                {
                    delete = delete.entries(entry);
                }
            }
        }
        if !messages.is_empty() {
            tokio::spawn(async move {
                if let Err(e) = delete.send().await {
                    eprintln!(
                        "bench consumer (sqs): DeleteMessageBatch: {}",
                        aws_sdk_sqs::error::DisplayErrorContext(&e)
                    );
                }
            });
        }
    }
}

/// Creates the FIFO queue `name` on moto; returns its URL.
async fn create_fifo_queue(client: &aws_sdk_sqs::Client, name: &str) -> Result<String> {
    let created = bounded(
        "moto",
        "CreateQueue",
        client
            .create_queue()
            .queue_name(name)
            .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
            .send(),
    )
    .await?;
    Ok(created
        .queue_url()
        .context("CreateQueue returned no queue URL")?
        .to_owned())
}

/// The event id of a Kinesis record's data: the `id` of the relay's JSON envelope
/// (`{"id","key","headers","payload"}`, the id as decimal text).
fn envelope_id(data: &[u8]) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: &'a str,
    }
    serde_json::from_slice::<Envelope<'_>>(data)
        .ok()
        .and_then(|e| parse_id(e.id.as_bytes()))
}

/// Makes Kinesis stream `name` (`shards` shards) unless it exists, and waits until it is ACTIVE;
/// its shards.
pub async fn kinesis_stream(
    client: &aws_sdk_kinesis::Client,
    name: &str,
    shards: i32,
) -> Result<aws_sdk_kinesis::operation::list_shards::ListShardsOutput> {
    match tokio::time::timeout(
        BROKER_TIMEOUT,
        client.create_stream().stream_name(name).shard_count(shards).send(),
    )
    .await
    {
        Ok(Ok(_)) => {}
        // Made before the drain (`SinkTarget::prepare`).
        Ok(Err(e)) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
        Ok(Err(e)) => {
            return Err(anyhow!(
                "moto, CreateStream {name}: {}",
                aws_sdk_kinesis::error::DisplayErrorContext(&e)
            ))
        }
        Err(_) => {
            return Err(anyhow!(
                "moto, CreateStream {name}: no answer within {BROKER_TIMEOUT:?}"
            ))
        }
    }
    // ListShards answers ResourceInUseException until the stream is ACTIVE (moto's
    // DescribeStreamSummary timestamps are not RFC 3339, which the SDK refuses).
    let deadline = Instant::now() + KINESIS_ACTIVE_LIMIT;
    loop {
        match tokio::time::timeout(BROKER_TIMEOUT, client.list_shards().stream_name(name).send()).await {
            Ok(Ok(listed)) => return Ok(listed),
            Ok(Err(e))
                if Instant::now() < deadline
                    && e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(e)) => {
                return Err(anyhow!(
                    "moto, ListShards {name}: {}",
                    aws_sdk_kinesis::error::DisplayErrorContext(&e)
                ))
            }
            Err(_) => return Err(anyhow!("moto, ListShards {name}: no answer within {BROKER_TIMEOUT:?}")),
        }
    }
}

/// One Kinesis shard read from its start: stamps every record as its read returns; reports an
/// error once per failure and reads on (a fresh iterator after the last sequence number read).
async fn kinesis_reader(
    client: aws_sdk_kinesis::Client,
    stream: String,
    shard: String,
    out: tokio::sync::mpsc::UnboundedSender<Result<Receipt, String>>,
) {
    use aws_sdk_kinesis::types::ShardIteratorType;
    let mut after: Option<String> = None;
    let mut iterator: Option<String> = None;
    loop {
        let it = match iterator.take() {
            Some(it) => it,
            None => {
                let request = client.get_shard_iterator().stream_name(&stream).shard_id(&shard);
                let request = match &after {
                    Some(seq) => request
                        .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                        .starting_sequence_number(seq),
                    None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
                };
                match request.send().await {
                    Ok(r) => match r.shard_iterator() {
                        Some(it) => it.to_owned(),
                        None => return,
                    },
                    Err(e) => {
                        let text = aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string();
                        if out.send(Err(format!("GetShardIterator: {text}"))).is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        let got = client
            .get_records()
            .shard_iterator(it)
            .limit(KINESIS_BATCH)
            .send()
            .await;
        let at = Instant::now();
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                let text = aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string();
                if out.send(Err(format!("GetRecords: {text}"))).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for record in got.records() {
            if let Some(id) = envelope_id(record.data().as_ref()) {
                if out.send(Ok((id, at))).is_err() {
                    return;
                }
            }
            after = Some(record.sequence_number().to_owned());
        }
        if got.records().is_empty() {
            tokio::time::sleep(KINESIS_IDLE).await;
        }
        // None: the shard was closed (not by this benchmark, which never reshards).
        match got.next_shard_iterator() {
            Some(next) => iterator = Some(next.to_owned()),
            None => return,
        }
    }
}
