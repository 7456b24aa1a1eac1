//! Step 3, publish: one outbox event — a row or a logical decoding message — and what happens when
//! it cannot be published.
//!
//! * Routing or extraction fails, or librdkafka refuses the record locally for what it is
//!   (`is_record_rejection`): the event is bad; `relay.on_bad_event` applies at once.
//! * The broker refuses it in a delivery report for what it is: it may have been refused with
//!   its whole batch, so it becomes a suspect and the session replays (`quarantine.rs`); the
//!   replay sends it alone and the policy applies only if it is refused again.
//! * Any other failure (transport, timeout, a broken producer) poisons the transaction and the
//!   session replays, whatever the policy.
//!
//! Watermark accounting: an event counts as in flight only once librdkafka queued it. A skipped
//! event never counts; a dead letter counts in its transaction like the event it replaces, so
//! the transaction is confirmed only once the dead letter is in Kafka.

use metrics::counter;
use rdkafka::error::KafkaError;
use tracing::{info, warn};

use super::stream::{DeliveryTag, Phase, StreamState};
use crate::config::relay::BadEventPolicy;
use crate::kafka::producer::{is_record_rejection, DeliveryFailure, OutboundRecord};
use crate::ops::metrics::BAD_EVENTS;
use crate::outbox::bad_event::BadEvent;
use crate::outbox::bad_event::RawEvent;
use crate::outbox::event::OutboxEvent;
use crate::outbox::message::best_effort_id;
use crate::postgres::lsn::Lsn;
use crate::postgres::pgoutput::LogicalDecodingMessage;
use crate::relay::error::RelayError;
use crate::relay::quarantine::{EventRef, Held, TxnEvent};
use crate::relay::resume::Verdict;

