//! The SQS client: the AWS SDK's configuration chain (credentials, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, profiles) with `[sqs] region` / `endpoint_url` on top, an HTTPS client on
//! rustls with ring, and each queue's URL resolved once (`GetQueueUrl`) and cached.
//!
//! Invariant: credentials are resolved (never printed) before the sink is handed out, so a
//! machine without any fails at start with the fix, not on the first event; a queue that does
//! not exist is a fact about the routed name, never cached (it may be created any time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::ProvideCredentials;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use super::SINK;
use crate::config::sqs::SqsSettings;
use crate::sink::SinkError;

/// What resolving a queue's URL came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueUrl {
    Found(String),
    /// The queue does not exist (or the principal may not see it): the routed name is wrong for
    /// this account and region.
    Missing(String),
    /// SQS, the network or the credentials failed: try again.
    Failed(String),
}

/// An SQS client and the queue URLs it resolved.
#[derive(Clone)]
pub(crate) struct Sqs {
    pub(crate) client: aws_sdk_sqs::Client,
    urls: Arc<Mutex<HashMap<String, String>>>,
    /// Where the client sends requests, for messages (`region`, or the endpoint).
    pub(crate) shown: String,
}

impl Sqs {
    /// The SDK configuration chain with `[sqs]` on top; `connect_timeout` bounds a connection.
    /// Fails (for good) when no region is configured anywhere or no credentials are found.
    pub(crate) async fn connect(settings: &SqsSettings, connect_timeout: Duration) -> Result<Sqs, SinkError> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(connect_timeout)
            .operation_attempt_timeout(settings.timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts);
        if let Some(region) = &settings.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(url) = &settings.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        let config = loader.load().await;
        let Some(region) = config.region().map(ToString::to_string) else {
            return Err(fatal(
                "no AWS region: set [sqs] region = \"eu-west-1\" (or the AWS_REGION environment variable, or a \
                 profile's region)"
                    .into(),
            ));
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
        Ok(Sqs {
            client: aws_sdk_sqs::Client::new(&config),
            urls: Arc::new(Mutex::new(HashMap::new())),
            shown,
        })
    }

    /// The URL of queue `name`: from the cache, else `GetQueueUrl` (cached when found).
    pub(crate) async fn queue_url(&self, name: &str) -> QueueUrl {
        if let Some(url) = self.urls.lock().expect("queue URL cache").get(name) {
            return QueueUrl::Found(url.clone());
        }
        match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => match out.queue_url {
                Some(url) => {
                    self.urls
                        .lock()
                        .expect("queue URL cache")
                        .insert(name.to_owned(), url.clone());
                    QueueUrl::Found(url)
                }
                None => QueueUrl::Failed(format!("GetQueueUrl of {name:?} answered without a URL")),
            },
            Err(e) => match &e {
                SdkError::ServiceError(s) if matches!(s.err(), GetQueueUrlError::QueueDoesNotExist(_)) => {
                    QueueUrl::Missing(format!(
                        "queue {name:?} does not exist in {} (or the relay's credentials may not see it); create it \
                         (`outbox-relay setup` does not create SQS queues) or route the event elsewhere",
                        self.shown
                    ))
                }
                _ => QueueUrl::Failed(format!("GetQueueUrl of {name:?} failed: {}", words(&e))),
            },
        }
    }

    /// Forgets `name`'s URL (the queue was deleted: the next send resolves it again).
    pub(crate) fn forget(&self, name: &str) {
        self.urls.lock().expect("queue URL cache").remove(name);
    }
}

/// One line for an SDK error: its code and message when SQS answered, else the cause chain.
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

fn fatal(cause: String) -> SinkError {
    SinkError {
        sink: SINK,
        cause,
        transient: false,
    }
}
