//! `[tracing]`: OTLP export of one PRODUCER span per published event, validated into
//! [`TracingSettings`].
//!
//! Off unless the section (with `otlp_endpoint`) is present: without it the relay builds no span
//! and allocates nothing per event for tracing. Invariant: a validated section has an `http(s)`
//! endpoint, a sampling ratio in `0.0..=1.0`, and a batch no larger than the queue (so a full
//! batch can always form), and every duration is non-zero.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{number_or_numeric_string, ConfigError};

/// The OTLP transports the exporter speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies, POSTed to `<endpoint>/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC (tonic), the collector's port 4317.
    Grpc,
}

impl OtlpProtocol {
    pub(crate) fn label(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct TracingSection {
    /// Base URL of the collector; absent or empty: no export.
    pub(crate) otlp_endpoint: Option<String>,
    pub(crate) protocol: String,
    #[serde(deserialize_with = "float_or_numeric_string")]
    pub(crate) sampling_ratio: f64,
    pub(crate) service_name: String,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) max_queue_size: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) max_export_batch_size: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) scheduled_delay_ms: u64,
    #[serde(deserialize_with = "number_or_numeric_string")]
    pub(crate) export_timeout_ms: u64,
}

impl Default for TracingSection {
    /// The OpenTelemetry SDK's batch-processor defaults, so the knobs read as users know them.
    fn default() -> Self {
        TracingSection {
            otlp_endpoint: None,
            protocol: "http/protobuf".into(),
            sampling_ratio: 1.0,
            service_name: "outbox-relay".into(),
            max_queue_size: 2048,
            max_export_batch_size: 512,
            scheduled_delay_ms: 1000,
            export_timeout_ms: 10_000,
        }
    }
}

/// `[tracing]`, validated: export is on.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Without a trailing `/`.
    pub(crate) endpoint: String,
    pub(crate) protocol: OtlpProtocol,
    /// Share of root spans (rows without a valid parent) that are sampled.
    pub(crate) sampling_ratio: f64,
    pub(crate) service_name: String,
    pub(crate) max_queue_size: usize,
    pub(crate) max_export_batch_size: usize,
    pub(crate) scheduled_delay: Duration,
    pub(crate) export_timeout: Duration,
}

impl TracingSettings {
    /// Where spans are sent: OTLP/HTTP posts to the signal's path under the base URL; gRPC
    /// takes the base URL (the service path is the protocol's).
    pub(crate) fn export_url(&self) -> String {
        match self.protocol {
            OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", self.endpoint),
            OtlpProtocol::Grpc => self.endpoint.clone(),
        }
    }
}

impl TracingSection {
    /// `None` when no endpoint is set: the section's other keys then have no effect.
    pub(crate) fn validate(self) -> Result<Option<TracingSettings>, ConfigError> {
        let endpoint = match self.otlp_endpoint.as_deref().map(str::trim) {
            None | Some("") => return Ok(None),
            Some(e) => e.trim_end_matches('/').to_owned(),
        };
        let scheme_ok = endpoint
            .split_once("://")
            .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && !rest.is_empty());
        if !scheme_ok {
            return Err(ConfigError::Invalid {
                key: "tracing.otlp_endpoint",
                message: format!(
                    "{endpoint:?} is not an http:// or https:// URL; set the collector's base URL, e.g. \
                     \"http://127.0.0.1:4318\" (http/protobuf) or \"http://127.0.0.1:4317\" (grpc)"
                ),
            });
        }
        let protocol = match self.protocol.trim() {
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            "grpc" => OtlpProtocol::Grpc,
            other => {
                return Err(ConfigError::Invalid {
                    key: "tracing.protocol",
                    message: format!(
                        "{other:?} is not an OTLP transport the relay speaks; set \"http/protobuf\" (the default) or \
                         \"grpc\" (http/json is not supported)"
                    ),
                })
            }
        };
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(ConfigError::Invalid {
                key: "tracing.sampling_ratio",
                message: format!(
                    "{} is outside 0.0..=1.0; set a share such as 1.0 (every root event), 0.01 (1 %) or 0.0 (only \
                     events whose row carries a sampled traceparent)",
                    self.sampling_ratio
                ),
            });
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::Invalid {
                key: "tracing.service_name",
                message: "is empty; remove the key for \"outbox-relay\" or name the service".into(),
            });
        }
        let positive = |key: &'static str, value: u64| {
            if value == 0 {
                Err(ConfigError::Invalid {
                    key,
                    message: "must be greater than zero; remove the key for its default".into(),
                })
            } else {
                Ok(value)
            }
        };
        let max_queue_size = positive("tracing.max_queue_size", self.max_queue_size)?;
        let max_export_batch_size = positive("tracing.max_export_batch_size", self.max_export_batch_size)?;
        if max_export_batch_size > max_queue_size {
            return Err(ConfigError::Invalid {
                key: "tracing.max_export_batch_size",
                message: format!(
                    "{max_export_batch_size} is larger than tracing.max_queue_size = {max_queue_size}: a batch is \
                     taken from the queue. Lower max_export_batch_size or raise max_queue_size"
                ),
            });
        }
        let scheduled_delay = positive("tracing.scheduled_delay_ms", self.scheduled_delay_ms)?;
        let export_timeout = positive("tracing.export_timeout_ms", self.export_timeout_ms)?;
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(Some(TracingSettings {
            endpoint,
            protocol,
            sampling_ratio: self.sampling_ratio,
            service_name: self.service_name.trim().to_owned(),
            max_queue_size: size(max_queue_size),
            max_export_batch_size: size(max_export_batch_size),
            scheduled_delay: Duration::from_millis(scheduled_delay),
            export_timeout: Duration::from_millis(export_timeout),
        }))
    }
}

