//! The SNS client: the AWS SDK's configuration chain (`aws/client.rs`: credentials, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, profiles) with `[sns] region` / `endpoint_url` on top, and each routed
//! topic name resolved to its ARN and cached.
//!
//! **Topic ARNs.** `PublishBatch` takes a topic ARN, the relay routes to a topic name. The name
//! is looked up with `ListTopics` (every page, all names cached at once), never with
//! `CreateTopic`: that call is idempotent but creates what is missing, which would turn a
//! mistyped routed name into a new topic nobody subscribed to, and needs `sns:CreateTopic`.
//! So the relay needs `sns:ListTopics` and `sns:Publish`, nothing else.
//!
//! Invariant: credentials are resolved (never printed) before the sink is handed out; a topic
//! that does not exist is a fact about the routed name, never cached (it may be created any
//! time: the next event for it lists again), like SQS's missing queue.

use std::collections::HashMap;

use aws_config::SdkConfig;

use crate::sink::aws::client::{words, Resolved, SdkClient, ServiceClient};

/// An SNS client and the topic ARNs it resolved (`[sns]` on the SDK's chain).
pub(crate) type SnsClient = ServiceClient<aws_sdk_sns::Client>;

impl SdkClient for aws_sdk_sns::Client {
    fn of(config: &SdkConfig) -> Self {
        aws_sdk_sns::Client::new(config)
    }
}

/// The topic name of an ARN (`arn:aws:sns:eu-west-1:123456789012:orders.fifo` → `orders.fifo`).
pub(crate) fn topic_name(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}

impl SnsClient {
    /// Every topic visible to the credentials (`ListTopics`, all pages), by name.
    pub(crate) async fn list(&self) -> Result<HashMap<String, String>, String> {
        let mut found = HashMap::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_topics()
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| format!("ListTopics failed: {}", words(&e)))?;
            for topic in out.topics() {
                if let Some(arn) = topic.topic_arn() {
                    found.insert(topic_name(arn).to_owned(), arn.to_owned());
                }
            }
            match out.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => return Ok(found),
            }
        }
    }

    /// The ARN of topic `name`: from the cache, else `ListTopics` (every name found is cached).
    pub(crate) async fn topic_arn(&self, name: &str) -> Resolved {
        if let Some(arn) = self.names.get(name) {
            return Resolved::Found(arn);
        }
        match self.list().await {
            Err(cause) => Resolved::Failed(cause),
            Ok(found) => {
                let arn = found.get(name).cloned();
                self.names.extend(found);
                match arn {
                    Some(arn) => Resolved::Found(arn),
                    None => Resolved::Missing(format!(
                        "topic {name:?} does not exist in {} (or the relay's credentials may not list it: it needs \
                         sns:ListTopics and sns:Publish); create it (`outbox-relay setup` does not create SNS topics) \
                         or route the event elsewhere",
                        self.shown
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_name_is_the_arn_s_last_part() {
        assert_eq!(
            topic_name("arn:aws:sns:eu-west-1:123456789012:orders.fifo"),
            "orders.fifo"
        );
        assert_eq!(topic_name("plain"), "plain");
    }
}
