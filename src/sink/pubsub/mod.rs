//! The Google Cloud Pub/Sub sink (`[sink] kind = "pubsub"`): each event published to the topic
//! `projects/<[pubsub] project>/topics/<routed name>`, its aggregate key as the ordering key,
//! the event id, key and headers as attributes. docs/sink-pubsub.md describes what a consumer
//! gets and the guarantees.
//!
//! * `message.rs` — a record as a message, checked against Pub/Sub's limits (refused on sight);
//! * `exchange.rs` — [`exchange::PubSubExchange`], what the shared driver runs: one publisher
//!   per topic, the reply classified (delivered, refused, transient), the client's ordering-key
//!   pause handed over to the driver's key fence.
//!
//! The client is Google's official one (`google-cloud-pubsub`, googleapis/google-cloud-rust):
//! Application Default Credentials as every Google client finds them, and
//! `PUBSUB_EMULATOR_HOST` honoured here as Google's other clients do (plain-text gRPC to that
//! `host:port`, no credentials) — the Rust client does not read it itself.
//!
//! Order per aggregate comes from the driver's per-key mode (one message per ordering key in
//! flight, up to `max_concurrency` keys at once). Exactly-once is not offered
//! ([`NO_EXACTLY_ONCE`]).
//!
//! Invariant: like every adapter, this one knows nothing of PostgreSQL or the watermark; it
//! imports only `config` and the sink interface.

pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod exchange;
pub(crate) mod message;

use std::sync::Arc;
use std::time::Duration;

use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::retry_policy::RetryPolicyExt;
use google_cloud_pubsub::client::{BasePublisher, TopicAdmin};
use google_cloud_pubsub::retry_policy::RetryableErrors;

use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::driver::{self, DriverOptions};
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{check_topic_id, PubSubSettings, EMULATOR_HOST_VAR, NO_EXACTLY_ONCE, SINK};

/// The Pub/Sub sink's plugin (`src/sink/registry.rs`).
pub(crate) struct PubSub;

impl SinkPlugin for PubSub {
    type Config = PubSubSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    /// OpenTelemetry's messaging conventions name it `gcp_pubsub`.
    const MESSAGING_SYSTEM: &'static str = "gcp_pubsub";

