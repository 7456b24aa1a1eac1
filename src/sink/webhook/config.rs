//! `[webhook]`: the HTTP webhook sink (`[sink] kind = "webhook"`, docs/sink-webhook.md) — where
//! events are POSTed, how they are signed, and how hard the relay pushes the receiver.
//!
//! ```toml
//! [webhook]
//! url = "https://hooks.example.com/outbox/${topic}"  # ${topic}: the routed name
//! secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"   # Standard Webhooks; a list while rotating
//! headers = { Authorization = { env = "ORDERS_HOOK_TOKEN", prefix = "Bearer " } }
//! timeout_ms = 10000        # one request, connect included
//! max_concurrency = 16      # aggregates with a request on the wire at once
//! tls_ca = "/etc/outbox-relay/hooks-ca.pem"
//! ```
//!
//! Invariant: nothing secret is ever printed. The signing keys ([`SigningKey`]) and every header
//! value ([`StaticHeader`]) print as a mask; the URL prints with its query values masked (a
//! query often carries a function key); a URL with `user:password@` is refused (credentials go
//! in `headers`, where they stay masked).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use crate::config::sink::SinkSection;
use crate::config::{optional_number, ConfigError};
use crate::sink::plugin::{Absent, SectionSpec};
use crate::sink::requests::{Count, Millis, RequestKeys, Requests};

/// The placeholder for the routed name in `url`.
pub(crate) const TOPIC_PLACEHOLDER: &str = "${topic}";
/// One request's bound (connect, send, reply) unless `timeout_ms` says otherwise.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Aggregates with a request on the wire at once unless `max_concurrency` says otherwise: one
/// HTTP/1.1 connection each. 16 keeps a small receiver (a serverless function's concurrency
/// limit, a service's worker pool) from being flooded, and still carries about 3,000 events/s
/// into a receiver that answers in 5 ms.
pub(crate) const DEFAULT_MAX_CONCURRENCY: u64 = 16;
/// The largest body sent unless `max_body_bytes` says otherwise (what common receivers and API
/// gateways accept without configuration).
pub(crate) const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// The first wait before a transient failure is retried unless `retry_initial_ms` says otherwise.
pub(crate) const DEFAULT_RETRY_INITIAL_MS: u64 = 100;
/// The longest wait between two attempts unless `retry_max_ms` says otherwise (also the cap on
/// a receiver's `Retry-After`).
pub(crate) const DEFAULT_RETRY_MAX_MS: u64 = 30_000;
const MASK: &str = "********";
/// Standard Webhooks: secrets SHOULD be between 24 and 64 bytes.
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The raw `[webhook]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookSection {
    url: Option<String>,
    /// One `whsec_…` secret, or several (rotation: every request is signed with each).
    #[serde(default)]
    secret: Option<OneOrMany>,
    /// Header name → a value, or `{ env = "VAR", prefix = "Bearer " }`.
    #[serde(default)]
    headers: BTreeMap<String, HeaderSource>,
    #[serde(default, deserialize_with = "optional_number")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_concurrency: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_body_bytes: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    retry_initial_ms: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    retry_max_ms: Option<u64>,
    /// A PEM file of CA certificates trusted for `https://` (besides the system's).
    #[serde(default)]
    tls_ca: Option<PathBuf>,
}

/// One secret or a list (an environment override is one string: comma- or space-separated).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl std::fmt::Debug for OneOrMany {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

/// A header value as written: literal, or read from the environment when the relay starts.
#[derive(Deserialize)]
#[serde(untagged)]
enum HeaderSource {
    Literal(String),
    Env {
        env: String,
        #[serde(default)]
        prefix: String,
    },
}

impl std::fmt::Debug for HeaderSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderSource::Literal(_) => f.write_str(MASK),
            HeaderSource::Env { env, .. } => write!(f, "{{ env = {env:?} }}"),
        }
    }
}

/// The endpoint: an `http(s)://` URL, perhaps with `${topic}` in its path or query.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct WebhookUrl(String);

impl WebhookUrl {
    /// Whether the URL names the routed destination.
    pub(crate) fn is_templated(&self) -> bool {
        self.0.contains(TOPIC_PLACEHOLDER)
    }

    /// The URL of a record routed to `topic` (checked by the sink's name rule, so it is a path
    /// segment that needs no escaping).
    pub(crate) fn for_topic(&self, topic: &str) -> String {
        self.0.replace(TOPIC_PLACEHOLDER, topic)
    }

