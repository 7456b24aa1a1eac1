//! Publishing backfilled rows: the same Kafka record a streamed insert of that row would give
//! (topic from the route-by value, key, payload bytes, `id` header, timestamp, extra headers:
//! [`OutboxEvent::from_columns`] then [`OutboxEvent::record`], as the polling relayer does),
//! through the configured sink (`crate::sink`), with the same in-flight budget.
//!
//! The backfill succeeds only when Kafka acknowledged every record: [`BackfillPublisher::finish`]
//! waits until nothing is in flight, and the first failed delivery ends the backfill.

use super::error::BackfillError;
use super::pending::PendingRow;
use crate::config::ident::TableName;
use crate::config::Settings;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::event::OutboxEvent;
use crate::outbox::event::RowFormat;
use crate::sink::{Completion, Completions, Sink, SinkLimits};

/// What rides with each backfilled record: its size, returned to the byte budget on delivery.
#[derive(Debug)]
pub(crate) struct BackfillTag {
    bytes: usize,
}

/// Records handed to Kafka and not yet reported, against `relay.max_in_flight(_bytes)`.
#[derive(Debug, Default)]
struct InFlight {
    events: usize,
    bytes: usize,
}

pub(crate) struct BackfillPublisher<'s> {
    settings: &'s Settings,
    publisher: Box<dyn Sink<BackfillTag>>,
    deliveries: Completions<BackfillTag>,
    limits: SinkLimits,
    in_flight: InFlight,
    pub(crate) sent: u64,
}

impl<'s> BackfillPublisher<'s> {
    pub(crate) async fn new(settings: &'s Settings) -> Result<Self, BackfillError> {
        let (publisher, deliveries) = crate::sink::create(settings, settings.relay.max_in_flight)
            .await
            .map_err(BackfillError::Producer)?;
        Ok(BackfillPublisher {
            settings,
            publisher,
            deliveries,
            limits: crate::sink::limits(settings),
            in_flight: InFlight::default(),
            sent: 0,
        })
    }

    /// Hands one pending row of `table` to Kafka, first waiting for room in the in-flight budget.
    /// `format` is how that table's rows become events (`bytea` payload decoded, `[debezium]`
    /// layout).
    pub(crate) async fn publish(
        &mut self,
        table: &TableName,
        format: &RowFormat,
        row: &PendingRow,
    ) -> Result<(), BackfillError> {
        let relay = &self.settings.relay;
        while self.in_flight.events >= relay.max_in_flight || self.in_flight.bytes >= relay.max_in_flight_bytes {
            self.settle_next().await?;
        }
        let values: Vec<Option<&str>> = row.iter().map(Option::as_deref).collect();
        let id = OutboxEvent::id_of_columns(&values);
        let bad = |cause: BadEvent| BackfillError::BadRow {
            id: id.to_owned(),
            cause,
        };
        let event = OutboxEvent::from_columns(&self.settings.outbox, table, &values, format).map_err(bad)?;
        // `[filter]`: the stream would not have sent it either.
        if !event.passes(self.settings) {
            crate::ops::metrics::count_filtered();
            return Ok(());
        }
        let record = event.record(self.settings, &self.limits).map_err(bad)?;
        if event.has_invalid_traceparent() {
            crate::ops::metrics::count_invalid_traceparent();
        }
        let bytes = record.size();
        if let Err(refusal) = self.publisher.send(&record, &[], None, Box::new(BackfillTag { bytes })) {
            if refusal.failure.is_refusal() {
                return Err(bad(BadEvent::refused_by(
                    self.settings.sink.broker_name(),
                    &refusal.failure.cause,
                )));
            }
            return Err(BackfillError::Delivery {
                sink: self.settings.sink.broker_name(),
                failure: Box::new(refusal.failure),
            });
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
    pub(crate) async fn finish(mut self) -> Result<u64, BackfillError> {
        while self.in_flight.events > 0 {
            self.settle_next().await?;
        }
        Ok(self.sent)
    }

    /// Gives up: drops queued records and waits (bounded) for those on the wire.
    pub(crate) fn abandon(self) {
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

    fn settle(&mut self, delivery: Completion<BackfillTag>) -> Result<(), BackfillError> {
        self.in_flight.events -= 1;
        self.in_flight.bytes -= delivery.tag.bytes;
        delivery.outcome.map_err(|failure| BackfillError::Delivery {
            sink: self.settings.sink.broker_name(),
            failure: Box::new(failure),
        })
    }
}

fn internal(e: impl std::fmt::Display) -> BackfillError {
    BackfillError::Internal(e.to_string())
}
