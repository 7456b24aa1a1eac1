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

/// Which columns of a table [`table_columns`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Columns {
    /// Every live column.
    All,
    /// The NOT NULL ones (`[debezium]` writes optional schemas for the others, as Debezium does).
    NotNull,
}

/// The live columns of `schema.table` that `which` names, in the table's order. Empty when the
/// table does not exist: preflight reports that.
pub(crate) async fn table_columns(
    client: &Client,
    schema: &str,
    table: &str,
    which: Columns,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let condition = match which {
        Columns::All => "",
        Columns::NotNull => "AND a.attnotnull",
    };
    let sql = format!(
        "SELECT a.attname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped {condition} \
         ORDER BY a.attnum"
    );
    let rows = client.query(&sql, &[&schema, &table]).await?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
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
