//! `[kinesis]`: the Amazon Kinesis Data Streams sink (`[sink] kind = "kinesis"`,
//! docs/sink-kinesis.md) — which region and endpoint, what a record's data holds, the streams
//! `setup` creates, and how hard the relay pushes Kinesis.
//!
//! ```toml
//! [kinesis]
//! region = "eu-west-1"                   # else AWS_REGION / the profile's region
//! endpoint_url = "http://127.0.0.1:5000" # else AWS_ENDPOINT_URL / the regional endpoint
//! format = "envelope"                    # or "payload": the payload alone (Debezium Server's shape)
//! streams = ["orders", "payments"]       # optional: what `outbox-relay setup` creates (on-demand)
//! max_record_bytes = 1048576             # data + partition key, Kinesis's own limit
//! max_concurrency = 500                  # aggregates with a record on the wire at once
//! max_requests = 8                       # PutRecords calls on the wire at once
//! timeout_ms = 10000                     # one attempt of one call
//! ```
//!
//! Credentials are never in this section: the AWS SDK's default chain finds them (environment,
//! profile, web identity, container and instance metadata), so nothing here is secret.
//!
//! Invariant: Kinesis records have no attributes, so `format` decides what travels: the
//! envelope carries the event id, key and headers beside the payload; `payload` carries the
//! payload alone. Kinesis never deduplicates, so exactly-once is refused here with the reason.

use serde::Deserialize;

use crate::config::sink::SinkSection;
use crate::config::{optional_number, ConfigError};
use crate::sink::aws::config::{Endpoint, EndpointKeys};
use crate::sink::plugin::{Absent, SectionSpec};
use crate::sink::requests::{Count, Millis, RequestKeys, Requests};

/// The largest record Kinesis accepts: its data and its partition key together.
pub(crate) const KINESIS_MAX_RECORD_BYTES: u64 = 1024 * 1024;
/// Aggregates with a record on the wire at once unless `max_concurrency` says otherwise: one
/// full `PutRecords` call (500 records) per round trip when that many aggregates are busy.
pub(crate) const DEFAULT_MAX_CONCURRENCY: u64 = 500;
/// `PutRecords` calls on the wire at once unless `max_requests` says otherwise.
pub(crate) const DEFAULT_MAX_REQUESTS: u64 = 8;
/// One attempt of one call unless `timeout_ms` says otherwise.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// What a record's data holds (Kinesis records have nothing but data and a partition key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// A JSON object: `id`, `key`, `headers` and the `payload` (docs/sink-kinesis.md).
    Envelope,
    /// The payload's bytes alone, as Debezium Server's Kinesis sink sends them: the event id
    /// and headers do not travel (the key is the partition key).
    Payload,
}

/// The raw `[kinesis]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KinesisSection {
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint_url: Option<String>,
    #[serde(default)]
    format: Option<String>,
    #[serde(default, deserialize_with = "list_or_comma_string")]
    streams: Option<Vec<String>>,
    #[serde(default, deserialize_with = "optional_number")]
    max_record_bytes: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_concurrency: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    max_requests: Option<u64>,
    #[serde(default, deserialize_with = "optional_number")]
    timeout_ms: Option<u64>,
}

/// A list, or its spelling in an environment override (`"orders,payments"`).
fn list_or_comma_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrText {
        List(Vec<String>),
        Text(String),
    }
    Ok(Some(match ListOrText::deserialize(d)? {
        ListOrText::List(l) => l,
        ListOrText::Text(t) => t
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    }))
}

/// `[kinesis]`, validated.
#[derive(Debug, Clone)]
pub struct KinesisSettings {
    pub(crate) endpoint: Endpoint,
    pub(crate) format: Format,
    /// The streams `setup` creates (empty: it creates none and says so).
    pub(crate) streams: Vec<String>,
    pub(crate) max_record_bytes: usize,
    pub(crate) requests: Requests,
}

/// `region` and `endpoint_url`, checked as every AWS section's.
const ENDPOINT: EndpointKeys = EndpointKeys {
    region: "kinesis.region",
    endpoint_url: "kinesis.endpoint_url",
    example: "https://kinesis.eu-west-1.amazonaws.com",
};

