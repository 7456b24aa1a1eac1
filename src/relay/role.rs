//! What `run` needs of its database role, checked on the control connection before its
//! sessions ([`check_session`]) — and by `setup` and `setup --check`, which call [`check`] too,
//! so the three refuse the same role with the same words.
//!
//! Invariants:
//! * **A role that can never stream fails at once**, whether the slot is free or busy: without
//!   REPLICATION a standby could wait forever for a slot it cannot take, so the check comes before
//!   the slot is looked at.
//! * **A configured takeover that can never work does not start.** With
//!   `relay.takeover_after_ms` a standby terminates only a holder it sees silent
//!   (`standby.rs`), and only a role with the privileges of `pg_read_all_stats` sees a holder's
//!   status updates: without them the setting would silently do nothing, so it is refused with
//!   the GRANT to run. Exactly-once by read-back still works without them — every takeover then
//!   waits its whole fence (`takeover.rs`) — so that is a warning.
//!
//! REPLICATION is checked before every session; the rest once per process, at its first
//! session: privileges revoked while the relay runs make a standby blind, not fatal, and a blind
//! standby never terminates a holder (`standby.rs`).

use crate::config::relay::Delivery;
use crate::config::Settings;
use crate::postgres::role::RoleFacts;
use crate::sink::ExactlyOnce;

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
/// with a warning when it works worse than it could.
pub(crate) fn check(settings: &Settings, role: &RoleFacts) -> Result<Option<String>, RoleRefusal> {
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
    let fenced = settings.relay.delivery == Delivery::ExactlyOnce
        && matches!(crate::sink::exactly_once(settings), ExactlyOnce::ReadBack(sink) if sink.queue_expiry().is_some());
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
pub(crate) fn check_session(settings: &Settings, role: &RoleFacts, checked: &mut bool) -> Result<(), RoleRefusal> {
    if *checked {
        return replication(role);
    }
    if let Some(warning) = check(settings, role)? {
        tracing::warn!(slot = %settings.postgres.slot, "{warning}");
    }
    *checked = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::settings;

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
        let err = check(&settings(""), &role(false, true)).unwrap_err();
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
        let err = check(&takeover, &role(true, false)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(r#"GRANT pg_read_all_stats TO "relay";"#) && msg.contains("takeover_after_ms = 3000"),
            "{msg}"
        );
        assert_eq!(check(&takeover, &role(true, true)), Ok(None));
        assert_eq!(
            check(&settings(""), &role(true, false)),
            Ok(None),
            "no takeover asked for"
        );
    }

    #[test]
    fn run_checks_the_grant_once_and_replication_every_session() {
        let takeover = settings("[relay]\ntakeover_after_ms = 3000\n");
        let mut checked = false;
        assert!(check_session(&takeover, &role(true, false), &mut checked).is_err());
        assert!(!checked);
        check_session(&takeover, &role(true, true), &mut checked).unwrap();
        assert!(checked);
        // Revoked while running: the standby goes blind (it never terminates), it does not stop.
        check_session(&takeover, &role(true, false), &mut checked).unwrap();
        assert!(matches!(
            check_session(&takeover, &role(false, true), &mut checked),
            Err(RoleRefusal::NoReplication { .. })
        ));
    }

    #[test]
    fn an_exactly_once_read_back_without_the_grant_is_a_warning() {
        let eo = settings("[relay]\ndelivery = \"exactly-once\"\n");
        let warning = check(&eo, &role(true, false)).unwrap().expect("a warning");
        assert!(
            warning.contains("whole fence") && warning.contains(r#"GRANT pg_read_all_stats TO "relay";"#),
            "{warning}"
        );
        assert_eq!(check(&eo, &role(true, true)), Ok(None));
    }
}
