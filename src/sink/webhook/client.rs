//! Sending one request until the receiver has answered it for good ([`Client::deliver`]).
//!
//! The reply decides ([`classify`]):
//! * **2xx** — delivered: the receiver has the event.
//! * **408, 429, 5xx**, a timeout, a refused or broken connection, a **3xx** (the relay never
//!   follows a redirect: a POST turned GET would lose the body) — transient: the same request
//!   is sent again after a capped exponential backoff with jitter (`retry_initial_ms` doubling
//!   up to `retry_max_ms`), or after the receiver's `Retry-After` (seconds or an HTTP date, up
//!   to [`MAX_RETRY_AFTER`]) when it gave one. Nothing is acknowledged meanwhile, so the WAL
//!   position stays where it is; other aggregates keep flowing.
//! * **any other 4xx** — refused: the receiver rejects the event for what it is, so sending it
//!   again cannot help; `relay.on_bad_event` decides. 401 and 403 included: the issue's rule
//!   (a receiver may refuse one event by policy), and a wrong token shows at the first event.
//! * **a TLS certificate the relay does not accept** (unknown issuer, a name that is not the
//!   URL's host, expired) — fatal: no retry can help and no event is the problem, so the sink
//!   says so ([`Undeliverable::Fatal`] → the driver's verdict) and the relay stops with the
//!   problem and the fix, instead of retrying for ever with the WAL held.
//!
//! Invariant: [`Client::deliver`] holds no state between attempts but its backoff; dropping
//! its future drops the request on the wire (a sink being abandoned), and a later `deliver` of
//! the same event starts over — the receiver deduplicates on `Idempotency-Key`/`webhook-id`.
//! The connection pool keeps HTTP/1.1 connections alive between requests; every reply body is
//! read to its end (up to [`MAX_REPLY_BYTES`]) so its connection can be reused.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::StatusCode;
use tracing::{debug, info, warn};

use super::config::{redact_query, WebhookSettings};
use super::request::Request;
use super::signature::Signer;
use super::SINK;
use crate::backoff::Backoff;
use crate::sink::SinkError;

/// The longest `Retry-After` honoured: a receiver asking for more is asked again after this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// How much of a reply body is read (and kept, cut to [`CAUSE_BYTES`], for a refusal's cause).
const MAX_REPLY_BYTES: usize = 64 * 1024;
/// How much of a refusing reply's body its cause quotes.
const CAUSE_BYTES: usize = 300;
/// How many failed attempts of one request are logged at `warn` (then every tenth).
const WARN_ATTEMPTS: u32 = 3;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Delivered,
    /// Try again (after `retry_after`, when the receiver said).
    Retry {
        cause: String,
        retry_after: Option<Duration>,
    },
    /// Never again: `relay.on_bad_event` decides.
    Refused {
        cause: String,
    },
    /// No attempt can succeed until an operator acts (the cause says what to do).
    Fatal {
        cause: String,
    },
}

/// The final outcome of [`Client::deliver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undeliverable {
    /// The receiver refused the event (a 4xx other than 408 and 429).
    Refused(String),
    /// No request can reach the receiver until an operator acts: the problem and the fix.
    Fatal(String),
}

/// What a reply's status and headers say (`body`: the start of the reply's body, for the cause).
pub(crate) fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8], now: SystemTime) -> Verdict {
    let words = || {
        let text = String::from_utf8_lossy(&body[..body.len().min(CAUSE_BYTES)]);
        let text = text.trim();
        if text.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {text}")
        }
    };
    match status.as_u16() {
        200..=299 => Verdict::Delivered,
        408 | 429 | 500..=599 => Verdict::Retry {
            cause: words(),
            retry_after: retry_after(headers, now),
        },
        300..=399 => Verdict::Retry {
            cause: format!(
                "HTTP {status}: the endpoint redirects{}; the relay does not follow redirects (a POST could \
                 lose its body): set [webhook] url to the final address",
                headers
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .map(|l| format!(" to {}", redact_query(l)))
                    .unwrap_or_default()
            ),
            retry_after: None,
        },
        400..=499 => Verdict::Refused { cause: words() },
        // 1xx never reaches here (the client handles them); anything else is not HTTP as known.
        _ => Verdict::Retry {
            cause: words(),
            retry_after: None,
        },
    }
}

