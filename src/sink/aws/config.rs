//! What the AWS sinks' sections (`[sqs]`, `[sns]`, `[kinesis]`) share: `region` and
//! `endpoint_url` ([`EndpointKeys`]), checked the same way and left to the SDK's chain
//! (`AWS_REGION`, `AWS_ENDPOINT_URL`, the profile) when absent; booleans as environment overrides
//! spell them; and, whole, the section of the two message services (`[sqs]` and `[sns]` have the
//! same keys: [`MessagesSection`], validated per service into [`MessagesSettings`], whose
//! [`MessageService`] says what differs — names, limits, defaults, the words of its refusals).
//!
//! ```toml
//! [sqs]                                  # or [sns]
//! region = "eu-west-1"                   # else AWS_REGION / the profile's region
//! endpoint_url = "http://127.0.0.1:5000" # else AWS_ENDPOINT_URL / the regional endpoint
//! fifo = true                            # every routed queue / topic is a FIFO one (name ends in .fifo)
//! headers = "attributes"                 # or "json": all headers in one attribute
//! max_message_bytes = 262144             # the service's limit, or the queue's
//! max_concurrency = 256                  # aggregates with a message on the wire at once
//! max_requests = 16                      # batch calls on the wire at once
//! timeout_ms = 10000                     # one attempt of one call
//! ```
//!
//! Invariant: nothing here is secret (credentials are never in a section: the SDK's default chain
//! finds them). With message services, `fifo` decides what the sink promises: FIFO queues and
//! topics keep the order of each aggregate (its key is the message group) and deduplicate
//! replays, so exactly-once is accepted; standard ones do neither, so exactly-once is refused at
//! load with the reason and a start warning says order is not kept.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::cloudevents::CloudEventsMode;
use crate::config::sink::{parse_section, SectionContext, SinkSection, SinkSectionSpec};
use crate::config::{optional_number, ConfigError};
use crate::sink::aws::client::{self, Connected};
use crate::sink::aws::message::Service;
use crate::sink::requests::{Count, RequestKeys, Requests};
use crate::sink::SinkError;

/// `key` (e.g. `"sqs.region"`): `None` leaves the region to the SDK's chain.
pub(crate) fn region(key: &'static str, value: Option<&str>) -> Result<Option<String>, ConfigError> {
    match value.map(str::trim) {
        None => Ok(None),
        Some(r) if valid_region(r) => Ok(Some(r.to_owned())),
        Some(r) => Err(ConfigError::invalid(
            key,
            format!("{r:?} is not an AWS region name (e.g. \"eu-west-1\"); fix it or leave it out for AWS_REGION"),
        )),
    }
}

/// `key` (e.g. `"sqs.endpoint_url"`): `None` (or empty) leaves the endpoint to the SDK's chain;
/// `example` is the service's regional endpoint, shown in the error.
pub(crate) fn endpoint_url(
    key: &'static str,
    value: Option<&str>,
    example: &str,
) -> Result<Option<String>, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(url) => validate_endpoint(key, url, example).map(Some),
    }
}

/// How an AWS section names its `region` and `endpoint_url` keys (`"sqs.region"`), and the
/// service's regional endpoint, shown in the error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointKeys {
    pub(crate) region: &'static str,
    pub(crate) endpoint_url: &'static str,
    pub(crate) example: &'static str,
}

/// Where an AWS sink's client connects: `None` leaves it to the SDK's chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `None`: `AWS_REGION`, the profile.
    pub(crate) region: Option<String>,
    /// `None`: `AWS_ENDPOINT_URL`, else the regional endpoint.
    pub(crate) endpoint_url: Option<String>,
}

impl EndpointKeys {
    /// The section's `region` and `endpoint_url`, checked.
    pub(crate) fn validate(&self, region: Option<&str>, endpoint_url: Option<&str>) -> Result<Endpoint, ConfigError> {
        Ok(Endpoint {
            region: self::region(self.region, region)?,
            endpoint_url: self::endpoint_url(self.endpoint_url, endpoint_url, self.example)?,
        })
    }
}

impl Endpoint {
    /// `get`'s answer for `region` and `endpoint_url` (`None` for another key).
    pub(crate) fn get(&self, key: &str) -> Option<Option<String>> {
        match key {
            "region" => Some(self.region.clone()),
            "endpoint_url" => Some(self.endpoint_url.clone()),
            _ => None,
        }
    }
}

