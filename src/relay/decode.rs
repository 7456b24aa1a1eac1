//! Step 2, decode: a replication frame → a pgoutput message → an outbox event.
//!
//! Transactions open a watermark ticket at Begin and close it at Commit (which must carry the
//! LSN Begin announced); Relation messages (re)resolve the outbox column mapping; Inserts into
//! the outbox table and logical messages with the outbox prefix become events for the publish
//! step. Keepalives move the received position and, when nothing is in flight, the watermark.

use std::sync::Arc;

use bytes::Bytes;
use tracing::{debug, info};

use super::error::{RelayError, StreamViolation};
use super::stream::{CachedRelation, FrameAction, OpenTxn, StreamState};
use crate::outbox::bad_event::RawEvent;
use crate::outbox::layout::OutboxLayout;
use crate::postgres::pgoutput::{self, Insert, LogicalMessage, Relation};
use crate::postgres::replication::frames::{decode_server_frame, ServerFrame};

impl StreamState<'_> {
    pub(crate) fn on_frame(&mut self, frame: Bytes) -> Result<FrameAction, RelayError> {
        match decode_server_frame(frame)? {
            ServerFrame::XLogData {
                wal_start,
                send_time,
                data,
                ..
            } => {
                self.last_send_unix_us = send_time.to_unix_micros();
                let msg = pgoutput::decode(data).map_err(|source| RelayError::Decode { lsn: wal_start, source })?;
                if let Some(resume) = &self.resume {
                    resume.check_alive()?;
                }
                self.on_message(msg)?;
                if self.resume.as_ref().is_some_and(|r| r.is_waiting()) {
                    return Ok(FrameAction::Blocked);
                }
                Ok(FrameAction::Nothing)
            }
            ServerFrame::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                self.received = self.received.max(wal_end);
                self.watermark.keepalive(wal_end);
                if let Some(resume) = &mut self.resume {
                    resume.reached(wal_end);
                }
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
                if let Some(resume) = &mut self.resume {
                    resume.reached(b.final_lsn);
                }
                let ticket = self.watermark.begin()?;
                self.behind_us = self.last_send_unix_us.saturating_sub(b.commit_time.to_unix_micros());
                self.open = Some(OpenTxn {
                    ticket,
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                    events: 0,
                });
            }
            LogicalMessage::Commit(c) => {
                let txn = self.open.take().ok_or(StreamViolation::CommitWithoutBegin)?;
                // The commit must be the one Begin announced; anything else means frames were
                // lost or reordered, and confirming this transaction could skip another.
                if c.commit_lsn != txn.commit_lsn {
                    return Err(StreamViolation::CommitMismatch {
                        commit: c.commit_lsn,
                        begin: txn.commit_lsn,
                    }
                    .into());
                }
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
            let layout = OutboxLayout::resolve(&self.settings.outbox, &relation, &self.bytea, self.debezium.as_ref())?;
            // PostgreSQL re-sends a table's Relation after every cache invalidation: only a
            // real change is news.
            match self
                .relations
                .get(&relation.oid)
                .map(|known| shape_change(&known.relation, &relation))
            {
                Some(Some(change)) => {
                    info!(table = %table, change = %change, "outbox table changed shape; column mapping refreshed")
                }
                Some(None) => debug!(table = %table, "outbox table's Relation re-sent unchanged"),
                None => {}
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
        let cached = self
            .relations
            .get(&insert.relation_oid)
            .cloned()
            .ok_or(StreamViolation::InsertBeforeRelation(insert.relation_oid))?;
        let Some(layout) = &cached.layout else { return Ok(()) };
        let settings = self.settings;
        let table = || settings.outbox.table.to_string();
        let txn = self.next_event()?;
        // Borrows from the cached layout and the decoded row: no copies on the way to Kafka.
        let event = match layout.extract(&cached.relation, &insert.new) {
            Ok(event) => event,
            Err(cause) => {
                let id = layout.id_for_error(&insert.new);
                let raw = RawEvent::row(&table(), &cached.relation, &insert.new, None);
                return self.bad_event(&txn, id, cause, &raw, true);
            }
        };
        self.publish(&txn, &event, || {
            let key = Some(Bytes::copy_from_slice(&event.key));
            RawEvent::row(&table(), &cached.relation, &insert.new, key)
        })
    }
}

/// What differs between two Relation messages of one table, for people (`None`: nothing that
/// matters to the mapping — the columns, their types and order).
fn shape_change(old: &Relation, new: &Relation) -> Option<String> {
    let same = |a: &pgoutput::RelationColumn, b: &pgoutput::RelationColumn| {
        a.name == b.name && a.type_oid == b.type_oid && a.type_modifier == b.type_modifier
    };
    if old.columns.len() == new.columns.len() && old.columns.iter().zip(&new.columns).all(|(a, b)| same(a, b)) {
        return None;
    }
    let find = |cols: &[pgoutput::RelationColumn], name: &str| cols.iter().position(|c| c.name == name);
    let mut parts = Vec::new();
    let added: Vec<&str> = new
        .columns
        .iter()
        .filter(|c| find(&old.columns, &c.name).is_none())
        .map(|c| c.name.as_str())
        .collect();
    let removed: Vec<&str> = old
        .columns
        .iter()
        .filter(|c| find(&new.columns, &c.name).is_none())
        .map(|c| c.name.as_str())
        .collect();
    let retyped: Vec<String> = new
        .columns
        .iter()
        .filter_map(|c| {
            let before = &old.columns[find(&old.columns, &c.name)?];
            (before.type_oid != c.type_oid || before.type_modifier != c.type_modifier).then(|| {
                format!(
                    "{} (type {}/{} → {}/{})",
                    c.name, before.type_oid, before.type_modifier, c.type_oid, c.type_modifier
                )
            })
        })
        .collect();
    if !added.is_empty() {
        parts.push(format!("added {}", added.join(", ")));
    }
    if !removed.is_empty() {
        parts.push(format!("removed {}", removed.join(", ")));
    }
    if !retyped.is_empty() {
        parts.push(format!("retyped {}", retyped.join(", ")));
    }
    if parts.is_empty() {
        parts.push("columns reordered".into());
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;
    use crate::postgres::lsn::Lsn;
    use crate::relay::quarantine::Suspects;
    use crate::relay::test_frames::{begin, commit, xlog, COMMITTED, SECOND_US};
    use crate::sink::memory::memory;

    /// A session state over an in-memory sink (no event in these frames).
    fn with_state(test: impl FnOnce(&mut StreamState<'_>)) {
        let settings = settings("");
        let (sink, handle, _completions) = memory();
        let publisher = Box::new(sink);
        let mut suspects = Suspects::default();
        let mut state = StreamState::new(&settings, publisher, Lsn(0x10), &mut suspects);
        test(&mut state);
        assert!(handle.stored().is_empty());
    }

    #[test]
    fn a_commit_must_be_the_one_its_begin_announced() {
        with_state(|state| {
            state.on_frame(xlog(COMMITTED, &begin(0x500))).unwrap();
            let err = state.on_frame(xlog(COMMITTED, &commit(0x600, 0x610))).unwrap_err();
            assert!(
                matches!(err, RelayError::Stream(StreamViolation::CommitMismatch { .. })),
                "{err}"
            );
            assert!(
                err.to_string().contains("0/600") && err.to_string().contains("0/500"),
                "{err}"
            );
            // A protocol violation stops the relay for an operator rather than looping.
            assert!(!err.is_transient(), "{err}");
        });
        with_state(|state| {
            state.on_frame(xlog(COMMITTED, &begin(0x500))).unwrap();
            state.on_frame(xlog(COMMITTED, &commit(0x500, 0x510))).unwrap();
            // The empty transaction is confirmed at its end.
            assert_eq!(state.confirmed(), Lsn(0x510));
        });
    }

    #[test]
    fn backlog_is_judged_by_the_servers_clock_alone() {
        with_state(|state| {
            // Sent 10 ms after its commit: live, whatever this host's clock says.
            state.on_frame(xlog(COMMITTED + 10_000, &begin(0x500))).unwrap();
            assert!(!state.catching_up(std::time::Duration::from_secs(1)));
            state.on_frame(xlog(COMMITTED + 10_000, &commit(0x500, 0x510))).unwrap();
            // Sent a minute after its commit: the stream is reading a backlog.
            state.on_frame(xlog(COMMITTED + 60 * SECOND_US, &begin(0x600))).unwrap();
            assert!(state.catching_up(std::time::Duration::from_secs(1)));
        });
    }

    #[test]
    fn only_a_real_change_of_the_columns_is_a_shape_change() {
        let cols = |c: &[&str]| Relation::text_columns("public", "events_outbox", c);
        let known = cols(&["id", "type", "payload"]);
        assert_eq!(shape_change(&known, &cols(&["id", "type", "payload"])), None);
        assert_eq!(
            shape_change(&known, &cols(&["id", "type", "payload", "trace"])).as_deref(),
            Some("added trace")
        );
        assert_eq!(
            shape_change(&known, &cols(&["id", "payload"])).as_deref(),
            Some("removed type")
        );
        let mut retyped = cols(&["id", "type", "payload"]);
        retyped.columns[2].type_oid = 3802;
        assert_eq!(
            shape_change(&known, &retyped).as_deref(),
            Some("retyped payload (type 25/-1 → 3802/-1)")
        );
        assert_eq!(
            shape_change(&known, &cols(&["type", "id", "payload"])).as_deref(),
            Some("columns reordered")
        );
    }
}
