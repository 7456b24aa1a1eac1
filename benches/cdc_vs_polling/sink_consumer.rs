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

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use async_nats::jetstream::consumer::push;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::consumer::Receipt;
use super::sinks::{bounded, nats_jetstream, rabbitmq_connection, redis_connection};

/// How long one read waits for messages before the consumer looks at its stop flag again.
const WAIT: Duration = Duration::from_millis(100);
const REDIS_BATCH: usize = 1_000;

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
