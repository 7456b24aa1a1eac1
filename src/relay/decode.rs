//! Step 2, decode: a replication frame → a pgoutput message → what it means for the relay.
//!
//! [`Decoder::decode`] is the whole step: frame in, [`Decoded`] out, nothing else touched —
//! no watermark, no sink, no exactly-once. Its own state is what decoding needs: the Relation
//! cache with each outbox table's resolved column mapping, the open transaction (so Commit can be
//! checked against Begin and each outbox event gets its position in its transaction), and the
//! server's clock. Relation messages (re)resolve the mapping; Inserts into an outbox table and
//! transactional logical messages with the outbox prefix become [`Decoded::Event`]s; updates,
//! deletes and other tables are nothing to the relay. The caller (`stream.rs`) feeds the
//! results to the watermark and the publish step.
//!
//! With protocol 2 (`postgres/replication/protocol.rs`) the server also streams large
//! transactions before they commit, in blocks of changes that each carry their (sub)transaction's
//! xid. Inside a block nothing is an event yet: the outbox inserts and messages, and the outbox
//! tables' Relation messages, become [`Decoded::Staged`] for the stage (`stage.rs`); a block's
//! Relation messages do not touch the Relation cache, because they describe the table as the
//! uncommitted transaction sees it. A Stream Commit becomes [`Decoded::StreamCommit`]; the
//! stream then replays the staged messages through [`Decoder::begin_released`],
//! [`Decoder::decode_released`] and [`Decoder::commit_released`], which turn them into the same
//! Begin, events (at the same positions) and Commit a transaction sent after its commit gives.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tracing::{debug, info, warn};

use super::error::{RelayError, StreamViolation};
use super::quarantine::EventRef;
use super::stage::Entry;
use crate::config::Settings;
use crate::outbox::layout::{DebeziumColumns, OutboxLayout};
use crate::outbox::payload::ByteaTypes;
use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::{
    self, Insert, LogicalDecodingMessage, LogicalMessage, PgTimestamp, Relation, StreamCommit, TupleData,
};
use crate::postgres::replication::frames::{decode_server_frame, ServerFrame};

/// A Relation message as last received, with the outbox column mapping when it is the outbox
/// table.
pub(crate) struct CachedRelation {
    pub(crate) relation: Relation,
    /// `Some` only for the outbox table.
    pub(crate) layout: Option<OutboxLayout>,
}

/// What one frame means to the relay.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// The server's keepalive: everything before `wal_end` was sent.
    Keepalive { wal_end: Lsn, reply_requested: bool },
    /// A transaction begins; it commits at `commit_lsn`.
    Begin {
        commit_lsn: Lsn,
        /// The transaction id and commit time, for `[transactions]` metadata.
        xid: u32,
        commit_time_unix_us: i64,
    },
    /// The open transaction committed (checked against its Begin); the server continues at `end_lsn`.
    Commit { end_lsn: Lsn },
    /// An outbox event of the open transaction, at its position there.
    Event { at: EventAt, source: EventSource },
    /// A block of the streamed transaction `xid` starts; the frame was sent `at` this WAL position.
    StreamStart { xid: u32, at: Lsn },
    /// Something the stage keeps for the streamed transaction `xid` (protocol 2).
    Staged { xid: u32, entry: Entry },
    /// The streamed transaction committed: its staged messages are published now.
    StreamCommit(StreamCommit),
    /// The streamed transaction `xid` aborted (`subxid == xid`), or its subtransaction `subxid`.
    StreamAbort { xid: u32, subxid: u32 },
    /// Nothing the relay acts on (a Relation, another table's row, an update, a delete, …).
    Nothing,
}

/// Where an event sits: its transaction and its position among that transaction's events.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventAt {
    pub(crate) event: EventRef,
    pub(crate) commit_time: PgTimestamp,
}

/// An outbox event as decoded, before extraction (`publish.rs` extracts and routes it).
#[derive(Debug)]
pub(crate) enum EventSource {
    /// A row inserted into the outbox table, with the relation it was decoded against.
    Row {
        relation: Arc<CachedRelation>,
        row: TupleData,
    },
    /// A transactional `pg_logical_emit_message` with the outbox prefix.
    Message(LogicalDecodingMessage),
}

