//! `[relay]`: flow control, timeouts, reconnect backoff, standby/takeover, slot health,
//! heartbeats, dead-connection detection, and the bad-event policy ([`BadEventPolicy`]); each
//! key validated against the others it interacts with.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{number_or_numeric_string, ConfigError};

/// Above this a standby reacts too slowly for the takeover promise in the docs to mean much.
const MAX_STANDBY_POLL: Duration = Duration::from_secs(60);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RelaySection {
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) max_in_flight: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) max_in_flight_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) status_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) shutdown_timeout_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) reconnect_backoff_initial_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) reconnect_backoff_max_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) connect_timeout_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) standby_poll_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) takeover_after_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) slot_check_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) retained_wal_warn_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) heartbeat_interval_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) receive_timeout_ms: u64,
    /// `fail` | `dead-letter` | `skip` (see [`BadEventPolicy`]).
    pub(crate) on_bad_event: String,
    pub(crate) dead_letter_topic: Option<String>,
    /// `at-least-once` | `exactly-once` (see [`Delivery`]).
    pub(crate) delivery: String,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) read_back_max_records: u64,
    /// Moved to `[kafka] exactly_once`: refused with a message naming the new key.
    pub(crate) exactly_once: Option<toml::Value>,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) transaction_max_events: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) transaction_max_ms: u64,
    /// Moved to `[kafka] checkpoint_topic`: refused with a message naming the new key.
    pub(crate) checkpoint_topic: Option<toml::Value>,
    /// Where streamed transactions beyond `stage_memory_bytes` are spilled (absolute).
    pub(crate) stage_dir: Option<std::path::PathBuf>,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) stage_memory_bytes: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) stage_disk_bytes: u64,
    /// `as-received` | `at-commit` (see [`StreamedProduce`]).
    pub(crate) streamed_produce: String,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            status_interval_ms: 1_000,
            shutdown_timeout_ms: 30_000,
            reconnect_backoff_initial_ms: 500,
            reconnect_backoff_max_ms: 30_000,
            connect_timeout_ms: 10_000,
            standby_poll_ms: 2_000,
            takeover_after_ms: 0,
            slot_check_interval_ms: 10_000,
            retained_wal_warn_bytes: 1 << 30,
            heartbeat_interval_ms: 0,
            receive_timeout_ms: 30_000,
            on_bad_event: "fail".into(),
            dead_letter_topic: None,
            delivery: "at-least-once".into(),
            read_back_max_records: 100_000,
            exactly_once: None,
            transaction_max_events: 2_000,
            transaction_max_ms: 100,
            checkpoint_topic: None,
            stage_dir: None,
            stage_memory_bytes: 64 * 1024 * 1024,
            stage_disk_bytes: 8 * 1024 * 1024 * 1024,
            streamed_produce: "as-received".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySettings {
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) status_interval: Duration,
    pub shutdown_timeout: Duration,
    pub(crate) reconnect_backoff_initial: Duration,
    /// Never below `reconnect_backoff_initial`.
    pub(crate) reconnect_backoff_max: Duration,
    pub(crate) connect_timeout: Duration,
    /// How often a standby retries the busy slot (takeover latency).
    pub(crate) standby_poll: Duration,
    /// Terminate a slot holder whose walsender heard no status update for this long (opt-in).
    pub(crate) takeover_after: Option<Duration>,
    /// How often `pg_replication_slots` is read for slot health.
    pub(crate) slot_check_interval: Duration,
    /// Warn when the slot retains more WAL than this (`None`: never).
    pub(crate) retained_wal_warn_bytes: Option<u64>,
    /// Emit `pg_logical_emit_message` heartbeats this often while streaming (`None`: off).
    pub(crate) heartbeat_interval: Option<Duration>,
    /// Silence from the server (while reading) after which the connection counts as dead;
    /// also the replication socket's `TCP_USER_TIMEOUT`.
    pub(crate) receive_timeout: Duration,
    /// What to do with an event that can never be published.
    pub(crate) on_bad_event: BadEventPolicy,
    /// `relay.delivery`: whether a (re)started stream checks Kafka before replaying.
    pub(crate) delivery: Delivery,
    /// Exactly-once: at most this many records are read back from one partition while looking
    /// for this relay's newest record there (`relay.read_back_max_records`).
    pub(crate) read_back_max_records: usize,
    /// Sink transactions: a transaction is committed at the first source-transaction boundary
    /// once it holds this many events (`relay.transaction_max_events`)…
    pub(crate) transaction_max_events: usize,
    /// …or is this old (`relay.transaction_max_ms`), or the stream has nothing more ready.
    pub(crate) transaction_max_age: Duration,
    /// Where and how much of the streamed, uncommitted transactions the relay keeps
    /// (`relay.stage_*`, `relay/stage.rs`).
    pub(crate) stage: StageSettings,
    /// `relay.streamed_produce`: whether sink transactions take a streamed transaction's
    /// records before its commit (`relay/early.rs`).
    pub(crate) streamed_produce: StreamedProduce,
}

