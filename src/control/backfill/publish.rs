//! Publishing backfilled rows: the same Kafka record a streamed insert of that row would give
//! (topic from the route-by value, key, payload bytes, `id` header, timestamp, extra headers:
//! [`OutboxEvent::from_columns`] then [`OutboxEvent::record`], as the polling relayer does),
//! through the configured sink (`crate::sink`), with the same in-flight budget.
//!
//! The backfill succeeds only when Kafka acknowledged every record: [`BackfillPublisher::finish`]
//! waits until nothing is in flight, and the first failed delivery ends the backfill.
//!
//! `replay` publishes through the same type, with [`Replayed`] options (one destination for
//! everything, a header marking the records as replayed) and reads
//! [`BackfillPublisher::acknowledged`]: the length of the longest prefix of rows, in publishing
//! order, whose every row the broker acknowledged (or the filter skipped) — the only position a
//! resumed replay may continue after.

use std::collections::VecDeque;

use super::error::BackfillError;
use super::pending::PendingRow;
use crate::config::ident::TableName;
use crate::config::Settings;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::event::OutboxEvent;
use crate::outbox::event::RowFormat;
use crate::sink::{Completion, Completions, Handover, Sink, SinkLimits};

/// What rides with each backfilled record: its size, returned to the byte budget on delivery.
#[derive(Debug)]
pub(crate) struct BackfillTag {
    bytes: usize,
    /// The row's place in publishing order.
    seq: u64,
}

/// How `replay` changes the records (the backfill uses neither).
#[derive(Debug, Clone, Default)]
pub(crate) struct Replayed {
    /// Every record goes here instead of its routed destination (`--to-topic`).
    pub(crate) destination: Option<String>,
    /// A header appended after the record's own, so consumers can tell a replayed record.
    pub(crate) header: Option<(String, Vec<u8>)>,
}

/// What became of one row handed to [`BackfillPublisher::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    Sent,
    /// `[filter]` excludes it: the stream would not have sent it either.
    Filtered,
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
    replayed: Replayed,
    prefix: AckedPrefix,
}

/// The acknowledged prefix of the rows handed over, in order: acknowledgements arrive in any
/// order (partitions, brokers), the prefix only grows over rows whose every predecessor is done.
#[derive(Debug, Default)]
struct AckedPrefix {
    /// One flag per row handed over and not yet in the prefix: done yet?
    window: VecDeque<bool>,
    /// Rows in the prefix (the sequence number of `window`'s front).
    done: u64,
}

impl AckedPrefix {
    /// Takes the next row; returns its sequence number.
    fn push(&mut self) -> u64 {
        self.window.push_back(false);
        self.done + self.window.len() as u64 - 1
    }

    /// Row `seq` is done: the prefix grows past every done row at its end.
    fn mark(&mut self, seq: u64) {
        let Some(index) = seq.checked_sub(self.done) else {
            return;
        };
        if let Some(flag) = self.window.get_mut(index as usize) {
            *flag = true;
        }
        while self.window.front() == Some(&true) {
            self.window.pop_front();
            self.done += 1;
        }
    }
}

impl<'s> BackfillPublisher<'s> {
    pub(crate) async fn new(settings: &'s Settings) -> Result<Self, BackfillError> {
        let (publisher, deliveries) =
            crate::sink::create(settings, settings.relay.max_in_flight, crate::sink::Purpose::Plain)
                .await
                .map_err(BackfillError::Producer)?;
        Ok(BackfillPublisher {
            settings,
            publisher,
            deliveries,
            limits: crate::sink::limits(settings),
            in_flight: InFlight::default(),
            sent: 0,
            replayed: Replayed::default(),
            prefix: AckedPrefix::default(),
        })
    }

    /// Publishes as `replay` does: see [`Replayed`].
    pub(crate) fn replaying(mut self, replayed: Replayed) -> Self {
        self.replayed = replayed;
        self
    }

    /// How many rows, from the first handed over, were all acknowledged (or filtered): a
    /// resumed run may skip exactly these.
    pub(crate) fn acknowledged(&self) -> u64 {
        self.prefix.done
    }

    /// Hands one pending row of `table` to Kafka, first waiting for room in the in-flight budget.
    /// `format` is how that table's rows become events (`bytea` payload decoded, `[debezium]`
    /// layout).
    pub(crate) async fn publish(
        &mut self,
        table: &TableName,
        format: &RowFormat,
        row: &PendingRow,
    ) -> Result<Handed, BackfillError> {
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
        let seq = self.prefix.push();
        if !event.passes(self.settings) {
            crate::ops::metrics::count_filtered();
            self.prefix.mark(seq);
            return Ok(Handed::Filtered);
        }
        let mut record = event.record(self.settings, &self.limits).map_err(bad)?;
        if let Some(destination) = &self.replayed.destination {
            record.destination = std::borrow::Cow::Borrowed(destination.as_str());
        }
        if event.has_invalid_traceparent() {
            crate::ops::metrics::count_invalid_traceparent();
        }
        let bytes = record.size();
        let header: Option<(&str, &[u8])> = self.replayed.header.as_ref().map(|(n, v)| (n.as_str(), v.as_slice()));
        let extra = header.as_slice();
        let tag = Box::new(BackfillTag { bytes, seq });
        // A full sink queue is waited out (backpressure), never a failed row.
        let sent = crate::sink::send_waiting(&*self.publisher, Handover::of(&record).with_extra(extra), tag).await;
        if let Err(refusal) = sent {
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
        Ok(Handed::Sent)
    }

    /// Settles every delivery already reported, without waiting.
    pub(crate) fn settle_ready(&mut self) -> Result<(), BackfillError> {
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
        if delivery.outcome.is_ok() {
            self.prefix.mark(delivery.tag.seq);
        }
        delivery.outcome.map_err(|failure| BackfillError::Delivery {
            sink: self.settings.sink.broker_name(),
            failure: Box::new(failure),
        })
    }
}

fn internal(e: impl std::fmt::Display) -> BackfillError {
    BackfillError::Internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::AckedPrefix;

    #[test]
    fn the_prefix_grows_only_over_rows_whose_every_predecessor_is_done() {
        let mut prefix = AckedPrefix::default();
        let seqs: Vec<u64> = (0..4).map(|_| prefix.push()).collect();
        assert_eq!(seqs, [0, 1, 2, 3]);
        prefix.mark(2);
        prefix.mark(1);
        assert_eq!(prefix.done, 0, "row 0 is still in flight");
        prefix.mark(0);
        assert_eq!(prefix.done, 3);
        assert_eq!(prefix.push(), 4);
        prefix.mark(4);
        assert_eq!(prefix.done, 3, "row 3 is still in flight");
        prefix.mark(3);
        assert_eq!(prefix.done, 5);
        // A sequence number already in the prefix changes nothing.
        prefix.mark(1);
        assert_eq!(prefix.done, 5);
    }
}
