//! `[sink]`: which broker the relay publishes to, and the generic half of every sink's own
//! section (named as its `[sink] kind`).
//!
//! The root configuration knows no sink by name. Each sink declares its section in its own
//! folder, `src/sink/<name>/config.rs`, as a [`SinkSectionSpec`] — the `[sink] kind` word (also the section's
//! name), its name for people, how its section is validated into a typed [`SinkSection`] — and
//! is listed once, by its plugin, in the sink layer's registry (`src/sink/registry.rs`), which
//! hands the specs to the loader ([`SinkSpecs`]): this module is the leaf the configuration
//! needs at load time, and cannot name the adapters.
//!
//! Invariant: exactly one sink section is validated — the chosen kind's (required, even if
//! empty, when the spec says so); any other sink's section is refused naming both kinds, so a
//! section left over from an earlier setup never goes unnoticed.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::cloudevents::CloudEventsMode;
use crate::config::relay::RelaySettings;
use crate::config::ConfigError;

/// The sections of the sinks this build has, in registration order: the sink registry's
/// (`src/sink/registry.rs`, each plugin's [`SinkSectionSpec`]), handed to the loader by its
/// caller — this module is the leaf the configuration needs at load time and cannot name the
/// sinks, so the registry is the one place a sink is listed. The first is the kind used when
/// `[sink]` names none.
pub(crate) type SinkSpecs = &'static [&'static dyn SinkSectionSpec];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SinkTable {
    /// The `kind` of one of the registered sinks ([`SinkSpecs`]); `None`: the first registered.
    pub(crate) kind: Option<String>,
}

/// What validating a sink's section may look at besides the section itself — never the
/// delivery mode: a sink says what it can do, and the relay decides (`relay/guarantee/`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SectionContext<'a> {
    /// `relay.dead_letter_topic` when bad events go there, for a sink that checks the name on
    /// load.
    pub(crate) dead_letter_topic: Option<&'a str>,
    /// `relay.status_interval_ms`: what a sink's client timeouts must leave room for.
    pub(crate) status_interval: Duration,
    /// `relay.max_in_flight`: what a sink's own queue should hold.
    pub(crate) max_in_flight: usize,
}

impl<'a> SectionContext<'a> {
    /// The context `[relay]` gives a sink's section.
    pub(crate) fn of(relay: &'a RelaySettings) -> SectionContext<'a> {
        SectionContext {
            dead_letter_topic: match &relay.on_bad_event {
                crate::config::relay::BadEventPolicy::DeadLetter { topic } => Some(topic),
                _ => None,
            },
            status_interval: relay.status_interval,
            max_in_flight: relay.max_in_flight,
        }
    }
}

/// The config half of a sink: its `[sink] kind`, its section, and what the generic
/// configuration asks of it. Implemented by a unit struct in `src/sink/<name>/config.rs`.
pub(crate) trait SinkSectionSpec: Sync {
    /// The `[sink] kind` word, which is also the section's name: `"nats"` → `[nats]`.
    fn kind(&self) -> &'static str;

    /// The broker's name for people, in messages: "NATS JetStream".
    fn name(&self) -> &'static str;

    /// Validates the section (`None`: the file has none) into its typed settings. The error
    /// names the key and the fix, as every config error does. A section that is required and
    /// missing is this function's error to word (it knows what a minimal section looks like).
    fn validate(
        &self,
        section: Option<toml::Value>,
        cx: &SectionContext<'_>,
    ) -> Result<Arc<dyn SinkSection>, ConfigError>;

    /// How an environment override's key is written in the section: the upper-cased
    /// `OUTBOX_RELAY__<SECTION>__<KEY>` part, lower-cased by default; a section of dotted
    /// property names (`bootstrap.servers`) maps `_` to `.`.
    fn env_key(&self, key: &str) -> String {
        key.to_ascii_lowercase()
    }

