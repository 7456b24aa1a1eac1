//! Topic routing with the semantics of Debezium's Outbox EventRouter.
//!
//! Debezium takes the route-by column's value (`routedByValue`) and feeds it through Kafka
//! Connect's `RegexRouter`: if `route.topic.regex` matches the *whole* value, the topic is the
//! value with that match replaced by `route.topic.replacement` (named groups are available as
//! `${name}`); if it does not match, the value itself is the topic. We reproduce exactly that:
//! the regex is anchored at both ends to emulate Java's `Matcher.matches()`, and the Java-style
//! named group `(?<name>…)` is accepted (the `regex` crate understands it).
//!
//! Differences from Java regexes worth knowing: no look-around or back-references, and a literal
//! `$` in the replacement is written `$$`.
//!
//! The resulting topic must be a legal Kafka topic name (1–249 characters of `[a-zA-Z0-9._-]`, not
//! `.` or `..`); an illegal one is a bad event, reported with the event's id and LSN by the caller.

use std::borrow::Cow;

use regex::Regex;

pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
pub const DEFAULT_TOPIC_REPLACEMENT: &str = "${routedByValue}";

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

#[derive(Debug, Clone)]
pub struct TopicRouter {
    anchored: Regex,
    replacement: String,
    /// The default rule, under which every value is its own topic (whether `.*` matches it or,
    /// for a value with a line break, does not): routing skips the regex, which otherwise costs
    /// about as much as decoding the row.
    identity: bool,
}

impl TopicRouter {
    /// Compiles the route regex; the error is a sentence for the config file's author.
    pub fn new(topic_regex: &str, replacement: &str) -> Result<Self, String> {
        let anchored = Regex::new(&format!("^(?:{topic_regex})$")).map_err(|e| {
            format!("{topic_regex:?} is not a valid regular expression ({e}); the default is {DEFAULT_TOPIC_REGEX:?}")
        })?;
        for name in referenced_groups(replacement) {
            let known = name.parse::<usize>().map_or_else(
                |_| anchored.capture_names().flatten().any(|n| n == name),
                |idx| idx < anchored.captures_len(),
            );
            if !known {
                return Err(format!(
                    "route.topic_replacement {replacement:?} refers to group {name:?}, which route.topic_regex {topic_regex:?} does not define"
                ));
            }
        }
        Ok(TopicRouter {
            anchored,
            replacement: replacement.to_owned(),
            identity: topic_regex == DEFAULT_TOPIC_REGEX && replacement == DEFAULT_TOPIC_REPLACEMENT,
        })
    }

    /// The topic for one route-by value.
    pub fn route<'a>(&self, routed_by_value: &'a str) -> Cow<'a, str> {
        if self.identity {
            return Cow::Borrowed(routed_by_value);
        }
        match self.anchored.captures(routed_by_value) {
            Some(caps) => {
                let mut topic = String::with_capacity(routed_by_value.len() + 16);
                caps.expand(&self.replacement, &mut topic);
                Cow::Owned(topic)
            }
            None => Cow::Borrowed(routed_by_value),
        }
    }
}

