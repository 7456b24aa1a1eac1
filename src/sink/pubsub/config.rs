//! `[pubsub]`: the Google Cloud Pub/Sub sink (`[sink] kind = "pubsub"`, docs/sink-pubsub.md) —
//! the project whose topics the routed names are, the topics `setup` creates, and how long the
//! client retries a publish before the relay replays.
//!
//! ```toml
//! [pubsub]
//! project = "my-project"              # required: topics are projects/<project>/topics/<routed name>
//! topics = ["orders", "payments"]     # optional: what `outbox-relay setup` creates
//! max_concurrency = 256               # ordering keys with a publish in flight at once
//! retry_timeout_ms = 60000            # the client's retries of one publish, then a replay
//! ```
//!
//! Credentials and endpoint are Google's conventions, not keys: Application Default
//! Credentials, and `PUBSUB_EMULATOR_HOST` (host:port) for the emulator. Invariant: nothing
//! here is a secret (ADC lives outside the file).

use serde::Deserialize;

use crate::config::sink::SinkSection;
use crate::config::{optional_number, ConfigError};
use crate::sink::plugin::{Absent, SectionSpec};
use crate::sink::requests::{Count, Millis, RequestKeys, Requests};

/// Ordering keys with a publish in flight at once unless `max_concurrency` says otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENCY: u64 = 256;
/// How long the client retries one publish (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
/// connection failures) before the record fails and the relay replays, unless
/// `retry_timeout_ms` says otherwise.
pub(crate) const DEFAULT_RETRY_TIMEOUT_MS: u64 = 60_000;
/// The environment variable Google's clients read for the emulator's `host:port`.
pub(crate) const EMULATOR_HOST_VAR: &str = "PUBSUB_EMULATOR_HOST";

/// Why `relay.delivery = "exactly-once"` is refused with this sink (the config error's words).
pub(crate) const NO_EXACTLY_ONCE: &str = "Pub/Sub's Publish has no deduplication: a publish whose answer was lost is \
     sent again and stored twice (exactly-once delivery is a subscription setting, for redeliveries to one \
     subscriber, not for duplicate publishes). Use relay.delivery = \"at-least-once\" and deduplicate on the `id` \
     attribute, the event id (docs/sink-pubsub.md)";

/// The raw `[pubsub]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PubSubSection {
    project: Option<String>,
    #[serde(default)]
    topics: Option<Vec<String>>,
    #[serde(default, deserialize_with = "optional_number")]
    max_concurrency: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    retry_timeout_ms: Option<u64>,
}

/// `[pubsub]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubSettings {
    pub(crate) project: String,
    /// The topic ids `setup` creates (empty: it creates none and says so).
    pub(crate) topics: Vec<String>,
    /// `max_concurrency` (ordering keys with a publish in flight) and `retry_timeout_ms` (the
    /// client's retries of one publish).
    pub(crate) requests: Requests,
}

/// `max_concurrency` and `retry_timeout_ms`, checked as every request sink's.
const REQUESTS: RequestKeys = RequestKeys {
    concurrency: Some(Count {
        key: "pubsub.max_concurrency",
        default: DEFAULT_MAX_CONCURRENCY,
        most: None,
    }),
    requests: None,
    timeout: Millis {
        key: "pubsub.retry_timeout_ms",
        default: DEFAULT_RETRY_TIMEOUT_MS,
        least: 1,
    },
};

impl PubSubSettings {
    /// The full resource name of topic `id`.
    pub(crate) fn topic_name(&self, id: &str) -> String {
        format!("projects/{}/topics/{id}", self.project)
    }
}

