//! `[kafka]`: librdkafka properties, passed through except for the durability-critical ones
//! (idempotence, `acks`), which the relay sets and refuses to see weakened; the relay's own two
//! Kafka keys (`exactly_once`, `checkpoint_topic`: how this sink delivers exactly once, when
//! `relay.delivery` asks for it); and Kafka's topic-name rule, which the dead-letter topic and
//! every routed topic must satisfy.
//!
//! The section never learns the delivery mode: it says what the sink *can* do (the exactly-once
//! strategy the user chose, or why neither works with these properties), and the relay decides.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use std::sync::Arc;

use crate::config::secret::is_secret_key;
use crate::config::sink::{parse_section, SectionContext, SinkSection, SinkSectionSpec};
use crate::config::ConfigError;

/// `[sink] kind = "kafka"` (the default) and its `[kafka]` section of librdkafka properties.
pub(crate) struct KafkaSection;

/// The config half of `[kafka]` (its plugin's `SPEC`, registered in `src/sink/registry.rs`).
pub(crate) const SECTION: KafkaSection = KafkaSection;

/// The relay's own keys in `[kafka]`: not librdkafka properties (those are dotted), never passed
/// to the client.
const OWN_KEYS: [&str; 2] = ["exactly_once", "checkpoint_topic"];

/// Where the checkpoint of Kafka transactions lives unless `checkpoint_topic` says otherwise.
const DEFAULT_CHECKPOINT_TOPIC: &str = "outbox-relay-checkpoints";

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
        let mut raw: BTreeMap<String, KafkaValue> = match section {
            Some(v) => parse_section("kafka", v)?,
            None => BTreeMap::new(),
        };
        let exactly_once = match raw.remove("exactly_once") {
            None => KafkaExactlyOnce::ReadBack,
            Some(KafkaValue(v)) => KafkaExactlyOnce::from_config(&v)?,
        };
        let checkpoint_topic = raw
            .remove("checkpoint_topic")
            .map_or_else(|| DEFAULT_CHECKPOINT_TOPIC.to_owned(), |v| v.0);
        let mut properties = KafkaProperties::validate(raw)?;
        if let Some(topic) = cx.dead_letter_topic {
            validate_topic_name(topic).map_err(|m| ConfigError::Invalid {
                key: "relay.on_bad_event",
                message: format!("relay.dead_letter_topic: {m}"),
            })?;
        }
        properties.check_transactional(exactly_once == KafkaExactlyOnce::Transactions)?;
        if exactly_once == KafkaExactlyOnce::Transactions {
            validate_topic_name(&checkpoint_topic).map_err(|m| ConfigError::Invalid {
                key: "kafka.checkpoint_topic",
                message: m,
            })?;
        }
        let refusal =
            exactly_once_partitioner(&properties).or_else(|| exactly_once_timeout(&properties, cx.status_interval));
        let queue_note = super::producer::small_queue_note(&properties, cx.max_in_flight);
        Ok(Arc::new(KafkaSettings {
            properties,
            exactly_once,
            checkpoint_topic,
            refusal,
            queue_note,
        }))
    }

    /// librdkafka property names are dotted: `OUTBOX_RELAY__KAFKA__BOOTSTRAP_SERVERS` sets
    /// `bootstrap.servers`; the relay's own keys keep their `_`.
    fn env_key(&self, key: &str) -> String {
        let key = key.to_ascii_lowercase();
        if OWN_KEYS.contains(&key.as_str()) {
            return key;
        }
        key.replace('_', ".")
    }
}

/// `[kafka] exactly_once`: how the Kafka sink delivers exactly once when `relay.delivery =
/// "exactly-once"` asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum KafkaExactlyOnce {
    /// A (re)started stream reads back the tail of each partition it replays into
    /// (`relay/guarantee/read_back.rs`): any Kafka, no broker transactions.
    #[default]
    ReadBack,
    /// One Kafka transaction per batch of whole source transactions, committed with a checkpoint
    /// before their WAL position is confirmed (`relay/guarantee/transactions.rs`,
    /// `transactions.rs` here).
    Transactions,
}

