//! The client setup every AWS sink (SQS, SNS, Kinesis) shares: the SDK's configuration chain
//! (credentials, `AWS_REGION`, `AWS_ENDPOINT_URL`, profiles, web identity, instance metadata)
//! with the section's `region` / `endpoint_url` on top, an HTTPS client on rustls with ring, and
//! one line for an SDK error; and, for a service whose calls take something else than the
//! routed name (a queue URL, a topic ARN), the cache of what each name resolved to.
//!
//! Invariant: credentials are resolved (never printed) before a sink is handed out, so a
//! machine without any fails at start with the fix, not on the first event. A name that does
//! not resolve is a fact about the routed name, never cached (it may be created any time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_credential_types::provider::ProvideCredentials;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::sink::aws::config::{Endpoint, MessageService, MessagesSettings};
use crate::sink::batch::CallError;
use crate::sink::SinkError;

/// The SDK configuration a service client is built from, and where it sends requests (for
/// messages: `region …`, or the endpoint and region).
pub(crate) struct Connected {
    pub(crate) config: SdkConfig,
    pub(crate) shown: String,
}

/// The SDK configuration chain with the section's `endpoint` on top, for `sink` (its name in
/// errors, `"Amazon SQS"`) and `section` (its name in fixes, `"sqs"`); `attempt_timeout` bounds
/// one attempt of one call, `connect_timeout` a connection. Fails (for good) when no region is
/// configured anywhere or no credentials are found.
pub(crate) async fn connect(
    sink: &'static str,
    section: &'static str,
    endpoint: &Endpoint,
    attempt_timeout: Duration,
    connect_timeout: Duration,
) -> Result<Connected, SinkError> {
    let fatal = |cause: String| SinkError {
        sink,
        cause,
        transient: false,
    };
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(connect_timeout)
        .operation_attempt_timeout(attempt_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .timeout_config(timeouts);
    if let Some(region) = &endpoint.region {
        loader = loader.region(aws_config::Region::new(region.to_owned()));
    }
    if let Some(url) = &endpoint.endpoint_url {
        loader = loader.endpoint_url(url.to_owned());
    }
    let config = loader.load().await;
    let Some(region) = config.region().map(ToString::to_string) else {
        return Err(fatal(format!(
            "no AWS region: set [{}] region = \"eu-west-1\" (or the AWS_REGION environment variable, or a \
             profile's region)",
            section
        )));
    };
    let Some(credentials) = config.credentials_provider() else {
        return Err(fatal("the AWS SDK has no credential provider".into()));
    };
    if let Err(e) = credentials.provide_credentials().await {
        return Err(fatal(format!(
            "no AWS credentials found ({}); give the relay credentials the SDK's default chain finds: \
             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a web identity token (EKS), or an instance \
             or container role",
            DisplayErrorContext(&e)
        )));
    }
    let shown = match config.endpoint_url() {
        Some(url) => format!("{url} (region {region})"),
        None => format!("region {region}"),
    };
    Ok(Connected { config, shown })
}

/// The error code of a failed call, when the service answered one (else empty).
pub(crate) fn code<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> &str {
    match e {
        SdkError::ServiceError(s) => s.err().code().unwrap_or_default(),
        _ => "",
    }
}

/// One line for an SDK error: its code and message when the service answered, else the cause
/// chain.
pub(crate) fn words<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> String {
    match e {
        SdkError::ServiceError(s) => {
            let err = s.err();
            format!(
                "{}: {}",
                err.code().unwrap_or("error"),
                err.message().unwrap_or("(no message)")
            )
        }
        other => DisplayErrorContext(other).to_string(),
    }
}

/// What resolving a routed name to what the service's calls take came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolved {
    Found(String),
    /// Nothing of that name is visible to the relay's credentials in this region: the routed
    /// name is wrong for this account (the words say so, with the fix).
    Missing(String),
    /// The service, the network or the credentials failed: try again.
    Failed(String),
}

impl Resolved {
    /// What a batch call takes, else its error: a name that does not resolve refuses the call's
    /// entries, a lookup that failed is retried.
    pub(crate) fn found(self) -> Result<String, CallError> {
        match self {
            Resolved::Found(found) => Ok(found),
            Resolved::Missing(cause) => Err(CallError::Missing(cause)),
            Resolved::Failed(cause) => Err(CallError::Transient(cause)),
        }
    }
}

/// A service's SDK client, made of the configuration chain's answer.
pub(crate) trait SdkClient: Clone {
    fn of(config: &SdkConfig) -> Self;
}

/// A message service's client: its SDK client (`C`), what the routed names resolved to (queue
/// URLs, topic ARNs), and where it sends requests.
#[derive(Clone)]
pub(crate) struct ServiceClient<C> {
    pub(crate) client: C,
    pub(crate) names: Arc<Names>,
    /// Where the client sends requests, for messages (`region`, or the endpoint).
    pub(crate) shown: String,
}

impl<C: SdkClient> ServiceClient<C> {
    /// The SDK configuration chain with `settings` on top; `connect_timeout` bounds a connection.
    /// Fails (for good) when no region is configured anywhere or no credentials are found.
    pub(crate) async fn connect<S: MessageService>(
        settings: &MessagesSettings<S>,
        connect_timeout: Duration,
    ) -> Result<ServiceClient<C>, SinkError> {
        let Connected { config, shown } = settings.connect(connect_timeout).await?;
        Ok(ServiceClient {
            client: C::of(&config),
            names: Arc::default(),
            shown,
        })
    }

    /// Forgets what `name` resolved to (deleted since: the next call resolves it again).
    pub(crate) fn forget(&self, name: &str) {
        self.names.forget(name);
    }
}

/// What routed names resolved to (queue URLs, topic ARNs), kept for the client's life.
#[derive(Debug, Default)]
pub(crate) struct Names(Mutex<HashMap<String, String>>);

impl Names {
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.0.lock().expect("resolved names").get(name).cloned()
    }

    pub(crate) fn extend(&self, found: impl IntoIterator<Item = (String, String)>) {
        self.0.lock().expect("resolved names").extend(found);
    }

    /// Forgets `name` (deleted since: the next call resolves it again).
    pub(crate) fn forget(&self, name: &str) {
        self.0.lock().expect("resolved names").remove(name);
    }
}
