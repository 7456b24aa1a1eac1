//! `[kafka]`: librdkafka properties, passed through except for the durability-critical ones
//! (idempotence, `acks`), which the relay sets and refuses to see weakened; and Kafka's
//! topic-name rule, which the dead-letter topic and every routed topic must satisfy.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use std::any::Any;
use std::sync::Arc;

use crate::config::relay::{BadEventPolicy, Delivery, ExactlyOnceVia, RelaySettings};
use crate::config::secret::is_secret_key;
use crate::config::sink::{parse_section, ClientQueueExpiry, SectionContext, SinkSection, SinkSectionSpec};
use crate::config::{ConfigError, TAKEOVER_FENCE_MARGIN};

/// `[sink] kind = "kafka"` (the default) and its `[kafka]` section of librdkafka properties.
pub(crate) struct KafkaSection;

/// The config half of `[kafka]` (its plugin's `spec`, registered in `src/sink/registry.rs`).
pub(crate) const SECTION: KafkaSection = KafkaSection;

/// A takeover fence longer than this is warned about at start.
const SLOW_TAKEOVER: Duration = Duration::from_secs(60);

impl SinkSectionSpec for KafkaSection {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn name(&self) -> &'static str {
        "Kafka"
    }

    fn validate(
        &self,
        section: Option<toml::Value>,
        cx: &SectionContext<'_>,
    ) -> Result<Arc<dyn SinkSection>, ConfigError> {
        let raw: BTreeMap<String, KafkaValue> = match section {
            Some(v) => parse_section("kafka", v)?,
            None => BTreeMap::new(),
        };
        let mut kafka = KafkaProperties::validate(raw)?;
        let relay = cx.relay;
        if let BadEventPolicy::DeadLetter { topic } = &relay.on_bad_event {
            validate_topic_name(topic).map_err(|m| ConfigError::Invalid {
                key: "relay.on_bad_event",
                message: format!("relay.dead_letter_topic: {m}"),
            })?;
        }
        if relay.delivery == Delivery::ExactlyOnce {
            validate_exactly_once_timeout(&kafka, relay)?;
            validate_exactly_once_partitioner(&kafka)?;
            kafka.bound_message_timeout();
        }
        let transactions = relay.exactly_once == ExactlyOnceVia::KafkaTransactions;
        kafka.check_transactional(transactions)?;
        if transactions {
            validate_topic_name(&relay.checkpoint_topic).map_err(|m| ConfigError::Invalid {
                key: "relay.checkpoint_topic",
                message: m,
            })?;
        }
        Ok(Arc::new(kafka))
    }

    /// librdkafka property names are dotted: `OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS` sets
    /// `bootstrap.servers`.
    fn env_key(&self, key: &str) -> String {
        key.to_ascii_lowercase().replace('_', ".")
    }

    fn transactions(&self) -> bool {
        true
    }
}

impl SinkSection for KafkaProperties {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn client_queue_expiry(&self) -> Option<ClientQueueExpiry> {
        Some(ClientQueueExpiry {
            expiry: self.message_timeout(),
            key: "message.timeout.ms",
        })
    }

    fn start_warnings(&self, relay: &RelaySettings) -> Vec<String> {
        let mut warnings = Vec::new();
        if relay.delivery == Delivery::ExactlyOnce {
            let fence = relay.stale_limit() + self.message_timeout() + TAKEOVER_FENCE_MARGIN;
            if let (Some((key, _)), true) = (self.user_message_timeout(), fence > SLOW_TAKEOVER) {
                warnings.push(format!(
                    "relay.delivery = \"exactly-once\" with [kafka] {key} = {} ms: a standby taking over from a \
                     frozen or unreachable holder waits up to {} s before publishing (the holder's queued records \
                     must land or expire first). Remove {key} (the relay then uses {} ms: at most {} s) or lower it",
                    self.message_timeout().as_millis(),
                    fence.as_secs(),
                    EXACTLY_ONCE_MESSAGE_TIMEOUT.as_millis(),
                    (relay.stale_limit() + EXACTLY_ONCE_MESSAGE_TIMEOUT + TAKEOVER_FENCE_MARGIN).as_secs(),
                ));
            }
        }
        warnings
    }

