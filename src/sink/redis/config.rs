//! `[redis]`: the Redis Streams sink (`[sink] kind = "redis"`, docs/sink-redis.md).
//!
//! ```toml
//! [redis]
//! url = "redis://user:password@127.0.0.1:6379/0"   # or rediss:// for TLS
//! dedup_window_secs = 600       # exactly-once: how long a dedup key is kept
//! dedup_max_keys = 1000000      # exactly-once: most dedup keys kept per stream
//! max_message_bytes = 536870912 # largest event (key + value + id + headers)
//! timeout_ms = 10000            # connect and reply timeout
//! ```
//!
//! The URL carries the password as Redis clients expect it; it is kept in a [`Secret`] and never
//! printed unredacted.

use serde::Deserialize;

use crate::config::number_or_numeric_string;
use crate::config::secret::Secret;
use crate::config::sink::SinkSection;
use crate::config::ConfigError;
use crate::sink::plugin::{Absent, SectionSpec};
use crate::sink::requests::{Millis, RequestKeys, Requests};

/// Redis' own `proto-max-bulk-len` default (512 MiB): the largest single value it accepts.
pub(crate) const REDIS_MAX_BULK_BYTES: u64 = 512 * 1024 * 1024;
/// How long a dedup key is kept in exactly-once mode unless `dedup_window_secs` says otherwise.
pub(crate) const DEFAULT_DEDUP_WINDOW_SECS: u64 = 600;
/// Most dedup keys kept per stream unless `dedup_max_keys` says otherwise (about 100 MB).
pub(crate) const DEFAULT_DEDUP_MAX_KEYS: u64 = 1_000_000;
/// Connect and reply timeout unless `timeout_ms` says otherwise.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RedisSection {
    /// `redis://[user[:password]@]host[:port][/db]` or `rediss://…` (TLS).
    pub(crate) url: Option<Secret>,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) dedup_window_secs: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) dedup_max_keys: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) max_message_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) timeout_ms: u64,
}

impl Default for RedisSection {
    fn default() -> Self {
        RedisSection {
            url: None,
            dedup_window_secs: DEFAULT_DEDUP_WINDOW_SECS,
            dedup_max_keys: DEFAULT_DEDUP_MAX_KEYS,
            max_message_bytes: REDIS_MAX_BULK_BYTES,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }
}

/// `[redis]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    pub(crate) url: Secret,
    /// Exactly-once: a dedup key older than this is dropped when a newer one is added.
    pub(crate) dedup_window: std::time::Duration,
    /// Exactly-once: the most dedup keys a stream's dedup set keeps (the newest ones).
    pub(crate) dedup_max_keys: u64,
    /// The largest event sent; larger ones are refused on sight (`relay.on_bad_event`).
    pub(crate) max_message_bytes: usize,
    /// `timeout_ms`: the connect timeout, and how long a pipelined batch may wait for its
    /// replies.
    pub(crate) requests: Requests,
}

/// `timeout_ms`, checked as every request sink's timeout (at least 100 ms: a pipelined batch
/// waits that long for its replies; Redis has no concurrency keys, its commands are pipelined
/// on one connection).
const REQUESTS: RequestKeys = RequestKeys {
    concurrency: None,
    requests: None,
    timeout: Millis {
        key: "redis.timeout_ms",
        default: DEFAULT_TIMEOUT_MS,
        least: 100,
    },
};

