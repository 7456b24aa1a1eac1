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

use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;

use super::config::SqsSettings;
use super::SINK;
use crate::sink::aws;
pub(crate) use crate::sink::aws::words;
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
    /// The SDK configuration chain with `[sqs]` on top (`sink/aws.rs`); `connect_timeout` bounds a
    /// connection. Fails (for good) when no region is configured anywhere or no credentials are
    /// found.
    pub(crate) async fn connect(settings: &SqsSettings, connect_timeout: Duration) -> Result<Sqs, SinkError> {
        let aws::Connected { config, shown } = aws::connect(aws::Endpoint {
            sink: SINK,
            section: "sqs",
            region: settings.region.as_deref(),
            endpoint_url: settings.endpoint_url.as_deref(),
            attempt_timeout: settings.timeout,
            connect_timeout,
        })
        .await?;
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