    fn get(&self, key: &str) -> Option<String> {
        (!is_secret_key(key)).then(|| self.0.get(key).cloned()).flatten()
    }
}

/// Exactly-once reads back the partition a record's key maps to, computed with Java's murmur2
/// (`murmur2_random`, the default): another partitioner would send records elsewhere, the
/// read-back would look in the wrong partitions and replays would be duplicated silently.
fn validate_exactly_once_partitioner(kafka: &KafkaProperties) -> Result<(), ConfigError> {
    match kafka.0.get("partitioner").map(String::as_str) {
        None | Some("murmur2_random") => Ok(()),
        Some(other) => Err(ConfigError::Invalid {
            key: "kafka",
            message: format!(
                "partitioner = {other:?} with relay.delivery = \"exactly-once\": the read-back finds a record's \
                 partition with murmur2 (partitioner = \"murmur2_random\", the default), so replays would go \
                 unchecked. Remove the partitioner key, or set relay.delivery = \"at-least-once\""
            ),
        }),
    }
}

/// Exactly-once with a user-set message timeout: it must leave room for the stream's batching
/// (`linger.ms`) and be a number.
fn validate_exactly_once_timeout(kafka: &KafkaProperties, relay: &RelaySettings) -> Result<(), ConfigError> {
    let Some((key, ms)) = kafka.user_message_timeout() else {
        return Ok(());
    };
    let linger = kafka
        .0
        .get("linger.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let floor = linger.max(relay.status_interval.as_millis() as u64).max(1_000);
    match ms {
        Some(ms) if ms >= floor => Ok(()),
        _ => Err(ConfigError::Invalid {
            key: "kafka",
            message: format!(
                "{key} = {:?} with relay.delivery = \"exactly-once\": it must be a number of milliseconds of at \
                 least {floor} (1 s, relay.status_interval_ms and linger.ms), or left out (the relay then uses {} ms)",
                kafka.0.get(key).map(String::as_str).unwrap_or_default(),
                EXACTLY_ONCE_MESSAGE_TIMEOUT.as_millis()
            ),
        }),
    }
}

/// Longest topic name Kafka accepts.
pub(crate) const MAX_TOPIC_LEN: usize = 249;

/// A librdkafka property value: TOML strings, integers, floats and booleans are all accepted
/// and passed to librdkafka as their text form.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KafkaValue(pub String);

impl<'de> Deserialize<'de> for KafkaValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Scalar {
            S(String),
            I(i64),
            F(f64),
            B(bool),
        }
        Ok(KafkaValue(match Scalar::deserialize(d)? {
            Scalar::S(s) => s,
            Scalar::I(i) => i.to_string(),
            Scalar::F(f) => f.to_string(),
            Scalar::B(b) => b.to_string(),
        }))
    }
}

/// librdkafka properties with the durability-critical ones enforced.
#[derive(Clone, PartialEq, Default)]
pub struct KafkaProperties(pub BTreeMap<String, String>);

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in &self.0 {
            if is_secret_key(k) {
                m.entry(k, &"********");
            } else {
                m.entry(k, v);
            }
        }
        m.finish()
    }
}

/// librdkafka's own default `message.timeout.ms`: how long a record may wait in its queue.
pub(crate) const LIBRDKAFKA_MESSAGE_TIMEOUT: Duration = Duration::from_secs(300);

