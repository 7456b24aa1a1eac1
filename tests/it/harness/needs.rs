//! "This test needs X": the one place a test finds out that something it needs is not there —
//! moto, the Pub/Sub emulator, a real Kafka, a PostgreSQL major, Debezium, the CloudEvents SDK,
//! standardwebhooks, network namespaces, failpoints, a local PostgreSQL cluster …
//!
//! Invariant: no test passes green without having run where it could not run. Locally
//! [`missing`] prints the loud SKIPPING line and the caller returns (a developer without moto
//! still runs the rest); under CI (the `CI` environment variable set, as `.ci/run` sets it) it
//! panics, naming what is missing and the script that provides it, so a CI run that lacks a
//! dependency fails instead of skipping. Every skip path of the harness and the suites goes
//! through here; a new one must too.

/// Something a test needs, and how to get it.
#[derive(Debug, Clone, Copy)]
pub struct Need {
    /// What it is, as the messages name it ("moto").
    pub what: &'static str,
    /// How to provide it ("run bash scripts/ensure-moto.sh").
    pub fix: &'static str,
}

pub const MOTO: Need = Need {
    what: "moto (moto_server in ~/.cache/outbox-relay/venv-moto)",
    fix: "run bash scripts/ensure-moto.sh",
};
pub const PUBSUB_EMULATOR: Need = Need {
    what: "Google's Pub/Sub emulator (/usr/lib/google-cloud-sdk/platform/pubsub-emulator)",
    fix: "run bash scripts/ensure-pubsub-emulator.sh",
};
pub const KAFKA: Need = Need {
    what: "Apache Kafka (a KRaft broker in ~/.cache/outbox-relay/kafka-<version> or $KAFKA_HOME)",
    fix: "run bash scripts/install-kafka.sh",
};
pub const POSTGRES_15: Need = Need {
    what: "PostgreSQL 15 (/usr/lib/postgresql/15/bin)",
    fix: "apt-get install postgresql-15 (.ci/run does)",
};
pub const POSTGRES_MAJORS: Need = Need {
    what: "the PostgreSQL majors 14, 16, 17 and 18 (~/.cache/outbox-relay/postgres-<version>)",
    fix: "run bash scripts/install-postgres-majors.sh",
};
pub const DEBEZIUM: Need = Need {
    what: "Debezium 3.6 (its jars in ~/.cache/outbox-relay/debezium-3.6.3, java and javac)",
    fix: "run bash scripts/install-debezium.sh",
};
pub const CLOUDEVENTS_SDK: Need = Need {
    what: "the Python CloudEvents SDK (~/.cache/outbox-relay/venv-cloudevents)",
    fix: "run bash scripts/install-cloudevents-sdk.sh (python3 with venv and pip, and PyPI)",
};
pub const STANDARD_WEBHOOKS: Need = Need {
    what: "the Python Standard Webhooks library (~/.cache/outbox-relay/venv-standardwebhooks)",
    fix: "run bash scripts/install-standardwebhooks.sh (python3 with venv and pip, and PyPI)",
};
pub const NETWORK_NAMESPACES: Need = Need {
    what: "network namespaces (root, `ip` from iproute2 and tc's blackhole qdisc)",
    fix: "run as root with iproute2 installed (apt-get install iproute2; .ci/run does)",
};
pub const FAILPOINTS: Need = Need {
    what: "the relay built with the `failpoints` feature",
    fix: "run cargo test --features failpoints (the README's test command)",
};
pub const LOCAL_POSTGRES: Need = Need {
    what: "a local PostgreSQL cluster of the test's own (OUTBOX_RELAY_TEST_PG_URL points the tests at an external \
           server, where none may be started, and which has no TLS/SCRAM test user)",
    fix: "unset OUTBOX_RELAY_TEST_PG_URL (the tests start their own clusters from /usr/lib/postgresql/15/bin)",
};
pub const RABBITMQ_SERVER: Need = Need {
    what: "rabbitmq-server (/usr/lib/rabbitmq/bin/rabbitmq-server, for a RabbitMQ node of the test's own)",
    fix: "run bash scripts/ensure-brokers.sh",
};
pub const SIGNALS_TO_POSTGRES: Need = Need {
    what: "the right to signal the PostgreSQL server's processes (the tests' own cluster, run by this user or root)",
    fix: "run the tests as root or as the user the clusters run as (unset OUTBOX_RELAY_TEST_PG_URL)",
};
pub const DOCKER_COMPOSE: Need = Need {
    what: "a compose implementation (`docker compose` or `docker-compose`) to validate docker-compose.yml",
    fix: "apt-get install docker-compose (.ci/run does)",
};

/// Whether this is a CI run: `CI` set to anything but empty, `0` or `false`.
pub fn under_ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

fn ci_value(value: Option<&str>) -> bool {
    value.is_some_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// `test` (empty: the test thread's name) cannot run here because `need` is missing
/// (`detail`: what exactly was not found).
/// Under CI this panics naming it and the fix; locally it prints the loud SKIPPING line and
/// returns, and the caller returns (or skips the part that needs it).
pub fn missing(need: Need, test: &str, detail: &str) {
    // The test thread is named after the test; a spawned task's is not.
    let thread = std::thread::current();
    let test = match (test, thread.name()) {
        ("", Some(name)) if name != "main" && !name.starts_with("tokio-") => name,
        ("", _) => "this test",
        (test, _) => test,
    };
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    };
    if under_ci() {
        panic!(
            "{test} needs {}{detail}: {}. A CI run (CI is set) runs every test; without CI set the test would skip",
            need.what, need.fix
        );
    }
    eprintln!(
        "\n!!!!! SKIPPING {test}: it needs {}{detail}; {} !!!!!\n",
        need.what, need.fix
    );
}

/// [`missing`] unless `present`; returns `present`, for `if !needs::check(…) { return; }`.
pub fn check(present: bool, need: Need, test: &str, detail: &str) -> bool {
    if !present {
        missing(need, test, detail);
    }
    present
}

#[test]
fn ci_is_set_as_ci_systems_set_it() {
    for (value, ci) in [
        (Some("true"), true),
        (Some("1"), true),
        (Some("yes"), true),
        (Some(""), false),
        (Some("0"), false),
        (Some("false"), false),
        (None, false),
    ] {
        assert_eq!(ci_value(value), ci, "{value:?}");
    }
}