impl KafkaExactlyOnce {
    fn from_config(value: &str) -> Result<Self, ConfigError> {
        match value {
            "read-back" => Ok(KafkaExactlyOnce::ReadBack),
            "transactions" => Ok(KafkaExactlyOnce::Transactions),
            other => Err(ConfigError::Invalid {
                key: "kafka.exactly_once",
                message: format!(
                    "{other:?} is not a way Kafka delivers exactly once; use \"read-back\" (the default) or \
                     \"transactions\""
                ),
            }),
        }
    }
}

/// `[kafka]`, validated: the librdkafka properties and the relay's own Kafka keys.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KafkaSettings {
    pub(crate) properties: KafkaProperties,
    pub(crate) exactly_once: KafkaExactlyOnce,
    /// Kafka transactions: the topic whose partition 0 carries the committed checkpoint (as the
    /// offset of the consumer group named after `transactional.id`).
    pub(crate) checkpoint_topic: String,
    /// Why neither exactly-once strategy works with these properties (`None`: they do).
    refusal: Option<String>,
    /// `run`'s start warning about a producer queue the user sized below the in-flight budget.
    queue_note: Option<String>,
}

impl KafkaSettings {
    /// Why exactly-once delivery is not possible with these properties, in the refusal's words.
    pub(crate) fn exactly_once_refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// The properties of a producer whose queued records a takeover may have to wait for
    /// (exactly-once): `message.timeout.ms` bounded unless the user set it (see
    /// [`EXACTLY_ONCE_MESSAGE_TIMEOUT`]).
    pub(crate) fn exactly_once_properties(&self) -> KafkaProperties {
        let mut properties = self.properties.clone();
        properties.bound_message_timeout();
        properties
    }
}

impl SinkSection for KafkaSettings {
    fn start_warnings(&self) -> Vec<String> {
        self.queue_note.iter().cloned().collect()
    }

    fn get(&self, key: &str) -> Option<String> {
        match key {
            "exactly_once" => Some(
                match self.exactly_once {
                    KafkaExactlyOnce::ReadBack => "read-back",
                    KafkaExactlyOnce::Transactions => "transactions",
                }
                .to_owned(),
            ),
            "checkpoint_topic" => Some(self.checkpoint_topic.clone()),
            _ => (!is_secret_key(key))
                .then(|| self.properties.0.get(key).cloned())
                .flatten(),
        }
    }
}

/// Exactly-once reads back the partition a record's key maps to, computed with Java's murmur2
/// (`murmur2_random`, the default): another partitioner would send records elsewhere, the
/// read-back would look in the wrong partitions and replays would be duplicated silently.
fn exactly_once_partitioner(kafka: &KafkaProperties) -> Option<String> {
    match kafka.0.get("partitioner").map(String::as_str) {
        None | Some("murmur2_random") => None,
        Some(other) => Some(format!(
            "[kafka] partitioner = {other:?}: the read-back finds a record's partition with murmur2 (partitioner = \
             \"murmur2_random\", the default), so replays would go unchecked. Remove the partitioner key"
        )),
    }
}