/// A topic id as Pub/Sub accepts it: 3 to 255 characters, a letter first, then letters, digits
/// and `-_.~+%`, and not starting with `goog`.
pub(crate) fn check_topic_id(id: &str) -> Result<(), String> {
    let fix = "a Pub/Sub topic id is 3 to 255 characters: a letter, then letters, digits, or - _ . ~ + %";
    if !(3..=255).contains(&id.len()) {
        return Err(format!("topic id {id:?} is {} characters long; {fix}", id.len()));
    }
    if !id.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!("topic id {id:?} does not start with a letter; {fix}"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.~+%".contains(*c)))
    {
        return Err(format!("topic id {id:?} contains {c:?}; {fix}"));
    }
    if id.to_ascii_lowercase().starts_with("goog") {
        return Err(format!("topic id {id:?} starts with \"goog\", which Pub/Sub reserves"));
    }
    Ok(())
}

impl PubSubSection {
    pub(crate) fn validate(self) -> Result<PubSubSettings, ConfigError> {
        let project = self.project.unwrap_or_default().trim().to_owned();
        if project.is_empty() {
            return Err(ConfigError::invalid(
                "pubsub.project",
                "missing: set the Google Cloud project whose topics the routed names are, e.g. project = \
                 \"my-project\"",
            ));
        }
        // Project ids are lower-case letters, digits and hyphens; a domain-scoped one has
        // `example.com:` before it. Anything else would change the resource name's shape.
        if project.contains(['/', ' ']) || !project.chars().all(|c| c.is_ascii_graphic()) {
            return Err(ConfigError::invalid(
                "pubsub.project",
                format!("{project:?} is not a project id (the id, not the name or number: e.g. \"my-project\")"),
            ));
        }
        let topics = self.topics.unwrap_or_default();
        for t in &topics {
            check_topic_id(t).map_err(|e| ConfigError::invalid("pubsub.topics", e))?;
        }
        Ok(PubSubSettings {
            project,
            topics,
            requests: REQUESTS.validate(self.max_concurrency, None, self.retry_timeout_ms)?,
        })
    }
}

/// The sink's name for people, in errors and logs (the section's `name`).
pub(crate) const SINK: &str = "Google Cloud Pub/Sub";

/// The config half of the Pub/Sub sink, `[pubsub]` (required).
pub(crate) const SECTION: SectionSpec<PubSubSection, PubSubSettings> = SectionSpec {
    kind: "pubsub",
    name: SINK,
    absent: Absent::Refused(
        "[sink] kind = \"pubsub\" needs a [pubsub] section: add `[pubsub]` with project = \"my-project\" \
         (docs/sink-pubsub.md)",
    ),
    validate: PubSubSection::validate,
    binary_refused: None,
};

impl SinkSection for PubSubSettings {
    /// Where the relay publishes when `PUBSUB_EMULATOR_HOST` is set: said once at start, so a
    /// variable left over from a test shell is not missed in production.
    fn start_warnings(&self) -> Vec<String> {
        match std::env::var(EMULATOR_HOST_VAR) {
            Ok(host) if !host.trim().is_empty() => vec![format!(
                "{EMULATOR_HOST_VAR}={host}: publishing to the Pub/Sub emulator there, without credentials, not to \
                 Google Cloud; unset it for production"
            )],
            _ => Vec::new(),
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        match key {
            "project" => Some(self.project.clone()),
            "topics" => Some(self.topics.join(",")),
            "max_concurrency" => Some(self.requests.max_concurrency.to_string()),
            "retry_timeout_ms" => Some(self.requests.timeout.as_millis().to_string()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(extra: &str) -> Result<crate::config::Settings, String> {
        crate::config::Settings::from_toml_str(
            &format!("[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n{extra}"),
            std::path::Path::new("test.toml"),
            std::iter::empty(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_goes_with_the_kind_and_refuses_exactly_once() {
        let settings = load("[sink]\nkind = \"pubsub\"\n[pubsub]\nproject = \"my-project\"\n").unwrap();
        assert_eq!(settings.sink.label(), "pubsub");
        let s = settings.sink.section::<PubSubSettings>().expect("the pubsub section");
        assert_eq!(s.project, "my-project");
        assert_eq!(s.topic_name("orders"), "projects/my-project/topics/orders");
        assert_eq!(s.requests.max_concurrency, DEFAULT_MAX_CONCURRENCY as usize);
        assert_eq!(s.requests.timeout.as_millis() as u64, DEFAULT_RETRY_TIMEOUT_MS);
        let missing = load("[sink]\nkind = \"pubsub\"\n").unwrap_err();
        assert!(
            missing.contains("[pubsub] section") && missing.contains("project"),
            "{missing}"
        );
        let no_project = load("[sink]\nkind = \"pubsub\"\n[pubsub]\ntopics = [\"orders\"]\n").unwrap_err();
        assert!(
            no_project.contains("pubsub.project") && no_project.contains("missing"),
            "{no_project}"
        );
        // Loads, and `run` and `setup` refuse it at start with the reason.
        let once = load("[sink]\nkind = \"pubsub\"\n[pubsub]\nproject = \"p\"\n[relay]\ndelivery = \"exactly-once\"\n")
            .map(|s| crate::sink::refusal::refusal(&s).unwrap_err().to_string())
            .unwrap();
        assert!(
            once.contains("relay.delivery") && once.contains("no deduplication") && once.contains("`id` attribute"),
            "{once}"
        );
        let unknown = load("[sink]\nkind = \"pubsub\"\n[pubsub]\nproject = \"p\"\nendpoint = \"x\"\n").unwrap_err();
        assert!(unknown.contains("unknown field `endpoint`"), "{unknown}");
        let other = load("[pubsub]\nproject = \"p\"\n").unwrap_err();
        assert!(
            other.contains("a [pubsub] section is set but [sink] kind = \"kafka\""),
            "{other}"
        );
    }

    #[test]
    fn environment_overrides_reach_the_section() {
        let settings = crate::config::Settings::from_toml_str(
            "[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n[sink]\nkind = \"pubsub\"\n",
            std::path::Path::new("test.toml"),
            [
                ("OUTBOX_RELAY__PUBSUB__PROJECT".to_owned(), "from-env".to_owned()),
                ("OUTBOX_RELAY__PUBSUB__MAX_CONCURRENCY".to_owned(), "8".to_owned()),
            ],
        )
        .unwrap();
        let s = settings.sink.section::<PubSubSettings>().unwrap();
        assert_eq!((s.project.as_str(), s.requests.max_concurrency), ("from-env", 8));
    }

    #[test]
    fn topic_ids_and_numbers_are_checked() {
        for ok in [
            "orders",
            "order.created",
            "a-b_c~d+e%f",
            &format!("t{}", "x".repeat(254)),
        ] {
            check_topic_id(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, says) in [
            ("ab", "2 characters"),
            ("1orders", "start with a letter"),
            ("orders/x", "'/'"),
            ("google-orders", "reserves"),
            (&"t".repeat(256), "256 characters"),
        ] {
            let err = check_topic_id(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let section = |t: &str| -> Result<PubSubSettings, String> {
            let s: PubSubSection = toml::from_str(t).map_err(|e| e.to_string())?;
            s.validate().map_err(|e| e.to_string())
        };
        let err = section("project = \"p\"\ntopics = [\"ok-topic\", \"x\"]").unwrap_err();
        assert!(err.contains("pubsub.topics"), "{err}");
        let err = section("project = \"p\"\nmax_concurrency = 0").unwrap_err();
        assert!(
            err.contains("pubsub.max_concurrency") && err.contains("leave it out"),
            "{err}"
        );
        let err = section("project = \"projects/p\"").unwrap_err();
        assert!(err.contains("not a project id"), "{err}");
        let s = section("project = \"p\"\nretry_timeout_ms = \"1500\"\ntopics = [\"orders\"]").unwrap();
        assert_eq!((s.requests.timeout.as_millis(), s.topics.len()), (1500, 1));
    }
}
