//! `[http]`: where the metrics and health endpoints listen, and what "ready" means.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{number_or_numeric_string, ConfigError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSection {
    /// `host:port`; absent or empty: no HTTP server.
    pub listen: Option<String>,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub ready_max_lag_seconds: u64,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            listen: None,
            ready_max_lag_seconds: 60,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub listen: Option<SocketAddr>,
    /// `/readyz` fails while the relay streams more than this far behind the source; `status`
    /// warns from here and calls it critical from ten times this.
    pub ready_max_lag: Duration,
}

impl HttpSection {
    pub fn validate(self) -> Result<HttpSettings, ConfigError> {
        let listen = match self.listen.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|e| ConfigError::Invalid {
                key: "http.listen",
                message: format!("{text:?} is not an IP address with a port ({e}); e.g. \"127.0.0.1:9187\""),
            })?),
        };
        if self.ready_max_lag_seconds == 0 {
            return Err(ConfigError::Invalid {
                key: "http.ready_max_lag_seconds",
                message: "must be greater than zero (default 60)".into(),
            });
        }
        Ok(HttpSettings {
            listen,
            ready_max_lag: Duration::from_secs(self.ready_max_lag_seconds),
        })
    }
}
