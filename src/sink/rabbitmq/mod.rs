//! The RabbitMQ sink (AMQP 0-9-1, lapin on the caller's tokio runtime): every record is
//! published to one durable topic exchange (`[rabbitmq] exchange`) with its routed destination
//! as the routing key, `mandatory`, persistent, and completed from its publisher confirm.
//!
//! * [`publisher`]: the adapter — a task that owns the connection and publishes, at most one
//!   unconfirmed message per aggregate key (the order rule below), and the confirm → completion
//!   mapping (ack, ack with a `basic.return` = unroutable = refused, nack = transient).
//! * [`prepare`] (`setup`: declares the exchange) and [`probe`] (`status`).
//!
//! Invariant: like every adapter this one knows nothing of PostgreSQL or WAL positions; it
//! imports only `config` and the sink interface. docs/sink-rabbitmq.md has the guarantees.

pub(crate) mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod publisher;

use std::time::Duration;

use lapin::options::ExchangeDeclareOptions;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};

use crate::config::secret::redact_connection_string;
use crate::config::sink::SinkSectionSpec;
#[cfg(feature = "demo")]
use crate::sink::demo::SinkDemo;
use crate::sink::plugin::{ClientLogTarget, SinkContext, SinkPlugin};
use crate::sink::{boxed, Created, ExactlyOnce, SinkError, SinkLimits, SinkTag};
use config::{validate_routing_key, RabbitMqSettings, SINK};

/// RabbitMQ 3.10's default `max_message_size` (128 MiB): a larger body closes the channel.
pub(crate) const MAX_MESSAGE_BYTES: usize = 128 * 1024 * 1024;

/// How long connecting (TCP, TLS, AMQP handshake) may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The RabbitMQ sink (`[sink] kind = "rabbitmq"`).
pub(crate) struct RabbitMq;

impl SinkPlugin for RabbitMq {
    type Config = RabbitMqSettings;

    const SPEC: &'static dyn SinkSectionSpec = &config::SECTION;

    #[cfg(feature = "demo")]
    const DEMO: &'static SinkDemo = &demo::DEMO;

    const MESSAGING_SYSTEM: &'static str = "rabbitmq";

    /// lapin logs every message RabbitMQ returns (unroutable), body included: the relay
    /// reports those as bad events itself, without the payload — never shown, even at DEBUG.
    const LOG_TARGETS: &'static [ClientLogTarget] = &[
        ClientLogTarget::debug("lapin"),
        ClientLogTarget::at("lapin::returned_messages", "error"),
    ];

    /// AMQP's routing-key rule (a short string) and the broker's default largest message.
    fn limits(&self, _: &RabbitMqSettings) -> SinkLimits {
        SinkLimits {
            check_name: validate_routing_key,
            max_message_bytes: MAX_MESSAGE_BYTES,
        }
    }

    fn exactly_once(&self, _: &RabbitMqSettings) -> ExactlyOnce {
        ExactlyOnce::Unsupported(NO_EXACTLY_ONCE.into())
    }

    /// What `outbox-relay setup` does for RabbitMQ: declares `[rabbitmq] exchange` as a durable topic
    /// exchange (idempotent). An exchange of that name with another type or durability is refused
    /// with the fix, never changed. Queues and bindings are the consumers' (docs/sink-rabbitmq.md).
    async fn prepare(&self, settings: &RabbitMqSettings) -> Result<Vec<String>, SinkError> {
        let (connection, channel) = connect(settings).await?;
        let existed = check_exchange(&channel, settings).await.is_ok();
        // A failed passive declare closed that channel.
        let channel = if existed {
            channel
        } else {
            connection
                .create_channel()
                .await
                .map_err(|e| err(format!("cannot open a channel: {}", words(&e)), true))?
        };
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = channel
            .exchange_declare(&settings.exchange, ExchangeKind::Topic, durable, FieldTable::default())
            .await
            .map_err(|e| match amqp_error(&e).map(|p| p.kind()) {
                Some(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)) => err(
                    format!(
                        "exchange {:?} already exists with another type or settings ({}): the relay needs a durable \
                         topic exchange; delete it (rabbitmqctl delete_exchange / rabbitmqadmin delete exchange \
                         name={}) if nothing else uses it, or choose another rabbitmq.exchange",
                        settings.exchange,
                        words(&e),
                        settings.exchange
                    ),
                    false,
                ),
                Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) => err(
                    format!(
                        "the user in rabbitmq.url may not declare exchange {:?} ({}): grant it configure permission, \
                         or have an administrator declare a durable topic exchange of that name",
                        settings.exchange,
                        words(&e)
                    ),
                    false,
                ),
                _ => err(
                    format!("cannot declare exchange {:?}: {}", settings.exchange, words(&e)),
                    true,
                ),
            });
        close(connection).await;
        declared?;
        Ok(vec![if existed {
            format!(
                "exchange {:?} on {} exists as a durable topic exchange",
                settings.exchange, settings.url
            )
        } else {
            format!(
                "exchange {:?} on {} declared (durable, topic); bind queues to it (docs/sink-rabbitmq.md)",
                settings.exchange, settings.url
            )
        }])
    }

    /// What `outbox-relay status` shows for RabbitMQ: the broker answers, and the exchange exists.
    async fn probe(&self, settings: &RabbitMqSettings) -> Result<String, SinkError> {
        let (connection, channel) = connect(settings).await?;
        let checked = check_exchange(&channel, settings).await;
        close(connection).await;
        checked?;
        Ok(format!(
            "{} reachable, exchange {:?} present",
            settings.url, settings.exchange
        ))
    }

    async fn create<Tag: SinkTag>(&self, config: &RabbitMqSettings, cx: &SinkContext) -> Created<Tag> {
        Ok(boxed(
            publisher::Publisher::create(config, cx.max_in_flight, cx.cloudevents).await?,
        ))
    }
}

