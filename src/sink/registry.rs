//! The sinks this relay has: one line per sink in [`sinks!`]'s list, in the order of
//! `config::sink::SINK_SECTIONS` (the config half of the same registration; a unit test below
//! checks the two agree). Generic code reaches a sink only through [`visit`] (the chosen one)
//! or [`each`] (all of them).
//!
//! Adding a sink: its folder `src/sink/<name>/` with a [`SinkPlugin`], its section in
//! `src/config/<name>.rs`, one line here and one in `config::sink::SINK_SECTIONS`
//! (docs/architecture.md, "Adding a sink").

#[cfg(test)]
use crate::config::sink::SinkSectionSpec;
use crate::config::sink::SinkSettings;
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
    };
}

sinks![
    crate::sink::kafka::Kafka,
    crate::sink::nats::Nats,
    crate::sink::rabbitmq::RabbitMq,
    crate::sink::redis::Redis,
    crate::sink::webhook::Webhook,
    crate::sink::pubsub::PubSub,
    crate::sink::sqs::SqsPlugin,
];

/// The config halves of the registered plugins, in registration order.
#[cfg(test)]
pub(crate) fn specs() -> Vec<&'static dyn SinkSectionSpec> {
    struct Specs(Vec<&'static dyn SinkSectionSpec>);
    impl Each for Specs {
        fn each<P: SinkPlugin>(&mut self, plugin: &'static P) {
            self.0.push(plugin.spec());
        }
    }
    let mut specs = Specs(Vec::new());
    each(&mut specs);
    specs.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sink::SINK_SECTIONS;

    #[test]
    fn the_plugins_and_the_config_sections_are_the_same_list() {
        let plugins: Vec<&str> = specs().iter().map(|s| s.kind()).collect();
        let sections: Vec<&str> = SINK_SECTIONS.iter().map(|s| s.kind()).collect();
        assert_eq!(
            plugins, sections,
            "src/sink/registry.rs and config::sink::SINK_SECTIONS must list the same sinks in the same order"
        );
    }
}
