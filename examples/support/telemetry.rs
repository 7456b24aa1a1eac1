//! The examples' OpenTelemetry, set up the way a service would: one tracer provider per service
//! with the W3C trace-context propagator. Spans go over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`
//! when it is set (the variable every OpenTelemetry SDK reads, e.g. `http://127.0.0.1:4318`),
//! and nowhere otherwise; their ids are real either way, so a trace continues through the outbox
//! row (`traceparent` column), the relay (its `send` span with `[tracing]`) and the consumer.
//!
//! Shared by both examples and the integration tests (`#[path]`-included there).

// Each includer uses its own part (the producer injects, the consumer extracts, tests export to
// memory).
#![allow(dead_code)]

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::TokioCurrentThread;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter};
use opentelemetry_sdk::Resource;

/// A service's tracer and the provider that exports its spans.
pub struct Telemetry {
    provider: SdkTracerProvider,
    pub tracer: SdkTracer,
}

impl Telemetry {
    /// From the environment: OTLP/HTTP export to `OTEL_EXPORTER_OTLP_ENDPOINT` when it is set,
    /// else none.
    pub fn from_env(service: &'static str) -> Result<Telemetry, opentelemetry_otlp::ExporterBuildError> {
        Telemetry::otlp(service, std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().as_deref())
    }

    /// Spans exported over OTLP/HTTP (protobuf) to `endpoint` (a collector's base URL, e.g.
    /// `http://127.0.0.1:4318`; `/v1/traces` is appended, as the OTLP spec says for it), or
    /// nowhere when `None`.
    pub fn otlp(
        service: &'static str,
        endpoint: Option<&str>,
    ) -> Result<Telemetry, opentelemetry_otlp::ExporterBuildError> {
        let Some(endpoint) = endpoint else {
            return Ok(Telemetry::with_provider(service, SdkTracerProvider::builder()));
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .build()?;
        // Batched on a thread of its own (its own current-thread runtime), so exporting never
        // runs on the service's runtime and shutting down can wait for the last batch.
        let processor = BatchSpanProcessor::builder(exporter, TokioCurrentThread).build();
        Ok(Telemetry::with_provider(
            service,
            SdkTracerProvider::builder().with_span_processor(processor),
        ))
    }

    /// Spans handed to `exporter` as each ends (tests: an in-memory exporter).
    pub fn with_exporter(service: &'static str, exporter: impl SpanExporter + 'static) -> Telemetry {
        Telemetry::with_provider(service, SdkTracerProvider::builder().with_simple_exporter(exporter))
    }

    fn with_provider(service: &'static str, builder: opentelemetry_sdk::trace::TracerProviderBuilder) -> Telemetry {
        let provider = builder
            .with_resource(Resource::builder_empty().with_service_name(service).build())
            .build();
        let tracer = provider.tracer(service);
        Telemetry { provider, tracer }
    }

    /// Exports what is still batched; call before the process exits.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("telemetry: the last spans were not exported: {e}");
        }
    }
}

/// The W3C `traceparent` of `cx`'s span, as the propagator writes it (`None` if it has no valid
/// span context).
pub fn traceparent(cx: &Context) -> Option<String> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The remote parent named by a record's `traceparent` and `tracestate` header values; an empty
/// context (a new trace) when `traceparent` is missing or invalid.
pub fn remote_parent(traceparent: Option<&[u8]>, tracestate: Option<&[u8]>) -> Context {
    let carrier: HashMap<String, String> = [("traceparent", traceparent), ("tracestate", tracestate)]
        .into_iter()
        .filter_map(|(name, value)| Some((name.to_owned(), std::str::from_utf8(value?).ok()?.to_owned())))
        .collect();
    TraceContextPropagator::new().extract(&carrier)
}
