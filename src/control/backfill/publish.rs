//! Publishing backfilled rows: the same Kafka record a streamed insert of that row would give
//! (topic from the route-by value, key, payload bytes, `id` header, timestamp, extra headers),
//! through the same idempotent [`Publisher`], with the same in-flight budget.
//!
//! The backfill succeeds only when Kafka acknowledged every record: all rows are one
//! [`AckWatermark`] "transaction" that is committed at the slot's consistent point after the last
//! send, and the watermark reaching that point is the proof (a failed delivery poisons it).

use bytes::Bytes;
use tokio::sync::mpsc;

use super::error::BackfillError;
use super::pending::PendingRow;
use crate::config::Settings;
use crate::lsn::Lsn;
use crate::outbox_event::{parse_timestamp_ms, BadEvent};
use crate::publisher::{Delivery, DeliveryTag, OutboundRecord, Publisher};
use crate::routing::validate_topic_name;
use crate::watermark::{AckWatermark, TxnTicket};

pub struct BackfillPublisher<'s> {
    settings: &'s Settings,
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    watermark: AckWatermark,
    ticket: TxnTicket,
    consistent_point: Lsn,
    pub sent: u64,
}

impl<'s> BackfillPublisher<'s> {
    pub fn new(settings: &'s Settings, consistent_point: Lsn) -> Result<Self, BackfillError> {
        let (publisher, deliveries) =
            Publisher::new(&settings.kafka, settings.relay.max_in_flight).map_err(BackfillError::Producer)?;
        // Starts below the consistent point so that reaching it means "all acknowledged".
        let mut watermark = AckWatermark::new(Lsn::ZERO);
        let ticket = watermark.begin().map_err(internal)?;
        Ok(BackfillPublisher {
            settings,
            publisher,
            deliveries,
            watermark,
            ticket,
            consistent_point,
            sent: 0,
        })
    }

    /// Hands one pending row to Kafka, first waiting for room in the in-flight budget.
    pub async fn publish(&mut self, row: &PendingRow) -> Result<(), BackfillError> {
        let relay = &self.settings.relay;
        while self.watermark.in_flight_events() >= relay.max_in_flight
            || self.watermark.in_flight_bytes() >= relay.max_in_flight_bytes
        {
            self.settle_next().await?;
        }
        let mapping = &self.settings.outbox;
        let columns = mapping.columns();
        let value = |i: usize| row.get(i).cloned().flatten();
        let required = |i: usize, role: &'static str| {
            value(i).ok_or_else(|| BadEvent::Null {
                column: columns[i].1.as_str().to_owned(),
                role,
            })
        };
        let id = value(0).unwrap_or_else(|| "?".into());
        let bad = |cause: BadEvent| BackfillError::BadRow { id: id.clone(), cause };
        let event_id = required(0, "event id").map_err(bad)?;
        let key = required(1, "message key").map_err(bad)?;
        let route_value = required(2, "route-by value").map_err(bad)?;
        let payload = required(3, "payload").map_err(bad)?;
        let mut next = 4;
        let timestamp_ms = if mapping.timestamp.is_some() {
            next += 1;
            value(4).and_then(|t| parse_timestamp_ms(t.as_bytes()))
        } else {
            None
        };
        let headers: Vec<(&str, Option<Bytes>)> = mapping
            .headers
            .iter()
            .enumerate()
            .map(|(i, (_, name))| (name.as_str(), value(next + i).map(Bytes::from)))
            .collect();
        let topic = self.settings.router.route(&route_value);
        validate_topic_name(&topic).map_err(|m| bad(BadEvent::Topic(m)))?;
        let record = OutboundRecord {
            topic: &topic,
            key: key.as_bytes(),
            payload: payload.as_bytes(),
            event_id: event_id.as_bytes(),
            timestamp_ms,
            headers: &headers,
        };
        let bytes = record.size();
        let tag = Box::new(DeliveryTag {
            ticket: self.ticket,
            bytes,
            commit_lsn: self.consistent_point,
            commit_time_unix_us: timestamp_ms.map_or(0, |ms| ms * 1000),
            event_seq: u32::try_from(self.sent).unwrap_or(u32::MAX),
            dead_letter: false,
            topic: crate::metrics::TopicId::default(),
        });
        self.watermark.event_sent(self.ticket, bytes).map_err(internal)?;
        if let Err(rejected) = self.publisher.send(&record, tag) {
            self.watermark.failed(self.ticket, bytes).map_err(internal)?;
            if rejected.is_bad_record() {
                return Err(bad(BadEvent::Rejected(rejected.error.to_string())));
            }
            return Err(BackfillError::Delivery(Box::new(crate::publisher::DeliveryFailure {
                error: rejected.error,
                topic: topic.into_owned(),
                event_id: Some(event_id),
            })));
        }
        self.sent += 1;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.settle(delivery)?;
        }
        Ok(())
    }

    /// Waits until Kafka acknowledged every record sent; returns how many there were.
    pub async fn finish(mut self) -> Result<u64, BackfillError> {
        while self.watermark.in_flight_events() > 0 {
            self.settle_next().await?;
        }
        self.watermark
            .commit(self.ticket, self.consistent_point)
            .map_err(internal)?;
        if self.watermark.confirmed() != self.consistent_point {
            return Err(internal(format!(
                "backfill watermark stopped at {} before the consistent point {}",
                self.watermark.confirmed(),
                self.consistent_point
            )));
        }
        Ok(self.sent)
    }

    /// Gives up: drops queued records and waits (bounded) for those on the wire.
    pub fn abandon(self) {
        self.publisher.abandon(self.settings.relay.shutdown_timeout);
    }

    async fn settle_next(&mut self) -> Result<(), BackfillError> {
        // librdkafka reports every record within message.timeout.ms, success or failure.
        let delivery = self
            .deliveries
            .recv()
            .await
            .ok_or_else(|| internal("the producer's delivery channel closed while records were in flight"))?;
        self.settle(delivery)
    }

    fn settle(&mut self, delivery: Delivery) -> Result<(), BackfillError> {
        let bytes = delivery.tag.bytes;
        match delivery.outcome {
            Ok(()) => self.watermark.acked(self.ticket, bytes).map_err(internal),
            Err(failure) => {
                self.watermark.failed(self.ticket, bytes).map_err(internal)?;
                Err(BackfillError::Delivery(Box::new(failure)))
            }
        }
    }
}

fn internal(e: impl std::fmt::Display) -> BackfillError {
    BackfillError::Internal(e.to_string())
}
