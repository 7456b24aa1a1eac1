//! A real HTTP receiver for the webhook sink, in the test process: hyper's HTTP/1.1 server on
//! 127.0.0.1 (keep-alive, as a real receiver), recording every request it answered.
//!
//! What it answers is the test's to say, at any time ([`WebhookReceiver::set`]): `200` to
//! everything ([`Behaviour::Accept`]), a status for the next N requests (`500`s, `429` with
//! `Retry-After`), a delay before each answer (a slow endpoint), or a `4xx` for the events whose
//! body contains a marker ([`WebhookReceiver::refuse_marked`]). [`WebhookReceiver::down_for`]
//! stops listening and drops every open connection, then binds the same port again — the
//! endpoint down for a while. [`WebhookReceiver::start_tls`] serves HTTPS with a certificate
//! from `harness/tls.rs` (a throwaway CA the relay trusts only when told to).
//!
//! [`WebhookReceiver::received`] gives the requests it answered with a 2xx as [`Received`]
//! records (topic = the last path segment, key and `id` from their headers, the body as the
//! payload), in arrival order, so `check_delivered` / `check_order` apply as to any broker.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::consumer::Received;

/// How the receiver answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    /// `200 OK` to everything.
    Accept,
    /// `status` (with `Retry-After: retry_after` when set) to the next `count` requests, then
    /// [`Behaviour::Accept`].
    Fail {
        status: u16,
        count: usize,
        retry_after: Option<String>,
    },
    /// `200 OK` after waiting `delay`.
    Slow(Duration),
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Hit {
    pub at: Instant,
    pub path: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// What the receiver answered.
    pub status: u16,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The request as a consumed record (topic: the path's last segment).
    pub fn record(&self, offset: i64) -> Received {
        Received {
            topic: self.path.rsplit('/').next().unwrap_or_default().to_owned(),
            partition: 0,
            offset,
            key: self.header("key").map(|k| k.as_bytes().to_vec()),
            payload: Some(self.body.clone()),
            headers: self.headers.clone(),
            timestamp_ms: None,
        }
    }
}

#[derive(Default)]
struct State {
    behaviour: VecDeque<Behaviour>,
    /// Events whose body contains this are answered with the status.
    refuse: Option<(String, u16)>,
    hits: Vec<Hit>,
    /// Requests being answered right now.
    open: usize,
    max_open: usize,
}

/// The receiver; dropping it stops it.
pub struct WebhookReceiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// HTTPS: the TLS acceptor every connection goes through.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl WebhookReceiver {
    /// Starts listening on a free port of 127.0.0.1, accepting everything.
    pub async fn start() -> WebhookReceiver {
        Self::start_with(None).await
    }

    /// Like [`WebhookReceiver::start`], serving HTTPS with `tls`'s server certificate (for
    /// 127.0.0.1, signed by `tls`'s CA).
    pub async fn start_tls(tls: &super::tls::ServerTls) -> WebhookReceiver {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(tls.cert_pem.as_bytes()).expect("server cert")],
                PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes()).expect("server key"),
            )
            .expect("server TLS config");
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> WebhookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let server = tokio::spawn(serve(listener, Arc::clone(&state), tls.clone()));
        WebhookReceiver {
            addr,
            state,
            server: Mutex::new(Some(server)),
            tls,
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` when started with TLS).
    pub fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The relay's `[webhook] url`: `<base>/hooks/${topic}`.
    pub fn url(&self) -> String {
        format!("{}/hooks/${{topic}}", self.base_url())
    }

    /// From now on, answers as `behaviour` says.
    pub fn set(&self, behaviour: Behaviour) {
        let mut s = self.state.lock().unwrap();
        s.behaviour.clear();
        s.behaviour.push_back(behaviour);
    }

    /// After what was set before has run its course, answers as `behaviour` says.
    pub fn then(&self, behaviour: Behaviour) {
        self.state.lock().unwrap().behaviour.push_back(behaviour);
    }

    /// Answers `status` to every event whose body contains `marker`, whatever else it does —
    /// except dead letters (a request with an `outbox-relay-error` header), which it accepts.
    pub fn refuse_marked(&self, marker: &str, status: u16) {
        self.state.lock().unwrap().refuse = Some((marker.to_owned(), status));
    }

    /// Every request so far, answered or not.
    pub fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    /// The most requests that were being answered at once.
    pub fn max_concurrent(&self) -> usize {
        self.state.lock().unwrap().max_open
    }

    /// The requests answered with a 2xx, as records, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.hits()
            .iter()
            .filter(|h| (200..300).contains(&h.status))
            .enumerate()
            .map(|(i, h)| h.record(i as i64))
            .collect()
    }

    /// Waits (at most `timeout`) until `count` distinct event ids were answered with a 2xx, then
    /// returns every such record.
    pub async fn collect(&self, count: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let records = self.received();
            let distinct: std::collections::HashSet<&[u8]> = records.iter().filter_map(|r| r.header("id")).collect();
            if distinct.len() >= count || Instant::now() >= deadline {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops listening and drops every open connection (a request being answered gets no
    /// reply); after `down`, binds the same port again and serves on. Returns when it is back.
    pub async fn down_for(&self, down: Duration) {
        self.down();
        tokio::time::sleep(down).await;
        self.up().await;
    }

    /// Stops listening and drops every open connection (a request being answered gets no reply).
    pub fn down(&self) {
        if let Some(server) = self.server.lock().unwrap().take() {
            server.abort();
        }
    }

    /// After [`WebhookReceiver::down`]: binds the same port again and serves on.
    pub async fn up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("webhook receiver: rebinding {}: {e}; trying again", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot bind {} again: {e}", self.addr),
            }
        };
        *self.server.lock().unwrap() = Some(tokio::spawn(serve(listener, Arc::clone(&self.state), self.tls.clone())));
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        if let Some(server) = self.server.lock().unwrap().take() {
            server.abort();
        }
    }
}

/// Accepts connections until aborted; the connections live in this task's set, so aborting it
/// closes them all.
async fn serve(listener: TcpListener, state: Arc<Mutex<State>>, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let state = Arc::clone(&state);
                let tls = tls.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(req, Arc::clone(&state)));
                    let http = hyper::server::conn::http1::Builder::new().keep_alive(true).clone();
                    match tls {
                        // A client that refuses the certificate ends the handshake: no request.
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn answer(req: Request<Incoming>, state: Arc<Mutex<State>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let at = Instant::now();
    let path = req.uri().path().to_owned();
    let headers: Vec<(String, Vec<u8>)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let (status, retry_after, delay) = {
        let mut s = state.lock().unwrap();
        s.open += 1;
        s.max_open = s.max_open.max(s.open);
        let dead_letter = headers.iter().any(|(k, _)| k == "outbox-relay-error");
        let refused = s
            .refuse
            .as_ref()
            .filter(|(marker, _)| !dead_letter && String::from_utf8_lossy(&body).contains(marker.as_str()))
            .map(|(_, status)| *status);
        match (refused, s.behaviour.front_mut()) {
            (Some(status), _) => (status, None, None),
            (None, None | Some(Behaviour::Accept)) => (200, None, None),
            (None, Some(Behaviour::Slow(d))) => (200, None, Some(*d)),
            (
                None,
                Some(Behaviour::Fail {
                    status,
                    count,
                    retry_after,
                }),
            ) => {
                let answer = (*status, retry_after.clone(), None);
                *count -= 1;
                if *count == 0 {
                    s.behaviour.pop_front();
                }
                answer
            }
        }
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    {
        let mut s = state.lock().unwrap();
        s.open -= 1;
        s.hits.push(Hit {
            at,
            path,
            headers,
            body,
            status,
        });
    }
    let mut reply = Response::new(Full::new(Bytes::from_static(b"ok")));
    *reply.status_mut() = StatusCode::from_u16(status).expect("a status");
    if let Some(after) = retry_after {
        reply
            .headers_mut()
            .insert("retry-after", after.parse().expect("retry-after"));
    }
    Ok(reply)
}
