//! The webhook adapter's requests, and its client against a small HTTP server in the test
//! process (the full relay against the harness's receiver is in `tests/it/sink_webhook.rs`).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap as AxumHeaders, StatusCode as AxumStatus};
use axum::response::IntoResponse;
use base64::Engine as _;

use super::client::{Client, Undeliverable};
use super::config::{WebhookSection, WebhookSettings};
use super::request::{check_templated_name, Encoder};
use crate::config::cloudevents::CloudEventsMode;
use crate::sink::{Handover, SinkRecord};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn settings(extra: &str) -> WebhookSettings {
    let section: WebhookSection = toml::from_str(extra).unwrap();
    section
        .validate(|var| (var == "TOKEN").then(|| "s3cret".to_owned()))
        .unwrap()
}

fn record<'a>(destination: &'a str, id: &'a [u8], body: &'a [u8]) -> SinkRecord<'a> {
    SinkRecord {
        destination: Cow::Borrowed(destination),
        key: Cow::Borrowed(b"order-7"),
        value: Some(Cow::Borrowed(body)),
        event_id: id,
        timestamp_ms: Some(1_700_000_000_123),
        headers: Cow::Owned(vec![
            (Cow::Borrowed("x-tenant"), Some(Cow::Borrowed(&b"acme"[..]))),
            (
                Cow::Borrowed("traceparent"),
                Some(Cow::Borrowed(
                    &b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"[..],
                )),
            ),
        ]),
        partition: None,
    }
}

fn header<'m>(headers: &'m reqwest::header::HeaderMap, name: &str) -> Vec<&'m str> {
    headers.get_all(name).iter().map(|v| v.to_str().unwrap()).collect()
}

/// `test`, failed if it takes more than 20 s.
async fn bounded<T>(test: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), test)
        .await
        .expect("bounded")
}

