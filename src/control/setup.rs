//! `setup`: preflight, then create the publication and the slot if they are missing.
//!
//! Order matters: the publication is created before the slot, because pgoutput reads the
//! publication with the catalog as of each decoded change, so a slot that starts before its
//! publication existed cannot decode what lies between.
//!
//! Idempotence and races: "already exists" is success. Two setups running at once both see the
//! object missing and both try to create it; the loser gets `duplicate_object` (or, for the
//! publication, `unique_violation` on the catalog index) and reports "already exists" after
//! re-checking what the winner created.
//!
//! With several outbox tables (`outbox.table` a list) the publication is created `FOR TABLE` all
//! of them, and an existing one is extended by the ones it lacks.
//!
//! Repairs: when the publication exists without an outbox table and the connected role owns it,
//! setup runs `ALTER PUBLICATION … ADD TABLE` and says so in a notice (adding a table only adds
//! events; no subscriber loses anything). Nothing is ever taken away from a publication, because
//! other subscribers may rely on it: one that publishes more than the relay needs (other
//! operations, other tables — Debezium's `dbz_publication` when the relay adopts Debezium's slot)
//! is used as it is, with a note saying how to narrow it; one that hides what the relay needs (a
//! column list without a mapped column, no inserts) is an error with the statement to run. A slot
//! is never repaired or recreated (see [`super`]); an existing one must be a pgoutput slot.
//!
//! Before anything is connected to or created, setup refuses what `run` would refuse, with the
//! same message (`crate::sink::refusal`), and it checks `[retention]` against every outbox table
//! (`crate::retention::check`) and the privileges of each change it is about to make (CREATE on
//! the database and the tables' ownership for a new publication) before it changes anything.
//! [`check`] (`setup --check`) makes the same checks — the one function, `checks` — and changes
//! nothing: a deploy pipeline's dry run.

use std::fmt;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::catalog::TableFacts;
use super::preflight::{check_slot, PreflightReport};
use super::{connect, error::describe, ControlError};
use crate::config::ident::{quote_ident, TableName};
use crate::config::Settings;
use crate::postgres::lsn::Lsn;

