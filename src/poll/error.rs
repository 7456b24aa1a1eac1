//! [`PollError`]: why the polling relayer stopped a batch, and whether it may try again.

use tokio_postgres::error::SqlState;

use crate::config::ident::TableName;
use crate::control::{describe, ControlError};
use crate::outbox::bad_event::BadEvent;
use crate::postgres::client::ConnectError;
use crate::sink::{SinkError, SinkFailure};

#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    #[error(transparent)]
    Connect(#[from] ConnectError),

    #[error(transparent)]
    Table(ControlError),

    /// `[tracing]`'s exporter could not be built (`ops::tracing_export::ExporterError`'s text).
    #[error("{0}")]
    Tracing(String),

    #[error("{context}: {}", describe(.source))]
    Query {
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error(
        "column {column} (poll.dispatched_column) is not in table {table} (it has: {present}). Set \
         poll.dispatched_column to the column a published row gets its timestamp in — dispatched_at in the \
         events_outbox schema, processed_at in the outbox schema — or add it: ALTER TABLE {table} ADD COLUMN \
         {column} timestamptz"
    )]
    DispatchedColumnMissing {
        column: String,
        table: TableName,
        present: String,
    },

    #[error(
        "column {column} (poll.dispatched_column) of {table} is {type_name}{not_null}; the polling relayer needs a \
         nullable timestamptz (or timestamp) column: NULL marks a pending row. Point poll.dispatched_column at such a \
         column"
    )]
    DispatchedColumnType {
        column: String,
        table: TableName,
        type_name: String,
        not_null: &'static str,
    },

    #[error(
        "the polling relayer orders claims by creation time, but {table} has no column {column}. Set \
         retention.timestamp_column or outbox.timestamp_column to the column holding each row's creation time \
         (created_at when neither is set)"
    )]
    CreatedAtMissing { column: String, table: TableName },

    #[error(
        "role {role} may not UPDATE {table}, which marks published rows. Run (as the table owner or a superuser): \
         GRANT UPDATE ({column}) ON {table} TO {}",
        crate::config::ident::quote_ident(.role)
    )]
    NoUpdatePrivilege {
        role: String,
        table: TableName,
        column: String,
    },

    #[error(
        "creating the pending-rows index on {table} failed: {message}. Have the table's owner ({owner}) or a \
         superuser run: {sql}"
    )]
    CreateIndex {
        table: TableName,
        owner: String,
        message: String,
        sql: String,
    },

    #[error(
        "index {index} on {table} is INVALID (an earlier CREATE INDEX CONCURRENTLY was interrupted). Run \
         DROP INDEX CONCURRENTLY {table_schema}.{index}; then run setup --poll again"
    )]
    InvalidIndex {
        index: String,
        table: TableName,
        table_schema: String,
    },

    #[error(
        "event id={id} cannot be published: {cause}. The polling relayer stops rather than skip it (skipping would \
         lose the event). Repair the row, or — if it must be dropped — mark it handled with UPDATE … SET \
         <dispatched column> = now() WHERE <id column> = '{id}', then restart"
    )]
    BadEvent { id: String, cause: BadEvent },

    #[error(
        "relay.on_bad_event = \"{policy}\" is not supported by `poll`: the polling relayer always stops on a row it \
         cannot publish, leaving it pending (nothing is skipped or dead-lettered). Set relay.on_bad_event = \"fail\" \
         (the default) in the config `poll` runs with"
    )]
    UnsupportedBadEventPolicy { policy: &'static str },

    /// `[retention]` does not fit an outbox table (`setup --poll` checks it as `setup` does).
    #[error(transparent)]
    Retention(#[from] crate::retention::RetentionError),

    #[error("{0}")]
    Sink(#[source] SinkError),

    #[error("{sink} did not take a claimed batch ({failure}); the batch was rolled back and will be claimed again")]
    Delivery {
        sink: &'static str,
        failure: Box<SinkFailure>,
    },

    #[error("the sink stopped reporting deliveries; the batch was rolled back and will be claimed again")]
    ProducerGone,

    #[error("a poll worker crashed: {message}. This is a bug; please report it with the log")]
    WorkerPanicked { message: String },

    #[error(
        "marking the batch published updated {marked} of {claimed} claimed rows: some id values do not survive a \
         text round trip through the id column's type ({id_type}), so those rows would be published again on every \
         poll. Use an id column whose text form parses back to the same value (bigint, uuid, text)"
    )]
    MarkedFewer {
        claimed: usize,
        marked: u64,
        id_type: String,
    },
}

impl PollError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> PollError {
        move |source| PollError::Query { context, source }
    }

    /// Worth another attempt after a pause: the database or Kafka was unreachable or busy. The
    /// claimed batch was rolled back, so its rows are claimed again; nothing is lost.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            PollError::Connect(e) | PollError::Table(ControlError::Connect(e)) => e.is_transient(),
            PollError::Delivery { .. } | PollError::ProducerGone => true,
            PollError::Sink(e) => e.transient,
            PollError::Table(ControlError::Query { source, .. }) | PollError::Query { source, .. } => {
                transient_pg(source)
            }
            _ => false,
        }
    }

    /// The PostgreSQL connection cannot be used any more and must be reopened.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            PollError::Query { source, .. } => source.is_closed() || source.as_db_error().is_none(),
            PollError::Connect(_) | PollError::Table(_) => true,
            _ => false,
        }
    }
}

/// Connection loss, server shutdown, lock conflicts and resource shortages pass; errors in what
/// we asked for (a dropped column, a revoked privilege) do not.
fn transient_pg(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else { return true };
    let code = db.code();
    let class = &code.code()[..2];
    matches!(class, "08" | "40" | "53" | "57" | "58") || *code == SqlState::LOCK_NOT_AVAILABLE
}