#[test]
fn a_plain_record_becomes_one_post_with_its_headers() {
    let s = settings(
        "url = \"http://127.0.0.1:1/in/${topic}\"\nheaders = { Authorization = { env = \"TOKEN\", prefix = \"Bearer \" } }",
    );
    let encoder = Encoder::new(&s, None).unwrap();
    let req = encoder
        .encode(
            &record("orders.created", b"42", br#"{"total":3}"#),
            &[("x-extra", b"1")],
        )
        .unwrap();
    assert_eq!(req.url, "http://127.0.0.1:1/in/orders.created");
    assert_eq!(&req.body[..], br#"{"total":3}"#);
    assert_eq!(req.event_id, "42");
    let h = &req.headers;
    for (name, value) in [
        ("content-type", "application/json"),
        ("id", "42"),
        ("idempotency-key", "42"),
        ("key", "order-7"),
        ("x-tenant", "acme"),
        ("x-extra", "1"),
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ] {
        assert_eq!(header(h, name), [value], "{name}");
    }
    assert_eq!(header(h, "authorization"), ["Bearer s3cret"]);
    assert!(h.get("authorization").unwrap().is_sensitive());
    // Not JSON: raw bytes.
    let bin = encoder.encode(&record("t", b"43", &[0xff, 0, 1]), &[]).unwrap();
    assert_eq!(header(&bin.headers, "content-type"), ["application/octet-stream"]);
}

#[test]
fn records_http_cannot_carry_are_refused_with_the_reason() {
    let s = settings("url = \"http://127.0.0.1:1/in/${topic}\"\nmax_body_bytes = 16");
    let encoder = Encoder::new(&s, None).unwrap();
    let big = encoder.encode(&record("t", b"1", &[b'x'; 17]), &[]).unwrap_err();
    assert!(big.contains("max_body_bytes"), "{big}");
    let mut bad = record("t", b"1", b"{}");
    bad.headers = Cow::Owned(vec![(Cow::Borrowed("x-note"), Some(Cow::Borrowed(&b"a\nb"[..])))]);
    assert!(encoder.encode(&bad, &[]).unwrap_err().contains("line break"));
    bad.headers = Cow::Owned(vec![(Cow::Borrowed("Idempotency-Key"), Some(Cow::Borrowed(&b"x"[..])))]);
    assert!(encoder.encode(&bad, &[]).unwrap_err().contains("writes itself"));
    bad.headers = Cow::Owned(vec![(Cow::Borrowed("bad name"), None)]);
    assert!(encoder
        .encode(&bad, &[])
        .unwrap_err()
        .contains("not an HTTP header name"));
    assert!(check_templated_name("orders.created-v2_x~").is_ok());
    for name in ["", ".", "..", "a/b", "a b", "a?b", "é"] {
        assert!(check_templated_name(name).is_err(), "{name:?}");
    }
}

#[test]
fn cloudevents_binary_mode_writes_the_http_bindings_headers() {
    let s = settings("url = \"http://127.0.0.1:1/\"");
    let encoder = Encoder::new(&s, Some(CloudEventsMode::Binary)).unwrap();
    let rec = crate::sink::memory::binary_ce_record("orders", b"42");
    let req = encoder.encode(&rec, &[]).unwrap();
    let hs = &req.headers;
    assert_eq!(header(hs, "ce-specversion"), ["1.0"]);
    assert_eq!(header(hs, "ce-id"), ["42"]);
    assert_eq!(header(hs, "ce-type"), ["orders.created"]);
    assert_eq!(header(hs, "ce-tenant"), ["acme"]);
    assert_eq!(header(hs, "content-type"), ["application/vnd.acme+json"]);
    assert_eq!(
        header(hs, "traceparent"),
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
        "the W3C header is there once"
    );
    assert_eq!(header(hs, "ce-traceparent").len(), 1);
    assert!(hs.keys().all(|k| !k.as_str().starts_with("ce_")), "{hs:?}");

    let structured = Encoder::new(&s, Some(CloudEventsMode::Structured)).unwrap();
    let h = |n: &'static str, v: &'static [u8]| (Cow::Borrowed(n), Some(Cow::Borrowed(v)));
    let rec = SinkRecord {
        headers: Cow::Owned(vec![h("content-type", b"application/cloudevents+json; charset=UTF-8")]),
        ..record("orders", b"42", br#"{"specversion":"1.0","id":"42","data":{}}"#)
    };
    let req = structured.encode(&rec, &[]).unwrap();
    assert_eq!(
        header(&req.headers, "content-type"),
        ["application/cloudevents+json; charset=UTF-8"]
    );
}

/// A scripted answer: the status, and a `Retry-After` value.
type Answer = (u16, Option<&'static str>);
/// A request as the receiver saw it: when, its headers, its body.
type Seen = (Instant, AxumHeaders, Vec<u8>);

/// A receiver in the test process: answers with the scripted statuses in order (then 200), and
/// records every request's headers.
#[derive(Clone, Default)]
struct Receiver {
    script: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn serve(receiver: Receiver) -> String {
    let app = axum::Router::new().fallback(move |headers: AxumHeaders, body: axum::body::Bytes| {
        let receiver = receiver.clone();
        async move {
            receiver
                .seen
                .lock()
                .unwrap()
                .push((Instant::now(), headers, body.to_vec()));
            let (status, retry_after) = receiver.script.lock().unwrap().pop_front().unwrap_or((200, None));
            let mut reply = (AxumStatus::from_u16(status).unwrap(), "answer").into_response();
            if let Some(after) = retry_after {
                reply.headers_mut().insert("retry-after", after.parse().unwrap());
            }
            reply
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn transient_replies_are_retried_then_delivered_and_a_4xx_refuses() {
    bounded(async {
        let receiver = Receiver::default();
        receiver
            .script
            .lock()
            .unwrap()
            .extend([(500, None), (503, None), (429, Some("1")), (408, None)]);
        let base = serve(receiver.clone()).await;
        let s = settings(&format!(
            "url = \"{base}/hooks/${{topic}}\"\nsecret = \"{SECRET}\"\nretry_initial_ms = 20\nretry_max_ms = 100"
        ));
        let client = Client::new(&s).unwrap();
        let req = Encoder::new(&s, None)
            .unwrap()
            .encode(&record("orders", b"42", br#"{"a":1}"#), &[])
            .unwrap();
        client.deliver(&req, "shown").await.unwrap();
        let seen = receiver.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 5, "four transient replies, then the 2xx");
        let after_429 = seen[3].0 - seen[2].0;
        assert!(
            after_429 >= Duration::from_millis(950),
            "Retry-After: 1 honoured: {after_429:?}"
        );
        for (_, headers, body) in &seen {
            assert_eq!(headers["idempotency-key"], "42");
            assert_eq!(headers["webhook-id"], "42");
            assert_eq!(body, br#"{"a":1}"#);
            // The signature is over this attempt's timestamp.
            let ts = headers["webhook-timestamp"].to_str().unwrap();
            let key = base64::engine::general_purpose::STANDARD
                .decode(SECRET.trim_start_matches("whsec_"))
                .unwrap();
            let tag = ring::hmac::sign(
                &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
                format!("42.{ts}.{}", std::str::from_utf8(body).unwrap()).as_bytes(),
            );
            let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(tag.as_ref()));
            assert_eq!(headers["webhook-signature"], expected.as_str());
        }

        receiver.script.lock().unwrap().push_back((422, None));
        let err = client.deliver(&req, "shown").await.unwrap_err();
        let Undeliverable::Refused(cause) = err else {
            panic!("a 422 refuses the event: {err:?}")
        };
        assert_eq!(cause, "HTTP 422 Unprocessable Entity: answer");
    })
    .await;
}

#[tokio::test]
async fn a_receiver_that_is_down_is_retried_until_it_is_back() {
    bounded(async {
        // A port nobody listens on yet.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let s = settings(&format!(
            "url = \"http://{addr}/\"\nretry_initial_ms = 20\nretry_max_ms = 50\ntimeout_ms = 1000"
        ));
        let client = Client::new(&s).unwrap();
        let req = Encoder::new(&s, None)
            .unwrap()
            .encode(&record("t", b"7", b"{}"), &[])
            .unwrap();
        let delivery = tokio::spawn(async move { client.deliver(&req, "shown").await });
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !delivery.is_finished(),
            "nothing acknowledged while the receiver is down"
        );
        let receiver = Receiver::default();
        let app_receiver = receiver.clone();
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let app = axum::Router::new().fallback(move || {
            let r = app_receiver.clone();
            async move {
                r.seen
                    .lock()
                    .unwrap()
                    .push((Instant::now(), AxumHeaders::new(), Vec::new()));
                AxumStatus::NO_CONTENT
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        delivery.await.unwrap().unwrap();
        assert_eq!(receiver.seen.lock().unwrap().len(), 1);
    })
    .await;
}

/// An HTTPS receiver on 127.0.0.1 whose certificate, for `names`, a throwaway CA signed; the
/// CA's PEM file (in the returned directory) and the count of requests that reached it.
struct HttpsReceiver {
    addr: std::net::SocketAddr,
    ca_path: std::path::PathBuf,
    hits: Arc<std::sync::atomic::AtomicUsize>,
    _dir: tempfile::TempDir,
}

async fn https_receiver(names: &[&str]) -> HttpsReceiver {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();

    let server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, counted) = (acceptor.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |_req| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::new(),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    HttpsReceiver {
        addr,
        ca_path,
        hits,
        _dir: dir,
    }
}

/// Trusted with `tls_ca` naming the receiver's CA (delivered); without it the certificate is
/// rejected at the first attempt — fatal, not retried: the cause names the problem and the fix.
#[tokio::test]
async fn https_with_the_tls_ca_file_and_not_without() {
    bounded(async {
        let receiver = https_receiver(&["127.0.0.1"]).await;
        let addr = receiver.addr;
        let trusted = settings(&format!(
            "url = \"https://{addr}/hooks\"\ntls_ca = {:?}",
            receiver.ca_path.display().to_string()
        ));
        let req = Encoder::new(&trusted, None)
            .unwrap()
            .encode(&record("t", b"9", b"{}"), &[])
            .unwrap();
        Client::new(&trusted).unwrap().deliver(&req, "shown").await.unwrap();
        assert_eq!(receiver.hits.load(std::sync::atomic::Ordering::SeqCst), 1);

        let untrusted = settings(&format!("url = \"https://{addr}/hooks\""));
        let verdict = Client::new(&untrusted).unwrap().attempt(&req).await;
        let super::client::Verdict::Fatal { cause } = verdict else {
            panic!("an untrusted certificate is fatal: {verdict:?}")
        };
        assert!(
            cause.contains("TLS certificate")
                && cause.contains("UnknownIssuer")
                && cause.contains("set [webhook] tls_ca"),
            "{cause}"
        );
        // `deliver` gives up at once instead of retrying for ever.
        let started = Instant::now();
        let Err(Undeliverable::Fatal(cause)) = Client::new(&untrusted).unwrap().deliver(&req, "shown").await else {
            panic!("deliver ends fatal")
        };
        assert!(started.elapsed() < Duration::from_secs(5), "{cause}");
        assert_eq!(
            receiver.hits.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "nothing reached the receiver"
        );
    })
    .await;
}

/// A certificate from the trusted CA that does not name the URL's host: fatal, naming the fix.
#[tokio::test]
async fn a_certificate_for_another_host_is_fatal() {
    bounded(async {
        let receiver = https_receiver(&["receiver.test"]).await;
        let s = settings(&format!(
            "url = \"https://{}/hooks\"\ntls_ca = {:?}",
            receiver.addr,
            receiver.ca_path.display().to_string()
        ));
        let req = Encoder::new(&s, None)
            .unwrap()
            .encode(&record("t", b"9", b"{}"), &[])
            .unwrap();
        let verdict = Client::new(&s).unwrap().attempt(&req).await;
        let super::client::Verdict::Fatal { cause } = verdict else {
            panic!("a certificate for another host is fatal: {verdict:?}")
        };
        assert!(cause.contains("does not name the URL's host"), "{cause}");
        assert_eq!(receiver.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
    })
    .await;
}

/// Through the driver: the record fails transient (the WAL position is held), nothing more is
/// sent, and the sink's verdict is the fatal error the relay stops with.
#[tokio::test]
async fn a_rejected_certificate_becomes_the_sinks_verdict() {
    use crate::sink::driver::{self, Concurrency, DriverOptions};
    use crate::sink::{FailureKind, Sink};

    bounded(async {
        let receiver = https_receiver(&["127.0.0.1"]).await;
        let s = settings(&format!("url = \"https://{}/hooks\"", receiver.addr));
        let exchange = super::exchange::HttpExchange::new(&s, None).unwrap();
        let options = DriverOptions::for_tests(Concurrency::PerKey { max_keys: 4 });
        let (sink, mut completions) = driver::start::<_, u32>(Arc::new(exchange), options);
        assert!(sink.verdict().is_none());
        sink.send(Handover::of(&record("t", b"1", b"{}")), Box::new(1)).unwrap();
        let done = completions.recv().await.unwrap();
        assert_eq!(done.outcome.unwrap_err().kind, FailureKind::Transient);
        let verdict = sink.verdict().expect("a verdict");
        assert!(!verdict.transient, "{verdict}");
        assert!(verdict.to_string().contains("set [webhook] tls_ca"), "{verdict}");
        assert_eq!(receiver.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
        tokio::task::spawn_blocking(move || Box::new(sink).abandon(Duration::from_millis(100)))
            .await
            .unwrap();
    })
    .await;
}