/// `relay.streamed_produce`: when the records of a transaction the server streams before its
/// commit (`postgres.streaming`) are handed to the sink. Only sink transactions
/// (`[kafka] exactly_once = "transactions"`) can take them sooner — an open broker transaction
/// can still be aborted — so every other mode publishes at the commit whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamedProduce {
    /// Produced into an open sink transaction as the blocks arrive, committed with the source
    /// commit, aborted when it aborts (`relay/early.rs` says when it falls back to the stage).
    AsReceived,
    /// Kept in the stage and produced after the source commit.
    AtCommit,
}

impl StreamedProduce {
    fn from_config(value: &str) -> Result<StreamedProduce, String> {
        match value {
            "as-received" => Ok(StreamedProduce::AsReceived),
            "at-commit" => Ok(StreamedProduce::AtCommit),
            other => Err(format!("{other:?} is not one of \"as-received\", \"at-commit\"")),
        }
    }
}

/// `relay.stage_dir`, `relay.stage_memory_bytes`, `relay.stage_disk_bytes`: the stage of
/// streamed transactions (`relay/stage.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StageSettings {
    /// The directory; each slot stages in a subdirectory of its own name.
    pub(crate) dir: std::path::PathBuf,
    /// Changes kept in memory, all open streamed transactions together, before the largest
    /// transaction is spilled to `dir`.
    pub(crate) memory_bytes: usize,
    /// What the spill files may hold together; beyond it the session stops with
    /// `RelayError::Stage`.
    pub(crate) disk_bytes: u64,
}

impl StageSettings {
    /// The default directory: `outbox-relay-stage` in the system's temporary directory.
    pub(crate) fn default_dir() -> std::path::PathBuf {
        std::env::temp_dir().join("outbox-relay-stage")
    }
}

impl RelaySettings {
    /// Exactly-once: how long the stream may go without a status update before it stops handing
    /// records to librdkafka (three status intervals, at least 3 s) — a holder that was paused
    /// that long may have been taken over. A healthy stream sends one every status interval from
    /// the top arm of its loop; a false alarm only restarts the session.
    pub(crate) fn stale_limit(&self) -> Duration {
        (self.status_interval * 3).max(Duration::from_secs(3))
    }
}

/// `[relay] delivery`: what a replay after a crash or reconnect may publish twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Delivery {
    /// Everything after the slot's confirmed position is published again (the default).
    #[default]
    AtLeastOnce,
    /// Records carry their source position in headers; a replay first reads back the tail of
    /// each partition it is about to write and skips what Kafka already holds
    /// (`relay::resume`, docs/reliability.md).
    ExactlyOnce,
}

impl Delivery {
    pub(crate) fn from_config(value: &str) -> Result<Self, String> {
        match value {
            "at-least-once" => Ok(Delivery::AtLeastOnce),
            "exactly-once" => Ok(Delivery::ExactlyOnce),
            other => Err(format!(
                "{other:?} is not a delivery mode; use \"at-least-once\" (the default) or \"exactly-once\""
            )),
        }
    }
}

