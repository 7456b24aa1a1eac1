//! The RabbitMQ adapter, run by the shared driver (`sink/driver.rs`, one message per key on the
//! wire): `encode` copies the record into an AMQP message, `send` publishes it on the channel,
//! in confirm mode, and hands back its confirm, `classify` reads the confirm.
//!
//! **Confirms.** Every publish gets a lapin `PublisherConfirm`, which lapin resolves from the
//! broker's `basic.ack`/`basic.nack` by delivery tag — including acks with `multiple` and acks
//! that arrive out of publish order — so each record is completed from its own confirm:
//! * ack → delivered (with `delivery_mode = 2` and durable queues, the message is on disk in
//!   every queue it was routed to);
//! * ack carrying a `basic.return` (`mandatory`, no queue bound for the routing key) →
//!   [`FailureKind::Refused`]: the broker would otherwise drop it silently, so it is a bad event
//!   and `relay.on_bad_event` decides; the records of the same key queued behind it, and those
//!   handed over later until the caller releases the key (`Sink::release`), are not published
//!   but fail `Transient` (the caller replays them once it decided about this one);
//! * nack, a failed publish, a closed channel or connection → [`FailureKind::Transient`], and
//!   the sink is *broken*: everything queued behind fails `Transient` at once and nothing more
//!   is published (no reconnect inside one sink; the relay abandons it and replays).
//!
//! **Order.** At most one unconfirmed message per aggregate key: a record whose key already has
//! a message on the wire waits in the driver until that one is confirmed. So a nack of message k
//! can never leave message k+1 of the same aggregate stored ahead of it — k+1 was not sent yet,
//! and fails with the sink. Different keys are pipelined freely. The cost: one aggregate gets
//! at most one message per confirm round trip (docs/sink-rabbitmq.md has numbers).
//!
//! **CloudEvents** (`[cloudevents]`, the AMQP protocol binding 1.0.2): the record arrives with
//! the Kafka binding's names (`ce_<attr>` headers, `content-type`), and [`message`] moves them
//! where AMQP puts them. Binary mode: each `ce_<attr>` becomes the application property (header)
//! `cloudEvents:<attr>`, a string (the binding allows the canonical string form for every
//! type), and `content-type` becomes the `content_type` property (the `datacontenttype`).
//! Structured mode: the body is the JSON envelope and `content_type` its media type. The config
//! refuses header columns named `ce_*` or `content-type` with `[cloudevents]`, so every such
//! name here is one the relay wrote.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use tracing::debug;

use super::config::{validate_routing_key, RabbitMqSettings, MAX_SHORT_STRING};
use super::{check_exchange, connect, words, MAX_MESSAGE_BYTES, SINK};
use crate::config::cloudevents::CloudEventsMode;
use crate::sink::driver::{self, Concurrency, Driven, DriverOptions, Exchange, Outcome, Protocol, ReplyFuture};
use crate::sink::{Completions, Handover, SinkError, SinkRecord};

/// Header holding the event id (also the `message_id` property).
pub(crate) const ID_HEADER: &str = "id";
/// Header holding the aggregate key (the Kafka record key), as bytes.
pub(crate) const KEY_HEADER: &str = "key";
/// The AMQP binding's prefix of a CloudEvents attribute's application property.
pub(crate) const CE_PROPERTY_PREFIX: &str = "cloudEvents:";
/// The prefix of a CloudEvents attribute's header in the record (the Kafka binding's).
const CE_HEADER_PREFIX: &str = "ce_";
/// The record header carrying the content type in CloudEvents modes.
const CONTENT_TYPE_HEADER: &str = "content-type";

/// The RabbitMQ sink: the driver running an [`AmqpExchange`].
pub(crate) type Publisher<Tag> = Driven<AmqpExchange, Tag>;

/// One message, owning everything.
pub(crate) struct Outgoing {
    routing_key: String,
    body: Vec<u8>,
    properties: BasicProperties,
}

/// A message's confirm, with its routing key for the words of a failure.
pub(crate) type Reply = (String, lapin::Result<Confirmation>);

