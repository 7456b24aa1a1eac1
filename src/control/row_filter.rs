//! `[filter]` pushed into the publication (PostgreSQL 15+): rows the filter drops are never
//! decoded nor sent, instead of being decoded and dropped by the relay.
//!
//! `setup` writes the row filter per outbox table (`DROP TABLE` + `ADD TABLE … WHERE (…)` in one
//! transaction: a change of filter takes effect at one commit, nothing is decoded without a
//! filter in between) and records the configured expression in the publication's comment;
//! `status` shows the filter in force (the server's own text, `pg_publication_tables.rowfilter`)
//! and warns when the configuration and the publication differ. On 14 the relay alone applies
//! the filter. The relay always applies `[filter]` too (`OutboxEvent::passes`), so a filter
//! narrowed in the config takes effect at the next start even before `setup` ran; a filter the
//! publication has and the config lost keeps rows away until `setup` removes it — which is
//! what `status` warns about.
//!
//! pgoutput lets a row filter use any column when the publication publishes inserts only (what
//! `setup` creates); a publication that also publishes updates or deletes (an adopted one) may
//! only filter on replica-identity columns, and the server refuses other filters with its own
//! message.

use tokio_postgres::Client;

use super::catalog::ServerInfo;
use super::ControlError;
use crate::config::ident::{quote_ident, TableName};
use crate::config::Settings;

/// The first version whose publications take row filters.
pub(crate) const ROW_FILTER_VERSION_NUM: i32 = 150_000;
/// How the publication's comment records the configured filter.
const COMMENT_PREFIX: &str = "outbox-relay filter: ";

/// The configured filter against the publication's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowFilterState {
    /// The row filter `[filter]` asks for (`None`: no `[filter]`).
    pub(crate) desired: Option<String>,
    /// Per configured outbox table: the server's text of its row filter in the publication.
    pub(crate) in_force: Vec<Option<String>>,
    /// What `setup` last wrote (the publication's comment).
    pub(crate) recorded: Option<String>,
    /// Every outbox table is in the publication by name (`pg_publication_rel`), so a row filter
    /// can be set on it; not for `FOR ALL TABLES`, `FOR TABLES IN SCHEMA` or a missing table,
    /// where the relay alone applies `[filter]`.
    pub(crate) pushable: bool,
}

impl RowFilterState {
    /// Whether the publication filters as the configuration says.
    pub(crate) fn in_sync(&self) -> bool {
        if !self.pushable {
            return true;
        }
        match &self.desired {
            None => self.in_force.iter().all(Option::is_none),
            Some(d) => self.recorded.as_deref() == Some(d.as_str()) && self.in_force.iter().all(Option::is_some),
        }
    }
}

/// The row filter `[filter]` asks for, as SQL (`None`: no filter).
pub(crate) fn desired(settings: &Settings) -> Option<String> {
    settings
        .filter
        .as_ref()
        .map(|f| f.row_filter_sql(&settings.outbox.route_by))
}

/// Reads the publication's row filters and comment (15+; before, nothing can be in force).
pub(crate) async fn read(
    client: &Client,
    server: &ServerInfo,
    settings: &Settings,
) -> Result<RowFilterState, ControlError> {
    let publication = settings.postgres.publication.as_str();
    let mut in_force = Vec::with_capacity(settings.outbox.tables.len());
    let mut recorded = None;
    let mut pushable = server.version_num >= ROW_FILTER_VERSION_NUM;
    if server.version_num >= ROW_FILTER_VERSION_NUM {
        for table in &settings.outbox.tables {
            let named = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid \
                       JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE p.pubname = $1 AND n.nspname = $2 AND c.relname = $3)",
                    &[&publication, &table.schema.as_str(), &table.name.as_str()],
                )
                .await
                .map_err(ControlError::query(format!(
                    "reading whether {publication} names {table}"
                )))?;
            pushable &= named.get::<_, bool>(0);
            let row = client
                .query_opt(
                    "SELECT rowfilter FROM pg_publication_tables \
                     WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                    &[&publication, &table.schema.as_str(), &table.name.as_str()],
                )
                .await
                .map_err(ControlError::query(format!(
                    "reading the row filter of {table} in {publication}"
                )))?;
            in_force.push(row.and_then(|r| r.get::<_, Option<String>>(0)));
        }
        let comment = client
            .query_opt(
                "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(ControlError::query(format!(
                "reading the comment of publication {publication}"
            )))?;
        recorded = comment
            .and_then(|r| r.get::<_, Option<String>>(0))
            .and_then(|c| c.strip_prefix(COMMENT_PREFIX).map(str::to_owned));
    } else {
        in_force.resize(settings.outbox.tables.len(), None);
    }
    Ok(RowFilterState {
        desired: desired(settings),
        in_force,
        recorded,
        pushable,
    })
}