/// `[relay] on_bad_event`, validated (dead-letter carries its topic). What each policy does is
/// described with the dead letter (`outbox::bad_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BadEventPolicy {
    Fail,
    Skip,
    DeadLetter { topic: String },
}

impl BadEventPolicy {
    /// Builds the policy from the two config keys; the error is a sentence for the config author.
    pub(crate) fn from_config(policy: &str, dead_letter_topic: Option<&str>) -> Result<Self, String> {
        match policy {
            "fail" => Ok(BadEventPolicy::Fail),
            "skip" => Ok(BadEventPolicy::Skip),
            "dead-letter" => {
                let Some(topic) = dead_letter_topic else {
                    return Err(
                        "on_bad_event = \"dead-letter\" needs relay.dead_letter_topic, the topic bad events are published to"
                            .into(),
                    );
                };
                // The sink's own name rule applies too: Kafka's in `Settings::validate`, the
                // others' when the relay starts (`relay::run`).
                if topic.trim().is_empty() {
                    return Err(
                        "relay.dead_letter_topic is empty; name the topic (subject, stream) bad events go to".into(),
                    );
                }
                Ok(BadEventPolicy::DeadLetter {
                    topic: topic.to_owned(),
                })
            }
            other => Err(format!(
                "{other:?} is not a policy; use \"fail\" (the default), \"dead-letter\" or \"skip\""
            )),
        }
    }

    /// The metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            BadEventPolicy::Fail => "fail",
            BadEventPolicy::Skip => "skip",
            BadEventPolicy::DeadLetter { .. } => "dead-letter",
        }
    }
}

impl RelaySection {
    pub(crate) fn validate(self) -> Result<RelaySettings, ConfigError> {
        let positive = |key: &'static str, v: u64| {
            if v == 0 {
                Err(ConfigError::Invalid {
                    key,
                    message: "must be greater than zero".into(),
                })
            } else {
                Ok(v)
            }
        };
        let ms = Duration::from_millis;
        let backoff_initial = positive("relay.reconnect_backoff_initial_ms", self.reconnect_backoff_initial_ms)?;
        if self.reconnect_backoff_max_ms < backoff_initial {
            return Err(ConfigError::Invalid {
                key: "relay.reconnect_backoff_max_ms",
                message: format!(
                    "{} ms is below relay.reconnect_backoff_initial_ms ({backoff_initial} ms), so the cap would \
                     undercut the first delay; raise relay.reconnect_backoff_max_ms to at least {backoff_initial} \
                     or lower relay.reconnect_backoff_initial_ms",
                    self.reconnect_backoff_max_ms
                ),
            });
        }
        let relay = RelaySettings {
            max_in_flight: positive("relay.max_in_flight", self.max_in_flight)? as usize,
            max_in_flight_bytes: positive("relay.max_in_flight_bytes", self.max_in_flight_bytes)? as usize,
            status_interval: ms(positive("relay.status_interval_ms", self.status_interval_ms)?),
            shutdown_timeout: ms(self.shutdown_timeout_ms),
            reconnect_backoff_initial: ms(backoff_initial),
            reconnect_backoff_max: ms(self.reconnect_backoff_max_ms),
            connect_timeout: ms(positive("relay.connect_timeout_ms", self.connect_timeout_ms)?),
            standby_poll: ms(self.standby_poll_ms),
            takeover_after: (self.takeover_after_ms > 0).then(|| ms(self.takeover_after_ms)),
            slot_check_interval: ms(self.slot_check_interval_ms),
            retained_wal_warn_bytes: (self.retained_wal_warn_bytes > 0).then_some(self.retained_wal_warn_bytes),
            heartbeat_interval: (self.heartbeat_interval_ms > 0).then(|| ms(self.heartbeat_interval_ms)),
            receive_timeout: ms(self.receive_timeout_ms),
            on_bad_event: BadEventPolicy::from_config(&self.on_bad_event, self.dead_letter_topic.as_deref()).map_err(
                |message| ConfigError::Invalid {
                    key: "relay.on_bad_event",
                    message,
                },
            )?,
            delivery: Delivery::from_config(&self.delivery).map_err(|message| ConfigError::Invalid {
                key: "relay.delivery",
                message,
            })?,
            read_back_max_records: positive("relay.read_back_max_records", self.read_back_max_records)? as usize,
            transaction_max_events: positive("relay.transaction_max_events", self.transaction_max_events)? as usize,
            transaction_max_age: ms(positive("relay.transaction_max_ms", self.transaction_max_ms)?),
            stage: StageSettings {
                dir: stage_dir(self.stage_dir)?,
                memory_bytes: usize::try_from(positive("relay.stage_memory_bytes", self.stage_memory_bytes)?)
                    .unwrap_or(usize::MAX),
                disk_bytes: positive("relay.stage_disk_bytes", self.stage_disk_bytes)?,
            },
            streamed_produce: StreamedProduce::from_config(&self.streamed_produce).map_err(|message| {
                ConfigError::Invalid {
                    key: "relay.streamed_produce",
                    message,
                }
            })?,
        };
        moved("relay.exactly_once", self.exactly_once.as_ref(), MOVED_EXACTLY_ONCE)?;
        moved(
            "relay.checkpoint_topic",
            self.checkpoint_topic.as_ref(),
            MOVED_CHECKPOINT_TOPIC,
        )?;
        validate_ha(&relay)?;
        Ok(relay)
    }
}

