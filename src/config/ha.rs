//! Validation of the `[relay]` keys for standby/takeover, slot health, heartbeats and
//! dead-connection detection. Kept apart from `config.rs` so the rules sit next to the code
//! that depends on them.

use std::time::Duration;

use crate::config::{ConfigError, RelaySettings};

/// Above this a standby reacts too slowly for the takeover promise in the docs to mean much.
pub const MAX_STANDBY_POLL: Duration = Duration::from_secs(60);

pub fn validate(r: &RelaySettings) -> Result<(), ConfigError> {
    let invalid = |key: &'static str, message: String| Err(ConfigError::Invalid { key, message });
    if r.standby_poll.is_zero() || r.standby_poll > MAX_STANDBY_POLL {
        return invalid(
            "relay.standby_poll_ms",
            format!(
                "must be between 1 and {} ms; it bounds how long a standby waits before taking over (default 2000)",
                MAX_STANDBY_POLL.as_millis()
            ),
        );
    }
    if let Some(t) = r.takeover_after {
        // A healthy holder replies once per status interval; anything shorter than two
        // intervals would terminate instances that are merely busy.
        if t < r.status_interval * 2 {
            return invalid(
                "relay.takeover_after_ms",
                format!(
                    "{} ms is less than two status intervals ({} ms), so a healthy holder could be terminated; \
                     raise it or set 0 to never terminate a holder",
                    t.as_millis(),
                    (r.status_interval * 2).as_millis()
                ),
            );
        }
    }
    if r.slot_check_interval.is_zero() {
        return invalid("relay.slot_check_interval_ms", "must be greater than zero".into());
    }
    let min_receive = (r.status_interval * 2).max(Duration::from_secs(1));
    if r.receive_timeout < min_receive {
        return invalid(
            "relay.receive_timeout_ms",
            format!(
                "must be at least {} ms (two status intervals, and at least 1 s): the relay probes the server \
                 halfway through it",
                min_receive.as_millis()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Settings;

    use super::*;

    const MINIMAL: &str =
        "[postgres]\nurl = \"postgres://relay:pw@127.0.0.1/app\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n";

    fn load(extra: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        Settings::from_toml_str(&format!("{MINIMAL}{extra}"), Path::new("t.toml"), env)
    }

    #[test]
    fn defaults_keep_takeover_within_five_seconds_and_terminate_nobody() {
        let r = load("", &[]).unwrap().relay;
        assert_eq!(r.standby_poll, Duration::from_secs(2));
        assert!(r.standby_poll <= Duration::from_secs(5));
        assert_eq!(r.takeover_after, None);
        assert_eq!(r.slot_check_interval, Duration::from_secs(10));
        assert_eq!(r.retained_wal_warn_bytes, Some(1 << 30));
        assert_eq!(r.heartbeat_interval, None);
        assert_eq!(r.receive_timeout, Duration::from_secs(30));
        let http = load("", &[]).unwrap().http;
        assert_eq!(http.listen, None);
        assert_eq!(http.ready_max_lag, Duration::from_secs(60));
    }

    #[test]
    fn keys_come_from_the_file_and_the_environment() {
        let s = load(
            "[relay]\ntakeover_after_ms = 5000\nretained_wal_warn_bytes = 0\n[http]\nlisten = \"127.0.0.1:9187\"\n",
            &[
                ("OUTBOX_RELAY__RELAY__HEARTBEAT_INTERVAL_MS", "250"),
                ("OUTBOX_RELAY__HTTP__READY_MAX_LAG_SECONDS", "5"),
            ],
        )
        .unwrap();
        assert_eq!(s.relay.takeover_after, Some(Duration::from_secs(5)));
        assert_eq!(s.relay.retained_wal_warn_bytes, None, "0 disables the warning");
        assert_eq!(s.relay.heartbeat_interval, Some(Duration::from_millis(250)));
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
    fn unsafe_or_useless_values_are_refused_with_the_key_named() {
        for (extra, key) in [
            ("[relay]\nstandby_poll_ms = 0\n", "relay.standby_poll_ms"),
            ("[relay]\nstandby_poll_ms = 600000\n", "relay.standby_poll_ms"),
            ("[relay]\ntakeover_after_ms = 1500\n", "relay.takeover_after_ms"),
            ("[relay]\nslot_check_interval_ms = 0\n", "relay.slot_check_interval_ms"),
            ("[relay]\nreceive_timeout_ms = 1500\n", "relay.receive_timeout_ms"),
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            ("[http]\nready_max_lag_seconds = 0\n", "http.ready_max_lag_seconds"),
            ("[http]\nport = 9187\n", "port"),
        ] {
            let err = load(extra, &[]).unwrap_err().to_string();
            assert!(err.contains(key), "{extra:?}: {err}");
        }
    }
}
