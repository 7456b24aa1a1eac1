//! `setup --poll`: check the outbox table for polling and create the pending-rows index.
//!
//! The index is `(created_at) WHERE <dispatched> IS NULL`: it holds only pending rows, so it
//! stays small however large the table grows, and it is in claim order, so a claim reads
//! `batch_size` entries. Any valid btree index with that leading column and exactly that
//! predicate counts as present (both seed schemas ship one under their own name). It is built
//! `CONCURRENTLY`, so a live outbox keeps taking inserts meanwhile.
//!
//! Poll mode needs no `wal_level = logical`, slot or publication, so none is checked or created.
//! Idempotent: a second run finds the index and changes nothing.

use std::fmt;

use tokio_postgres::error::SqlState;

use super::error::PollError;
use super::sql::{create_pending_index, pending_index_name};
use super::table::{self, PollTable};
use crate::config::ident::Ident;
use crate::config::Settings;
use crate::control::describe;
use crate::control::preflight::column_list;

#[derive(Debug, Clone)]
pub(crate) struct PollSetupReport {
    pub(crate) table: PollTable,
    pub(crate) table_name: String,
    pub(crate) dispatched: Ident,
    pub(crate) index: IndexOutcome,
    /// What setup did or found on the sink's side.
    pub(crate) sink: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IndexOutcome {
    Created { name: String },
    AlreadyExists { name: String },
}

impl fmt::Display for PollSetupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let facts = &self.table.facts;
        writeln!(
            f,
            "preflight (poll): PostgreSQL {}, database {}, role {}",
            facts.server_version, facts.database, facts.role
        )?;
        writeln!(
            f,
            "preflight (poll): outbox table {}: {}",
            self.table_name,
            column_list(&facts.columns)
        )?;
        writeln!(
            f,
            "preflight (poll): poll.dispatched_column = {}; claims ordered by {}",
            self.dispatched, self.table.created_at
        )?;
        let shape = format!(
            "ON {} ({}) WHERE {} IS NULL",
            self.table_name, self.table.created_at, self.dispatched
        );
        match &self.index {
            IndexOutcome::Created { name } => writeln!(f, "pending index {name}: created ({shape})")?,
            IndexOutcome::AlreadyExists { name } => writeln!(f, "pending index {name}: already exists ({shape})")?,
        }
        for line in &self.sink {
            writeln!(f, "sink: {line}")?;
        }
        write!(
            f,
            "poll mode needs no replication slot or publication; start it with `outbox-relay poll`"
        )
    }
}

/// Checks the table and creates the pending-rows index if no usable one exists. Safe to repeat.
pub(crate) async fn setup(settings: &Settings) -> Result<PollSetupReport, PollError> {
    let client = crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout).await?;
    let table = table::check(&client, settings).await?;
    let table_name = settings.outbox.table.to_string();
    let invalid = |index: &table::PendingIndex| PollError::InvalidIndex {
        index: crate::config::ident::quote_ident(&index.name),
        table: settings.outbox.table.clone(),
        table_schema: crate::config::ident::quote_ident(&index.schema),
    };
    let index = match &table.pending_index {
        Some(index) if index.valid => IndexOutcome::AlreadyExists {
            name: index.name.clone(),
        },
        Some(index) => return Err(invalid(index)),
        None => {
            let name = pending_index_name(settings);
            let sql = create_pending_index(settings, &name, &table.created_at, table.facts.partitioned);
            if let Err(e) = client.batch_execute(&sql).await {
                let denied = e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
                return Err(if denied {
                    PollError::CreateIndex {
                        table: settings.outbox.table.clone(),
                        owner: table.facts.table_owner.clone(),
                        message: describe(&e),
                        sql,
                    }
                } else {
                    PollError::Query {
                        context: "creating the pending-rows index",
                        source: e,
                    }
                });
            }
            // IF NOT EXISTS also "succeeds" over an invalid leftover of that name: look again.
            let after = table::check(&client, settings).await?;
            match &after.pending_index {
                Some(index) if index.valid => IndexOutcome::Created {
                    name: index.name.clone(),
                },
                Some(index) => return Err(invalid(index)),
                None => {
                    return Err(PollError::CreateIndex {
                        table: settings.outbox.table.clone(),
                        owner: table.facts.table_owner.clone(),
                        message: format!("an object named {name:?} already exists and is not the pending-rows index"),
                        sql,
                    })
                }
            }
        }
    };
    let sink = crate::sink::prepare(settings).await.map_err(PollError::Sink)?;
    Ok(PollSetupReport {
        table,
        table_name,
        dispatched: settings.poll.dispatched.clone(),
        index,
        sink,
    })
}
