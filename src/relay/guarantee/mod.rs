//! The delivery guarantee of one session: one trait, [`Guarantee`], and one implementation per
//! strategy, chosen once at session start ([`start`]) from `relay.delivery` and what the sink
//! declares it can do (`sink::ExactlyOnce`):
//!
//! | `relay.delivery` | the sink declares | strategy | file |
//! |---|---|---|---|
//! | `at-least-once` | anything | everything after the slot's position is published again | `at_least_once.rs` |
//! | `exactly-once` | the broker deduplicates | replays carry a deduplication key the broker drops repeats by | `broker_dedup.rs` |
//! | `exactly-once` | its records can be read back | a replay skips what a read-back of its destination finds | `read_back.rs` |
//! | `exactly-once` | it commits records in units | one sink transaction per batch of whole source transactions, sealed with a checkpoint | `transactions.rs` |
//!
//! Invariant: [`start`] is the only code that branches on the delivery mode; everything else
//! asks the chosen strategy (the trait's methods) and gets its answer. The stream shows it what
//! it reached and each record before it is sent ([`Guarantee::admit`], [`Guarantee::stamp`],
//! [`Guarantee::sent`]); the strategy answers, and drives the seal cap through
//! [`Durability`]'s narrow API — it never makes a flush LSN itself. Takeover liveness, which
//! every mode needs, is not a strategy's: `liveness.rs`.

mod at_least_once;
mod broker_dedup;
mod position;
mod read_back;
mod transactions;
mod window;

use std::time::Instant;

use tokio::sync::mpsc;

use super::durability::Durability;
use super::error::RelayError;
use super::publish::DeliveryTag;
use super::quarantine::EventRef;
use super::takeover::Predecessor;
use crate::config::relay::Delivery;
use crate::config::Settings;
use crate::postgres::lsn::Lsn;
use crate::sink::{ExactlyOnce, Sink, SinkError, SinkFailure, SinkWithCompletions};

#[cfg(test)]
pub(crate) use position::{HEADER_COMMIT_LSN, HEADER_INDEX, HEADER_SOURCE};

/// What to do with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Send,
    /// The sink already holds it.
    Skip,
    /// The strategy must look first (a read-back); come back with the same event.
    Wait,
}

/// Where a record goes, as the strategy sees it before the record is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound<'a> {
    /// The routed destination.
    pub(crate) destination: &'a str,
    pub(crate) key: &'a [u8],
    /// A placement chosen by the caller (`[debezium]` partition placement).
    pub(crate) placement: Option<i32>,
}

/// What [`Guarantee::stamp`] adds to a record: position headers and a broker deduplication key.
#[derive(Debug, Default)]
pub(crate) struct Stamp<'b> {
    pub(crate) headers: Option<[(&'static str, &'b [u8]); 3]>,
    pub(crate) dedup_key: Option<String>,
}

/// An answer to a strategy's own background work (a read-back), for [`Guarantee::on_answer`].
pub(crate) struct Answer(read_back::Done);

/// Where a strategy's answers arrive (the event loop's read-back arm).
pub(crate) type Answers = mpsc::UnboundedReceiver<Answer>;

/// What the event loop shows while a strategy holds the stream back (a takeover's fence).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HoldNote {
    pub(crate) text: String,
    pub(crate) seconds_left: f64,
}

/// One delivery strategy (module docs). Every method has the at-least-once answer as its
/// default: admit everything, stamp nothing, hold nothing.
pub(crate) trait Guarantee: Send {
    /// `relay.delivery` and the strategy, for logs: "exactly-once (read-back)".
    fn label(&self) -> &'static str;

    /// The stream reached `lsn` (a keepalive's end, a transaction's commit LSN).
    fn reached(&mut self, lsn: Lsn) {
        let _ = lsn;
    }

    /// Whether the record of the event at `at`, bound for `to`, goes out; `dead_letter`: where
    /// its dead letter would go, should the sink refuse it — looked at now, so that the dead
    /// letter never has to wait. `may_wait`: nothing of the event was sent yet, so it may be
    /// made to wait ([`Verdict::Wait`]); otherwise the answer is `Send` or `Skip`.
    fn admit(&mut self, at: EventRef, to: Bound<'_>, dead_letter: Option<&str>, may_wait: bool) -> Verdict {
        let _ = (at, to, dead_letter, may_wait);
        Verdict::Send
    }

    /// What a record of the event at `at` carries for the strategy.
    fn stamp<'b>(&'b self, at: EventRef, buf: &'b mut [u8; 40]) -> Stamp<'b> {
        let _ = (at, buf);
        Stamp::default()
    }