    /// The client and its transport log retries and connection churn; the relay reports
    /// failures itself.
    const LOG_TARGETS: &'static [ClientLogTarget] = &[
        ClientLogTarget::debug("google_cloud_pubsub"),
        ClientLogTarget::debug("google_cloud_gax"),
        ClientLogTarget::debug("google_cloud_gax_internal"),
        ClientLogTarget::debug("google_cloud_auth"),
    ];

    fn limits(&self, _: &PubSubSettings) -> SinkLimits {
        SinkLimits {
            check_name: check_topic_id,
            max_message_bytes: message::MAX_MESSAGE_BYTES,
        }
    }

    fn exactly_once(&self, _: &PubSubSettings) -> ExactlyOnce {
        ExactlyOnce::Unsupported(NO_EXACTLY_ONCE.into())
    }

    /// `setup`: creates each topic of `[pubsub] topics` that does not exist yet.
    async fn prepare(&self, settings: &PubSubSettings) -> Result<Vec<String>, SinkError> {
        if settings.topics.is_empty() {
            return Ok(vec![format!(
                "Pub/Sub project {}: no topics created ([pubsub] topics is empty); every routed topic must exist \
                 (list them in [pubsub] topics, or `gcloud pubsub topics create <id>`)",
                settings.project
            )]);
        }
        let (admin, endpoint) = admin(settings).await?;
        let mut done = Vec::new();
        for topic in &settings.topics {
            let name = settings.topic_name(topic);
            match admin.get_topic().set_topic(&name).send().await {
                Ok(_) => done.push(format!("Pub/Sub topic {name} exists")),
                Err(e) if e.status().is_some_and(|s| s.code == Code::NotFound) => {
                    match admin.create_topic().set_name(&name).send().await {
                        Ok(_) => done.push(format!("Pub/Sub topic {name} created")),
                        // Created by another `setup` meanwhile.
                        Err(e) if e.status().is_some_and(|s| s.code == Code::AlreadyExists) => {
                            done.push(format!("Pub/Sub topic {name} exists"))
                        }
                        Err(e) => return Err(admin_error(&format!("creating topic {name}"), &endpoint, &e)),
                    }
                }
                Err(e) => return Err(admin_error(&format!("looking up topic {name}"), &endpoint, &e)),
            }
        }
        Ok(done)
    }

    /// `status`: the service answers, and the `[pubsub] topics` exist.
    async fn probe(&self, settings: &PubSubSettings) -> Result<String, SinkError> {
        let (admin, endpoint) = admin(settings).await?;
        let started = std::time::Instant::now();
        let mut missing = Vec::new();
        let check = async {
            if settings.topics.is_empty() {
                // Any answer about the project shows the service is reachable and the identity valid.
                admin
                    .list_topics()
                    .set_project(format!("projects/{}", settings.project))
                    .set_page_size(1)
                    .send()
                    .await
                    .map(|_| ())
            } else {
                for topic in &settings.topics {
                    let name = settings.topic_name(topic);
                    match admin.get_topic().set_topic(&name).send().await {
                        Ok(_) => {}
                        Err(e) if e.status().is_some_and(|s| s.code == Code::NotFound) => missing.push(name),
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        };
        match tokio::time::timeout(Duration::from_secs(30), check).await {
            Ok(Ok(())) if missing.is_empty() => Ok(format!(
                "{} answers ({} ms); project {}, {} topic(s) checked, up to {} ordering keys at once",
                endpoint.shown(),
                started.elapsed().as_millis(),
                settings.project,
                settings.topics.len(),
                settings.requests.max_concurrency
            )),
            Ok(Ok(())) => Err(error(
                format!(
                    "{} answers, but these topics do not exist: {}; run `outbox-relay setup` to create them",
                    endpoint.shown(),
                    missing.join(", ")
                ),
                false,
            )),
            Ok(Err(e)) => Err(admin_error("checking the topics", &endpoint, &e)),
            Err(_) => Err(error(format!("{} did not answer within 30 s", endpoint.shown()), true)),
        }
    }

    async fn create<Tag: SinkTag>(&self, config: &PubSubSettings, cx: &SinkContext) -> Created<Tag> {
        let base = connect(config, cx.connect_timeout).await?;
        let exchange = exchange::PubSubExchange::new(base, config, cx.cloudevents);
        let options = DriverOptions {
            // The client's retries end after retry_timeout_ms, but one attempt the service
            // never answers is not bounded by it (seen under load: a publish left waiting with
            // nothing logged, holding its key and the WAL). Past the window and a margin the
            // driver fails it as transient: the session replays it.
            reply_timeout: Some(config.requests.timeout + REPLY_MARGIN),
            // Dropped without abandon: what is on the wire gets one retry window's second.
            drop_wait: Duration::from_secs(1),
            ..config.requests.per_key(cx)
        };
        Ok(boxed(driver::start(Arc::new(exchange), options)))
    }
}

/// How long past `[pubsub] retry_timeout_ms` a publish may stay unanswered before the driver
/// fails it (one attempt's deadline on top of the retry window).
const REPLY_MARGIN: Duration = Duration::from_secs(30);

fn error(cause: String, transient: bool) -> SinkError {
    SinkError {
        sink: SINK,
        cause,
        transient,
    }
}

/// Where the client connects: `PUBSUB_EMULATOR_HOST` (plain text, no credentials) or Google
/// Cloud with Application Default Credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Emulator(String),
    Google,
}

impl Endpoint {
    pub(crate) fn from_env() -> Endpoint {
        match std::env::var(EMULATOR_HOST_VAR) {
            Ok(host) if !host.trim().is_empty() => Endpoint::Emulator(host.trim().to_owned()),
            _ => Endpoint::Google,
        }
    }

    fn url(&self) -> Option<String> {
        match self {
            Endpoint::Emulator(host) if host.contains("://") => Some(host.clone()),
            Endpoint::Emulator(host) => Some(format!("http://{host}")),
            Endpoint::Google => None,
        }
    }

    fn shown(&self) -> String {
        match self {
            Endpoint::Emulator(host) => format!("the Pub/Sub emulator at {host} ({EMULATOR_HOST_VAR})"),
            Endpoint::Google => "Google Cloud Pub/Sub (Application Default Credentials)".to_owned(),
        }
    }
}

/// The client's TLS (rustls) needs a process-wide crypto provider: ring, as everywhere else in
/// the relay (the client's own default would be aws-lc). Installing twice is harmless.
fn crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client's builder options, from the endpoint.
macro_rules! configured {
    ($builder:expr, $endpoint:expr) => {{
        let builder = $builder;
        match $endpoint.url() {
            Some(url) => builder
                .with_endpoint(url)
                .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build()),
            None => builder,
        }
    }};
}

