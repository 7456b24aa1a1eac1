//! Ordinary (non-replication) PostgreSQL connections for the control plane: preflight checks,
//! publication and slot management, `status`, slot health.
//!
//! A failed connection says why ([`ConnectError`]'s message carries the server's message and
//! SQLSTATE, or the operating system's error, and a hint) and whether retrying can help
//! ([`ConnectError::is_transient`], the same classification as the replication connection's).

use std::time::Duration;

use tokio_postgres::Client;
use tracing::debug;

use crate::config::postgres::PostgresSettings;
use crate::postgres::failure;
use crate::postgres::tls;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `url` is the redacted URL (no password).
    #[error("cannot connect to PostgreSQL at {url}: {}{}", failure::describe_pg(.source), hint_suffix(.source))]
    Postgres {
        url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("connecting to PostgreSQL at {url} timed out after {after:?}; check the host, port and firewall")]
    Timeout { url: String, after: Duration },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

fn hint_suffix(e: &tokio_postgres::Error) -> String {
    failure::pg_hint(e).map(|h| format!(". Hint: {h}")).unwrap_or_default()
}

impl ConnectError {
    /// True when connecting again later can succeed without anyone changing anything: the
    /// server was unreachable, busy or restarting. A wrong password, a missing database or
    /// privilege, or a TLS problem is fatal.
    pub fn is_transient(&self) -> bool {
        match self {
            ConnectError::Postgres { source, .. } => failure::is_transient_pg(source),
            ConnectError::Timeout { .. } => true,
            ConnectError::Tls(_) => false,
        }
    }

    /// The server's error code, if the server refused the connection.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ConnectError::Postgres { source, .. } => source.as_db_error().map(|db| db.code().code()),
            _ => None,
        }
    }
}

/// Opens a control connection; the connection task runs until the returned client is dropped.
pub(crate) async fn connect(settings: &PostgresSettings, timeout: Duration) -> Result<Client, ConnectError> {
    let mut config = settings.connection.clone();
    if config.get_application_name().is_none() {
        config.application_name("outbox-relay");
    }
    open(&config, settings, timeout).await
}

/// Connects with `config` under the settings' TLS, bounded by `timeout`; errors name the URL
/// (password masked). The connection task runs until the client is dropped.
async fn open(
    config: &tokio_postgres::Config,
    settings: &PostgresSettings,
    timeout: Duration,
) -> Result<Client, ConnectError> {
    let url = settings.url.to_string();
    let tls =
        tokio_postgres_rustls::MakeRustlsConnect::new((*tls::client_config(settings.sslrootcert.as_deref())?).clone());
    let (client, connection) = tokio::time::timeout(timeout, config.connect(tls))
        .await
        .map_err(|_| ConnectError::Timeout {
            url: url.clone(),
            after: timeout,
        })?
        .map_err(|source| ConnectError::Postgres { url, source })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "control connection closed");
        }
    });
    Ok(client)
}

/// Opens a control connection to one host of `postgres.url` only (user, password, database
/// and TLS as configured; `target_session_attrs` ignored), e.g. to look at a standby.
pub(crate) async fn connect_host(
    settings: &PostgresSettings,
    host: &tokio_postgres::config::Host,
    port: u16,
    timeout: Duration,
) -> Result<Client, ConnectError> {
    let base = &settings.connection;
    let mut config = tokio_postgres::Config::new();
    match host {
        tokio_postgres::config::Host::Tcp(name) => config.host(name),
        tokio_postgres::config::Host::Unix(dir) => config.host_path(dir),
    };
    config.port(port).ssl_mode(base.get_ssl_mode());
    if let Some(user) = base.get_user() {
        config.user(user);
    }
    if let Some(password) = base.get_password() {
        config.password(password);
    }
    if let Some(db) = base.get_dbname() {
        config.dbname(db);
    }
    config.application_name(base.get_application_name().unwrap_or("outbox-relay"));
    open(&config, settings, timeout).await
}

/// The OIDs of the domains over `bytea`, directly or over another such domain (a payload
/// column of any of them holds binary data).
pub(crate) async fn bytea_domain_oids(client: &Client) -> Result<Vec<u32>, tokio_postgres::Error> {
    const BYTEA_OID: u32 = 17;
    let rows = client
        .query(
            "WITH RECURSIVE d(oid) AS (SELECT $1::oid UNION \
               SELECT t.oid FROM pg_type t JOIN d ON t.typbasetype = d.oid WHERE t.typtype = 'd') \
             SELECT oid FROM d WHERE oid <> $1::oid",
            &[&BYTEA_OID],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get::<_, u32>(0)).collect())
}

/// One live column of a table as the catalog describes it, its type resolved through domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CatalogColumn {
    pub(crate) name: String,
    /// As `format_type` prints it, e.g. `character varying(255)`.
    pub(crate) type_name: String,
    /// `pg_type.oid` of its base type (a domain resolved to the type it is built on).
    pub(crate) base_oid: u32,
    /// The base type's `typname` and `typtype` (`b` base, `e` enum, …).
    pub(crate) base_name: String,
    pub(crate) base_kind: String,
    pub(crate) not_null: bool,
}

/// The live columns of `table` (quoted, as `TableName::quoted` writes it), in the table's
/// order, with their base types. Empty when the table does not exist.
pub(crate) async fn catalog_columns(client: &Client, table: &str) -> Result<Vec<CatalogColumn>, tokio_postgres::Error> {
    // Domains resolve to their base type (recursively: a domain may be over a domain).
    let rows = client
        .query(
            "WITH RECURSIVE base(attnum, typid) AS ( \
                 SELECT a.attnum, a.atttypid FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
               UNION ALL \
                 SELECT b.attnum, t.typbasetype FROM base b JOIN pg_type t ON t.oid = b.typid WHERE t.typtype = 'd') \
             SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.oid, t.typname::text, t.typtype::text, \
                    a.attnotnull \
             FROM pg_attribute a JOIN base b ON b.attnum = a.attnum JOIN pg_type t ON t.oid = b.typid AND t.typtype <> 'd' \
             WHERE a.attrelid = to_regclass($1) ORDER BY a.attnum",
            &[&table],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| CatalogColumn {
            name: r.get(0),
            type_name: r.get(1),
            base_oid: r.get(2),
            base_name: r.get(3),
            base_kind: r.get(4),
            not_null: r.get(5),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_retried_and_tls_setup_errors_are_not() {
        let timeout = ConnectError::Timeout {
            url: "postgres://relay:********@db/app".into(),
            after: Duration::from_secs(5),
        };
        assert!(timeout.is_transient() && timeout.sqlstate().is_none());
        let tls = ConnectError::Tls(tls::client_config(Some(std::path::Path::new("/nonexistent/ca.pem"))).unwrap_err());
        assert!(!tls.is_transient());
    }
}