    /// A record of the source transaction committed at `commit_lsn` was handed to the sink.
    fn sent(&mut self, commit_lsn: Lsn, durability: &mut Durability) {
        let _ = (commit_lsn, durability);
    }

    /// Whether sending waits for the strategy: by default while as many records of committed
    /// transactions await confirmation as the in-flight budget (what a crash would replay).
    /// `at_boundary`: no source transaction is open and nothing waits.
    fn pauses_sending(&self, durability: &Durability, max_in_flight: usize, at_boundary: bool) -> bool {
        let _ = at_boundary;
        durability.committed_unconfirmed_events() >= max_in_flight
    }

    /// At a source-transaction boundary: seals what was sent since the previous seal, if a seal
    /// is due; `nothing_ready`: the stream has nothing more to send at once.
    fn seal_if_due(&mut self, nothing_ready: bool, now: Instant) -> Result<(), RelayError> {
        let _ = (nothing_ready, now);
        Ok(())
    }

    /// The sink's answer to the seal under way.
    fn sealed(&mut self, outcome: Result<(), SinkFailure>, durability: &mut Durability) -> Result<(), RelayError> {
        let _ = (outcome, durability);
        Err(super::error::InternalError::CompletionsClosed.into())
    }

    /// A seal is under way (the wind-down waits for it like a delivery).
    fn sealing(&self) -> bool {
        false
    }

    /// Whether the sink's refusal of a record dooms the unit it was sent in (a sink
    /// transaction that can no longer commit).
    fn refusal_dooms_unit(&self) -> bool {
        false
    }

    /// Whether a streamed source transaction whose first block arrives now, with the stream at
    /// `received`, may be produced before its commit (`relay/early.rs`): only a strategy whose
    /// units can still be aborted says yes. Default: no, it is published at its commit.
    fn may_produce_early(&self, received: Lsn) -> bool {
        let _ = received;
        false
    }

    /// A record of a streamed transaction not committed yet was handed to the sink: the unit
    /// it went into must not be sealed before that transaction's commit.
    fn early_sent(&mut self, durability: &mut Durability) {
        let _ = durability;
    }

    /// The transaction produced early committed at `commit_lsn`: its unit may be sealed once
    /// the rest of it was sent.
    fn early_committed(&mut self, commit_lsn: Lsn) {
        let _ = commit_lsn;
    }

    /// The transaction produced early may never be committed as sent (it aborted, or it falls
    /// back to the stage): the unit holding its records is aborted. The abort's completion is
    /// a seal's ([`sealed`](Self::sealed)); nothing is sent until it arrived. `Ok(false)`: no
    /// unit was open (nothing of it was sent), nothing to abort.
    fn abort_early(&mut self, why: &str) -> Result<bool, RelayError> {
        let _ = why;
        Ok(false)
    }

    /// An answer to the strategy's own background work arrived.
    fn on_answer(&mut self, answer: Answer) -> Result<(), RelayError> {
        let _ = answer;
        Ok(())
    }

    /// What the stream is held back by now, for `/readyz` (`None`: nothing).
    fn hold_note(&mut self, now: Instant) -> Option<HoldNote> {
        let _ = now;
        None
    }

    /// Events skipped because the sink held them already.
    fn skipped(&self) -> u64 {
        0
    }

    /// The session ends: the strategy says what it found.
    fn finish(self: Box<Self>) {}
}

/// The relay's sink and its completions, tagged with [`DeliveryTag`]s.
pub(crate) type RelaySink = Box<dyn Sink<DeliveryTag>>;

/// What a session starts with, from [`start`].
pub(crate) struct Chosen {
    pub(crate) guarantee: Box<dyn Guarantee>,
    pub(crate) sink: RelaySink,
    pub(crate) completions: crate::sink::Completions<DeliveryTag>,
    /// `Some` for a strategy that works in the background.
    pub(crate) answers: Option<Answers>,
}

/// What [`start`] needs of the session: the slot is the session's by now.
pub(crate) struct Start<'a> {
    pub(crate) control: &'a tokio_postgres::Client,
    pub(crate) system_id: &'a str,
    /// The slot's confirmed position: where the stream starts.
    pub(crate) slot_start: Lsn,
    pub(crate) predecessor: &'a Predecessor,
}

