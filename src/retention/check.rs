//! What retention needs of each outbox table, checked once by `setup` (and `setup --check`) and
//! again by retention itself before its first run on a table: the columns it ages and deletes
//! by, the partitioning `retention.mode = "partitions"` works on, and the role's privileges.
//!
//! Invariant: whatever would stop retention for a table at its first run — while publishing
//! goes on and the table grows unnoticed — is an error here, so `setup` refuses it instead of
//! saying nothing. What only degrades bookkeeping (the record table `status` reads) is a note.

use tokio_postgres::Client;

use super::record;
use super::{partitions, RetentionError, Target};
use crate::config::ident::{quote_ident, TableName};
use crate::config::retention::{RetentionMode, RetentionSettings};
use crate::config::Settings;

/// Resolves `table`'s id and timestamp columns and, in partitions mode, checks the table is
/// partitioned by range of the timestamp column (the checks of every run's first look).
pub(crate) async fn resolve(
    client: &Client,
    settings: &Settings,
    config: &RetentionSettings,
    table: &TableName,
) -> Result<Target, RetentionError> {
    let (timestamp, _) = settings.created_at_column();
    let id = settings.outbox.id.clone();
    let row = client
        .query_one(
            "SELECT (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                      WHERE a.attrelid = $1::text::regclass AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped),
                    (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                      WHERE a.attrelid = $1::text::regclass AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped)",
            &[&table.quoted(), &id.as_str(), &timestamp.as_str()],
        )
        .await
        .map_err(RetentionError::query(table, "reading the outbox table's columns"))?;
    let (id_type, ts_type): (Option<String>, Option<String>) = (row.get(0), row.get(1));
    if ts_type.is_none() {
        return Err(RetentionError::NoTimestampColumn {
            table: table.to_string(),
            column: timestamp.quoted(),
        });
    }
    let Some(id_type) = id_type else {
        return Err(RetentionError::NoTimestampColumn {
            table: table.to_string(),
            column: id.quoted(),
        });
    };
    let target = Target {
        table: table.clone(),
        label: record::key(table),
        id,
        id_type,
        timestamp,
        keep_ms: config.keep.as_millis(),
        not_before_unix: None,
    };
    if config.mode == RetentionMode::Partitions {
        partitions::check(client, &target).await?;
        partitions::partition_name(&target, i64::from(u32::MAX))?;
    }
    Ok(target)
}

/// What the connected role may do to one outbox table and its schema.
struct Privileges {
    role: String,
    owner: String,
    schema: String,
    select: bool,
    delete: bool,
    /// Owner or member of the owner: `ATTACH` / `DETACH PARTITION` need it.
    owns: bool,
    create_in_schema: bool,
    /// Whether the record table beside it exists, and whether the role may write it.
    record_exists: bool,
    record_writable: bool,
}

async fn privileges(client: &Client, table: &TableName) -> Result<Privileges, RetentionError> {
    let record = record::record_table(table);
    let row = client
        .query_one(
            "SELECT current_user::text, pg_get_userbyid(c.relowner)::text, n.nspname::text,
                    has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'DELETE'),
                    pg_has_role(c.relowner, 'USAGE'), has_schema_privilege(c.relnamespace, 'CREATE'),
                    to_regclass($2) IS NOT NULL,
                    COALESCE(has_table_privilege(to_regclass($2), 'INSERT')
                             AND has_table_privilege(to_regclass($2), 'UPDATE'), false)
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.oid = $1::text::regclass",
            &[&table.quoted(), &record],
        )
        .await
        .map_err(RetentionError::query(table, "reading the role's privileges"))?;
    Ok(Privileges {
        role: row.get(0),
        owner: row.get(1),
        schema: row.get(2),
        select: row.get(3),
        delete: row.get(4),
        owns: row.get(5),
        create_in_schema: row.get(6),
        record_exists: row.get(7),
        record_writable: row.get(8),
    })
}

/// Checks `[retention]` against every outbox table (nothing when it is not configured) and
/// says, one line per table, what it found.
pub(crate) async fn check(client: &Client, settings: &Settings) -> Result<Vec<String>, RetentionError> {
    let Some(config) = &settings.retention else {
        return Ok(Vec::new());
    };
    let mode = config.mode.label();
    let mut found = Vec::with_capacity(settings.outbox.tables.len());
    for table in &settings.outbox.tables {
        let target = resolve(client, settings, config, table).await?;
        let p = privileges(client, table).await?;
        let refuse = |needs: String, fix: String| RetentionError::Privilege {
            table: table.to_string(),
            mode,
            role: p.role.clone(),
            needs,
            fix,
        };
        let role = quote_ident(&p.role);
        if !p.select {
            return Err(refuse(
                "SELECT on the table".into(),
                format!("Run: GRANT SELECT ON {} TO {role}", table.quoted()),
            ));
        }
        let how = match config.mode {
            RetentionMode::Delete => {
                if !p.delete {
                    return Err(refuse(
                        "DELETE on the table".into(),
                        format!("Run: GRANT DELETE ON {} TO {role}", table.quoted()),
                    ));
                }
                format!(
                    "deletes published rows older than {} by {}",
                    keep(config),
                    target.timestamp
                )
            }
            RetentionMode::Partitions => {
                if !p.owns {
                    return Err(refuse(
                        format!(
                            "ownership of the table (owner: {}) to attach and detach partitions",
                            p.owner
                        ),
                        format!(
                            "Run retention's role as the owner, or have a superuser run: GRANT {} TO {role}",
                            quote_ident(&p.owner)
                        ),
                    ));
                }
                if !p.create_in_schema {
                    return Err(refuse(
                        format!("CREATE on schema {} to create partitions ahead", p.schema),
                        format!("Run: GRANT CREATE ON SCHEMA {} TO {role}", quote_ident(&p.schema)),
                    ));
                }
                let partitions = partitions::list(client, &target).await?;
                format!(
                    "partitioned by range of {} ({} partitions now); drops published partitions older than {}",
                    target.timestamp,
                    partitions.len(),
                    keep(config)
                )
            }
        };
        let record = match (p.record_exists, p.record_writable, p.create_in_schema) {
            (true, true, _) | (false, _, true) => String::new(),
            _ => format!(
                "; note: role {} cannot {} the record table {} (`status` will not show what retention removed; \
                 retention works all the same)",
                p.role,
                if p.record_exists { "write" } else { "create" },
                record::record_table(table)
            ),
        };
        found.push(format!(
            "{table}: mode {mode}, {how}; role {} has the privileges it needs{record}",
            p.role
        ));
    }
    Ok(found)
}

fn keep(config: &RetentionSettings) -> String {
    crate::config::retention::show(config.keep)
}
