//! Heartbeats: a tiny WAL record in this database every `heartbeat_interval_ms`.
//!
//! On a cluster where other databases write WAL while this one is idle, the walsender of this
//! slot still reads that WAL, but some server versions and managed services only move the
//! slot's `restart_lsn` when a record of this database is decoded. A non-transactional logical
//! message (`pg_logical_emit_message(false, …)`) is such a record, costs a few dozen bytes, and
//! is not an outbox event: pgoutput passes it to the relay as a Message, which the stream
//! ignores, and the keepalive after it lets the confirmed position move on.
//!
//! Only the streaming instance sends heartbeats (standbys must not write). Failures are logged
//! and retried on the next tick; they never stop the stream.

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_postgres::Client;
use tracing::{debug, info, warn};

use crate::config::Settings;
use crate::postgres::client as pg_client;

/// The message prefix (docs/operations.md): consumers of the slot's messages tell heartbeats
/// apart by it. A literal in the statement, so no prepare round trip per heartbeat.
macro_rules! heartbeat_prefix {
    () => {
        "outbox-relay-heartbeat"
    };
}

const HEARTBEAT_SQL: &str = concat!(
    "SELECT pg_logical_emit_message(false, '",
    heartbeat_prefix!(),
    "', ''::text)::text"
);

/// The heartbeat task of one session; dropping it stops the heartbeats.
pub(crate) struct Heartbeat(JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts heartbeats on `runtime` if `relay.heartbeat_interval_ms` is set, on a connection of
/// their own (reconnecting when it breaks).
pub(crate) fn spawn(settings: &Settings, runtime: &Handle) -> Option<Heartbeat> {
    let every = settings.relay.heartbeat_interval?;
    let postgres = settings.postgres.clone();
    let connect_timeout = settings.relay.connect_timeout;
    Some(Heartbeat(runtime.spawn(async move {
        let mut client: Option<Client> = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            if client.is_none() {
                match pg_client::connect(&postgres, connect_timeout).await {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        report_failure(&mut failing, &e.to_string());
                        continue;
                    }
                }
            }
            let Some(c) = client.as_ref() else { continue };
            let wait = every.max(Duration::from_secs(5));
            match tokio::time::timeout(wait, c.query_one(HEARTBEAT_SQL, &[])).await {
                Ok(Ok(row)) => {
                    if std::mem::take(&mut failing) {
                        info!("heartbeats resumed");
                    }
                    debug!(lsn = row.get::<_, &str>(0), "heartbeat");
                }
                Ok(Err(e)) => {
                    report_failure(&mut failing, &e.to_string());
                    client = None;
                }
                Err(_) => {
                    report_failure(&mut failing, &format!("no answer within {wait:?}"));
                    client = None;
                }
            }
        }
    })))
}

/// Logs the first failure of a streak only, so an outage does not flood the log.
fn report_failure(failing: &mut bool, error: &str) {
    if !std::mem::replace(failing, true) {
        warn!(
            error,
            "heartbeat failed (pg_logical_emit_message); retrying every interval. The role needs EXECUTE on it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_emits_the_documented_prefix() {
        assert_eq!(
            HEARTBEAT_SQL,
            "SELECT pg_logical_emit_message(false, 'outbox-relay-heartbeat', ''::text)::text"
        );
    }
}
