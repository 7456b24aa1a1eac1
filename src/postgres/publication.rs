//! What a publication publishes: its operations and its tables, read by `run` before it streams
//! and by the control plane's preflight, so both describe a publication the same way.
//!
//! A publication may publish more than one table's inserts (Debezium's `dbz_publication` is
//! `FOR ALL TABLES` with every operation by default). Consumers of this module decide what they
//! need; this module only says what is published beyond the inserts into the outbox tables (one
//! or several, `outbox.table`), and which statements would narrow the publication to them.

use tokio_postgres::Client;

use crate::config::ident::TableName;

/// How many other published tables a description names before it says "and N more".
const NAMED_TABLES: usize = 5;

/// The operations and tables of one publication, relative to the tables of interest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PublicationScope {
    pub(crate) name: String,
    /// `FOR ALL TABLES`: every table, present and future.
    pub(crate) all_tables: bool,
    /// The published operations in PostgreSQL's order (`insert, update, delete, truncate`), as
    /// `publish = '…'` spells them.
    pub(crate) actions: Vec<String>,
    /// Tables published besides the tables of interest, as `schema.table` (empty when
    /// `all_tables`: then it is every table).
    pub(crate) other_tables: Vec<String>,
}

impl PublicationScope {
    /// From the `pub*` flags of `pg_publication`.
    pub(crate) fn actions_of(insert: bool, update: bool, delete: bool, truncate: bool) -> Vec<String> {
        [
            (insert, "insert"),
            (update, "update"),
            (delete, "delete"),
            (truncate, "truncate"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| (*name).to_owned())
        .collect()
    }

    pub(crate) fn publishes_inserts(&self) -> bool {
        self.actions.iter().any(|a| a == "insert")
    }

    /// The operations besides insert, e.g. `update, delete, truncate`.
    fn other_actions(&self) -> Vec<&str> {
        self.actions
            .iter()
            .map(String::as_str)
            .filter(|a| *a != "insert")
            .collect()
    }

    /// What the publication publishes beyond the inserts into the tables of interest, in words
    /// (`None`: nothing beyond them), e.g. `update, delete and truncate operations, and every
    /// table of the database (FOR ALL TABLES)`.
    pub(crate) fn beyond_inserts(&self) -> Option<String> {
        let mut parts = Vec::new();
        let others = self.other_actions();
        if !others.is_empty() {
            parts.push(format!("{} operations", others.join(", ")));
        }
        if self.all_tables {
            parts.push("every table of the database (FOR ALL TABLES)".to_owned());
        } else if !self.other_tables.is_empty() {
            let n = self.other_tables.len();
            let named = self.other_tables[..n.min(NAMED_TABLES)].join(", ");
            parts.push(match n.saturating_sub(NAMED_TABLES) {
                0 if n == 1 => format!("1 other table ({named})"),
                0 => format!("{n} other tables ({named})"),
                more => format!("{n} other tables ({named} and {more} more)"),
            });
        }
        (!parts.is_empty()).then(|| parts.join(", and "))
    }

    /// The statements that narrow the publication to the inserts into `tables`; a `FOR ALL
    /// TABLES` publication cannot be narrowed to some tables in place (only dropped and
    /// recreated), so only its operations are narrowed.
    pub(crate) fn narrowing(&self, tables: &[TableName]) -> Vec<String> {
        let mut sql = Vec::new();
        if !self.other_actions().is_empty() {
            sql.push(format!("ALTER PUBLICATION {} SET (publish = 'insert')", self.name));
        }
        if !self.all_tables && !self.other_tables.is_empty() {
            let list: Vec<String> = tables.iter().map(TableName::quoted).collect();
            sql.push(format!("ALTER PUBLICATION {} SET TABLE {}", self.name, list.join(", ")));
        }
        sql
    }
}

/// The publication named `name` (`None`: it does not exist), with the tables it publishes
/// besides `tables`. `pubtruncate` is read through `to_jsonb` so the query also runs on servers
/// older than 11, which lack the column.
pub(crate) async fn read_scope(
    client: &Client,
    name: &str,
    tables: &[TableName],
) -> Result<Option<PublicationScope>, tokio_postgres::Error> {
    let Some(row) = client
        .query_opt(
            "SELECT p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, \
                    COALESCE((to_jsonb(p) ->> 'pubtruncate')::bool, false) \
             FROM pg_publication p WHERE p.pubname = $1",
            &[&name],
        )
        .await?
    else {
        return Ok(None);
    };
    let all_tables: bool = row.get(0);
    let actions = PublicationScope::actions_of(row.get(1), row.get(2), row.get(3), row.get(4));
    let other_tables = if all_tables {
        Vec::new()
    } else {
        self::tables(client, name, tables, Listed::Others).await?
    };
    Ok(Some(PublicationScope {
        name: name.to_owned(),
        all_tables,
        actions,
        other_tables,
    }))
}

/// `tables` as two parallel arrays (schemas, names), for `unnest($2::text[], $3::text[])`.
fn columns(tables: &[TableName]) -> (Vec<&str>, Vec<&str>) {
    tables.iter().map(|t| (t.schema.as_str(), t.name.as_str())).unzip()
}

/// Which tables [`tables`] lists (`schema.table`, quoted as PostgreSQL prints them).
/// `pg_publication_tables` lists what `FOR ALL TABLES`, `FOR TABLES IN SCHEMA` and partition
/// roots (`publish_via_partition_root`) make published, so one query answers for every form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    /// The tables of `tables` that exist and that the publication does not publish: their
    /// inserts never reach a walsender of this publication. A table that does not exist has no
    /// rows to miss (events may come from logical decoding messages alone).
    Unpublished,
    /// Every table the publication publishes, but `tables`.
    Others,
}

