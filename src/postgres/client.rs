//! Ordinary (non-replication) PostgreSQL connections for the control plane: preflight checks,
//! publication and slot management, `status`, slot health.

use std::time::Duration;

use tokio_postgres::Client;
use tracing::debug;

use crate::config::postgres::PostgresSettings;
use crate::postgres::tls;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to PostgreSQL at {url}: {source}")]
    Postgres { url: String, source: tokio_postgres::Error },
    #[error("connecting to PostgreSQL at {url} timed out after {after:?}; check the host, port and firewall")]
    Timeout { url: String, after: Duration },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Opens a control connection; the connection task runs until the returned client is dropped.
pub async fn connect(settings: &PostgresSettings, timeout: Duration) -> Result<Client, ConnectError> {
    let url = settings.url.to_string();
    let mut config = settings.connection.clone();
    if config.get_application_name().is_none() {
        config.application_name("outbox-relay");
    }
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
