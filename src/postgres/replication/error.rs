//! Errors of the replication connection, classified by what the caller does with them (with the
//! SQLSTATE classification the control connection uses too, [`crate::postgres::failure`]).

use std::fmt;

use crate::postgres::failure::{io_hint, is_transient_sqlstate, sqlstate_hint};

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
    #[error("cannot connect to {host}:{port} for replication: {source}. Hint: {}", io_hint(.source))]
    Connect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("server error: {}{}", .0, server_hint(.0))]
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
            ReplicationError::Io(_)
            | ReplicationError::Connect { .. }
            | ReplicationError::Timeout { .. }
            | ReplicationError::Closed => true,
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

/// ". Hint: …" for a server error whose SQLSTATE has one.
fn server_hint(e: &ServerError) -> String {
    sqlstate_hint(&e.code)
        .map(|h| format!(". Hint: {h}"))
        .unwrap_or_default()
}