/// `setup`: makes the publication filter as `[filter]` says (15+), one transaction; a notice
/// says what changed, or that the relay applies the filter itself (14).
pub(crate) async fn sync(
    client: &mut Client,
    server: &ServerInfo,
    settings: &Settings,
    notices: &mut Vec<String>,
) -> Result<(), ControlError> {
    let publication = settings.postgres.publication.as_str();
    if server.version_num < ROW_FILTER_VERSION_NUM {
        if let Some(filter) = &settings.filter {
            notices.push(format!(
                "PostgreSQL {} has no publication row filters (15+): the relay applies [filter] ({}) itself; \
                 filtered rows are decoded and dropped, their WAL confirmed as usual",
                server.version,
                filter.describe()
            ));
        }
        return Ok(());
    }
    let state = read(client, server, settings).await?;
    if !state.pushable {
        if let Some(filter) = &settings.filter {
            notices.push(format!(
                "publication {publication} does not name every outbox table (FOR ALL TABLES or FOR TABLES IN \
                 SCHEMA), so it takes no row filter: the relay applies [filter] ({}) itself",
                filter.describe()
            ));
        }
        return Ok(());
    }
    if state.in_sync() {
        return Ok(());
    }
    let tx = client
        .transaction()
        .await
        .map_err(ControlError::query("starting the row-filter change"))?;
    for (table, sql) in settings.outbox.tables.iter().zip(alter_statements(settings, &state)) {
        tx.batch_execute(&sql).await.map_err(ControlError::query(format!(
            "setting the row filter of {table} in publication {publication} ({sql})"
        )))?;
    }
    tx.batch_execute(&comment_statement(settings, &state))
        .await
        .map_err(ControlError::query(format!(
            "recording the filter on publication {publication}"
        )))?;
    tx.commit()
        .await
        .map_err(ControlError::query("committing the row-filter change"))?;
    notices.push(match (&settings.filter, &state.desired) {
        (Some(filter), Some(d)) => format!(
            "publication {publication}: row filter set on {} ({}): WHERE ({d}); rows it drops are never decoded",
            table_list(&settings.outbox.tables),
            filter.describe()
        ),
        _ => format!(
            "publication {publication}: row filter removed from {} ([filter] is not configured)",
            table_list(&settings.outbox.tables)
        ),
    });
    Ok(())
}

/// The statements [`sync`] runs per outbox table to give the publication `state.desired`'s row
/// filter: the table dropped and added back with it, in one transaction.
pub(crate) fn alter_statements(settings: &Settings, state: &RowFilterState) -> Vec<String> {
    let name = quote_ident(settings.postgres.publication.as_str());
    let clause = state
        .desired
        .as_deref()
        .map_or_else(String::new, |d| format!(" WHERE ({d})"));
    settings
        .outbox
        .tables
        .iter()
        .map(|table| {
            format!(
                "ALTER PUBLICATION {name} DROP TABLE {t}; ALTER PUBLICATION {name} ADD TABLE {t}{clause}",
                t = table.quoted()
            )
        })
        .collect()
}

/// The statement [`sync`] records the configured filter with (the publication's comment).
pub(crate) fn comment_statement(settings: &Settings, state: &RowFilterState) -> String {
    let comment = match &state.desired {
        Some(d) => format!("'{}'", format!("{COMMENT_PREFIX}{d}").replace('\'', "''")),
        None => "NULL".to_owned(),
    };
    format!(
        "COMMENT ON PUBLICATION {} IS {comment}",
        quote_ident(settings.postgres.publication.as_str())
    )
}

/// What `status` says of the filter, and a warning when config and publication differ.
pub(crate) fn verdict(state: &RowFilterState, server: &ServerInfo, settings: &Settings) -> (String, Option<String>) {
    let configured = settings
        .filter
        .as_ref()
        .map_or_else(|| "none".to_owned(), |f| f.describe());
    let in_force: Vec<String> = settings
        .outbox
        .tables
        .iter()
        .zip(&state.in_force)
        .filter_map(|(t, f)| f.as_ref().map(|f| format!("{t}: WHERE {f}")))
        .collect();
    let line = if server.version_num < ROW_FILTER_VERSION_NUM {
        format!(
            "filter: {configured} (applied by the relay: PostgreSQL {} has no row filters)",
            server.version
        )
    } else if in_force.is_empty() {
        format!("filter: {configured}; publication row filter: none")
    } else {
        format!("filter: {configured}; publication row filter: {}", in_force.join("; "))
    };
    let warning = (server.version_num >= ROW_FILTER_VERSION_NUM && !state.in_sync()).then(|| {
        if state.desired.is_none() {
            "the publication has a row filter but the config has no [filter]: rows it drops are never relayed; run \
             `outbox-relay setup` to remove it, or restore [filter]"
                .to_owned()
        } else {
            "the publication's row filter differs from [filter]: the relay drops what [filter] excludes, but rows \
             only the publication drops are never relayed; run `outbox-relay setup` to bring the publication in line"
                .to_owned()
        }
    });
    (line, warning)
}

fn table_list(tables: &[TableName]) -> String {
    tables.iter().map(TableName::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(desired: Option<&str>, in_force: &[Option<&str>], recorded: Option<&str>) -> RowFilterState {
        RowFilterState {
            desired: desired.map(str::to_owned),
            in_force: in_force.iter().map(|f| f.map(str::to_owned)).collect(),
            recorded: recorded.map(str::to_owned),
            pushable: true,
        }
    }

    #[test]
    fn in_sync_when_the_recorded_filter_is_the_configured_one_and_in_force() {
        assert!(state(None, &[None, None], None).in_sync());
        assert!(
            !state(None, &[Some("x"), None], None).in_sync(),
            "a filter the config lost"
        );
        assert!(state(Some("a"), &[Some("(a)")], Some("a")).in_sync());
        assert!(
            !state(Some("a"), &[Some("(b)")], Some("b")).in_sync(),
            "the config changed"
        );
        assert!(
            !state(Some("a"), &[None], Some("a")).in_sync(),
            "a table without its filter"
        );
        assert!(!state(Some("a"), &[None], None).in_sync(), "never pushed");
        let all_tables = RowFilterState {
            pushable: false,
            ..state(Some("a"), &[None], None)
        };
        assert!(all_tables.in_sync(), "nothing to push: the relay applies it");
    }
}
