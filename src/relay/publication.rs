//! Checking the publication before streaming: it must publish inserts, and when it publishes
//! more (other operations, other tables — Debezium's `dbz_publication` when the relay adopts
//! Debezium's slot) the operator learns once per process that the surplus is decoded and ignored.
//!
//! Why here and not only in `setup`: `run` may be pointed at a publication `setup` never saw (an
//! adopted slot, a publication altered since), and one without inserts would stream nothing —
//! not an error anywhere, just silence. A missing publication is left to the walsender, which
//! names it in its own error.

use tracing::info;

use super::error::RelayError;
use crate::config::Settings;
use crate::postgres::publication::{self, read_scope, Listed};

/// Fails when the publication exists without inserts; returns the note about what it publishes
/// beyond the outbox tables' inserts, if anything.
pub(crate) async fn check(client: &tokio_postgres::Client, settings: &Settings) -> Result<Option<String>, RelayError> {
    let name = settings.postgres.publication.as_str();
    let tables = &settings.outbox.tables;
    let Some(scope) = read_scope(client, name, tables).await? else {
        return Ok(None);
    };
    if !scope.publishes_inserts() {
        let actions = if scope.actions.is_empty() {
            "nothing".to_owned()
        } else {
            scope.actions.join(", ")
        };
        return Err(RelayError::PublicationWithoutInserts {
            publication: name.to_owned(),
            actions,
            with_insert: std::iter::once("insert")
                .chain(scope.actions.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // A configured outbox table the publication leaves out would be streamed past in silence:
    // its rows never arrive, the slot is confirmed beyond them, and retention would take them
    // for published.
    let missing = publication::tables(client, name, tables, Listed::Unpublished).await?;
    if !missing.is_empty() {
        return Err(RelayError::PublicationMissesTables {
            publication: name.to_owned(),
            tables: missing.join(", "),
        });
    }
    Ok(scope.beyond_inserts().map(|beyond| {
        let narrow = scope.narrowing(tables);
        let table = settings.outbox.tables_display();
        let how = if narrow.is_empty() {
            String::new()
        } else {
            format!("; to narrow it, only if nothing else uses it: {}", narrow.join("; "))
        };
        format!(
            "publication {name} publishes {beyond} beyond the inserts into {table}: changes of other tables and \
             updates, deletes and truncates of {table} are decoded by the server and ignored by the relay (a small \
             decoding cost){how}"
        )
    }))
}

/// Logs the note [`check`] returned, the first time only (sessions restart on every reconnect).
pub(crate) fn log_note(note: Option<String>, noted: &mut bool) {
    if let Some(note) = note.filter(|_| !*noted) {
        info!(publication_note = %note, "publication used as it is");
        *noted = true;
    }
}
