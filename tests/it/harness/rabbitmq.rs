//! RabbitMQ for the sink tests: the shared broker at 127.0.0.1:5672 (guest/guest, vhost `/`,
//! which CI starts), a unique durable topic exchange per test with a durable queue bound to it,
//! and reading that queue back as [`Received`] records so the Kafka checks
//! ([`check_delivered`](super::checks::check_delivered), [`check_order`](super::checks::check_order))
//! apply: topic = routing key, key = the `key` header, payload = body, headers = the AMQP
//! headers that are byte strings (plus the `message_id`, `delivery_mode` and `content_type`
//! properties under those names), timestamp = the AMQP timestamp in ms.
//! Also [`AmqpProxy`], a TCP proxy that can cut every connection to the broker for a while.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::consumer::Received;
use super::util::unique_name;

/// The shared broker.
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const RABBITMQ_ADDR: &str = "127.0.0.1:5672";

pub async fn amqp_connect(url: &str) -> (Connection, Channel) {
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let connection = tokio::time::timeout(Duration::from_secs(10), Connection::connect(url, props))
        .await
        .expect("RabbitMQ connect in time")
        .expect("RabbitMQ at 127.0.0.1:5672 (guest/guest)");
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
}

/// A unique exchange with one durable queue bound by `bindings`; what was read so far.
pub struct RabbitFixture {
    pub exchange: String,
    pub queue: String,
    connection: Connection,
    channel: Channel,
    received: Mutex<Vec<Received>>,
}

impl RabbitFixture {
    pub async fn new(bindings: &[&str]) -> RabbitFixture {
        RabbitFixture::new_at(RABBITMQ_URL, bindings).await
    }

