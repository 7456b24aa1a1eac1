//! `[postgres]`: the source database — connection URL (a [`Secret`]), replication slot and
//! publication names, the optional CA bundle that turns on certificate verification, and
//! whether the slot is a failover slot (PostgreSQL 17+).
//!
//! Several hosts in the URL are a primary and its standbys: with `target_session_attrs` =
//! `read-write` or `primary` every connection, the replication one included, goes to the host
//! that is the primary ([`TargetSession`]). `tokio-postgres` knows only `read-write`, so
//! `primary` reaches it as `read-write` (what a primary always is, unless
//! `default_transaction_read_only` is on), and our replication connection checks the
//! stricter `primary` itself.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::ident::SimpleName;
use crate::config::secret::Secret;
use crate::config::{named, ConfigError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostgresSection {
    pub(crate) url: Secret,
    #[serde(default = "default_slot")]
    pub(crate) slot: String,
    #[serde(default = "default_slot")]
    pub(crate) publication: String,
    /// CA bundle (PEM) to verify the server certificate against; enables verify-full.
    #[serde(default)]
    pub(crate) sslrootcert: Option<PathBuf>,
    #[serde(default)]
    pub(crate) failover_slot: FailoverSlot,
    #[serde(default)]
    pub(crate) streaming: Streaming,
}

/// `postgres.streaming`: whether large transactions are streamed to the relay before they
/// commit (pgoutput protocol 2, PostgreSQL 14+) instead of being spilled to the primary's disk
/// and sent after their commit (`postgres/replication/protocol.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Streaming {
    /// On where the server supports it (14+), off elsewhere.
    #[default]
    Auto,
    /// Required: a session on a server older than 14 fails.
    On,
    /// Never: protocol 1, every transaction sent after its commit.
    Off,
}

impl Streaming {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Streaming::Auto => "auto",
            Streaming::On => "on",
            Streaming::Off => "off",
        }
    }
}

/// `postgres.failover_slot`: whether `setup` makes the slot a failover slot, synchronized to
/// physical standbys (`sync_replication_slots`) so that it survives a promotion. PostgreSQL
/// 17+ only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverSlot {
    /// On where the server supports it (17+), off elsewhere.
    #[default]
    Auto,
    /// Required: `setup` fails on a server older than 17.
    On,
    /// Never (a slot that already has it keeps it).
    Off,
}

impl FailoverSlot {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailoverSlot::Auto => "auto",
            FailoverSlot::On => "on",
            FailoverSlot::Off => "off",
        }
    }
}

/// `target_session_attrs` of `postgres.url`: which of its hosts a connection may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TargetSession {
    /// The first host that accepts the connection (the default).
    #[default]
    Any,
    /// A host that accepts writes: not in recovery, `default_transaction_read_only` off.
    ReadWrite,
    /// A host that is not in recovery.
    Primary,
}

impl TargetSession {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TargetSession::Any => "any",
            TargetSession::ReadWrite => "read-write",
            TargetSession::Primary => "primary",
        }
    }
}

/// Reads `target_session_attrs` from the URL (query or key=value form) and rewrites `primary`
/// to `read-write`, which is what `tokio-postgres` understands.
fn target_session(url: &str) -> Result<(TargetSession, String), ConfigError> {
    let key = "target_session_attrs=";
    let Some(at) = url.find(key) else {
        return Ok((TargetSession::Any, url.to_owned()));
    };
    let value_start = at + key.len();
    let value_end = url[value_start..]
        .find(|c: char| c == '&' || c.is_whitespace())
        .map_or(url.len(), |i| value_start + i);
    let value = &url[value_start..value_end];
    let target = match value {
        "any" => TargetSession::Any,
        "read-write" => TargetSession::ReadWrite,
        "primary" => TargetSession::Primary,
        other => {
            return Err(ConfigError::Invalid {
                key: "postgres.url",
                message: format!(
                    "target_session_attrs={other}: the relay must reach the primary (it creates and streams from a \
                     slot, and only a primary has one it may use); use target_session_attrs=read-write or primary, \
                     or leave it out (any: the first host that answers)"
                ),
            })
        }
    };
    let rewritten = format!("{}read-write{}", &url[..value_start], &url[value_end..]);
    Ok((
        target,
        if target == TargetSession::Primary {
            rewritten
        } else {
            url.to_owned()
        },
    ))
}