/// The `message.timeout.ms` the relay sets in exactly-once mode when the user sets neither it
/// nor its alias: a takeover's fence waits for whatever the previous holder may still have
/// queued in librdkafka to land or expire, so this bounds the takeover (docs/reliability.md).
/// A record not delivered in time only ends the session; the replay skips what Kafka holds.
pub(crate) const EXACTLY_ONCE_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `transaction.timeout.ms` the relay sets for Kafka transactions unless the user sets it:
/// how long a dead holder's open transaction can hold back `read_committed` consumers when no
/// standby fences it sooner (docs/reliability.md).
pub(crate) const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The two names librdkafka accepts for the message timeout.
const MESSAGE_TIMEOUT_KEYS: [&str; 2] = ["message.timeout.ms", "delivery.timeout.ms"];

/// Librdkafka defaults this relay relies on. Users may override all but the two durability ones.
const KAFKA_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // The Java client's partitioner, so keys land where Debezium / Kafka Connect put them.
    ("partitioner", "murmur2_random"),
    // 5 ms, not 0: sending at once cuts commit-to-ack by the linger (docs/benchmarks.md, "Where
    // the time and the CPU go"), but spreads a transaction's events over several requests in
    // flight, and a request the broker refuses for good (an authorization failure) then lets
    // later requests of the same partition land before the refused events are replayed: first
    // deliveries out of commit order (test `failures::non_retriable_broker_error_replays_*`).
    // Until the relay holds back a partition's later records after such a failure, the linger
    // keeps a transaction's events in one request.
    ("linger.ms", "5"),
];

impl KafkaProperties {
    /// Validates the `[kafka]` table: bootstrap servers present, durability not weakened,
    /// no transactions; fills in [`KAFKA_DEFAULTS`].
    pub(crate) fn validate(raw: BTreeMap<String, KafkaValue>) -> Result<KafkaProperties, ConfigError> {
        let mut props: BTreeMap<String, String> = raw.into_iter().map(|(k, v)| (k, v.0)).collect();
        if !props.contains_key("bootstrap.servers") && !props.contains_key("metadata.broker.list") {
            return Err(ConfigError::Invalid {
                key: "kafka",
                message: "bootstrap.servers is missing; add `\"bootstrap.servers\" = \"host:9092\"` under [kafka]"
                    .into(),
            });
        }
        if let Some(v) = props.get("enable.idempotence") {
            if v != "true" {
                return Err(ConfigError::Invalid {
                    key: "kafka",
                    message: format!(
                        "enable.idempotence = {v:?} would allow reordering and duplicates inside one aggregate; remove the key (the relay sets true)"
                    ),
                });
            }
        }
        if let Some(v) = props.get("acks").or_else(|| props.get("request.required.acks")) {
            if v != "all" && v != "-1" {
                return Err(ConfigError::Invalid {
                    key: "kafka",
                    message: format!(
                        "acks = {v:?} lets Kafka acknowledge events it can still lose, and the relay would confirm their WAL; remove the key (the relay sets all)"
                    ),
                });
            }
        }
        // transactional.id is checked with `[relay] exactly_once` (`Settings::validate`): it is
        // only for relay.exactly_once = "kafka-transactions".
        for (k, v) in KAFKA_DEFAULTS {
            if !(*k == "acks" && props.contains_key("request.required.acks")) {
                props.entry((*k).to_owned()).or_insert_with(|| (*v).to_owned());
            }
        }
        Ok(KafkaProperties(props))
    }

    /// The user's own message timeout, if set: `(key, milliseconds)`.
    pub(crate) fn user_message_timeout(&self) -> Option<(&'static str, Option<u64>)> {
        MESSAGE_TIMEOUT_KEYS
            .into_iter()
            .find_map(|k| self.0.get(k).map(|v| (k, v.parse::<u64>().ok())))
    }

    /// How long a queued record can live in librdkafka (`message.timeout.ms`, alias
    /// `delivery.timeout.ms`; librdkafka's default when neither is set).
    pub(crate) fn message_timeout(&self) -> Duration {
        match self.user_message_timeout() {
            Some((_, Some(ms))) => Duration::from_millis(ms),
            _ => LIBRDKAFKA_MESSAGE_TIMEOUT,
        }
    }

