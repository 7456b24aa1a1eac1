//! Step 3, publish: one outbox event — a row or a logical decoding message — handed to the sink
//! as a record, and what happens when it cannot be published. [`Publish`] owns the sink and
//! what sending needs (the name rule and size limit, the suspects of earlier sessions, the
//! `[transactions]` metadata, the tracer); each call gets [`Accounts`]: the session's delivery
//! guarantee, its durability contract and its progress, where the step accounts for what it
//! sends.
//!
//! * Routing or extraction fails, or the sink refuses the record on sight for what it is: the
//!   event is bad; `relay.on_bad_event` applies at once.
//! * The sink refuses it in a delivery report for what it is: it may have been refused with
//!   its whole batch, so it becomes a suspect and the session replays (`quarantine.rs`); the
//!   replay sends it alone and the policy applies only if it is refused again — where the
//!   refusal dooms the sink's unit (sink transactions), on the replay after that.
//! * Any other failure (transport, timeout, a broken producer) poisons the transaction and the
//!   session replays, whatever the policy.
//!
//! Accounting: an event counts as in flight only once the sink took it. A skipped event never
//! counts; a dead letter counts in its transaction like the event it replaces, so the
//! transaction is confirmed only once the dead letter is stored.

use metrics::counter;
use tracing::{info, warn};

use bytes::Bytes;

use super::decode::EventSource;
use super::durability::{Durability, TxnTicket};
use super::error::{InternalError, RelayError};
use super::guarantee::{Bound, Guarantee, RelaySink, Verdict};
use super::progress::Progress;
use crate::config::relay::BadEventPolicy;
use crate::config::Settings;
use crate::ops::metrics::BAD_EVENTS;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::bad_event::RawEvent;
use crate::outbox::event::OutboxEvent;
use crate::outbox::message::best_effort_id;
use crate::postgres::lsn::Lsn;
use crate::relay::quarantine::{EventRef, Held, HeldState, Standing, Suspects, TxnEvent};
use crate::relay::transaction_meta::{Marker, OpenTxn, TxnMeta};
use crate::sink::{Handover, SinkError, SinkFailure, SinkLimits, SinkRecord};
use std::borrow::Cow;

use crate::ops::tracing_export::{ProducerSpan, Tracer};

/// Rides along with each record and comes back in its delivery report.
#[derive(Debug)]
pub(crate) struct DeliveryTag {
    pub(crate) ticket: TxnTicket,
    pub(crate) bytes: usize,
    /// Commit LSN of the event's transaction, for error messages.
    pub(crate) commit_lsn: Lsn,
    /// Commit time (µs since the Unix epoch), for latency measurements.
    pub(crate) commit_time_unix_us: i64,
    /// Position among its transaction's outbox events (with `commit_lsn`, the event's identity
    /// across replays; see `relay::quarantine`).
    pub(crate) event_seq: u32,
    /// What the record is (an event's, a dead letter, or a seal).
    pub(crate) kind: TagKind,
    /// The event's topic in the session's per-topic metrics (`crate::ops::metrics::SessionMetrics`).
    pub(crate) topic: crate::ops::metrics::TopicId,
    /// `[tracing]`: the event's PRODUCER span, ended when this tag comes back; `None` (no
    /// allocation) without tracing, for an unsampled root, and for dead letters.
    pub(crate) span: Option<Box<ProducerSpan>>,
}

/// What a [`DeliveryTag`] comes back for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TagKind {
    /// An event's record (or a `[transactions]` marker).
    Record,
    /// A dead letter (`[relay] on_bad_event = "dead-letter"`): its failure is a plain delivery
    /// failure, never another bad event.
    DeadLetter,
    /// A seal (`guarantee/transactions.rs`), not a record: its completion says whether the sink
    /// committed the unit (`ticket` is [`TxnTicket::SEAL`]).
    Seal,
    /// A record of a streamed transaction produced before its commit (`early.rs`): its report
    /// goes to the early step, never to the watermark (`ticket` is [`TxnTicket::SEAL`]).
    Early,
}

impl DeliveryTag {
    /// The tag of a seal storing `checkpoint`.
    pub(crate) fn seal(checkpoint: u64) -> Box<DeliveryTag> {
        Box::new(DeliveryTag {
            ticket: TxnTicket::SEAL,
            bytes: 0,
            commit_lsn: Lsn(checkpoint),
            commit_time_unix_us: 0,
            event_seq: 0,
            kind: TagKind::Seal,
            topic: crate::ops::metrics::TopicId::default(),
            span: None,
        })
    }
}

/// One delivery report.
pub(crate) type Delivery = crate::sink::Completion<DeliveryTag>;

/// What the publish step did with an event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Published {
    /// Handed to the sink, skipped or settled by `relay.on_bad_event`.
    Done,
    /// The delivery guarantee needs a read-back first: publish it again afterwards.
    Wait,
    /// The sink's queue is full (backpressure): nothing of the event was sent; publish it
    /// again once room frees, before anything else.
    Full,
}

/// What [`Publish::early_event`] did with an event of a streamed transaction not committed yet.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EarlySent {
    /// Handed to the sink, weighing `bytes`.
    Sent { bytes: usize },
    /// Not for the sink (`[filter]`), as it will not be at the commit either.
    Filtered,
    /// The sink's queue is full: nothing was sent; hand it over again once room frees.
    Full,
    /// It cannot go out before the commit (a bad event, a record the sink refuses on sight):
    /// the transaction falls back to the stage, whose release applies the usual rules.
    Declined(&'static str),
}

/// What the sink did with one record handed to it.
enum Handed {
    Taken,
    /// Its queue had no room: nothing was queued or counted.
    Full,
    /// Not taken, for this reason (the span ended with it).
    Failed(SinkFailure),
}

/// Where the step is, as far as sending goes.
enum Phase {
    /// Sending the events it is given.
    Streaming,
    /// A suspect (`quarantine.rs`) is sent alone: nothing else goes out until the sink's
    /// verdict on it.
    Holding(Held),
    /// Winding down: deliveries are applied, nothing new is sent. A suspect held when the
    /// session ended stays, so its acknowledgement still clears it.
    Draining(Option<Held>),
}

impl Phase {
    fn held(&self) -> Option<&Held> {
        match self {
            Phase::Streaming => None,
            Phase::Holding(held) => Some(held),
            Phase::Draining(held) => held.as_ref(),
        }
    }

    /// Takes the held suspect, leaving the phase otherwise as it was.
    fn take_held(&mut self) -> Option<Held> {
        match std::mem::replace(self, Phase::Streaming) {
            Phase::Streaming => None,
            Phase::Holding(held) => Some(held),
            Phase::Draining(held) => {
                *self = Phase::Draining(None);
                held
            }
        }
    }
}

/// Where the publish step accounts for what it sends.
pub(super) struct Accounts<'a> {
    /// Admits, stamps and counts each record (`guarantee/`).
    pub(super) guarantee: &'a mut dyn Guarantee,
    /// Records in flight and settled (`durability/`).
    pub(super) durability: &'a mut Durability,
    /// Metrics per record (`progress.rs`).
    pub(super) progress: &'a mut Progress,
}

/// The publish step of one session.
pub(super) struct Publish<'s> {
    settings: &'s Settings,
    sink: RelaySink,
    /// The sink's name rule and largest message.
    limits: SinkLimits,
    /// Events the sink refused in earlier sessions (kept by the supervisor).
    suspects: &'s mut Suspects,
    phase: Phase,
    /// `[transactions]`: the open transaction's metadata (`transaction_meta.rs`).
    txn_meta: TxnMeta,
    /// `[tracing]`: set when spans are exported.
    tracer: Option<Tracer>,
    /// The sink had no room for the last record ([`Publish::waiting_for_room`]).
    full: bool,
}

