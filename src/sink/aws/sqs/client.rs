//! The SQS client: the AWS SDK's configuration chain (`aws/client.rs`: credentials,
//! `AWS_REGION`, `AWS_ENDPOINT_URL`, profiles) with `[sqs] region` / `endpoint_url` on top, and
//! each queue's URL resolved once (`GetQueueUrl`) and cached.
//!
//! Invariant: a queue that does not exist is a fact about the routed name, never cached (it may
//! be created any time).

use aws_config::SdkConfig;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;

use crate::sink::aws::client::{words, Resolved, SdkClient, ServiceClient};

/// An SQS client and the queue URLs it resolved (`[sqs]` on the SDK's chain).
pub(crate) type SqsClient = ServiceClient<aws_sdk_sqs::Client>;

impl SdkClient for aws_sdk_sqs::Client {
    fn of(config: &SdkConfig) -> Self {
        aws_sdk_sqs::Client::new(config)
    }
}

impl SqsClient {
    /// The URL of queue `name`: from the cache, else `GetQueueUrl` (cached when found).
    pub(crate) async fn queue_url(&self, name: &str) -> Resolved {
        if let Some(url) = self.names.get(name) {
            return Resolved::Found(url);
        }
        match self.client.get_queue_url().queue_name(name).send().await {
            Ok(out) => match out.queue_url {
                Some(url) => {
                    self.names.extend([(name.to_owned(), url.clone())]);
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
}
