//! Reading the rows a polling relayer had not yet published, as of the slot's exported snapshot.
//!
//! The reading transaction imports the snapshot (`SET TRANSACTION SNAPSHOT`) that
//! `CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')` exported, so it sees exactly the transactions
//! that committed before the slot's consistent point: every row it returns was committed before
//! streaming starts, and every row committed later reaches the relay through the slot. That is
//! the whole no-gap, no-overlap argument; nothing here may read outside that snapshot.
//!
//! Values come back in text format through the simple query protocol, i.e. rendered by each
//! type's output function — the same function pgoutput uses — under the same session settings
//! the replication connection pins (`DateStyle=ISO`, `TimeZone=UTC`, `extra_float_digits=3`,
//! `IntervalStyle=postgres`). A backfilled event therefore carries byte-for-byte what the relay
//! would have published for the same row from the WAL.
//!
//! Memory stays bounded by reading through a cursor, [`FETCH_ROWS`] rows at a time. With several
//! outbox tables each is read in turn, each in a transaction importing the same snapshot (the
//! exporting connection stays open until all are read), so every table is read as of the one
//! consistent point.

use tokio_postgres::{Client, SimpleQueryMessage};

use super::error::BackfillError;
use crate::config::ident::{Ident, TableName};
use crate::config::Settings;
use crate::control::ControlError;

/// Rows per `FETCH`.
pub(crate) const FETCH_ROWS: usize = 500;
const CURSOR: &str = "outbox_relay_backfill";

/// One pending row: the mapped columns' text in [`crate::config::outbox::OutboxMapping::columns`] order
/// (`None` = SQL NULL).
pub(crate) type PendingRow = Vec<Option<String>>;

/// An open cursor over the pending rows of one outbox table in the snapshot.
pub(crate) struct PendingRows {
    client: Client,
    exhausted: bool,
}

impl PendingRows {
    /// Connects, imports `snapshot` and opens the cursor over `table`'s pending rows. The
    /// replication connection that exported `snapshot` must still be open and idle.
    pub(crate) async fn open(
        settings: &Settings,
        snapshot: &str,
        table: &TableName,
        order: &PendingOrder<'_>,
    ) -> Result<Self, BackfillError> {
        if snapshot.is_empty() || !snapshot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(BackfillError::Replication {
                context: "reading the exported snapshot's name",
                source: Box::new(crate::postgres::replication::error::ReplicationError::Protocol(
                    format!("unexpected snapshot name {snapshot:?}"),
                )),
            });
        }
        let client = crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout)
            .await
            .map_err(ControlError::from)?;
        set_output_formats(&client).await?;
        // SET TRANSACTION SNAPSHOT must be the transaction's first statement.
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot}'"
            ))
            .await
            .map_err(BackfillError::query("importing the slot's exported snapshot"))?;
        client
            .batch_execute(&format!(
                "DECLARE {CURSOR} NO SCROLL CURSOR FOR {}",
                select_pending(settings, table, order)
            ))
            .await
            .map_err(BackfillError::query("selecting the pending outbox rows"))?;
        Ok(PendingRows {
            client,
            exhausted: false,
        })
    }

    /// The next rows in order; empty once all were read.
    pub(crate) async fn next_batch(&mut self) -> Result<Vec<PendingRow>, BackfillError> {
        if self.exhausted {
            return Ok(Vec::new());
        }
        let messages = self
            .client
            .simple_query(&format!("FETCH {FETCH_ROWS} FROM {CURSOR}"))
            .await
            .map_err(BackfillError::query("reading pending outbox rows"))?;
        let rows = text_rows(messages);
        self.exhausted = rows.len() < FETCH_ROWS;
        Ok(rows)
    }

    /// Ends the reading transaction (it changed nothing).
    pub(crate) async fn close(self) -> Result<(), BackfillError> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(BackfillError::query("ending the backfill's reading transaction"))
    }
}

/// Sets the session's output formats to the replication connection's, so text values are
/// byte-for-byte what pgoutput sends; and no server-side timeout may end a transaction while it
/// waits for the broker between two reads.
pub(crate) async fn set_output_formats(client: &Client) -> Result<(), BackfillError> {
    client
        .batch_execute(
            "SET DateStyle = 'ISO'; SET TimeZone = 'UTC'; SET extra_float_digits = 3; \
             SET IntervalStyle = 'postgres'; SET bytea_output = 'hex'; SET statement_timeout = 0; \
             SET idle_in_transaction_session_timeout = 0",
        )
        .await
        .map_err(BackfillError::query("setting the session's output formats"))
}

/// The mapped columns' text of every row a simple query returned.
pub(crate) fn text_rows(messages: Vec<SimpleQueryMessage>) -> Vec<PendingRow> {
    messages
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect()),
            _ => None,
        })
        .collect()
}

/// Which rows a backfill publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection<'a> {
    /// Migrating from a polling relayer: rows whose dispatched column (set once a poller
    /// published the row) is NULL.
    Undispatched(&'a Ident),
    /// Recovering a lost slot: rows whose (integer) id is greater than this.
    AfterId(i64),
    /// Recovering a lost slot: rows whose creation-time column (`Settings::created_at_column`)
    /// is at or after this instant (text PostgreSQL reads as `timestamptz`).
    Since(&'a str),
}

impl Selection<'_> {
    /// The `WHERE` condition (values are numbers or quoted literals).
    fn condition(&self, settings: &Settings) -> String {
        match self {
            Selection::Undispatched(column) => format!("{} IS NULL", column.quoted()),
            Selection::AfterId(id) => format!("{} > {id}", settings.outbox.id.quoted()),
            Selection::Since(ts) => {
                let (column, _) = settings.created_at_column();
                format!("{} >= '{}'::timestamptz", column.quoted(), ts.replace('\'', "''"))
            }
        }
    }
}