    /// The URL with `topic` in place, for people (query values masked).
    pub(crate) fn shown_for(&self, topic: &str) -> String {
        redact_query(&self.for_topic(topic))
    }
}

/// `url` with every query value masked.
pub(crate) fn redact_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) => format!("{k}={MASK}"),
            None => kv.to_owned(),
        })
        .collect();
    format!("{base}?{}", masked.join("&"))
}

impl std::fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_query(&self.0))
    }
}

impl std::fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_query(&self.0))
    }
}

/// A Standard Webhooks signing key: the bytes of a `whsec_…` secret. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SigningKey(Vec<u8>);

impl SigningKey {
    #[cfg(test)]
    pub(crate) fn for_test(bytes: Vec<u8>) -> SigningKey {
        SigningKey(bytes)
    }

    /// The key bytes, for the HMAC only.
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("whsec_")?;
        f.write_str(MASK)
    }
}

/// A static header: its name, and a value that is never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct StaticHeader {
    pub(crate) name: String,
    value: String,
}

impl StaticHeader {
    /// The value, for the request only.
    pub(crate) fn expose(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for StaticHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {MASK}", self.name)
    }
}

/// `[webhook]`, validated.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub(crate) url: WebhookUrl,
    /// Empty: requests are not signed.
    pub(crate) keys: Vec<SigningKey>,
    /// In name order; none is a header the sink writes itself.
    pub(crate) headers: Vec<StaticHeader>,
    /// `max_concurrency` (connections to the receiver) and `timeout_ms` (one request).
    pub(crate) requests: Requests,
    pub(crate) max_body_bytes: usize,
    pub(crate) retry_initial: Duration,
    pub(crate) retry_max: Duration,
    pub(crate) tls_ca: Option<PathBuf>,
}

/// `max_concurrency` and `timeout_ms`, checked as every request sink's.
const REQUESTS: RequestKeys = RequestKeys {
    concurrency: Some(Count {
        key: "webhook.max_concurrency",
        default: DEFAULT_MAX_CONCURRENCY,
        most: Some((4096, "connections to one receiver")),
    }),
    requests: None,
    timeout: Millis {
        key: "webhook.timeout_ms",
        default: DEFAULT_TIMEOUT_MS,
        least: 1,
    },
};

/// Headers the sink writes itself: a static header of that name would be overwritten or doubled.
pub(crate) const OWN_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "id",
    "key",
    "idempotency-key",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "traceparent",
    "tracestate",
    "transfer-encoding",
    "connection",
];

impl WebhookSection {
    /// Validates the section; `env` looks up the variables `headers` read (the process
    /// environment in production).
    pub(crate) fn validate(self, env: impl Fn(&str) -> Option<String>) -> Result<WebhookSettings, ConfigError> {
        let url = validate_url(self.url.as_deref().unwrap_or_default())?;
        let keys = match self.secret {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => s
                .split([',', ' '])
                .filter(|p| !p.trim().is_empty())
                .map(parse_secret)
                .collect::<Result<_, _>>()?,
            Some(OneOrMany::Many(list)) => list.iter().map(|s| parse_secret(s)).collect::<Result<_, _>>()?,
        };
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, source) in self.headers {
            headers.push(validate_header(name, source, &env)?);
        }
        let requests = REQUESTS.validate(self.max_concurrency, None, self.timeout_ms)?;
        let max_body_bytes = Count {
            key: "webhook.max_body_bytes",
            default: DEFAULT_MAX_BODY_BYTES,
            most: None,
        }
        .validate(self.max_body_bytes)?;
        let retry_initial = Millis {
            key: "webhook.retry_initial_ms",
            default: DEFAULT_RETRY_INITIAL_MS,
            least: 1,
        }
        .validate(self.retry_initial_ms)?;
        let retry_max = Millis {
            key: "webhook.retry_max_ms",
            default: DEFAULT_RETRY_MAX_MS,
            least: 1,
        }
        .validate(self.retry_max_ms)?;
        if retry_max < retry_initial {
            return Err(ConfigError::invalid(
                "webhook.retry_max_ms",
                format!(
                    "{} ms is below retry_initial_ms ({} ms); raise it or leave both out",
                    retry_max.as_millis(),
                    retry_initial.as_millis()
                ),
            ));
        }
        if let Some(ca) = &self.tls_ca {
            if !ca.is_file() {
                return Err(ConfigError::invalid(
                    "webhook.tls_ca",
                    format!(
                        "{} is not a readable file; point it at a PEM file of CA certificates",
                        ca.display()
                    ),
                ));
            }
        }
        Ok(WebhookSettings {
            url,
            keys,
            headers,
            requests,
            max_body_bytes,
            retry_initial,
            retry_max,
            tls_ca: self.tls_ca,
        })
    }
}

