//! The NATS JetStream sink: one connection per sink instance, records published as JetStream
//! messages (subject = the routed destination) whose PubAcks are awaited pipelined, one
//! completion per record; `setup`'s stream creation ([`prepare`]) and `status`'s check
//! ([`probe`]). docs/sink-nats.md describes what lands where and the guarantees.
//!
//! Invariant: like the Kafka adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface.

pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod publisher;

use std::time::Duration;

use async_nats::jetstream;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event, ServerAddr};

use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{filter_covers, validate_subject, NatsSettings, SINK};

/// The NATS JetStream sink (`[sink] kind = "nats"`).
pub(crate) struct Nats;

impl SinkPlugin for Nats {
    type Config = NatsSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    const MESSAGING_SYSTEM: &'static str = "nats";

    const LOG_TARGETS: &'static [ClientLogTarget] = &[ClientLogTarget::debug("async_nats")];

    /// NATS's subject rule (no wildcards, no empty tokens, no whitespace) and `[nats] max_payload`
    /// (the server's real `max_payload` is also checked on sight, per record, once connected).
    fn limits(&self, settings: &NatsSettings) -> SinkLimits {
        SinkLimits {
            check_name: check_subject,
            max_message_bytes: settings.max_payload,
        }
    }

    /// `Nats-Msg-Id`: JetStream drops a message whose id it stored within the stream's
    /// duplicate window.
    fn exactly_once(&self, _: &NatsSettings) -> ExactlyOnce {
        ExactlyOnce::BrokerDeduplicates
    }

    /// `setup`: creates the stream (file storage, `[nats] subjects`, the server's defaults
    /// otherwise: 2-minute duplicate window) when missing; accepts an existing one that covers the
    /// subjects; refuses one that does not, and a missing one when `[nats] subjects` is not set
    /// (a stream on `>` would also store every reply, PubAcks included). Returns what it did.
    async fn prepare(&self, settings: &NatsSettings) -> Result<Vec<String>, SinkError> {
        let client = connect(settings, None, None).await?;
        let js = context(client, settings);
        let mut done = Vec::new();
        match checked_stream(&js, settings).await {
            Ok(info) => done.push(format!(
                "NATS stream {:?} exists with subjects {:?} ({} messages)",
                settings.stream, info.config.subjects, info.state.messages
            )),
            Err(e) if e.cause.contains("does not exist") => {
                let Some(subjects) = settings.subjects.clone() else {
                    return Err(error(
                        format!(
                            "stream {:?} does not exist, and [nats] subjects is not set: set it to the subjects the \
                             [route] produces (e.g. subjects = [\"outbox.>\"]) so setup can create the stream",
                            settings.stream
                        ),
                        false,
                    ));
                };
                js.create_stream(jetstream::stream::Config {
                    name: settings.stream.clone(),
                    subjects: subjects.clone(),
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    error(
                        format!(
                            "cannot create stream {:?} with subjects {:?}: {e}; another stream may already hold some \
                             of these subjects (streams may not overlap): set [nats] subjects to a free subject space",
                            settings.stream, subjects
                        ),
                        false,
                    )
                })?;
                done.push(format!(
                    "created NATS stream {:?} with subjects {subjects:?}",
                    settings.stream
                ));
            }
            Err(e) => return Err(e),
        }
        Ok(done)
    }

    /// `status`: the server reachable, the stream present and covering the subjects, its size.
    async fn probe(&self, settings: &NatsSettings) -> Result<String, SinkError> {
        let client = connect(settings, None, None).await?;
        let server = client.server_info();
        let js = context(client, settings);
        let info = checked_stream(&js, settings).await?;
        Ok(format!(
            "NATS {} at {} (max_payload {} bytes): stream {:?} subjects {:?}, {} messages, {} bytes, duplicate window {} s",
            server.version,
            settings.url,
            server.max_payload,
            settings.stream,
            info.config.subjects,
            info.state.messages,
            info.state.bytes,
            info.config.duplicate_window.as_secs()
        ))
    }

    async fn create<Tag: SinkTag>(&self, config: &NatsSettings, cx: &SinkContext) -> Created<Tag> {
        Ok(boxed(publisher::Publisher::create(config, cx.max_in_flight).await?))
    }
}

fn check_subject(name: &str) -> Result<(), String> {
    validate_subject(name, false)
}

fn error(cause: String, transient: bool) -> SinkError {
    SinkError {
        sink: SINK,
        cause,
        transient,
    }
}