/// `Retry-After`: delay-seconds or an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The HTTP client of one sink: a keep-alive pool, the signer, the retry policy.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    signer: Option<std::sync::Arc<Signer>>,
    retry_initial: Duration,
    retry_max: Duration,
}

impl Client {
    pub(crate) fn new(settings: &WebhookSettings) -> Result<Client, SinkError> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .http1_only()
            .timeout(settings.requests.timeout)
            .connect_timeout(settings.requests.timeout)
            .pool_max_idle_per_host(settings.requests.max_concurrency)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &settings.tls_ca {
            let pem = std::fs::read(path).map_err(|e| SinkError {
                sink: SINK,
                cause: format!("cannot read [webhook] tls_ca {}: {e}", path.display()),
                transient: false,
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| SinkError {
                sink: SINK,
                cause: format!("[webhook] tls_ca {} holds no PEM certificate: {e}", path.display()),
                transient: false,
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| SinkError {
            sink: SINK,
            cause: format!("cannot build the HTTP client: {e}"),
            transient: false,
        })?;
        Ok(Client {
            http,
            signer: Signer::new(&settings.keys).map(std::sync::Arc::new),
            retry_initial: settings.retry_initial,
            retry_max: settings.retry_max,
        })
    }

    /// One attempt: signs the request now, sends it, reads the reply.
    pub(crate) async fn attempt(&self, request: &Request) -> Verdict {
        let mut headers = request.headers.clone();
        if let Some(signer) = &self.signer {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let signature = signer.sign(&request.event_id, now, &request.body);
            let put = |headers: &mut HeaderMap, name: &'static str, value: String| {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(HeaderName::from_static(name), value);
                }
            };
            put(&mut headers, "webhook-id", request.event_id.clone());
            put(&mut headers, "webhook-timestamp", now.to_string());
            put(&mut headers, "webhook-signature", signature);
        }
        let sent = self
            .http
            .post(&request.url)
            .headers(headers)
            .body(request.body.clone())
            .send()
            .await;
        let mut reply = match sent {
            Ok(reply) => reply,
            Err(e) => {
                if let Some(problem) = certificate_problem(&e) {
                    return Verdict::Fatal {
                        cause: format!("{}: {problem}", redact_query(&request.url)),
                    };
                }
                return Verdict::Retry {
                    cause: describe(&e),
                    retry_after: None,
                };
            }
        };
        let mut body = Vec::new();
        loop {
            match reply.chunk().await {
                Ok(Some(chunk)) if body.len() < MAX_REPLY_BYTES => body.extend_from_slice(&chunk),
                Ok(Some(_)) => {}
                Ok(None) => break,
                // The reply is known by its status; a broken body only costs the connection.
                Err(e) => {
                    debug!(error = %describe(&e), "webhook reply body cut short");
                    break;
                }
            }
        }
        classify(reply.status(), reply.headers(), &body, SystemTime::now())
    }

    /// `status`: an `OPTIONS` request to `url`, and the reply's status (`Err`: no HTTP reply).
    pub(crate) async fn options(&self, url: &str) -> Result<StatusCode, String> {
        match self.http.request(reqwest::Method::OPTIONS, url).send().await {
            Ok(reply) => Ok(reply.status()),
            Err(e) => Err(describe(&e)),
        }
    }