    /// On the broker at `url` (a [`PrivateRabbit`]).
    pub async fn new_at(url: &str, bindings: &[&str]) -> RabbitFixture {
        let (connection, channel) = amqp_connect(url).await;
        let exchange = unique_name("it-rmq-x");
        let queue = unique_name("it-rmq-q");
        channel
            .exchange_declare(
                &exchange,
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        channel
            .queue_declare(
                &queue,
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare queue");
        for pattern in bindings {
            channel
                .queue_bind(
                    &queue,
                    &exchange,
                    pattern,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind queue");
        }
        RabbitFixture {
            exchange,
            queue,
            connection,
            channel,
            received: Mutex::new(Vec::new()),
        }
    }

    /// Binds the queue to the exchange by `pattern` too.
    pub async fn bind(&self, pattern: &str) {
        self.channel
            .queue_bind(
                &self.queue,
                &self.exchange,
                pattern,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
    }

    /// Reads whatever the queue holds now; every record read so far.
    pub async fn drain(&self) -> Vec<Received> {
        while let Some(m) = self
            .channel
            .basic_get(&self.queue, BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let mut received = self.received.lock().unwrap();
            let offset = received.len() as i64;
            received.push(to_received(&m.delivery, offset));
        }
        self.received.lock().unwrap().clone()
    }

    /// Connects again (after the broker restarted).
    pub async fn reconnect(&mut self, url: &str) {
        let (connection, channel) = amqp_connect(url).await;
        self.connection = connection;
        self.channel = channel;
    }

    /// Messages waiting in the queue.
    pub async fn count(&self) -> u32 {
        self.channel
            .queue_declare(
                &self.queue,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|q| q.message_count())
            .unwrap_or(0)
    }

    /// Reads the queue until `expected` records arrived in all (then one more second for
    /// stragglers and duplicates) or `timeout` passed; returns everything read so far.
    pub async fn collect(&self, expected: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut grace: Option<Instant> = None;
        loop {
            let got = self
                .channel
                .basic_get(&self.queue, BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get");
            let now = Instant::now();
            match got {
                Some(m) => {
                    let mut received = self.received.lock().unwrap();
                    let offset = received.len() as i64;
                    received.push(to_received(&m.delivery, offset));
                }
                None => {
                    if now >= deadline || grace.is_some_and(|g| now >= g) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if grace.is_none() && self.received.lock().unwrap().len() >= expected {
                grace = Some(now + Duration::from_secs(1));
            }
            if now >= deadline + Duration::from_secs(5) {
                break;
            }
        }
        self.received.lock().unwrap().clone()
    }

    pub async fn clean(self) {
        let _ = self
            .channel
            .queue_delete(&self.queue, QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(&self.exchange, ExchangeDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "").await;
    }
}

fn to_received(d: &lapin::message::Delivery, offset: i64) -> Received {
    let p = &d.properties;
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    let mut key = None;
    if let Some(table) = p.headers() {
        for (name, value) in table.inner() {
            if let AMQPValue::LongString(s) = value {
                if name.as_str() == "key" {
                    key = Some(s.as_bytes().to_vec());
                }
                headers.push((name.as_str().to_owned(), s.as_bytes().to_vec()));
            }
        }
    }
    if let Some(id) = p.message_id() {
        headers.push(("message_id".into(), id.as_str().as_bytes().to_vec()));
    }
    if let Some(mode) = p.delivery_mode() {
        headers.push(("delivery_mode".into(), mode.to_string().into_bytes()));
    }
    if let Some(ct) = p.content_type() {
        headers.push(("content_type".into(), ct.as_str().as_bytes().to_vec()));
    }
    Received {
        topic: d.routing_key.as_str().to_owned(),
        partition: 0,
        offset,
        key,
        payload: Some(d.data.clone()),
        headers,
        timestamp_ms: p.timestamp().map(|s| s as i64 * 1000),
    }
}

/// A TCP proxy to the broker whose [`cut`](Self::cut) drops every connection and refuses new
/// ones (accepts and closes them) until [`restore`](Self::restore): a broker outage as the relay
/// sees it, without stopping the shared broker.
pub struct AmqpProxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl AmqpProxy {
    pub async fn start(upstream: &'static str) -> AmqpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (up2, conns2) = (Arc::clone(&up), Arc::clone(&conns));
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(Ok(mut outbound)) =
                        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns2.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        AmqpProxy {
            port,
            up,
            conns,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for AmqpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// The broker's start script.
const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// A RabbitMQ node of the test's own (its own node name, ports, data and logs in a temporary
/// directory, no plugins) that the test may stop and start again, keeping its data; the shared
/// broker is never touched. Killed when dropped, and by a watchdog if the test process dies.
pub struct PrivateRabbit {
    pub port: u16,
    dist_port: u16,
    node: String,
    dir: tempfile::TempDir,
    child: Option<(std::process::Child, super::process::Watchdog)>,
}

impl PrivateRabbit {
    /// Starts a node and waits (up to 90 s) until it accepts AMQP; `None`, with a loud message,
    /// where the broker is not installed.
    pub async fn start() -> Option<PrivateRabbit> {
        if !std::path::Path::new(RABBITMQ_SERVER).exists() {
            super::needs::missing(super::needs::RABBITMQ_SERVER, "", "no RabbitMQ node of the test's own");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").unwrap();
        let mut node = PrivateRabbit {
            port: super::util::free_port(),
            dist_port: super::util::free_port(),
            node: format!("it{}x{}@localhost", std::process::id(), super::util::free_port()),
            dir,
            child: None,
        };
        node.boot().await;
        Some(node)
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("out.txt")).unwrap_or_default();
        text.lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts (again) on the same node name, ports and data directory.
    pub async fn boot(&mut self) {
        let d = self.dir.path();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("out.txt"))
            .unwrap();
        let child = std::process::Command::new(RABBITMQ_SERVER)
            .current_dir(d)
            .env("HOME", d)
            // The VM in place of the script (-noinput), so signals and the watchdog reach it.
            .env("RUNNING_UNDER_SYSTEMD", "true")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("none"))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start rabbitmq-server");
        let watchdog = super::process::Watchdog::guard(child.id());
        self.child = Some((child, watchdog));
        let url = self.url();
        let up = super::util::wait_until(Duration::from_secs(90), Duration::from_millis(500), || {
            let url = url.clone();
            async move {
                let props = ConnectionProperties::default()
                    .with_executor(tokio_executor_trait::Tokio::current())
                    .with_reactor(tokio_reactor_trait::Tokio::current());
                match tokio::time::timeout(Duration::from_secs(5), Connection::connect(&url, props)).await {
                    Ok(Ok(c)) => {
                        let _ = c.close(200, "").await;
                        true
                    }
                    _ => false,
                }
            }
        })
        .await;
        assert!(up, "private RabbitMQ node did not start in 90 s:\n{}", self.log_tail());
    }

    /// Stops the node (SIGTERM: a clean shutdown; SIGKILL after 30 s).
    pub async fn stop(&mut self) {
        if let Some((mut child, _watchdog)) = self.child.take() {
            super::process::send_signal(child.id(), "TERM");
            if super::process::wait_child(&mut child, Duration::from_secs(30))
                .await
                .is_none()
            {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