/// What setup did.
#[derive(Debug, Clone)]
pub struct SetupReport {
    pub preflight: PreflightReport,
    pub publication: PublicationOutcome,
    pub slot: SlotOutcome,
    /// Things the operator should know about, e.g. a repair setup made.
    pub notices: Vec<String>,
    /// What setup did or found on the sink's side (a stream, an exchange).
    pub sink: Vec<String>,
    /// What setup found of `[retention]`, one line per outbox table (empty: not configured).
    pub retention: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationOutcome {
    Created,
    AlreadyExists,
    /// It existed without one or more outbox tables; setup added them.
    TableAdded,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotOutcome {
    /// Decoding starts at `consistent_point`: rows committed after it are relayed.
    Created {
        consistent_point: Lsn,
    },
    AlreadyExists {
        confirmed_flush_lsn: Option<Lsn>,
    },
}

impl SetupReport {
    /// True when setup found everything in place and changed nothing.
    pub fn already_set_up(&self) -> bool {
        self.publication == PublicationOutcome::AlreadyExists && matches!(self.slot, SlotOutcome::AlreadyExists { .. })
    }
}

impl fmt::Display for SetupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl SetupReport {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        writeln!(f, "{}", self.preflight)?;
        let publication = &self.preflight.publication_name;
        let tables = table_list(self.preflight.tables.iter().map(|t| &t.facts.name));
        match self.publication {
            PublicationOutcome::Created => writeln!(
                f,
                "publication {publication}: created (FOR TABLE {tables}, publish = 'insert')"
            )?,
            PublicationOutcome::AlreadyExists => writeln!(f, "publication {publication}: already exists")?,
            PublicationOutcome::TableAdded => writeln!(
                f,
                "publication {publication}: already existed; added what it lacked of {tables}"
            )?,
        }
        let slot = &self.preflight.slot_name;
        match &self.slot {
            SlotOutcome::Created { consistent_point } => writeln!(
                f,
                "slot {slot}: created (pgoutput); rows committed after {consistent_point} will be relayed"
            )?,
            SlotOutcome::AlreadyExists {
                confirmed_flush_lsn: Some(lsn),
            } => writeln!(f, "slot {slot}: already exists (confirmed up to {lsn})")?,
            SlotOutcome::AlreadyExists {
                confirmed_flush_lsn: None,
            } => writeln!(f, "slot {slot}: already exists")?,
        }
        super::write_rows(f, "sink", &self.sink)?;
        super::write_rows(f, "retention", &self.retention)?;
        super::write_rows(f, "notice", &self.notices)
    }
}

/// What `run` refuses from the configuration alone, before it connects to anything: the sink's
/// refusals (`crate::sink::refusal`, the very function `run` calls) and a `[tracing]` exporter
/// that cannot be built (the check `run`'s start makes). The same errors, so the same words.
pub(crate) fn refuse_as_run(settings: &Settings) -> Result<(), ControlError> {
    crate::sink::refusal::refusal(settings)?;
    if let Some(tracing) = &settings.tracing {
        crate::ops::tracing_export::check(tracing)?;
    }
    Ok(())
}

/// Every check `setup` makes before it changes anything, and `setup --check` makes all of them:
/// what `run` refuses, preflight, `[retention]` against every table, and the privileges of the
/// changes setup is about to make (which `run` does not need: [`check_changes`], the row
/// filter's).
async fn checks(settings: &Settings) -> Result<(Client, PreflightReport, Vec<String>), ControlError> {
    refuse_as_run(settings)?;
    let client = connect(settings).await?;
    let preflight = super::preflight(&client, settings).await?;
    let retention = crate::retention::check(&client, settings).await?;
    check_changes(&client, &preflight).await?;
    check_row_filter_change(&client, settings, &preflight).await?;
    Ok((client, preflight, retention))
}

/// The row filter `setup` would write into an existing publication (`row_filter::sync`) needs the
/// ownership of the publication and of every outbox table.
async fn check_row_filter_change(
    client: &Client,
    settings: &Settings,
    pre: &PreflightReport,
) -> Result<(), ControlError> {
    let Some(publication) = &pre.publication else {
        return Ok(());
    };
    if pre.role_facts.superuser || pre.server_version_num < super::row_filter::ROW_FILTER_VERSION_NUM {
        return Ok(());
    }
    let server = super::catalog::server_info(client).await?;
    let state = super::row_filter::read(client, &server, settings).await?;
    if state.in_sync() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let row = client
        .query_one("SELECT pg_has_role($1::text::name, 'USAGE')", &[&publication.owner])
        .await
        .map_err(ControlError::query("checking ownership of the publication"))?;
    if !row.get::<_, bool>(0) {
        missing.push(format!(
            "ownership of publication {} (owner: {})",
            pre.publication_name, publication.owner
        ));
    }
    for table in &pre.tables {
        if !owns(client, &table.facts).await? {
            missing.push(format!(
                "ownership of {} (owner: {})",
                table.facts.name, table.facts.owner
            ));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(ControlError::CannotChangeRowFilter {
        publication: pre.publication_name.clone(),
        role: pre.role_facts.name.clone(),
        missing: missing.join(" and "),
        statements: super::row_filter::alter_statements(settings, &state)
            .into_iter()
            .chain([super::row_filter::comment_statement(settings, &state)])
            .collect(),
    })
}

/// The privileges of what setup is about to create or change, checked before anything is: a
/// missing publication needs CREATE on the database and ownership of every outbox table, a table
/// added to an existing one (ours: preflight refused another role's) needs its ownership. The
/// slot needs REPLICATION, which preflight checked.
async fn check_changes(client: &Client, pre: &PreflightReport) -> Result<(), ControlError> {
    let role = &pre.role_facts;
    match &pre.publication {
        None => {
            let mut missing = Vec::new();
            let who = quote_ident(&role.name);
            if !role.create_on_database {
                let database = quote_ident(&pre.database);
                missing.push((
                    format!("CREATE on database {database}"),
                    format!("GRANT CREATE ON DATABASE {database} TO {who};"),
                ));
            }
            for table in &pre.tables {
                if !owns(client, &table.facts).await? {
                    let name = &table.facts.name;
                    missing.push((
                        format!("ownership of {name} (owner: {})", table.facts.owner),
                        format!("ALTER TABLE {} OWNER TO {who};", name.quoted()),
                    ));
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            Err(ControlError::CannotCreatePublication {
                publication: pre.publication_name.clone(),
                role: role.name.clone(),
                missing,
                sql: create_publication_sql(pre),
            })
        }
        Some(p) => {
            for table in &p.missing_tables {
                if !owns(client, table).await? {
                    return Err(ControlError::CannotAddTable {
                        publication: pre.publication_name.clone(),
                        table: Box::new(table.name.clone()),
                        role: role.name.clone(),
                        owner: table.owner.clone(),
                        sql: add_table_sql(&pre.publication_name, table),
                    });
                }
            }
            Ok(())
        }
    }
}

/// The connected role has the privileges of `table`'s owner (is it, a member of it, or superuser):
/// the server's test for `CREATE PUBLICATION … FOR TABLE` and `ADD TABLE`.
async fn owns(client: &Client, table: &TableFacts) -> Result<bool, ControlError> {
    let row = client
        .query_one(
            "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = $1",
            &[&table.oid],
        )
        .await
        .map_err(ControlError::query(format!("checking ownership of {}", table.name)))?;
    Ok(row.get(0))
}

/// Checks the server and the outbox table, then creates what is missing. Safe to repeat.
pub async fn setup(settings: &Settings) -> Result<SetupReport, ControlError> {
    let (mut client, preflight, retention) = checks(settings).await?;
    let mut notices = Vec::new();
    let publication = ensure_publication(&client, &preflight, &mut notices).await?;
    // Before the slot: a new slot decodes with the filter from its first change on.
    let server = super::catalog::server_info(&client).await?;
    super::row_filter::sync(&mut client, &server, settings, &mut notices).await?;
    let slot = ensure_slot(&client, &preflight).await?;
    if matches!(slot, SlotOutcome::Created { .. }) {
        // Rows committed before the new slot were not streamed by it: retention must not take
        // its position for theirs (a slot lost and re-created).
        notices.extend(crate::retention::note_slot_created(&client, settings, false).await);
    }
    ensure_failover(settings, &preflight, &slot, &mut notices).await?;
    // Re-check with both objects in place: a concurrent setup may have created them differently.
    let preflight = super::preflight(&client, settings).await?;
    let sink = crate::sink::prepare(settings).await?;
    Ok(SetupReport {
        preflight,
        publication,
        slot,
        notices,
        sink,
        retention,
    })
}

/// What `setup --check` found: everything setup checks, with nothing created or changed.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub preflight: PreflightReport,
    /// The sink as `status` probes it (reachable, and how it looks), or why it is not reachable
    /// now (a broker that is down is no configuration problem: `run` waits for it).
    pub sink: String,
    /// As in [`SetupReport::retention`].
    pub retention: Vec<String>,
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| {
            use fmt::Write as _;
            writeln!(f, "{}", self.preflight)?;
            let publication = &self.preflight.publication_name;
            match &self.preflight.publication {
                None => writeln!(f, "publication {publication}: missing; setup would create it")?,
                Some(p) if !p.missing_tables.is_empty() => writeln!(
                    f,
                    "publication {publication}: exists without {}; setup would add them",
                    table_list(p.missing_tables.iter().map(|t| &t.name))
                )?,
                Some(_) => writeln!(f, "publication {publication}: exists")?,
            }
            let slot = &self.preflight.slot_name;
            match &self.preflight.slot {
                None => writeln!(f, "slot {slot}: missing; setup would create it")?,
                Some(s) => match s.confirmed_flush_lsn {
                    Some(lsn) => writeln!(f, "slot {slot}: exists (confirmed up to {lsn})")?,
                    None => writeln!(f, "slot {slot}: exists")?,
                },
            }
            writeln!(f, "sink: {}", self.sink)?;
            super::write_rows(f, "retention", &self.retention)?;
            writeln!(f, "check passed: nothing was created or changed")
        })
    }
}

/// `setup --check`: the refusals `run` makes, preflight, `[retention]` against every outbox
/// table and the sink — every check `setup` makes, creating nothing. A configuration this
/// passes, `setup` and `run` start with (barring changes in between). The sink fails the check
/// only for what an operator must fix (credentials, permissions, a missing stream); a broker
/// that does not answer now is reported and passes, as `run` retries it.
pub async fn check(settings: &Settings) -> Result<CheckReport, ControlError> {
    let (_client, preflight, retention) = checks(settings).await?;
    let sink = match crate::sink::probe(settings).await {
        Ok(found) => found,
        Err(e) if e.transient => format!("not reachable now ({e}); `run` waits for it"),
        Err(e) => return Err(e.into()),
    };
    Ok(CheckReport {
        preflight,
        sink,
        retention,
    })
}

fn is_duplicate(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::DUPLICATE_OBJECT || *c == SqlState::UNIQUE_VIOLATION)
}

fn is_permission_denied(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

pub(super) async fn ensure_publication(
    client: &Client,
    pre: &PreflightReport,
    notices: &mut Vec<String>,
) -> Result<PublicationOutcome, ControlError> {
    let name = &pre.publication_name;
    match &pre.publication {
        Some(p) if p.missing_tables.is_empty() => Ok(PublicationOutcome::AlreadyExists),
        Some(p) => {
            // Preflight only lets this through when we own the publication. One table per
            // statement, so a refusal names the table and its owner.
            let mut added = 0;
            for table in &p.missing_tables {
                if add_table(client, name, table).await? {
                    added += 1;
                    let table = &table.name;
                    notices.push(match pre.slot.as_ref().and_then(|s| s.confirmed_flush_lsn) {
                        Some(lsn) => format!(
                            "publication {name} existed without {table}; setup added it. Rows committed to {table} \
                             between {lsn} (the slot's confirmed position) and now were not published and will NOT \
                             be relayed; re-insert them if they matter"
                        ),
                        None => format!("publication {name} existed without {table}; setup added it"),
                    });
                }
            }
            Ok(if added == 0 {
                PublicationOutcome::AlreadyExists
            } else {
                PublicationOutcome::TableAdded
            })
        }
        None => {
            let sql = create_publication_sql(pre);
            match client.batch_execute(&sql).await {
                Ok(()) => {}
                Err(e) if is_duplicate(&e) => return Ok(PublicationOutcome::AlreadyExists),
                Err(e) if is_permission_denied(&e) => {
                    return Err(ControlError::PermissionDenied {
                        action: format!("create publication {name}"),
                        message: describe(&e),
                        fix: format!(
                            "CREATE PUBLICATION … FOR TABLE needs ownership of the tables (owners: {}) and CREATE \
                             on database {}. Run setup as the tables' owner or a superuser, or have one run: {sql}",
                            table_owners(pre),
                            pre.database
                        ),
                    })
                }
                Err(e) => return Err(ControlError::query(format!("creating publication {name}"))(e)),
            }
            if let Some(lsn) = pre.slot.as_ref().and_then(|s| s.confirmed_flush_lsn) {
                notices.push(format!(
                    "slot {} existed before publication {name}: rows committed between {lsn} and now were not \
                     published and will NOT be relayed (before PostgreSQL 18, decoding them may fail with \
                     \"publication … does not exist\")",
                    pre.slot_name
                ));
            }
            Ok(PublicationOutcome::Created)
        }
    }
}

/// The publication setup creates: every outbox table, inserts only, partitioned tables under
/// their own names.
fn create_publication_sql(pre: &PreflightReport) -> String {
    let via_root = if pre.tables.iter().any(|t| t.facts.partitioned) {
        ", publish_via_partition_root = true"
    } else {
        ""
    };
    let tables: Vec<String> = pre.tables.iter().map(|t| t.facts.name.quoted()).collect();
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert'{via_root})",
        quote_ident(&pre.publication_name),
        tables.join(", ")
    )
}

fn add_table_sql(publication: &str, table: &TableFacts) -> String {
    format!(
        "ALTER PUBLICATION {} ADD TABLE {}",
        quote_ident(publication),
        table.name.quoted()
    )
}

/// `ALTER PUBLICATION … ADD TABLE` for one outbox table; `false` when a concurrent setup added it
/// first.
async fn add_table(client: &Client, name: &str, table: &TableFacts) -> Result<bool, ControlError> {
    let sql = add_table_sql(name, table);
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(true),
        Err(e) if is_duplicate(&e) => Ok(false),
        Err(e) if is_permission_denied(&e) => {
            let owner = &table.owner;
            Err(ControlError::PermissionDenied {
                action: format!("add {} to publication {name}", table.name),
                message: describe(&e),
                fix: format!("Adding a table needs its ownership (owner: {owner}); have {owner} run: {sql}"),
            })
        }
        Err(e) => Err(ControlError::query(format!(
            "adding {} to publication {name}",
            table.name
        ))(e)),
    }
}

