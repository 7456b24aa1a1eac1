//! [`SinkPlugin`]: everything the relay asks of one kind of sink, in one trait — its section,
//! limits, `setup` preparation, `status` probe, exactly-once capability, the names it goes by
//! in traces and logs, and creating it. Each sink implements it in `src/sink/<name>/` and is
//! listed once in `src/sink/registry.rs`; nothing else in the crate knows the sink exists.
//!
//! Invariant: a plugin sees only its own validated section (its `src/sink/<name>/config.rs` type,
//! [`SinkPlugin::Config`]) and a [`SinkContext`] of what it truly needs from the rest of the
//! configuration — never the whole `Settings`, and never the delivery mode: it declares what it
//! can do for exactly-once delivery ([`SinkPlugin::exactly_once`]) and the relay chooses.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::cloudevents::CloudEventsMode;
use crate::config::sink::{parse_section, SectionContext, SinkSection, SinkSectionSpec};
use crate::config::{ConfigError, Settings};
use crate::sink::{Created, ExactlyOnce, SinkError, SinkLimits, SinkTag, Transactional};

/// What a sink may know of the rest of the configuration.
#[derive(Debug, Clone)]
pub(crate) struct SinkContext {
    /// The caller's in-flight budget (records handed over and not completed), which the sink's
    /// own queue must never refuse. Zero where the caller sends nothing (`setup`, `status`).
    pub(crate) max_in_flight: usize,
    /// The caller's in-flight byte budget ([`crate::sink::SinkRecord::size`] summed), for
    /// a driver-run sink's wire ([`crate::sink::driver::DriverOptions`]).
    #[allow(dead_code)] // read by the driver-run adapters
    pub(crate) max_in_flight_bytes: usize,
    /// `[cloudevents] mode`: records carry CloudEvents attributes as `ce_*` headers (binary)
    /// or an envelope (structured); `None`: plain records.
    pub(crate) cloudevents: Option<CloudEventsMode>,
    /// `relay.connect_timeout`: how long a blocking start-up step may take.
    pub(crate) connect_timeout: Duration,
}

impl SinkContext {
    /// The context of `settings` for a caller whose budget is `max_in_flight` records.
    pub(crate) fn of(settings: &Settings, max_in_flight: usize) -> SinkContext {
        SinkContext {
            max_in_flight,
            max_in_flight_bytes: settings.relay.max_in_flight_bytes,
            cloudevents: settings.cloudevents.as_ref().map(|ce| ce.mode),
            connect_timeout: settings.relay.connect_timeout,
        }
    }
}

/// A sink's config half as a value (its plugin's `SPEC`, registered in `src/sink/registry.rs`):
/// what [`SinkSectionSpec`] asks, for a section whose validation needs nothing but the section.
/// Each such sink declares one, `SECTION`, in its `config.rs`; `R` is the section's serde type,
/// `S` its validated settings.
pub(crate) struct SectionSpec<R, S> {
    /// The `[sink] kind` word, which is also the section's name ([`SinkSectionSpec::kind`]).
    pub(crate) kind: &'static str,
    /// The broker's name for people ([`SinkSectionSpec::name`]).
    pub(crate) name: &'static str,
    /// What a file without the section means.
    pub(crate) absent: Absent<R>,
    /// The parsed section, validated.
    pub(crate) validate: fn(R) -> Result<S, ConfigError>,
    /// `Some(why)`: the broker's CloudEvents binding (or its lack of one) leaves the structured
    /// content mode only, and `why` refuses `[cloudevents] mode = "binary"`; `None`: both modes.
    pub(crate) binary_refused: Option<&'static str>,
}

/// What a file without a sink's section means ([`SectionSpec::absent`]).
pub(crate) enum Absent<R> {
    /// The section is required: the error, which says what a minimal section looks like.
    Refused(&'static str),
    /// The section as if written empty.
    Empty(fn() -> R),
}

impl<R: serde::de::DeserializeOwned, S: SinkSection> SinkSectionSpec for SectionSpec<R, S> {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn validate(
        &self,
        section: Option<toml::Value>,
        _: &SectionContext<'_>,
    ) -> Result<Arc<dyn SinkSection>, ConfigError> {
        let raw = match (section, &self.absent) {
            (Some(section), _) => parse_section(self.kind, section)?,
            (None, Absent::Refused(missing)) => return Err(ConfigError::invalid(self.kind, *missing)),
            (None, Absent::Empty(empty)) => empty(),
        };
        Ok(Arc::new((self.validate)(raw)?))
    }

