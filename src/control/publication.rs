//! Preflight checks of an existing publication against what the relay needs.
//!
//! What matters is what pgoutput will actually send for the outbox tables (every one of
//! `outbox.table`, each checked on its own and named in any error): the publication must cover it (directly, FOR ALL TABLES, or FOR TABLES IN SCHEMA on 15+), publish inserts, send a
//! partitioned table's rows under the table's own name, and include every mapped column when it
//! has a column list (15+). A row filter (15+) is allowed — someone chose it — but noted, since
//! the rows it rejects never reach Kafka.
//!
//! A publication that publishes more — other operations, other tables, e.g. Debezium's
//! `dbz_publication` (`FOR ALL TABLES`, every operation) when the relay adopts Debezium's slot —
//! is accepted as it is and noted: the relay ignores what it does not need, and narrowing a
//! publication is the operator's call, since another subscriber may rely on what it publishes
//! (the same reason setup never narrows one, see [`super::setup`](mod@super::setup)).

use tokio_postgres::Client;

use super::catalog::{self, PublicationRow, ServerInfo, TableFacts};
use super::ControlError;
use crate::config::ident::TableName;
use crate::config::Settings;
use crate::postgres::publication::{Listed, PublicationScope};

/// What preflight found of the configured publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicationInfo {
    pub(crate) owner: String,
    /// The connected role owns it, so setup may add the outbox tables to it.
    pub(crate) owned_by_current_role: bool,
    pub(crate) all_tables: bool,
    /// Outbox tables it does not publish yet (setup adds them); empty when it covers them all.
    pub(crate) missing_tables: Vec<TableFacts>,
    /// The published operations in PostgreSQL's order; `insert` is among them once preflight
    /// passed, and the others (update, delete, truncate) reach the relay only to be ignored.
    pub(crate) actions: Vec<String>,
    pub(crate) via_partition_root: bool,
}

