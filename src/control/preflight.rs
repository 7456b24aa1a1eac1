//! Preflight: everything that must hold before the relay can create its slot or stream from it.
//!
//! Checks run cheapest-and-most-fundamental first (server version, standby, `wal_level`, role
//! privileges — those `run` checks, `postgres/role.rs`), then each outbox table (`outbox.table` may list several) and its mapped columns —
//! every error names the table it is about — then the state of the slot and the
//! publication, and last the server's free capacity (a slot and a WAL sender). The first failed
//! check is returned as a [`ControlError`] that says what to change; everything that is merely
//! worth knowing lands in [`PreflightReport::notes`].
//!
//! A missing slot or publication is not an error here (setup creates them); `run` checks its
//! slot itself (`relay/slot.rs`). A publication that exists but lacks the
//! outbox table is an error only when the connected role does not own it — its owner's setup
//! adds the table (see [`super::setup`](mod@super::setup)).

use std::fmt;
use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::catalog::{self, ServerInfo, SlotLookup, SlotRow, TableFacts};
use super::failover;
pub(crate) use super::publication::PublicationInfo;
use super::ControlError;
use crate::config::ident::{quote_ident, TableName};
use crate::config::Settings;
use crate::outbox::column_types::check_mapping;
use crate::outbox::connect::{ColumnFacts, ConnectLayout};
use crate::outbox::event::RowFormat;
use crate::outbox::payload::{PayloadFormat, BYTEA_OID};
use crate::postgres::lsn::Lsn;
use crate::postgres::role::RoleFacts;

/// The oldest server with pgoutput.
const MIN_VERSION_NUM: i32 = 100_000;
/// The first server whose pgoutput accepts the `messages` option.
const MESSAGES_OPTION_VERSION_NUM: i32 = 140_000;

/// How long preflight waits for a concurrent setup to finish creating the slot. Creation waits
/// for the transactions running when it started, so a long transaction can stretch it.
const SLOT_CREATION_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// What preflight found. Everything in here passed its checks.
#[derive(Debug, Clone)]
pub struct PreflightReport {
    /// e.g. `15.20`.
    pub(crate) server_version: String,
    /// e.g. `150020`.
    pub(crate) server_version_num: i32,
    /// Whether the slot is to be a failover slot (`postgres.failover_slot` on this server).
    pub(crate) wants_failover: bool,
    pub(crate) database: String,
    pub(crate) role: String,
    pub(crate) superuser: bool,
    /// What the role may do (REPLICATION, `pg_read_all_stats`, CREATE on the database).
    pub(crate) role_facts: RoleFacts,
    /// Every configured outbox table, checked, in `outbox.table` order.
    pub(crate) tables: Vec<CheckedTable>,
    pub(crate) slot_name: String,
    /// `None`: the slot does not exist yet.
    pub(crate) slot: Option<SlotInfo>,
    pub(crate) publication_name: String,
    /// `None`: the publication does not exist yet.
    pub(crate) publication: Option<PublicationInfo>,
    /// Things worth knowing that do not stop the relay.
    pub(crate) notes: Vec<String>,
}

