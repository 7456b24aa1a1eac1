//! The per-session state machine between decoded WAL messages, Kafka and the watermark.
//!
//! Pure with respect to I/O: it receives decoded frames and delivery reports and tells the
//! event loop (in `session.rs`) what to send. Keeping the loop's arms this short is what makes
//! their priorities easy to read.

use std::collections::HashMap;

use bytes::Bytes;
use tracing::{debug, info};

use super::error::RelayError;
use crate::config::Settings;
use crate::lsn::Lsn;
use crate::outbox_event::{BadEvent, OutboxLayout};
use crate::pgoutput::{self, Insert, LogicalMessage, PgTimestamp, Relation};
use crate::publisher::{Delivery, DeliveryTag, OutboundRecord, Publisher};
use crate::replication::frames::{decode_server_frame, ServerFrame};
use crate::routing::validate_topic_name;
use crate::watermark::{AckWatermark, TxnTicket};

struct CachedRelation {
    relation: Relation,
    /// `Some` only for the outbox table.
    layout: Option<OutboxLayout>,
}

struct OpenTxn {
    ticket: TxnTicket,
    commit_lsn: Lsn,
    commit_time: PgTimestamp,
}

/// Counters for logs (and, later, metrics).
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionCounts {
    pub transactions: u64,
    pub events_sent: u64,
    pub events_acked: u64,
}

/// What the event loop must do after a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameAction {
    Nothing,
    /// The server asked for a status update right away.
    ReplyNow,
}

pub struct StreamState<'s> {
    settings: &'s Settings,
    publisher: Publisher,
    watermark: AckWatermark,
    relations: HashMap<u32, CachedRelation>,
    open: Option<OpenTxn>,
    received: Lsn,
    reported: Lsn,
    pub counts: SessionCounts,
}

impl<'s> StreamState<'s> {
    pub fn new(settings: &'s Settings, publisher: Publisher, start: Lsn) -> Self {
        StreamState {
            settings,
            publisher,
            watermark: AckWatermark::new(start),
            relations: HashMap::new(),
            open: None,
            received: start,
            reported: start,
            counts: SessionCounts::default(),
        }
    }

    /// Backpressure: stop reading WAL while this many events or bytes are unacknowledged.
    pub fn is_full(&self) -> bool {
        self.watermark.in_flight_events() >= self.settings.relay.max_in_flight
            || self.watermark.in_flight_bytes() >= self.settings.relay.max_in_flight_bytes
    }

    pub fn status_interval(&self) -> std::time::Duration {
        self.settings.relay.status_interval
    }

    pub fn in_flight(&self) -> usize {
        self.watermark.in_flight_events()
    }

    /// The (write, flush) pair for the next standby status update. Flush never goes backwards.
    pub fn status_position(&mut self) -> (Lsn, Lsn) {
        let flush = self.watermark.confirmed().max(self.reported);
        if flush > self.reported {
            debug!(flush = %flush, "confirming");
        }
        self.reported = flush;
        (self.received.max(flush), flush)
    }

    pub fn confirmed(&self) -> Lsn {
        self.reported.max(self.watermark.confirmed())
    }

    pub fn received(&self) -> Lsn {
        self.received
    }

    pub fn into_publisher(self) -> Publisher {
        self.publisher
    }

    pub fn on_frame(&mut self, frame: Bytes) -> Result<FrameAction, RelayError> {
        match decode_server_frame(frame).map_err(|e| RelayError::Frame(e.to_string()))? {
            ServerFrame::XLogData { wal_start, data, .. } => {
                let msg = pgoutput::decode(data).map_err(|source| RelayError::Decode { lsn: wal_start, source })?;
                self.on_message(msg)?;
                Ok(FrameAction::Nothing)
            }
            ServerFrame::PrimaryKeepalive { wal_end, reply_requested, .. } => {
                self.received = self.received.max(wal_end);
                self.watermark.keepalive(wal_end);
                Ok(if reply_requested { FrameAction::ReplyNow } else { FrameAction::Nothing })
            }
        }
    }

    fn on_message(&mut self, msg: LogicalMessage) -> Result<(), RelayError> {
        match msg {
            LogicalMessage::Begin(b) => {
                let ticket = self.watermark.begin()?;
                self.open = Some(OpenTxn { ticket, commit_lsn: b.final_lsn, commit_time: b.commit_time });
            }
            LogicalMessage::Commit(c) => {
                let txn = self.open.take().ok_or_else(|| RelayError::Protocol("Commit without Begin".into()))?;
                self.watermark.commit(txn.ticket, c.end_lsn)?;
                self.received = self.received.max(c.end_lsn);
                self.counts.transactions += 1;
            }
            LogicalMessage::Relation(r) => self.on_relation(r)?,
            LogicalMessage::Insert(i) => self.on_insert(i)?,
            // Updates and deletes of the outbox (a polling relayer's `SET dispatched_at`, an
            // insert-then-delete in one transaction, cleanup jobs) are not events.
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Message(_) => {}
        }
        Ok(())
    }

