//! Publishing backfilled rows: the same Kafka record a streamed insert of that row would give
//! (topic from the route-by value, key, payload bytes, `id` header, timestamp, extra headers),
//! through the same idempotent [`Publisher`], with the same in-flight budget.
//!
//! The backfill succeeds only when Kafka acknowledged every record: [`BackfillPublisher::finish`]
//! waits until nothing is in flight, and the first failed delivery ends the backfill.

use bytes::Bytes;
use tokio::sync::mpsc;

use super::error::BackfillError;
use super::pending::PendingRow;
use crate::config::Settings;
use crate::kafka::producer::{Delivery, OutboundRecord, Publisher};
use crate::outbox::event::{parse_timestamp_ms, BadEvent};
use crate::outbox::routing;

/// What rides with each backfilled record: its size, returned to the byte budget on delivery.
#[derive(Debug)]
pub struct BackfillTag {
    bytes: usize,
}

/// Records handed to Kafka and not yet reported, against `relay.max_in_flight(_bytes)`.
#[derive(Debug, Default)]
struct InFlight {
    events: usize,
    bytes: usize,
}

pub struct BackfillPublisher<'s> {
    settings: &'s Settings,
    publisher: Publisher<BackfillTag>,
    deliveries: mpsc::UnboundedReceiver<Delivery<BackfillTag>>,
    in_flight: InFlight,
    pub sent: u64,
}

impl<'s> BackfillPublisher<'s> {
    pub fn new(settings: &'s Settings) -> Result<Self, BackfillError> {
        let (publisher, deliveries) =
            Publisher::create(&settings.kafka, settings.relay.max_in_flight).map_err(BackfillError::Producer)?;
        Ok(BackfillPublisher {
            settings,
            publisher,
            deliveries,
            in_flight: InFlight::default(),
            sent: 0,
        })
    }

    /// Hands one pending row to Kafka, first waiting for room in the in-flight budget.
    pub async fn publish(&mut self, row: &PendingRow) -> Result<(), BackfillError> {
        let relay = &self.settings.relay;
        while self.in_flight.events >= relay.max_in_flight || self.in_flight.bytes >= relay.max_in_flight_bytes {
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
        let topic = routing::topic(&self.settings.router, &route_value).map_err(bad)?;
        let record = OutboundRecord {
            topic: &topic,
            key: key.as_bytes(),
            payload: payload.as_bytes(),
            event_id: event_id.as_bytes(),
            timestamp_ms,
            headers: &headers,
        };
        let bytes = record.size();
        if let Err(rejected) = self.publisher.send(&record, Box::new(BackfillTag { bytes })) {
            if rejected.is_bad_record() {
                return Err(bad(BadEvent::Rejected(rejected.error.to_string())));
            }
            return Err(BackfillError::Delivery(Box::new(
                crate::kafka::producer::DeliveryFailure {
                    error: rejected.error,
                    topic: topic.into_owned(),
                    event_id: Some(event_id),
                },
            )));
        }
        self.in_flight.events += 1;
        self.in_flight.bytes += bytes;
        self.sent += 1;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.settle(delivery)?;
        }
        Ok(())
    }

    /// Waits until Kafka acknowledged every record sent; returns how many there were.
    pub async fn finish(mut self) -> Result<u64, BackfillError> {
        while self.in_flight.events > 0 {
            self.settle_next().await?;
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

    fn settle(&mut self, delivery: Delivery<BackfillTag>) -> Result<(), BackfillError> {
        self.in_flight.events -= 1;
        self.in_flight.bytes -= delivery.tag.bytes;
        delivery
            .outcome
            .map_err(|failure| BackfillError::Delivery(Box::new(failure)))
    }
}

fn internal(e: impl std::fmt::Display) -> BackfillError {
    BackfillError::Internal(e.to_string())
}