/// `max_concurrency`, `max_requests`, `timeout_ms`, checked as every request sink's.
const REQUESTS: RequestKeys = RequestKeys {
    concurrency: Some(Count {
        key: "kinesis.max_concurrency",
        default: DEFAULT_MAX_CONCURRENCY,
        most: None,
    }),
    requests: Some(Count {
        key: "kinesis.max_requests",
        default: DEFAULT_MAX_REQUESTS,
        most: Some((1024, "calls at once")),
    }),
    timeout: Millis {
        key: "kinesis.timeout_ms",
        default: DEFAULT_TIMEOUT_MS,
        least: 1,
    },
};

/// The stream-name rule: 1 to 128 letters, digits, `_`, `-` and `.`.
pub(crate) fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(format!(
            "{:?} is not a Kinesis stream name (1 to 128 characters: letters, digits, _ - and .)",
            name.chars().take(140).collect::<String>()
        ));
    }
    Ok(())
}

impl KinesisSection {
    pub(crate) fn validate(self) -> Result<KinesisSettings, ConfigError> {
        let endpoint = ENDPOINT.validate(self.region.as_deref(), self.endpoint_url.as_deref())?;
        let format = match self.format.as_deref().map(str::trim) {
            None | Some("envelope") => Format::Envelope,
            Some("payload") => Format::Payload,
            Some(other) => {
                return Err(ConfigError::invalid(
                    "kinesis.format",
                    format!(
                        "{other:?} is not a record format; use \"envelope\" (the default: id, key, headers and \
                         payload in one JSON object) or \"payload\" (the payload alone)"
                    ),
                ))
            }
        };
        let streams = self.streams.unwrap_or_default();
        for s in &streams {
            check_stream_name(s).map_err(|e| ConfigError::invalid("kinesis.streams", e))?;
        }
        let max_record_bytes = Count {
            key: "kinesis.max_record_bytes",
            default: KINESIS_MAX_RECORD_BYTES,
            most: None,
        }
        .validate(self.max_record_bytes)?;
        if max_record_bytes as u64 > KINESIS_MAX_RECORD_BYTES {
            return Err(ConfigError::invalid(
                "kinesis.max_record_bytes",
                format!(
                    "{max_record_bytes} is above Kinesis's limit of {KINESIS_MAX_RECORD_BYTES} bytes (data and \
                     partition key); lower it"
                ),
            ));
        }
        if max_record_bytes < 1024 {
            return Err(ConfigError::invalid(
                "kinesis.max_record_bytes",
                format!("{max_record_bytes} bytes leaves no room for an event; use at least 1024"),
            ));
        }
        Ok(KinesisSettings {
            endpoint,
            format,
            streams,
            max_record_bytes,
            requests: REQUESTS.validate(self.max_concurrency, self.max_requests, self.timeout_ms)?,
        })
    }
}

/// Why `relay.delivery = "exactly-once"` is refused (the config error's words).
pub(crate) const NO_EXACTLY_ONCE: &str = "Kinesis Data Streams has no deduplication: a record sent again (a replay \
     after a crash, or a PutRecords retried after its answer was lost) is stored again under a new sequence number, \
     and the relay cannot tell which records a shard already holds without reading every shard back. Use \
     relay.delivery = \"at-least-once\" and deduplicate on the envelope's `id` (docs/sink-kinesis.md)";

/// The config half of the Kinesis sink, `[kinesis]`.
pub(crate) const SECTION: SectionSpec<KinesisSection, KinesisSettings> = SectionSpec {
    kind: "kinesis",
    name: "Amazon Kinesis Data Streams",
    // An empty (or missing) `[kinesis]` is valid: region, endpoint and credentials then come
    // from the AWS SDK's own chain.
    absent: Absent::Empty(KinesisSection::default),
    validate: KinesisSection::validate,
    // Kinesis has no CloudEvents binding and its records no attributes for the binary mode's
    // `ce_*` headers.
    binary_refused: Some(
        "Kinesis has no CloudEvents binding and its records have no attributes; use mode = \"structured\" (the \
         event as a JSON envelope in the record's data)",
    ),
};

