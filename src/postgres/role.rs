//! What the connected role may do, by the rules the server itself applies, and what the
//! configuration asks of it: the one query and the one check `run` (before its sessions,
//! [`check_session`]), `setup` and `setup --check` (preflight, [`check`]) make, so the three
//! refuse the same role with the same words.
//!
//! Invariants:
//! * **Each fact is the server's own test, not a guess from names.** REPLICATION is the
//!   attribute (or superuser, or RDS's `rds_replication` membership, which the managed service
//!   grants instead); "reads every walsender's details" is `pg_has_role(…, 'USAGE')` on
//!   `pg_read_all_stats` — the privilege check `pg_stat_replication` makes before it shows a
//!   walsender's `reply_time`, `flush_lag` and `sent_lsn` (membership through `pg_monitor` and
//!   superuser count, as they do there); CREATE is `has_database_privilege`.
//! * **A role that can never stream fails at once**, whether the slot is free or busy: without
//!   REPLICATION a standby could wait forever for a slot it cannot take, so `run` checks it before
//!   it looks at the slot.
//! * **A configured takeover that can never work does not start.** With
//!   `relay.takeover_after_ms` a standby terminates only a holder it sees silent
//!   (`relay/standby.rs`), and only a role with the privileges of `pg_read_all_stats` sees a
//!   holder's status updates: without them the setting would silently do nothing, so it is
//!   refused with the GRANT to run. Exactly-once by read-back still works without them — every
//!   takeover then waits its whole fence (`relay/takeover.rs`) — so that is a warning.
//!
//! `run` checks REPLICATION before every session and the rest once per process: privileges
//! revoked while the relay runs make a standby blind, not fatal, and a blind standby never
//! terminates a holder.

use tokio_postgres::Client;

use crate::config::ident::quote_ident;
use crate::config::Settings;

/// The connected role's standing, as the server judges it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RoleFacts {
    /// `current_user`.
    pub(crate) name: String,
    pub(crate) superuser: bool,
    /// May start a walsender: superuser, the REPLICATION attribute, or `rds_replication`.
    pub(crate) replication: bool,
    /// Has the privileges of `pg_read_all_stats`: `pg_stat_replication` shows it every
    /// walsender's details. Without them a walsender's row carries its pid and nothing of its
    /// replies (`reply_time`, `flush_lag`, `sent_lsn` read NULL).
    pub(crate) reads_all_stats: bool,
    /// CREATE on the current database (`CREATE PUBLICATION` needs it).
    pub(crate) create_on_database: bool,
}

impl RoleFacts {
    /// `GRANT pg_read_all_stats TO "role";`: what makes the walsenders' replies visible.
    pub(crate) fn stats_grant(&self) -> String {
        stats_grant(&self.name)
    }

    /// `ALTER ROLE "role" REPLICATION;`: what lets the role start a walsender.
    pub(crate) fn replication_fix(&self) -> String {
        replication_fix(&self.name)
    }
}

/// `GRANT pg_read_all_stats TO "role";`
pub(crate) fn stats_grant(role: &str) -> String {
    format!("GRANT pg_read_all_stats TO {};", quote_ident(role))
}

/// `ALTER ROLE "role" REPLICATION;`
pub(crate) fn replication_fix(role: &str) -> String {
    format!("ALTER ROLE {} REPLICATION;", quote_ident(role))
}

const ROLE_QUERY: &str = "
SELECT current_user::text,
       r.rolsuper,
       r.rolsuper OR r.rolreplication
         OR EXISTS (SELECT 1 FROM pg_roles g
                     WHERE g.rolname = 'rds_replication' AND pg_has_role(r.oid, g.oid, 'MEMBER')),
       pg_has_role(r.oid, 'pg_read_all_stats', 'USAGE'),
       has_database_privilege(current_database(), 'CREATE')
  FROM pg_roles r
 WHERE r.rolname = current_user";

/// Reads the connected role's facts.
pub(crate) async fn role_facts(client: &Client) -> Result<RoleFacts, tokio_postgres::Error> {
    let row = client.query_one(ROLE_QUERY, &[]).await?;
    Ok(RoleFacts {
        name: row.get(0),
        superuser: row.get(1),
        replication: row.get(2),
        reads_all_stats: row.get(3),
        create_on_database: row.get(4),
    })
}

/// The role cannot do what the configuration asks of it. Fatal: an operator changes the role
/// or the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleRefusal {
    #[error(
        "role {role} may not stream from a replication slot: it has neither the REPLICATION attribute nor \
         superuser, so it could never take the slot over, free or held. As a superuser run: {fix}"
    )]
    NoReplication { role: String, fix: String },
    #[error(
        "relay.takeover_after_ms = {takeover_after_ms}, but role {role} cannot see a slot holder's status updates \
         (pg_stat_replication.reply_time needs the privileges of pg_read_all_stats), so a standby could never tell \
         a frozen holder from a healthy one and never takes over. Run: {grant} — or remove relay.takeover_after_ms"
    )]
    TakeoverBlind {
        role: String,
        takeover_after_ms: u64,
        grant: String,
    },
}

