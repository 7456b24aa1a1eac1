//! A claimed row as the domain's [`OutboxEvent`](crate::outbox::event::OutboxEvent).
//!
//! The claim query selects the mapped columns as text (see [`super::sql`]), in
//! [`crate::config::outbox::OutboxMapping::columns`] order: exactly what
//! [`OutboxEvent::from_columns`](crate::outbox::event::OutboxEvent::from_columns) takes, which
//! applies the streaming path's rules. So a polled row and the same row streamed from the WAL
//! give identical records (`OutboxEvent::record`; `tests/it/poll.rs`).

use tokio_postgres::Row;

use super::error::PollError;
use crate::outbox::bad_event::BadEvent;

/// The claim query's columns as text (`None` = NULL), borrowed from `row`, for
/// [`OutboxEvent::from_columns`](crate::outbox::event::OutboxEvent::from_columns).
pub(crate) fn claimed_values(row: &Row) -> Result<Vec<Option<&str>>, PollError> {
    (0..row.len())
        .map(|i| {
            // Every column is `format(…)` text; a decoding failure is impossible short of a bug.
            row.try_get(i).map_err(|e| PollError::BadEvent {
                id: "?".into(),
                cause: BadEvent::Rejected(format!("column {i} of the claim is not text: {e}")),
            })
        })
        .collect()
}
