//! [`ReplayError`]: every way `replay` can stop, each saying what to do next.

use crate::control::backfill::BackfillError;
use crate::control::{describe, ControlError};
use crate::outbox::bad_event::BadEvent;
use crate::sink::SinkFailure;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The command line asks for something impossible (exit code 2).
    #[error("{0}")]
    Usage(String),

    #[error(transparent)]
    Control(#[from] ControlError),

    #[error(transparent)]
    Rows(BackfillError),

    #[error(
        "outbox row id={id} cannot be published: {cause}. Fix the row, or narrow the selection (--type, \
         --aggregate, --since/--until) to leave it out"
    )]
    BadRow { id: String, cause: BadEvent },

    #[error("{sink} did not acknowledge a replayed event: {failure}. Check the brokers")]
    Delivery {
        sink: &'static str,
        failure: Box<SinkFailure>,
    },

    #[error("{0}")]
    State(String),

    #[error("selecting the rows to replay (WHERE {condition}): {}", describe(.source))]
    Selection {
        condition: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error(
        "the replay was interrupted after {acknowledged} rows acknowledged; its position is saved in {state}. Run \
         the same command with --resume to continue without re-sending them"
    )]
    Interrupted { acknowledged: u64, state: String },

    #[error(
        "the replay stopped: {cause}. {acknowledged} rows were acknowledged and are saved in {state}; fix the cause, \
         then run the same command with --resume to continue (rows in flight at the failure are sent again; \
         consumers deduplicate on the id header)"
    )]
    Stopped {
        acknowledged: u64,
        state: String,
        cause: Box<ReplayError>,
    },
}

impl ReplayError {
    /// A usage error (exit 2) rather than a runtime failure (exit 1).
    pub(crate) fn is_usage(&self) -> bool {
        matches!(self, ReplayError::Usage(_))
    }
}

/// The publisher's errors, worded for `replay` (the backfill's name `setup --backfill` as the fix).
impl From<BackfillError> for ReplayError {
    fn from(e: BackfillError) -> ReplayError {
        match e {
            BackfillError::BadRow { id, cause } => ReplayError::BadRow { id, cause },
            BackfillError::Delivery { sink, failure } => ReplayError::Delivery { sink, failure },
            other => ReplayError::Rows(other),
        }
    }
}
