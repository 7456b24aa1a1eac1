//! Errors of the replication connection, classified by what the caller does with them (with the
//! SQLSTATE classification the control connection uses too, [`crate::postgres::failure`]).

use std::fmt;

use crate::postgres::failure::{io_hint, is_transient_sqlstate, sqlstate_hint};

/// An `ErrorResponse` from the server, with the fields an operator needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    pub(crate) severity: String,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) detail: Option<String>,
    pub(crate) hint: Option<String>,
}

impl std::error::Error for ServerError {}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " (detail: {d})")?;
        }
        if let Some(h) = &self.hint {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("replication connection I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot connect to {host}:{port} for replication: {source}. Hint: {}", io_hint(.source))]
    Connect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("server error: {}{}", .0, server_hint(.0))]
    Server(Box<ServerError>),
    #[error("replication protocol violation: {0}")]
    Protocol(String),
    /// Authentication cannot even be attempted (no password, unsupported method, no TLS).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The server refused the credentials (SQLSTATE class 28).
    #[error("authentication failed: {server}{}", server_hint(server))]
    AuthRefused {
        #[source]
        server: ServerError,
    },
    #[error(transparent)]
    Tls(#[from] crate::postgres::tls::TlsError),
    #[error("{what} timed out after {after:?}")]
    Timeout {
        what: &'static str,
        after: std::time::Duration,
    },
    #[error("the server closed the replication stream")]
    Closed,
    /// No host of `postgres.url` is the primary right now (each skipped, with why); a standby
    /// may be promoted, so this is retried.
    #[error(
        "no host in postgres.url is the primary (target_session_attrs={target}): {}. Retrying: after a failover the \
         promoted standby is found once it accepts writes",
        .skipped.join("; ")
    )]
    NoPrimary { target: &'static str, skipped: Vec<String> },
    /// `postgres.streaming = "on"` on a server without streaming of in-progress transactions.
    #[error(
        "postgres.streaming = \"on\", but PostgreSQL {version} cannot stream transactions before they commit (that \
         came with 14). Upgrade the server, or set postgres.streaming = \"auto\" (or \"off\") to have large \
         transactions sent after their commit"
    )]
    StreamingUnsupported { version: String },
}

impl ServerError {
    /// The server refused a slot that a standby synchronizes from its primary (PostgreSQL
    /// 17+, SQLSTATE 55000 "… is being synchronized from the primary server"): we reached a
    /// standby, not the primary. After a promotion the same slot is usable, so this is "try
    /// again / try the next host", never fatal.
    pub(crate) fn is_synced_slot_on_standby(&self) -> bool {
        self.code == "55000"
            && [self.message.as_str(), self.detail.as_deref().unwrap_or_default()]
                .iter()
                .any(|t| t.contains("being synchronized from the primary"))
    }
}

impl ReplicationError {
    /// True when reconnecting later can succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            ReplicationError::Io(_)
            | ReplicationError::Connect { .. }
            | ReplicationError::Timeout { .. }
            | ReplicationError::Closed
            | ReplicationError::NoPrimary { .. } => true,
            ReplicationError::Server(e) => is_transient_sqlstate(&e.code) || e.is_synced_slot_on_standby(),
            ReplicationError::Protocol(_)
            | ReplicationError::Auth(_)
            | ReplicationError::AuthRefused { .. }
            | ReplicationError::Tls(_)
            | ReplicationError::StreamingUnsupported { .. } => false,
        }
    }

    /// The server error code, if the server sent one.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        match self {
            ReplicationError::Server(e) => Some(&e.code),
            ReplicationError::AuthRefused { server, .. } => Some(&server.code),
            _ => None,
        }
    }
}

/// ". Hint: …" for a server error whose SQLSTATE has one.
fn server_hint(e: &ServerError) -> String {
    if e.is_synced_slot_on_standby() {
        return ". Hint: this host is a standby whose copy of the failover slot follows the primary's; not the \
                primary, retrying (list the primary's hosts in postgres.url with target_session_attrs=read-write to \
                skip standbys)"
            .into();
    }
    sqlstate_hint(&e.code)
        .map(|h| format!(". Hint: {h}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn server(code: &str, message: &str) -> ServerError {
        ServerError {
            severity: "FATAL".into(),
            code: code.into(),
            message: message.into(),
            ..ServerError::default()
        }
    }

    #[test]
    fn a_refused_login_is_fatal_and_keeps_the_server_error() {
        let err = ReplicationError::AuthRefused {
            server: server("28P01", "password authentication failed for user \"relay\""),
        };
        assert!(!err.is_transient());
        assert_eq!(err.sqlstate(), Some("28P01"));
        let source = err.source().and_then(|s| s.downcast_ref::<ServerError>());
        assert_eq!(source.map(|s| s.code.as_str()), Some("28P01"));
        let msg = err.to_string();
        assert!(
            msg.contains("password authentication failed") && msg.contains("pg_hba.conf"),
            "{msg}"
        );
    }

    #[test]
    fn server_errors_are_classified_by_sqlstate_with_a_hint() {
        let busy = ReplicationError::Server(Box::new(server("53300", "sorry, too many clients already")));
        assert!(busy.is_transient());
        assert!(busy.to_string().contains("max_connections"), "{busy}");
        for code in ["42501", "3D000", "28000"] {
            assert!(
                !ReplicationError::Server(Box::new(server(code, "x"))).is_transient(),
                "{code}"
            );
        }
        let synced = ReplicationError::Server(Box::new(ServerError {
            detail: Some("This replication slot is being synchronized from the primary server.".into()),
            ..server(
                "55000",
                "cannot use replication slot \"outbox_relay\" for logical decoding",
            )
        }));
        assert!(synced.is_transient(), "{synced}");
        assert!(synced.to_string().contains("not the primary"), "{synced}");
        assert!(!ReplicationError::Server(Box::new(server("55000", "other"))).is_transient());
        let none = ReplicationError::NoPrimary {
            target: "read-write",
            skipped: vec![
                "a:1: not the primary: it is a standby".into(),
                "b:2: connection refused".into(),
            ],
        };
        assert!(none.is_transient());
        assert!(none.to_string().contains("a:1: not the primary") && none.to_string().contains("b:2"));
        let refused = ReplicationError::Connect {
            host: "db.internal".into(),
            port: 5433,
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(refused.is_transient());
        let msg = refused.to_string();
        assert!(
            msg.contains("db.internal:5433") && msg.contains("server is running"),
            "{msg}"
        );
    }
}
