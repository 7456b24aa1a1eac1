//! What a standby does while another process holds the slot.
//!
//! The slot itself is the lock: PostgreSQL lets one walsender at a time stream from a slot, so
//! instances with the same config need no other coordination. A standby re-checks every
//! `relay.standby_poll_ms` and starts streaming as soon as the slot is free; it never interrupts
//! a healthy holder. Two exceptions end a holder's walsender, both logged:
//!
//! * the holder is **this process's own previous walsender** (left behind by a connection this
//!   process already gave up on, e.g. after a network cut, until `wal_sender_timeout`): nobody
//!   else is using it, so waiting would only delay the stream;
//! * the operator opted in with `relay.takeover_after_ms` and the holder has sent no status
//!   update for that long (a frozen or partitioned instance). The staleness test and
//!   `pg_terminate_backend` are one statement, so a holder that just recovered is spared.
//!
//! A holder whose status updates this role cannot see (`pg_stat_replication` shows
//! `reply_time` only with the privileges of `pg_read_all_stats`) is never judged silent: its
//! silence is unknown, not long. `run` refuses `takeover_after_ms` without those privileges
//! (`postgres/role.rs`), so this is met only when they were revoked while the relay ran; it is logged
//! once per holder.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tracing::{info, warn};

use super::error::RelayError;
use super::slot::{terminate_holder, SlotHolder};
use super::SessionContext;
use crate::config::Settings;
use crate::ops::health::Mode;
use crate::postgres::client as pg_client;
use crate::postgres::slot::Silence;

/// After terminating a holder, the next attempt comes this soon (its walsender needs a moment
/// to release the slot).
const AFTER_TERMINATE: Duration = Duration::from_millis(200);

/// The standby's memory between polls, so the log says things once, not every poll.
#[derive(Debug, Default)]
pub(crate) struct Standby {
    announced_holder: Option<Option<i32>>,
    /// The holder whose replies were hidden from this role, once that was logged.
    announced_hidden: Option<Option<i32>>,
    /// Our own old walsender, once asked to terminate: if it lingers (a frozen backend handles
    /// the signal only when it runs again), later attempts wait a standby poll, not a moment.
    terminated_own: Option<i32>,
}

impl Standby {
    /// The slot was busy; returns how long to wait before the next attempt.
    pub(crate) async fn on_busy(
        &mut self,
        settings: &Settings,
        ctx: &mut SessionContext,
        holder: &SlotHolder,
    ) -> Duration {
        let slot = settings.postgres.slot.as_str();
        if let Some(pid) = holder.pid.filter(|pid| Some(*pid) == ctx.carried.last_walsender) {
            if self.terminated_own == Some(pid) {
                return settings.relay.standby_poll;
            }
            info!(
                slot,
                walsender_pid = pid,
                "the slot is still held by this relay's previous walsender; ending it"
            );
            terminate(settings, pid, None).await;
            self.terminated_own = Some(pid);
            return AFTER_TERMINATE;
        }
        ctx.health.set_mode(Mode::Standby);
        ctx.carried.predecessor.observe(holder.silent_for(), Instant::now());
        if self.announced_holder != Some(holder.pid) {
            self.announced_holder = Some(holder.pid);
            info!(
                slot,
                holder = %holder,
                poll_ms = settings.relay.standby_poll.as_millis() as u64,
                "slot is held by another instance; standing by"
            );
        }
        if let (Some(limit), Silence::Hidden { role }) = (settings.relay.takeover_after, &holder.silence) {
            if self.announced_hidden != Some(holder.pid) {
                self.announced_hidden = Some(holder.pid);
                warn!(
                    slot,
                    holder = %holder,
                    takeover_after_ms = limit.as_millis() as u64,
                    "this relay cannot see whether the slot holder replies, so it never terminates it \
                     (relay.takeover_after_ms has no effect until {})",
                    crate::postgres::role::stats_grant(role)
                );
            }
        }
        if let (Some(limit), Some(pid), Some(silent)) = (settings.relay.takeover_after, holder.pid, holder.silent_for())
        {
            if silent >= limit {
                warn!(
                    slot,
                    holder = %holder,
                    takeover_after_ms = limit.as_millis() as u64,
                    "the slot holder sent no status update for longer than takeover_after_ms; terminating its walsender to take over"
                );
                if terminate(settings, pid, Some(limit)).await {
                    ctx.carried.predecessor.terminated();
                    return AFTER_TERMINATE;
                }
            }
        }
        settings.relay.standby_poll
    }

    /// The slot was acquired (or the session ended for another reason).
    pub(crate) fn reset(&mut self) {
        self.announced_holder = None;
        self.announced_hidden = None;
        self.terminated_own = None;
    }
}

/// Terminates `pid` if it still holds the slot (and was silent for `min_silence`); logs failures.
async fn terminate(settings: &Settings, pid: i32, min_silence: Option<Duration>) -> bool {
    let slot = settings.postgres.slot.as_str();
    let result = async {
        let client = pg_client::connect(&settings.postgres, settings.relay.connect_timeout).await?;
        terminate_holder(&client, slot, pid, min_silence).await
    };
    match tokio::time::timeout(settings.relay.connect_timeout, result).await {
        Ok(Ok(true)) => {
            info!(slot, walsender_pid = pid, "terminated the slot holder's walsender");
            true
        }
        Ok(Ok(false)) => {
            info!(
                slot,
                walsender_pid = pid,
                "the holder released the slot or replied meanwhile; not terminated"
            );
            false
        }
        Ok(Err(e)) => {
            let denied = matches!(&e, RelayError::Control(pg) if pg.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE));
            let hint = if denied {
                "; the relay's role must be the holder's role, a member of pg_signal_backend, or superuser"
            } else {
                ""
            };
            warn!(slot, walsender_pid = pid, error = %e, "could not terminate the slot holder{hint}");
            false
        }
        Err(_) => {
            warn!(slot, walsender_pid = pid, "terminating the slot holder timed out");
            false
        }
    }
}