/// The tables `which` names, for the publication `name` and the configured `tables`.
pub(crate) async fn tables(
    client: &Client,
    name: &str,
    tables: &[TableName],
    which: Listed,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let sql = match which {
        Listed::Unpublished => UNPUBLISHED,
        Listed::Others => OTHER_TABLES,
    };
    let (schemas, names) = columns(tables);
    let rows = client.query(sql, &[&name, &schemas, &names]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// [`Listed::Unpublished`]'s query.
const UNPUBLISHED: &str = "SELECT format('%I.%I', o.schema_name, o.table_name) \
     FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS o(schema_name, table_name, n) \
     WHERE to_regclass(format('%I.%I', o.schema_name, o.table_name)) IS NOT NULL \
       AND NOT EXISTS (SELECT 1 FROM pg_publication_tables p \
           WHERE p.pubname = $1 AND p.schemaname = o.schema_name AND p.tablename = o.table_name) \
     ORDER BY o.n";

/// [`Listed::Others`]'s query.
const OTHER_TABLES: &str = "SELECT format('%I.%I', p.schemaname, p.tablename) FROM pg_publication_tables p \
     WHERE p.pubname = $1 AND NOT EXISTS ( \
         SELECT 1 FROM unnest($2::text[], $3::text[]) AS o(schema_name, table_name) \
         WHERE o.schema_name = p.schemaname AND o.table_name = p.tablename) \
     ORDER BY 1";

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> [TableName; 1] {
        [TableName::parse("outbox.table", "public.outbox").unwrap()]
    }

    fn scope(all_tables: bool, actions: &[&str], other_tables: &[&str]) -> PublicationScope {
        PublicationScope {
            name: "dbz_publication".into(),
            all_tables,
            actions: actions.iter().map(|a| (*a).to_owned()).collect(),
            other_tables: other_tables.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    #[test]
    fn inserts_of_the_one_table_are_nothing_beyond() {
        let own = scope(false, &["insert"], &[]);
        assert!(own.publishes_inserts());
        assert_eq!(own.beyond_inserts(), None);
        assert!(own.narrowing(&table()).is_empty());
    }

    #[test]
    fn debeziums_default_publication_is_described_and_narrowed_in_its_operations_only() {
        let all = scope(true, &["insert", "update", "delete", "truncate"], &[]);
        assert_eq!(
            all.beyond_inserts().unwrap(),
            "update, delete, truncate operations, and every table of the database (FOR ALL TABLES)"
        );
        assert_eq!(
            all.narrowing(&table()),
            ["ALTER PUBLICATION dbz_publication SET (publish = 'insert')"]
        );
    }

    #[test]
    fn other_tables_are_named_and_counted() {
        let filtered = scope(false, &["insert"], &["public.orders"]);
        assert_eq!(filtered.beyond_inserts().unwrap(), "1 other table (public.orders)");
        assert_eq!(
            filtered.narrowing(&table()),
            ["ALTER PUBLICATION dbz_publication SET TABLE \"public\".\"outbox\""]
        );
        let many: Vec<String> = (0..7).map(|i| format!("public.t{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let wide = scope(false, &["insert", "delete"], &many);
        assert_eq!(
            wide.beyond_inserts().unwrap(),
            "delete operations, and 7 other tables (public.t0, public.t1, public.t2, public.t3, public.t4 and 2 more)"
        );
        assert_eq!(wide.narrowing(&table()).len(), 2);
        let two = [
            TableName::parse("outbox.table", "sales.outbox").unwrap(),
            TableName::parse("outbox.table", "billing.outbox").unwrap(),
        ];
        assert_eq!(
            filtered.narrowing(&two),
            ["ALTER PUBLICATION dbz_publication SET TABLE \"sales\".\"outbox\", \"billing\".\"outbox\""],
            "narrowing keeps every outbox table"
        );
    }

    #[test]
    fn actions_follow_postgres_order() {
        assert_eq!(
            PublicationScope::actions_of(true, false, true, true),
            ["insert", "delete", "truncate"]
        );
        assert!(!scope(false, &["update", "delete"], &[]).publishes_inserts());
    }
}
