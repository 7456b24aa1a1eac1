//! `[kafka]`: librdkafka properties, passed through except for the durability-critical ones
//! (idempotence, `acks`), which the relay sets and refuses to see weakened; and Kafka's
//! topic-name rule, which the dead-letter topic and every routed topic must satisfy.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::secret::is_secret_key;
use crate::config::ConfigError;

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
#[derive(Clone, PartialEq)]
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

/// Librdkafka defaults this relay relies on. Users may override all but the two durability ones.
const KAFKA_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // The Java client's partitioner, so keys land where Debezium / Kafka Connect put them.
    ("partitioner", "murmur2_random"),
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
        if props.contains_key("transactional.id") {
            return Err(ConfigError::Invalid {
                key: "kafka",
                message: "transactional.id is not supported; the relay uses the idempotent producer. Remove the key"
                    .into(),
            });
        }
        for (k, v) in KAFKA_DEFAULTS {
            if !(*k == "acks" && props.contains_key("request.required.acks")) {
                props.entry((*k).to_owned()).or_insert_with(|| (*v).to_owned());
            }
        }
        Ok(KafkaProperties(props))
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