/// `xx-name-N` (`us-east-1`, `ap-southeast-2`, `us-gov-west-1`, `eu-isoe-west-1`).
fn valid_region(r: &str) -> bool {
    let parts: Vec<&str> = r.split('-').collect();
    parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
        && parts.last().is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
}

/// An `http(s)://host[:port][/]` URL (a local emulator, a VPC endpoint).
fn validate_endpoint(key: &'static str, url: &str, example: &str) -> Result<String, ConfigError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(ConfigError::invalid(
            key,
            format!("{url:?} is not an absolute URL; write e.g. \"{example}\""),
        ));
    };
    if scheme != "http" && scheme != "https" {
        return Err(ConfigError::invalid(key, format!("{url:?} is not http:// or https://")));
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.is_empty() || authority.contains('@') {
        return Err(ConfigError::invalid(
            key,
            "needs a host and no user:password@ (credentials come from the AWS credential chain)",
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// How a record's headers travel as message attributes (SQS and SNS allow 10 per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderMode {
    /// Each header is a message attribute of its own (`id` and `key` take two, exactly-once's
    /// position three more): a record with more than 10 in all is refused.
    Attributes,
    /// All headers in one attribute, `headers`, a JSON object (any number).
    Json,
}

/// `key` (e.g. `"sqs.headers"`): `"attributes"` (the default) or `"json"`.
pub(crate) fn header_mode(key: &'static str, value: Option<&str>) -> Result<HeaderMode, ConfigError> {
    match value.map(str::trim) {
        None | Some("attributes") => Ok(HeaderMode::Attributes),
        Some("json") => Ok(HeaderMode::Json),
        Some(other) => Err(ConfigError::invalid(
            key,
            format!("{other:?} is not a header mode; use \"attributes\" (the default) or \"json\""),
        )),
    }
}

/// A boolean, or its spelling in an environment override (`"true"`, `"false"`).
pub(crate) fn optional_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum BoolOrText {
        Bool(bool),
        Text(String),
    }
    match <BoolOrText as serde::Deserialize>::deserialize(d)? {
        BoolOrText::Bool(b) => Ok(Some(b)),
        BoolOrText::Text(t) => match t.trim() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err(serde::de::Error::custom(format!("{other:?} is not true or false"))),
        },
    }
}

/// What a message service's section says of it besides the words of [`Service`]: its keys, its
/// limits and defaults, and why it refuses exactly-once with standard queues or topics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessagesKeys {
    pub(crate) endpoint: EndpointKeys,
    pub(crate) headers: &'static str,
    /// `max_message_bytes`: its key and default.
    pub(crate) max_message_bytes: Count,
    /// The largest message the service accepts (body and attributes), bytes.
    pub(crate) message_limit: u64,
    pub(crate) requests: RequestKeys,
    /// Why `relay.delivery = "exactly-once"` is refused with `fifo = false` (the config error's
    /// words, and the plugin's answer).
    pub(crate) no_exactly_once: &'static str,
}

/// One message service (SQS, SNS): a unit struct in its folder, whose section is a
/// [`MessagesSettings`] of it.
pub(crate) trait MessageService: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// Its names and words, shared with the encoder (`message.rs`).
    const SERVICE: &'static Service;
    const KEYS: MessagesKeys;
}

/// The raw `[sqs]` or `[sns]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesSection {
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint_url: Option<String>,
    #[serde(default, deserialize_with = "optional_bool")]
    fifo: Option<bool>,
    #[serde(default)]
    headers: Option<String>,
    #[serde(default, deserialize_with = "optional_number")]
    max_message_bytes: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_concurrency: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_requests: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    timeout_ms: Option<u64>,
}

/// `[sqs]` or `[sns]`, validated (a type per service, so the registry tells their sections apart).
#[derive(Debug, Clone)]
pub(crate) struct MessagesSettings<S> {
    pub(crate) endpoint: Endpoint,
    pub(crate) fifo: bool,
    pub(crate) headers: HeaderMode,
    pub(crate) max_message_bytes: usize,
    pub(crate) requests: Requests,
    service: PhantomData<S>,
}

