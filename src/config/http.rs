//! `[http]`: where the metrics and health endpoints listen, and what "ready" means.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{number_or_numeric_string, ConfigError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HttpSection {
    /// `host:port`; absent or empty: no HTTP server.
    pub(crate) listen: Option<String>,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) ready_max_lag_seconds: u64,
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
    pub(crate) ready_max_lag: Duration,
}

impl HttpSection {
    pub(crate) fn validate(self) -> Result<HttpSettings, ConfigError> {
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

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use crate::config::test_support::{load, refusal};

    #[test]
    fn defaults_serve_nothing_and_allow_a_minute_of_lag() {
        let http = load("", &[]).unwrap().http;
        assert_eq!(http.listen, None);
        assert_eq!(http.ready_max_lag, Duration::from_secs(60));
    }

    #[test]
    fn keys_come_from_the_file_and_the_environment() {
        let s = load(
            "[http]\nlisten = \"127.0.0.1:9187\"\n",
            &[("OUTBOX_RELAY__HTTP__READY_MAX_LAG_SECONDS", "5")],
        )
        .unwrap();
        assert_eq!(s.http.listen, Some("127.0.0.1:9187".parse().unwrap()));
        assert_eq!(s.http.ready_max_lag, Duration::from_secs(5));
        let off = load(
            "[http]\nlisten = \"127.0.0.1:9187\"\n",
            &[("OUTBOX_RELAY__HTTP__LISTEN", "")],
        )
        .unwrap();
        assert_eq!(off.http.listen, None, "an empty override turns the server off");
    }

    #[test]
    fn unusable_values_are_refused_with_the_key_named() {
        for (extra, key) in [
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            ("[http]\nready_max_lag_seconds = 0\n", "http.ready_max_lag_seconds"),
            ("[http]\nport = 9187\n", "port"),
        ] {
            let err = refusal(extra, &[]);
            assert!(err.contains(key), "{extra:?}: {err}");
        }
    }
}
