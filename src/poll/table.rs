//! What the polling relayer checks about each outbox table before claiming from it (every table
//! of `outbox.table`, each on its own; errors name the table).
//!
//! The mapped columns are checked exactly as for streaming ([`check_outbox_table`]); on top of
//! that polling needs the dispatched column (a nullable timestamp), the creation-time column it
//! orders by, and the UPDATE privilege. Nothing here needs `wal_level = logical`, a slot or a
//! publication.

use tokio_postgres::Client;

use super::error::PollError;
use crate::config::ident::{Ident, TableName};
use crate::config::Settings;
use crate::control::preflight::{check_outbox_table, OutboxTableFacts};

/// `timestamp` and `timestamptz` type OIDs.
const TIMESTAMP_OIDS: [u32; 2] = [1114, 1184];

/// One outbox table, checked for polling.
#[derive(Debug, Clone)]
pub(crate) struct PollTable {
    pub(crate) facts: OutboxTableFacts,
    /// The id column's type as `format_type` prints it, e.g. `bigint`, `uuid`.
    pub(crate) id_type: String,
    /// The column claims are ordered by and the pending index is built on.
    pub(crate) created_at: Ident,
    /// An index usable for claims: `(created_at …) WHERE <dispatched> IS NULL`, if one exists.
    pub(crate) pending_index: Option<PendingIndex>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingIndex {
    pub(crate) name: String,
    pub(crate) schema: String,
    pub(crate) valid: bool,
}

/// Checks `table` (one of `outbox.table`) for polling.
pub(crate) async fn check(client: &Client, settings: &Settings, table: &TableName) -> Result<PollTable, PollError> {
    let facts = check_outbox_table(client, settings, table)
        .await
        .map_err(PollError::Table)?;
    let columns = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END, a.attnotnull \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&facts.table_oid],
        )
        .await
        .map_err(PollError::query("reading the outbox table's columns"))?;
    let table = &facts.table;
    let find = |name: &str| columns.iter().find(|r| r.get::<_, &str>(0) == name);

    let dispatched = &settings.poll.dispatched;
    let Some(col) = find(dispatched.as_str()) else {
        return Err(PollError::DispatchedColumnMissing {
            column: dispatched.quoted(),
            table: table.clone(),
            present: columns
                .iter()
                .map(|r| crate::config::ident::quote_ident(r.get(0)))
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let (base_oid, not_null): (u32, bool) = (col.get(2), col.get(3));
    if !TIMESTAMP_OIDS.contains(&base_oid) || not_null {
        return Err(PollError::DispatchedColumnType {
            column: dispatched.quoted(),
            table: table.clone(),
            type_name: col.get(1),
            not_null: if not_null { " NOT NULL" } else { "" },
        });
    }
    let (created_at, _) = settings.created_at_column();
    if find(created_at.as_str()).is_none() {
        return Err(PollError::CreatedAtMissing {
            column: created_at.quoted(),
            table: table.clone(),
        });
    }
    let id_type = facts
        .columns
        .iter()
        .find(|c| c.config_key == "outbox.id_column")
        .map(|c| c.type_name.clone())
        .unwrap_or_else(|| "text".to_owned());

    let may_update: bool = client
        .query_one(
            "SELECT has_column_privilege($1::oid, $2, 'UPDATE')",
            &[&facts.table_oid, &dispatched.as_str()],
        )
        .await
        .map_err(PollError::query("checking UPDATE on the dispatched column"))?
        .get(0);
    if !may_update {
        return Err(PollError::NoUpdatePrivilege {
            role: facts.role.clone(),
            table: table.clone(),
            column: dispatched.quoted(),
        });
    }
    let pending_index = find_pending_index(client, facts.table_oid, &created_at, dispatched).await?;
    Ok(PollTable {
        facts,
        id_type,
        created_at,
        pending_index,
    })
}

/// A btree index whose first key is `created_at` and whose predicate is exactly
/// `<dispatched> IS NULL` (compared in the server's own deparsed form); valid ones first.
async fn find_pending_index(
    client: &Client,
    table_oid: u32,
    created_at: &Ident,
    dispatched: &Ident,
) -> Result<Option<PendingIndex>, PollError> {
    let row = client
        .query_opt(
            "SELECT c.relname::text, n.nspname::text, i.indisvalid \
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                  JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am am ON am.oid = c.relam \
             WHERE i.indrelid = $1 AND am.amname = 'btree' AND i.indexprs IS NULL \
               AND i.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = $1 AND attname = $2) \
               AND pg_get_expr(i.indpred, i.indrelid) = format('(%s IS NULL)', quote_ident($3)) \
             ORDER BY i.indisvalid DESC, c.relname LIMIT 1",
            &[&table_oid, &created_at.as_str(), &dispatched.as_str()],
        )
        .await
        .map_err(PollError::query("looking for the pending-rows index"))?;
    Ok(row.map(|r| PendingIndex {
        name: r.get(0),
        schema: r.get(1),
        valid: r.get(2),
    }))
}