impl SinkSection for KinesisSettings {
    fn get(&self, key: &str) -> Option<String> {
        match key {
            "format" => Some(
                match self.format {
                    Format::Envelope => "envelope",
                    Format::Payload => "payload",
                }
                .to_owned(),
            ),
            "streams" => Some(self.streams.join(",")),
            _ => self.endpoint.get(key).flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn section(toml: &str) -> Result<KinesisSettings, String> {
        let s: KinesisSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn an_empty_section_takes_the_sdk_chain_and_the_defaults() {
        let s = section("").unwrap();
        assert_eq!(s.endpoint, Endpoint::default());
        assert_eq!(s.format, Format::Envelope);
        assert!(s.streams.is_empty());
        assert_eq!(s.max_record_bytes as u64, KINESIS_MAX_RECORD_BYTES);
        assert_eq!(s.requests.max_concurrency as u64, DEFAULT_MAX_CONCURRENCY);
        assert_eq!(s.requests.max_requests as u64, DEFAULT_MAX_REQUESTS);
        assert_eq!(s.requests.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
    }

    #[test]
    fn every_key_is_read_and_checked() {
        let s = section(
            "region = \"eu-west-1\"\nendpoint_url = \"http://127.0.0.1:5000/\"\nformat = \"payload\"\n\
             streams = \"orders, payments\"\nmax_record_bytes = 65536\nmax_concurrency = 8\nmax_requests = \"4\"\n\
             timeout_ms = 500",
        )
        .unwrap();
        assert_eq!(s.endpoint.region.as_deref(), Some("eu-west-1"));
        assert_eq!(s.endpoint.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(s.format, Format::Payload);
        assert_eq!(s.streams, ["orders", "payments"], "an override's comma list");
        assert_eq!(
            (
                s.max_record_bytes,
                s.requests.max_concurrency,
                s.requests.max_requests,
                s.requests.timeout
            ),
            (65536, 8, 4, Duration::from_millis(500))
        );
        assert_eq!(section("streams = [\"a.b_c-1\"]").unwrap().streams, ["a.b_c-1"]);
        for (toml, says) in [
            ("region = \"Europe\"", "kinesis.region"),
            ("endpoint_url = \"localhost:5000\"", "kinesis.eu-west-1"),
            ("format = \"xml\"", "kinesis.format"),
            ("streams = [\"a b\"]", "kinesis.streams"),
            ("max_record_bytes = 2000000", "above Kinesis's limit"),
            ("max_record_bytes = 100", "at least 1024"),
            ("max_concurrency = 0", "leave it out"),
            ("max_requests = 5000", "kinesis.max_requests"),
            ("stream_name = \"x\"", "stream_name"),
        ] {
            let err = section(toml).unwrap_err();
            assert!(err.contains(says), "{toml}: {err}");
        }
    }

    fn load(extra: &str, env: &[(&str, &str)]) -> Result<crate::config::Settings, String> {
        crate::config::Settings::from_toml_str(
            &format!("[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n{extra}"),
            std::path::Path::new("test.toml"),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_goes_with_the_kind_and_exactly_once_is_refused_at_start() {
        let settings = load("[sink]\nkind = \"kinesis\"\n", &[]).unwrap();
        assert_eq!(settings.sink.label(), "kinesis");
        let s = settings.sink.section::<KinesisSettings>().expect("the kinesis section");
        assert_eq!(s.format, Format::Envelope, "no section: the defaults");
        let env = [
            ("OUTBOX_RELAY__KINESIS__FORMAT", "payload"),
            ("OUTBOX_RELAY__KINESIS__STREAMS", "a,b"),
        ];
        let settings = load("[sink]\nkind = \"kinesis\"\n[kinesis]\nregion = \"eu-west-1\"\n", &env).unwrap();
        let s = settings.sink.section::<KinesisSettings>().unwrap();
        assert_eq!(
            (s.format, s.streams.len()),
            (Format::Payload, 2),
            "environment overrides"
        );
        // Loads, and `run` and `setup` refuse it at start with the reason.
        let once = load(
            "[sink]\nkind = \"kinesis\"\n[relay]\ndelivery = \"exactly-once\"\n",
            &[],
        )
        .map(|s| crate::sink::refusal::refusal(&s).unwrap_err().to_string())
        .unwrap();
        assert!(
            once.contains("relay.delivery") && once.contains("no deduplication") && once.contains("`id`"),
            "{once}"
        );
        let binary = load("[sink]\nkind = \"kinesis\"\n[cloudevents]\nmode = \"binary\"\n", &[]).unwrap_err();
        assert!(binary.contains("structured"), "{binary}");
        let other = load("[kinesis]\nformat = \"payload\"\n", &[]).unwrap_err();
        assert!(other.contains("[kinesis]"), "{other}");
    }

    #[test]
    fn stream_names() {
        assert!(check_stream_name("orders.v1_a-b").is_ok());
        assert!(check_stream_name(&"x".repeat(128)).is_ok());
        for bad in ["", "a/b", "a b", "ü"] {
            assert!(check_stream_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_stream_name(&"x".repeat(129)).is_err());
    }
}
