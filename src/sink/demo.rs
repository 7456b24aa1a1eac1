//! A sink's half of `outbox-relay demo` (cargo feature "demo"): what the demo asks of each
//! sink's plugin ([`SinkPlugin::DEMO`]), so that `src/demo/` keeps no list of sinks and names
//! none. Each sink answers in its own `demo.rs`: which server it needs and how to reach or start
//! one ([`Server`]), what its client reads from the environment ([`SinkDemo::point_clients_at`]),
//! the run's configuration section ([`DemoTarget::config`]), what the summary says of it
//! ([`DemoTarget::describe`]), and its consumer ([`DemoTarget::consume`]): it makes what the run
//! reads from (a queue, a subscription, a stream), counts what it reads into a [`Tally`], and at
//! the end removes what the run made and says so.
//!
//! Invariant: the demo reaches only local servers (the embedded or given Kafka, a broker on
//! 127.0.0.1, an emulator, moto, its own receiver), never a cloud account; every call a consumer
//! makes to its server is bounded ([`bounded`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::config::sink::SinkSettings;
use crate::sink::plugin::SinkPlugin;
use crate::sink::registry::{self, Each};

/// How long a demo consumer waits for one call to its server.
pub(crate) const BROKER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a demo consumer counts what it read: the demo's statistics, for this run.
pub(crate) trait Tally: Send + Sync {
    /// One message read, with the event id it carries (its `id`) and its payload: counted when
    /// they are an event of this run. Returns whether it was counted.
    fn record(&self, id: Option<i64>, payload: Option<&[u8]>) -> bool;

    /// What the server reports it stored for the run, where it reports a count.
    fn published(&self, n: u64);

    /// One more stored, where the consumer sees each arrive (a receiver).
    fn published_one(&self);
}

/// A local stand-in of a cloud service: its name, and how to start one, said when it does not
/// answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalServer {
    pub(crate) name: &'static str,
    pub(crate) start: &'static str,
}

/// How the demo reaches a sink's server.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Server {
    /// The demo runs the server itself (named: "receiver"), so it takes no address.
    Own(&'static str),
    /// The demo embeds the server (named: "Kafka") unless `--bootstrap` gives one.
    Embedded(&'static str),
    /// A server that runs already, at `--sink-url` (`default_url` unless given); `local`: a
    /// local stand-in of a cloud service, checked before anything starts.
    Running {
        default_url: &'static str,
        local: Option<LocalServer>,
    },
}

impl Server {
    /// A broker running at `default_url` unless `--sink-url` says where.
    pub(crate) const fn running(default_url: &'static str) -> Server {
        Server::Running {
            default_url,
            local: None,
        }
    }
}

/// What one run of the demo is called by.
#[derive(Debug, Clone)]
pub(crate) struct DemoRun {
    /// Unique per run: in the names of what the run makes, and in every event's payload.
    pub(crate) id: String,
    /// The event type the demo's producers write (the routed-by value).
    pub(crate) event_type: &'static str,
}

/// Opens a run's target: starts what the run needs of the sink itself (an embedded broker, a
/// receiver) and names what the run makes on the server; the address is the server given
/// (`--sink-url` or its default, or `--bootstrap`; `None` when none was).
pub(crate) type Open = fn(Option<String>, &DemoRun) -> Result<Box<dyn DemoTarget>, String>;

/// A sink's answers to the demo: `DEMO` in `src/sink/<name>/demo.rs`, returned by its plugin.
#[derive(Clone, Copy)]
pub(crate) struct SinkDemo {
    /// What `demo --help` says of the sink beside its kind.
    pub(crate) help: Option<&'static str>,
    /// How the demo reaches the sink's server.
    pub(crate) server: Server,
    /// Sets what the sink's client reads from the environment to reach the server at the
    /// address given (an emulator's host, test credentials): the relay runs in the demo's
    /// process. Called before the runtime's threads exist.
    pub(crate) point_clients_at: fn(&str),
    pub(crate) open: Open,
}

impl SinkDemo {
    /// The demo half of a sink whose client reads nothing from the environment.
    pub(crate) const fn new(server: Server, open: Open) -> SinkDemo {
        SinkDemo {
            help: None,
            server,
            point_clients_at: |_| {},
            open,
        }
    }

    /// With `help` in `demo --help`.
    pub(crate) const fn help(self, help: &'static str) -> SinkDemo {
        SinkDemo {
            help: Some(help),
            ..self
        }
    }

    /// With `point` setting what the sink's client reads from the environment.
    pub(crate) const fn pointing(self, point: fn(&str)) -> SinkDemo {
        SinkDemo {
            point_clients_at: point,
            ..self
        }
    }
}

/// The sink's part of the run's configuration, as a user would write it: the keys of its section
/// (the demo heads them with `[sink] kind` and the section's name), and those of a `[route]`
/// where the run needs names of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DemoConfig {
    pub(crate) keys: String,
    pub(crate) route: Option<String>,
}