/// Exactly-once with a user-set message timeout: it must leave room for the stream's batching
/// (`linger.ms`) and status updates, and be a number.
fn exactly_once_timeout(kafka: &KafkaProperties, status_interval: Duration) -> Option<String> {
    let (key, ms) = kafka.user_message_timeout()?;
    let linger = kafka
        .0
        .get("linger.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let floor = linger.max(status_interval.as_millis() as u64).max(1_000);
    match ms {
        Some(ms) if ms >= floor => None,
        _ => Some(format!(
            "[kafka] {key} = {:?}: it must be a number of milliseconds of at least {floor} (1 s, \
             relay.status_interval_ms and linger.ms), or left out (the relay then uses {} ms)",
            kafka.0.get(key).map(String::as_str).unwrap_or_default(),
            EXACTLY_ONCE_MESSAGE_TIMEOUT.as_millis()
        )),
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
        // transactional.id is checked with `[kafka] exactly_once` (`check_transactional`): it is
        // only for exactly_once = "transactions".
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

    /// `[kafka] exactly_once = "transactions"`: needs `transactional.id` (one per slot: the
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
                message: "exactly_once = \"transactions\" needs `\"transactional.id\" = \"<one name per slot>\"` \
                          under [kafka]; the standby of the same slot uses the same id"
                    .into(),
            }),
            (false, _) if self.0.contains_key("transactional.id") => Err(ConfigError::Invalid {
                key: "kafka",
                message: "transactional.id is only for exactly_once = \"transactions\" under [kafka] (with \
                          relay.delivery = \"exactly-once\"); otherwise the relay uses the idempotent producer. Remove \
                          the key"
                    .into(),
            }),
            (true, true) => {
                if !self.0.contains_key("transaction.timeout.ms") {
                    // The transactional producer's messages time out as any exactly-once
                    // producer's do (`KafkaSettings::exactly_once_properties`).
                    let mut bounded = self.clone();
                    bounded.bound_message_timeout();
                    let timeout = bounded.message_timeout().max(TRANSACTION_TIMEOUT);
                    self.0
                        .insert("transaction.timeout.ms".into(), timeout.as_millis().to_string());
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Bounds `message.timeout.ms` unless the user set it (see [`EXACTLY_ONCE_MESSAGE_TIMEOUT`]).
    fn bound_message_timeout(&mut self) {
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
        &self.kafka_settings().properties
    }

    /// The whole `[kafka]` section of settings whose sink is the default one, for tests.
    pub(crate) fn kafka_settings(&self) -> &KafkaSettings {
        self.sink.section::<KafkaSettings>().expect("the sink is kafka")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn topic_name_rules() {
        let long = |n: usize| "a".repeat(n);
        for (name, legal) in [
            ("order.placed-v1_x".to_owned(), true),
            (String::new(), false),
            ("..".to_owned(), false),
            ("has space".to_owned(), false),
            ("ünï".to_owned(), false),
            (long(250), false),
            (long(249), true),
        ] {
            assert_eq!(validate_topic_name(&name).is_ok(), legal, "{name:?}");
        }
    }

    proptest! {
        #[test]
        fn topic_validation_is_kafkas_rule(name in prop_oneof![".{0,20}", "[a-zA-Z0-9._-]{0,260}", "[.]{1,3}"]) {
            prop_assert_eq!(validate_topic_name(&name).is_ok(), legal_topic(&name), "{:?}", name);
        }
    }

    use crate::config::test_support::{load, settings};
    use crate::sink::refusal::{refusal, StartRefusal};
    use crate::sink::ExactlyOnce;

    /// What `run` and `setup` say of exactly-once with `kafka` in the `[kafka]` section.
    fn exactly_once_refusal(kafka: &str) -> Option<String> {
        match refusal(&settings(&format!("{kafka}[relay]\ndelivery = \"exactly-once\"\n"))) {
            Ok(()) => None,
            Err(e @ StartRefusal::ExactlyOnceUnsupported { .. }) => Some(e.to_string()),
            Err(other) => panic!("another refusal: {other}"),
        }
    }

    #[test]
    fn a_producer_queue_sized_below_the_budget_is_warned_about_at_start() {
        let small = settings("\"queue.buffering.max.messages\" = 1001\n[relay]\nmax_in_flight = 1000\n");
        let warnings = small.start_warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("queue.buffering.max.messages = 1001") && w.contains("(11000)")),
            "{warnings:?}"
        );
        assert!(settings("[relay]\nmax_in_flight = 1000\n").start_warnings().is_empty());
        assert!(settings("\"queue.buffering.max.messages\" = 20000\n")
            .start_warnings()
            .is_empty());
    }

    #[test]
    fn an_exactly_once_producer_bounds_the_message_timeout_unless_the_user_set_it() {
        let s = settings("");
        assert_eq!(
            s.kafka().0.get("message.timeout.ms"),
            None,
            "librdkafka's default stays"
        );
        assert_eq!(
            s.kafka_settings().exactly_once_properties().0["message.timeout.ms"],
            "10000"
        );
        // The alias counts as set: it is not overridden.
        let alias = settings("\"delivery.timeout.ms\" = 20000\n");
        assert_eq!(
            alias
                .kafka_settings()
                .exactly_once_properties()
                .0
                .get("message.timeout.ms"),
            None
        );
        let ExactlyOnce::ReadBack(source) = crate::sink::exactly_once(&alias) else {
            panic!("reads back")
        };
        let expiry = source.queue_expiry().expect("a client queue");
        assert_eq!(
            (expiry.expiry, expiry.key, expiry.unset),
            (
                Duration::from_secs(20),
                "delivery.timeout.ms",
                Some(EXACTLY_ONCE_MESSAGE_TIMEOUT)
            )
        );
    }

    #[test]
    fn exactly_once_refuses_a_tiny_message_timeout_and_at_least_once_leaves_it_to_the_user() {
        for bad in ["\"message.timeout.ms\" = 500\n", "\"message.timeout.ms\" = \"soon\"\n"] {
            let err = exactly_once_refusal(bad).expect("refused");
            assert!(
                err.contains("message.timeout.ms") && err.contains("at least 1000"),
                "{err}"
            );
        }
        assert_eq!(exactly_once_refusal("\"message.timeout.ms\" = 40000\n"), None);
        // The same timeout in at-least-once mode is the user's business.
        assert_eq!(refusal(&settings("\"message.timeout.ms\" = 500\n")), Ok(()));
    }

    #[test]
    fn exactly_once_refuses_a_partitioner_its_read_back_cannot_follow() {
        let err = exactly_once_refusal("partitioner = \"consistent_random\"\n").expect("refused");
        assert!(
            err.contains("\"consistent_random\"") && err.contains("murmur2_random") && err.contains("at-least-once"),
            "{err}"
        );
        assert_eq!(exactly_once_refusal("partitioner = \"murmur2_random\"\n"), None);
        assert_eq!(exactly_once_refusal(""), None);
        // At-least-once reads nothing back: any partitioner is the user's business.
        assert_eq!(refusal(&settings("partitioner = \"consistent_random\"\n")), Ok(()));
    }

    #[test]
    fn kafka_transactions_need_a_transactional_id_and_name_their_checkpoint_topic() {
        let txn = "\"transactional.id\" = \"orders-relay\"\nexactly_once = \"transactions\"\n";
        let s = settings(&format!("{txn}[relay]\ndelivery = \"exactly-once\"\n"));
        let kafka = s.kafka_settings();
        assert_eq!(kafka.exactly_once, KafkaExactlyOnce::Transactions);
        assert!(matches!(crate::sink::exactly_once(&s), ExactlyOnce::Transactions));
        assert_eq!(s.relay.transaction_max_events, 2_000);
        assert_eq!(s.relay.transaction_max_age, Duration::from_millis(100));
        assert_eq!(kafka.checkpoint_topic, "outbox-relay-checkpoints");
        assert_eq!(kafka.properties.0["transactional.id"], "orders-relay");
        assert!(
            !kafka.properties.0.contains_key("exactly_once"),
            "the relay's own keys stay out of librdkafka's"
        );
        // The larger of the transaction default and the (exactly-once) message timeout.
        assert_eq!(kafka.properties.0["transaction.timeout.ms"], "10000");
        assert_eq!(settings("").kafka_settings().exactly_once, KafkaExactlyOnce::ReadBack);
        let err = load("exactly_once = \"transactions\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("needs `\"transactional.id\""), "{err}");
        let err = load("\"transactional.id\" = \"x\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("transactional.id is only for"), "{err}");
        let err = load("exactly_once = \"kafka-transactions\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kafka.exactly_once") && err.contains("\"transactions\""),
            "{err}"
        );
        let err = load(&format!("{txn}checkpoint_topic = \"bad topic\"\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.checkpoint_topic"), "{err}");
        // The relay's own keys from the environment keep their `_`.
        let s = load(
            "\"transactional.id\" = \"x\"\n",
            &[("OUTBOX_RELAY__KAFKA__EXACTLY_ONCE", "transactions")],
        )
        .expect("valid");
        assert_eq!(s.kafka_settings().exactly_once, KafkaExactlyOnce::Transactions);
    }
}