/// Connects with transparent reconnection disabled: each server of the URL is tried once, and a
/// lost connection stays lost (the publisher fails what it had in flight; the relay starts a
/// new session, with a new connection, after its backoff). `events` sees the client's events;
/// `subscription_capacity` (messages queued per subscription) replaces the client's default.
pub(crate) async fn connect(
    s: &NatsSettings,
    events: Option<tokio::sync::mpsc::UnboundedSender<Event>>,
    subscription_capacity: Option<usize>,
) -> Result<Client, SinkError> {
    let servers: Vec<ServerAddr> = s
        .url
        .servers()
        .iter()
        .map(|u| u.parse::<ServerAddr>())
        .collect::<Result<_, _>>()
        .map_err(|e| error(format!("{}: {e}; fix [nats] url", s.url), false))?;
    let count = servers.len();
    let mut options = ConnectOptions::new()
        .name("outbox-relay")
        .connection_timeout(s.connect_timeout)
        // The connector counts every attempt, the first connection's included: one per server.
        .max_reconnects(Some(count))
        .ignore_discovered_servers()
        .request_timeout(Some(s.requests.timeout));
    if let Some(path) = &s.creds_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| error(format!("cannot read [nats] creds_file {}: {e}", path.display()), false))?;
    }
    if let Some(ca) = &s.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some(capacity) = subscription_capacity {
        options = options.subscription_capacity(capacity);
    }
    if let Some(events) = events {
        options = options.event_callback(move |event| {
            let events = events.clone();
            async move {
                let _ = events.send(event);
            }
        });
    }
    // Each server gets one connect timeout, plus a margin for the handshake.
    let bound = s.connect_timeout * u32::try_from(count).unwrap_or(u32::MAX) + Duration::from_secs(2);
    match tokio::time::timeout(bound, options.connect(servers)).await {
        Err(_) => Err(error(
            format!("cannot reach {} within {} ms", s.url, bound.as_millis()),
            true,
        )),
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => {
            let transient = !matches!(
                e.kind(),
                ConnectErrorKind::Authentication
                    | ConnectErrorKind::AuthorizationViolation
                    | ConnectErrorKind::ServerParse
                    | ConnectErrorKind::Tls
            );
            let fix = if transient {
                "is the server up and reachable?"
            } else {
                "check [nats] url (user:password@ or token@), creds_file and tls_ca"
            };
            Err(error(format!("cannot connect to {}: {e}; {fix}", s.url), transient))
        }
    }
}

/// The JetStream API context for stream management (`setup`, `status`, the publisher's stream
/// check); records are not published through it (`publisher.rs` publishes with its own replies).
fn context(client: Client, s: &NatsSettings) -> jetstream::Context {
    jetstream::context::ContextBuilder::new()
        .timeout(s.requests.timeout)
        .build(client)
}

/// The configured stream, checked: it exists and its subjects cover every configured subject.
/// Returns the stream's subject filters and its info.
pub(crate) async fn checked_stream(
    js: &jetstream::Context,
    s: &NatsSettings,
) -> Result<jetstream::stream::Info, SinkError> {
    let stream = match js.get_stream(&s.stream).await {
        Ok(stream) => stream,
        Err(e) => {
            let missing = matches!(
                e.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            );
            return Err(if missing {
                error(
                    format!(
                        "stream {:?} does not exist; run `outbox-relay setup` (it creates the stream with [nats] subjects)",
                        s.stream
                    ),
                    false,
                )
            } else {
                error(
                    format!(
                        "cannot look up stream {:?}: {e}; is JetStream enabled on the server (nats-server -js)?",
                        s.stream
                    ),
                    true,
                )
            });
        }
    };
    let info = stream.cached_info().clone();
    let wanted = s.subjects.as_deref().unwrap_or_default();
    uncovered(&info.config.subjects, wanted).map_or(Ok(info), |missing| {
        Err(error(
            format!(
                "stream {:?} has subjects {:?}, which do not cover [nats] subjects {missing:?}; add them to the \
                 stream (nats stream edit) or set [nats] subjects to what the stream holds",
                s.stream,
                stream.cached_info().config.subjects
            ),
            false,
        ))
    })
}

/// The wanted subjects no stream filter covers, if any.
fn uncovered(stream_subjects: &[String], wanted: &[String]) -> Option<Vec<String>> {
    let missing: Vec<String> = wanted
        .iter()
        .filter(|w| !stream_subjects.iter().any(|f| filter_covers(f, w)))
        .cloned()
        .collect();
    (!missing.is_empty()).then_some(missing)
}

#[cfg(test)]
pub(crate) mod tests;
