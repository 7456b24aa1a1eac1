//! moto in server mode for the AWS sink tests (`scripts/ensure-moto.sh` installs it into
//! `~/.cache/outbox-relay/venv-moto`): each test starts a `moto_server` of its own on a free
//! loopback port ([`Moto::start`], `None` after `needs::missing` where moto is missing),
//! creates its queues with the AWS SDK, and reads them back as [`Received`] records so the
//! Kafka checks (`check_delivered`, `check_order`) apply: topic = the queue name, key = the
//! `key` attribute, payload = the body, headers = every message attribute (`id` first),
//! offset = the position in the order the queue returned the messages.
//!
//! moto keeps everything in memory, and its FIFO deduplication only compares with the messages
//! still in the queue (real SQS remembers a deduplication id for 5 minutes after the message
//! was deleted). So [`Moto::collect`] waits until the queue holds the expected number of
//! messages and only then drains it (receive and delete): nothing is deleted while the relay
//! may still send, and a duplicate the relay sent shows up as a message too many. A test that
//! takes the server away freezes it (SIGSTOP, [`Moto::freeze`]) rather than killing it: a
//! killed moto forgets every queue and message, which would measure moto, not the relay.
//! `MOTO_TRACE=1` prints the count while [`Moto::collect`] waits (moto's FIFO queues are slow).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};

use super::consumer::Received;
use super::process::{send_signal, Watchdog};
use super::util::free_port;

/// The region every test uses (moto accepts any).
pub const REGION: &str = "us-east-1";

/// The credentials the relay and the test client use (moto accepts any).
pub const AWS_ENV: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];

/// `moto_server` from the venv of `scripts/ensure-moto.sh`, if installed.
fn moto_binary() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(home).join(".cache"));
    let bin = cache.join("outbox-relay/venv-moto/bin/moto_server");
    bin.is_file().then_some(bin)
}

/// A `moto_server` of a test's own.
pub struct Moto {
    pub port: u16,
    child: Option<(Child, Watchdog)>,
    pub client: aws_sdk_sqs::Client,
}

impl Moto {
    /// Starts moto on a free port and waits until it answers; `None` where moto is not
    /// installed (after [`super::needs::missing`]: a loud SKIPPING line, a failure under CI).
    pub async fn start(test: &str) -> Option<Moto> {
        let Some(bin) = moto_binary() else {
            super::needs::missing(super::needs::MOTO, test, "");
            return None;
        };
        // Another process may take the port between free_port and moto's bind: try again.
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn moto_server");
            let watchdog = Watchdog::guard(child.id());
            let mut moto = Moto {
                port,
                child: Some((child, watchdog)),
                client: client(&format!("http://127.0.0.1:{port}")),
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if moto.exited() {
                    break;
                }
                if moto.client.list_queues().send().await.is_ok() {
                    return Some(moto);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("moto_server did not start on a free port in 5 attempts");
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|(c, _)| c.try_wait().ok().flatten().is_some())
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The `[sqs]` keys for [`super::RelayConfig::sink`]: this server, [`REGION`].
    pub fn section(&self) -> Vec<(&'static str, String)> {
        vec![("region", REGION.to_owned()), ("endpoint_url", self.endpoint())]
    }

    /// SIGSTOP: the server stops answering (connections hang until the relay's timeouts), its
    /// state kept.
    pub fn freeze(&self) {
        let (c, _) = self.child.as_ref().expect("running");
        assert!(send_signal(c.id(), "STOP"), "SIGSTOP moto");
    }

    /// SIGCONT after [`Moto::freeze`].
    pub fn thaw(&self) {
        let (c, _) = self.child.as_ref().expect("running");
        assert!(send_signal(c.id(), "CONT"), "SIGCONT moto");
    }

    /// Creates a queue (FIFO when `name` ends in `.fifo`); returns its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let mut req = self.client.create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
        }
        req.send()
            .await
            .unwrap_or_else(|e| panic!("create queue {name}: {e:?}"))
            .queue_url()
            .expect("queue URL")
            .to_owned()
    }

    async fn url(&self, name: &str) -> String {
        self.client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .unwrap_or_else(|e| panic!("queue {name}: {e:?}"))
            .queue_url()
            .expect("url")
            .to_owned()
    }

