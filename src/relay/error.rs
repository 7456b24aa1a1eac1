//! Why a streaming session ended, and whether the supervisor reconnects or stops.

use crate::lsn::Lsn;
use crate::outbox_event::{BadEvent, LayoutError};
use crate::pg_client::ConnectError;
use crate::pgoutput::DecodeError;
use crate::publisher::DeliveryFailure;
use crate::replication::error::ReplicationError;
use crate::watermark::WatermarkError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("control query failed: {0}")]
    Control(#[from] tokio_postgres::Error),
    #[error(
        "replication slot {slot:?} does not exist in this database. Create it with `outbox-relay setup --config …` \
         (if it existed before, it was dropped: events in WAL it retained may be gone — see docs/operations.md)"
    )]
    SlotMissing { slot: String },
    #[error("replication slot {slot:?} uses plugin {plugin:?}; outbox-relay needs a pgoutput logical slot. Drop it or configure another postgres.slot")]
    WrongSlotPlugin { slot: String, plugin: String },
    #[error(
        "replication slot {slot:?} is invalidated (wal_status = lost): the WAL it needed was removed, so events written \
         while it lagged may never be delivered. Recover: drop the slot (outbox-relay teardown --yes), run setup, and \
         backfill the outbox rows committed since {confirmed} (docs/operations.md)"
    )]
    SlotLost { slot: String, confirmed: Lsn },
    #[error("cannot create the Kafka producer: {0}. Check the [kafka] properties")]
    ProducerConfig(rdkafka::error::KafkaError),
    #[error("Kafka delivery failed for the transaction committed at {commit_lsn}: {failure}; replaying from the last confirmed LSN")]
    DeliveryFailed { failure: Box<DeliveryFailure>, commit_lsn: Lsn },
    #[error(
        "outbox event id={id} (transaction committed at {commit_lsn}) cannot be published: {cause}. Nothing after it is \
         confirmed; fix or remove the row's transaction effect, then restart"
    )]
    BadEvent { id: String, commit_lsn: Lsn, cause: BadEvent },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("undecodable pgoutput message after {lsn}: {source}")]
    Decode { lsn: Lsn, source: DecodeError },
    #[error("undecodable replication frame: {0}")]
    Frame(String),
    #[error("internal bookkeeping error (a bug; please report it): {0}")]
    Watermark(#[from] WatermarkError),
    #[error("replication protocol: {0}")]
    Protocol(String),
}

impl RelayError {
    /// Whether reconnecting (with backoff) can fix this without an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            RelayError::Replication(e) => e.is_transient(),
            RelayError::Connect(ConnectError::Tls(_)) => false,
            RelayError::Connect(_) | RelayError::Control(_) | RelayError::DeliveryFailed { .. } => true,
            RelayError::SlotMissing { .. }
            | RelayError::WrongSlotPlugin { .. }
            | RelayError::SlotLost { .. }
            | RelayError::ProducerConfig(_)
            | RelayError::BadEvent { .. }
            | RelayError::Layout(_)
            | RelayError::Decode { .. }
            | RelayError::Frame(_)
            | RelayError::Watermark(_)
            | RelayError::Protocol(_) => false,
        }
    }

    /// Another instance holds the slot: this one is a standby.
    pub fn is_slot_busy(&self) -> bool {
        matches!(self, RelayError::Replication(e) if e.sqlstate() == Some("55006"))
    }
}
