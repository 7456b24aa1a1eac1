//! The destination of an event: its route-by value through the configured [`TopicRoute`]
//! (Debezium EventRouter semantics, see `crate::config::outbox`), then the sink's name rule
//! (Kafka's topic names, NATS subjects, …). A value that routes to an illegal name is a bad event
//! ([`BadEvent::Topic`]), reported with the event's id and LSN by the caller.

use std::borrow::Cow;

use crate::config::outbox::TopicRoute;
use crate::outbox::bad_event::BadEvent;
use crate::sink::SinkLimits;

/// The destination for one route-by value, or why the event cannot have one.
pub(crate) fn destination<'a>(
    route: &TopicRoute,
    limits: &SinkLimits,
    routed_by_value: &'a str,
) -> Result<Cow<'a, str>, BadEvent> {
    let name = route.route(routed_by_value);
    (limits.check_name)(&name).map_err(BadEvent::Topic)?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::outbox::DEFAULT_TOPIC_REGEX;
    use proptest::prelude::*;
    use std::sync::LazyLock;

    /// The default sink's rule (Kafka's), as its plugin's limits carry it; the rule's own test
    /// holds it against Kafka's (`topic_validation_is_kafkas_rule`).
    static LIMITS: LazyLock<SinkLimits> =
        LazyLock::new(|| crate::sink::limits(&crate::config::test_support::settings("")));

    fn topic<'a>(r: &TopicRoute, value: &'a str) -> Result<Cow<'a, str>, BadEvent> {
        destination(r, &LIMITS, value)
    }

    #[test]
    fn an_illegal_routed_name_is_a_bad_event_naming_the_topic() {
        let r = TopicRoute::new(DEFAULT_TOPIC_REGEX, "outbox.event.${routedByValue}").unwrap();
        assert_eq!(topic(&r, "Order").unwrap(), "outbox.event.Order");
        match topic(&r, "order placed") {
            Err(BadEvent::Topic(m)) => assert!(m.contains("\"outbox.event.order placed\" contains ' '"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #[test]
        fn debezium_prefix_replacement_prepends_and_validates(value in "[a-zA-Z0-9._ -]{0,250}") {
            let r = TopicRoute::new(DEFAULT_TOPIC_REGEX, "outbox.event.${routedByValue}").unwrap();
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), format!("outbox.event.{value}"));
            prop_assert_eq!(topic(&r, &value).is_ok(), (LIMITS.check_name)(&routed).is_ok());
        }
    }
}