impl std::fmt::Debug for CachedRelation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{} (oid {})",
            self.relation.namespace, self.relation.name, self.relation.oid
        )
    }
}

struct OpenTxn {
    commit_lsn: Lsn,
    commit_time: PgTimestamp,
    /// Outbox events seen so far: the next event's position.
    events: u32,
}

/// The decode step's state (see the module docs).
#[derive(Default)]
pub(crate) struct Decoder {
    relations: HashMap<u32, Arc<CachedRelation>>,
    /// Which payload column types are binary (`bytea` and the domains over it), read from the
    /// catalog when the session starts (`session.rs`).
    bytea: ByteaTypes,
    /// `[debezium]`: the format and the outbox table's NOT NULL columns, read with `bytea`.
    debezium: Option<DebeziumColumns>,
    open: Option<OpenTxn>,
    /// The server's send time of the last data frame (µs since the epoch).
    last_send_unix_us: i64,
    /// The WAL position of the last data frame (its `wal_start`).
    last_wal_start: Lsn,
    /// Protocol 2 was asked for: the stream may carry streamed transactions.
    streams: bool,
    /// The streamed transaction whose block of changes is being read (between Stream Start and
    /// Stream Stop).
    block: Option<u32>,
    /// Per streamed transaction, the tables its blocks described, and whether each is an outbox
    /// table (the Relation cache is not touched before the commit: see the module docs).
    streamed_tables: HashMap<u32, HashMap<u32, bool>>,
    /// How far behind the source the reading is, by the server's own clock: the send time of
    /// the last data frame minus the commit time of the last transaction begun, in µs.
    behind_us: i64,
}

impl Decoder {
    /// A decoder for a session whose catalog says which types are binary and, with
    /// `[debezium]`, which outbox columns are NOT NULL.
    pub(crate) fn new(bytea: ByteaTypes, debezium: Option<DebeziumColumns>) -> Decoder {
        Decoder {
            bytea,
            debezium,
            ..Decoder::default()
        }
    }

    /// The session asked for protocol 2 with streaming (`session.rs`).
    pub(crate) fn with_streaming(mut self, streams: bool) -> Decoder {
        self.streams = streams;
        self
    }

    /// A decoder for one streamed transaction read before its commit (`early.rs`): this one's
    /// catalog facts and Relation cache as they stand, and nothing else — what it learns from
    /// the transaction's own Relation messages stays its own, as the stage's do until the
    /// commit. Its events are positioned as the release will position them; their commit LSN
    /// is 0 (not known yet).
    pub(crate) fn fork_for_early(&self, settings: &Settings, xid: u32) -> Result<Decoder, RelayError> {
        let mut fork = Decoder {
            relations: self.relations.clone(),
            bytea: self.bytea.clone(),
            debezium: self.debezium.clone(),
            ..Decoder::default()
        };
        let unknown = StreamCommit {
            xid,
            flags: 0,
            commit_lsn: Lsn(0),
            end_lsn: Lsn(0),
            commit_time: PgTimestamp::default(),
        };
        fork.begin_released(settings, &unknown)?;
        Ok(fork)
    }

    /// Takes over the Relation cache of `fork` (`fork_for_early`), which read a streamed
    /// transaction to its commit while this one decoded nothing else: what it learnt from that
    /// transaction's Relation messages is known from now on, as a release would have made it.
    pub(crate) fn adopt_relations(&mut self, fork: Decoder) {
        self.relations = fork.relations;
    }

    /// How far behind its source the stream reads, by the server's clock (µs): see
    /// `StreamState::catching_up`.
    pub(crate) fn behind_us(&self) -> i64 {
        self.behind_us
    }

    /// The step: one frame in, its meaning out.
    pub(crate) fn decode(&mut self, settings: &Settings, frame: Bytes) -> Result<Decoded, RelayError> {
        match decode_server_frame(frame)? {
            ServerFrame::XLogData {
                wal_start,
                send_time,
                data,
                ..
            } => {
                self.last_send_unix_us = send_time.to_unix_micros();
                self.last_wal_start = wal_start;
                let decode_error = |source| RelayError::Decode { lsn: wal_start, source };
                if let Some(xid) = self.block {
                    let streamed = pgoutput::decode_streamed(data.clone()).map_err(decode_error)?;
                    return self.in_block(settings, xid, streamed, &data);
                }
                let msg = pgoutput::decode(data).map_err(decode_error)?;
                self.on_message(settings, msg)
            }
            ServerFrame::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => Ok(Decoded::Keepalive {
                wal_end,
                reply_requested,
            }),
        }
    }

