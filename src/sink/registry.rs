//! The sinks this relay has: one line per sink in [`sinks!`]'s list, the only place a sink is
//! registered. Generic code reaches a sink only through [`visit`] (the chosen one) or [`each`]
//! (all of them); the configuration reaches the sinks' sections through [`sections`], which
//! the loader's entry points below hand to the config leaf (`Settings::load`,
//! `Settings::load_with_env`, `Settings::from_toml_str`: they live here, above both layers,
//! because `config` cannot name the sinks).
//!
//! Adding a sink: its folder `src/sink/<name>/` with a [`SinkPlugin`] (whose `SPEC` is its
//! section in `src/sink/<name>/config.rs`) and one line here (docs/architecture.md, "Adding a sink").

use std::path::Path;

use crate::config::sink::{SinkSettings, SinkSpecs};
use crate::config::{ConfigError, Settings};
use crate::sink::plugin::SinkPlugin;

/// Something done with the chosen sink's plugin and its section.
pub(crate) trait Visit<'a> {
    type Output;
    fn visit<P: SinkPlugin>(self, plugin: &'static P, config: &'a P::Config) -> Self::Output;
}

/// Something done with every registered plugin.
pub(crate) trait Each {
    fn each<P: SinkPlugin>(&mut self, plugin: &'static P);
}

macro_rules! sinks {
    ($($plugin:path),+ $(,)?) => {
        /// Runs `visitor` with the chosen sink's plugin and section (`None`: the section's kind
        /// has no plugin — impossible once the test below passes).
        pub(crate) fn visit<'a, V: Visit<'a>>(sink: &'a SinkSettings, visitor: V) -> Option<V::Output> {
            $(
                if let Some(config) = sink.section::<<$plugin as SinkPlugin>::Config>() {
                    return Some(visitor.visit(&$plugin, config));
                }
            )+
            None
        }

        /// Runs `each` with every registered plugin, in registration order.
        pub(crate) fn each<E: Each>(each: &mut E) {
            $( each.each(&$plugin); )+
        }

        /// The config halves of the registered plugins ([`SinkPlugin::SPEC`]), in
        /// registration order: what `[sink] kind` and the sink sections are validated against.
        pub(crate) fn sections() -> SinkSpecs {
            &[$( <$plugin as SinkPlugin>::SPEC ),+]
        }
    };
}

sinks![
    crate::sink::kafka::Kafka,
    crate::sink::nats::Nats,
    crate::sink::rabbitmq::RabbitMq,
    crate::sink::redis::Redis,
    crate::sink::webhook::Webhook,
    crate::sink::pubsub::PubSub,
    crate::sink::aws::sqs::SqsPlugin,
    crate::sink::aws::kinesis::KinesisPlugin,
    crate::sink::aws::sns::SnsPlugin,
];

impl Settings {
    /// Reads `path`, applies `OUTBOX_RELAY__*` variables from the process environment, validates
    /// (the sink sections: the registered ones).
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// [`Settings::load`] with `env` as the environment.
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        Settings::read_with(path, env, sections())
    }

    /// [`Settings::load_with_env`] for a file's text (`path` names it in errors).
    pub fn from_toml_str(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        Settings::parse_with(text, path, env, sections())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sink::{kinds_quoted, spec_of, SinkTable};
    use crate::config::test_support::load;

    #[test]
    fn every_kind_is_registered_once() {
        let mut kinds: Vec<&str> = sections().iter().map(|s| s.kind()).collect();
        let n = kinds.len();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(kinds.len(), n, "a kind registered twice: {kinds:?}");
    }

    #[test]
    fn kafka_is_the_default_and_unknown_kinds_name_the_choices() {
        assert_eq!(SinkTable::default().spec(sections()).unwrap().kind(), "kafka");
        let Err(err) = spec_of("eventhubs", sections()) else {
            panic!("eventhubs is no sink")
        };
        let err = err.to_string();
        assert!(
            err.contains("sink.kind") && err.contains("\"eventhubs\"") && err.contains("\"kafka\""),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_section_or_another_kinds_section_names_the_registered_sinks() {
        let err = load("[eventhubs]\nhub = \"x\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains("unknown field `eventhubs`"), "{err}");
        for kind in sections().iter().map(|s| s.kind()) {
            assert!(err.contains(&format!("[{kind}]")), "{kind} missing: {err}");
        }
        // The default kind with another sink's section: refused naming both.
        let err = load("[redis]\nurl = \"redis://127.0.0.1\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a [redis] section is set but [sink] kind = \"kafka\""),
            "{err}"
        );
        let err = load("[sink]\nkind = \"eventhubs\"\n", &[]).unwrap_err().to_string();
        assert!(err.contains(&kinds_quoted(sections())), "{err}");
    }
}