/// `a, b` for people.
fn table_list<'t>(tables: impl Iterator<Item = &'t TableName>) -> String {
    tables.map(TableName::to_string).collect::<Vec<_>>().join(", ")
}

/// The owners of the outbox tables, each once: `app` or `sales, billing`.
fn table_owners(pre: &PreflightReport) -> String {
    let mut owners: Vec<&str> = Vec::new();
    for t in &pre.tables {
        if !owners.contains(&t.facts.owner.as_str()) {
            owners.push(&t.facts.owner);
        }
    }
    owners.join(", ")
}

async fn ensure_slot(client: &Client, pre: &PreflightReport) -> Result<SlotOutcome, ControlError> {
    let name = &pre.slot_name;
    if let Some(slot) = &pre.slot {
        return Ok(SlotOutcome::AlreadyExists {
            confirmed_flush_lsn: slot.confirmed_flush_lsn,
        });
    }
    // Waits for transactions running right now to finish: the slot's snapshot must see them all.
    // On 17+ the fifth argument makes it a failover slot (`postgres.failover_slot`).
    let created = if pre.server_version_num >= super::failover::FAILOVER_VERSION_NUM {
        client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, $2)",
                &[name, &pre.wants_failover],
            )
            .await
    } else {
        client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[name],
            )
            .await
    };
    match created {
        Ok(row) => {
            let lsn: String = row.get(0);
            let consistent_point = lsn
                .parse()
                .map_err(|e| ControlError::Unexpected(format!("pg_create_logical_replication_slot returned {e}")))?;
            Ok(SlotOutcome::Created { consistent_point })
        }
        Err(e) if is_duplicate(&e) => {
            // A concurrent setup won; make sure what it created is usable.
            let slot = check_slot(client, name, &pre.database).await?;
            Ok(SlotOutcome::AlreadyExists {
                confirmed_flush_lsn: slot.and_then(|s| s.confirmed_flush_lsn),
            })
        }
        Err(e) if e.code() == Some(&SqlState::CONFIGURATION_LIMIT_EXCEEDED) => {
            // Another slot was created since preflight counted.
            let (used, max) = super::preflight::slot_usage(client).await?;
            Err(ControlError::NoFreeReplicationSlot {
                slot: name.clone(),
                used,
                max,
            })
        }
        Err(e) if is_permission_denied(&e) => Err(ControlError::PermissionDenied {
            action: format!("create replication slot {name}"),
            message: describe(&e),
            fix: format!(
                "As a superuser run: ALTER ROLE {} WITH REPLICATION",
                quote_ident(&pre.role)
            ),
        }),
        Err(e) => Err(ControlError::query(format!("creating replication slot {name}"))(e)),
    }
}