impl StreamState<'_> {
    /// The identity of the open transaction's next outbox event.
    pub(super) fn next_event(&mut self) -> Result<TxnEvent, RelayError> {
        let txn = self
            .open
            .as_mut()
            .ok_or_else(|| RelayError::Protocol("outbox event outside a transaction".into()))?;
        let seq = txn.events;
        txn.events += 1;
        Ok(TxnEvent {
            ticket: txn.ticket,
            commit_time_unix_us: txn.commit_time.to_unix_micros(),
            event: EventRef {
                commit_lsn: txn.commit_lsn,
                seq,
            },
        })
    }

    /// A transactional `pg_logical_emit_message` with the configured prefix is an event; other
    /// messages are not (see `outbox/message.rs` for why non-transactional ones are ignored).
    pub(super) fn on_logical_message(&mut self, message: LogicalDecodingMessage) -> Result<(), RelayError> {
        let settings = self.settings;
        let Some(prefix) = settings.outbox.message_prefix.as_deref() else {
            return Ok(());
        };
        if message.prefix != prefix {
            return Ok(());
        }
        if !message.transactional {
            warn!(
                prefix,
                lsn = %message.lsn,
                "ignored a non-transactional pg_logical_emit_message with the outbox prefix: it is not atomic with \
                 the business write (it is decoded even if its transaction rolls back). Emit events with \
                 pg_logical_emit_message(true, …)"
            );
            return Ok(());
        }
        let txn = self.next_event()?;
        let raw = || RawEvent::message(prefix, message.content.clone());
        match OutboxEvent::from_message(&message.content) {
            Ok(event) => self.publish(&txn, &event, raw),
            Err(cause) => {
                let id = best_effort_id(&message.content);
                self.bad_event(&txn, id.as_bytes(), cause, &raw(), true)
            }
        }
    }

    /// Routes and sends one event. `raw` renders the event for a dead letter (only when needed).
    pub(super) fn publish(
        &mut self,
        txn: &TxnEvent,
        event: &OutboxEvent<'_>,
        raw: impl FnOnce() -> RawEvent,
    ) -> Result<(), RelayError> {
        let settings = self.settings;
        let record = match event.record(&settings.router) {
            Ok(record) => record,
            Err(cause) => return self.bad_event(txn, &event.id, cause, &raw(), true),
        };
        if let Some(resume) = self.resume.as_mut() {
            match resume.verdict(txn.event, &record.topic, &record.key, record.partition, true) {
                Verdict::Send => {}
                Verdict::Skip => return Ok(()),
                Verdict::Wait => {
                    self.unallocate_event();
                    return Ok(());
                }
            }
            // Should Kafka refuse the record, its dead letter must not wait either.
            if let BadEventPolicy::DeadLetter { topic } = &settings.relay.on_bad_event {
                if !resume.prepare(txn.event, topic, &event.key, None) {
                    self.unallocate_event();
                    return Ok(());
                }
            }
        }
        if let Some(earlier) = self.suspects.get(txn.event) {
            self.phase = Phase::Holding(Held {
                txn: *txn,
                event: event.clone().into_owned(),
                raw: raw(),
                earlier: earlier.to_owned(),
                sent: false,
            });
            return self.release_held();
        }
        match self.send(txn, &record, false)? {
            None => Ok(()),
            Some(error) if is_record_rejection(&error) => {
                self.bad_event(txn, &event.id, BadEvent::Rejected(error.to_string()), &raw(), false)
            }
            Some(error) => Err(delivery_failed(error, &record.topic, &event.id, txn.commit_lsn())),
        }
    }

    /// Hands a record to librdkafka; `Some(error)` when it refused it (nothing was counted then).
    fn send(
        &mut self,
        txn: &TxnEvent,
        record: &OutboundRecord<'_>,
        dead_letter: bool,
    ) -> Result<Option<KafkaError>, RelayError> {
        let bytes = record.size();
        let topic = self.count_sent(&record.topic, txn.commit_lsn(), txn.commit_time_unix_us);
        let tag = Box::new(DeliveryTag {
            ticket: txn.ticket,
            bytes,
            commit_lsn: txn.commit_lsn(),
            commit_time_unix_us: txn.commit_time_unix_us,
            event_seq: txn.event.seq,
            dead_letter,
            topic,
        });
        let sent = match &self.resume {
            None => self.publisher.send(record, tag),
            Some(resume) => {
                let mut buf = [0u8; 40];
                let position = resume.position_headers(txn.event, &mut buf);
                self.publisher.send_with(record, &position, tag)
            }
        };
        if let Err(rejected) = sent {
            self.count_delivery(&rejected.tag, false);
            return Ok(Some(rejected.error));
        }
        self.watermark.event_sent(txn.ticket, bytes)?;
        self.counts.events_sent += 1;
        Ok(None)
    }

    /// Applies `relay.on_bad_event` to an event that can never be published. `may_wait`: the
    /// event's frame is being decoded and nothing of it was sent yet, so an exactly-once
    /// read-back may hold it (`resume.rs`).
    pub(super) fn bad_event(
        &mut self,
        txn: &TxnEvent,
        id: &[u8],
        cause: BadEvent,
        raw: &RawEvent,
        may_wait: bool,
    ) -> Result<(), RelayError> {
        let settings = self.settings;
        let policy = &settings.relay.on_bad_event;
        if let (Some(resume), BadEventPolicy::DeadLetter { topic }) = (self.resume.as_mut(), policy) {
            let key = raw.key.as_deref().unwrap_or_default();
            match resume.verdict(txn.event, topic, key, None, may_wait) {
                Verdict::Send => {}
                Verdict::Skip => return Ok(()),
                Verdict::Wait => {
                    self.unallocate_event();
                    return Ok(());
                }
            }
        }
        counter!(BAD_EVENTS, "policy" => policy.label(), "cause" => cause.label()).increment(1);
        self.counts.bad_events += 1;
        let id_text = String::from_utf8_lossy(id);
        let commit_lsn = txn.commit_lsn();
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
                Ok(())
            }
            BadEventPolicy::DeadLetter { topic } => {
                let record = raw.dead_letter(topic, id, commit_lsn, &cause, &settings.kafka);
                warn!(
                    id = %id_text,
                    commit_lsn = %commit_lsn,
                    source = %raw.source,
                    cause = %cause,
                    dead_letter_topic = %topic,
                    "dead-lettering a bad outbox event (relay.on_bad_event = \"dead-letter\")"
                );
                match self.send(txn, &record, true)? {
                    None => Ok(()),
                    Some(error) => Err(delivery_failed(error, topic, id, commit_lsn)),
                }
            }
        }
    }

    /// A failed delivery report: a suspect's verdict, a new suspect, or a plain failure.
    pub(super) fn on_failed_delivery(&mut self, tag: &DeliveryTag, failure: DeliveryFailure) -> Result<(), RelayError> {
        let event = EventRef {
            commit_lsn: tag.commit_lsn,
            seq: tag.event_seq,
        };
        let refused = !tag.dead_letter && is_record_rejection(&failure.error);
        let verdict = refused && matches!(&self.phase, Phase::Holding(h) if h.sent && h.txn.event == event);
        if let (true, Some(held)) = (verdict, self.phase.take_held()) {
            info!(
                id = %String::from_utf8_lossy(&held.event.id),
                commit_lsn = %tag.commit_lsn,
                "Kafka refused the suspect event again on its own: it is a bad event"
            );
            let cause = BadEvent::Rejected(failure.error.to_string());
            return match self.bad_event(&held.txn, &held.event.id, cause, &held.raw, false) {
                // Skipped, or replaced by its dead letter (counted in flight by now).
                Ok(()) => Ok(self.watermark.acked(tag.ticket, tag.bytes)?),
                Err(e) => {
                    self.watermark.failed(tag.ticket, tag.bytes)?;
                    Err(e)
                }
            };
        }
        self.watermark.failed(tag.ticket, tag.bytes)?;
        if refused {
            self.suspects.insert(event, failure.error.to_string());
            return Err(RelayError::RecordRejected {
                failure: Box::new(failure),
                commit_lsn: tag.commit_lsn,
            });
        }
        Err(RelayError::DeliveryFailed {
            failure: Box::new(failure),
            commit_lsn: tag.commit_lsn,
        })
    }

    /// An acknowledgement: if it is the held suspect's, that event was innocent.
    pub(super) fn held_accepted(&mut self, tag: &DeliveryTag) {
        let event = EventRef {
            commit_lsn: tag.commit_lsn,
            seq: tag.event_seq,
        };
        if tag.dead_letter || !self.phase.held().is_some_and(|h| h.sent && h.txn.event == event) {
            return;
        }
        info!(commit_lsn = %tag.commit_lsn, seq = tag.event_seq, "Kafka accepted the suspect event on its own: it only shared a batch with a bad record");
        self.suspects.clear(event);
        self.phase.take_held();
    }

    /// Sends the held suspect once nothing else is in flight (so it travels in a batch of its own).
    pub(super) fn release_held(&mut self) -> Result<(), RelayError> {
        let Phase::Holding(held) = &self.phase else {
            return Ok(());
        };
        if held.sent || self.watermark.in_flight_events() > 0 {
            return Ok(());
        }
        let Some(mut held) = self.phase.take_held() else {
            return Ok(());
        };
        info!(
            id = %String::from_utf8_lossy(&held.event.id),
            commit_lsn = %held.txn.commit_lsn(),
            earlier = %held.earlier,
            "sending alone an event Kafka refused earlier, to tell whether it is the bad one"
        );
        let settings = self.settings;
        let record = match held.event.record(&settings.router) {
            Ok(record) => record,
            // It was routed before it was held, and routing depends on nothing else.
            Err(cause) => return self.bad_event(&held.txn, &held.event.id, cause, &held.raw, false),
        };
        match self.send(&held.txn, &record, false)? {
            None => {
                held.sent = true;
                self.phase = Phase::Holding(held);
                Ok(())
            }
            Some(error) if is_record_rejection(&error) => self.bad_event(
                &held.txn,
                &held.event.id,
                BadEvent::Rejected(error.to_string()),
                &held.raw,
                false,
            ),
            Some(error) => Err(delivery_failed(
                error,
                &record.topic,
                &held.event.id,
                held.txn.commit_lsn(),
            )),
        }
    }
}

fn delivery_failed(error: KafkaError, topic: &str, id: &[u8], commit_lsn: Lsn) -> RelayError {
    RelayError::DeliveryFailed {
        failure: Box::new(DeliveryFailure {
            error,
            topic: topic.to_owned(),
            partition: -1,
            event_id: Some(String::from_utf8_lossy(id).into_owned()),
        }),
        commit_lsn,
    }
}