/// Checks Kafka's topic-name rules; the error says what is wrong with the name.
pub fn validate_topic_name(topic: &str) -> Result<(), String> {
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

/// Group names or numbers a replacement string refers to (`$name`, `${name}`, `$1`).
fn referenced_groups(replacement: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = replacement.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            i += 1;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'$') {
            i += 2;
            continue;
        }
        if bytes.get(i + 1) == Some(&b'{') {
            if let Some(end) = replacement[i + 2..].find('}') {
                out.push(&replacement[i + 2..i + 2 + end]);
                i += 3 + end;
                continue;
            }
        }
        let start = i + 1;
        let len = replacement[start..]
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        if len > 0 {
            out.push(&replacement[start..start + len]);
        }
        i = start + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_routes_to_the_type_itself() {
        let r = TopicRouter::new(DEFAULT_TOPIC_REGEX, DEFAULT_TOPIC_REPLACEMENT).unwrap();
        assert_eq!(r.route("order.placed"), "order.placed");
        assert_eq!(r.route(""), "");
    }

    #[test]
    fn prefix_before_first_dot() {
        let r = TopicRouter::new(r"^(?<routedByValue>[^.]+)\..*$", "${routedByValue}").unwrap();
        assert_eq!(r.route("order.placed"), "order");
        // No match: Debezium keeps the route value as the topic.
        assert_eq!(r.route("orderplaced"), "orderplaced");
    }

    #[test]
    fn debezium_default_replacement_prefix() {
        let r = TopicRouter::new(DEFAULT_TOPIC_REGEX, "outbox.event.${routedByValue}").unwrap();
        assert_eq!(r.route("Order"), "outbox.event.Order");
    }

    #[test]
    fn python_style_groups_and_numbers_work() {
        let r = TopicRouter::new(r"(?P<agg>\w+)\.(\w+)", "events-$agg-${2}").unwrap();
        assert_eq!(r.route("order.paid"), "events-order-paid");
    }

    #[test]
    fn match_must_cover_the_whole_value() {
        // Java's matches() semantics: a partial match does not count.
        let r = TopicRouter::new("order", "orders").unwrap();
        assert_eq!(r.route("order.placed"), "order.placed");
        assert_eq!(r.route("order"), "orders");
    }

    #[test]
    fn bad_regex_and_unknown_groups_are_config_errors() {
        assert!(TopicRouter::new("(unclosed", "x")
            .unwrap_err()
            .contains("not a valid regular expression"));
        assert!(TopicRouter::new("(?<a>.*)", "${b}").unwrap_err().contains("\"b\""));
        assert!(TopicRouter::new("(?<a>.*)", "$$literal-${a}").is_ok());
    }

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

    /// Kafka's rule, written independently of `validate_topic_name`.
    fn legal_topic(t: &str) -> bool {
        (1..=MAX_TOPIC_LEN).contains(&t.len())
            && t != "."
            && t != ".."
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    }

    proptest! {
        #[test]
        fn topic_validation_is_kafkas_rule(name in prop_oneof![".{0,20}", "[a-zA-Z0-9._-]{0,260}", "[.]{1,3}"]) {
            prop_assert_eq!(validate_topic_name(&name).is_ok(), legal_topic(&name), "{:?}", name);
        }

        #[test]
        fn debezium_prefix_replacement_prepends_and_validates(value in "[a-zA-Z0-9._ -]{0,250}") {
            let r = TopicRouter::new(DEFAULT_TOPIC_REGEX, "outbox.event.${routedByValue}").unwrap();
            let topic = r.route(&value);
            prop_assert_eq!(topic.as_ref(), format!("outbox.event.{value}"));
            prop_assert_eq!(validate_topic_name(&topic).is_ok(), legal_topic(&topic));
        }

        #[test]
        fn unmatched_values_route_to_themselves(value in "[a-z]{1,20}") {
            // The regex needs a dot; a value without one does not match and stays the topic.
            let r = TopicRouter::new(r"(?<routedByValue>[^.]+)\..+", "${routedByValue}").unwrap();
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }
    }

    proptest! {
        #[test]
        fn default_router_is_identity(value in ".*") {
            let r = TopicRouter::new(DEFAULT_TOPIC_REGEX, DEFAULT_TOPIC_REPLACEMENT).unwrap();
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }

        #[test]
        fn the_default_rule_through_the_regex_is_identity_too(value in "(?s).{0,40}") {
            // Spelled differently, so the regex runs: it must agree with the shortcut, line
            // breaks (where `.*` does not match, and the value is kept as is) included.
            let via_regex = TopicRouter::new(DEFAULT_TOPIC_REGEX, "$routedByValue").unwrap();
            prop_assert!(!via_regex.identity);
            let routed = via_regex.route(&value);
            prop_assert_eq!(routed.as_ref(), value.as_str());
        }

        #[test]
        fn prefix_router_takes_text_before_first_dot(head in "[a-z]{1,10}", tail in "[a-z.]{0,10}") {
            let r = TopicRouter::new(r"^(?<routedByValue>[^.]+)\..*$", "${routedByValue}").unwrap();
            let value = format!("{head}.{tail}");
            let routed = r.route(&value);
            prop_assert_eq!(routed.as_ref(), head.as_str());
        }

        #[test]
        fn routing_never_panics(regex_src in "[a-z().*?<>]{0,12}", repl in "[a-z${}]{0,12}", value in ".{0,20}") {
            if let Ok(r) = TopicRouter::new(&regex_src, &repl) {
                let _ = r.route(&value);
            }
        }
    }
}