/// The AMQP side of the driver: the connection and its channel in confirm mode.
pub(crate) struct AmqpExchange {
    exchange: String,
    connection: Connection,
    channel: Channel,
    /// `[cloudevents]`'s mode: records carry CloudEvents headers to map to the AMQP binding.
    cloudevents: Option<CloudEventsMode>,
}

impl<Tag: Send + Sync + 'static> Driven<AmqpExchange, Tag> {
    /// Connects, checks the exchange, turns on publisher confirms and starts the driver on the
    /// current runtime. `max_in_flight` bounds the messages on the wire (the caller's budget
    /// bounds them anyway). `cloudevents`: `[cloudevents]`'s mode, if set.
    pub(crate) async fn create(
        settings: &RabbitMqSettings,
        max_in_flight: usize,
        cloudevents: Option<CloudEventsMode>,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        let (connection, channel) = connect(settings).await?;
        if let Err(e) = check_exchange(&channel, settings).await {
            let _ = tokio::time::timeout(Duration::from_secs(2), connection.close(200, "")).await;
            return Err(e);
        }
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| SinkError {
                sink: SINK,
                cause: format!("cannot turn on publisher confirms: {}", words(&e)),
                transient: true,
            })?;
        let exchange = AmqpExchange {
            exchange: settings.exchange.clone(),
            connection,
            channel,
            cloudevents,
        };
        Ok(driver::start(
            Arc::new(exchange),
            DriverOptions {
                // Different keys are pipelined freely; one unconfirmed message per key.
                concurrency: Concurrency::PerKey { max_keys: usize::MAX },
                max_in_flight: max_in_flight.max(1),
                max_in_flight_bytes: usize::MAX,
                // lapin resolves every confirm: with the broker's answer, or an error once the
                // channel or connection is gone.
                reply_timeout: None,
                max_queue_wait: None,
                dedup_queue_wait: None,
                // A dropped sink (no abandon) stops at once.
                drop_wait: Duration::ZERO,
            },
        ))
    }
}

