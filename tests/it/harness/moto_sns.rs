//! SNS on the tests' moto (`harness/moto.rs`): a topic and its subscriber, an SQS queue of the
//! same name subscribed with raw message delivery (the body is the published message, the
//! message attributes are the published ones; a FIFO topic forwards its message group and
//! deduplication id). The SNS suite reads the queue back with [`Moto::collect`] /
//! [`Moto::drain`], so a record's `topic` is the routed topic's name.

use aws_sdk_sqs::types::QueueAttributeName;

use super::moto::{Moto, REGION};

/// An SNS client of the moto at `endpoint` with the test credentials.
pub fn sns_client(endpoint: &str) -> aws_sdk_sns::Client {
    let config = aws_sdk_sns::Config::builder()
        .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
        .region(aws_sdk_sns::config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_sns::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build();
    aws_sdk_sns::Client::from_conf(config)
}

impl Moto {
    /// Creates topic `name` (FIFO when it ends in `.fifo`) and a queue of the same name (FIFO
    /// likewise) subscribed to it with raw message delivery; returns the topic's ARN.
    pub async fn create_topic_with_queue(&self, name: &str) -> String {
        let sns = sns_client(&self.endpoint());
        let mut req = sns.create_topic().name(name);
        if name.ends_with(".fifo") {
            req = req.attributes("FifoTopic", "true");
        }
        let topic = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("create topic {name}: {e:?}"))
            .topic_arn()
            .expect("topic ARN")
            .to_owned();
        let url = self.create_queue(name).await;
        let queue_arn = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("queue attributes")
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .expect("queue ARN");
        sns.subscribe()
            .topic_arn(&topic)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .unwrap_or_else(|e| panic!("subscribe {name}: {e:?}"));
        topic
    }
}