impl RedisSection {
    pub(crate) fn validate(self) -> Result<RedisSettings, ConfigError> {
        let url = match self.url {
            Some(url) if !url.expose().trim().is_empty() => url,
            _ => return Err(ConfigError::Invalid {
                key: "redis.url",
                message:
                    "missing; add `url = \"redis://127.0.0.1:6379\"` under [redis] (or set OUTBOX_RELAY__REDIS__URL)"
                        .into(),
            }),
        };
        let scheme_ok = url.expose().starts_with("redis://") || url.expose().starts_with("rediss://");
        if !scheme_ok {
            return Err(ConfigError::Invalid {
                key: "redis.url",
                message: format!(
                    "{url} is not a redis:// or rediss:// URL; write it as redis://[user:password@]host:port[/db]"
                ),
            });
        }
        if let Err(e) = redis::Client::open(url.expose()) {
            // The client's words never contain the password, only what is wrong.
            return Err(ConfigError::Invalid {
                key: "redis.url",
                message: format!(
                    "{url} is not usable ({:?}). Write it as redis://[user:password@]host:port[/db]",
                    e.kind()
                ),
            });
        }
        if self.dedup_window_secs == 0 {
            return Err(ConfigError::Invalid {
                key: "redis.dedup_window_secs",
                message: format!("must be at least 1; remove the key for the default ({DEFAULT_DEDUP_WINDOW_SECS})"),
            });
        }
        if self.dedup_max_keys == 0 {
            return Err(ConfigError::Invalid {
                key: "redis.dedup_max_keys",
                message: format!("must be at least 1; remove the key for the default ({DEFAULT_DEDUP_MAX_KEYS})"),
            });
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > REDIS_MAX_BULK_BYTES {
            return Err(ConfigError::Invalid {
                key: "redis.max_message_bytes",
                message: format!(
                    "{} is outside 1..={REDIS_MAX_BULK_BYTES} (Redis' proto-max-bulk-len default); remove the key for that default",
                    self.max_message_bytes
                ),
            });
        }
        Ok(RedisSettings {
            url,
            dedup_window: std::time::Duration::from_secs(self.dedup_window_secs),
            dedup_max_keys: self.dedup_max_keys,
            max_message_bytes: self.max_message_bytes as usize,
            requests: REQUESTS.validate(None, None, Some(self.timeout_ms))?,
        })
    }
}

/// The sink's name for people, in errors and logs (the section's `name`).
pub(crate) const SINK: &str = "Redis";

/// The config half of `[redis]`, `[sink] kind = "redis"` (required).
pub(crate) const SECTION: SectionSpec<RedisSection, RedisSettings> = SectionSpec {
    kind: "redis",
    name: SINK,
    absent: Absent::Refused(
        "[sink] kind = \"redis\" needs a [redis] section with url = \"redis://host:6379\"; add it \
         (docs/sink-redis.md)",
    ),
    validate: RedisSection::validate,
    binary_refused: None,
};

impl SinkSection for RedisSettings {}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml: &str) -> Result<RedisSettings, String> {
        let s: RedisSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn url_is_required_and_checked_and_never_printed() {
        let s = section("url = \"redis://app:s3cret@127.0.0.1:6379/2\"").unwrap();
        assert_eq!(s.dedup_window.as_secs(), DEFAULT_DEDUP_WINDOW_SECS);
        assert_eq!(s.dedup_max_keys, DEFAULT_DEDUP_MAX_KEYS);
        assert_eq!(s.max_message_bytes as u64, REDIS_MAX_BULK_BYTES);
        assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
        let err = section("").unwrap_err();
        assert!(err.contains("redis.url") && err.contains("redis://"), "{err}");
        let err = section("url = \"http://u:s3cret@host\"").unwrap_err();
        assert!(err.contains("redis.url") && !err.contains("s3cret"), "{err}");
        let err = section("url = \"redis://127.0.0.1\"\nmaxlen = 5").unwrap_err();
        assert!(err.contains("maxlen"), "{err}");
        let err = section("url = \"redis://127.0.0.1\"\ndedup_window_secs = 0").unwrap_err();
        assert!(err.contains("redis.dedup_window_secs"), "{err}");
        let err = section("url = \"redis://127.0.0.1\"\ndedup_max_keys = 0").unwrap_err();
        assert!(err.contains("redis.dedup_max_keys"), "{err}");
        let err = section("url = \"redis://127.0.0.1\"\nmax_message_bytes = 0").unwrap_err();
        assert!(err.contains("redis.max_message_bytes"), "{err}");
        let s = section("url = \"rediss://127.0.0.1\"\nmax_message_bytes = \"1024\"\ntimeout_ms = 500").unwrap();
        assert_eq!((s.max_message_bytes, s.requests.timeout.as_millis()), (1024, 500));
    }

    #[test]
    fn the_section_is_present_iff_the_sink_is_redis() {
        use crate::config::Settings;
        let load = |text: &str, env: &[(&str, &str)]| {
            Settings::from_toml_str(
                &format!("[postgres]\nurl = \"postgres://relay@127.0.0.1/app\"\n{text}"),
                std::path::Path::new("t.toml"),
                env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            )
            .map_err(|e| e.to_string())
        };
        let s = load(
            "[sink]\nkind = \"redis\"\n[redis]\nurl = \"redis://127.0.0.1:6379\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(s.sink.label(), "redis");
        assert!(s.sink.section::<RedisSettings>().is_some());
        let err = load("[sink]\nkind = \"redis\"\n", &[]).unwrap_err();
        assert!(err.contains("[redis]") && err.contains("url"), "{err}");
        let err = load(
            "[kafka]\n\"bootstrap.servers\" = \"x:9092\"\n[redis]\nurl = \"redis://h\"\n",
            &[],
        )
        .unwrap_err();
        assert!(err.contains("remove the section"), "{err}");
        let err = load(
            "[sink]\nkind = \"redis\"\n[redis]\nurl = \"redis://h\"\n[kafka]\n\"bootstrap.servers\" = \"x:9092\"\n",
            &[],
        )
        .unwrap_err();
        assert!(err.contains("[kafka]"), "{err}");
        // The URL from the environment, as a secret kept out of Debug.
        let s = load(
            "[sink]\nkind = \"redis\"\n",
            &[("OUTBOX_RELAY__REDIS__URL", "redis://u:env-s3cret@127.0.0.1:6380/1")],
        )
        .unwrap();
        let redis = s.sink.section::<RedisSettings>().unwrap().clone();
        assert_eq!(redis.url.expose(), "redis://u:env-s3cret@127.0.0.1:6380/1");
        assert!(!format!("{redis:?}").contains("env-s3cret"));
    }
}
