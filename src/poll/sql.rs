//! The polling relayer's SQL, built once from the configuration (names always quoted).
//!
//! # Values rendered like pgoutput
//! pgoutput sends every column as the text its type's *output function* produces. The claim
//! selects each mapped column as `format('%s', col)`, which calls exactly that function, so a
//! polled event carries the same bytes a streamed one does. A plain `col::text` cast would not:
//! some types have their own cast to text that differs from their output function — `boolean`
//! (`true` instead of `t`), `char(n)` (trailing blanks stripped), `inet` (netmask added). `format`
//! turns NULL into an empty string, hence the `CASE` that keeps NULL a NULL.
//! Session settings that affect output functions are pinned to the replication connection's
//! values ([`SESSION_SETTINGS`]).
//!
//! # Order and index
//! Claims are ordered by the creation-time column, then the id: per aggregate that is the order
//! the events were written (a writer's next transaction starts after its previous one
//! committed), and it is the order of the partial index `… (created_at) WHERE <dispatched> IS
//! NULL`, so a claim reads `batch_size` index entries instead of sorting every pending row — which
//! is what keeps a large backlog draining at a constant cost per batch. (`ORDER BY id` alone
//! could not use that index, and for uuid ids it is no order at all.)
//!
//! With several outbox tables (`outbox.table` a list) each table has statements of its own and
//! workers of its own: order holds per aggregate within each table, as it does for streaming.

use crate::config::ident::{quote_ident, Ident, TableName};
use crate::config::Settings;
use crate::outbox::event::RowFormat;

/// Pinned like the replication connection's startup parameters (`src/postgres/replication/connection.rs`),
/// because these settings change how output functions render timestamps, floats and intervals.
pub(crate) const SESSION_SETTINGS: &str =
    "SET DateStyle = 'ISO'; SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET IntervalStyle = 'postgres'; \
     SET bytea_output = 'hex'";

/// The statements one worker prepares, for one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct PollSql {
    /// The outbox table the statements claim from and mark in (one of `outbox.table`).
    pub(crate) table: TableName,
    /// `$1`: the batch size (int8). Returns the mapped columns as text, in
    /// [`crate::config::outbox::OutboxMapping::columns`] order.
    pub(crate) claim: String,
    /// `$1`: the claimed ids as text (`text[]`), cast back to the id column's type so the
    /// primary-key index serves the lookup.
    pub(crate) mark: String,
    /// How a claimed row becomes an event (`bytea` payload decoded, `[debezium]` layout).
    pub(crate) rows: RowFormat,
}

impl PollSql {
    /// `id_type` is the id column's type as `format_type` prints it (valid SQL type syntax);
    /// `created_at` the column claims are ordered by.
    /// `rows` is how a claimed row becomes an event; `outbox` the table (one of `outbox.table`).
    pub(crate) fn new(
        settings: &Settings,
        outbox: &TableName,
        id_type: &str,
        created_at: &Ident,
        rows: RowFormat,
    ) -> PollSql {
        let mapping = &settings.outbox;
        let table = outbox.quoted();
        let dispatched = settings.poll.dispatched.quoted();
        let id = mapping.id.quoted();
        let columns: Vec<String> = mapping.columns().iter().map(|(_, c)| rendered_as_text(c)).collect();
        let claim = format!(
            "SELECT {} FROM {table} WHERE {dispatched} IS NULL ORDER BY {}, {id} LIMIT $1 FOR UPDATE SKIP LOCKED",
            columns.join(", "),
            created_at.quoted(),
        );
        let mark = format!("UPDATE {table} SET {dispatched} = now() WHERE {id} = ANY ($1::text[]::{id_type}[])");
        PollSql {
            table: outbox.clone(),
            claim,
            mark,
            rows,
        }
    }
}

/// `col` as its output function renders it, NULL kept NULL.
fn rendered_as_text(col: &Ident) -> String {
    let c = col.quoted();
    format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END")
}

/// `CREATE INDEX … ON <table> (<created_at>) WHERE <dispatched> IS NULL`. `CONCURRENTLY` (no
/// write lock on a live outbox) except on a partitioned table, where PostgreSQL does not allow it.
pub(crate) fn create_pending_index(
    settings: &Settings,
    table: &TableName,
    index_name: &str,
    created_at: &Ident,
    partitioned: bool,
) -> String {
    format!(
        "CREATE INDEX {}IF NOT EXISTS {} ON {} ({}) WHERE {} IS NULL",
        if partitioned { "" } else { "CONCURRENTLY " },
        quote_ident(index_name),
        table.quoted(),
        created_at.quoted(),
        settings.poll.dispatched.quoted()
    )
}

