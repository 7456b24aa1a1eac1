//! `setup --poll`: check each outbox table for polling and create its pending-rows index (every
//! table of `outbox.table`, in order; the first failure stops setup and names the table).
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
use crate::config::ident::{Ident, TableName};
use crate::config::Settings;
use crate::control::describe;
use crate::control::preflight::column_list;
use crate::control::write_rows;

#[derive(Debug, Clone)]
pub(crate) struct PollSetupReport {
    /// One entry per outbox table, in `outbox.table` order.
    pub(crate) tables: Vec<TableSetup>,
    pub(crate) dispatched: Ident,
    /// What setup did or found on the sink's side.
    pub(crate) sink: Vec<String>,
    /// What setup found of `[retention]`, one line per outbox table (empty: not configured).
    pub(crate) retention: Vec<String>,
}

/// What setup found and did for one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct TableSetup {
    pub(crate) table: PollTable,
    pub(crate) table_name: String,
    pub(crate) index: IndexOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IndexOutcome {
    Created { name: String },
    AlreadyExists { name: String },
}

impl fmt::Display for PollSetupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(first) = self.tables.first() {
            let facts = &first.table.facts;
            writeln!(
                f,
                "preflight (poll): PostgreSQL {}, database {}, role {}",
                facts.server_version, facts.database, facts.role
            )?;
        }
        for t in &self.tables {
            writeln!(
                f,
                "preflight (poll): outbox table {}: {}",
                t.table_name,
                column_list(&t.table.facts.columns)
            )?;
            writeln!(
                f,
                "preflight (poll): poll.dispatched_column = {}; claims ordered by {}",
                self.dispatched, t.table.created_at
            )?;
            let shape = format!(
                "ON {} ({}) WHERE {} IS NULL",
                t.table_name, t.table.created_at, self.dispatched
            );
            match &t.index {
                IndexOutcome::Created { name } => writeln!(f, "pending index {name}: created ({shape})")?,
                IndexOutcome::AlreadyExists { name } => writeln!(f, "pending index {name}: already exists ({shape})")?,
            }
        }
        write_rows(f, "sink", &self.sink)?;
        write_rows(f, "retention", &self.retention)?;
        write!(
            f,
            "poll mode needs no replication slot or publication; start it with `outbox-relay poll`"
        )
    }
}

/// Checks every outbox table and creates its pending-rows index if no usable one exists. Safe
/// to repeat.
pub(crate) async fn setup(settings: &Settings) -> Result<PollSetupReport, PollError> {
    // What `poll` would refuse, refused before anything is created.
    super::refusal(settings)?;
    let client = crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout).await?;
    let mut tables = Vec::with_capacity(settings.outbox.tables.len());
    for outbox in &settings.outbox.tables {
        tables.push(setup_table(&client, settings, outbox).await?);
    }
    let retention = crate::retention::check(&client, settings).await?;
    let sink = crate::sink::prepare(settings).await.map_err(PollError::Sink)?;
    Ok(PollSetupReport {
        tables,
        dispatched: settings.poll.dispatched.clone(),
        sink,
        retention,
    })
}

/// Checks `outbox` and creates its pending-rows index if no usable one exists.
async fn setup_table(
    client: &tokio_postgres::Client,
    settings: &Settings,
    outbox: &TableName,
) -> Result<TableSetup, PollError> {
    let table = table::check(client, settings, outbox).await?;
    let table_name = outbox.to_string();
    let invalid = |index: &table::PendingIndex| PollError::InvalidIndex {
        index: crate::config::ident::quote_ident(&index.name),
        table: outbox.clone(),
        table_schema: crate::config::ident::quote_ident(&index.schema),
    };
    let index = match &table.pending_index {
        Some(index) if index.valid => IndexOutcome::AlreadyExists {
            name: index.name.clone(),
        },
        Some(index) => return Err(invalid(index)),
        None => {
            let name = pending_index_name(settings, outbox);
            let sql = create_pending_index(settings, outbox, &name, &table.created_at, table.facts.partitioned);
            if let Err(e) = client.batch_execute(&sql).await {
                let denied = e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
                return Err(if denied {
                    PollError::CreateIndex {
                        table: outbox.clone(),
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
            let after = table::check(client, settings, outbox).await?;
            match &after.pending_index {
                Some(index) if index.valid => IndexOutcome::Created {
                    name: index.name.clone(),
                },
                Some(index) => return Err(invalid(index)),
                None => {
                    return Err(PollError::CreateIndex {
                        table: outbox.clone(),
                        owner: table.facts.table_owner.clone(),
                        message: format!("an object named {name:?} already exists and is not the pending-rows index"),
                        sql,
                    })
                }
            }
        }
    };
    Ok(TableSetup {
        table,
        table_name,
        index,
    })
}