impl MessagesSection {
    pub(crate) fn validate<S: MessageService>(self) -> Result<MessagesSettings<S>, ConfigError> {
        let keys = S::KEYS;
        let endpoint = keys
            .endpoint
            .validate(self.region.as_deref(), self.endpoint_url.as_deref())?;
        let headers = header_mode(keys.headers, self.headers.as_deref())?;
        let max_message_bytes = keys.max_message_bytes.validate(self.max_message_bytes)?;
        let limit = keys.message_limit;
        if max_message_bytes as u64 > limit {
            return Err(ConfigError::invalid(
                keys.max_message_bytes.key,
                format!(
                    "{max_message_bytes} is above {}'s limit of {limit} bytes; lower it",
                    S::SERVICE.name
                ),
            ));
        }
        Ok(MessagesSettings {
            endpoint,
            fifo: self.fifo.unwrap_or(false),
            headers,
            max_message_bytes,
            requests: keys
                .requests
                .validate(self.max_concurrency, self.max_requests, self.timeout_ms)?,
            service: PhantomData,
        })
    }
}

impl<S: MessageService> MessagesSettings<S> {
    /// The SDK configuration chain with this section on top (`client.rs`), for `S`'s client.
    pub(crate) async fn connect(&self, connect_timeout: Duration) -> Result<Connected, SinkError> {
        let service = S::SERVICE;
        client::connect(
            service.sink,
            service.section,
            &self.endpoint,
            self.requests.timeout,
            connect_timeout,
        )
        .await
    }

    /// The start warning of standard queues or topics (order is not kept).
    pub(crate) fn warnings(&self) -> Vec<String> {
        let service = S::SERVICE;
        if self.fifo {
            return Vec::new();
        }
        vec![format!(
            "[{s}] fifo = false: standard {n} {d}s do not keep order (nor deliver only once), so the events of one \
             aggregate may reach {r} out of commit order. Route to FIFO {d}s (names ending in .fifo) with fifo = \
             true to keep per-aggregate order (docs/sink-{s}.md)",
            s = service.section,
            n = service.name,
            d = service.destination,
            r = service.readers,
        )]
    }
}

/// The config half of a message service's sink (its plugin's `SPEC`, registered in
/// `src/sink/registry.rs`).
pub(crate) struct MessagesSpec<S>(PhantomData<fn() -> S>);

impl<S> MessagesSpec<S> {
    pub(crate) const fn new() -> MessagesSpec<S> {
        MessagesSpec(PhantomData)
    }
}

impl<S: MessageService> SinkSectionSpec for MessagesSpec<S> {
    fn kind(&self) -> &'static str {
        S::SERVICE.section
    }

    /// The sink's name for people ("Amazon SQS"), not the service's short one (`Service::name`).
    #[allow(clippy::misnamed_getters)]
    fn name(&self) -> &'static str {
        S::SERVICE.sink
    }

    /// An empty (or missing) section is valid: region, endpoint and credentials then come from
    /// the AWS SDK's own chain, and queues or topics are standard ones.
    fn validate(
        &self,
        section: Option<toml::Value>,
        _: &SectionContext<'_>,
    ) -> Result<Arc<dyn SinkSection>, ConfigError> {
        let raw: MessagesSection = match section {
            Some(section) => parse_section(self.kind(), section)?,
            None => MessagesSection::default(),
        };
        Ok(Arc::new(raw.validate::<S>()?))
    }

    /// Neither service has a CloudEvents binding; at most 10 attributes leave no room for the
    /// binary mode's `ce_*` headers beside the relay's own.
    fn cloudevents_mode(&self, mode: CloudEventsMode) -> Result<(), String> {
        match mode {
            CloudEventsMode::Structured => Ok(()),
            CloudEventsMode::Binary => Err(format!(
                "{} has no CloudEvents binding and allows 10 message attributes; use mode = \"structured\" (the \
                 event as a JSON envelope in the message body)",
                S::SERVICE.name
            )),
        }
    }
}

impl<S: MessageService> SinkSection for MessagesSettings<S> {
    fn start_warnings(&self) -> Vec<String> {
        self.warnings()
    }

