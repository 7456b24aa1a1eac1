//! `teardown`: drop the relay's slot and publication.
//!
//! Dropping the slot discards every change it still holds: outbox rows committed after its
//! `confirmed_flush_lsn` will never be relayed. The report says how much WAL that was, and the
//! CLI asks for confirmation before calling this.
//!
//! Both objects are checked before either is dropped, so a refusal leaves everything as it was.
//! Teardown refuses to drop what does not look like the relay's own: a slot that is active (a
//! relay still streams from it), physical, decoded by another plugin or bound to another database,
//! and a publication that also publishes tables other than the outbox tables (every one of
//! `outbox.table`; it may serve other subscribers). Missing objects are reported as already
//! absent, so teardown is idempotent; it does not need the outbox tables or `wal_level =
//! logical`, so it also cleans up after a half-failed setup.

use std::fmt;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::catalog::{self, SlotRow};
use super::preflight::slot_here;
use super::{connect, error::describe, human_bytes, ControlError};
use crate::config::ident::quote_ident;
use crate::config::Settings;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeardownReport {
    pub slot_name: String,
    pub slot: Dropped,
    pub publication_name: String,
    pub publication: Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dropped {
    /// `unrelayed_wal_bytes`: WAL after the slot's confirmed position that was discarded with
    /// it (always `None` for a publication).
    Dropped {
        unrelayed_wal_bytes: Option<i64>,
    },
    AlreadyAbsent,
}

impl fmt::Display for TeardownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::display_lines(f, |f| self.render(f))
    }
}

impl TeardownReport {
    fn render(&self, f: &mut String) -> fmt::Result {
        use fmt::Write as _;
        match &self.slot {
            Dropped::Dropped {
                unrelayed_wal_bytes: Some(b),
            } if *b > 0 => writeln!(
                f,
                "slot {}: dropped ({} of WAL after its confirmed position was discarded)",
                self.slot_name,
                human_bytes(*b)
            )?,
            Dropped::Dropped { .. } => writeln!(f, "slot {}: dropped", self.slot_name)?,
            Dropped::AlreadyAbsent => writeln!(f, "slot {}: already absent", self.slot_name)?,
        }
        match &self.publication {
            Dropped::Dropped { .. } => writeln!(f, "publication {}: dropped", self.publication_name),
            Dropped::AlreadyAbsent => writeln!(f, "publication {}: already absent", self.publication_name),
        }
    }
}

/// Drops the slot, then the publication. Safe to repeat.
pub async fn teardown(settings: &Settings) -> Result<TeardownReport, ControlError> {
    let client = connect(settings).await?;
    let server = catalog::server_info(&client).await?;
    let slot_name = settings.postgres.slot.as_str();
    let publication_name = settings.postgres.publication.as_str();

    let slot = slot_here(
        slot_name,
        &server.database,
        catalog::slot_lookup(&client, slot_name).await?,
    )?;
    if let Some(s) = &slot {
        check_droppable_slot(slot_name, &server.database, s)?;
    }
    let publication = catalog::publication(&client, publication_name).await?;
    if let Some(p) = &publication {
        // The publication is the relay's own while it publishes nothing but the outbox tables.
        let outbox = &settings.outbox;
        let others: Vec<String> = catalog::publication_tables(&client, publication_name)
            .await?
            .into_iter()
            .filter(|(schema, name)| outbox.table_of(schema, name).is_none())
            .map(|(schema, name)| format!("{}.{}", quote_ident(&schema), quote_ident(&name)))
            .collect();
        if p.puballtables || !others.is_empty() {
            let others = if p.puballtables {
                "all tables".to_owned()
            } else {
                others.join(", ")
            };
            return Err(ControlError::PublicationShared {
                publication: publication_name.to_owned(),
                others,
            });
        }
    }

    let slot = match slot {
        Some(s) => drop_slot(&client, slot_name, s.lag_bytes).await?,
        None => Dropped::AlreadyAbsent,
    };
    let publication = match publication {
        Some(p) => drop_publication(&client, publication_name, &p.owner).await?,
        None => Dropped::AlreadyAbsent,
    };
    Ok(TeardownReport {
        slot_name: slot_name.to_owned(),
        slot,
        publication_name: publication_name.to_owned(),
        publication,
    })
}

fn check_droppable_slot(name: &str, database: &str, slot: &SlotRow) -> Result<(), ControlError> {
    let slot_name = name.to_owned();
    if let (true, Some(pid)) = (slot.being_created(), slot.active_pid) {
        return Err(ControlError::SlotInUse { slot: slot_name, pid });
    }
    super::preflight::ensure_pgoutput_slot_here(name, database, slot)?;
    if let (true, Some(pid)) = (slot.active, slot.active_pid) {
        return Err(ControlError::SlotInUse { slot: slot_name, pid });
    }
    Ok(())
}

async fn drop_slot(client: &Client, name: &str, lag_bytes: Option<i64>) -> Result<Dropped, ControlError> {
    match client.execute("SELECT pg_drop_replication_slot($1)", &[&name]).await {
        Ok(_) => Ok(Dropped::Dropped {
            unrelayed_wal_bytes: lag_bytes,
        }),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(Dropped::AlreadyAbsent),
        Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => {
            // A relay attached between our check and the drop.
            let pid = catalog::slot(client, name).await?.and_then(|s| s.active_pid);
            match pid {
                Some(pid) => Err(ControlError::SlotInUse {
                    slot: name.to_owned(),
                    pid,
                }),
                None => Err(ControlError::query(format!(
                    "dropping replication slot {name} (retry teardown)"
                ))(e)),
            }
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(ControlError::PermissionDenied {
            action: format!("drop replication slot {name}"),
            message: describe(&e),
            fix: "Run teardown as a superuser or a role WITH REPLICATION".into(),
        }),
        Err(e) => Err(ControlError::query(format!("dropping replication slot {name}"))(e)),
    }
}

async fn drop_publication(client: &Client, name: &str, owner: &str) -> Result<Dropped, ControlError> {
    let sql = format!("DROP PUBLICATION {}", quote_ident(name));
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(Dropped::Dropped {
            unrelayed_wal_bytes: None,
        }),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(Dropped::AlreadyAbsent),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(ControlError::PermissionDenied {
            action: format!("drop publication {name}"),
            message: describe(&e),
            fix: format!(
                "Only its owner ({owner}) or a superuser may drop it: run teardown as {owner}, or have them run: {sql}"
            ),
        }),
        Err(e) => Err(ControlError::query(format!("dropping publication {name}"))(e)),
    }
}