    /// `relay.exactly_once = "kafka-transactions"`: needs `transactional.id` (one per slot: the
    /// standby of a slot uses the same one, which is what fences the previous holder), and
    /// bounds `transaction.timeout.ms` unless the user set it, so that the open transaction of
    /// a holder that died with nobody taking over blocks `read_committed` consumers only this
    /// long (librdkafka needs `message.timeout.ms` ≤ `transaction.timeout.ms`). Without
    /// transactions, `transactional.id` is refused.
    pub(crate) fn check_transactional(&mut self, transactions: bool) -> Result<(), ConfigError> {
        let has_id = self.0.get("transactional.id").is_some_and(|v| !v.trim().is_empty());
        match (transactions, has_id) {
            (true, false) => Err(ConfigError::Invalid {
                key: "kafka",
                message: "relay.exactly_once = \"kafka-transactions\" needs `\"transactional.id\" = \"<one name per slot>\"` \
                          under [kafka]; the standby of the same slot uses the same id"
                    .into(),
            }),
            (false, _) if self.0.contains_key("transactional.id") => Err(ConfigError::Invalid {
                key: "kafka",
                message: "transactional.id is only for relay.delivery = \"exactly-once\" with relay.exactly_once = \
                          \"kafka-transactions\"; otherwise the relay uses the idempotent producer. Remove the key"
                    .into(),
            }),
            (true, true) => {
                if !self.0.contains_key("transaction.timeout.ms") {
                    let timeout = self.message_timeout().max(TRANSACTION_TIMEOUT);
                    self.0.insert("transaction.timeout.ms".into(), timeout.as_millis().to_string());
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Exactly-once mode: bounds `message.timeout.ms` unless the user set it (see
    /// [`EXACTLY_ONCE_MESSAGE_TIMEOUT`]).
    pub(crate) fn bound_message_timeout(&mut self) {
        if self.user_message_timeout().is_none() {
            self.0.insert(
                MESSAGE_TIMEOUT_KEYS[0].to_owned(),
                EXACTLY_ONCE_MESSAGE_TIMEOUT.as_millis().to_string(),
            );
        }
    }
}

/// Checks Kafka's topic-name rules (1–249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`);
/// the error says what is wrong with the name.
pub(crate) fn validate_topic_name(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("the routed topic name is empty".into());
    }
    if topic == "." || topic == ".." {
        return Err(format!("{topic:?} is not a legal Kafka topic name"));
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "the routed topic name is {} characters; Kafka allows at most {MAX_TOPIC_LEN}",
            topic.len()
        ));
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic {topic:?} contains {bad:?}; Kafka topic names allow only letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Kafka's topic-name rule, written independently of [`validate_topic_name`] (for tests that
/// check the two agree).
#[cfg(test)]
pub(crate) fn legal_topic(t: &str) -> bool {
    (1..=MAX_TOPIC_LEN).contains(&t.len())
        && t != "."
        && t != ".."
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[cfg(test)]
impl crate::config::Settings {
    /// The `[kafka]` properties of settings whose sink is the default one, for tests.
    pub(crate) fn kafka(&self) -> &KafkaProperties {
        self.sink.section::<KafkaProperties>().expect("the sink is kafka")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn topic_name_rules() {
        assert!(validate_topic_name("order.placed-v1_x").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("has space").is_err());
        assert!(validate_topic_name("ünï").is_err());
        assert!(validate_topic_name(&"a".repeat(250)).is_err());
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
    }

    proptest! {
        #[test]
        fn topic_validation_is_kafkas_rule(name in prop_oneof![".{0,20}", "[a-zA-Z0-9._-]{0,260}", "[.]{1,3}"]) {
            prop_assert_eq!(validate_topic_name(&name).is_ok(), legal_topic(&name), "{:?}", name);
        }
    }
}