fn validate_url(raw: &str) -> Result<WebhookUrl, ConfigError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(ConfigError::invalid(
            "webhook.url",
            "missing; add `url = \"https://host/path\"` under [webhook] (`${topic}` in it stands for the routed name)",
        ));
    }
    let shown = redact_query(raw);
    // `${topic}` only after the authority: the routed name never picks the host.
    let (scheme, rest) = raw.split_once("://").ok_or_else(|| {
        ConfigError::invalid(
            "webhook.url",
            format!("{shown} is not an absolute URL; write e.g. \"https://hooks.example.com/outbox/${{topic}}\""),
        )
    })?;
    if scheme != "http" && scheme != "https" {
        return Err(ConfigError::invalid(
            "webhook.url",
            format!("{shown} is not http:// or https://; a webhook is an HTTP endpoint"),
        ));
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.contains('@') {
        return Err(ConfigError::invalid(
            "webhook.url",
            "carries credentials (user:password@): remove them and send them as a header instead, e.g. headers = \
             { Authorization = { env = \"HOOK_AUTH\" } }, which is never printed",
        ));
    }
    if authority.contains('$') {
        return Err(ConfigError::invalid(
            "webhook.url",
            format!("{shown}: ${{topic}} may only stand in the path or query, never in the host"),
        ));
    }
    if raw.contains('#') {
        return Err(ConfigError::invalid(
            "webhook.url",
            format!("{shown} has a #fragment, which HTTP never sends; remove it"),
        ));
    }
    let probe = raw.replace(TOPIC_PLACEHOLDER, "topic");
    if probe.contains("${") {
        return Err(ConfigError::invalid(
            "webhook.url",
            format!("{shown} has a placeholder other than ${{topic}}, the only one there is"),
        ));
    }
    if let Err(e) = reqwest::Url::parse(&probe) {
        return Err(ConfigError::invalid(
            "webhook.url",
            format!("{shown} is not a URL: {e}"),
        ));
    }
    Ok(WebhookUrl(raw.to_owned()))
}

/// A `whsec_…` secret's key bytes (the prefix is optional, as the Standard Webhooks libraries have it).
fn parse_secret(raw: &str) -> Result<SigningKey, ConfigError> {
    let text = raw.trim();
    let b64 = text.strip_prefix("whsec_").unwrap_or(text);
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| {
        ConfigError::invalid(
            "webhook.secret",
            "is not a Standard Webhooks secret (whsec_ followed by base64); make one with \
             `echo whsec_$(openssl rand -base64 32)`",
        )
    })?;
    if !SECRET_BYTES.contains(&bytes.len()) {
        return Err(ConfigError::invalid(
            "webhook.secret",
            format!(
                "decodes to {} bytes; Standard Webhooks secrets are 24 to 64 bytes (`echo whsec_$(openssl rand -base64 32)`)",
                bytes.len()
            ),
        ));
    }
    Ok(SigningKey(bytes))
}

fn validate_header(
    name: String,
    source: HeaderSource,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<StaticHeader, ConfigError> {
    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(ConfigError::invalid(
            "webhook.headers",
            format!("{name:?} is not an HTTP header name (letters, digits and -)"),
        ));
    }
    let lower = name.to_ascii_lowercase();
    if OWN_HEADERS.contains(&lower.as_str()) || lower.starts_with("ce-") {
        return Err(ConfigError::invalid(
            "webhook.headers",
            format!("{name:?} is a header the relay writes itself (for every event); remove it"),
        ));
    }
    let value = match source {
        HeaderSource::Literal(v) => v,
        HeaderSource::Env { env: var, prefix } => match env(&var) {
            Some(v) if !v.is_empty() => format!("{prefix}{v}"),
            _ => {
                return Err(ConfigError::invalid(
                    "webhook.headers",
                    format!(
                        "header {name:?} reads the environment variable {var}, which is not set (or empty); set it"
                    ),
                ))
            }
        },
    };
    if reqwest::header::HeaderValue::from_str(&value).is_err() {
        // The value is a secret: say where, never what.
        return Err(ConfigError::invalid(
            "webhook.headers",
            format!("the value of {name:?} is not a valid header value (a line break or control character?)"),
        ));
    }
    Ok(StaticHeader { name, value })
}

