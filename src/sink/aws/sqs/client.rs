//! The SQS client: the AWS SDK's configuration chain (`aws/client.rs`: credentials,
//! `AWS_REGION`, `AWS_ENDPOINT_URL`, profiles) with `[sqs] region` / `endpoint_url` on top, and
//! each queue's URL resolved once (`GetQueueUrl`) and cached.
//!
//! Invariant: a queue that does not exist is a fact about the routed name, never cached (it may
//! be created any time).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;

use super::config::SqsSettings;
use crate::sink::aws::client::{words, Connected, Names, Resolved};
use crate::sink::SinkError;

/// An SQS client and the queue URLs it resolved.
#[derive(Clone)]
pub(crate) struct SqsClient {
    pub(crate) client: aws_sdk_sqs::Client,
    urls: Arc<Names>,
    /// Where the client sends requests, for messages (`region`, or the endpoint).
    pub(crate) shown: String,
}

impl SqsClient {
    /// The SDK configuration chain with `[sqs]` on top; `connect_timeout` bounds a connection.
    /// Fails (for good) when no region is configured anywhere or no credentials are found.
    pub(crate) async fn connect(settings: &SqsSettings, connect_timeout: Duration) -> Result<SqsClient, SinkError> {
        let Connected { config, shown } = settings.connect(connect_timeout).await?;
        Ok(SqsClient {
            client: aws_sdk_sqs::Client::new(&config),
            urls: Arc::default(),
            shown,
        })
    }

    /// The URL of queue `name`: from the cache, else `GetQueueUrl` (cached when found).
    pub(crate) async fn queue_url(&self, name: &str) -> Resolved {
        if let Some(url) = self.urls.get(name) {
            return Resolved::Found(url);
        }
        match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => match out.queue_url {
                Some(url) => {
                    self.urls.extend([(name.to_owned(), url.clone())]);
                    Resolved::Found(url)
                }
                None => Resolved::Failed(format!("GetQueueUrl of {name:?} answered without a URL")),
            },
            Err(e) => match &e {
                SdkError::ServiceError(s) if matches!(s.err(), GetQueueUrlError::QueueDoesNotExist(_)) => {
                    Resolved::Missing(format!(
                        "queue {name:?} does not exist in {} (or the relay's credentials may not see it); create it \
                         (`outbox-relay setup` does not create SQS queues) or route the event elsewhere",
                        self.shown
                    ))
                }
                _ => Resolved::Failed(format!("GetQueueUrl of {name:?} failed: {}", words(&e))),
            },
        }
    }

    /// Forgets `name`'s URL (the queue was deleted: the next send resolves it again).
    pub(crate) fn forget(&self, name: &str) {
        self.urls.forget(name);
    }
}