    fn get(&self, key: &str) -> Option<String> {
        match key {
            "fifo" => Some(self.fifo.to_string()),
            _ => self.endpoint.get(key).flatten(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A message service's section checked as its own tests ask: the defaults of an empty
    /// section, every key read (`max_message_bytes = ok_size`), every key's error naming it
    /// (`too_large` above the service's limit, `unknown` no key of it), and the words of the
    /// standard queues' or topics' warning.
    pub(crate) fn every_key_is_read_and_checked<S: MessageService>(
        ok_size: u64,
        too_large: u64,
        unknown: &str,
        warning: &str,
    ) {
        let section = |toml: &str| -> Result<MessagesSettings<S>, String> {
            let s: MessagesSection = toml::from_str(toml).map_err(|e| e.to_string())?;
            s.validate().map_err(|e| e.to_string())
        };
        let (keys, name) = (S::KEYS, S::SERVICE.section);
        let s = section("").unwrap();
        assert_eq!(s.endpoint, Endpoint::default(), "no section: the SDK's chain");
        assert!(!s.fifo);
        assert_eq!(s.headers, HeaderMode::Attributes);
        assert_eq!(s.max_message_bytes as u64, keys.max_message_bytes.default);
        let defaults = keys.requests.validate(None, None, None).unwrap();
        assert_eq!(s.requests, defaults);
        assert_eq!(s.warnings(), [warning], "standard {}s warn", S::SERVICE.destination);
        let s = section(&format!(
            "region = \"eu-west-1\"\nendpoint_url = \"http://127.0.0.1:5000/\"\nfifo = \"true\"\nheaders = \"json\"\n\
             max_message_bytes = {ok_size}\nmax_concurrency = 8\nmax_requests = \"4\"\ntimeout_ms = 500"
        ))
        .unwrap();
        assert_eq!(s.endpoint.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.endpoint.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(s.fifo && s.warnings().is_empty());
        assert_eq!(s.headers, HeaderMode::Json);
        assert_eq!(
            (
                s.max_message_bytes as u64,
                s.requests.max_concurrency,
                s.requests.max_requests,
                s.requests.timeout
            ),
            (ok_size, 8, 4, Duration::from_millis(500))
        );
        for (toml, says) in [
            ("region = \"Europe\"".to_owned(), format!("{name}.region")),
            (
                "endpoint_url = \"localhost:5000\"".to_owned(),
                format!("{name}.eu-west-1"),
            ),
            (
                "endpoint_url = \"localhost:5000\"".to_owned(),
                "not an absolute URL".to_owned(),
            ),
            ("endpoint_url = \"ftp://h\"".to_owned(), "not http".to_owned()),
            (
                "endpoint_url = \"http://k:s@h\"".to_owned(),
                "credential chain".to_owned(),
            ),
            ("headers = \"xml\"".to_owned(), format!("{name}.headers")),
            (
                format!("max_message_bytes = {too_large}"),
                format!("above {}'s limit", S::SERVICE.name),
            ),
            ("max_concurrency = 0".to_owned(), "leave it out".to_owned()),
            ("max_requests = 5000".to_owned(), format!("{name}.max_requests")),
            ("fifo = \"yes\"".to_owned(), "not true or false".to_owned()),
            (format!("{unknown} = \"x\""), unknown.to_owned()),
        ] {
            let err = section(&toml).unwrap_err();
            assert!(err.contains(&says), "{toml}: {err}");
        }
    }

    #[test]
    fn regions_and_endpoints_are_checked_and_name_their_key() {
        assert_eq!(region("x.region", None).unwrap(), None);
        for ok in ["us-east-1", "ap-southeast-2", "us-gov-west-1", "eu-isoe-west-1"] {
            assert_eq!(region("x.region", Some(ok)).unwrap().as_deref(), Some(ok));
        }
        for bad in ["Europe", "eu-west", "eu--1", "EU-WEST-1"] {
            let e = region("x.region", Some(bad)).unwrap_err().to_string();
            assert!(e.contains("x.region") && e.contains("AWS_REGION"), "{bad}: {e}");
        }
        let ex = "https://sqs.eu-west-1.amazonaws.com";
        assert_eq!(endpoint_url("x.endpoint_url", Some(" "), ex).unwrap(), None);
        assert_eq!(
            endpoint_url("x.endpoint_url", Some("http://127.0.0.1:5000/"), ex)
                .unwrap()
                .as_deref(),
            Some("http://127.0.0.1:5000")
        );
        for (bad, says) in [
            ("localhost:5000", "sqs.eu-west-1"),
            ("ftp://h", "not http"),
            ("http://k:s@h", "credential chain"),
            ("http:///x", "needs a host"),
        ] {
            let e = endpoint_url("x.endpoint_url", Some(bad), ex).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("x.endpoint_url"), "{bad}: {e}");
        }
    }
}
