//! The per-session state machine between decoded WAL messages, Kafka and the watermark.
//!
//! Pure with respect to I/O: it receives decoded frames and delivery reports and tells the
//! event loop (in `session.rs`) what to send. Keeping the loop's arms this short is what makes
//! their priorities easy to read.

mod progress;
mod publish;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tracing::{debug, info};

use super::error::RelayError;
use super::quarantine::{Held, Suspects};
use crate::bad_event::RawEvent;
use crate::config::Settings;
use crate::lsn::Lsn;
use crate::outbox_event::OutboxLayout;
use crate::pgoutput::{self, Insert, LogicalMessage, PgTimestamp, Relation};
use crate::publisher::{Delivery, Publisher};
use crate::replication::frames::{decode_server_frame, ServerFrame};
use crate::watermark::{AckWatermark, TxnTicket};
use publish::EventParts;

struct CachedRelation {
    relation: Relation,
    /// `Some` only for the outbox table.
    layout: Option<OutboxLayout>,
}

struct OpenTxn {
    ticket: TxnTicket,
    commit_lsn: Lsn,
    commit_time: PgTimestamp,
    /// Outbox events (rows and messages) seen so far: the next event's position.
    events: u32,
}

/// Counters for logs (and, later, metrics).
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionCounts {
    pub transactions: u64,
    pub events_sent: u64,
    pub events_acked: u64,
    /// Events handled by `relay.on_bad_event`.
    pub bad_events: u64,
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
    relations: HashMap<u32, Arc<CachedRelation>>,
    open: Option<OpenTxn>,
    /// Events Kafka refused in earlier sessions (kept by the supervisor).
    suspects: &'s mut Suspects,
    /// A suspect being sent alone; reading pauses while it is held.
    held: Option<Held>,
    /// Winding down: apply deliveries, send nothing new.
    draining: bool,
    received: Lsn,
    reported: Lsn,
    /// Commit time (µs since the epoch) of the last transaction that began: how far behind the
    /// source the reading is (see [`StreamState::catching_up`]).
    last_commit_unix_us: i64,
    pub counts: SessionCounts,
    /// Per-topic counters and the commit-to-ack histogram (see `progress.rs`).
    metrics: crate::metrics::SessionMetrics,
    lag: super::lag::CommitLag,
}

impl<'s> StreamState<'s> {
    pub fn new(settings: &'s Settings, publisher: Publisher, start: Lsn, suspects: &'s mut Suspects) -> Self {
        suspects.forget_before(start);
        StreamState {
            settings,
            publisher,
            watermark: AckWatermark::new(start),
            relations: HashMap::new(),
            open: None,
            suspects,
            held: None,
            draining: false,
            received: start,
            reported: start,
            last_commit_unix_us: i64::MAX,
            counts: SessionCounts::default(),
            metrics: crate::metrics::SessionMetrics::default(),
            lag: super::lag::CommitLag::default(),
        }
    }