/// Checks `role` against what `settings` asks of it: `Err` when it cannot work at all, `Ok(Some)`
/// with a warning when it works worse than it could. `fenced`: a takeover waits a fence timed
/// from the holder's status updates (`crate::sink::takeover_fenced`).
pub(crate) fn check(settings: &Settings, role: &RoleFacts, fenced: bool) -> Result<Option<String>, RoleRefusal> {
    replication(role)?;
    if role.reads_all_stats {
        return Ok(None);
    }
    if let Some(limit) = settings.relay.takeover_after {
        return Err(RoleRefusal::TakeoverBlind {
            role: role.name.clone(),
            takeover_after_ms: limit.as_millis() as u64,
            grant: role.stats_grant(),
        });
    }
    Ok(fenced.then(|| {
        format!(
            "role {} cannot see a slot holder's status updates (pg_stat_replication.reply_time needs the privileges \
             of pg_read_all_stats), so an exactly-once takeover cannot tell a holder that stopped from one that went \
             silent, and every takeover waits its whole fence (docs/operations.md, \"Standby and takeover\"). Run: {}",
            role.name,
            role.stats_grant()
        )
    }))
}

fn replication(role: &RoleFacts) -> Result<(), RoleRefusal> {
    if role.replication {
        return Ok(());
    }
    Err(RoleRefusal::NoReplication {
        role: role.name.clone(),
        fix: role.replication_fix(),
    })
}

/// `run`'s check before a session: [`check`] in full once per process (`checked` remembers it,
/// and its warning is logged then), REPLICATION alone after that.
pub(crate) fn check_session(
    settings: &Settings,
    role: &RoleFacts,
    fenced: bool,
    checked: &mut bool,
) -> Result<(), RoleRefusal> {
    if *checked {
        return replication(role);
    }
    if let Some(warning) = check(settings, role, fenced)? {
        tracing::warn!(slot = %settings.postgres.slot, "{warning}");
    }
    *checked = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

    #[test]
    fn the_fixes_are_statements_to_paste() {
        let role = RoleFacts {
            name: "relay".into(),
            ..RoleFacts::default()
        };
        assert_eq!(role.stats_grant(), r#"GRANT pg_read_all_stats TO "relay";"#);
        assert_eq!(role.replication_fix(), r#"ALTER ROLE "relay" REPLICATION;"#);
        assert_eq!(stats_grant(r#"We"ird"#), r#"GRANT pg_read_all_stats TO "We""ird";"#);
    }

    fn role(replication: bool, reads_all_stats: bool) -> RoleFacts {
        RoleFacts {
            name: "relay".into(),
            replication,
            reads_all_stats,
            ..RoleFacts::default()
        }
    }

    #[test]
    fn without_replication_nothing_can_work() {
        let err = check(&settings(""), &role(false, true), false).unwrap_err();
        assert_eq!(
            err,
            RoleRefusal::NoReplication {
                role: "relay".into(),
                fix: r#"ALTER ROLE "relay" REPLICATION;"#.into()
            }
        );
        assert!(err.to_string().contains("REPLICATION attribute"), "{err}");
    }

    #[test]
    fn a_takeover_that_could_never_happen_is_refused_with_the_grant() {
        let takeover = settings("[relay]\ntakeover_after_ms = 3000\n");
        let err = check(&takeover, &role(true, false), false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(r#"GRANT pg_read_all_stats TO "relay";"#) && msg.contains("takeover_after_ms = 3000"),
            "{msg}"
        );
        assert_eq!(check(&takeover, &role(true, true), false), Ok(None));
        assert_eq!(
            check(&settings(""), &role(true, false), false),
            Ok(None),
            "no takeover asked for"
        );
    }

    #[test]
    fn run_checks_the_grant_once_and_replication_every_session() {
        let takeover = settings("[relay]\ntakeover_after_ms = 3000\n");
        let mut checked = false;
        assert!(check_session(&takeover, &role(true, false), false, &mut checked).is_err());
        assert!(!checked);
        check_session(&takeover, &role(true, true), false, &mut checked).unwrap();
        assert!(checked);
        // Revoked while running: the standby goes blind (it never terminates), it does not stop.
        check_session(&takeover, &role(true, false), false, &mut checked).unwrap();
        assert!(matches!(
            check_session(&takeover, &role(false, true), false, &mut checked),
            Err(RoleRefusal::NoReplication { .. })
        ));
    }

    #[test]
    fn an_exactly_once_read_back_without_the_grant_is_a_warning() {
        let eo = settings("[relay]\ndelivery = \"exactly-once\"\n");
        let warning = check(&eo, &role(true, false), true).unwrap().expect("a warning");
        assert!(
            warning.contains("whole fence") && warning.contains(r#"GRANT pg_read_all_stats TO "relay";"#),
            "{warning}"
        );
        assert_eq!(check(&eo, &role(true, true), true), Ok(None));
    }
}
