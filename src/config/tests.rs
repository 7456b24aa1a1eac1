//! Unit tests of the configuration: file + environment layering, every validation error naming
//! its key and the fix, and the defaults documented in docs/configuration.md.

use std::time::Duration;

use super::*;

fn load(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    Settings::from_toml_str(
        text,
        Path::new("test.toml"),
        env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
}

/// What [`load`] refuses `text` (with `env`) with: the error's text.
fn refusal(text: &str, env: &[(&str, &str)]) -> String {
    load(text, env).unwrap_err().to_string()
}

use super::test_support::MINIMAL;

#[test]
fn minimal_config_gets_documented_defaults() {
    let s = load(MINIMAL, &[]).unwrap();
    assert_eq!(s.postgres.slot.as_str(), "outbox_relay");
    assert_eq!(s.postgres.publication.as_str(), "outbox_relay");
    assert_eq!(s.outbox.tables.len(), 1);
    assert_eq!(s.outbox.tables[0].quoted(), r#""public"."events_outbox""#);
    assert_eq!(s.outbox.key.as_str(), "aggregate_id");
    assert_eq!(s.relay.max_in_flight, 10_000);
    assert_eq!(s.relay.status_interval, Duration::from_secs(1));
    assert_eq!(s.kafka().0["enable.idempotence"], "true");
    assert_eq!(s.kafka().0["acks"], "all");
    assert_eq!(s.router.route("order.placed"), "order.placed");
}

#[test]
fn unknown_keys_are_errors() {
    let err = refusal(&format!("{MINIMAL}\n[relay]\nmax_inflight = 5\n"), &[]);
    assert!(err.contains("unknown field `max_inflight`"), "{err}");
    let err = refusal(&format!("{MINIMAL}\n[extra]\na = 1\n"), &[]);
    assert!(err.contains("unknown field `extra`"), "{err}");
}

#[test]
fn env_overrides_apply_and_kafka_keys_get_dots() {
    let s = load(
        MINIMAL,
        &[
            ("OUTBOX_RELAY__POSTGRES__SLOT", "other_slot"),
            ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "42"),
            ("OUTBOX_RELAY__KAFKA__MESSAGE_TIMEOUT_MS", "5000"),
            ("OUTBOX_RELAY__OUTBOX__HEADER_COLUMNS", "{ created_at = \"x-created\" }"),
            ("UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(s.postgres.slot.as_str(), "other_slot");
    assert_eq!(s.relay.max_in_flight, 42);
    assert_eq!(s.kafka().0["message.timeout.ms"], "5000");
    assert_eq!(s.outbox.headers[0].1, "x-created");
}

#[test]
fn unknown_env_keys_are_errors_too() {
    for (var, named) in [
        ("OUTBOX_RELAY__RELAY__MAX_INFLIGHT", "max_inflight"),
        ("OUTBOX_RELAY__NOSECTIONKEY", "OUTBOX_RELAY__<SECTION>__<KEY>"),
    ] {
        let err = refusal(MINIMAL, &[(var, "1")]);
        assert!(err.contains(named), "{err}");
    }
}

#[test]
fn durability_properties_cannot_be_weakened() {
    let text = format!("{MINIMAL}\"acks\" = \"1\"\n");
    assert!(refusal(&text, &[]).contains("acks"));
    let text = format!("{MINIMAL}\"enable.idempotence\" = false\n");
    assert!(refusal(&text, &[]).contains("enable.idempotence"));
    let text = format!("{MINIMAL}\"acks\" = -1\n");
    assert!(load(&text, &[]).is_ok());
}

#[test]
fn names_are_validated() {
    for (var, value, key) in [
        ("OUTBOX_RELAY__POSTGRES__SLOT", "Bad-Slot", "postgres.slot"),
        ("OUTBOX_RELAY__OUTBOX__TABLE", "x; drop table y", "outbox.table"),
    ] {
        let err = refusal(MINIMAL, &[(var, value)]);
        assert!(err.contains(key), "{err}");
    }
    let quoted = load(MINIMAL, &[("OUTBOX_RELAY__OUTBOX__TABLE", "\"Sales\".\"OutBox\"")]).unwrap();
    assert_eq!(quoted.outbox.tables[0].name.as_str(), "OutBox");
}

#[test]
fn outbox_table_takes_a_string_or_a_list() {
    let one = load(&format!("{MINIMAL}[outbox]\ntable = \"sales.outbox\"\n"), &[]).unwrap();
    assert_eq!(one.outbox.tables.len(), 1);
    assert_eq!(one.outbox.tables[0].quoted(), r#""sales"."outbox""#);

    let two = load(
        &format!("{MINIMAL}[outbox]\ntable = [\"sales.outbox\", '\"Billing\".\"OutBox\"', \"outbox\"]\n"),
        &[],
    )
    .unwrap();
    let quoted: Vec<String> = two.outbox.tables.iter().map(|t| t.quoted()).collect();
    assert_eq!(
        quoted,
        [r#""sales"."outbox""#, r#""Billing"."OutBox""#, r#""public"."outbox""#],
        "in the configured order, the schema defaulting to public"
    );
    assert_eq!(
        two.outbox.table_of("Billing", "OutBox").map(|t| t.quoted()).as_deref(),
        Some(r#""Billing"."OutBox""#)
    );
    assert_eq!(
        two.outbox.table_of("billing", "outbox"),
        None,
        "catalog names compare exactly"
    );
    assert_eq!(two.outbox.table_of("public", "events_outbox"), None);

    let env = load(
        MINIMAL,
        &[("OUTBOX_RELAY__OUTBOX__TABLE", "[\"a.outbox\", \"b.outbox\"]")],
    )
    .unwrap();
    let names: Vec<&str> = env.outbox.tables.iter().map(|t| t.schema.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn outbox_table_lists_are_checked() {
    let empty = refusal(&format!("{MINIMAL}[outbox]\ntable = []\n"), &[]);
    assert!(
        empty.contains("outbox.table") && empty.contains("empty list"),
        "{empty}"
    );

    // `outbox` and `public.OUTBOX` fold to the same table.
    let twice = refusal(
        &format!("{MINIMAL}[outbox]\ntable = [\"public.outbox\", \"sales.outbox\", \"OUTBOX\"]\n"),
        &[],
    );
    assert!(
        twice.contains("outbox.table")
            && twice.contains(r#"lists "public"."outbox" twice"#)
            && twice.contains("\"OUTBOX\""),
        "{twice}"
    );

    let bad = refusal(
        &format!("{MINIMAL}[outbox]\ntable = [\"sales.outbox\", \"x; drop table y\"]\n"),
        &[],
    );
    assert!(bad.contains("outbox.table"), "{bad}");

    let number = refusal(&format!("{MINIMAL}[outbox]\ntable = 5\n"), &[]);
    assert!(number.contains("a table name") && number.contains("list"), "{number}");

    let bad_env = refusal(MINIMAL, &[("OUTBOX_RELAY__OUTBOX__TABLE", "[\"a.outbox\",")]);
    assert!(
        bad_env.contains("OUTBOX_RELAY__OUTBOX__TABLE") && bad_env.contains("TOML array"),
        "{bad_env}"
    );
}

#[test]
fn missing_bootstrap_servers_is_explained() {
    let err = refusal("[postgres]\nurl = \"postgres://u@h/db\"\n", &[]);
    assert!(err.contains("bootstrap.servers"), "{err}");
}

#[test]
fn debug_output_hides_secrets() {
    let text = format!("{MINIMAL}\"sasl.password\" = \"kafkasecret\"\n");
    let s = load(&text, &[]).unwrap();
    let dbg = format!("{s:?}");
    assert!(!dbg.contains("kafkasecret"), "{dbg}");
    assert!(!dbg.contains(":pw@"), "{dbg}");
}

#[test]
fn the_shipped_example_config_is_valid() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/outbox-relay.toml"));
    Settings::load_with_env(path, Vec::new()).unwrap();
}

#[test]
fn bad_event_policy_defaults_to_fail_and_dead_letter_needs_a_valid_topic() {
    use crate::config::relay::BadEventPolicy;
    assert_eq!(load(MINIMAL, &[]).unwrap().relay.on_bad_event, BadEventPolicy::Fail);
    let skip = load(MINIMAL, &[("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", "skip")]).unwrap();
    assert_eq!(skip.relay.on_bad_event, BadEventPolicy::Skip);
    let dl = load(
        &format!("{MINIMAL}\n[relay]\non_bad_event = \"dead-letter\"\ndead_letter_topic = \"outbox.dlq\"\n"),
        &[],
    )
    .unwrap();
    assert_eq!(
        dl.relay.on_bad_event,
        BadEventPolicy::DeadLetter {
            topic: "outbox.dlq".into()
        }
    );
    let missing = refusal(MINIMAL, &[("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", "dead-letter")]);
    assert!(
        missing.contains("relay.on_bad_event") && missing.contains("dead_letter_topic"),
        "{missing}"
    );
    let bad_topic = refusal(
        MINIMAL,
        &[
            ("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", "dead-letter"),
            ("OUTBOX_RELAY__RELAY__DEAD_LETTER_TOPIC", "dead letters"),
        ],
    );
    assert!(bad_topic.contains("contains ' '"), "{bad_topic}");
    let typo = refusal(MINIMAL, &[("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", "deadletter")]);
    assert!(typo.contains("\"deadletter\" is not a policy"), "{typo}");
}

#[test]
fn message_prefix_is_optional_but_never_empty() {
    assert_eq!(load(MINIMAL, &[]).unwrap().outbox.message_prefix, None);
    let set = load(MINIMAL, &[("OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX", "outbox")]).unwrap();
    assert_eq!(set.outbox.message_prefix.as_deref(), Some("outbox"));
    let empty = refusal(MINIMAL, &[("OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX", "")]);
    assert!(empty.contains("outbox.message_prefix"), "{empty}");
}

mod bad_event_props {
    use super::*;
    use crate::config::relay::BadEventPolicy;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_legal_topic_is_a_dead_letter_topic(topic in "[a-zA-Z0-9._-]{1,249}") {
            prop_assume!(topic != "." && topic != "..");
            let s = load(
                MINIMAL,
                &[("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", "dead-letter"), ("OUTBOX_RELAY__RELAY__DEAD_LETTER_TOPIC", &topic)],
            )
            .unwrap();
            prop_assert_eq!(s.relay.on_bad_event, BadEventPolicy::DeadLetter { topic });
        }

        #[test]
        fn only_the_three_policies_are_accepted(policy in "[a-z-]{0,12}") {
            let result = load(
                MINIMAL,
                &[("OUTBOX_RELAY__RELAY__ON_BAD_EVENT", &policy), ("OUTBOX_RELAY__RELAY__DEAD_LETTER_TOPIC", "dlq")],
            );
            let known = ["fail", "skip", "dead-letter"].contains(&policy.as_str());
            prop_assert_eq!(result.is_ok(), known, "{}: {:?}", policy, result.err().map(|e| e.to_string()));
        }
    }
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn numeric_settings_round_trip_through_env(n in 1u64..1_000_000) {
            let s = load(MINIMAL, &[("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", &n.to_string())]).unwrap();
            prop_assert_eq!(s.relay.max_in_flight as u64, n);
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = load(&text, &[]);
        }
    }
}

/// Whether `line` names a path of the crate outside `config` (a `crate` path not into `config`).
fn names_outside_config(line: &str) -> bool {
    let needle = concat!("crate", "::");
    line.match_indices(needle).any(|(i, m)| {
        let rest = &line[i + m.len()..];
        let into_config = rest
            .strip_prefix("config")
            .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
        !into_config
    })
}

/// config/ is the leaf layer: its files may name no other part of the crate (not even in docs,
/// which keeps this check a plain text search).
#[test]
fn config_imports_nothing_from_the_rest_of_the_crate() {
    let c = concat!("crate", "::");
    assert!(names_outside_config(&format!("use {c}outbox::routing::TopicRouter;")));
    assert!(names_outside_config(&format!("use {c}config::X; use {c}relay::Y;")));
    assert!(names_outside_config(&format!("{c}configuration")));
    assert!(!names_outside_config(&format!(
        "use {c}config::ident::Ident; {c}config;"
    )));

    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/config"));
    let mut checked = 0;
    let mut offending = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        checked += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if names_outside_config(line) {
                offending.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(checked >= 9, "found only {checked} files under {}", dir.display());
    assert!(
        offending.is_empty(),
        "config must not depend on other modules:\n{}",
        offending.join("\n")
    );
}

#[test]
fn route_templates_read_their_columns_and_exclude_the_regex_rule() {
    let s =
        super::test_support::settings("[route]\ntopic = \"${tenant}.${type}\"\nkey = \"${tenant}/${aggregate_id}\"\n");
    let routing_columns: Vec<(&str, &str)> = s.outbox.routing_columns.iter().map(|(c, k)| (c.as_str(), *k)).collect();
    assert_eq!(
        routing_columns,
        [
            ("tenant", "route.topic"),
            ("type", "route.topic"),
            ("aggregate_id", "route.key")
        ]
    );
    // Every routing_columns column is a mapped column preflight checks against the table.
    let keys: Vec<&str> = s.outbox.columns().iter().map(|(k, _)| *k).collect();
    assert!(keys.ends_with(&["route.topic", "route.topic", "route.key"]), "{keys:?}");

    let err = super::test_support::refusal(
        "[route]\ntopic = \"${tenant}\"\ntopic_regex = \"(?<routedByValue>[^.]+)\\\\..*\"\n",
        &[],
    );
    assert!(err.contains("route.topic") && err.contains("topic_regex"), "{err}");
    let err = super::test_support::refusal("[route]\nkey = \"${tenant}\"\n[debezium]\n", &[]);
    assert!(err.contains("route.key") && err.contains("[debezium]"), "{err}");
    // Without templates the Debezium rule is what it was.
    let s = super::test_support::settings("[route]\ntopic_replacement = \"outbox.event.${routedByValue}\"\n");
    assert!(s.outbox.routing_columns.is_empty() && s.router.topic.is_none());
    assert_eq!(s.router.route("Order"), "outbox.event.Order");
}

#[test]
fn the_exactly_once_keys_that_moved_to_kafka_are_refused_naming_their_new_place() {
    for (key, value) in [
        ("exactly_once", "\"kafka-transactions\""),
        ("checkpoint_topic", "\"cp\""),
    ] {
        let err = refusal(&format!("{MINIMAL}[relay]\n{key} = {value}\n"), &[]);
        assert!(
            err.contains(&format!("relay.{key}"))
                && err.contains("moved to the Kafka section")
                && err.contains("[kafka]"),
            "{err}"
        );
    }
}

/// A bad value from an `OUTBOX_RELAY__*` variable is that variable's error, named, never the
/// file's; the file is blamed for its own mistakes only.
#[test]
fn a_bad_environment_override_names_the_variable_not_the_file() {
    for (var, value, says) in [
        (
            "OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT",
            "lots",
            "non-negative whole number",
        ),
        ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "0", "relay.max_in_flight"),
        ("OUTBOX_RELAY__RELAY__MAX_INFLIGHT", "5", "unknown field `max_inflight`"),
        ("OUTBOX_RELAY__NOSUCH__KEY", "5", "no [nosuch] section"),
        ("OUTBOX_RELAY__POSTGRES__SLOT", "Not A Slot", "postgres.slot"),
        ("OUTBOX_RELAY__RETENTION__KEEP", "7d", "retention"),
    ] {
        let err = refusal(MINIMAL, &[(var, value)]);
        assert!(
            err.starts_with(&format!("environment variable {var} is not usable")) && err.contains(says),
            "{var}={value}: {err}"
        );
        assert!(!err.contains("config file"), "{var}={value}: {err}");
    }
    // The same mistake in the file is the file's, even with (good) overrides beside it.
    let err = refusal(
        &format!("{MINIMAL}[relay]\nmax_in_flight = \"lots\"\n"),
        &[("OUTBOX_RELAY__POSTGRES__SLOT", "other")],
    );
    assert!(
        err.starts_with("config file test.toml is not valid") && err.contains("relay.max_in_flight"),
        "{err}"
    );
    // A good override of a bad file value mends it.
    load(
        &format!("{MINIMAL}[relay]\nmax_in_flight = \"lots\"\n"),
        &[("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "7")],
    )
    .unwrap();
}