/// Why `relay.delivery = "exactly-once"` is refused with this sink (the config error's words).
pub(crate) const NO_EXACTLY_ONCE: &str = "HTTP has no deduplication on the wire: a request whose reply was lost is \
     sent again, and only the receiver can tell. Use relay.delivery = \"at-least-once\" and deduplicate on the \
     Idempotency-Key (or webhook-id) header, the event id (docs/sink-webhook.md)";

/// The sink's name for people, in errors and logs (the section's `name`).
pub(crate) const SINK: &str = "HTTP webhook";

/// The config half of the webhook sink, `[webhook]` (required).
pub(crate) const SECTION: SectionSpec<WebhookSection, WebhookSettings> = SectionSpec {
    kind: "webhook",
    name: SINK,
    absent: Absent::Refused(
        "[sink] kind = \"webhook\" needs a [webhook] section: add `[webhook]` with url = \
         \"https://host/path/${topic}\" (docs/sink-webhook.md)",
    ),
    validate: |section| section.validate(|var| std::env::var(var).ok()),
    binary_refused: None,
};

impl SinkSection for WebhookSettings {
    /// The settings reports may show (none of them secret; the URL's query masked).
    fn get(&self, key: &str) -> Option<String> {
        match key {
            "url" => Some(self.url.to_string()),
            "timeout_ms" => Some(self.requests.timeout.as_millis().to_string()),
            "max_concurrency" => Some(self.requests.max_concurrency.to_string()),
            "max_body_bytes" => Some(self.max_body_bytes.to_string()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn section(toml: &str) -> Result<WebhookSettings, String> {
        let s: WebhookSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate(|var| (var == "HOOK_TOKEN").then(|| "t0ken".to_owned()))
            .map_err(|e| e.to_string())
    }

    fn load(extra: &str) -> Result<crate::config::Settings, String> {
        crate::config::Settings::from_toml_str(
            &format!("[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n{extra}"),
            std::path::Path::new("test.toml"),
            [("OUTBOX_RELAY__WEBHOOK__SECRET".to_owned(), SECRET.to_owned())],
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_goes_with_the_kind_and_refuses_exactly_once() {
        let settings = load("[sink]\nkind = \"webhook\"\n[webhook]\nurl = \"http://127.0.0.1:9/${topic}\"\n").unwrap();
        assert_eq!(settings.sink.label(), "webhook");
        let webhook = settings.sink.section::<WebhookSettings>().expect("the webhook section");
        assert_eq!(webhook.keys.len(), 1, "the secret from OUTBOX_RELAY__WEBHOOK__SECRET");
        // The secret's environment override makes a [webhook] table: its url is what is missing.
        let missing = load("[sink]\nkind = \"webhook\"\n").unwrap_err();
        assert!(
            missing.contains("webhook.url") && missing.contains("missing"),
            "{missing}"
        );
        // Loads, and `run` and `setup` refuse it at start with the reason.
        let once = load(
            "[sink]\nkind = \"webhook\"\n[webhook]\nurl = \"http://127.0.0.1:9/\"\n[relay]\ndelivery = \"exactly-once\"\n",
        )
        .map(|s| crate::sink::refusal::refusal(&s).unwrap_err().to_string())
        .unwrap();
        assert!(
            once.contains("relay.delivery")
                && once.contains("HTTP has no deduplication")
                && once.contains("Idempotency-Key"),
            "{once}"
        );
    }

    #[test]
    fn defaults_and_a_templated_url() {
        let s = section("url = \"http://127.0.0.1:9/hooks/${topic}?code=abc\"").unwrap();
        assert!(s.url.is_templated());
        assert_eq!(s.url.for_topic("orders"), "http://127.0.0.1:9/hooks/orders?code=abc");
        assert_eq!(
            s.url.shown_for("orders"),
            "http://127.0.0.1:9/hooks/orders?code=********"
        );
        assert_eq!(s.requests.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert_eq!(s.requests.max_concurrency, DEFAULT_MAX_CONCURRENCY as usize);
        assert!(s.keys.is_empty() && s.headers.is_empty());
        assert!(!format!("{s:?}").contains("abc"));
    }

    #[test]
    fn bad_urls_name_the_fix() {
        for (url, says) in [
            ("", "missing"),
            ("hooks.example.com/x", "not an absolute URL"),
            ("ftp://h/x", "not http"),
            ("https://u:pw@h/x", "carries credentials"),
            ("https://${topic}.example.com/", "never in the host"),
            ("https://h/${event}", "other than ${topic}"),
            ("https://h/x#frag", "fragment"),
        ] {
            let err = section(&format!("url = {url:?}")).unwrap_err();
            assert!(err.contains("webhook.url") && err.contains(says), "{url}: {err}");
            assert!(!err.contains("pw@"), "{err}");
        }
    }

    #[test]
    fn secrets_one_or_several_and_never_printed() {
        let one = section(&format!("url = \"http://h/\"\nsecret = \"{SECRET}\"")).unwrap();
        assert_eq!(one.keys.len(), 1);
        let two = section(&format!(
            "url = \"http://h/\"\nsecret = [\"{SECRET}\", \"whsec_{}\"]",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        ))
        .unwrap();
        assert_eq!(two.keys.len(), 2);
        assert_eq!(two.keys[1].expose(), &[7u8; 32]);
        // An environment override is one string: several secrets comma-separated.
        let env = section(&format!("url = \"http://h/\"\nsecret = \"{SECRET}, {SECRET}\"")).unwrap();
        assert_eq!(env.keys.len(), 2);
        let printed = format!("{two:?}");
        assert!(
            !printed.contains("MfKQ9r8") && printed.contains("whsec_********"),
            "{printed}"
        );
        let err = section("url = \"http://h/\"\nsecret = \"whsec_not base64!\"").unwrap_err();
        assert!(err.contains("webhook.secret") && err.contains("openssl rand"), "{err}");
        let short = section("url = \"http://h/\"\nsecret = \"whsec_c2hvcnQ=\"").unwrap_err();
        assert!(short.contains("24 to 64 bytes"), "{short}");
    }

    #[test]
    fn headers_from_literals_and_the_environment() {
        let s = section(
            "url = \"http://h/\"\nheaders = { Authorization = { env = \"HOOK_TOKEN\", prefix = \"Bearer \" }, X-Team = \"orders\" }",
        )
        .unwrap();
        assert_eq!(s.headers.len(), 2);
        assert_eq!(s.headers[0].name, "Authorization");
        assert_eq!(s.headers[0].expose(), "Bearer t0ken");
        assert_eq!(s.headers[1].expose(), "orders");
        let printed = format!("{s:?}");
        assert!(!printed.contains("t0ken") && !printed.contains("orders\""), "{printed}");
        let unset = section("url = \"http://h/\"\nheaders = { Authorization = { env = \"NOPE\" } }").unwrap_err();
        assert!(unset.contains("NOPE") && unset.contains("not set"), "{unset}");
        let own = section("url = \"http://h/\"\nheaders = { Idempotency-Key = \"x\" }").unwrap_err();
        assert!(own.contains("writes itself"), "{own}");
        let bad = section("url = \"http://h/\"\nheaders = { \"a b\" = \"x\" }").unwrap_err();
        assert!(bad.contains("not an HTTP header name"), "{bad}");
    }

    #[test]
    fn numbers_are_checked() {
        let err = section("url = \"http://h/\"\nmax_concurrency = 0").unwrap_err();
        assert!(
            err.contains("webhook.max_concurrency") && err.contains("leave it out"),
            "{err}"
        );
        let err = section("url = \"http://h/\"\nretry_initial_ms = 500\nretry_max_ms = 100").unwrap_err();
        assert!(err.contains("below retry_initial_ms"), "{err}");
        let s = section("url = \"http://h/\"\ntimeout_ms = \"250\"\nmax_concurrency = 4").unwrap();
        assert_eq!(
            (s.requests.timeout, s.requests.max_concurrency),
            (Duration::from_millis(250), 4)
        );
        let err = section("url = \"http://h/\"\ntls_ca = \"/nonexistent/ca.pem\"").unwrap_err();
        assert!(err.contains("webhook.tls_ca"), "{err}");
        let err = section("url = \"http://h/\"\nverbose = true").unwrap_err();
        assert!(err.contains("verbose"), "{err}");
    }
}