/// What `relay.exactly_once` became: the way a sink delivers exactly once is the sink's own
/// setting, and only Kafka has two.
const MOVED_EXACTLY_ONCE: &str = "moved to the Kafka section: write `exactly_once = \"transactions\"` under \
     [kafka] (with relay.delivery = \"exactly-once\" and \"transactional.id\"), or remove the key for the read-back \
     (the default); docs/configuration.md, [kafka]";
/// What `relay.checkpoint_topic` became.
const MOVED_CHECKPOINT_TOPIC: &str =
    "moved to the Kafka section: write `checkpoint_topic = \"<topic>\"` under [kafka] \
     (docs/configuration.md, [kafka])";

/// `relay.stage_dir`: absolute, so that where the spill files go does not depend on the working
/// directory the relay was started in.
fn stage_dir(dir: Option<std::path::PathBuf>) -> Result<std::path::PathBuf, ConfigError> {
    match dir {
        None => Ok(StageSettings::default_dir()),
        Some(dir) if dir.is_absolute() => Ok(dir),
        Some(dir) => Err(ConfigError::Invalid {
            key: "relay.stage_dir",
            message: format!(
                "{} is a relative path; give an absolute directory the relay may write to (default {})",
                dir.display(),
                StageSettings::default_dir().display()
            ),
        }),
    }
}

/// A key that moved to another section is refused, naming where it went.
fn moved(key: &'static str, value: Option<&toml::Value>, message: &str) -> Result<(), ConfigError> {
    match value {
        None => Ok(()),
        Some(_) => Err(ConfigError::Invalid {
            key,
            message: message.into(),
        }),
    }
}