/// One outbox table as preflight found it: it exists, is a table, has every mapped column with a
/// usable type, and the role may read it.
#[derive(Debug, Clone)]
pub(crate) struct CheckedTable {
    /// The table as the catalogs know it.
    pub(crate) facts: TableFacts,
    /// The mapped columns in [`crate::config::outbox::OutboxMapping::columns`] order.
    pub(crate) columns: Vec<MappedColumn>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MappedColumn {
    pub(crate) config_key: &'static str,
    pub(crate) column: crate::config::ident::Ident,
    /// As `format_type` prints it, e.g. `character varying(255)`.
    pub(crate) type_name: String,
    /// Its base type (a domain resolved to the type it is built on) is `bytea`.
    pub(crate) bytea: bool,
    /// `pg_type.oid` of its base type.
    pub(crate) base_oid: u32,
    pub(crate) not_null: bool,
}

/// How the poller and the backfill turn rows of `table`'s checked columns into events.
pub(crate) fn row_format(
    settings: &Settings,
    table: &TableName,
    columns: &[MappedColumn],
) -> Result<RowFormat, ControlError> {
    Ok(RowFormat {
        payload: payload_format(columns),
        connect: connect_layout(settings, table, columns)?,
    })
}

/// `[debezium]`'s record format for `table`'s checked columns (`None` without the section):
/// also `setup`'s check that the section fits the table.
fn connect_layout(
    settings: &Settings,
    table: &TableName,
    columns: &[MappedColumn],
) -> Result<Option<Arc<ConnectLayout>>, ControlError> {
    let Some(format) = &settings.debezium else {
        return Ok(None);
    };
    let layout = ConnectLayout::new(format, &settings.outbox, table, |ident| {
        columns.iter().find(|c| c.column == *ident).map(|c| ColumnFacts {
            type_oid: c.base_oid,
            not_null: c.not_null,
        })
    })?;
    Ok(Some(Arc::new(layout)))
}

/// How the payload column's text becomes the record value, from its checked type: `bytea` (or a
/// domain over it) is decoded to its bytes, everything else passes as text.
fn payload_format(columns: &[MappedColumn]) -> PayloadFormat {
    match columns.iter().find(|c| c.config_key == "outbox.payload_column") {
        Some(c) if c.bytea => PayloadFormat::Bytea,
        _ => PayloadFormat::Text,
    }
}

/// A usable logical pgoutput slot of this database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotInfo {
    pub(crate) active_pid: Option<i32>,
    pub(crate) confirmed_flush_lsn: Option<Lsn>,
    pub(crate) restart_lsn: Option<Lsn>,
    pub(crate) wal_status: Option<String>,
    /// PostgreSQL 17+: whether it is a failover slot (`None` before 17).
    pub(crate) failover: Option<bool>,
}

/// The mapped columns for a report line: `id_column = id bigint, …`.
pub(crate) fn column_list(columns: &[MappedColumn]) -> String {
    let cols: Vec<String> = columns
        .iter()
        .map(|c| format!("{} = {} {}", c.config_key, c.column, c.type_name))
        .collect();
    cols.join(", ")
}

