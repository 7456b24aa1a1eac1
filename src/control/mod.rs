//! The control plane: `setup`, `status`, `teardown`, and the `preflight` checks `setup` and `run`
//! share. Everything here talks to PostgreSQL over an ordinary (non-replication) connection —
//! except `import-debezium` ([`import_debezium`]), which only turns a Debezium connector config
//! into this relay's config file and connects to nothing.
//!
//! # Objects the relay owns
//! * A **publication** (`postgres.publication`) `FOR TABLE <outbox> WITH (publish = 'insert')`:
//!   pgoutput sends only what a publication names, and the relay needs only inserts — outbox rows
//!   are events, appended once; updates and deletes of them (cleanup jobs) are not events.
//!   Partitioned outbox tables also get `publish_via_partition_root = true`, so their rows arrive
//!   under the outbox table's own name. An existing publication may publish more (other
//!   operations, other tables, e.g. Debezium's `FOR ALL TABLES` one): it is used as it is, since
//!   the relay ignores everything but the outbox table's inserts, and noted.
//! * A logical **replication slot** (`postgres.slot`) with the `pgoutput` plugin. The slot is the
//!   relay's durable cursor: the server keeps every WAL segment from the slot's `restart_lsn` on,
//!   and the relay advances `confirmed_flush_lsn` only after Kafka acknowledged everything before
//!   it. That is the whole delivery guarantee.
//!
//! # Invariants
//! * **A slot is never recreated or replaced silently.** A slot that is missing where one existed,
//!   or that the server invalidated (`wal_status = 'lost'`, after `max_slot_wal_keep_size` was
//!   exceeded), means WAL the relay had not yet relayed is gone. A fresh slot starts at the
//!   *current* WAL position, so the events in the lost stretch would vanish with no error anywhere.
//!   Preflight therefore refuses an invalidated slot, and an unusable one (physical, another
//!   plugin, another database), with an error that explains the loss; only an operator decides,
//!   with `teardown` + `setup`, after finding out what was lost. `setup` creates a slot only where
//!   none exists under that name.
//! * **Setup is idempotent and race-safe**: existing objects are reported as "already exists";
//!   a concurrent setup losing a creation race (`duplicate_object` / `unique_violation`) reports
//!   the same after re-checking what the winner created.
//! * **Setup only ever adds to a publication** (the outbox table, if the connected role owns the
//!   publication), never takes away; see [`setup`](mod@setup) for the reasoning.
//! * **Every error says what to change** (see [`ControlError`]) and no output contains the
//!   password: URLs print through [`crate::config::secret::Secret`].
//! * **Names reach SQL quoted** ([`crate::config::ident`]); values travel as bind parameters.
//!
//! `status` output is a stable JSON schema, documented in [`status`](mod@status).

pub(crate) mod backfill;
mod catalog;
mod error;
pub(crate) mod failover;
pub(crate) mod import_debezium;
pub(crate) mod preflight;
mod publication;
pub(crate) mod replay;
mod row_filter;
pub(crate) mod setup;
pub(crate) mod status;
pub(crate) mod status_health;
pub(crate) mod status_tables;
pub(crate) mod teardown;

pub use crate::postgres::role::RoleRefusal;
pub use crate::sink::StartRefusal;
pub(crate) use backfill::setup_with_backfill;
pub(crate) use error::describe;
pub use error::ControlError;
pub(crate) use preflight::preflight;
pub use setup::{check, setup, CheckReport, PublicationOutcome, SetupReport, SlotOutcome};
pub use status::{
    status, FailoverStatus, OutboxTableStatus, PublicationStatus, ServerStatus, SlotStatus, StandbyStatus,
    StatusReport, TableRef, STATUS_SCHEMA_VERSION,
};
pub use teardown::{teardown, Dropped, TeardownReport};

use crate::config::Settings;
pub(crate) use crate::ops::units::human_bytes;

/// Opens the control connection the commands use, as the relay's configured role.
async fn connect(settings: &Settings) -> Result<tokio_postgres::Client, ControlError> {
    Ok(crate::postgres::client::connect(&settings.postgres, settings.relay.connect_timeout).await?)
}

/// A report's `label: line` rows, one per line (what setup found of the sink, of `[retention]`…).
pub(crate) fn write_rows(out: &mut impl std::fmt::Write, label: &str, lines: &[String]) -> std::fmt::Result {
    lines.iter().try_for_each(|line| writeln!(out, "{label}: {line}"))
}

/// Writes a multi-line report rendered by `render`, without a trailing newline (callers
/// `println!` reports).
fn display_lines(
    f: &mut std::fmt::Formatter<'_>,
    render: impl FnOnce(&mut String) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut text = String::new();
    render(&mut text)?;
    f.write_str(text.trim_end())
}