    /// How many messages `name` holds (moto's count is exact).
    pub async fn count(&self, name: &str) -> usize {
        let url = self.url(name).await;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("queue attributes");
        let attrs = out.attributes().cloned().unwrap_or_default();
        let n = |a: QueueAttributeName| attrs.get(&a).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
        n(QueueAttributeName::ApproximateNumberOfMessages)
            + n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
    }

    /// Waits (at most `timeout`) until the queues hold `n` messages together, waits `settle`
    /// more for stragglers (duplicates), then drains them all. Panics when they do not arrive,
    /// with `context()` (the relay's log) in the message.
    pub async fn collect(
        &self,
        names: &[String],
        n: usize,
        timeout: Duration,
        settle: Duration,
        context: impl Fn() -> String,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut have = 0;
            for name in names {
                have += self.count(name).await;
            }
            if have >= n {
                break;
            }
            if std::env::var_os("MOTO_TRACE").is_some() {
                eprintln!("moto trace: {have} of {n}");
            }
            assert!(
                Instant::now() < deadline,
                "queues {names:?} hold {have} of {n} messages after {timeout:?}; {}",
                context()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tokio::time::sleep(settle).await;
        let mut out = Vec::new();
        for name in names {
            out.extend(self.drain(name).await);
        }
        out
    }

    /// Receives and deletes every message of `name`, in the order the queue returns them.
    pub async fn drain(&self, name: &str) -> Vec<Received> {
        let url = self.url(name).await;
        let mut out: Vec<Received> = Vec::new();
        let mut empty = 0;
        while empty < 2 {
            // moto 5.1 reads only the older (deprecated) AttributeNames for system attributes
            // (only for FIFO queues: moto answers a standard queue's with a null
            // MessageDeduplicationId, which the SDK refuses to parse.)
            let mut receive = self
                .client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .visibility_timeout(600)
                .message_attribute_names("All");
            if name.ends_with(".fifo") {
                #[allow(deprecated)]
                {
                    receive = receive
                        .message_system_attribute_names(MessageSystemAttributeName::All)
                        .set_attribute_names(Some(vec![QueueAttributeName::All]));
                }
            }
            let got = receive.send().await.expect("receive");
            let messages = got.messages();
            if messages.is_empty() {
                empty += 1;
                continue;
            }
            empty = 0;
            let mut delete = self.client.delete_message_batch().queue_url(&url);
            for (i, m) in messages.iter().enumerate() {
                let mut headers: Vec<(String, Vec<u8>)> = m
                    .message_attributes()
                    .map(|attrs| attrs.iter().map(|(k, v)| (k.clone(), bytes(v))).collect())
                    .unwrap_or_default();
                headers.sort_by(|a, b| (a.0 != "id", &a.0).cmp(&(b.0 != "id", &b.0)));
                if let Some(attrs) = m.attributes() {
                    for (k, v) in attrs {
                        headers.push((format!("sqs:{}", k.as_str()), v.as_bytes().to_vec()));
                    }
                }
                let key = headers.iter().find(|(k, _)| k == "key").map(|(_, v)| v.clone());
                out.push(Received {
                    topic: name.to_owned(),
                    partition: 0,
                    offset: out.len() as i64,
                    key,
                    payload: m.body().map(|b| b.as_bytes().to_vec()),
                    headers,
                    timestamp_ms: None,
                });
                delete = delete.entries(
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().expect("receipt handle"))
                        .build()
                        .expect("entry"),
                );
            }
            delete.send().await.expect("delete");
        }
        out
    }
}

fn bytes(v: &MessageAttributeValue) -> Vec<u8> {
    match (v.string_value(), v.binary_value()) {
        (Some(s), _) => s.as_bytes().to_vec(),
        (None, Some(b)) => b.as_ref().to_vec(),
        _ => Vec::new(),
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            let _ = send_signal(child.id(), "CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A client of the moto at `endpoint` with the test credentials.
pub fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
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
    aws_sdk_sqs::Client::from_conf(config)
}

// ---- Shared by the AWS sink suites (sink_sqs.rs, sink_sns.rs, sink_kinesis.rs) ----

/// `outbox-relay run` with the test credentials ([`AWS_ENV`]).
pub fn aws_run(config: &super::RelayConfig) -> super::RelayProcess {
    super::RelayProcess::run_with(config, &[], &AWS_ENV)
}

/// [`aws_run`], once streaming started.
pub async fn aws_run_streaming(config: &super::RelayConfig) -> super::RelayProcess {
    let relay = aws_run(config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    relay
}
