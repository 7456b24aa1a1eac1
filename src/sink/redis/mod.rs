//! The Redis Streams sink (`[sink] kind = "redis"`, docs/sink-redis.md).
//!
//! Each record becomes one stream entry, `XADD <destination> * id … key … <headers> timestamp …
//! payload …`, on ONE multiplexed connection per sink instance ([`publisher`]). Commands on one
//! connection run in order, so records reach each stream in the order they were handed over.
//! Exactly-once mode adds each record's dedup key to a companion sorted set in the same Lua
//! script as its `XADD` ([`DEDUP_SCRIPT`]), so the two cannot diverge and a replay is dropped.
//!
//! "Delivered" means Redis replied to the command: without AOF (`appendonly yes`,
//! `appendfsync always`) that is "in memory" only, which `setup` and `status` say.

pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod publisher;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};

use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{RedisSettings, SINK};

/// The suffix of a stream's dedup set: `<stream>:outbox-relay-dedup`.
pub(crate) const DEDUP_SUFFIX: &str = ":outbox-relay-dedup";

/// Longest stream key the relay writes (Redis itself takes up to 512 MB; a longer routed name
/// is a routing mistake).
pub(crate) const MAX_STREAM_KEY_LEN: usize = 1024;

/// Field names of a stream entry, in the order they are written; the record's headers and the
/// relay's position headers sit between `key` and `timestamp`.
pub(crate) const FIELD_ID: &str = "id";
pub(crate) const FIELD_KEY: &str = "key";
pub(crate) const FIELD_TIMESTAMP: &str = "timestamp";
pub(crate) const FIELD_PAYLOAD: &str = "payload";

/// Exactly-once: `XADD` only when the dedup key is new, and remember it — atomically.
/// KEYS[1] = stream, KEYS[2] = its dedup set; ARGV[1] = dedup key, ARGV[2] = window (ms),
/// ARGV[3] = most keys kept, ARGV[4..] = the entry's fields and values. Returns 1 (added) or 0
/// (a duplicate, dropped). Scores are the server's clock in ms. The dedup set is read first so
/// that a wrong-typed dedup key fails before anything is written; it is trimmed only when a new
/// key is added, so a replay after a long outage still finds the keys written before it.
pub(crate) const DEDUP_SCRIPT: &str = r"
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]) - 1)
local most = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[2]) > most then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(most + 1))
end
return 1
";