/// The standby/takeover, slot-health and dead-connection keys, which only make sense together.
fn validate_ha(r: &RelaySettings) -> Result<(), ConfigError> {
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

    use super::*;

    use crate::config::test_support::{load, refusal};

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
    }

    #[test]
    fn delivery_defaults_to_at_least_once_and_names_the_choices() {
        let r = load("", &[]).unwrap().relay;
        assert_eq!(r.delivery, Delivery::AtLeastOnce);
        assert_eq!(r.read_back_max_records, 100_000);
        let r = load("[relay]\ndelivery = \"exactly-once\"\n", &[]).unwrap().relay;
        assert_eq!(r.delivery, Delivery::ExactlyOnce);
        let r = load("", &[("OUTBOX_RELAY__RELAY__DELIVERY", "exactly-once")])
            .unwrap()
            .relay;
        assert_eq!(r.delivery, Delivery::ExactlyOnce);
        let err = refusal("[relay]\ndelivery = \"exactly_once\"\n", &[]);
        assert!(
            err.contains("relay.delivery") && err.contains("\"exactly-once\""),
            "{err}"
        );
        let err = refusal("[relay]\nread_back_max_records = 0\n", &[]);
        assert!(err.contains("relay.read_back_max_records"), "{err}");
    }

    #[test]
    fn keys_come_from_the_file_and_the_environment() {
        let s = load(
            "[relay]\ntakeover_after_ms = 5000\nretained_wal_warn_bytes = 0\n",
            &[("OUTBOX_RELAY__RELAY__HEARTBEAT_INTERVAL_MS", "250")],
        )
        .unwrap();
        assert_eq!(s.relay.takeover_after, Some(Duration::from_secs(5)));
        assert_eq!(s.relay.retained_wal_warn_bytes, None, "0 disables the warning");
        assert_eq!(s.relay.heartbeat_interval, Some(Duration::from_millis(250)));
    }

    #[test]
    fn unsafe_or_useless_values_are_refused_with_the_key_named() {
        for (extra, key) in [
            ("[relay]\nstandby_poll_ms = 0\n", "relay.standby_poll_ms"),
            ("[relay]\nstandby_poll_ms = 600000\n", "relay.standby_poll_ms"),
            ("[relay]\ntakeover_after_ms = 1500\n", "relay.takeover_after_ms"),
            ("[relay]\nslot_check_interval_ms = 0\n", "relay.slot_check_interval_ms"),
            ("[relay]\nreceive_timeout_ms = 1500\n", "relay.receive_timeout_ms"),
        ] {
            let err = refusal(extra, &[]);
            assert!(err.contains(key), "{extra:?}: {err}");
        }
    }

    #[test]
    fn reconnect_backoff_max_below_initial_is_refused_naming_both_keys() {
        let err = refusal(
            "[relay]\nreconnect_backoff_initial_ms = 2000\nreconnect_backoff_max_ms = 1000\n",
            &[],
        );
        assert!(err.contains("relay.reconnect_backoff_max_ms"), "{err}");
        assert!(err.contains("relay.reconnect_backoff_initial_ms"), "{err}");
        assert!(err.contains("1000 ms") && err.contains("at least 2000"), "{err}");
        let env = refusal("", &[("OUTBOX_RELAY__RELAY__RECONNECT_BACKOFF_MAX_MS", "499")]);
        assert!(env.contains("relay.reconnect_backoff_max_ms"), "{env}");
        let equal = load(
            "[relay]\nreconnect_backoff_initial_ms = 1000\nreconnect_backoff_max_ms = 1000\n",
            &[],
        )
        .unwrap()
        .relay;
        assert_eq!(equal.reconnect_backoff_initial, Duration::from_secs(1));
        assert_eq!(equal.reconnect_backoff_max, Duration::from_secs(1));
        let defaults = load("", &[]).unwrap().relay;
        assert_eq!(defaults.reconnect_backoff_initial, Duration::from_millis(500));
        assert_eq!(defaults.reconnect_backoff_max, Duration::from_secs(30));
    }

    #[test]
    fn policy_parsing() {
        assert_eq!(BadEventPolicy::from_config("fail", None), Ok(BadEventPolicy::Fail));
        assert_eq!(
            BadEventPolicy::from_config("skip", Some("ignored")),
            Ok(BadEventPolicy::Skip)
        );
        assert_eq!(
            BadEventPolicy::from_config("dead-letter", Some("outbox.dlq")),
            Ok(BadEventPolicy::DeadLetter {
                topic: "outbox.dlq".into()
            })
        );
        assert!(BadEventPolicy::from_config("dead-letter", None)
            .unwrap_err()
            .contains("dead_letter_topic"));
        // The sink's name rule is applied with the sink known (Kafka's in `Settings::validate`).
        assert!(BadEventPolicy::from_config("dead-letter", Some(" "))
            .unwrap_err()
            .contains("dead_letter_topic"));
        assert!(BadEventPolicy::from_config("ignore", None)
            .unwrap_err()
            .contains("\"skip\""));
    }
}
