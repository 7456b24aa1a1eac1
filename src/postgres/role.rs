//! What the connected role may do, by the rules the server itself applies: the one query
//! `setup`, `setup --check` and `run` ask, so the three refuse the same role for the same reason.
//!
//! Invariant: **each fact is the server's own test, not a guess from names.** REPLICATION is the
//! attribute (or superuser, or RDS's `rds_replication` membership, which the managed service
//! grants instead); "reads every walsender's details" is `pg_has_role(…, 'USAGE')` on
//! `pg_read_all_stats` — the privilege check `pg_stat_replication` makes before it shows a
//! walsender's `reply_time`, `flush_lag` and `sent_lsn` (membership through `pg_monitor` and
//! superuser count, as they do there); CREATE is `has_database_privilege`.

use tokio_postgres::Client;

use crate::config::ident::quote_ident;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
