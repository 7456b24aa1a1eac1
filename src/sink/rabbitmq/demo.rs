//! RabbitMQ's half of `outbox-relay demo`: the relay publishes to a running broker
//! (`--sink-url`), through an exchange of the run's own that `setup` declares. The consumer is
//! an exclusive, auto-delete queue bound to that exchange with the demo's routing key, declared before the relay starts (a message no queue is bound
//! for is a bad event to the relay). Counts by `message_id` (or the `id` header). RabbitMQ
//! reports no count of what was published through an exchange, so `published` is what was read.
//! At the end it deletes the exchange (the queue goes with its connection).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};

use super::config::RabbitMqSettings;
use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    bounded, cleaned_up, container, parse_id, start, toml_string, DemoConfig, DemoConsumer, DemoRun, DemoTarget,
    Server, SinkDemo, Starting, Tally, BROKER_TIMEOUT,
};

const TIMEOUT: Duration = BROKER_TIMEOUT;
const BROKER: &str = "RabbitMQ";
const IDLE: Duration = Duration::from_millis(10);

pub(crate) struct RabbitMqConsumer {
    connection: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
}

impl RabbitMqConsumer {
    /// Connects and binds the queue; call it before the relay publishes.
    pub(crate) async fn new(url: &str, exchange: &str, routing_key: &str) -> Result<RabbitMqConsumer, String> {
        let properties = ConnectionProperties::default()
            .with_connection_name("outbox-relay-demo".into())
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio::current());
        let connection = bounded(BROKER, "connecting", Connection::connect(url, properties)).await?;
        let channel = bounded(BROKER, "opening a channel", connection.create_channel()).await?;
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let queue = bounded(
            BROKER,
            "declaring the demo queue",
            channel.queue_declare("", options, FieldTable::default()),
        )
        .await?
        .name()
        .as_str()
        .to_owned();
        bounded(
            BROKER,
            "binding the demo queue",
            channel.queue_bind(
                &queue,
                exchange,
                routing_key,
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        Ok(RabbitMqConsumer {
            connection,
            channel,
            exchange: exchange.to_owned(),
            queue,
        })
    }
}

impl DemoConsumer for RabbitMqConsumer {
    /// Reads until `stop`, then deletes the exchange; returns what it cleaned up.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        while !stop.load(Ordering::Relaxed) {
            match bounded(
                BROKER,
                "reading",
                self.channel.basic_get(&self.queue, BasicGetOptions { no_ack: true }),
            )
            .await
            {
                Ok(Some(message)) => {
                    let d = &message.delivery;
                    let id = d
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|m| parse_id(m.as_str().as_bytes()))
                        .or_else(|| {
                            d.properties
                                .headers()
                                .as_ref()
                                .and_then(|h| h.inner().get("id"))
                                .and_then(|v| match v {
                                    AMQPValue::LongString(s) => parse_id(s.as_bytes()),
                                    _ => None,
                                })
                        });
                    tally.record(id, Some(&d.data));
                }
                Ok(None) => tokio::time::sleep(IDLE).await,
                Err(e) => {
                    eprintln!("demo: the RabbitMQ consumer stopped: {e}");
                    break;
                }
            }
        }
        let deleted = bounded(
            BROKER,
            "deleting the exchange",
            self.channel
                .exchange_delete(&self.exchange, ExchangeDeleteOptions::default()),
        )
        .await;
        let _ = tokio::time::timeout(TIMEOUT, self.connection.close(200, "demo done")).await;
        vec![cleaned_up(
            deleted,
            format!(
                "RabbitMQ exchange {} deleted (queue {} went with the connection)",
                self.exchange, self.queue
            ),
        )]
    }
}

/// RabbitMQ's answers to the demo.
pub(crate) const DEMO: SinkDemo = SinkDemo::new(Server::running("amqp://guest:guest@127.0.0.1:5672/%2f"), open);

fn open(url: Option<String>, run: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(RabbitMqTarget {
        url: url.unwrap_or_default(),
        exchange: container(run),
    }))
}

/// The broker and the run's exchange.
struct RabbitMqTarget {
    url: String,
    exchange: String,
}

impl DemoTarget for RabbitMqTarget {
    /// `setup` declares the run's exchange; the demo's queue binds the routed topic to it.
    fn config(&self) -> DemoConfig {
        DemoConfig {
            keys: format!("url = {}\nexchange = \"{}\"\n", toml_string(&self.url), self.exchange),
            route: None,
        }
    }

    /// The URL as the settings print it: any password masked.
    fn describe(&self, sink: &SinkSettings) -> String {
        match sink.section::<RabbitMqSettings>() {
            Some(r) => format!("RabbitMQ {} (exchange {})", r.url, r.exchange),
            None => "RabbitMQ".to_owned(),
        }
    }

    /// Started before the relay: the queue must be bound before anything is published.
    fn consume<'a>(&'a self, topic: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(RabbitMqConsumer::new(&self.url, &self.exchange, topic), tally, stop)
    }
}