    fn on_message(&mut self, settings: &Settings, msg: LogicalMessage) -> Result<Decoded, RelayError> {
        Ok(match msg {
            LogicalMessage::StreamStart(_)
            | LogicalMessage::StreamStop
            | LogicalMessage::StreamCommit(_)
            | LogicalMessage::StreamAbort(_) => return self.on_stream_message(msg),
            LogicalMessage::Begin(b) => {
                self.behind_us = self.last_send_unix_us.saturating_sub(b.commit_time.to_unix_micros());
                self.open = Some(OpenTxn {
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                    events: 0,
                });
                Decoded::Begin {
                    commit_lsn: b.final_lsn,
                    xid: b.xid,
                    commit_time_unix_us: b.commit_time.to_unix_micros(),
                }
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
                Decoded::Commit { end_lsn: c.end_lsn }
            }
            LogicalMessage::Relation(r) => {
                self.on_relation(settings, r)?;
                Decoded::Nothing
            }
            LogicalMessage::Insert(i) => self.on_insert(i)?,
            LogicalMessage::Message(m) => self.on_logical_message(settings, m)?,
            // Updates and deletes of the outbox (a polling relayer's `SET dispatched_at`, an
            // insert-then-delete in one transaction, cleanup jobs) are not events.
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Origin(_) => Decoded::Nothing,
        })
    }

    /// A Stream Start, Stop, Commit or Abort outside a block.
    fn on_stream_message(&mut self, msg: LogicalMessage) -> Result<Decoded, RelayError> {
        if !self.streams {
            return Err(StreamViolation::StreamingNotAskedFor.into());
        }
        let name = match &msg {
            LogicalMessage::StreamStart(_) => "Stream Start",
            LogicalMessage::StreamCommit(_) => "Stream Commit",
            LogicalMessage::StreamAbort(_) => "Stream Abort",
            _ => "Stream Stop",
        };
        if self.open.is_some() {
            return Err(StreamViolation::StreamInTransaction(name).into());
        }
        Ok(match msg {
            LogicalMessage::StreamStart(start) => {
                self.block = Some(start.xid);
                Decoded::StreamStart {
                    xid: start.xid,
                    at: self.last_wal_start,
                }
            }
            LogicalMessage::StreamCommit(commit) => {
                self.streamed_tables.remove(&commit.xid);
                Decoded::StreamCommit(commit)
            }
            LogicalMessage::StreamAbort(abort) => {
                if abort.is_toplevel() {
                    self.streamed_tables.remove(&abort.xid);
                }
                Decoded::StreamAbort {
                    xid: abort.xid,
                    subxid: abort.subxid,
                }
            }
            _ => return Err(StreamViolation::StreamStopOutsideBlock.into()),
        })
    }