impl std::fmt::Display for Selection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Undispatched(column) => write!(f, "{column} IS NULL"),
            Selection::AfterId(id) => write!(f, "id > {id}"),
            Selection::Since(ts) => write!(f, "created at or after {ts}"),
        }
    }
}

/// Which rows are pending, and how to order them.
pub(crate) struct PendingOrder<'a> {
    pub(crate) selection: Selection<'a>,
    /// The id column is an integer (a sequence), so its order is insertion order.
    pub(crate) id_is_sequential: bool,
}

/// `SELECT <mapped columns> FROM <table> WHERE <selection> ORDER BY …`, for one outbox table.
///
/// Events are published in this order and Kafka keeps it per partition, so it must be
/// insertion order within an aggregate: a sequence id gives that; otherwise (uuid ids) the
/// mapped timestamp column (`created_at`) does, with the id only breaking ties.
pub(crate) fn select_pending(settings: &Settings, table: &TableName, order: &PendingOrder<'_>) -> String {
    select_rows(
        settings,
        table,
        &order.selection.condition(settings),
        order.id_is_sequential,
    )
}

/// The columns rows are ordered by, in order: insertion order within an aggregate (see
/// [`select_pending`]).
pub(crate) fn order_columns(settings: &Settings, id_is_sequential: bool) -> Vec<&Ident> {
    let mapping = &settings.outbox;
    let mut order_by = Vec::new();
    if let (false, Some(ts)) = (id_is_sequential, &mapping.timestamp) {
        order_by.push(ts);
    }
    order_by.push(&mapping.id);
    order_by
}

/// `SELECT <mapped columns> FROM <table> WHERE <condition> ORDER BY <order_columns>`: the one
/// query shape the backfill and `replay` read rows with.
pub(crate) fn select_rows(settings: &Settings, table: &TableName, condition: &str, id_is_sequential: bool) -> String {
    let columns: Vec<String> = settings.outbox.columns().iter().map(|(_, c)| c.quoted()).collect();
    let order_by: Vec<String> = order_columns(settings, id_is_sequential)
        .iter()
        .map(|c| c.quoted())
        .collect();
    format!(
        "SELECT {} FROM {} WHERE {} ORDER BY {}",
        columns.join(", "),
        table.quoted(),
        condition,
        order_by.join(", ")
    )
}

#[cfg(test)]
mod tests {

    use super::*;

    fn settings(outbox: &str) -> Settings {
        crate::config::test_support::settings(&format!(
            "[outbox]
{outbox}"
        ))
    }

    #[test]
    fn selects_the_mapped_columns_in_record_order_and_quotes_every_name() {
        let s = settings(
            "table = '\"Sales\".\"OutBox\"'\ntimestamp_column = \"created_at\"\nheader_columns = { tenant = \"x-tenant\" }\n",
        );
        let dispatched = Ident::parse("poll.dispatched_column", "\"SentAt\"").unwrap();
        let sql = select_pending(
            &s,
            &s.outbox.tables[0],
            &PendingOrder {
                selection: Selection::Undispatched(&dispatched),
                id_is_sequential: true,
            },
        );
        assert_eq!(
            sql,
            "SELECT \"id\", \"aggregate_id\", \"type\", \"payload\", \"created_at\", \"tenant\" FROM \"Sales\".\"OutBox\" \
             WHERE \"SentAt\" IS NULL ORDER BY \"id\""
        );
    }

    #[test]
    fn non_sequential_ids_are_ordered_by_the_timestamp_column_first() {
        let dispatched = Ident::parse("poll.dispatched_column", "processed_at").unwrap();
        let order = PendingOrder {
            selection: Selection::Undispatched(&dispatched),
            id_is_sequential: false,
        };
        let ts = settings("timestamp_column = \"created_at\"\n");
        let with_ts = select_pending(&ts, &ts.outbox.tables[0], &order);
        assert!(
            with_ts.ends_with("WHERE \"processed_at\" IS NULL ORDER BY \"created_at\", \"id\""),
            "{with_ts}"
        );
        // Without a timestamp column the id is all there is.
        let plain = settings("");
        let without = select_pending(&plain, &plain.outbox.tables[0], &order);
        assert!(without.ends_with("ORDER BY \"id\""), "{without}");
    }

    #[test]
    fn lost_slot_recovery_selects_by_id_or_creation_time() {
        let s = settings("timestamp_column = \"created_at\"\n");
        let after = select_pending(
            &s,
            &s.outbox.tables[0],
            &PendingOrder {
                selection: Selection::AfterId(41),
                id_is_sequential: true,
            },
        );
        assert!(after.ends_with("WHERE \"id\" > 41 ORDER BY \"id\""), "{after}");
        let since = select_pending(
            &s,
            &s.outbox.tables[0],
            &PendingOrder {
                selection: Selection::Since("2024-05-01 12:00:00+00' OR '1"),
                id_is_sequential: false,
            },
        );
        assert!(
            since.ends_with(
                "WHERE \"created_at\" >= '2024-05-01 12:00:00+00'' OR ''1'::timestamptz ORDER BY \"created_at\", \"id\""
            ),
            "{since}"
        );
    }
}