    fn on_relation(&mut self, relation: Relation) -> Result<(), RelayError> {
        let table = &self.settings.outbox.table;
        let layout = if relation.namespace == table.schema.as_str() && relation.name == table.name.as_str() {
            let layout = OutboxLayout::resolve(&self.settings.outbox, &relation)?;
            if self.relations.contains_key(&relation.oid) {
                info!(table = %table, columns = relation.columns.len(), "outbox table changed shape; column mapping refreshed");
            }
            Some(layout)
        } else {
            None
        };
        self.relations.insert(relation.oid, CachedRelation { relation, layout });
        Ok(())
    }

    fn on_insert(&mut self, insert: Insert) -> Result<(), RelayError> {
        let cached = self.relations.get(&insert.relation_oid).ok_or_else(|| {
            RelayError::Protocol(format!("Insert for relation {} before its Relation message", insert.relation_oid))
        })?;
        let Some(layout) = &cached.layout else { return Ok(()) };
        let txn = self.open.as_ref().ok_or_else(|| RelayError::Protocol("Insert outside a transaction".into()))?;
        let bad = |id: &Bytes, cause: BadEvent| RelayError::BadEvent {
            id: String::from_utf8_lossy(id).into_owned(),
            commit_lsn: txn.commit_lsn,
            cause,
        };
        let row = layout.extract(&cached.relation, &insert.new).map_err(|cause| {
            let id = extract_id_for_error(&cached.relation, &insert, &self.settings.outbox.id);
            bad(&id, cause)
        })?;
        let topic = self.settings.router.route(&row.route_value);
        validate_topic_name(&topic).map_err(|m| bad(&row.id, BadEvent::Topic(m)))?;
        let headers: Vec<(&str, Option<Bytes>)> =
            row.headers.iter().map(|(i, v)| (layout.header_name(*i), v.clone())).collect();
        let record = OutboundRecord {
            topic: &topic,
            key: &row.key,
            payload: &row.payload,
            event_id: &row.id,
            timestamp_ms: row.timestamp_ms,
            headers: &headers,
        };
        let bytes = record.size();
        let tag = Box::new(DeliveryTag {
            ticket: txn.ticket,
            bytes,
            commit_lsn: txn.commit_lsn,
            commit_time_unix_us: txn.commit_time.to_unix_micros(),
        });
        self.watermark.event_sent(txn.ticket, bytes)?;
        if let Err(rejected) = self.publisher.send(&record, tag) {
            self.watermark.failed(txn.ticket, bytes)?;
            if rejected.is_bad_record() {
                return Err(bad(&row.id, BadEvent::Rejected(rejected.error.to_string())));
            }
            return Err(RelayError::DeliveryFailed {
                failure: Box::new(crate::publisher::DeliveryFailure {
                    error: rejected.error,
                    topic: topic.into_owned(),
                    event_id: Some(String::from_utf8_lossy(&row.id).into_owned()),
                }),
                commit_lsn: txn.commit_lsn,
            });
        }
        self.counts.events_sent += 1;
        Ok(())
    }

    /// Applies one delivery report. A failure poisons the watermark and ends the session.
    pub fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        let tag = delivery.tag;
        match delivery.outcome {
            Ok(()) => {
                self.watermark.acked(tag.ticket, tag.bytes)?;
                self.counts.events_acked += 1;
                Ok(())
            }
            Err(failure) => {
                self.watermark.failed(tag.ticket, tag.bytes)?;
                Err(RelayError::DeliveryFailed { failure: Box::new(failure), commit_lsn: tag.commit_lsn })
            }
        }
    }

    /// Like [`on_delivery`](Self::on_delivery) while winding down after an error: failures
    /// are already accounted for, so they only stop the watermark.
    pub fn on_delivery_draining(&mut self, delivery: Delivery) {
        let _ = self.on_delivery(delivery);
    }
}

/// The event id of a row that failed extraction, best effort, for the error message.
fn extract_id_for_error(relation: &Relation, insert: &Insert, id_col: &crate::sql_ident::Ident) -> Bytes {
    relation
        .columns
        .iter()
        .position(|c| c.name == id_col.as_str())
        .and_then(|i| insert.new.columns.get(i))
        .and_then(|v| match v {
            pgoutput::ColumnValue::Text(b) => Some(b.clone()),
            _ => None,
        })
        .unwrap_or_else(|| Bytes::from_static(b"?"))
}