/// The configured publication, if it exists, checked against what the relay needs for every
/// outbox table in `tables`.
pub(crate) async fn check_publication(
    client: &Client,
    settings: &Settings,
    tables: &[TableFacts],
    server: &ServerInfo,
    notes: &mut Vec<String>,
) -> Result<Option<PublicationInfo>, ControlError> {
    let name = settings.postgres.publication.as_str();
    let Some(publication) = catalog::publication(client, name).await? else {
        return Ok(None);
    };
    let mut missing_tables = Vec::new();
    let mut memberships = Vec::with_capacity(tables.len());
    for table in tables {
        let membership = membership(client, &publication, table, server).await?;
        if !publication.puballtables && membership.is_none() {
            if !publication.owned_by_current_role {
                return Err(ControlError::PublicationLacksTable {
                    publication: name.to_owned(),
                    table: table.name.clone(),
                    owner: publication.owner.clone(),
                    role: server.role.clone(),
                });
            }
            missing_tables.push(table.clone());
        }
        memberships.push(membership);
    }
    let actions = publication.actions();
    if !actions.iter().any(|a| a == "insert") {
        return Err(ControlError::PublicationActions {
            publication: name.to_owned(),
            actions: if actions.is_empty() {
                "nothing".to_owned()
            } else {
                actions.join(", ")
            },
            with_insert: std::iter::once("insert")
                .chain(actions.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    for (table, membership) in tables.iter().zip(&memberships) {
        check_table(settings, name, &publication, table, membership.as_ref(), notes)?;
    }
    let includes_table = missing_tables.len() < tables.len();
    if includes_table {
        let names: Vec<TableName> = tables.iter().map(|t| t.name.clone()).collect();
        let other_tables = if publication.puballtables {
            Vec::new()
        } else {
            crate::postgres::publication::tables(client, name, &names, Listed::Others)
                .await
                .map_err(ControlError::query(format!("listing the tables of publication {name}")))?
        };
        let scope = PublicationScope {
            name: name.to_owned(),
            all_tables: publication.puballtables,
            actions: actions.clone(),
            other_tables,
        };
        if let Some(note) = surplus_note(&scope, &names) {
            notes.push(note);
        }
    }
    Ok(Some(PublicationInfo {
        owner: publication.owner.clone(),
        owned_by_current_role: publication.owned_by_current_role,
        all_tables: publication.puballtables,
        missing_tables,
        actions,
        via_partition_root: publication.pubviaroot,
    }))
}

/// What the publication must do for one outbox table it publishes (`membership`, or `None` when
/// only FOR ALL TABLES or setup's coming `ADD TABLE` covers it): send a partitioned table's rows
/// under its own name, and every mapped column when it has a column list.
fn check_table(
    settings: &Settings,
    name: &str,
    publication: &PublicationRow,
    table: &TableFacts,
    membership: Option<&Membership>,
    notes: &mut Vec<String>,
) -> Result<(), ControlError> {
    if table.partitioned && !publication.pubviaroot {
        return Err(ControlError::PublicationNotViaRoot {
            publication: name.to_owned(),
            table: table.name.clone(),
        });
    }
    if let Some(membership) = membership {
        if let Some(published) = &membership.column_list {
            let missing: Vec<String> = settings
                .outbox
                .columns()
                .into_iter()
                .filter(|(_, c)| !published.iter().any(|p| p == c.as_str()))
                .map(|(_, c)| c.quoted())
                .collect();
            if !missing.is_empty() {
                return Err(ControlError::PublicationColumnList {
                    publication: name.to_owned(),
                    table: table.name.clone(),
                    missing,
                });
            }
        }
        if membership.row_filter {
            notes.push(format!(
                "publication {name} has a row filter (WHERE) on {}: rows it rejects are never relayed",
                table.name
            ));
        }
    }
    Ok(())
}

/// The note for a publication that publishes more than the inserts into the outbox table
/// (`None` when it publishes just those): what it publishes beyond them, that the relay ignores
/// it, what that costs, and how to narrow it.
pub(crate) fn surplus_note(scope: &PublicationScope, tables: &[TableName]) -> Option<String> {
    let beyond = scope.beyond_inserts()?;
    let narrow = scope.narrowing(tables);
    let table = tables.iter().map(TableName::to_string).collect::<Vec<_>>().join(", ");
    let how = match narrow.as_slice() {
        [] => String::new(),
        statements => format!(
            " To narrow it — only if nothing else (e.g. a Debezium connector) uses it: {}.",
            statements.join("; ")
        ),
    };
    let all_tables = if scope.all_tables {
        " A FOR ALL TABLES publication cannot be narrowed to the outbox table in place; a publication of \
         the relay's own is (see docs/migrating-from-debezium.md)."
    } else {
        ""
    };
    Some(format!(
        "publication {} publishes {beyond} beyond the inserts into {table} that the relay needs; it is used \
         as it is. The relay ignores changes of other tables and updates, deletes and truncates of {table}; \
         the server still decodes and sends them, a small cost in walsender CPU and network.{how}{all_tables}",
        scope.name
    ))
}

/// How the table belongs to the publication (`None`: it does not, short of FOR ALL TABLES).
struct Membership {
    /// The published columns when the publication has a column list (15+).
    column_list: Option<Vec<String>>,
    row_filter: bool,
}

async fn membership(
    client: &Client,
    publication: &PublicationRow,
    table: &TableFacts,
    server: &ServerInfo,
) -> Result<Option<Membership>, ControlError> {
    let context = || ControlError::query(format!("reading the tables of publication {}", table.name));
    if server.version_num < 150_000 {
        let row = client
            .query_opt(
                "SELECT 1 FROM pg_publication_rel WHERE prpubid = $1 AND prrelid = $2",
                &[&publication.oid, &table.oid],
            )
            .await
            .map_err(context())?;
        return Ok(row.map(|_| Membership {
            column_list: None,
            row_filter: false,
        }));
    }
    let row = client
        .query_opt(
            "SELECT pr.prattrs IS NOT NULL, \
                    ARRAY(SELECT a.attname::text FROM pg_attribute a \
                          WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs::int2[])), \
                    pr.prqual IS NOT NULL \
             FROM pg_publication_rel pr WHERE pr.prpubid = $1 AND pr.prrelid = $2",
            &[&publication.oid, &table.oid],
        )
        .await
        .map_err(context())?;
    if let Some(row) = row {
        let column_list = row.get::<_, bool>(0).then(|| row.get(1));
        return Ok(Some(Membership {
            column_list,
            row_filter: row.get(2),
        }));
    }
    // FOR TABLES IN SCHEMA (15+) publishes every table of the schema, without column lists.
    let row = client
        .query_opt(
            "SELECT 1 FROM pg_publication_namespace pn JOIN pg_class c ON c.relnamespace = pn.pnnspid \
             WHERE pn.pnpubid = $1 AND c.oid = $2",
            &[&publication.oid, &table.oid],
        )
        .await
        .map_err(context())?;
    Ok(row.map(|_| Membership {
        column_list: None,
        row_filter: false,
    }))
}