    fn cloudevents_mode(&self, mode: CloudEventsMode) -> Result<(), String> {
        match (mode, self.binary_refused) {
            (CloudEventsMode::Binary, Some(why)) => Err(why.into()),
            _ => Ok(()),
        }
    }
}

/// A broker client's log target and what becomes of its lines (`ops/logging.rs`): the relay
/// reports the client's failures itself, so the client's own lines are DEBUG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientLogTarget {
    /// The `tracing` target, as `RUST_LOG` names it: `"lapin"`.
    pub(crate) target: &'static str,
    /// `None`: shown only when the relay logs at DEBUG or finer. `Some(level)`: always at that
    /// level (`"error"`: a target whose lines carry payloads, never shown below ERROR; `"warn"`:
    /// a client whose own callback already routes its chatter to DEBUG).
    pub(crate) fixed: Option<&'static str>,
}

impl ClientLogTarget {
    /// A target shown only when the relay logs at DEBUG or finer.
    pub(crate) const fn debug(target: &'static str) -> ClientLogTarget {
        ClientLogTarget { target, fixed: None }
    }

    /// A target always shown at `level` ([`ClientLogTarget::fixed`]).
    pub(crate) const fn at(target: &'static str, level: &'static str) -> ClientLogTarget {
        ClientLogTarget {
            target,
            fixed: Some(level),
        }
    }
}

/// One kind of sink. Implemented by a unit struct in `src/sink/<name>/mod.rs`.
pub(crate) trait SinkPlugin: Sync + 'static {
    /// The sink's validated section: the type its `config.rs` produces.
    type Config: SinkSection;

    /// Its config half, handed to the config loader by the registry: the `[sink] kind` word
    /// ([`SinkSectionSpec::kind`]) and the name for people ([`SinkSectionSpec::name`]).
    const SPEC: &'static dyn SinkSectionSpec;

    /// OpenTelemetry's `messaging.system` value for the broker ("kafka", "nats", "rabbitmq",
    /// "redis"; a system the conventions do not name uses its `[sink] kind`).
    const MESSAGING_SYSTEM: &'static str;

    /// The span attribute carrying the record key, where the messaging conventions define one
    /// for the broker (`messaging.kafka.message.key`); `None`: the key is not an attribute.
    const KEY_ATTRIBUTE: Option<&'static str> = None;

    /// The log targets of the sink's client library ([`ClientLogTarget`]).
    const LOG_TARGETS: &'static [ClientLogTarget] = &[];

    /// The sink's half of `outbox-relay demo` (its `demo.rs`): what the demo asks of the sink
    /// instead of knowing it.
    #[cfg(feature = "demo")]
    const DEMO: &'static crate::sink::demo::SinkDemo;

    /// What the sink accepts (destination name rule, largest message), known before anything
    /// is sent. Each routed destination and each record is checked against it.
    fn limits(&self, config: &Self::Config) -> SinkLimits;

    /// What the sink can do for exactly-once delivery with this configuration (a value; the
    /// relay chooses the strategy: `relay/guarantee/`).
    fn exactly_once(&self, config: &Self::Config) -> ExactlyOnce;

    /// What `setup` does for the sink (create or check what it needs: a stream, an exchange);
    /// one line per thing done or found, for the report.
    fn prepare(&self, config: &Self::Config) -> impl Future<Output = Result<Vec<String>, SinkError>> + Send;

    /// What `status` says of the sink: reachable, and how it looks (`Err`: why not).
    fn probe(&self, config: &Self::Config) -> impl Future<Output = Result<String, SinkError>> + Send;

    /// Creates the sink (connecting, where the broker needs a connection). Called inside a
    /// tokio runtime, whose tasks the sink may use for its I/O.
    fn create<Tag: SinkTag>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Created<Tag>> + Send;

    /// [`ExactlyOnce::BrokerDeduplicates`]: the sink ready to hand its broker the records'
    /// deduplication keys (Redis: with its dedup script loaded); by default the plain one.
    fn create_deduplicating<Tag: SinkTag>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Created<Tag>> + Send {
        self.create(config, cx)
    }

    /// [`ExactlyOnce::ReadBack`]: the sink as its read-back source promised it (a client queue
    /// that expires in the time [`crate::sink::ReadBackSource::queue_expiry`] names); by default
    /// the plain one.
    fn create_read_back<Tag: SinkTag>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Created<Tag>> + Send {
        self.create(config, cx)
    }

    /// [`ExactlyOnce::Transactions`]: the sink that commits in units together with the
    /// caller's checkpoint, fencing earlier producers of its identity before it returns. Only
    /// called when [`SinkPlugin::exactly_once`] says `Transactions`; others refuse.
    fn create_transactional<Tag: SinkTag>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Result<Transactional<Tag>, SinkError>> + Send {
        let _ = (config, cx);
        let sink = Self::SPEC.name();
        async move {
            Err(SinkError {
                sink,
                cause: "this sink does not commit records in units".into(),
                transient: false,
            })
        }
    }
}
