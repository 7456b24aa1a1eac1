//! Preflight checks of an existing publication against what the relay needs.
//!
//! What matters is what pgoutput will actually send for the outbox table: the publication must
//! cover it (directly, FOR ALL TABLES, or FOR TABLES IN SCHEMA on 15+), publish inserts and
//! nothing else, send a partitioned table's rows under the table's own name, and include every
//! mapped column when it has a column list (15+). A row filter (15+) is allowed — someone chose
//! it — but noted, since the rows it rejects never reach Kafka.

use tokio_postgres::Client;

use super::catalog::{self, PublicationRow, ServerInfo, TableFacts};
use super::ControlError;
use crate::config::Settings;

/// What preflight found of the configured publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicationInfo {
    pub(crate) owner: String,
    /// The connected role owns it, so setup may add the outbox table to it.
    pub(crate) owned_by_current_role: bool,
    pub(crate) all_tables: bool,
    pub(crate) includes_table: bool,
    /// Always exactly `["insert"]` once preflight passed.
    pub(crate) actions: Vec<String>,
    pub(crate) via_partition_root: bool,
}

/// The configured publication, if it exists, checked against what the relay needs.
pub(crate) async fn check_publication(
    client: &Client,
    settings: &Settings,
    table: &TableFacts,
    server: &ServerInfo,
    notes: &mut Vec<String>,
) -> Result<Option<PublicationInfo>, ControlError> {
    let name = settings.postgres.publication.as_str();
    let Some(publication) = catalog::publication(client, name).await? else {
        return Ok(None);
    };
    let membership = membership(client, &publication, table, server).await?;
    let includes_table = publication.puballtables || membership.is_some();
    if !includes_table && !publication.owned_by_current_role {
        return Err(ControlError::PublicationLacksTable {
            publication: name.to_owned(),
            table: table.name.clone(),
            owner: publication.owner.clone(),
            role: server.role.clone(),
        });
    }
    let actions = publication.actions();
    if actions != ["insert"] {
        let actions = if actions.is_empty() {
            "nothing".to_owned()
        } else {
            actions.join(", ")
        };
        return Err(ControlError::PublicationActions {
            publication: name.to_owned(),
            actions,
        });
    }
    if table.partitioned && !publication.pubviaroot {
        return Err(ControlError::PublicationNotViaRoot {
            publication: name.to_owned(),
            table: table.name.clone(),
        });
    }
    if let Some(membership) = &membership {
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
    Ok(Some(PublicationInfo {
        owner: publication.owner.clone(),
        owned_by_current_role: publication.owned_by_current_role,
        all_tables: publication.puballtables,
        includes_table,
        actions,
        via_partition_root: publication.pubviaroot,
    }))
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