/// Chooses the session's strategy — the one decision on the delivery mode — and creates the
/// sink it needs. Called once the slot is the session's: a transactional sink fences earlier
/// producers of its identity when it is created, and a holder must never fence the one that
/// holds the slot.
pub(crate) async fn start(settings: &Settings, at: &Start<'_>) -> Result<Chosen, RelayError> {
    let max = settings.relay.max_in_flight;
    match (settings.relay.delivery, crate::sink::exactly_once(settings)) {
        (Delivery::AtLeastOnce, _) => {
            let sink = crate::sink::create(settings, max, crate::sink::Purpose::Plain).await;
            chosen(Box::new(at_least_once::AtLeastOnce), sink)
        }
        (Delivery::ExactlyOnce, ExactlyOnce::BrokerDeduplicates) => {
            let guarantee = broker_dedup::BrokerDedup::start(settings, at).await?;
            chosen(
                Box::new(guarantee),
                crate::sink::create(settings, max, crate::sink::Purpose::Deduplicating).await,
            )
        }
        (Delivery::ExactlyOnce, ExactlyOnce::ReadBack(source)) => {
            let (guarantee, answers) = read_back::ReadBack::start(settings, at, source).await?;
            let mut chosen = chosen(
                Box::new(guarantee),
                crate::sink::create(settings, max, crate::sink::Purpose::ReadBack).await,
            )?;
            chosen.answers = Some(answers);
            Ok(chosen)
        }
        (Delivery::ExactlyOnce, ExactlyOnce::Transactions) => {
            let sink = crate::sink::create_transactional(settings, max)
                .await
                .map_err(RelayError::Sink)?;
            let guarantee = transactions::Transactions::new(settings, at.system_id, sink.sealer, sink.checkpoint);
            Ok(Chosen {
                guarantee: Box::new(guarantee),
                sink: sink.sink,
                completions: sink.completions,
                answers: None,
            })
        }
        // Refused before anything connects (`sink::refusal`), with the same words.
        (Delivery::ExactlyOnce, ExactlyOnce::Unsupported(reason)) => {
            Err(RelayError::Refused(crate::sink::StartRefusal::ExactlyOnceUnsupported {
                sink: settings.sink.label(),
                reason: reason.into_owned(),
            }))
        }
    }
}

/// `guarantee` over the sink made for it.
fn chosen(
    guarantee: Box<dyn Guarantee>,
    sink: Result<SinkWithCompletions<DeliveryTag>, SinkError>,
) -> Result<Chosen, RelayError> {
    let (sink, completions) = sink.map_err(RelayError::Sink)?;
    Ok(Chosen {
        guarantee,
        sink,
        completions,
        answers: None,
    })
}

/// What the operator should know at start about the strategy the configuration chooses.
pub(crate) fn warnings(settings: &Settings) -> Vec<String> {
    match (settings.relay.delivery, crate::sink::exactly_once(settings)) {
        (Delivery::ExactlyOnce, ExactlyOnce::ReadBack(source)) => read_back::warnings(settings, &*source),
        (Delivery::AtLeastOnce, ExactlyOnce::Transactions) => vec![format!(
            "the {} section asks for sink transactions, which only exactly-once delivery uses: with \
             relay.delivery = \"at-least-once\" the relay publishes without them. Set relay.delivery = \
             \"exactly-once\", or remove the section's exactly-once key",
            settings.sink.label()
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Strategies for the stream's unit tests, without a database or a broker.
    use super::*;
    use crate::sink::memory::MemoryHandle;

    /// The strategy `settings` chooses, with an empty replay window (it ends where the stream
    /// starts, at `start`); sink transactions seal through the in-memory sink `handle`.
    pub(crate) fn chosen_for(
        settings: &Settings,
        start: Lsn,
        handle: &MemoryHandle<DeliveryTag>,
    ) -> Box<dyn Guarantee> {
        match (settings.relay.delivery, crate::sink::exactly_once(settings)) {
            (Delivery::AtLeastOnce, _) => Box::new(at_least_once::AtLeastOnce),
            (Delivery::ExactlyOnce, ExactlyOnce::Transactions) => Box::new(transactions::Transactions::new(
                settings,
                "7000",
                Box::new(handle.sealer()),
                None,
            )),
            (Delivery::ExactlyOnce, ExactlyOnce::BrokerDeduplicates) => Box::new(broker_dedup::BrokerDedup::new(
                settings,
                "7000",
                window::ReplayWindow::new(start, start),
            )),
            (Delivery::ExactlyOnce, ExactlyOnce::ReadBack(sink)) => {
                let window = window::ReplayWindow::new(start, start);
                Box::new(read_back::ReadBack::new(settings, sink, "7000", window, None).0)
            }
            (Delivery::ExactlyOnce, ExactlyOnce::Unsupported(reason)) => panic!("exactly-once refused: {reason}"),
        }
    }
}
