//! Errors of the replication connection, classified by what the caller does with them.

use std::fmt;

/// An `ErrorResponse` from the server, with the fields an operator needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

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
    #[error("server error: {0}")]
    Server(ServerError),
    #[error("replication protocol violation: {0}")]
    Protocol(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error(transparent)]
    Tls(#[from] crate::postgres::tls::TlsError),
    #[error("{what} timed out after {after:?}")]
    Timeout {
        what: &'static str,
        after: std::time::Duration,
    },
    #[error("the server closed the replication stream")]
    Closed,
}

impl ReplicationError {
    /// True when reconnecting later can succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            ReplicationError::Io(_) | ReplicationError::Timeout { .. } | ReplicationError::Closed => true,
            ReplicationError::Server(e) => is_transient_sqlstate(&e.code),
            ReplicationError::Protocol(_) | ReplicationError::Auth(_) | ReplicationError::Tls(_) => false,
        }
    }

    /// The server error code, if the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ReplicationError::Server(e) => Some(&e.code),
            _ => None,
        }
    }
}

/// SQLSTATEs after which a retry can succeed: the slot is busy (another instance streams),
/// the server is shutting down or restarting, connections are exhausted, or the link broke.
pub fn is_transient_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "55006" // object_in_use: the slot is active for another walsender
            | "57P01" // admin_shutdown (also pg_terminate_backend)
            | "57P02" // crash_shutdown
            | "57P03" // cannot_connect_now (starting up / recovery)
            | "53300" // too_many_connections
            | "53400" // configuration_limit_exceeded (max_wal_senders)
            | "40001"
            | "40P01"
    ) || code.starts_with("08")
}