impl<'s> Publish<'s> {
    /// The step over `sink`, for a stream starting at `start` (suspects confirmed before it are
    /// forgotten).
    pub(super) fn new(
        settings: &'s Settings,
        sink: RelaySink,
        start: Lsn,
        suspects: &'s mut Suspects,
        tracer: Option<Tracer>,
    ) -> Publish<'s> {
        suspects.forget_before(start);
        Publish {
            settings,
            sink,
            limits: crate::sink::limits(settings),
            suspects,
            phase: Phase::Streaming,
            txn_meta: TxnMeta::default(),
            tracer,
            full: false,
        }
    }

    /// A suspect is held: nothing else may go out until the sink's verdict on it.
    pub(super) fn holding(&self) -> bool {
        matches!(self.phase, Phase::Holding(_))
    }

    /// Sending as usual (no suspect held, not winding down).
    pub(super) fn streaming(&self) -> bool {
        matches!(self.phase, Phase::Streaming)
    }

    pub(super) fn draining(&self) -> bool {
        matches!(self.phase, Phase::Draining(_))
    }

    /// Winds down: nothing new is sent from now on.
    pub(super) fn drain(&mut self) {
        if !self.draining() {
            self.phase = Phase::Draining(self.phase.take_held());
        }
    }

    /// The sink's complaint, while it acknowledges nothing (`Sink::complaint`).
    pub(super) fn sink_complaint(&self) -> Option<String> {
        self.sink.complaint()
    }

    /// The sink's word that it has reached no broker yet (`Sink::unreachable`).
    pub(super) fn sink_unreachable(&self) -> Option<String> {
        self.sink.unreachable()
    }

    /// The sink's word that waiting cannot help (`Sink::verdict`).
    pub(super) fn sink_verdict(&self) -> Option<SinkError> {
        self.sink.verdict()
    }

    /// The session ends: the sink, for its abandon.
    pub(super) fn into_sink(self) -> RelaySink {
        self.sink
    }

    /// `[transactions]`: a transaction began.
    pub(super) fn begin_transaction(&mut self, xid: u32, commit_lsn: Lsn, commit_time_unix_us: i64) {
        self.txn_meta.begin(xid, commit_lsn, commit_time_unix_us);
    }

    /// `[transactions] headers`: how many events the open transaction has (known at its Commit).
    pub(super) fn set_transaction_count(&mut self, count: u32) {
        self.txn_meta.set_count(count);
    }

    /// `[transactions] headers`: the open transaction's commit LSN, for the log.
    pub(super) fn open_transaction_lsn(&self) -> Lsn {
        self.txn_meta.open().map(|t| t.commit_lsn()).unwrap_or_default()
    }

    /// `[transactions]`: the END marker of the transaction `ticket` stands for, a record of it
    /// sent before the watermark learns it is complete.
    /// `Published::Full`: the sink had no room for the marker; the Commit is handed on again.
    pub(super) fn end_transaction(&mut self, ticket: TxnTicket, a: &mut Accounts<'_>) -> Result<Published, RelayError> {
        if let Some(ended) = self.txn_meta.end() {
            if self.send_marker(ticket, &ended, Marker::End, a)? == Published::Full {
                self.txn_meta.end_marker_not_sent(ended);
                return Ok(Published::Full);
            }
        }
        Ok(Published::Done)
    }

    /// The step: one decoded event (`decode.rs`) extracted, routed and handed to the sink — or
    /// settled by `relay.on_bad_event` — unless the delivery guarantee makes it wait.
    pub(super) fn event(
        &mut self,
        txn: &TxnEvent,
        source: &EventSource,
        a: &mut Accounts<'_>,
    ) -> Result<Published, RelayError> {
        match source {
            EventSource::Row { relation, row } => {
                let layout = relation.layout.as_ref().ok_or(InternalError::RowWithoutLayout)?;
                let table = || layout.table().to_string();
                // Borrows from the cached layout and the decoded row: no copies on the way to the sink.
                match layout.extract(&relation.relation, row) {
                    Ok(event) => {
                        let event = event.with_commit_time(txn.commit_time_unix_us);
                        // Rendered (and the key copied) only for a dead letter or a suspect.
                        let raw = || {
                            let key = Some(Bytes::copy_from_slice(&event.key));
                            RawEvent::row(&table(), &relation.relation, row, key)
                        };
                        self.publish(txn, &event, raw, a)
                    }
                    Err(cause) => {
                        let id = layout.id_for_error(row);
                        let raw = RawEvent::row(&table(), &relation.relation, row, None);
                        self.bad_event(txn, id, cause, &raw, true, a)
                    }
                }
            }
            EventSource::Message(message) => {
                let prefix = self.settings.outbox.message_prefix.as_deref().unwrap_or_default();
                let raw = || RawEvent::message(prefix, message.content.clone());
                match OutboxEvent::from_message(&message.content) {
                    Ok(event) => self.publish(txn, &event.with_commit_time(txn.commit_time_unix_us), raw, a),
                    Err(cause) => {
                        let id = best_effort_id(&message.content);
                        self.bad_event(txn, id.as_bytes(), cause, &raw(), true, a)
                    }
                }
            }
        }
    }

    /// Whether an event may be produced before its transaction commits (`early.rs`): only the
    /// plain path — no suspect of an earlier session (known by a commit LSN not known yet), no
    /// `[transactions]` metadata or `[tracing]` span (both need the commit), nothing held.
    pub(super) fn can_produce_early(&self) -> bool {
        self.streaming()
            && !self.full
            && self.suspects.is_empty()
            && self.settings.transactions.is_none()
            && self.tracer.is_none()
    }

    /// An event of a streamed transaction not committed yet (`early.rs`), the `seq`-th of its
    /// transaction, extracted, routed and handed to the sink into its open unit. Anything but
    /// the plain path declines: the commit publishes the transaction from the stage instead.
    /// The record carries no position headers: its commit LSN is not known yet. Its tag
    /// carries `generation` (`early.rs`) where a record's carries its commit LSN.
    pub(super) fn early_event(
        &mut self,
        source: &EventSource,
        seq: u32,
        generation: u64,
        a: &mut Accounts<'_>,
    ) -> Result<EarlySent, RelayError> {
        let event = match read_event(source) {
            Some(Ok(event)) => event,
            Some(Err(_)) => return Ok(EarlySent::Declined("a row or message that cannot be read as an event")),
            None => return Err(InternalError::RowWithoutLayout.into()),
        };
        if !event.passes(self.settings) {
            return Ok(EarlySent::Filtered);
        }
        let Ok(record) = event.record(self.settings, &self.limits) else {
            return Ok(EarlySent::Declined("an event that cannot be routed or is too large"));
        };
        let bytes = record.size();
        let topic = a.progress.topic(&record.destination);
        let tag = Box::new(DeliveryTag {
            ticket: TxnTicket::SEAL,
            bytes,
            commit_lsn: Lsn(generation),
            commit_time_unix_us: 0,
            event_seq: seq,
            kind: TagKind::Early,
            topic,
            span: None,
        });
        match self.sink.send(Handover::of(&record), tag) {
            Ok(()) => {
                a.guarantee.early_sent(a.durability);
                a.progress.sent_early(topic);
                a.progress.counts.events_sent += 1;
                Ok(EarlySent::Sent { bytes })
            }
            Err(refusal) if refusal.failure.is_full() => {
                self.full = true;
                Ok(EarlySent::Full)
            }
            Err(_) => Ok(EarlySent::Declined("a record the sink refused on sight")),
        }
    }

    /// `[transactions]`: whether `source` is one of its transaction's events — it passes
    /// `[filter]`, or cannot be read (a bad event keeps its place). Extracted only to apply a
    /// filter.
    pub(super) fn is_transaction_event(&self, source: &EventSource) -> bool {
        if self.settings.filter.is_none() {
            return true;
        }
        read_event(source).is_none_or(|event| event.map_or(true, |event| event.passes(self.settings)))
    }

    /// Routes and sends one event. `raw` renders the event for a dead letter (only when needed).
    fn publish(
        &mut self,
        txn: &TxnEvent,
        event: &OutboxEvent<'_>,
        raw: impl FnOnce() -> RawEvent,
        a: &mut Accounts<'_>,
    ) -> Result<Published, RelayError> {
        let settings = self.settings;
        // `[filter]`: not sent, and not in flight, so its transaction confirms as if it were
        // published (nothing pins WAL behind a filtered event).
        if !event.passes(settings) {
            crate::ops::metrics::count_filtered();
            return Ok(Published::Done);
        }
        // `[transactions]`: numbered before anything can go wrong with it, so that a bad event
        // keeps its place and a replay numbers as the first session did.
        let txn_index = self.txn_meta.number(txn.event.seq, event.table.as_deref());
        let original = event;
        // `[tracing]`: the span exists before the record, whose traceparent names it.
        let (span, traced) = self.start_span(txn, event).unzip();
        let event = traced.as_ref().unwrap_or(event);
        let record = match event.record(settings, &self.limits) {
            Ok(record) => record,
            Err(cause) => return self.bad_event(txn, &event.id, cause, &raw(), true, a),
        };
        // Should the sink refuse the record, its dead letter must not wait either.
        let dead_letters = match &settings.relay.on_bad_event {
            BadEventPolicy::DeadLetter { topic } => Some(topic.as_str()),
            _ => None,
        };
        let bound = Bound {
            destination: &record.destination,
            key: &record.key,
            placement: record.partition,
        };
        match a.guarantee.admit(txn.event, bound, dead_letters, true) {
            Verdict::Send => {}
            Verdict::Skip => return Ok(Published::Done),
            Verdict::Wait => return Ok(Published::Wait),
        }
        // Counted once per event the stream sends (not when it waits, or skips a replay).
        if event.has_invalid_traceparent() {
            crate::ops::metrics::count_invalid_traceparent();
        }
        match self.suspects.standing(txn.event).cloned() {
            Some(Standing::Condemned(refusal)) => {
                // Refused alone in an earlier session, whose sink unit had to abort.
                let cause = BadEvent::refused_by(self.settings.sink.broker_name(), &refusal);
                return self.bad_event(txn, &event.id, cause, &raw(), false, a);
            }
            Some(Standing::Suspect(earlier)) => {
                // Kept as read: its release starts a span of its own.
                self.phase = Phase::Holding(Held {
                    txn: *txn,
                    event: original.clone().into_owned(),
                    raw: raw(),
                    earlier,
                    state: HeldState::Waiting,
                    txn_index,
                });
                self.release_held(a)?;
                return Ok(Published::Done);
            }
            None => {}
        }
        let Some(record) = self.with_transaction_meta(txn, txn_index, record, a)? else {
            return Ok(Published::Full);
        };
        let span = span.map(|s| with_partition(s, record.partition));
        match self.send(txn, &record, TagKind::Record, span, a)? {
            Handed::Taken => Ok(Published::Done),
            Handed::Full => Ok(Published::Full),
            Handed::Failed(failure) if failure.is_refusal() => self.bad_event(
                txn,
                &event.id,
                BadEvent::refused_by(self.settings.sink.broker_name(), &failure.cause),
                &raw(),
                false,
                a,
            ),
            Handed::Failed(failure) => Err(delivery_failed(
                self.settings.sink.broker_name(),
                failure,
                txn.commit_lsn(),
            )),
        }
    }

    /// `[tracing]`: the PRODUCER span of `event`, started at its commit, and the event as it is
    /// then sent ([`OutboxEvent::traced`]). `None`: tracing is off, or the event goes as read.
    fn start_span<'e>(&self, txn: &TxnEvent, event: &OutboxEvent<'e>) -> Option<(Box<ProducerSpan>, OutboxEvent<'e>)> {
        let tracer = self.tracer.as_ref()?;
        event.traced(tracer, self.settings, &self.limits, txn.commit_time_unix_us)
    }

    /// `[tracing]`: ends the span a tag carried, with the failure's cause if it failed.
    fn end_span(&self, tag: &mut DeliveryTag, failure: Option<&SinkFailure>) {
        if let (Some(span), Some(tracer)) = (tag.span.take(), &self.tracer) {
            tracer.end(*span, failure.map(|f| f.cause.clone()));
        }
    }

    /// `[transactions]`: the BEGIN marker before a transaction's first sent event, and the
    /// event's transaction headers (`transaction_meta.rs`). `None`: the sink had no room for
    /// the marker (the event is published again, and the marker with it).
    fn with_transaction_meta<'r>(
        &mut self,
        txn: &TxnEvent,
        txn_index: Option<u32>,
        mut record: SinkRecord<'r>,
        a: &mut Accounts<'_>,
    ) -> Result<Option<SinkRecord<'r>>, RelayError> {
        let Some(meta) = &self.settings.transactions else {
            return Ok(Some(record));
        };
        let Some(index) = txn_index else {
            return Ok(Some(record));
        };
        if meta.topic.is_some() {
            if let Some(open) = self.txn_meta.begin_marker_due().cloned() {
                if self.send_marker(txn.ticket, &open, Marker::Begin, a)? == Published::Full {
                    self.txn_meta.begin_marker_not_sent();
                    return Ok(None);
                }
            }
        }
        if meta.headers {
            if let Some(open) = self.txn_meta.open() {
                let mut headers = record.headers.into_owned();
                headers.extend(open.headers(index));
                record.headers = Cow::Owned(headers);
            }
        }
        Ok(Some(record))
    }

    /// Sends a BEGIN or END marker of `open` as a record of its transaction (`ticket`): counted
    /// in the watermark like an event, so the transaction confirms only once it is acknowledged.
    /// `Published::Full`: the sink had no room for it.
    fn send_marker(
        &mut self,
        ticket: TxnTicket,
        open: &OpenTxn,
        marker: Marker,
        a: &mut Accounts<'_>,
    ) -> Result<Published, RelayError> {
        let Some(topic) = self.settings.transactions.as_ref().and_then(|m| m.topic.as_deref()) else {
            return Ok(Published::Done);
        };
        let id = open.id();
        let commit_lsn = open.commit_lsn();
        (self.limits.check_name)(topic).map_err(|m| RelayError::BadEvent {
            id: format!("{marker:?} marker of transaction {id} (transactions.topic)"),
            commit_lsn,
            cause: BadEvent::Topic(m),
        })?;
        let (key, value) = open.marker(marker);
        let record = SinkRecord {
            destination: Cow::Borrowed(topic),
            key: Cow::Owned(key),
            value: Some(Cow::Owned(value)),
            event_id: id.as_bytes(),
            timestamp_ms: Some(open.commit_ms()),
            headers: Cow::Owned(Vec::new()),
            partition: None,
        };
        // Outside the events' positions (`seq`), so a refusal never names an event.
        let seq = match marker {
            Marker::Begin => u32::MAX - 1,
            Marker::End => u32::MAX,
        };
        let txn = TxnEvent {
            ticket,
            commit_time_unix_us: open.commit_ms().saturating_mul(1000),
            event: EventRef { commit_lsn, seq },
        };
        match self.send(&txn, &record, TagKind::Record, None, a)? {
            Handed::Taken => Ok(Published::Done),
            Handed::Full => Ok(Published::Full),
            Handed::Failed(failure) => Err(delivery_failed(self.settings.sink.broker_name(), failure, commit_lsn)),
        }
    }

    /// Hands a record to the sink ([`Handed`]): taken, no room (nothing counted, the span
    /// dropped: the retry starts its own), or refused (nothing in flight; `span` ended with the
    /// refusal).
    fn send(
        &mut self,
        txn: &TxnEvent,
        record: &SinkRecord<'_>,
        kind: TagKind,
        span: Option<Box<ProducerSpan>>,
        a: &mut Accounts<'_>,
    ) -> Result<Handed, RelayError> {
        let bytes = record.size();
        let topic = a.progress.topic(&record.destination);
        let tag = Box::new(DeliveryTag {
            ticket: txn.ticket,
            bytes,
            commit_lsn: txn.commit_lsn(),
            commit_time_unix_us: txn.commit_time_unix_us,
            event_seq: txn.event.seq,
            kind,
            topic,
            span,
        });
        let mut buf = [0u8; 40];
        let stamp = a.guarantee.stamp(txn.event, &mut buf);
        let extra = stamp.headers.as_ref().map_or(&[][..], |h| &h[..]);
        let handover = Handover::of(record)
            .with_extra(extra)
            .with_dedup_key(stamp.dedup_key.as_deref());
        let sent = self.sink.send(handover, tag);
        if matches!(&sent, Err(refusal) if refusal.failure.is_full()) {
            self.full = true;
            return Ok(Handed::Full);
        }
        a.progress.sent(topic, txn.commit_lsn(), txn.commit_time_unix_us);
        if let Err(mut refusal) = sent {
            a.progress.delivered(&refusal.tag, false);
            self.end_span(&mut refusal.tag, Some(&refusal.failure));
            return Ok(Handed::Failed(refusal.failure));
        }
        a.durability.sent(txn.ticket, bytes)?;
        a.guarantee.sent(txn.commit_lsn(), a.durability);
        a.progress.counts.events_sent += 1;
        Ok(Handed::Taken)
    }

    /// Applies `relay.on_bad_event` to an event that can never be published. `may_wait`: the
    /// event is being published for the first time and nothing of it was sent yet, so the
    /// delivery guarantee may make it wait for a read-back.
    fn bad_event(
        &mut self,
        txn: &TxnEvent,
        id: &[u8],
        cause: BadEvent,
        raw: &RawEvent,
        may_wait: bool,
        a: &mut Accounts<'_>,
    ) -> Result<Published, RelayError> {
        let settings = self.settings;
        let policy = &settings.relay.on_bad_event;
        if let BadEventPolicy::DeadLetter { topic } = policy {
            let bound = Bound {
                destination: topic,
                key: raw.key.as_deref().unwrap_or_default(),
                placement: None,
            };
            match a.guarantee.admit(txn.event, bound, None, may_wait) {
                Verdict::Send => {}
                Verdict::Skip => return Ok(Published::Done),
                Verdict::Wait => return Ok(Published::Wait),
            }
        }
        let id_text = String::from_utf8_lossy(id);
        let commit_lsn = txn.commit_lsn();
        // Handed over before it is counted and logged: a sink with no room for it makes the
        // event come back (`Published::Full`), and it is counted then.
        let dead_letter = match policy {
            BadEventPolicy::DeadLetter { topic } => {
                let record = raw.dead_letter(topic, id, commit_lsn, &cause, &self.limits);
                match self.send(txn, &record, TagKind::DeadLetter, None, a)? {
                    Handed::Taken => Some(topic),
                    Handed::Full => return Ok(Published::Full),
                    Handed::Failed(failure) => {
                        return Err(delivery_failed(self.settings.sink.broker_name(), failure, commit_lsn))
                    }
                }
            }
            _ => None,
        };
        counter!(BAD_EVENTS, "policy" => policy.label(), "cause" => cause.label()).increment(1);
        a.progress.counts.bad_events += 1;
        if let Some(topic) = dead_letter {
            warn!(
                id = %id_text,
                commit_lsn = %commit_lsn,
                source = %raw.source,
                cause = %cause,
                dead_letter_topic = %topic,
                "dead-lettering a bad outbox event (relay.on_bad_event = \"dead-letter\")"
            );
            return Ok(Published::Done);
        }
        match policy {
            BadEventPolicy::Fail => Err(RelayError::BadEvent {
                id: id_text.into_owned(),
                commit_lsn,
                cause,
            }),
            BadEventPolicy::Skip => {
                warn!(
                    id = %id_text,
                    commit_lsn = %commit_lsn,
                    source = %raw.source,
                    cause = %cause,
                    "skipped a bad outbox event (relay.on_bad_event = \"skip\")"
                );
                Ok(Published::Done)
            }
            // Handed over above.
            BadEventPolicy::DeadLetter { .. } => Ok(Published::Done),
        }
    }

    /// One delivery report of a record this step sent: the watermark step settles it, and a
    /// failure is a suspect's verdict, a new suspect, or a plain failure (module docs).
    pub(super) fn on_delivery(&mut self, delivery: Delivery, a: &mut Accounts<'_>) -> Result<(), RelayError> {
        // A report frees room in the sink's queue.
        self.full = false;
        let mut tag = delivery.tag;
        a.progress.delivered(&tag, delivery.outcome.is_ok());
        self.end_span(&mut tag, delivery.outcome.as_ref().err());
        match delivery.outcome {
            Ok(()) => {
                a.durability.acknowledged(tag.ticket, tag.bytes)?;
                a.progress.counts.events_acked += 1;
                self.held_accepted(&tag);
            }
            Err(failure) => self.on_failed_delivery(&tag, failure, a)?,
        }
        self.release_held(a)
    }

    /// A failed delivery report: a suspect's verdict, a new suspect, or a plain failure.
    fn on_failed_delivery(
        &mut self,
        tag: &DeliveryTag,
        failure: SinkFailure,
        a: &mut Accounts<'_>,
    ) -> Result<(), RelayError> {
        let event = EventRef {
            commit_lsn: tag.commit_lsn,
            seq: tag.event_seq,
        };
        let refused = tag.kind != TagKind::DeadLetter && failure.is_refusal();
        let verdict = refused
            && matches!(&self.phase, Phase::Holding(h) if matches!(h.state, HeldState::Sent) && h.txn.event == event);
        if verdict && a.guarantee.refusal_dooms_unit() {
            // The refusal left the sink's unit unable to commit: neither a dead letter nor the
            // events after it can go into it. Condemned, it is settled on the replay.
            self.phase.take_held();
            a.durability.failed(tag.ticket, tag.bytes)?;
            self.suspects.condemn(event, failure.cause.clone());
            return Err(RelayError::RecordCondemned {
                sink: self.settings.sink.broker_name(),
                failure: Box::new(failure),
                commit_lsn: tag.commit_lsn,
            });
        }
        if let (true, Some(held)) = (verdict, self.phase.take_held()) {
            info!(
                id = %String::from_utf8_lossy(&held.event.id),
                commit_lsn = %tag.commit_lsn,
                "the sink refused the suspect event again on its own: it is a bad event"
            );
            // Decided: the sink publishes the key's records again (its dead letter first).
            if let Ok(record) = held.event.record(self.settings, &self.limits) {
                self.sink.release(&record.key);
            }
            return self.condemn_held(held, tag.ticket, tag.bytes, failure.cause, a);
        }
        a.durability.failed(tag.ticket, tag.bytes)?;
        if refused {
            self.suspects.insert(event, failure.cause.clone());
            return Err(RelayError::RecordRejected {
                sink: self.settings.sink.broker_name(),
                failure: Box::new(failure),
                commit_lsn: tag.commit_lsn,
            });
        }
        Err(RelayError::DeliveryFailed {
            sink: self.settings.sink.broker_name(),
            failure: Box::new(failure),
            commit_lsn: tag.commit_lsn,
        })
    }

    /// The held suspect was refused again on its own: `relay.on_bad_event` applies to it, and
    /// its own delivery (`ticket`, `bytes`) is settled once that is done. A dead letter the
    /// sink has no room for yet keeps it held ([`HeldState::DeadLetterDue`]: handed over again
    /// after the pause, nothing else sent meanwhile), never acknowledged without it.
    fn condemn_held(
        &mut self,
        mut held: Held,
        ticket: TxnTicket,
        bytes: usize,
        cause: String,
        a: &mut Accounts<'_>,
    ) -> Result<(), RelayError> {
        let bad = BadEvent::refused_by(self.settings.sink.broker_name(), &cause);
        match self.bad_event(&held.txn, &held.event.id, bad, &held.raw, false, a) {
            Ok(Published::Full) => {
                held.state = HeldState::DeadLetterDue { ticket, bytes, cause };
                self.phase = Phase::Holding(held);
                Ok(())
            }
            // Skipped, or replaced by its dead letter (counted in flight by now); it cannot
            // wait (`may_wait` is false).
            Ok(_) => Ok(a.durability.acknowledged(ticket, bytes)?),
            Err(e) => {
                a.durability.failed(ticket, bytes)?;
                Err(e)
            }
        }
    }

    /// An acknowledgement: if it is the held suspect's, that event was innocent.
    fn held_accepted(&mut self, tag: &DeliveryTag) {
        let event = EventRef {
            commit_lsn: tag.commit_lsn,
            seq: tag.event_seq,
        };
        let sent = |h: &Held| matches!(h.state, HeldState::Sent) && h.txn.event == event;
        if tag.kind == TagKind::DeadLetter || !self.phase.held().is_some_and(sent) {
            return;
        }
        info!(commit_lsn = %tag.commit_lsn, seq = tag.event_seq, "the sink accepted the suspect event on its own: it only shared a batch with a bad record");
        self.suspects.clear(event);
        self.phase.take_held();
    }

    /// Sends the held suspect once nothing else is in flight (so it travels in a batch of its own).
    /// A sink with no room for it keeps it held ([`Publish::retry_room`] comes back to it).
    fn release_held(&mut self, a: &mut Accounts<'_>) -> Result<(), RelayError> {
        let Phase::Holding(held) = &self.phase else {
            return Ok(());
        };
        match held.state {
            HeldState::Sent => return Ok(()),
            HeldState::Waiting | HeldState::NoRoom if a.durability.in_flight_events() > 0 => return Ok(()),
            HeldState::Waiting | HeldState::NoRoom | HeldState::DeadLetterDue { .. } => {}
        }
        let Some(mut held) = self.phase.take_held() else {
            return Ok(());
        };
        match std::mem::replace(&mut held.state, HeldState::NoRoom) {
            HeldState::DeadLetterDue { ticket, bytes, cause } => {
                return self.condemn_held(held, ticket, bytes, cause, a);
            }
            HeldState::Waiting => info!(
                id = %String::from_utf8_lossy(&held.event.id),
                commit_lsn = %held.txn.commit_lsn(),
                earlier = %held.earlier,
                "sending alone an event the sink refused earlier, to tell whether it is the bad one"
            ),
            HeldState::NoRoom | HeldState::Sent => {}
        }
        let settings = self.settings;
        let (span, traced) = self.start_span(&held.txn, &held.event).unzip();
        let event = traced.as_ref().unwrap_or(&held.event);
        let settled = |published: Published| published != Published::Full;
        let sent = match event.record(settings, &self.limits) {
            // It was routed before it was held, and routing depends on nothing else.
            Err(cause) => {
                settled(self.bad_event(&held.txn, &held.event.id, cause, &held.raw, false, a)?).then_some(false)
            }
            Ok(record) => match self.with_transaction_meta(&held.txn, held.txn_index, record, a)? {
                None => None,
                Some(record) => {
                    let span = span.map(|s| with_partition(s, record.partition));
                    match self.send(&held.txn, &record, TagKind::Record, span, a)? {
                        Handed::Taken => Some(true),
                        Handed::Full => None,
                        Handed::Failed(failure) if failure.is_refusal() => {
                            let cause = BadEvent::refused_by(self.settings.sink.broker_name(), &failure.cause);
                            settled(self.bad_event(&held.txn, &held.event.id, cause, &held.raw, false, a)?)
                                .then_some(false)
                        }
                        Handed::Failed(failure) => {
                            return Err(delivery_failed(
                                self.settings.sink.broker_name(),
                                failure,
                                held.txn.commit_lsn(),
                            ))
                        }
                    }
                }
            },
        };
        drop(traced);
        match sent {
            // Settled by `relay.on_bad_event`: nothing is held any more.
            Some(false) => {}
            // Sent (its verdict is awaited), or not taken for want of room (sent again later).
            Some(true) | None => {
                held.state = if sent.is_some() {
                    HeldState::Sent
                } else {
                    HeldState::NoRoom
                };
                self.phase = Phase::Holding(held);
            }
        }
        Ok(())
    }

    /// The sink answered that its queue is full ([`Published::Full`]): nothing more is sent
    /// until a delivery report or [`retry_room`](Self::retry_room) says to try again.
    /// A delivery report freed room in the sink's queue (one that is not this step's to apply).
    pub(super) fn room_freed(&mut self) {
        self.full = false;
    }

    pub(super) fn waiting_for_room(&self) -> bool {
        self.full
    }

    /// Tries again after the sink had no room (a pause passed without a delivery report: the
    /// client frees room on its own clock): the held suspect, if it was the one not taken.
    pub(super) fn retry_room(&mut self, a: &mut Accounts<'_>) -> Result<(), RelayError> {
        self.full = false;
        self.release_held(a)
    }

    /// The suspects as they stand (unit tests).
    #[cfg(test)]
    pub(super) fn suspects(&self) -> &Suspects {
        self.suspects
    }
}