fn default_slot() -> String {
    "outbox_relay".into()
}

#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// The URL as configured (password inside; prints redacted).
    pub(crate) url: Secret,
    pub(crate) connection: tokio_postgres::Config,
    pub slot: SimpleName,
    pub(crate) publication: SimpleName,
    pub(crate) sslrootcert: Option<PathBuf>,
    pub(crate) failover_slot: FailoverSlot,
    pub(crate) streaming: Streaming,
    /// Which host of the URL a connection may use (see the module docs).
    pub(crate) target_session: TargetSession,
}

impl PostgresSettings {
    /// `host:port` of each host in the URL, in order.
    pub(crate) fn host_ports(&self) -> Vec<(tokio_postgres::config::Host, u16)> {
        let cfg = &self.connection;
        cfg.get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = cfg
                    .get_ports()
                    .get(i)
                    .or_else(|| cfg.get_ports().first())
                    .copied()
                    .unwrap_or(5432);
                (host.clone(), port)
            })
            .collect()
    }
}

impl PostgresSection {
    pub(crate) fn validate(self) -> Result<PostgresSettings, ConfigError> {
        let (target_session, url) = target_session(self.url.expose())?;
        let connection: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| ConfigError::Invalid {
                key: "postgres.url",
                message: format!(
                    "{} is not a PostgreSQL connection URL ({e}); expected e.g. postgres://user:password@host:5432/dbname",
                    self.url
                ),
            })?;
        if connection.get_hosts().is_empty() {
            return Err(ConfigError::Invalid {
                key: "postgres.url",
                message: "names no host; add one, e.g. postgres://user@127.0.0.1:5432/app".into(),
            });
        }
        if connection.get_user().is_none() {
            return Err(ConfigError::Invalid {
                key: "postgres.url",
                message: "names no user; add one, e.g. postgres://relay@127.0.0.1:5432/app".into(),
            });
        }
        if let Some(ca) = &self.sslrootcert {
            if !ca.is_file() {
                return Err(ConfigError::Invalid {
                    key: "postgres.sslrootcert",
                    message: format!(
                        "{} is not a readable file; point it at the server's CA certificate (PEM)",
                        ca.display()
                    ),
                });
            }
        }
        Ok(PostgresSettings {
            url: self.url,
            connection,
            slot: SimpleName::parse("postgres.slot", &self.slot).map_err(named("postgres.slot"))?,
            publication: SimpleName::parse("postgres.publication", &self.publication)
                .map_err(named("postgres.publication"))?,
            sslrootcert: self.sslrootcert,
            failover_slot: self.failover_slot,
            streaming: self.streaming,
            target_session,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_session_attrs_primary_reaches_tokio_postgres_as_read_write() {
        let (t, url) = target_session("postgres://u@a:1,b:2/db?target_session_attrs=primary&sslmode=disable").unwrap();
        assert_eq!(t, TargetSession::Primary);
        assert_eq!(
            url,
            "postgres://u@a:1,b:2/db?target_session_attrs=read-write&sslmode=disable"
        );
        let (t, url) = target_session("postgres://u@a/db?target_session_attrs=read-write").unwrap();
        assert_eq!(
            (t, url.as_str()),
            (
                TargetSession::ReadWrite,
                "postgres://u@a/db?target_session_attrs=read-write"
            )
        );
        assert_eq!(target_session("postgres://u@a/db").unwrap().0, TargetSession::Any);
        assert_eq!(
            target_session("host=a,b user=u target_session_attrs=primary")
                .unwrap()
                .1,
            "host=a,b user=u target_session_attrs=read-write"
        );
        let err = target_session("postgres://u@a/db?target_session_attrs=standby").unwrap_err();
        assert!(err.to_string().contains("must reach the primary"), "{err}");
    }
}
