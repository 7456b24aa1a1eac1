//! [`SinkPlugin`]: everything the relay asks of one kind of sink, in one trait — its section,
//! limits, `setup` preparation, `status` probe, exactly-once capability, the names it goes by
//! in traces and logs, and creating it. Each sink implements it in `src/sink/<name>/` and is
//! listed once in `src/sink/registry.rs`; nothing else in the crate knows the sink exists.
//!
//! Invariant: a plugin sees only its own validated section (its `src/sink/<name>/config.rs` type,
//! [`SinkPlugin::Config`]) and a [`SinkContext`] of what it truly needs from the rest of the
//! configuration — never the whole `Settings`.

use std::future::Future;
use std::time::Duration;

use crate::config::cloudevents::CloudEventsMode;
use crate::config::relay::{Delivery, ExactlyOnceVia};
use crate::config::sink::{SinkSection, SinkSectionSpec};
use crate::config::Settings;
use crate::sink::{ExactlyOnce, ReadBackSpec, SinkError, SinkLimits, SinkWithCompletions};

/// What a sink may know of the rest of the configuration.
#[derive(Debug, Clone)]
pub(crate) struct SinkContext {
    /// `relay.delivery`.
    pub(crate) delivery: Delivery,
    /// `relay.exactly_once`: how exactly-once is wanted (only meaningful with
    /// [`Delivery::ExactlyOnce`]).
    pub(crate) exactly_once: ExactlyOnceVia,
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
    /// `relay.checkpoint_topic`: where a sink committing in units keeps the checkpoint.
    pub(crate) checkpoint_topic: String,
}

impl SinkContext {
    /// The context of `settings` for a caller whose budget is `max_in_flight` records.
    pub(crate) fn of(settings: &Settings, max_in_flight: usize) -> SinkContext {
        SinkContext {
            delivery: settings.relay.delivery,
            exactly_once: settings.relay.exactly_once,
            max_in_flight,
            max_in_flight_bytes: settings.relay.max_in_flight_bytes,
            cloudevents: settings.cloudevents.as_ref().map(|ce| ce.mode),
            connect_timeout: settings.relay.connect_timeout,
            checkpoint_topic: settings.relay.checkpoint_topic.clone(),
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

/// One kind of sink. Implemented by a unit struct in `src/sink/<name>/mod.rs`.
pub(crate) trait SinkPlugin: Sync + 'static {
    /// The sink's validated section: the type its `config.rs` produces.
    type Config: SinkSection;

    /// Its config half, handed to the config loader by the registry: the `[sink] kind` word
    /// ([`SinkSectionSpec::kind`]) and the name for people ([`SinkSectionSpec::name`]).
    fn spec(&self) -> &'static dyn SinkSectionSpec;

    /// OpenTelemetry's `messaging.system` value for the broker ("kafka", "nats", "rabbitmq",
    /// "redis"; a system the conventions do not name uses its `[sink] kind`).
    fn messaging_system(&self) -> &'static str;

    /// The span attribute carrying the record key, where the messaging conventions define one
    /// for the broker (`messaging.kafka.message.key`); `None`: the key is not an attribute.
    fn key_attribute(&self) -> Option<&'static str> {
        None
    }

    /// The log targets of the sink's client library ([`ClientLogTarget`]).
    fn log_targets(&self) -> &'static [ClientLogTarget] {
        &[]
    }

    /// What the sink accepts (destination name rule, largest message), known before anything
    /// is sent. Each routed destination and each record is checked against it.
    fn limits(&self, config: &Self::Config) -> SinkLimits;

    /// How the sink supports `relay.delivery = "exactly-once"` with this configuration.
    fn exactly_once(&self, config: &Self::Config, cx: &SinkContext) -> ExactlyOnce;

    /// What `setup` does for the sink (create or check what it needs: a stream, an exchange);
    /// one line per thing done or found, for the report.
    fn prepare(&self, config: &Self::Config) -> impl Future<Output = Result<Vec<String>, SinkError>> + Send;

    /// What `status` says of the sink: reachable, and how it looks (`Err`: why not).
    fn probe(&self, config: &Self::Config) -> impl Future<Output = Result<String, SinkError>> + Send;

    /// Creates the sink (connecting, where the broker needs a connection). Called inside a
    /// tokio runtime, whose tasks the sink may use for its I/O.
    fn create<Tag: Send + Sync + 'static>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Result<SinkWithCompletions<Tag>, SinkError>> + Send;

    /// The sink's half of `outbox-relay demo` (its `demo.rs`): what the demo asks of the sink
    /// instead of knowing it.
    #[cfg(feature = "demo")]
    fn demo(&self) -> &'static dyn crate::sink::demo::SinkDemo;

    /// [`ExactlyOnce::Transactions`]: the sink that commits in units together with the
    /// relay's checkpoint, fencing earlier producers of its identity before it returns. Only
    /// called when [`SinkPlugin::exactly_once`] says `Transactions`; others refuse.
    fn create_sealing<Tag: Send + Sync + 'static>(
        &self,
        config: &Self::Config,
        cx: &SinkContext,
    ) -> impl Future<Output = Result<SinkWithCompletions<Tag>, SinkError>> + Send {
        let _ = (config, cx);
        let sink = self.spec().name();
        async move {
            Err(SinkError {
                sink,
                cause: "this sink does not commit records in units".into(),
                transient: false,
            })
        }
    }

    /// [`ExactlyOnce::ReadBack`]: what opening a reader of the sink's stored records needs.
    fn read_back(&self, config: &Self::Config) -> Option<ReadBackSpec> {
        let _ = config;
        None
    }
}