    /// One message of the block of streamed changes of transaction `xid`; `raw` is the message
    /// as received (its xid is cut out of what is staged).
    fn in_block(
        &mut self,
        settings: &Settings,
        xid: u32,
        streamed: pgoutput::Streamed,
        raw: &Bytes,
    ) -> Result<Decoded, RelayError> {
        // The change's own (sub)transaction; the stream's messages carry none.
        let subxid = streamed.xid.unwrap_or(xid);
        let staged = |entry: fn(u32, Bytes) -> Entry| Decoded::Staged {
            xid,
            entry: entry(subxid, without_xid(raw)),
        };
        Ok(match streamed.message {
            LogicalMessage::StreamStop => {
                self.block = None;
                Decoded::Nothing
            }
            LogicalMessage::Relation(r) => {
                let outbox = settings.outbox.table_of(&r.namespace, &r.name).is_some();
                self.streamed_tables.entry(xid).or_default().insert(r.oid, outbox);
                if outbox {
                    staged(|_, message| Entry::schema(message))
                } else {
                    Decoded::Nothing
                }
            }
            LogicalMessage::Insert(i) => {
                let outbox = match self.streamed_tables.get(&xid).and_then(|t| t.get(&i.relation_oid)) {
                    Some(outbox) => *outbox,
                    None => self
                        .relations
                        .get(&i.relation_oid)
                        .ok_or(StreamViolation::InsertBeforeRelation(i.relation_oid))?
                        .layout
                        .is_some(),
                };
                if outbox {
                    staged(Entry::change)
                } else {
                    Decoded::Nothing
                }
            }
            LogicalMessage::Message(m) => {
                let ours = settings.outbox.message_prefix.as_deref() == Some(m.prefix.as_str());
                if ours && m.transactional {
                    staged(Entry::change)
                } else {
                    // Not an event, or not one to take (a non-transactional message is said at
                    // the outbox's own path: it never comes inside a block).
                    Decoded::Nothing
                }
            }
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Origin(_) => Decoded::Nothing,
            LogicalMessage::Begin(_) => return Err(StreamViolation::InStreamBlock("Begin").into()),
            LogicalMessage::Commit(_) => return Err(StreamViolation::InStreamBlock("Commit").into()),
            LogicalMessage::StreamStart(_) => return Err(StreamViolation::InStreamBlock("Stream Start").into()),
            LogicalMessage::StreamCommit(_) => return Err(StreamViolation::InStreamBlock("Stream Commit").into()),
            LogicalMessage::StreamAbort(_) => return Err(StreamViolation::InStreamBlock("Stream Abort").into()),
        })
    }

    /// A released streamed transaction begins: the Begin a transaction sent after its commit
    /// would have had.
    pub(crate) fn begin_released(&mut self, settings: &Settings, commit: &StreamCommit) -> Result<Decoded, RelayError> {
        self.on_message(
            settings,
            LogicalMessage::Begin(pgoutput::Begin {
                final_lsn: commit.commit_lsn,
                commit_time: commit.commit_time,
                xid: commit.xid,
            }),
        )
    }

    /// One staged message of the released transaction, decoded as if it had come after its
    /// commit.
    pub(crate) fn decode_released(&mut self, settings: &Settings, message: Bytes) -> Result<Decoded, RelayError> {
        let at = self.open.as_ref().map_or(Lsn(0), |t| t.commit_lsn);
        let msg = pgoutput::decode(message).map_err(|source| RelayError::Decode { lsn: at, source })?;
        self.on_message(settings, msg)
    }

    /// The released transaction ends with the Commit it would have had.
    pub(crate) fn commit_released(
        &mut self,
        settings: &Settings,
        commit: &StreamCommit,
    ) -> Result<Decoded, RelayError> {
        self.on_message(
            settings,
            LogicalMessage::Commit(pgoutput::Commit {
                flags: commit.flags,
                commit_lsn: commit.commit_lsn,
                end_lsn: commit.end_lsn,
                commit_time: commit.commit_time,
            }),
        )
    }

