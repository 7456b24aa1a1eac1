//! [`BackfillError`]: every way `setup --backfill` can stop, each phrased as problem + fix.

use crate::config::ident::{Ident, TableName};
use crate::control::{describe, ControlError};
use crate::outbox::bad_event::BadEvent;
use crate::postgres::replication::error::ReplicationError;
use crate::sink::{SinkError, SinkFailure};

#[derive(Debug, thiserror::Error)]
pub(crate) enum BackfillError {
    #[error(transparent)]
    Control(#[from] ControlError),

    #[error(
        "replication slot {slot} already exists, and a backfill needs the snapshot exported at the moment the slot \
         is created (rows before it are backfilled, rows after it are streamed). If the relay already streams from \
         {slot}, no backfill is needed: run plain `outbox-relay setup`. If {slot} is left over from an interrupted \
         `setup --backfill` and nothing ever streamed from it, drop it (SELECT pg_drop_replication_slot('{slot}')) \
         and run `setup --backfill` again"
    )]
    SlotExists { slot: String },

    #[error(
        "the backfill column {key} = {column} is not a column of {table} (its columns are: {}). Set {key} to the \
         column your polling relayer sets when it has published a row (NULL = still pending), e.g. dispatched_at",
        .columns.join(", ")
    )]
    DispatchedColumnMissing {
        key: &'static str,
        column: Ident,
        table: TableName,
        columns: Vec<String>,
    },

    #[error("{context}: {source}")]
    Replication {
        context: &'static str,
        // Boxed to keep the error small (clippy::result_large_err).
        #[source]
        source: Box<ReplicationError>,
    },

    #[error("{context}: {}", describe(.source))]
    Query {
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error("{0}")]
    Producer(SinkError),

    #[error(
        "pending outbox row id={id} cannot be published: {cause}. Fix the row (or mark it dispatched if it must not \
         be sent), then run `setup --backfill` again"
    )]
    BadRow { id: String, cause: BadEvent },

    #[error("{sink} did not acknowledge a backfilled event: {failure}. Check the brokers, then run `setup --backfill` again")]
    Delivery {
        sink: &'static str,
        failure: Box<SinkFailure>,
    },

    #[error("{0}")]
    Unsupported(String),

    #[error("internal bookkeeping error (a bug in outbox-relay; please report it): {0}")]
    Internal(String),

    #[error(
        "the backfill stopped: {cause}. Slot {slot} was dropped again, so nothing is half done; events already \
         published will be published once more by the next attempt (consumers deduplicate on the id header)"
    )]
    RolledBack { slot: String, cause: Box<BackfillError> },

    #[error(
        "the backfill stopped: {cause}. Dropping slot {slot} afterwards failed too ({drop_error}); drop it yourself \
         (SELECT pg_drop_replication_slot('{slot}')) before running `setup --backfill` again"
    )]
    SlotLeftBehind {
        slot: String,
        cause: Box<BackfillError>,
        drop_error: String,
    },
}

impl BackfillError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> BackfillError {
        move |source| BackfillError::Query { context, source }
    }

    pub(super) fn replication(context: &'static str) -> impl FnOnce(ReplicationError) -> BackfillError {
        move |source| BackfillError::Replication {
            context,
            source: Box::new(source),
        }
    }
}
