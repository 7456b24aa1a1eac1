//! What can go wrong while removing old outbox rows, split into what the next interval retries
//! (a lost connection, a lock or statement timeout, a serialization conflict) and what needs an
//! operator (a missing privilege or column, a table that is not partitioned as configured).
//! Either way only retention stops or waits: publishing never depends on it.

use crate::postgres::client::ConnectError;
use crate::postgres::failure::{describe_pg, is_transient_pg, pg_hint};
use crate::postgres::slot::SlotQueryError;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("retention cannot connect: {0}")]
    Connect(#[from] ConnectError),
    #[error("retention on {table}: {what} failed: {}{}", describe_pg(.source), hint(.source))]
    Query {
        table: String,
        what: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("retention cannot read the replication slot: {0}")]
    Slot(#[from] SlotQueryError),
    #[error("the server returned a WAL position retention cannot read: {text:?}")]
    Lsn { text: String },
    #[error(
        "retention on {table}: the table has no column {column} to age rows by. Set retention.timestamp_column (or \
         outbox.timestamp_column) to the rows' creation-time column"
    )]
    NoTimestampColumn { table: String, column: String },
    #[error(
        "retention.mode = \"partitions\", but {table} is not partitioned by range of {column} alone ({found}). Create \
         it with `PARTITION BY RANGE ({column})`, or use retention.mode = \"delete\""
    )]
    NotPartitioned {
        table: String,
        column: String,
        found: String,
    },
    #[error(
        "retention on {table} (retention.mode = \"{mode}\") needs {needs}, which role {role} lacks, so it would stop \
         at its first run while publishing went on. {fix}"
    )]
    Privilege {
        table: String,
        mode: &'static str,
        role: String,
        /// What is missing, for people: "DELETE on the table".
        needs: String,
        /// The statement or change that grants it.
        fix: String,
    },
    #[error(
        "retention on {table}: partition names are the table's name plus \"_p\" and 10 digits, which exceeds \
         PostgreSQL's 63-byte limit; rename the table or create partitions yourself and use retention.mode = \"delete\""
    )]
    PartitionNameTooLong { table: String },
}

fn hint(e: &tokio_postgres::Error) -> String {
    pg_hint(e).map(|h| format!(". Hint: {h}")).unwrap_or_default()
}

/// SQLSTATE of a lock that was not granted within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

impl RetentionError {
    pub(crate) fn query(table: &impl ToString, what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let table = table.to_string();
        move |source| RetentionError::Query { table, what, source }
    }

    /// True when the next interval can succeed without anyone changing anything.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            RetentionError::Connect(e) => e.is_transient(),
            RetentionError::Query { source, .. } => {
                is_transient_pg(source)
                    || source
                        .as_db_error()
                        .is_some_and(|db| db.code().code() == LOCK_NOT_AVAILABLE)
            }
            RetentionError::Slot(e) => e.postgres().is_some_and(is_transient_pg),
            RetentionError::Lsn { .. } => true,
            RetentionError::NoTimestampColumn { .. }
            | RetentionError::NotPartitioned { .. }
            | RetentionError::Privilege { .. }
            | RetentionError::PartitionNameTooLong { .. } => false,
        }
    }

    /// The metric label of the error's kind.
    pub(crate) fn kind(&self) -> &'static str {
        if self.is_transient() {
            "transient"
        } else {
            "fatal"
        }
    }
}
