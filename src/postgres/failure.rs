//! Classifying and explaining PostgreSQL failures, for the control connection
//! ([`super::client`]) and the replication connection ([`super::replication`]) alike.
//!
//! Invariants:
//! * **One classification.** Whether an error is worth a reconnect is decided by the SQLSTATE
//!   (the server's error code) with [`is_transient_sqlstate`], whichever connection it came on,
//!   so a wrong password or a missing privilege stops the relay on either connection instead of
//!   being retried forever on one of them. Errors without a SQLSTATE are transient when they are
//!   I/O (connection refused or lost, timeouts, name resolution) and fatal otherwise (TLS
//!   verification, configuration).
//! * **Every message names the cause**: the server's message and SQLSTATE, or the operating
//!   system's error, plus a short hint on what to check. Never a password: callers print URLs
//!   through [`crate::config::secret::Secret`], and nothing here sees the URL.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::io;

/// SQLSTATEs after which a retry can succeed without anyone changing anything: the link broke
/// (class 08), the server is shutting down, restarting or still starting (57P01–57P03),
/// connections or WAL senders are exhausted (53300, 53400), the slot is busy (55006: another
/// instance streams), a statement was cancelled (57014), or a transaction lost a conflict
/// (40001, 40P01). Everything else — authentication (28xxx), privileges (42501), a missing
/// database or object (3D000, 42704, 42P01), bad configuration — needs an operator.
pub(crate) fn is_transient_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "55006" // object_in_use: the slot is active for another walsender
            | "57P01" // admin_shutdown (also pg_terminate_backend)
            | "57P02" // crash_shutdown
            | "57P03" // cannot_connect_now (starting up / recovery)
            | "57014" // query_canceled
            | "53300" // too_many_connections
            | "53400" // configuration_limit_exceeded (max_wal_senders)
            | "40001" // serialization_failure
            | "40P01" // deadlock_detected
    ) || code.starts_with("08")
}

/// What to check after a server error, by SQLSTATE.
pub(crate) fn sqlstate_hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "28P01" | "28000" => {
            "check the user and password in postgres.url, and that pg_hba.conf lets this user connect from this host \
             (with a `replication` line for the replication connection)"
        }
        "42501" => "grant the role the missing privilege (see docs/operations.md for what the relay needs)",
        "3D000" => "check the database name in postgres.url",
        "42704" | "42P01" => "run `outbox-relay setup`, or check the names in the config",
        "53300" => "the server has no free connection slots (max_connections); retrying",
        "53400" => "the server has no free WAL sender (max_wal_senders); retrying",
        "57P01" | "57P02" | "57P03" => "the server is shutting down, restarting or starting up; retrying",
        _ if code.starts_with("08") => "the connection broke; retrying",
        _ => return None,
    })
}

/// What to check after an operating-system error while connecting.
pub(crate) fn io_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => {
            "check the host and port in postgres.url and that the server is running and listens there \
             (listen_addresses, port)"
        }
        io::ErrorKind::TimedOut => "check the host, the port and any firewall in between",
        io::ErrorKind::NotFound => "check the host name in postgres.url",
        _ if e.to_string().contains("lookup") => "the host name did not resolve: check the host in postgres.url",
        _ => "check the host and port in postgres.url, the network, and that the server is running",
    }
}

/// The I/O error somewhere in `e`'s source chain (including `e` itself).
pub(crate) fn io_cause<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a io::Error> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io);
        }
        next = err.source();
    }
    None
}

/// Whether `e`'s source chain contains a TLS failure (a certificate that does not verify, a
/// handshake the server refused): retrying cannot fix that.
fn is_tls_failure(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = err.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            if inner.is::<rustls::Error>() {
                return true;
            }
        }
        next = err.source();
    }
    false
}

/// Whether reconnecting later can fix a `tokio-postgres` error (see the module docs).
pub(crate) fn is_transient_pg(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        return is_transient_sqlstate(db.code().code());
    }
    if e.is_closed() {
        return true;
    }
    !is_tls_failure(e) && io_cause(e).is_some()
}

/// A `tokio-postgres` error as an operator wants it: the server's message with SQLSTATE, detail
/// and hint; otherwise what failed and why, down the source chain (e.g. "error connecting to
/// server: Connection refused (os error 111)").
pub(crate) fn describe_pg(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            let _ = write!(s, "; detail: {detail}");
        }
        if let Some(hint) = db.hint() {
            let _ = write!(s, "; hint: {hint}");
        }
        return s;
    }
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !s.ends_with(&text) {
            let _ = write!(s, ": {text}");
        }
        next = cause.source();
    }
    s
}

/// What to check after a `tokio-postgres` error, if anything useful can be said.
pub(crate) fn pg_hint(e: &tokio_postgres::Error) -> Option<&'static str> {
    if let Some(db) = e.as_db_error() {
        return sqlstate_hint(db.code().code());
    }
    if is_tls_failure(e) {
        return Some("check sslmode in postgres.url and postgres.sslrootcert");
    }
    io_cause(e).map(io_hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_transient_only_when_waiting_can_help() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "53300", "53400", "55006", "40001",
        ] {
            assert!(is_transient_sqlstate(code), "{code}");
        }
        for code in ["28P01", "28000", "42501", "3D000", "42704", "42P01", "22023", "XX000"] {
            assert!(!is_transient_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn hints_name_what_to_check() {
        assert!(sqlstate_hint("28P01").unwrap().contains("password"));
        assert!(sqlstate_hint("28000").unwrap().contains("pg_hba.conf"));
        assert!(sqlstate_hint("3D000").unwrap().contains("database"));
        assert_eq!(sqlstate_hint("XX000"), None);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(io_hint(&refused).contains("server is running"));
        let timeout = io::Error::from(io::ErrorKind::TimedOut);
        assert!(io_hint(&timeout).contains("firewall"));
        let dns = io::Error::other("failed to lookup address information: Name or service not known");
        assert!(io_hint(&dns).contains("did not resolve"));
    }

    #[test]
    fn io_and_tls_causes_are_found_down_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] io::Error);
        let outer = Outer(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            io_cause(&outer).map(io::Error::kind),
            Some(io::ErrorKind::ConnectionRefused)
        );
        assert!(!is_tls_failure(&outer));
        let tls = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::General("bad certificate".into()),
        );
        assert!(is_tls_failure(&tls));
        assert!(is_tls_failure(&Outer(tls)));
    }
}