    /// Whether the sink writes CloudEvents in this content mode; `Err` says why not and what
    /// to set instead (the protocol binding of the broker defines only the other mode).
    fn cloudevents_mode(&self, mode: CloudEventsMode) -> Result<(), String> {
        let _ = mode;
        Ok(())
    }
}

/// A validated section as [`Any`], for the downcast to its own type: every `'static` type is one.
pub(crate) trait AsAny {
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A sink's section, validated: what the generic configuration reads of it. The adapter
/// downcasts it to its own type ([`SinkSettings::section`]).
pub(crate) trait SinkSection: AsAny + std::fmt::Debug + Send + Sync + 'static {
    /// Warnings about this section for the operator, logged when `run` starts.
    fn start_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// A setting of the section by its name as written in the file, as text (`None`: not
    /// set, or a secret). For reports and deployment checks.
    fn get(&self, key: &str) -> Option<String> {
        let _ = key;
        None
    }
}

/// `[sink]` and the chosen sink's section, validated.
#[derive(Clone)]
pub struct SinkSettings {
    spec: &'static dyn SinkSectionSpec,
    section: Arc<dyn SinkSection>,
}

impl std::fmt::Debug for SinkSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkSettings")
            .field("kind", &self.spec.kind())
            .field("section", &self.section)
            .finish()
    }
}

impl SinkSettings {
    /// The config word for the chosen sink (`[sink] kind`), which is also its section's name.
    pub(crate) fn label(&self) -> &'static str {
        self.spec.kind()
    }

    /// The broker's name for people, in log lines.
    pub(crate) fn broker_name(&self) -> &'static str {
        self.spec.name()
    }

    /// The chosen sink's validated section, as the generic configuration sees it.
    pub(crate) fn section_dyn(&self) -> &dyn SinkSection {
        &*self.section
    }

    /// The chosen sink's validated section as its own type (`None`: another sink is chosen).
    pub(crate) fn section<T: 'static>(&self) -> Option<&T> {
        // Through the section itself, not the `Arc` (which is `Any` too).
        (*self.section).as_any().downcast_ref::<T>()
    }

    /// A setting of the chosen sink's section by its name in the file (see [`SinkSection::get`]).
    pub fn get(&self, key: &str) -> Option<String> {
        self.section.get(key)
    }
}

/// The registered spec of `kind`, or the error naming the kinds there are.
pub(crate) fn spec_of(kind: &str, specs: SinkSpecs) -> Result<&'static dyn SinkSectionSpec, ConfigError> {
    let kind = kind.trim();
    specs
        .iter()
        .copied()
        .find(|s| s.kind() == kind)
        .ok_or_else(|| ConfigError::Invalid {
            key: "sink.kind",
            message: format!(
                "{kind:?} is not a sink this relay has; use one of {}",
                kinds_quoted(specs)
            ),
        })
}

/// Every registered kind, quoted and comma-separated, for messages.
pub(crate) fn kinds_quoted(specs: SinkSpecs) -> String {
    specs
        .iter()
        .map(|s| format!("\"{}\"", s.kind()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `name` is a sink's section (`[nats]`, …), registered or not chosen.
pub(crate) fn is_sink_section(name: &str, specs: SinkSpecs) -> bool {
    specs.iter().any(|s| s.kind() == name)
}

impl SinkTable {
    /// The registered spec of `[sink] kind` (the first registered one when it names none).
    pub(crate) fn spec(&self, specs: SinkSpecs) -> Result<&'static dyn SinkSectionSpec, ConfigError> {
        match &self.kind {
            Some(kind) => spec_of(kind, specs),
            None => specs.first().copied().ok_or_else(|| ConfigError::Invalid {
                key: "sink.kind",
                message: "this build has no sink registered".into(),
            }),
        }
    }

    /// Validates `[sink]` and the sink sections found in the file (`sections`: by name), given
    /// the validated `[relay]`.
    pub(crate) fn validate(
        self,
        mut sections: std::collections::BTreeMap<String, toml::Value>,
        cx: &SectionContext<'_>,
        specs: SinkSpecs,
    ) -> Result<SinkSettings, ConfigError> {
        let spec = self.spec(specs)?;
        let own = sections.remove(spec.kind());
        if let Some(other) = sections.keys().next() {
            let key = specs.iter().map(|s| s.kind()).find(|k| k == other).unwrap_or("sink");
            return Err(ConfigError::Invalid {
                key,
                message: format!(
                    "a [{other}] section is set but [sink] kind = \"{}\": remove the section, or set kind = \"{other}\"",
                    spec.kind()
                ),
            });
        }
        let section = spec.validate(own, cx)?;
        Ok(SinkSettings { spec, section })
    }
}

/// The section `raw` as the spec's own serde type, with the parse error worded as today's
/// (`unknown field`, …) and keyed by the section.
pub(crate) fn parse_section<T: serde::de::DeserializeOwned>(
    kind: &'static str,
    raw: toml::Value,
) -> Result<T, ConfigError> {
    raw.try_into().map_err(|e: toml::de::Error| ConfigError::Invalid {
        key: kind,
        message: e.to_string(),
    })
}
