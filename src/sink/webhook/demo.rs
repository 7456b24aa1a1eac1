//! The webhook's half of `outbox-relay demo` (`demo --sink webhook`): the demo runs its own
//! receiver, an HTTP endpoint on 127.0.0.1 in this process, the relay's `[webhook] url`, written as a receiver should be — it verifies each
//! request's Standard Webhooks signature (HMAC-SHA256 of `id.timestamp.body` with the run's
//! secret, the timestamp within five minutes), deduplicates on `webhook-id` (the event id), and
//! answers `204` for a verified event (a duplicate too), `401` for a bad signature. Verified
//! first deliveries are the demo's consumed events; the summary line says how many requests
//! came, how many were duplicates and how many failed verification.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;

use crate::config::sink::SinkSettings;
use crate::sink::demo::{
    parse_id, start, DemoConfig, DemoConsumer, DemoRun, DemoTarget, Server, SinkDemo, Starting, Tally,
};

/// The largest clock difference a signature's timestamp may have (the libraries' default).
const TOLERANCE_S: u64 = 300;

/// The receiver's socket and the run's secret, made before the relay's settings (which name
/// both).
pub(crate) struct Endpoint {
    listener: std::net::TcpListener,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({:?}, secret ********)", self.listener.local_addr().ok())
    }
}

impl Endpoint {
    /// Binds a free port of 127.0.0.1 and makes a random 32-byte secret.
    pub(crate) fn bind() -> Result<Endpoint, String> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding the webhook receiver: {e}"))?;
        let mut secret = vec![0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| "webhook receiver: no randomness for the secret".to_owned())?;
        Ok(Endpoint { listener, secret })
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn base_url(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| format!("http://{a}"))
            .unwrap_or_default()
    }

    /// The secret as `[webhook] secret` takes it.
    pub(crate) fn whsec(&self) -> String {
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(&self.secret)
        )
    }
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    duplicates: AtomicU64,
    unverified: AtomicU64,
}

pub(crate) struct WebhookConsumer {
    listener: tokio::net::TcpListener,
    key: ring::hmac::Key,
}

impl WebhookConsumer {
    pub(crate) fn new(endpoint: &Endpoint) -> Result<WebhookConsumer, String> {
        let std_listener = endpoint
            .listener
            .try_clone()
            .map_err(|e| format!("the webhook receiver's socket: {e}"))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| format!("the webhook receiver's socket: {e}"))?;
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .map_err(|e| format!("the webhook receiver's socket: {e}"))?;
        Ok(WebhookConsumer {
            listener,
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &endpoint.secret),
        })
    }
}

impl DemoConsumer for WebhookConsumer {
    /// Serves until `stop`; returns the receiver's summary line.
    async fn run(self, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Vec<String> {
        let counts = Arc::new(Counts::default());
        let seen = Arc::new(Mutex::new(HashSet::<String>::new()));
        let key = Arc::new(self.key);
        let app = {
            let (counts, tally) = (Arc::clone(&counts), Arc::clone(&tally));
            axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
                let (counts, tally, seen, key) = (
                    Arc::clone(&counts),
                    Arc::clone(&tally),
                    Arc::clone(&seen),
                    Arc::clone(&key),
                );
                async move {
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    let Some(id) = verified(&key, &headers, &body) else {
                        counts.unverified.fetch_add(1, Ordering::Relaxed);
                        return StatusCode::UNAUTHORIZED;
                    };
                    if !seen.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone()) {
                        counts.duplicates.fetch_add(1, Ordering::Relaxed);
                        return StatusCode::NO_CONTENT;
                    }
                    tally.published_one();
                    tally.record(parse_id(id.as_bytes()), Some(&body));
                    StatusCode::NO_CONTENT
                }
            })
        };
        let stopped = async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let served = axum::serve(self.listener, app).with_graceful_shutdown(stopped).await;
        let line = format!(
            "webhook receiver stopped: {} requests, {} duplicates (acknowledged, not counted twice), {} failed \
             signature verification",
            counts.requests.load(Ordering::Relaxed),
            counts.duplicates.load(Ordering::Relaxed),
            counts.unverified.load(Ordering::Relaxed)
        );
        vec![match served {
            Ok(()) => line,
            Err(e) => format!("FAILED: the webhook receiver: {e}"),
        }]
    }
}

/// The webhook's answers to the demo.
pub(crate) const DEMO: SinkDemo =
    SinkDemo::new(Server::Own("receiver"), open).help("An HTTP receiver of the demo's own");

/// Binds the receiver and makes the run's secret.
fn open(_: Option<String>, _: &DemoRun) -> Result<Box<dyn DemoTarget>, String> {
    Ok(Box::new(Endpoint::bind()?))
}

impl DemoTarget for Endpoint {
    /// The demo's own receiver; each event's topic is the last path segment.
    fn config(&self) -> DemoConfig {
        DemoConfig {
            keys: format!(
                "url = \"{}/hooks/${{topic}}\"\nsecret = \"{}\"\n",
                self.base_url(),
                self.whsec()
            ),
            route: None,
        }
    }

    fn describe(&self, _: &SinkSettings) -> String {
        format!(
            "the demo's webhook receiver {} (every request's signature verified)",
            self.base_url()
        )
    }

    fn consume<'a>(&'a self, _: &'a str, tally: Arc<dyn Tally>, stop: Arc<AtomicBool>) -> Starting<'a> {
        start(async { WebhookConsumer::new(self) }, tally, stop)
    }
}

/// The event id of a request whose Standard Webhooks signature verifies with `key` (one of its
/// space-separated `v1,` signatures matches, its timestamp within [`TOLERANCE_S`]).
fn verified(key: &ring::hmac::Key, headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (id, timestamp, signatures) = (
        header("webhook-id")?,
        header("webhook-timestamp")?,
        header("webhook-signature")?,
    );
    let sent: u64 = timestamp.parse().ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    if now.abs_diff(sent) > TOLERANCE_S {
        return None;
    }
    let mut signed = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    signed.extend_from_slice(id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(timestamp.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    signatures
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .any(|tag| ring::hmac::verify(key, &signed, &tag).is_ok())
        .then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_the_specifications_example_and_refuses_a_changed_body() {
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        let body = br#"{"test": 2432232314}"#;
        let mut signed = format!("msg_1.{now}.").into_bytes();
        signed.extend_from_slice(body);
        let tag = base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, &signed).as_ref());
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        headers.insert("webhook-timestamp", now.parse().unwrap());
        headers.insert("webhook-signature", format!("v1,bm90IGl0 v1,{tag}").parse().unwrap());
        assert_eq!(verified(&key, &headers, body).as_deref(), Some("msg_1"));
        assert_eq!(verified(&key, &headers, b"{}"), None);
        headers.insert("webhook-timestamp", "1614265330".parse().unwrap());
        assert_eq!(verified(&key, &headers, body), None, "too old");
    }
}