    /// Sends `request` until it is delivered or refused: transient failures are retried for as
    /// long as it takes (module docs). Cancel by dropping the future.
    pub(crate) async fn deliver(&self, request: &Request, shown_url: &str) -> Result<(), Undeliverable> {
        let mut backoff = Backoff::new(self.retry_initial, self.retry_max);
        let mut failures: u32 = 0;
        loop {
            match self.attempt(request).await {
                Verdict::Delivered => {
                    if failures > 0 {
                        info!(
                            event_id = %request.event_id,
                            url = %shown_url,
                            attempts = failures + 1,
                            "webhook delivered after retries"
                        );
                    }
                    return Ok(());
                }
                Verdict::Refused { cause } => return Err(Undeliverable::Refused(cause)),
                Verdict::Fatal { cause } => return Err(Undeliverable::Fatal(cause)),
                Verdict::Retry { cause, retry_after } => {
                    failures = failures.saturating_add(1);
                    let wait = match retry_after {
                        Some(after) => after.min(MAX_RETRY_AFTER),
                        None => backoff.next_delay(),
                    };
                    if failures <= WARN_ATTEMPTS || failures.is_multiple_of(10) {
                        warn!(
                            event_id = %request.event_id,
                            url = %shown_url,
                            attempt = failures,
                            retry_in_ms = wait.as_millis() as u64,
                            cause = %cause,
                            "webhook request failed; retrying (the WAL position is held until it is delivered)"
                        );
                    } else {
                        debug!(event_id = %request.event_id, attempt = failures, cause = %cause, "webhook retry");
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// What is wrong with the receiver's TLS certificate and what to do, when `e` is the relay
/// refusing it (rustls's verdict in the error's source chain); `None` for any other failure.
fn certificate_problem(e: &reqwest::Error) -> Option<String> {
    use rustls::CertificateError as C;
    let mut source = std::error::Error::source(e);
    let mut rejected = None;
    while let Some(s) = source {
        // The TLS connector wraps rustls's error in an `io::Error`, itself wrapped in another
        // (whose `source` skips the inner ones): look inside each.
        let mut inner: &(dyn std::error::Error + 'static) = s;
        while let Some(wrapped) = inner.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            inner = wrapped;
        }
        if let Some(rustls::Error::InvalidCertificate(problem)) = inner.downcast_ref::<rustls::Error>() {
            rejected = Some(problem.clone());
            break;
        }
        source = s.source();
    }
    let problem = rejected?;
    let fix = match &problem {
        C::UnknownIssuer | C::BadSignature => {
            "its issuer is not trusted: set [webhook] tls_ca to the PEM file of the CA that signed the receiver's \
             certificate, or have the receiver present a certificate from a CA in this system's roots"
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "it does not name the URL's host: set [webhook] url to a host name the certificate lists, or have the \
             receiver present a certificate for this host"
        }
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            "it is outside its validity period: renew the receiver's certificate (or check this machine's clock)"
        }
        _ => "fix the receiver's certificate, or [webhook] tls_ca if the relay should trust its issuer",
    };
    Some(format!(
        "the receiver's TLS certificate is rejected ({problem:?}); {fix}. No event is sent until then"
    ))
}

/// A client error in words, with its source chain (reqwest's own message is terse), without the
/// URL's query.
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if let Some(url) = e.url() {
        text.push_str(&format!(" ({})", redact_query(url.as_str())));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_static(k), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// The verdict on an empty reply of `status` with the headers `pairs`.
    fn verdict(status: StatusCode, pairs: &[(&'static str, &str)], now: SystemTime) -> Verdict {
        classify(status, &headers(pairs), b"", now)
    }

    #[test]
    fn statuses_are_classified_as_the_issue_says() {
        let now = SystemTime::now();
        let none = HeaderMap::new();
        let plain = |code: u16| verdict(StatusCode::from_u16(code).unwrap(), &[], now);
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(plain(code), Verdict::Delivered);
        }
        for code in [408, 429, 500, 502, 503, 504, 599, 301, 307] {
            assert!(matches!(plain(code), Verdict::Retry { .. }), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 410, 413, 422, 451] {
            assert!(matches!(plain(code), Verdict::Refused { .. }), "{code}");
        }
        let Verdict::Refused { cause } = classify(StatusCode::UNPROCESSABLE_ENTITY, &none, b"  bad total\n", now)
        else {
            panic!("422 is a refusal")
        };
        assert_eq!(cause, "HTTP 422 Unprocessable Entity: bad total");
        let Verdict::Retry { cause, .. } = verdict(
            StatusCode::MOVED_PERMANENTLY,
            &[("location", "https://new/x?sig=abc")],
            now,
        ) else {
            panic!("3xx is transient")
        };
        assert!(
            cause.contains("https://new/x?sig=********") && !cause.contains("abc"),
            "{cause}"
        );
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &past)]), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        let Verdict::Retry { retry_after: after, .. } =
            verdict(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "2")], now)
        else {
            panic!("429 is transient")
        };
        assert_eq!(after, Some(Duration::from_secs(2)));
    }
}
