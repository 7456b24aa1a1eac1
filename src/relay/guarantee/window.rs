//! The replay window of an exactly-once session: from the slot's confirmed position up to the
//! server's WAL position read once the slot was the session's ([`ReplayWindow::start`]). Only
//! events whose transaction committed inside it can have been published before; the strategies
//! that check a replay (read-back) or let the broker drop it (deduplication) say once, when the
//! stream got past it, what the window held.

use crate::postgres::lsn::Lsn;
use crate::relay::error::RelayError;

/// Where the stream stands against the replay window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Inside,
    /// Got past it, and said so.
    Past,
}

#[derive(Debug)]
pub(super) struct ReplayWindow {
    pub(super) start: Lsn,
    pub(super) end: Lsn,
    standing: Standing,
}

impl ReplayWindow {
    pub(super) fn new(start: Lsn, end: Lsn) -> ReplayWindow {
        ReplayWindow {
            start,
            end,
            standing: Standing::Inside,
        }
    }

    /// The window of a session whose slot starts at `start`: it ends at the server's WAL
    /// position now — no transaction committing at or after it can have been sent to an
    /// earlier walsender (read once the slot is this session's).
    pub(super) async fn start(control: &tokio_postgres::Client, start: Lsn) -> Result<ReplayWindow, RelayError> {
        let row = control
            .query_one(
                "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)::text",
                &[],
            )
            .await?;
        let text: Option<String> = row.get(0);
        let end = text
            .and_then(|t| t.parse::<Lsn>().ok())
            .ok_or(RelayError::NoWalPosition)?;
        Ok(ReplayWindow::new(start, end))
    }

    /// Whether a transaction committed at `commit_lsn` may have been published before.
    pub(super) fn holds(&self, commit_lsn: Lsn) -> bool {
        commit_lsn < self.end
    }

    /// The stream reached `lsn`: true the first time that is past the window (the caller says
    /// what the window held, once).
    pub(super) fn reached(&mut self, lsn: Lsn) -> bool {
        self.passed_on(lsn >= self.end)
    }

    /// The session ends: true if the stream never got past the window (the caller says what it
    /// held then).
    pub(super) fn close(&mut self) -> bool {
        self.passed_on(true)
    }

    /// The stream got past the window.
    pub(super) fn is_past(&self) -> bool {
        self.standing == Standing::Past
    }

    fn passed_on(&mut self, past: bool) -> bool {
        let first = past && self.standing == Standing::Inside;
        if first {
            self.standing = Standing::Past;
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_passed_once_and_closing_after_it_says_nothing_more() {
        let mut w = ReplayWindow::new(Lsn(0x100), Lsn(0x200));
        assert!(w.holds(Lsn(0x1ff)) && !w.holds(Lsn(0x200)));
        assert!(!w.reached(Lsn(0x1ff)) && !w.is_past());
        assert!(w.reached(Lsn(0x200)) && w.is_past());
        assert!(!w.reached(Lsn(0x300)), "said once");
        assert!(!w.close(), "already said");
        let mut open = ReplayWindow::new(Lsn(0x100), Lsn(0x200));
        assert!(
            open.close(),
            "a session that ends inside the window says what it found then"
        );
    }
}
