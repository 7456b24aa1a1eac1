//! `[transactions]`: transaction metadata with the events — per-event headers (transaction id,
//! commit LSN, commit time, the event's position in its transaction and their count) and BEGIN / END markers
//! to a topic in Debezium's transaction-metadata format (`provide.transaction.metadata`).
//!
//! ```toml
//! [transactions]
//! headers = true
//! topic = "outbox.transaction"
//! ```

use serde::Deserialize;

use crate::config::relay::Delivery;
use crate::config::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct TransactionsSection {
    pub(crate) headers: bool,
    pub(crate) topic: Option<String>,
}

/// The validated `[transactions]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionMetadata {
    /// Each event carries its transaction's headers.
    pub(crate) headers: bool,
    /// BEGIN / END markers go to this destination (the sink's name rule applies).
    pub(crate) topic: Option<String>,
}

impl TransactionsSection {
    /// `None`: neither headers nor markers. Markers are refused with exactly-once delivery,
    /// whose replay check knows the outbox events' positions, not the markers'.
    pub(crate) fn validate(self, delivery: Delivery) -> Result<Option<TransactionMetadata>, ConfigError> {
        if let Some(topic) = &self.topic {
            if topic.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "transactions.topic",
                    message: "is empty; name the topic for BEGIN / END markers, e.g. \"outbox.transaction\", or \
                              remove the key"
                        .into(),
                });
            }
            if delivery == Delivery::ExactlyOnce {
                return Err(ConfigError::Invalid {
                    key: "transactions.topic",
                    message: "is not available with relay.delivery = \"exactly-once\" (its replay check covers \
                              outbox events, not markers, so markers could be duplicated); remove the key, or \
                              use at-least-once delivery (markers then follow the events' guarantee)"
                        .into(),
                });
            }
        }
        if !self.headers && self.topic.is_none() {
            return Ok(None);
        }
        Ok(Some(TransactionMetadata {
            headers: self.headers,
            topic: self.topic,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_need_at_least_once_and_a_name() {
        let section = |topic: Option<&str>| TransactionsSection {
            headers: false,
            topic: topic.map(str::to_owned),
        };
        assert_eq!(section(None).validate(Delivery::AtLeastOnce).unwrap(), None);
        assert!(section(Some("tx")).validate(Delivery::AtLeastOnce).unwrap().is_some());
        let err = section(Some("tx")).validate(Delivery::ExactlyOnce).unwrap_err();
        assert!(err.to_string().contains("exactly-once"), "{err}");
        assert!(section(Some("")).validate(Delivery::AtLeastOnce).is_err());
    }
}