/// Makes an existing slot a failover slot when `postgres.failover_slot` wants one and it is not
/// yet (`ALTER_REPLICATION_SLOT` exists only as a replication command). A slot that is one is
/// left alone, also with `failover_slot = "off"`: turning it off is the operator's decision.
async fn ensure_failover(
    settings: &Settings,
    pre: &PreflightReport,
    slot: &SlotOutcome,
    notices: &mut Vec<String>,
) -> Result<(), ControlError> {
    let name = &pre.slot_name;
    let SlotOutcome::AlreadyExists { .. } = slot else {
        if pre.wants_failover {
            notices.push(format!(
                "slot {name}: created as a failover slot (synchronized to standbys)"
            ));
        }
        return Ok(());
    };
    let is_failover = pre.slot.as_ref().and_then(|s| s.failover).unwrap_or(false);
    if !pre.wants_failover || is_failover {
        return Ok(());
    }
    let alter = async {
        let mut repl = crate::postgres::replication::connection::ReplicationConnection::connect(
            &settings.postgres,
            settings.relay.connect_timeout,
        )
        .await?;
        let result = repl
            .simple_query(&format!("ALTER_REPLICATION_SLOT {name} (FAILOVER true)"))
            .await;
        repl.close().await;
        result.map(|_| ())
    };
    match tokio::time::timeout(settings.relay.connect_timeout * 2, alter).await {
        Ok(Ok(())) => {
            notices.push(format!(
                "slot {name}: existed without failover; setup made it a failover slot (ALTER_REPLICATION_SLOT … \
                 (FAILOVER true))"
            ));
            Ok(())
        }
        Ok(Err(e)) => Err(ControlError::FailoverAlter {
            slot: name.clone(),
            message: e.to_string(),
        }),
        Err(_) => Err(ControlError::FailoverAlter {
            slot: name.clone(),
            message: "no answer in time".into(),
        }),
    }
}
