//! What `run` refuses to start with, decided from the configuration and the configured sink
//! alone, before anything is connected to or created.
//!
//! Invariant: `run`, `setup` and `setup --check` all call [`refusal`] first, so a configuration
//! `run` would refuse is refused by `setup` too — with the same words — and a deploy pipeline
//! that runs `setup` learns it there, not when the relay starts. It lives beside the sinks
//! because every such refusal is about what the configured sink can do, and because `relay` and
//! `control` both import `sink` but not each other.

use crate::config::relay::{BadEventPolicy, Delivery};
use crate::config::Settings;

use super::ExactlyOnce;

/// A configuration the relay cannot run with. Each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartRefusal {
    #[error(
        "relay.dead_letter_topic {topic:?} is not a name {sink} takes: {reason}. Set relay.dead_letter_topic to a \
         name the sink accepts"
    )]
    DeadLetterName {
        sink: &'static str,
        topic: String,
        reason: String,
    },
    #[error(
        "relay.delivery = \"exactly-once\" is not possible with [sink] kind = \"{sink}\": {reason}. Set \
         relay.delivery = \"at-least-once\" (consumers deduplicate on the id header)"
    )]
    ExactlyOnceUnsupported { sink: &'static str, reason: String },
}

/// The first thing about `settings` the relay refuses to run with, if any.
pub(crate) fn refusal(settings: &Settings) -> Result<(), StartRefusal> {
    if let BadEventPolicy::DeadLetter { topic } = &settings.relay.on_bad_event {
        (super::limits(settings).check_name)(topic).map_err(|reason| StartRefusal::DeadLetterName {
            sink: settings.sink.broker_name(),
            topic: topic.clone(),
            reason,
        })?;
    }
    if let (Delivery::ExactlyOnce, ExactlyOnce::Unsupported(reason)) =
        (settings.relay.delivery, super::exactly_once(settings))
    {
        return Err(StartRefusal::ExactlyOnceUnsupported {
            sink: settings.sink.label(),
            reason: reason.into_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn settings(extra: &str) -> Settings {
        let text = format!(
            "[postgres]\nurl = \"postgres://u@localhost/db\"\n[outbox]\ntable = \"public.outbox\"\n\
             key_column = \"aggregate_id\"\nroute_by_column = \"type\"\npayload_column = \"payload\"\n{extra}"
        );
        Settings::from_toml_str(&text, Path::new("t.toml"), std::iter::empty()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn exactly_once_with_rabbitmq_is_refused_and_with_kafka_not() {
        let rabbit = settings(
            "[relay]\ndelivery = \"exactly-once\"\n[sink]\nkind = \"rabbitmq\"\n[rabbitmq]\n\
             url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\nexchange = \"outbox\"\n",
        );
        match refusal(&rabbit) {
            Err(StartRefusal::ExactlyOnceUnsupported { sink: "rabbitmq", .. }) => {}
            other => panic!("expected the exactly-once refusal, got {other:?}"),
        }
        let kafka = settings("[relay]\ndelivery = \"exactly-once\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n");
        assert_eq!(refusal(&kafka), Ok(()));
    }

    #[test]
    fn a_dead_letter_subject_nats_cannot_name_is_refused() {
        // Kafka's names are checked when the config loads; the other sinks' rules here.
        let s = settings(
            "[relay]\non_bad_event = \"dead-letter\"\ndead_letter_topic = \"dead.*\"\n\
             [sink]\nkind = \"nats\"\n[nats]\nurl = \"nats://127.0.0.1:4222\"\nstream = \"OUTBOX\"\n",
        );
        match refusal(&s) {
            Err(
                e @ StartRefusal::DeadLetterName {
                    sink: "NATS JetStream", ..
                },
            ) => {
                assert!(e.to_string().contains("\"dead.*\""), "{e}")
            }
            other => panic!("expected the dead-letter name refusal, got {other:?}"),
        }
    }
}