/// The stream key rule: non-empty, at most [`MAX_STREAM_KEY_LEN`] bytes, no control characters,
/// and not a dedup set's name.
pub(crate) fn check_stream_key(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a Redis stream key cannot be empty".into());
    }
    if name.len() > MAX_STREAM_KEY_LEN {
        return Err(format!(
            "a Redis stream key is limited to {MAX_STREAM_KEY_LEN} bytes here; this one has {}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("a Redis stream key may not contain control characters".into());
    }
    if name.ends_with(DEDUP_SUFFIX) {
        return Err(format!(
            "a stream key ending in {DEDUP_SUFFIX:?} would write into the relay's own dedup set"
        ));
    }
    Ok(())
}

/// The Redis Streams sink (`[sink] kind = "redis"`).
pub(crate) struct Redis;

impl SinkPlugin for Redis {
    type Config = RedisSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    const MESSAGING_SYSTEM: &'static str = "redis";

    const LOG_TARGETS: &'static [ClientLogTarget] = &[ClientLogTarget::debug("redis")];

    fn limits(&self, settings: &RedisSettings) -> SinkLimits {
        SinkLimits {
            check_name: check_stream_key,
            max_message_bytes: settings.max_message_bytes,
        }
    }

    /// A dedup set per stream, checked by a script before each `XADD`.
    fn exactly_once(&self, _: &RedisSettings) -> ExactlyOnce {
        ExactlyOnce::BrokerDeduplicates
    }

    /// What `setup` does for Redis: checks the server is reachable and new enough; the returned
    /// lines are for the operator (a warning when persistence is off). Streams are created by
    /// their first `XADD`, so there is nothing to create.
    async fn prepare(&self, settings: &RedisSettings) -> Result<Vec<String>, SinkError> {
        let mut conn = connect(settings).await?;
        let (version, aof) = server_facts(&mut conn, settings).await?;
        if !version_ok(&version) {
            return Err(SinkError {
                sink: SINK,
                cause: format!("{} runs Redis {version}; streams need Redis 5.0 or later", settings.url),
                transient: false,
            });
        }
        let mut lines = vec![format!(
            "Redis {version} at {}: reachable; streams are created by their first event",
            settings.url
        )];
        if !aof {
            lines.push(format!("WARNING: {NO_AOF}"));
        }
        Ok(lines)
    }

    /// What `status` shows for Redis: one line, version and persistence.
    async fn probe(&self, settings: &RedisSettings) -> Result<String, SinkError> {
        let mut conn = connect(settings).await?;
        let (version, aof) = server_facts(&mut conn, settings).await?;
        Ok(format!(
            "Redis {version} at {}, persistence {}",
            settings.url,
            if aof { "AOF on" } else { "off (a reply means in memory)" }
        ))
    }

    async fn create<Tag: SinkTag>(&self, config: &RedisSettings, _: &SinkContext) -> Created<Tag> {
        Ok(boxed(
            publisher::RedisSink::create(config, publisher::Dedup::None).await?,
        ))
    }

    /// With the dedup script loaded (an at-least-once user needs no SCRIPT/EVALSHA).
    async fn create_deduplicating<Tag: SinkTag>(&self, config: &RedisSettings, _: &SinkContext) -> Created<Tag> {
        Ok(boxed(
            publisher::RedisSink::create(config, publisher::Dedup::Script).await?,
        ))
    }
}

/// Whether a connection error is worth retrying (the server is down, busy or slow) rather than
/// a configuration the operator must fix (bad URL, wrong password, missing ACL permission).
fn is_transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(e.code(), Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN"))
}

fn sink_error(what: &str, e: &RedisError, settings: &RedisSettings) -> SinkError {
    // A TLS handshake refused for the server's certificate surfaces as an I/O error, but no
    // retry fixes it.
    let certificate = e.to_string().contains("certificate");
    let transient = is_transient(e) && !certificate;
    SinkError {
        sink: SINK,
        cause: format!(
            "{what} {}: {e}. {}",
            settings.url,
            if certificate {
                "rediss:// checks the server's certificate against the system's roots (SSL_CERT_FILE names \
                 another CA file): fix the certificate or the trusted CA"
            } else if transient {
                "Is the server running and reachable?"
            } else {
                "Check [redis] url (host, port, user, password, database) and the user's ACL"
            }
        ),
        transient,
    }
}

/// A new connection (TLS for `rediss://`, authenticated, database selected), with the settings'
/// connect and reply timeouts.
pub(crate) async fn connect(settings: &RedisSettings) -> Result<MultiplexedConnection, SinkError> {
    let client = redis::Client::open(settings.url.expose()).map_err(|e| sink_error("bad URL", &e, settings))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.requests.timeout))
        .set_response_timeout(Some(settings.requests.timeout));
    let connect = client.get_multiplexed_async_connection_with_config(&config);
    match tokio::time::timeout(settings.requests.timeout + Duration::from_secs(1), connect).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(sink_error("cannot connect to", &e, settings)),
        Err(_) => Err(SinkError {
            sink: SINK,
            cause: format!(
                "no connection to {} within {:?}",
                settings.url, settings.requests.timeout
            ),
            transient: true,
        }),
    }
}

/// What the server says about itself: `(version, aof_enabled)`.
async fn server_facts(conn: &mut MultiplexedConnection, settings: &RedisSettings) -> Result<(String, bool), SinkError> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .arg("persistence")
        .query_async(conn)
        .await
        .map_err(|e| sink_error("INFO failed on", &e, settings))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_owned())
    };
    let version = field("redis_version").unwrap_or_else(|| "unknown".into());
    let aof = field("aof_enabled").as_deref() == Some("1");
    Ok((version, aof))
}

/// Streams arrived in Redis 5.0.
fn version_ok(version: &str) -> bool {
    version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .is_none_or(|major| major >= 5)
}

const NO_AOF: &str = "persistence (AOF) is off on this Redis: a reply means \"in memory\", and a restart loses \
     every stream entry (and every dedup set) it had. Set appendonly yes and appendfsync always for replies that \
     mean \"on disk\"";

#[cfg(test)]
pub(crate) mod tests;