impl fmt::Display for PreflightReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl PreflightReport {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        let privilege = if self.superuser { "superuser" } else { "replication" };
        writeln!(
            f,
            "preflight: PostgreSQL {}, database {}, wal_level = logical, role {} ({privilege})",
            self.server_version, self.database, self.role
        )?;
        for table in &self.tables {
            writeln!(
                f,
                "preflight: outbox table {}: {}",
                table.facts.name,
                column_list(&table.columns)
            )?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// Runs every check against `client` (connected as the relay will connect) for `settings`.
pub(crate) async fn preflight(client: &Client, settings: &Settings) -> Result<PreflightReport, ControlError> {
    let server = catalog::server_info(client).await?;
    check_server(&server)?;
    let mut notes = Vec::new();
    let role_facts = check_role(client, settings, &mut notes).await?;
    let superuser = role_facts.superuser;
    let mut tables = Vec::with_capacity(settings.outbox.tables.len());
    for name in &settings.outbox.tables {
        let table = check_table(client, settings, name, &server).await?;
        connect_layout(settings, name, &table.columns)?;
        tables.push(table);
    }

    let slot_name = settings.postgres.slot.as_str();
    let slot = check_slot(client, slot_name, &server.database).await?;
    let facts: Vec<TableFacts> = tables.iter().map(|t| t.facts.clone()).collect();
    let publication = super::publication::check_publication(client, settings, &facts, &server, &mut notes).await?;
    check_capacity(client, slot_name, slot.as_ref()).await?;

    if server.version_num < MESSAGES_OPTION_VERSION_NUM {
        notes.push(format!(
            "PostgreSQL {} predates 14: pgoutput's `messages` option is unavailable, so the relay omits it",
            server.version
        ));
    }
    if let Some(pid) = slot.as_ref().and_then(|s| s.active_pid) {
        notes.push(format!("slot {slot_name} is in use by pid {pid} (a relay is running?)"));
    }
    let wants_failover = failover::wants_failover(settings.postgres.failover_slot, &server)?;
    notes.extend(failover::notes(client, slot_name, &server, wants_failover).await?);
    Ok(PreflightReport {
        server_version_num: server.version_num,
        wants_failover,
        server_version: server.version,
        database: server.database,
        role: server.role,
        superuser,
        role_facts,
        tables,
        slot_name: slot_name.to_owned(),
        slot,
        publication_name: settings.postgres.publication.as_str().to_owned(),
        publication,
        notes,
    })
}

/// One outbox table as the polling relayer needs it (see [`check_outbox_table`]).
#[derive(Debug, Clone)]
pub(crate) struct OutboxTableFacts {
    pub(crate) server_version: String,
    pub(crate) database: String,
    pub(crate) role: String,
    pub(crate) table: TableName,
    pub(crate) table_oid: u32,
    pub(crate) table_owner: String,
    pub(crate) partitioned: bool,
    /// The mapped columns in [`crate::config::outbox::OutboxMapping::columns`] order.
    pub(crate) columns: Vec<MappedColumn>,
}

/// Only the outbox-table part of preflight, for `table` (one of `outbox.table`): the table
/// exists, the mapped columns exist with usable types, and the role may read it. Nothing about
/// `wal_level`, slots or publications — the polling relayer (`crate::poll`) needs none of them.
pub(crate) async fn check_outbox_table(
    client: &Client,
    settings: &Settings,
    table: &TableName,
) -> Result<OutboxTableFacts, ControlError> {
    let server = catalog::server_info(client).await?;
    let checked = check_table(client, settings, table, &server).await?;
    Ok(OutboxTableFacts {
        server_version: server.version,
        database: server.database,
        role: server.role,
        table: checked.facts.name,
        table_oid: checked.facts.oid,
        table_owner: checked.facts.owner,
        partitioned: checked.facts.partitioned,
        columns: checked.columns,
    })
}

/// One outbox table: it exists and is a table, its mapped columns exist with usable types, and
/// the role may read it.
async fn check_table(
    client: &Client,
    settings: &Settings,
    name: &TableName,
    server: &ServerInfo,
) -> Result<CheckedTable, ControlError> {
    let table = find_table(client, name, server).await?;
    let columns = check_columns(client, settings, &table).await?;
    check_select(client, &table, server).await?;
    Ok(CheckedTable { facts: table, columns })
}

fn check_server(server: &ServerInfo) -> Result<(), ControlError> {
    if server.version_num < MIN_VERSION_NUM {
        return Err(ControlError::ServerTooOld {
            version: server.version.clone(),
        });
    }
    if server.in_recovery {
        return Err(ControlError::InRecovery);
    }
    if server.wal_level != "logical" {
        return Err(ControlError::WalLevel {
            current: server.wal_level.clone(),
        });
    }
    Ok(())
}

/// The role's facts, checked as `run` checks them (`postgres/role.rs`: the same function, so
/// the same refusal in the same words); its warning becomes a note.
async fn check_role(client: &Client, settings: &Settings, notes: &mut Vec<String>) -> Result<RoleFacts, ControlError> {
    let role = crate::postgres::role::role_facts(client)
        .await
        .map_err(ControlError::query("reading the role's privileges"))?;
    let fenced = crate::sink::takeover_fenced(settings);
    notes.extend(crate::postgres::role::check(settings, &role, fenced)?);
    Ok(role)
}

async fn find_table(client: &Client, table: &TableName, server: &ServerInfo) -> Result<TableFacts, ControlError> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, pg_get_userbyid(c.relowner)::text \
             FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&table.quoted()],
        )
        .await
        .map_err(|source| match source.code() {
            Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => ControlError::PermissionDenied {
                action: format!("look up {table}"),
                message: super::error::describe(&source),
                fix: format!(
                    "Run (as the schema owner or a superuser): GRANT USAGE ON SCHEMA {} TO {}",
                    table.schema,
                    quote_ident(&server.role)
                ),
            },
            _ => ControlError::query(format!("looking up the outbox table {table}"))(source),
        })?;
    let Some(row) = row else {
        return Err(ControlError::TableNotFound {
            table: table.clone(),
            database: server.database.clone(),
            similar: similar_tables(client, table).await,
        });
    };
    let relkind: String = row.get(1);
    let kind = match relkind.as_str() {
        "r" | "p" => None,
        "v" => Some("view"),
        "m" => Some("materialized view"),
        "f" => Some("foreign table"),
        "S" => Some("sequence"),
        "i" | "I" => Some("index"),
        _ => Some("relation that is not a table"),
    };
    if let Some(kind) = kind {
        return Err(ControlError::NotATable {
            table: table.clone(),
            kind,
        });
    }
    let partitioned = relkind == "p";
    if partitioned && server.version_num < 130_000 {
        return Err(ControlError::PartitionedTableUnsupported {
            version: server.version.clone(),
            table: table.clone(),
        });
    }
    Ok(TableFacts {
        name: table.clone(),
        oid: row.get(0),
        owner: row.get(2),
        partitioned,
    })
}

