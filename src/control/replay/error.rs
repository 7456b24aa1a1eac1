//! [`ReplayError`]: every way `replay` can stop, each saying what to do next.

use crate::control::backfill::BackfillError;
use crate::control::{describe, ControlError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The command line asks for something impossible (exit code 2).
    #[error("{0}")]
    Usage(String),

    #[error(transparent)]
    Control(#[from] ControlError),

    #[error(transparent)]
    Rows(#[from] BackfillError),

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