/// `application/json` when the body is JSON, else nothing (consumers get the bytes as they are).
fn content_type(body: &[u8]) -> Option<&'static str> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    (matches!(first, b'{' | b'[' | b'"') && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok())
        .then_some("application/json")
}

/// The AMQP message of a record: headers (the record's, the extra ones, then `id` and `key`,
/// which win over a record header of the same name), properties, body. With `cloudevents`, the
/// CloudEvents headers are mapped to the AMQP binding (module docs) and the content type is the
/// event's, never derived from the body.
fn message(
    record: &SinkRecord<'_>,
    extra: &[(&str, &[u8])],
    cloudevents: Option<CloudEventsMode>,
) -> Result<(BasicProperties, Vec<u8>), String> {
    let mut headers = FieldTable::default();
    let named = |name: &str| -> Result<ShortString, String> {
        if name.len() > MAX_SHORT_STRING {
            return Err(format!(
                "header {:?}… is {} bytes long; AMQP header names allow at most {MAX_SHORT_STRING}",
                name.chars().take(32).collect::<String>(),
                name.len()
            ));
        }
        Ok(name.into())
    };
    let mut ce_content_type: Option<String> = None;
    for (name, value) in record.headers_with(extra) {
        if cloudevents.is_some() && name == CONTENT_TYPE_HEADER {
            let ct = value
                .and_then(|v| std::str::from_utf8(v).ok())
                .filter(|ct| ct.len() <= MAX_SHORT_STRING);
            ce_content_type = Some(
                ct.ok_or_else(|| {
                    "the CloudEvents content type is not UTF-8 text of at most 255 bytes, so it cannot be the AMQP \
                     content_type property; set [cloudevents] content_type to a shorter media type"
                        .to_owned()
                })?
                .to_owned(),
            );
            continue;
        }
        let value = match value {
            Some(v) => AMQPValue::LongString(LongString::from(v.to_vec())),
            None => AMQPValue::Void,
        };
        let name = match (cloudevents, name.strip_prefix(CE_HEADER_PREFIX)) {
            (Some(CloudEventsMode::Binary), Some(attribute)) => named(&format!("{CE_PROPERTY_PREFIX}{attribute}"))?,
            _ => named(name)?,
        };
        headers.insert(name, value);
    }
    headers.insert(
        ID_HEADER.into(),
        AMQPValue::LongString(LongString::from(record.event_id.to_vec())),
    );
    headers.insert(
        KEY_HEADER.into(),
        AMQPValue::LongString(LongString::from(record.key.to_vec())),
    );
    let event_id = std::str::from_utf8(record.event_id)
        .ok()
        .filter(|id| id.len() <= MAX_SHORT_STRING)
        .ok_or_else(|| {
            "the event id is not UTF-8 text of at most 255 bytes, so it cannot be the AMQP message_id".to_owned()
        })?;
    let body = record.value.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(event_id.into())
        .with_app_id("outbox-relay".into())
        .with_headers(headers);
    if let Some(ms) = record.timestamp_ms.filter(|ms| *ms >= 0) {
        // AMQP timestamps are whole seconds.
        properties = properties.with_timestamp((ms / 1000) as u64);
    }
    match ce_content_type {
        Some(ct) => properties = properties.with_content_type(ct.into()),
        // A CloudEvent's content type is its `datacontenttype` or nothing: a guess from the body
        // would state an attribute the event does not have.
        None if cloudevents.is_some() => {}
        None => {
            if let Some(ct) = content_type(&body) {
                properties = properties.with_content_type(ct.into());
            }
        }
    }
    Ok((properties, body))
}

impl Protocol for AmqpExchange {
    type Request = Outgoing;
    type Reply = Reply;

    const NAME: &'static str = SINK;

    fn reply_name(&self) -> &'static str {
        "confirm"
    }

    /// AMQP 0-9-1 does not deduplicate: `dedup_key` is unused (exactly-once is refused at start).
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Outgoing, String> {
        let Handover { record, extra, .. } = handover;
        validate_routing_key(&record.destination)?;
        if record.size() > MAX_MESSAGE_BYTES {
            return Err(format!(
                "the message is {} bytes; RabbitMQ's max_message_size is {MAX_MESSAGE_BYTES} by default",
                record.size()
            ));
        }
        let (properties, body) = message(record, extra, self.cloudevents)?;
        Ok(Outgoing {
            routing_key: record.destination.clone().into_owned(),
            body,
            properties,
        })
    }

    fn classify(&self, (routing_key, confirmation): Reply) -> Outcome {
        match confirmation {
            Ok(Confirmation::Ack(None)) => Outcome::Acknowledged,
            Ok(Confirmation::Ack(Some(returned))) => Outcome::Refused(format!(
                "unroutable: exchange {:?} has no queue bound for routing key {:?} (the broker returned it: {} \
                 {}); bind a queue whose pattern matches, or route the event elsewhere",
                self.exchange, routing_key, returned.reply_code, returned.reply_text
            )),
            Ok(Confirmation::Nack(_)) => Outcome::Transient(format!(
                "RabbitMQ nacked the message (it could not store it in every queue bound for routing key {routing_key:?})"
            )),
            Ok(Confirmation::NotRequested) => Outcome::Transient("the channel is not in confirm mode".into()),
            Err(e) => Outcome::Transient(format!("no confirm from RabbitMQ: {}", words(&e))),
        }
    }

    async fn close(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.channel.close(200, "abandoned")).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.connection.close(200, "abandoned")).await;
        debug!(exchange = %self.exchange, "RabbitMQ publisher closed");
    }
}

impl Exchange for AmqpExchange {
    async fn send(&self, outgoing: Outgoing) -> Result<ReplyFuture<Reply>, String> {
        let Outgoing {
            routing_key,
            body,
            properties,
        } = outgoing;
        let confirm = self
            .channel
            .basic_publish(
                &self.exchange,
                &routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &body,
                properties,
            )
            .await
            .map_err(|e| format!("publish to exchange {:?} failed: {}", self.exchange, words(&e)))?;
        Ok(Box::pin(async move { (routing_key, confirm.await) }))
    }
}