/// Why the relay cannot offer exactly-once with this sink (the config error's words).
pub(crate) const NO_EXACTLY_ONCE: &str = "AMQP 0-9-1 has no publisher deduplication: a message replayed after a crash \
     or an outage is stored again, so RabbitMQ consumers must deduplicate on the message_id (the event id); use \
     relay.delivery = \"at-least-once\"";

fn err(cause: String, transient: bool) -> SinkError {
    SinkError {
        sink: SINK,
        cause,
        transient,
    }
}

/// The broker's reply code in a lapin error, if it is an AMQP error.
fn amqp_error(e: &lapin::Error) -> Option<&lapin::protocol::AMQPError> {
    match e.kind() {
        ErrorKind::ProtocolError(p) => Some(p),
        _ => None,
    }
}

/// A lapin error as text, passwords masked (lapin's own words may include the URI).
fn words(e: &lapin::Error) -> String {
    redact_connection_string(&e.to_string())
}

/// Connects and opens one channel. Unreachable (refused, reset, timed out) is transient; a
/// refused login or vhost is the operator's to fix.
pub(crate) async fn connect(settings: &RabbitMqSettings) -> Result<(Connection, Channel), SinkError> {
    let shown = settings.url.to_string();
    let properties = ConnectionProperties::default()
        .with_connection_name("outbox-relay".into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let connection =
        match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(settings.url.expose(), properties)).await {
            Err(_) => {
                return Err(err(
                    format!(
                        "cannot reach {shown} within {}s: check that the broker runs and rabbitmq.url",
                        CONNECT_TIMEOUT.as_secs()
                    ),
                    true,
                ))
            }
            Ok(Err(e)) => return Err(connect_error(&e, &shown)),
            Ok(Ok(c)) => c,
        };
    let channel = connection.create_channel().await.map_err(|e| {
        err(
            format!("connected to {shown} but cannot open a channel: {}", words(&e)),
            true,
        )
    })?;
    Ok((connection, channel))
}

fn connect_error(e: &lapin::Error, shown: &str) -> SinkError {
    match amqp_error(e).map(|p| p.kind()) {
        Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) => err(
            format!(
                "{shown} refused the login ({}): check the user and password in rabbitmq.url",
                words(e)
            ),
            false,
        ),
        Some(AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED | AMQPHardError::INVALIDPATH)) => err(
            format!(
                "{shown} refused the virtual host ({}): check the vhost at the end of rabbitmq.url (URL-encoded, \
                 %2f for \"/\") and the user's permissions on it",
                words(e)
            ),
            false,
        ),
        _ => err(
            format!(
                "cannot connect to {shown}: {}. Check that the broker runs and rabbitmq.url",
                words(e)
            ),
            true,
        ),
    }
}

/// Checks that the exchange exists (a passive declare). A missing exchange closes the channel.
pub(crate) async fn check_exchange(channel: &Channel, settings: &RabbitMqSettings) -> Result<(), SinkError> {
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(&settings.exchange, ExchangeKind::Topic, passive, FieldTable::default())
        .await
        .map_err(|e| match amqp_error(&e).map(|p| p.kind()) {
            Some(AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)) => err(
                format!(
                    "exchange {:?} does not exist on {}: run `outbox-relay setup` (it declares the exchange as a \
                     durable topic exchange), or check rabbitmq.exchange",
                    settings.exchange, settings.url
                ),
                false,
            ),
            Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) => err(
                format!(
                    "the user in rabbitmq.url may not use exchange {:?}: {}",
                    settings.exchange,
                    words(&e)
                ),
                false,
            ),
            _ => err(
                format!("cannot check exchange {:?}: {}", settings.exchange, words(&e)),
                true,
            ),
        })
}

async fn close(connection: Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(2), connection.close(200, "outbox-relay done")).await;
}

#[cfg(test)]
pub(crate) mod tests;