/// `<table>_<dispatched>_pending`, shortened to PostgreSQL's 63-byte limit on a character boundary.
/// An index lives in its table's schema, so tables of one name in several schemas do not clash.
pub(crate) fn pending_index_name(settings: &Settings, table: &TableName) -> String {
    let mut name = format!("{}_{}_pending", table.name.as_str(), settings.poll.dispatched.as_str());
    while name.len() > crate::config::ident::MAX_IDENTIFIER_BYTES {
        name.pop();
    }
    name
}

#[cfg(test)]
mod tests {

    use super::*;

    use crate::config::test_support::settings;

    /// The statements for the first outbox table of `s`, its id of type `id_type`, rows ordered
    /// by `created_at`, in the default row format.
    fn statements(s: &Settings, id_type: &str) -> PollSql {
        PollSql::new(
            s,
            &s.outbox.tables[0],
            id_type,
            &Ident::parse("t", "created_at").unwrap(),
            RowFormat::default(),
        )
    }

    #[test]
    fn claim_selects_mapped_columns_as_output_text_in_index_order() {
        let s = settings("[outbox]\ntimestamp_column = \"created_at\"\nheader_columns = { tenant = \"x-tenant\" }\n");
        let sql = statements(&s, "bigint");
        assert_eq!(
            sql.claim,
            "SELECT CASE WHEN \"id\" IS NULL THEN NULL ELSE format('%s', \"id\") END, \
             CASE WHEN \"aggregate_id\" IS NULL THEN NULL ELSE format('%s', \"aggregate_id\") END, \
             CASE WHEN \"type\" IS NULL THEN NULL ELSE format('%s', \"type\") END, \
             CASE WHEN \"payload\" IS NULL THEN NULL ELSE format('%s', \"payload\") END, \
             CASE WHEN \"created_at\" IS NULL THEN NULL ELSE format('%s', \"created_at\") END, \
             CASE WHEN \"tenant\" IS NULL THEN NULL ELSE format('%s', \"tenant\") END \
             FROM \"public\".\"events_outbox\" WHERE \"dispatched_at\" IS NULL \
             ORDER BY \"created_at\", \"id\" LIMIT $1 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            sql.mark,
            "UPDATE \"public\".\"events_outbox\" SET \"dispatched_at\" = now() WHERE \"id\" = ANY ($1::text[]::bigint[])"
        );
    }

    #[test]
    fn schema_b_names_and_hostile_names_stay_quoted() {
        let s = settings(
            "[outbox]\ntable = 'public.\"Out\"\"box\"'\nid_column = \"event_id\"\n[poll]\ndispatched_column = \"processed_at\"\n",
        );
        let sql = statements(&s, "uuid");
        assert!(
            sql.claim
                .contains("FROM \"public\".\"Out\"\"box\" WHERE \"processed_at\" IS NULL"),
            "{}",
            sql.claim
        );
        assert_eq!(
            sql.mark,
            "UPDATE \"public\".\"Out\"\"box\" SET \"processed_at\" = now() WHERE \"event_id\" = ANY ($1::text[]::uuid[])"
        );
    }

    #[test]
    fn pending_index_statement_and_name() {
        let s = settings("[poll]\ndispatched_column = \"processed_at\"\n");
        let created = Ident::parse("t", "created_at").unwrap();
        let table = &s.outbox.tables[0];
        let name = pending_index_name(&s, table);
        assert_eq!(name, "events_outbox_processed_at_pending");
        assert_eq!(
            create_pending_index(&s, table, &name, &created, false),
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"events_outbox_processed_at_pending\" \
             ON \"public\".\"events_outbox\" (\"created_at\") WHERE \"processed_at\" IS NULL"
        );
        assert!(create_pending_index(&s, table, &name, &created, true).starts_with("CREATE INDEX IF NOT EXISTS"));
        let long = settings(&format!("[outbox]\ntable = \"{}\"\n", "t".repeat(60)));
        assert_eq!(pending_index_name(&long, &long.outbox.tables[0]).len(), 63);
    }

    #[test]
    fn each_outbox_table_gets_its_own_statements() {
        let s = settings("[outbox]\ntable = [\"sales.outbox\", \"billing.outbox\"]\n");
        let created = Ident::parse("t", "created_at").unwrap();
        let claims: Vec<String> = s
            .outbox
            .tables
            .iter()
            .map(|t| PollSql::new(&s, t, "bigint", &created, RowFormat::default()).claim)
            .collect();
        assert!(claims[0].contains("FROM \"sales\".\"outbox\" WHERE"), "{}", claims[0]);
        assert!(claims[1].contains("FROM \"billing\".\"outbox\" WHERE"), "{}", claims[1]);
        let billing = &s.outbox.tables[1];
        assert!(
            create_pending_index(&s, billing, "outbox_dispatched_at_pending", &created, false)
                .contains("ON \"billing\".\"outbox\" (\"created_at\")")
        );
    }
}