/// Tables whose name resembles the configured one, in the form `outbox.table` takes. Best
/// effort: a failure here must not hide the real error, so it yields an empty list.
async fn similar_tables(client: &Client, table: &TableName) -> Vec<String> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND n.nspname NOT LIKE 'pg\\_toast%' \
               AND (strpos(lower(c.relname), lower($1)) > 0 OR strpos(lower(c.relname), 'outbox') > 0) \
             ORDER BY lower(c.relname) = lower($1) DESC, 1, 2 LIMIT 5",
            &[&table.name.as_str()],
        )
        .await
        .unwrap_or_default();
    rows.iter().map(|r| config_form(r.get(0), r.get(1))).collect()
}

/// How to write a table name in `outbox.table`: bare when the name would survive case folding,
/// double-quoted otherwise.
fn config_form(schema: &str, name: &str) -> String {
    let part = |s: &str| {
        let plain = s.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if plain {
            s.to_owned()
        } else {
            quote_ident(s)
        }
    };
    format!("{}.{}", part(schema), part(name))
}

async fn check_columns(
    client: &Client,
    settings: &Settings,
    table: &TableFacts,
) -> Result<Vec<MappedColumn>, ControlError> {
    let columns = crate::postgres::client::catalog_columns(client, &table.name.quoted())
        .await
        .map_err(ControlError::query(format!("reading the columns of {}", table.name)))?;
    let mapped = check_mapping(&settings.outbox, &table.name, &columns)?;
    Ok(mapped
        .into_iter()
        .map(|(config_key, column, found)| MappedColumn {
            config_key,
            column,
            type_name: found.type_name.clone(),
            bytea: found.base_oid == BYTEA_OID,
            base_oid: found.base_oid,
            not_null: found.not_null,
        })
        .collect())
}

async fn check_select(client: &Client, table: &TableFacts, server: &ServerInfo) -> Result<(), ControlError> {
    let row = client
        .query_one("SELECT has_table_privilege($1::oid, 'SELECT')", &[&table.oid])
        .await
        .map_err(ControlError::query(format!(
            "checking SELECT on the outbox table {}",
            table.name
        )))?;
    if !row.get::<_, bool>(0) {
        return Err(ControlError::NoSelectPrivilege {
            role: server.role.clone(),
            table: table.name.clone(),
        });
    }
    Ok(())
}