    fn on_relation(&mut self, settings: &Settings, relation: Relation) -> Result<(), RelayError> {
        // Any configured outbox table: each relation id resolves its own layout.
        let outbox = &settings.outbox;
        let layout = if let Some(table) = outbox.table_of(&relation.namespace, &relation.name) {
            let layout = OutboxLayout::resolve(outbox, table, &relation, &self.bytea, self.debezium.as_ref())?;
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

    fn on_insert(&mut self, insert: Insert) -> Result<Decoded, RelayError> {
        let relation = self
            .relations
            .get(&insert.relation_oid)
            .cloned()
            .ok_or(StreamViolation::InsertBeforeRelation(insert.relation_oid))?;
        if relation.layout.is_none() {
            return Ok(Decoded::Nothing);
        }
        let at = self.next_event()?;
        Ok(Decoded::Event {
            at,
            source: EventSource::Row {
                relation,
                row: insert.new,
            },
        })
    }

    /// A transactional `pg_logical_emit_message` with the configured prefix is an event; other
    /// messages are not (see `outbox/message.rs` for why non-transactional ones are ignored).
    fn on_logical_message(
        &mut self,
        settings: &Settings,
        message: LogicalDecodingMessage,
    ) -> Result<Decoded, RelayError> {
        let Some(prefix) = settings.outbox.message_prefix.as_deref() else {
            return Ok(Decoded::Nothing);
        };
        if message.prefix != prefix {
            return Ok(Decoded::Nothing);
        }
        if !message.transactional {
            warn!(
                prefix,
                lsn = %message.lsn,
                "ignored a non-transactional pg_logical_emit_message with the outbox prefix: it is not atomic with \
                 the business write (it is decoded even if its transaction rolls back). Emit events with \
                 pg_logical_emit_message(true, …)"
            );
            return Ok(Decoded::Nothing);
        }
        let at = self.next_event()?;
        Ok(Decoded::Event {
            at,
            source: EventSource::Message(message),
        })
    }

    /// The position of the open transaction's next outbox event.
    fn next_event(&mut self) -> Result<EventAt, RelayError> {
        let txn = self.open.as_mut().ok_or(StreamViolation::EventOutsideTransaction)?;
        let seq = txn.events;
        txn.events += 1;
        Ok(EventAt {
            event: EventRef {
                commit_lsn: txn.commit_lsn,
                seq,
            },
            commit_time: txn.commit_time,
        })
    }
}

/// A message of a block of streamed changes as it would have come after its commit: its tag,
/// then everything after the xid.
fn without_xid(raw: &Bytes) -> Bytes {
    let mut out = Vec::with_capacity(raw.len().saturating_sub(4));
    out.extend_from_slice(&raw[..1.min(raw.len())]);
    out.extend_from_slice(raw.get(5..).unwrap_or_default());
    Bytes::from(out)
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
    /// The names of `of`'s columns that `other` does not have.
    fn missing<'a>(of: &'a Relation, other: &Relation) -> Vec<&'a str> {
        of.columns
            .iter()
            .filter(|c| other.columns.iter().all(|o| o.name != c.name))
            .map(|c| c.name.as_str())
            .collect()
    }
    let mut parts = Vec::new();
    let added = missing(new, old);
    let removed = missing(old, new);
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
    use crate::relay::stream::test_support::stream;
    use crate::relay::stream::StreamState;
    use crate::relay::test_frames::{begin, commit, insert, relation, xlog, COMMITTED, SECOND_US};

    /// A session state over an in-memory sink (no event in these frames).
    fn with_state(test: impl FnOnce(&mut StreamState<'_>)) {
        let settings = settings("");
        let mut suspects = Suspects::default();
        let (mut state, handle, _completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
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

    /// The step alone, no sink and no watermark: frames in, meanings out.
    #[test]
    fn the_step_turns_outbox_rows_into_positioned_events_and_nothing_else() {
        let settings = settings("");
        let mut decoder = Decoder::default();
        let mut decode = |frame: &[u8]| decoder.decode(&settings, xlog(COMMITTED, frame)).unwrap();
        let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
        let row = [Some("1"), Some("a"), Some("Created"), Some("{}"), None, None];
        assert!(matches!(
            decode(&begin(0x500)),
            Decoded::Begin {
                commit_lsn: Lsn(0x500),
                ..
            }
        ));
        assert!(matches!(
            decode(&relation(7, "public", "events_outbox", &columns)),
            Decoded::Nothing
        ));
        assert!(matches!(
            decode(&relation(8, "public", "orders", &columns)),
            Decoded::Nothing
        ));
        // Another table's row is nothing to the relay; the outbox's rows are numbered in order.
        assert!(matches!(decode(&insert(8, &row)), Decoded::Nothing));
        for seq in 0..2 {
            match decode(&insert(7, &row)) {
                Decoded::Event {
                    at,
                    source: EventSource::Row { relation, .. },
                } => {
                    assert_eq!(
                        at.event,
                        EventRef {
                            commit_lsn: Lsn(0x500),
                            seq
                        }
                    );
                    assert_eq!(relation.relation.name, "events_outbox");
                }
                other => panic!("expected an event, got {other:?}"),
            }
        }
        assert!(matches!(
            decode(&commit(0x500, 0x510)),
            Decoded::Commit { end_lsn: Lsn(0x510) }
        ));
        // An event outside a transaction is a protocol violation, not a guess.
        let err = decoder
            .decode(&settings, xlog(COMMITTED, &insert(7, &row)))
            .unwrap_err();
        assert!(
            matches!(err, RelayError::Stream(StreamViolation::EventOutsideTransaction)),
            "{err}"
        );
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