/// A span's `messaging.destination.partition.id` when the record names its partition
/// (`[debezium]` placement); otherwise the broker chooses, after the span started.
fn with_partition(mut span: Box<ProducerSpan>, partition: Option<i32>) -> Box<ProducerSpan> {
    if let (Some(p), true) = (partition, span.sampled) {
        span.attributes.push(opentelemetry::KeyValue::new(
            "messaging.destination.partition.id",
            p.to_string(),
        ));
    }
    span
}

/// The event `source` holds, as read without its commit (`None`: a row of a table without a
/// column mapping, which the decode step never hands on).
fn read_event(source: &EventSource) -> Option<Result<OutboxEvent<'_>, BadEvent>> {
    match source {
        EventSource::Row { relation, row } => Some(relation.layout.as_ref()?.extract(&relation.relation, row)),
        EventSource::Message(message) => Some(OutboxEvent::from_message(&message.content)),
    }
}

fn delivery_failed(sink: &'static str, failure: SinkFailure, commit_lsn: Lsn) -> RelayError {
    RelayError::DeliveryFailed {
        sink,
        failure: Box::new(failure),
        commit_lsn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;
    use crate::relay::quarantine::Suspects;
    use crate::relay::stream::test_support::stream;
    use crate::relay::stream::StreamState;
    use crate::relay::test_frames::{begin, commit, insert, relation, xlog, COMMITTED, SECOND_US};
    use crate::sink::memory::MemoryHandle;
    use crate::sink::{Completions, FailureKind};

    const OUTBOX: u32 = 16_384;

    /// What a test does with the session [`run_with`] fed: its state, the sink, the completions
    /// and the outcome of feeding it.
    trait SessionTest:
        FnOnce(&mut StreamState<'_>, &MemoryHandle<DeliveryTag>, &mut Completions<DeliveryTag>, Result<(), RelayError>)
    {
    }

    impl<F> SessionTest for F where
        F: FnOnce(
            &mut StreamState<'_>,
            &MemoryHandle<DeliveryTag>,
            &mut Completions<DeliveryTag>,
            Result<(), RelayError>,
        )
    {
    }

    /// One transaction inserting `types.len()` outbox rows (ids 1, 2, …; aggregate `agg-<id>`),
    /// committed at 0x500 and ending at 0x510, fed to a session over an in-memory sink.
    fn run(extra_config: &str, types: &[&str], test: impl SessionTest) {
        run_with(extra_config, types, Suspects::default(), None, test)
    }

    /// [`run`], replaying with `suspects` from an earlier session.
    fn run_with(
        extra_config: &str,
        types: &[&str],
        mut suspects: Suspects,
        tracer: Option<crate::ops::tracing_export::Tracer>,
        test: impl SessionTest,
    ) {
        let settings = settings(extra_config);
        let (mut state, handle, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, tracer);
        let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
        let outcome = (|| {
            state.on_frame(xlog(COMMITTED, &begin(0x500)))?;
            state.on_frame(xlog(COMMITTED, &relation(OUTBOX, "public", "events_outbox", &columns)))?;
            for (i, t) in types.iter().enumerate() {
                let id = (i + 1).to_string();
                let agg = format!("agg-{id}");
                let row = [
                    Some(id.as_str()),
                    Some(agg.as_str()),
                    Some(*t),
                    Some("{\"n\": 1}"),
                    None,
                    None,
                ];
                state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row)))?;
            }
            state.on_frame(xlog(COMMITTED, &commit(0x500, 0x510)))?;
            Ok(())
        })();
        test(&mut state, &handle, &mut completions, outcome);
    }

    /// [`run_with`] of one `order.placed` row (`EventRef::at(0x500, 0)`) that an earlier session
    /// left in `suspects`.
    fn replay_one(extra_config: &str, suspects: Suspects, test: impl SessionTest) {
        run_with(extra_config, &["order.placed"], suspects, None, test)
    }

    fn apply_all(state: &mut StreamState<'_>, completions: &mut Completions<DeliveryTag>) -> Result<(), RelayError> {
        let mut first_error = Ok(());
        while let Ok(d) = completions.try_recv() {
            let d: Delivery = d;
            if let Err(e) = state.on_delivery(d) {
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }

    #[test]
    fn events_reach_the_sink_in_commit_order_and_are_confirmed_only_once_all_are_delivered() {
        run(
            "",
            &["order.placed", "order.paid"],
            |state, sink, completions, outcome| {
                outcome.unwrap();
                let stored = sink.stored();
                let seen: Vec<String> = stored
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {} {:?}",
                            r.destination,
                            String::from_utf8_lossy(&r.key),
                            r.header("id")
                        )
                    })
                    .collect();
                assert_eq!(seen, ["order.placed agg-1 Some([49])", "order.paid agg-2 Some([50])"]);
                assert_eq!(stored[0].value.as_deref(), Some(&b"{\"n\": 1}"[..]));
                assert_eq!(state.in_flight(), 2);
                sink.deliver(1);
                apply_all(state, completions).unwrap();
                assert_eq!(state.confirmed(), Lsn(0x10), "half the transaction is not confirmed");
                sink.deliver(1);
                apply_all(state, completions).unwrap();
                assert_eq!(state.confirmed(), Lsn(0x510));
                assert_eq!(sink.pending(), 0);
            },
        );
    }

    /// Issue 44: a sink whose queue is full takes nothing, and nothing fails: the event it did
    /// not take is first in line, reading pauses, and once a report freed room (or the retry
    /// pause passed) the same event goes out — once, in order; the transaction's END marker
    /// waits the same way, and the Commit with it.
    #[test]
    fn a_full_sink_queue_makes_the_stream_wait_and_hand_the_same_event_over_again() {
        let settings = settings("[transactions]\ntopic = \"txns\"\n");
        let mut suspects = Suspects::default();
        let (mut state, sink, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
        let row = |id: &'static str| [Some(id), Some("agg"), Some("order.placed"), Some("{}"), None, None];
        sink.capacity(Some(2));
        state.on_frame(xlog(COMMITTED, &begin(0x500))).unwrap();
        state
            .on_frame(xlog(COMMITTED, &relation(OUTBOX, "public", "events_outbox", &columns)))
            .unwrap();
        // BEGIN marker and event 1 fill the queue; event 2 is not taken.
        state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row("1")))).unwrap();
        state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row("2")))).unwrap();
        assert_eq!(sink.stored().len(), 2);
        assert!(
            state.is_full() && state.waiting_for_room(),
            "reading pauses while the sink has no room"
        );
        state.work_backlog().unwrap();
        assert_eq!(sink.stored().len(), 2, "nothing is retried before room frees");
        // A report frees room: the same event goes out.
        sink.deliver(1);
        apply_all(&mut state, &mut completions).unwrap();
        state.work_backlog().unwrap();
        assert!(!state.is_full());
        state.on_frame(xlog(COMMITTED, &commit(0x500, 0x510))).unwrap();
        // The END marker finds no room: the Commit waits with it, nothing is confirmed.
        assert!(state.waiting_for_room() && state.is_full());
        state.retry_room().unwrap();
        state.work_backlog().unwrap();
        assert!(state.is_full(), "still no room after the pause");
        sink.capacity(None);
        state.retry_room().unwrap();
        state.work_backlog().unwrap();
        assert!(!state.is_full());
        let ids: Vec<String> = sink
            .stored()
            .iter()
            .map(|r| format!("{}:{}", r.destination, String::from_utf8_lossy(r.header("id").unwrap())))
            .collect();
        assert_eq!(ids.len(), 4, "BEGIN, 1, 2, END — each once: {ids:?}");
        assert!(ids[1].ends_with(":1") && ids[2].ends_with(":2"), "{ids:?}");
        assert!(ids[0].starts_with("txns:") && ids[3].starts_with("txns:"), "{ids:?}");
        sink.deliver(3);
        apply_all(&mut state, &mut completions).unwrap();
        assert_eq!(state.confirmed(), Lsn(0x510));
        assert_eq!(state.counts().events_sent, 4);
    }

    /// `[transactions] headers`: the frames of one transaction with an outbox row per type
    /// (ids from 1), fed one by one; `between(state, sink, i)` runs after the `i`-th insert.
    fn held_transaction(
        extra_config: &str,
        types: &[&str],
        mut between: impl FnMut(&mut StreamState<'_>, &MemoryHandle<DeliveryTag>, &mut Completions<DeliveryTag>, usize),
        after: impl FnOnce(&mut StreamState<'_>, &MemoryHandle<DeliveryTag>, &mut Completions<DeliveryTag>),
    ) {
        let settings = settings(extra_config);
        let mut suspects = Suspects::default();
        let (mut state, handle, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
        state.on_frame(xlog(COMMITTED, &begin(0x500))).unwrap();
        state
            .on_frame(xlog(COMMITTED, &relation(OUTBOX, "public", "events_outbox", &columns)))
            .unwrap();
        for (i, t) in types.iter().enumerate() {
            let id = (i + 1).to_string();
            let row = [Some(id.as_str()), Some("agg"), Some(*t), Some("{}"), None, None];
            state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row))).unwrap();
            between(&mut state, &handle, &mut completions, i + 1);
        }
        state.on_frame(xlog(COMMITTED, &commit(0x500, 0x510))).unwrap();
        after(&mut state, &handle, &mut completions);
    }

    fn txn_headers(stored: &crate::sink::memory::Stored) -> (String, String, Option<String>) {
        let text = |name| stored.header(name).map(|v| String::from_utf8(v.to_vec()).unwrap());
        (
            text("id").unwrap(),
            text("outbox-relay-txn-index").unwrap(),
            text("outbox-relay-txn-count"),
        )
    }

    #[test]
    fn with_transaction_headers_a_transaction_is_held_until_its_commit_and_each_event_carries_its_count() {
        let config = "[transactions]\nheaders = true\n[filter]\nexclude = [\"noise.*\"]\n";
        held_transaction(
            config,
            &["order.placed", "noise.tick", "order.paid"],
            |state, sink, _, _| {
                assert!(sink.stored().is_empty(), "held until the Commit");
                assert!(!state.is_full(), "reading goes on while a transaction is held");
            },
            |state, sink, completions| {
                let stored = sink.stored();
                // The filtered event neither counts nor takes an index.
                let headers: Vec<_> = stored.iter().map(txn_headers).collect();
                assert_eq!(
                    headers,
                    [
                        ("1".into(), "1".into(), Some("2".into())),
                        ("3".into(), "2".into(), Some("2".into())),
                    ]
                );
                assert_eq!(state.confirmed(), Lsn(0x10), "nothing acknowledged yet");
                sink.deliver(2);
                apply_all(state, completions).unwrap();
                assert_eq!(
                    state.confirmed(),
                    Lsn(0x510),
                    "the transaction confirms once both are acknowledged"
                );
            },
        );
    }

    #[test]
    fn a_transaction_larger_than_the_in_flight_budget_goes_out_as_it_arrives_without_its_count() {
        let config = "[relay]\nmax_in_flight = 2\n[transactions]\nheaders = true\n";
        held_transaction(
            config,
            &["a", "b", "c"],
            |state, sink, completions, i| {
                match i {
                    1 => assert!(sink.stored().is_empty(), "held while it fits"),
                    // The second fills the budget: both go out, the rest as it arrives.
                    2 => {
                        assert_eq!(sink.stored().len(), 2);
                        assert!(state.is_full(), "the budget is used up");
                        sink.deliver(2);
                        apply_all(state, completions).unwrap();
                        assert!(!state.is_full());
                    }
                    _ => assert_eq!(sink.stored().len(), 3, "not held any more"),
                }
            },
            |state, sink, completions| {
                let headers: Vec<_> = sink.stored().iter().map(txn_headers).collect();
                assert_eq!(
                    headers,
                    [
                        ("1".into(), "1".into(), None),
                        ("2".into(), "2".into(), None),
                        ("3".into(), "3".into(), None),
                    ]
                );
                sink.deliver(1);
                apply_all(state, completions).unwrap();
                assert_eq!(state.confirmed(), Lsn(0x510));
            },
        );
    }

    #[test]
    fn a_released_transaction_waits_for_room_in_the_budget_before_its_commit_is_taken() {
        let config = "[relay]\nmax_in_flight = 3\n[transactions]\nheaders = true\n";
        let settings = settings(config);
        let mut suspects = Suspects::default();
        let (mut state, handle, mut completions) = stream(&settings, Lsn(0x10), &mut suspects, None);
        let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
        let row = |id| [Some(id), Some("g"), Some("a"), Some("{}"), None, None];
        state
            .on_frame(xlog(COMMITTED, &relation(OUTBOX, "public", "events_outbox", &columns)))
            .unwrap();
        for (txn, ids) in [(0x500, ["1", "2"]), (0x600, ["3", "4"])] {
            state.on_frame(xlog(COMMITTED, &begin(txn))).unwrap();
            for id in ids {
                state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row(id)))).unwrap();
            }
            state.on_frame(xlog(COMMITTED, &commit(txn, txn + 0x10))).unwrap();
        }
        // The first transaction's two and one of the second's fill the budget of three: the
        // other and the second's Commit wait, and no frame is read meanwhile.
        assert_eq!(handle.stored().len(), 3);
        assert!(state.is_full());
        handle.deliver(3);
        apply_all(&mut state, &mut completions).unwrap();
        assert_eq!(state.confirmed(), Lsn(0x510), "the second is not complete");
        state.work_backlog().unwrap();
        assert!(!state.is_full());
        let stored = handle.stored();
        assert_eq!(
            stored.iter().map(txn_headers).collect::<Vec<_>>(),
            [("1", "1"), ("2", "2"), ("3", "1"), ("4", "2")].map(|(id, index)| (
                id.to_owned(),
                index.to_owned(),
                Some("2".to_owned())
            ))
        );
        handle.deliver(1);
        apply_all(&mut state, &mut completions).unwrap();
        assert_eq!(state.confirmed(), Lsn(0x610));
    }

    const TRANSACTIONS: &str =
        "\"transactional.id\" = \"t\"\nexactly_once = \"transactions\"\n[relay]\ndelivery = \"exactly-once\"\n";

    #[test]
    fn with_kafka_transactions_acknowledged_events_are_confirmed_only_once_their_transaction_committed() {
        run(
            TRANSACTIONS,
            &["order.placed", "order.paid"],
            |state, sink, completions, outcome| {
                outcome.unwrap();
                sink.deliver(2);
                apply_all(state, completions).unwrap();
                assert_eq!(state.confirmed(), Lsn(0x10), "acknowledged inside an open transaction");
                assert!(!state.has_unreported_progress());
                state.seal_if_due(true).unwrap();
                assert_eq!(sink.seals(), vec![0x500], "the checkpoint: the last source commit LSN");
                assert!(state.is_full(), "nothing is read while the commit is under way");
                assert_eq!(state.confirmed(), Lsn(0x10), "not before the commit succeeded");
                sink.deliver(1);
                apply_all(state, completions).unwrap();
                assert_eq!(state.confirmed(), Lsn(0x510));
                assert!(!state.is_full());
            },
        );
        run(TRANSACTIONS, &["order.placed"], |state, sink, completions, outcome| {
            outcome.unwrap();
            sink.deliver(1);
            state.seal_if_due(true).unwrap();
            sink.fail_next(FailureKind::Transient, "transaction aborted");
            let err = apply_all(state, completions).unwrap_err();
            assert!(err.is_transient(), "a new session replays: {err}");
            assert_eq!(
                state.confirmed(),
                Lsn(0x10),
                "an aborted transaction is never confirmed"
            );
            state.keepalive(Lsn(0x900));
            assert_eq!(state.confirmed(), Lsn(0x10));
        });
    }

    #[test]
    fn a_failed_delivery_ends_the_session_and_confirms_nothing_after_it() {
        run(
            "",
            &["order.placed", "order.paid"],
            |state, sink, completions, outcome| {
                outcome.unwrap();
                sink.fail_next(FailureKind::Transient, "broker down");
                sink.deliver(1);
                let err = apply_all(state, completions).unwrap_err();
                assert!(matches!(err, RelayError::DeliveryFailed { .. }), "{err}");
                assert!(err.is_transient(), "a new session replays: {err}");
                assert_eq!(state.confirmed(), Lsn(0x10));
            },
        );
    }

    #[test]
    fn a_refusal_in_a_completion_makes_a_suspect_sent_alone_on_replay() {
        run("", &["order.placed"], |state, sink, completions, outcome| {
            outcome.unwrap();
            sink.fail_next(FailureKind::Refused, "record too large");
            let err = apply_all(state, completions).unwrap_err();
            assert!(matches!(err, RelayError::RecordRejected { .. }), "{err}");
            let suspect = EventRef::at(0x500, 0);
            assert_eq!(
                state.suspects().standing(suspect),
                Some(&Standing::Suspect("record too large".into()))
            );
        });
    }

    /// A replay whose one event (at 0x500, key `agg-1`) is a suspect refused earlier in a batch,
    /// under `on_bad_event = "dead-letter"` to topic `dlq`: `then` runs once it was sent alone.
    fn replay_a_suspect_under_dead_letter(
        then: impl FnOnce(&mut StreamState<'_>, &MemoryHandle<DeliveryTag>, &mut Completions<DeliveryTag>),
    ) {
        let mut suspects = Suspects::default();
        suspects.insert(EventRef::at(0x500, 0), "batch refused".into());
        let dead_letter = "[relay]\non_bad_event = \"dead-letter\"\ndead_letter_topic = \"dlq\"\n";
        replay_one(dead_letter, suspects, |state, sink, completions, outcome| {
            outcome.unwrap();
            assert_eq!(sink.stored().len(), 1, "the suspect, sent alone");
            then(state, sink, completions);
        });
    }

    #[test]
    fn a_suspect_refused_again_releases_its_key_before_its_dead_letter() {
        replay_a_suspect_under_dead_letter(|state, sink, completions| {
            assert!(sink.released().is_empty(), "nothing decided yet");
            sink.fail_next(FailureKind::Refused, "record too large");
            apply_all(state, completions).unwrap();
            // The sink fenced agg-1 when it reported the refusal; the relay decided (dead
            // letter) and released the key before handing over the dead letter.
            assert_eq!(sink.released(), vec![(b"agg-1".to_vec(), 1)]);
            let stored = sink.stored();
            assert_eq!((stored.len(), stored[1].destination.as_str()), (2, "dlq"));
            sink.deliver(1);
            apply_all(state, completions).unwrap();
            assert_eq!(state.confirmed(), Lsn(0x510));
        });
    }

    /// Issue 44: a sink with no room for the dead letter of a suspect refused again (Kafka:
    /// the dead-letter topic's first record waits for what the topic takes) keeps the suspect
    /// held — no replay, nothing else sent — and hands the dead letter over again after the
    /// pause; the suspect is acknowledged only once its dead letter is.
    #[test]
    fn a_dead_letter_without_room_is_handed_over_again_without_a_replay() {
        replay_a_suspect_under_dead_letter(|state, sink, completions| {
            sink.capacity(Some(0));
            sink.fail_next(FailureKind::Refused, "record too large");
            apply_all(state, completions).expect("no room is backpressure, not a failure");
            assert_eq!(sink.stored().len(), 1, "the dead letter was not taken");
            assert!(state.waiting_for_room() && state.is_full());
            state.retry_room().unwrap();
            assert_eq!(sink.stored().len(), 1, "still no room after the pause");
            assert_eq!(state.confirmed(), Lsn(0x10), "not acknowledged without its dead letter");
            sink.capacity(None);
            state.retry_room().unwrap();
            let stored = sink.stored();
            assert_eq!((stored.len(), stored[1].destination.as_str()), (2, "dlq"));
            sink.deliver(1);
            apply_all(state, completions).unwrap();
            assert_eq!(state.confirmed(), Lsn(0x510));
            assert_eq!(sink.stored().len(), 2, "the dead letter once");
        });
    }

    #[test]
    fn with_kafka_transactions_a_suspect_refused_again_is_condemned_and_settled_on_the_replay() {
        let suspect = EventRef::at(0x500, 0);
        let config = format!("{TRANSACTIONS}on_bad_event = \"dead-letter\"\ndead_letter_topic = \"dlq\"\n");
        let mut suspects = Suspects::default();
        suspects.insert(suspect, "batch refused".into());
        // The session that sends it alone: refused again, its broker transaction can no longer
        // commit, so no dead letter goes into it; the session ends and nothing is confirmed.
        replay_one(&config, suspects, |state, sink, completions, outcome| {
            outcome.unwrap();
            assert_eq!(sink.stored().len(), 1, "the suspect, sent alone");
            sink.fail_next(FailureKind::Refused, "record too large");
            let err = apply_all(state, completions).unwrap_err();
            assert!(matches!(err, RelayError::RecordCondemned { .. }), "{err}");
            assert!(err.is_transient(), "the replay settles it: {err}");
            assert_eq!(sink.stored().len(), 1, "no dead letter inside the doomed transaction");
            assert_eq!(state.confirmed(), Lsn(0x10));
        });
        // The replay: the condemned event is dead-lettered without being sent, the unit sealed
        // and the source transaction confirmed.
        let mut suspects = Suspects::default();
        suspects.condemn(suspect, "record too large".into());
        replay_one(&config, suspects, |state, sink, completions, outcome| {
            outcome.unwrap();
            let stored = sink.stored();
            assert_eq!(
                (stored.len(), stored[0].destination.as_str()),
                (1, "dlq"),
                "only its dead letter"
            );
            sink.deliver(1);
            apply_all(state, completions).unwrap();
            state.seal_if_due(true).unwrap();
            sink.deliver(1);
            apply_all(state, completions).unwrap();
            assert_eq!(state.confirmed(), Lsn(0x510));
        });
    }

    #[test]
    fn a_record_the_sink_refuses_on_sight_follows_on_bad_event() {
        // fail: the session stops naming the event.
        let refuse_placed = |state: &mut StreamState<'_>, sink: &MemoryHandle<DeliveryTag>| {
            sink.refuse("order.placed");
            let columns = ["id", "aggregate_id", "type", "payload", "created_at", "dispatched_at"];
            state.on_frame(xlog(COMMITTED, &begin(0x600)))?;
            state.on_frame(xlog(COMMITTED, &relation(OUTBOX, "public", "events_outbox", &columns)))?;
            let row = [Some("9"), Some("agg-9"), Some("order.placed"), Some("{}"), None, None];
            state.on_frame(xlog(COMMITTED, &insert(OUTBOX, &row)))?;
            state.on_frame(xlog(COMMITTED, &commit(0x600, 0x610)))
        };
        run("", &[], |state, sink, _, _| {
            let err = refuse_placed(state, sink).unwrap_err();
            assert!(matches!(err, RelayError::BadEvent { ref id, .. } if id == "9"), "{err}");
        });
        // dead-letter: the raw row goes to the dead-letter topic with the cause.
        let dead_letter = "[relay]\non_bad_event = \"dead-letter\"\ndead_letter_topic = \"dlq\"\n";
        run(dead_letter, &[], |state, sink, completions, _| {
            refuse_placed(state, sink).unwrap();
            let stored = sink.stored();
            assert_eq!(stored.len(), 1);
            assert_eq!(stored[0].destination, "dlq");
            assert_eq!(stored[0].key, b"agg-9");
            let error = String::from_utf8_lossy(stored[0].header("outbox-relay-error").unwrap()).into_owned();
            assert!(error.contains("refused by the test"), "{error}");
            sink.deliver(1);
            apply_all(state, completions).unwrap();
            assert_eq!(state.confirmed(), Lsn(0x610), "confirmed once the dead letter is in");
        });
        // skip: nothing is sent and the transaction is confirmed.
        run("[relay]\non_bad_event = \"skip\"\n", &[], |state, sink, _, _| {
            refuse_placed(state, sink).unwrap();
            assert!(sink.stored().is_empty());
            assert_eq!(state.confirmed(), Lsn(0x610));
            assert_eq!(state.counts().bad_events, 1);
        });
    }

    #[test]
    fn exactly_once_records_carry_their_position_after_their_own_headers() {
        use crate::relay::guarantee::{HEADER_COMMIT_LSN, HEADER_INDEX, HEADER_SOURCE};
        run(
            "[relay]\ndelivery = \"exactly-once\"\n",
            &["a", "b"],
            |_, sink, _, outcome| {
                outcome.unwrap();
                let stored = sink.stored();
                let names: Vec<&str> = stored[1].headers.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(names, ["id", HEADER_SOURCE, HEADER_COMMIT_LSN, HEADER_INDEX]);
                assert_eq!(stored[1].header(HEADER_SOURCE), Some(&b"7000/outbox_relay"[..]));
                assert_eq!(stored[1].header(HEADER_COMMIT_LSN), Some(&b"0/500"[..]));
                assert_eq!(stored[1].header(HEADER_INDEX), Some(&b"1"[..]));
            },
        );
        run("", &["a"], |_, sink, _, outcome| {
            outcome.unwrap();
            assert_eq!(sink.stored()[0].headers.len(), 1, "at-least-once adds no position");
        });
    }

    #[test]
    fn a_traced_event_carries_its_span_in_the_header_and_the_ack_ends_it() {
        use crate::ops::tracing_export::test_tracer;
        let (tracer, mut spans) = test_tracer(1.0, 8);
        run_with(
            "",
            &["order.placed", "order.paid"],
            Suspects::default(),
            Some(tracer),
            |state, sink, completions, outcome| {
                outcome.unwrap();
                let stored = sink.stored();
                let headers: Vec<String> = stored
                    .iter()
                    .map(|r| {
                        String::from_utf8_lossy(r.header("traceparent").expect("a root span's header")).into_owned()
                    })
                    .collect();
                assert!(spans.next().is_none(), "nothing ends before the ack");
                sink.deliver(1);
                sink.fail_next(FailureKind::Transient, "broker down");
                let _ = apply_all(state, completions);
                let (ok, error) = spans.next().expect("the acked span");
                assert_eq!(error, None);
                assert_eq!(headers[0], ok.traceparent(), "the header names the span");
                assert_eq!(ok.name, "send order.placed");
                assert_eq!(ok.parent, None, "no trace column: a root");
                // Started at the commit (the frames' time is µs since 2000-01-01).
                assert_eq!(ok.start_unix_us, COMMITTED + 946_684_800 * SECOND_US);
                let (failed, error) = spans.next().expect("the failed span");
                assert_eq!(error.as_deref(), Some("broker down"));
                assert_eq!(headers[1], failed.traceparent());
                assert!(spans.next().is_none());
            },
        );
        // sampling_ratio 0 and no parent: sent exactly as without tracing.
        let (tracer, mut spans) = test_tracer(0.0, 8);
        run_with(
            "",
            &["order.placed"],
            Suspects::default(),
            Some(tracer),
            |state, sink, completions, outcome| {
                outcome.unwrap();
                assert_eq!(sink.stored()[0].headers.len(), 1, "only the id header");
                sink.deliver(1);
                apply_all(state, completions).unwrap();
                assert!(spans.next().is_none());
            },
        );
    }
}