    /// Backpressure: stop reading WAL while this many events or bytes are unacknowledged, while
    /// as many events of committed transactions await confirmation (what a crash would replay;
    /// see `AckWatermark::committed_unconfirmed_events`), and while a suspect is held
    /// (`quarantine.rs`).
    pub fn is_full(&self) -> bool {
        let max = self.settings.relay.max_in_flight;
        self.watermark.in_flight_events() >= max
            || self.watermark.in_flight_bytes() >= self.settings.relay.max_in_flight_bytes
            || self.watermark.committed_unconfirmed_events() >= max
            || self.held.is_some()
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

    /// Whether the stream is reading a backlog: the last transaction begun was committed more
    /// than `age` before `now_unix_us`. Live traffic is never this old.
    pub fn catching_up(&self, now_unix_us: i64, age: std::time::Duration) -> bool {
        let age_us = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
        now_unix_us.saturating_sub(self.last_commit_unix_us) > age_us
    }

    /// Whether the watermark moved past the last reported position (a status update would
    /// release WAL and shrink what a crash replays).
    pub fn has_unreported_progress(&self) -> bool {
        self.watermark.confirmed() > self.reported
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
            ServerFrame::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                self.received = self.received.max(wal_end);
                self.watermark.keepalive(wal_end);
                Ok(if reply_requested {
                    FrameAction::ReplyNow
                } else {
                    FrameAction::Nothing
                })
            }
        }
    }

    fn on_message(&mut self, msg: LogicalMessage) -> Result<(), RelayError> {
        match msg {
            LogicalMessage::Begin(b) => {
                let ticket = self.watermark.begin()?;
                self.last_commit_unix_us = b.commit_time.to_unix_micros();
                self.open = Some(OpenTxn {
                    ticket,
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                    events: 0,
                });
            }
            LogicalMessage::Commit(c) => {
                let txn = self
                    .open
                    .take()
                    .ok_or_else(|| RelayError::Protocol("Commit without Begin".into()))?;
                self.watermark.commit(txn.ticket, c.end_lsn)?;
                self.received = self.received.max(c.end_lsn);
                self.counts.transactions += 1;
            }
            LogicalMessage::Relation(r) => self.on_relation(r)?,
            LogicalMessage::Insert(i) => self.on_insert(i)?,
            LogicalMessage::Message(m) => self.on_logical_message(m)?,
            // Updates and deletes of the outbox (a polling relayer's `SET dispatched_at`, an
            // insert-then-delete in one transaction, cleanup jobs) are not events.
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Origin(_) => {}
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
        self.relations
            .insert(relation.oid, Arc::new(CachedRelation { relation, layout }));
        Ok(())
    }

    fn on_insert(&mut self, insert: Insert) -> Result<(), RelayError> {
        let cached = self.relations.get(&insert.relation_oid).cloned().ok_or_else(|| {
            RelayError::Protocol(format!(
                "Insert for relation {} before its Relation message",
                insert.relation_oid
            ))
        })?;
        let Some(layout) = &cached.layout else { return Ok(()) };
        let settings = self.settings;
        let table = || settings.outbox.table.to_string();
        let txn = self.next_event()?;
        let row = match layout.extract(&cached.relation, &insert.new) {
            Ok(row) => row,
            Err(cause) => {
                let id = extract_id_for_error(&cached.relation, &insert, &settings.outbox.id);
                let raw = RawEvent::row(&table(), &cached.relation, &insert.new, None);
                return self.bad_event(&txn, &id, cause, &raw);
            }
        };
        let headers: Vec<(&str, Option<Bytes>)> = row
            .headers
            .iter()
            .map(|(i, v)| (layout.header_name(*i), v.clone()))
            .collect();
        let event = EventParts {
            route_value: &row.route_value,
            key: &row.key,
            payload: &row.payload,
            id: &row.id,
            timestamp_ms: row.timestamp_ms,
            headers: &headers,
        };
        self.publish(&txn, &event, || {
            RawEvent::row(&table(), &cached.relation, &insert.new, Some(row.key.clone()))
        })
    }

    /// Applies one delivery report. A failure poisons the watermark and ends the session,
    /// unless it is a suspect's verdict that `relay.on_bad_event` settles (see `publish.rs`).
    pub fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        let tag = delivery.tag;
        self.count_delivery(&tag, delivery.outcome.is_ok());
        match delivery.outcome {
            Ok(()) => {
                self.watermark.acked(tag.ticket, tag.bytes)?;
                self.counts.events_acked += 1;
                self.held_accepted(&tag);
            }
            Err(failure) => self.on_failed_delivery(&tag, failure)?,
        }
        self.release_held()
    }

    /// Like [`on_delivery`](Self::on_delivery) while winding down after an error: failures
    /// are already accounted for, so they only stop the watermark, and nothing new is sent.
    pub fn on_delivery_draining(&mut self, delivery: Delivery) {
        self.draining = true;
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
