//! `[postgres]`: the source database — connection URL (a [`Secret`]), replication slot and
//! publication names, and the optional CA bundle that turns on certificate verification.

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
}

impl PostgresSection {
    pub(crate) fn validate(self) -> Result<PostgresSettings, ConfigError> {
        let connection: tokio_postgres::Config =
            self.url.expose().parse().map_err(|e: tokio_postgres::Error| ConfigError::Invalid {
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
        })
    }
}