/// The configured slot, if it exists and the relay can use it. Never offers to replace an
/// unusable slot: see the module docs of [`super`] for why.
pub(crate) async fn check_slot(client: &Client, name: &str, database: &str) -> Result<Option<SlotInfo>, ControlError> {
    let deadline = tokio::time::Instant::now() + SLOT_CREATION_WAIT;
    loop {
        let Some(slot) = slot_here(name, database, catalog::slot_lookup(client, name).await?)? else {
            return Ok(None);
        };
        if !slot.being_created() {
            return usable_slot(name, database, &slot).map(Some);
        }
        // A concurrent setup is creating it; its plugin is only known once that finishes.
        if tokio::time::Instant::now() >= deadline {
            return Err(ControlError::SlotBeingCreated {
                slot: name.to_owned(),
                pid: slot.active_pid.unwrap_or_default(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// This database's slot from a lookup; a logical slot of that name in another database is an
/// error (slot names are cluster-wide, so setup could not create one here either).
pub(crate) fn slot_here(name: &str, database: &str, lookup: SlotLookup) -> Result<Option<SlotRow>, ControlError> {
    match lookup {
        SlotLookup::Found(row) => Ok(Some(*row)),
        SlotLookup::Missing => Ok(None),
        SlotLookup::InOtherDatabase {
            database: slot_database,
        } => Err(ControlError::SlotInOtherDatabase {
            slot: name.to_owned(),
            slot_database,
            database: database.to_owned(),
        }),
    }
}

/// The slot is a pgoutput logical slot of this database, i.e. one the relay can stream from
/// (and so one that `setup` may reuse and `teardown` may drop).
pub(crate) fn ensure_pgoutput_slot_here(name: &str, database: &str, slot: &SlotRow) -> Result<(), ControlError> {
    let slot_name = name.to_owned();
    if slot.slot_type != "logical" {
        return Err(ControlError::SlotIsPhysical { slot: slot_name });
    }
    let plugin = slot.plugin.clone().unwrap_or_default();
    if plugin != "pgoutput" {
        return Err(ControlError::SlotWrongPlugin {
            slot: slot_name,
            plugin,
        });
    }
    let slot_database = slot.database.clone().unwrap_or_default();
    if slot_database != database {
        return Err(ControlError::SlotInOtherDatabase {
            slot: slot_name,
            slot_database,
            database: database.to_owned(),
        });
    }
    Ok(())
}

pub(crate) fn usable_slot(name: &str, database: &str, slot: &SlotRow) -> Result<SlotInfo, ControlError> {
    ensure_pgoutput_slot_here(name, database, slot)?;
    let slot_name = name.to_owned();
    if let Some(reason) = slot.invalidated() {
        return Err(ControlError::SlotInvalidated {
            slot: slot_name,
            reason,
        });
    }
    Ok(SlotInfo {
        active_pid: slot.active_pid.filter(|_| slot.active),
        confirmed_flush_lsn: slot.confirmed_flush_lsn,
        restart_lsn: slot.restart_lsn,
        wal_status: slot.wal_status.clone(),
        failover: slot.failover,
    })
}

/// A new slot needs a free `max_replication_slots` entry; streaming needs a free WAL sender
/// unless the relay already holds one (its slot is active).
async fn check_capacity(client: &Client, slot_name: &str, slot: Option<&SlotInfo>) -> Result<(), ControlError> {
    if slot.is_none() {
        let (used, max) = slot_usage(client).await?;
        if used >= max {
            return Err(ControlError::NoFreeReplicationSlot {
                slot: slot_name.to_owned(),
                used,
                max,
            });
        }
    }
    let streaming = slot.is_some_and(|s| s.active_pid.is_some());
    if !streaming {
        let row = catalog::one_row(
            client,
            "SELECT (SELECT count(*) FROM pg_stat_replication), current_setting('max_wal_senders')::int8",
            "counting WAL senders",
        )
        .await?;
        let (used, max): (i64, i64) = (row.get(0), row.get(1));
        if used >= max {
            return Err(ControlError::NoFreeWalSender { used, max });
        }
    }
    Ok(())
}

/// (slots in use, max_replication_slots).
pub(crate) async fn slot_usage(client: &Client) -> Result<(i64, i64), ControlError> {
    let row = catalog::one_row(
        client,
        "SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int8",
        "counting replication slots",
    )
    .await?;
    Ok((row.get(0), row.get(1)))
}
