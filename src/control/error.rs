//! [`ControlError`]: every way the control plane can refuse, each phrased as problem + fix.

use crate::config::ident::{Ident, TableName};
use crate::postgres::client::ConnectError;

/// Why `setup`, `status`, `teardown` or `preflight` stopped. Every message names what is wrong
/// and what to do about it; none contains a password (URLs are printed redacted).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Connect(#[from] ConnectError),

    /// The sink's side of `setup` (a stream or an exchange it needs) failed.
    #[error("{0}")]
    Sink(#[from] crate::sink::SinkError),

    /// A configuration `run` refuses too, in `run`'s words (`src/sink/refusal.rs`).
    #[error(transparent)]
    Refused(#[from] crate::sink::StartRefusal),

    /// `[tracing]`'s exporter cannot be built, as `run` would find (in its words).
    #[error(transparent)]
    Tracing(#[from] crate::ops::tracing_export::ExporterError),

    /// `[retention]` does not fit an outbox table: retention would stop at its first run.
    #[error(transparent)]
    Retention(#[from] crate::retention::RetentionError),

    #[error("{context}: {}", describe(.source))]
    Query {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error(
        "PostgreSQL {version} is too old: logical decoding with pgoutput needs PostgreSQL 10 or newer \
         (14+ recommended). Upgrade the server"
    )]
    ServerTooOld { version: String },

    #[error(
        "connected to a standby (the server is in recovery); publications and slots are created on the \
         primary. Point postgres.url at the primary server"
    )]
    InRecovery,

    #[error(
        "postgres.failover_slot = \"on\", but PostgreSQL {version} has no failover slots (they came with 17). Use \
         \"auto\" (or \"off\") here, and follow docs/operations.md, \"Failover on PostgreSQL 14-16\", for what a \
         promotion means for the slot"
    )]
    FailoverUnsupported { version: String },

    #[error(
        "cannot make slot {slot} a failover slot (ALTER_REPLICATION_SLOT {slot} (FAILOVER true)): {message}. Run it \
         yourself on a replication connection (psql \"dbname=… replication=database\"), or set \
         postgres.failover_slot = \"off\""
    )]
    FailoverAlter { slot: String, message: String },

    #[error(
        "wal_level is '{current}'; logical decoding needs wal_level = logical. Set it in postgresql.conf \
         (or ALTER SYSTEM SET wal_level = logical) and RESTART the server — a reload is not enough"
    )]
    WalLevel { current: String },

    #[error(
        "no free replication slot: {used} of max_replication_slots = {max} are in use and slot {slot} needs \
         one more. Raise max_replication_slots in postgresql.conf and RESTART the server, or drop a slot \
         nothing uses (see pg_replication_slots; SELECT pg_drop_replication_slot('<name>'))"
    )]
    NoFreeReplicationSlot { slot: String, used: i64, max: i64 },

    #[error(
        "no free WAL sender: {used} of max_wal_senders = {max} are in use (pg_stat_replication) and the relay \
         needs one to stream. Raise max_wal_senders in postgresql.conf and RESTART the server, or stop an \
         unused replication client"
    )]
    NoFreeWalSender { used: i64, max: i64 },

    /// The role cannot do what `run` needs of it, in `run`'s words (`src/postgres/role.rs`).
    #[error(transparent)]
    Role(#[from] crate::postgres::role::RoleRefusal),

    #[error(
        "setup would create publication {publication}, but role {role} lacks {}: CREATE PUBLICATION … FOR TABLE \
         needs CREATE on the database and ownership of every table it names. Either grant them (as a superuser: \
         {}), or have a superuser or the tables' owner create the publication (run: {sql}) and run setup again — \
         with the publication in place the relay needs neither (docs/operations.md, \"The relay's role\")",
        .missing.iter().map(|(what, _)| what.as_str()).collect::<Vec<_>>().join(" and "),
        .missing.iter().map(|(_, grant)| grant.as_str()).collect::<Vec<_>>().join(" ")
    )]
    CannotCreatePublication {
        publication: String,
        role: String,
        /// What is missing (e.g. `CREATE on database "app"`) and the statement that gives it.
        missing: Vec<(String, String)>,
        sql: String,
    },

    #[error(
        "setup would change the row filter of publication {publication} to what [filter] says, but role {role} \
         lacks {missing}, which ALTER PUBLICATION … DROP TABLE / ADD TABLE … WHERE needs. Have the owner or a \
         superuser run setup, or run: {}",
        .statements.join("; ")
    )]
    CannotChangeRowFilter {
        publication: String,
        role: String,
        /// E.g. `ownership of publication outbox_relay (owner: app)`.
        missing: String,
        statements: Vec<String>,
    },

    #[error(
        "setup would add {table} to publication {publication}, but role {role} does not own it (owner: {owner}), \
         and ALTER PUBLICATION … ADD TABLE needs that. Have {owner} or a superuser run: {sql}"
    )]
    CannotAddTable {
        publication: String,
        // Boxed to keep the error small (clippy::result_large_err).
        table: Box<TableName>,
        role: String,
        owner: String,
        sql: String,
    },

    #[error(
        "role {role} cannot read the outbox table {table}. Run (as the table owner or a superuser): \
         GRANT SELECT ON {table} TO {}",
        crate::config::ident::quote_ident(.role)
    )]
    NoSelectPrivilege { role: String, table: TableName },

    #[error(
        "the outbox table {table} does not exist in database {database}{}. Set outbox.table to the \
         schema-qualified table name, e.g. table = \"public.events_outbox\"; double-quote mixed-case parts, \
         e.g. table = '\"Sales\".\"OutBox\"'",
        similar_hint(.similar)
    )]
    TableNotFound {
        table: TableName,
        database: String,
        similar: Vec<String>,
    },

    #[error(
        "outbox.table {table} is a {kind}, not a table; logical replication publishes only tables. \
         Point outbox.table at the outbox table itself"
    )]
    NotATable { table: TableName, kind: &'static str },

    #[error(
        "PostgreSQL {version} cannot publish the partitioned table {table} (needs PostgreSQL 13+ for \
         publish_via_partition_root). Upgrade, or use a plain table as the outbox"
    )]
    PartitionedTableUnsupported { version: String, table: TableName },

    /// What `run` says too ([`MappingError`](crate::outbox::column_types::MappingError)).
    #[error("{}", crate::outbox::column_types::not_found(key, column, table, columns))]
    ColumnNotFound {
        key: &'static str,
        column: Ident,
        table: TableName,
        columns: Vec<String>,
    },

    #[error("{}", crate::outbox::column_types::unusable(key, column, table, type_name, accepted))]
    UnusableColumnType {
        key: &'static str,
        column: Ident,
        // Boxed to keep the error small (clippy::result_large_err).
        table: Box<TableName>,
        type_name: String,
        accepted: &'static str,
    },

    /// `[debezium]` cannot render the outbox table's columns (a type, a converter, a placement).
    #[error("{0}. Change the [debezium] section or the column, then run setup again")]
    Debezium(#[from] crate::outbox::connect::ConnectLayoutError),

    #[error(
        "publication {publication} exists but does not include {table}, and it belongs to role {owner}, so \
         setup (running as {role}) leaves it alone. Have {owner} run: ALTER PUBLICATION {publication} ADD TABLE \
         {table} — or set postgres.publication to a name of the relay's own"
    )]
    PublicationLacksTable {
        publication: String,
        table: TableName,
        owner: String,
        role: String,
    },

    #[error(
        "publication {publication} publishes {actions} but not insert, so no outbox row would ever reach the \
         relay (outbox rows are events when inserted). Run: ALTER PUBLICATION {publication} SET (publish = \
         '{with_insert}') — or, if others rely on it as it is, set postgres.publication to a name of the \
         relay's own and run setup, which creates it"
    )]
    PublicationActions {
        publication: String,
        actions: String,
        /// The publication's operations with insert added, for the fix.
        with_insert: String,
    },

    #[error(
        "publication {publication} publishes the partitioned table {table} under its partitions' names, so the \
         relay would see no rows of {table}. Run: ALTER PUBLICATION {publication} SET \
         (publish_via_partition_root = true)"
    )]
    PublicationNotViaRoot { publication: String, table: TableName },

    #[error(
        "publication {publication} publishes only some columns of {table} and leaves out {}, which the relay \
         needs. Run: ALTER PUBLICATION {publication} SET TABLE {table} (no column list)",
        .missing.join(", ")
    )]
    PublicationColumnList {
        publication: String,
        table: TableName,
        missing: Vec<String>,
    },

    #[error(
        "replication slot {slot} is a physical slot (used by a standby or a backup tool), not a logical one. \
         Set postgres.slot to another name, or drop it if nothing uses it: SELECT pg_drop_replication_slot('{slot}')"
    )]
    SlotIsPhysical { slot: String },

    #[error(
        "replication slot {slot} uses output plugin {plugin}, but the relay needs pgoutput, and a slot's plugin \
         is fixed when it is created, so the relay cannot stream from it (nor adopt it, if it is Debezium's: \
         plugin.name = {plugin}). Give the relay a slot of its own: set postgres.slot to another name (e.g. \
         outbox_relay), run setup, and switch over with the overlap procedure in docs/migrating-from-debezium.md \
         (\"Switch-over without losing an event\"). Drop {slot} once nothing uses it: SELECT \
         pg_drop_replication_slot('{slot}')"
    )]
    SlotWrongPlugin { slot: String, plugin: String },

    #[error(
        "replication slot {slot} belongs to database {slot_database}, but postgres.url connects to {database}; \
         a logical slot decodes only its own database. Connect to {slot_database} or set postgres.slot to \
         another name"
    )]
    SlotInOtherDatabase {
        slot: String,
        slot_database: String,
        database: String,
    },

    #[error(
        "replication slot {slot} was invalidated ({reason}): PostgreSQL removed WAL it still needed, so events \
         committed in that WAL can no longer be relayed. The relay never recreates a slot by itself, because \
         that would skip those events without a trace. Find out what was lost (outbox rows after the last \
         relayed event), re-publish it if needed, then run `outbox-relay teardown` and `outbox-relay setup`; \
         raise max_slot_wal_keep_size to avoid a repeat"
    )]
    SlotInvalidated { slot: String, reason: String },

    #[error(
        "replication slot {slot} is in use by pid {pid} — stop the relay first (if pid {pid} is not a relay: \
         SELECT pg_terminate_backend({pid}))"
    )]
    SlotInUse { slot: String, pid: i32 },

    #[error(
        "replication slot {slot} is still being created by pid {pid} (another setup?). Creating a slot waits for \
         the transactions running when it started; look for long-running ones in pg_stat_activity and retry \
         when it is done"
    )]
    SlotBeingCreated { slot: String, pid: i32 },

    #[error(
        "publication {publication} also publishes {others}, so it may serve other subscribers; teardown drops \
         only a publication of the outbox table alone. Drop it yourself if you are sure: DROP PUBLICATION \
         {publication}"
    )]
    PublicationShared { publication: String, others: String },

    #[error(
        "unexpected catalog contents ({0}); this is a bug in outbox-relay, please report it with the server version"
    )]
    Unexpected(String),

    #[error("permission denied to {action}: {message}. {fix}")]
    PermissionDenied {
        action: String,
        message: String,
        fix: String,
    },
}

impl From<crate::outbox::column_types::MappingError> for ControlError {
    fn from(e: crate::outbox::column_types::MappingError) -> Self {
        use crate::outbox::column_types::MappingError;
        match e {
            MappingError::ColumnNotFound {
                key,
                column,
                table,
                columns,
            } => ControlError::ColumnNotFound {
                key,
                column,
                table,
                columns,
            },
            MappingError::UnusableType {
                key,
                column,
                table,
                type_name,
                accepted,
            } => ControlError::UnusableColumnType {
                key,
                column,
                table,
                type_name,
                accepted,
            },
        }
    }
}

impl ControlError {
    /// Wraps a failed statement, saying what the relay was doing when it failed.
    pub(crate) fn query(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> ControlError {
        let context = context.into();
        move |source| ControlError::Query { context, source }
    }
}

/// A server error as an operator wants it: message, SQLSTATE, detail and hint; other errors
/// with their causes (e.g. the operating system's error).
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    crate::postgres::failure::describe_pg(e)
}

fn similar_hint(similar: &[String]) -> String {
    if similar.is_empty() {
        String::new()
    } else {
        format!(" (tables with similar names: {})", similar.join(", "))
    }
}