impl DemoConfig {
    /// `keys`, with every event routed to `replacement` (`${routedByValue}` standing for the
    /// routed-by value).
    pub(crate) fn routed(keys: String, replacement: &str) -> DemoConfig {
        DemoConfig {
            keys,
            route: Some(format!(
                "topic_regex = \"(?<routedByValue>.*)\"\ntopic_replacement = \"{replacement}\"\n"
            )),
        }
    }

    /// The configuration's text for the sink of `kind`.
    pub(crate) fn text(&self, kind: &str) -> String {
        let route = self
            .route
            .as_ref()
            .map(|keys| format!("\n[route]\n{keys}"))
            .unwrap_or_default();
        format!("[sink]\nkind = \"{kind}\"\n\n[{kind}]\n{}{route}", self.keys)
    }
}

/// The future of a started consumer.
pub(crate) type Starting<'a> = Pin<Box<dyn Future<Output = Result<Consuming, String>> + Send + 'a>>;

/// Where one run publishes, and what it holds of the sink (dropped at the end: an embedded
/// broker stops with it).
pub(crate) trait DemoTarget: Send + Sync {
    /// The sink's part of the run's configuration ([`DemoConfig`]).
    fn config(&self) -> DemoConfig;

    /// Where the events went, for the summary (secrets masked as the settings print them).
    fn describe(&self, sink: &SinkSettings) -> String;

    /// Makes what the run's consumer reads from and starts it on `topic` (the routed name):
    /// called before the relay publishes. It counts into `tally` until `stop`, then removes
    /// what the run made.
    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a>;
}

/// A demo consumer that runs as a task: it reads until `stop`, then removes what the run made
/// and returns what it cleaned up.
pub(crate) trait DemoConsumer: Send + 'static {
    fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> impl Future<Output = Vec<String>> + Send;
}

/// [`DemoTarget::consume`] for a consumer that runs as a task: once `made`, it is started.
pub(crate) fn start<'a, C: DemoConsumer>(
    made: impl Future<Output = Result<C, String>> + Send + 'a,
    tally: Arc<dyn Tally>,
    stop: Arc<AtomicBool>,
) -> Starting<'a> {
    Box::pin(async move {
        let consumer = made.await?;
        Ok(Consuming::Task(tokio::spawn(consumer.run(tally, stop))))
    })
}

/// A running demo consumer: a task (which may wait for a thread of its own) that cleans up what
/// the run made and says so.
pub(crate) enum Consuming {
    Task(tokio::task::JoinHandle<Vec<String>>),
}

impl Consuming {
    /// Waits (bounded) for the consumer to stop; returns its cleanup lines.
    pub(crate) async fn join(self) -> Vec<String> {
        match self {
            Consuming::Task(mut t) => match tokio::time::timeout(Duration::from_secs(20), &mut t).await {
                Ok(Ok(lines)) => lines,
                Ok(Err(e)) => vec![format!("FAILED: the demo consumer panicked: {e}")],
                Err(_) => {
                    t.abort();
                    vec!["FAILED: the demo consumer did not stop within 20 s".to_owned()]
                }
            },
        }
    }
}

/// Every registered sink's `[sink] kind` and demo half, in registration order (the first is
/// the default `[sink] kind`).
pub(crate) fn sinks() -> Vec<(&'static str, &'static SinkDemo)> {
    struct Demos(Vec<(&'static str, &'static SinkDemo)>);
    impl Each for Demos {
        fn each<P: SinkPlugin>(&mut self, _: &'static P) {
            self.0.push((P::SPEC.kind(), P::DEMO));
        }
    }
    let mut demos = Demos(Vec::new());
    registry::each(&mut demos);
    demos.0
}

/// The demo half of the sink of `kind`.
pub(crate) fn find(kind: &str) -> Option<&'static SinkDemo> {
    sinks().into_iter().find(|(k, _)| *k == kind).map(|(_, demo)| demo)
}

/// `f`, bounded by [`BROKER_TIMEOUT`], its error naming the server and what was being done.
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    broker: &str,
    what: &str,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(BROKER_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| format!("{broker}, {what}: {e}")),
        Err(_) => Err(format!("{broker}, {what}: no answer within {BROKER_TIMEOUT:?}")),
    }
}

/// The line of a consumer's clean-up (deleting the run's stream, queue, topic or exchange):
/// `done` when `outcome` went well, `FAILED:` and why otherwise.
pub(crate) fn cleaned_up<T, E: std::fmt::Display>(outcome: Result<T, E>, done: String) -> String {
    match outcome {
        Ok(_) => done,
        Err(e) => format!("FAILED: {e}"),
    }
}

/// The event id as the brokers carry it: decimal text.
pub(crate) fn parse_id(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// `value` as a TOML basic string.
pub(crate) fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The name of what the run makes on a server (a queue, a topic, an exchange, a stream).
pub(crate) fn container(run: &DemoRun) -> String {
    format!("outbox-relay-demo-{}", run.id)
}