/// The longest wait between two attempts of one publish. The client's default (60 s, growing
/// fourfold from 100 ms) would leave a publish idle for up to a minute after the service is back;
/// 5 s resumes within seconds of an outage's end at a cost of one request per 5 s meanwhile.
pub(crate) const RETRY_MAX_DELAY: Duration = Duration::from_secs(5);

fn backoff() -> google_cloud_gax::exponential_backoff::ExponentialBackoff {
    google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder::new()
        .with_initial_delay(Duration::from_millis(100))
        .with_maximum_delay(RETRY_MAX_DELAY)
        .with_scaling(4)
        .clamp()
}

/// The publishers' shared connection, with the retry window of `[pubsub] retry_timeout_ms`.
async fn connect(settings: &PubSubSettings, timeout: Duration) -> Result<BasePublisher, SinkError> {
    connect_to(settings, &Endpoint::from_env(), timeout).await
}

async fn connect_to(
    settings: &PubSubSettings,
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<BasePublisher, SinkError> {
    crypto();
    let builder = configured!(BasePublisher::builder(), endpoint)
        .with_retry_policy(RetryableErrors.with_time_limit(settings.requests.timeout))
        .with_backoff_policy(backoff());
    match tokio::time::timeout(timeout, builder.build()).await {
        Ok(Ok(base)) => Ok(base),
        Ok(Err(e)) => Err(error(
            format!("cannot create the client for {}: {e}", endpoint.shown()),
            false,
        )),
        Err(_) => Err(error(
            format!(
                "creating the client for {} took longer than {timeout:?}",
                endpoint.shown()
            ),
            true,
        )),
    }
}

async fn admin(settings: &PubSubSettings) -> Result<(TopicAdmin, Endpoint), SinkError> {
    crypto();
    let endpoint = Endpoint::from_env();
    let builder = configured!(TopicAdmin::builder(), endpoint)
        .with_retry_policy(RetryableErrors.with_time_limit(settings.requests.timeout.min(Duration::from_secs(30))));
    let admin = builder.build().await.map_err(|e| {
        error(
            format!("cannot create the admin client for {}: {e}", endpoint.shown()),
            false,
        )
    })?;
    Ok((admin, endpoint))
}

/// An admin call's error as the relay words it; `NOT_FOUND` is not an error here.
fn admin_error(what: &str, endpoint: &Endpoint, e: &google_cloud_pubsub::Error) -> SinkError {
    let code = e.status().map(|s| s.code);
    let transient = !matches!(
        code,
        Some(Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument)
    );
    error(format!("{what} on {}: {e}", endpoint.shown()), transient)
}

#[cfg(test)]
mod tests;