/// Floats may also be written as numeric strings (what environment overrides produce), and as
/// integers (`sampling_ratio = 1`).
fn float_or_numeric_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        F(f64),
        I(i64),
        S(String),
    }
    match Num::deserialize(d)? {
        Num::F(f) => Ok(f),
        Num::I(i) => Ok(i as f64),
        Num::S(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("expected a number such as 0.25, got {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{OtlpProtocol, TracingSettings};
    use crate::config::test_support::{load, refusal};

    /// The batch knobs the tests below set: sampling ratio, service name, queue and batch sizes,
    /// scheduled delay, export timeout.
    fn knobs(t: &TracingSettings) -> (f64, &str, usize, usize, Duration, Duration) {
        (
            t.sampling_ratio,
            &t.service_name,
            t.max_queue_size,
            t.max_export_batch_size,
            t.scheduled_delay,
            t.export_timeout,
        )
    }

    #[test]
    fn absent_section_or_endpoint_exports_nothing() {
        assert_eq!(load("", &[]).unwrap().tracing, None);
        assert_eq!(load("[tracing]\nsampling_ratio = 0.5\n", &[]).unwrap().tracing, None);
    }

    #[test]
    fn defaults_are_the_sdk_batch_defaults() {
        let t = load("[tracing]\notlp_endpoint = \"http://127.0.0.1:4318/\"\n", &[])
            .unwrap()
            .tracing
            .unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:4318");
        assert_eq!(t.export_url(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(
            knobs(&t),
            (
                1.0,
                "outbox-relay",
                2048,
                512,
                Duration::from_secs(1),
                Duration::from_secs(10)
            )
        );
    }

    #[test]
    fn every_key_comes_from_the_file_or_the_environment() {
        let t = load(
            "[tracing]\nprotocol = \"grpc\"\nsampling_ratio = 1\n",
            &[
                ("OUTBOX_RELAY__TRACING__OTLP_ENDPOINT", "https://collector:4317"),
                ("OUTBOX_RELAY__TRACING__SAMPLING_RATIO", "0.25"),
                ("OUTBOX_RELAY__TRACING__SERVICE_NAME", "orders-relay"),
                ("OUTBOX_RELAY__TRACING__MAX_QUEUE_SIZE", "100"),
                ("OUTBOX_RELAY__TRACING__MAX_EXPORT_BATCH_SIZE", "10"),
                ("OUTBOX_RELAY__TRACING__SCHEDULED_DELAY_MS", "50"),
                ("OUTBOX_RELAY__TRACING__EXPORT_TIMEOUT_MS", "700"),
            ],
        )
        .unwrap()
        .tracing
        .unwrap();
        assert_eq!(t.protocol, OtlpProtocol::Grpc);
        assert_eq!(t.export_url(), "https://collector:4317");
        assert_eq!(
            knobs(&t),
            (
                0.25,
                "orders-relay",
                100,
                10,
                Duration::from_millis(50),
                Duration::from_millis(700)
            )
        );
    }

    #[test]
    fn each_mistake_names_its_key_and_the_fix() {
        let err = |extra: &str| refusal(&format!("[tracing]\notlp_endpoint = \"http://c:4318\"\n{extra}"), &[]);
        let e = err("sampling_ratio = 1.5\n");
        assert!(e.contains("tracing.sampling_ratio") && e.contains("0.0..=1.0"), "{e}");
        let e = err("sampling_ratio = -0.1\n");
        assert!(e.contains("tracing.sampling_ratio"), "{e}");
        let e = err("max_queue_size = 10\nmax_export_batch_size = 20\n");
        assert!(
            e.contains("tracing.max_export_batch_size") && e.contains("raise max_queue_size"),
            "{e}"
        );
        let e = err("protocol = \"http/json\"\n");
        assert!(e.contains("tracing.protocol") && e.contains("\"grpc\""), "{e}");
        let e = err("scheduled_delay_ms = 0\n");
        assert!(
            e.contains("tracing.scheduled_delay_ms") && e.contains("greater than zero"),
            "{e}"
        );
        let e = err("service_name = \" \"\n");
        assert!(e.contains("tracing.service_name"), "{e}");
        let e = err("endpoint = \"x\"\n");
        assert!(e.contains("unknown field `endpoint`"), "{e}");
        let e = refusal("[tracing]\notlp_endpoint = \"127.0.0.1:4318\"\n", &[]);
        assert!(
            e.contains("tracing.otlp_endpoint") && e.contains("http://127.0.0.1:4318"),
            "{e}"
        );
        let e = refusal("[tracing]\notlp_endpoint = \"grpc://c:4317\"\n", &[]);
        assert!(e.contains("is not an http:// or https:// URL"), "{e}");
    }
}
