//! `[tracing]`: one OTLP PRODUCER span per published event, exported off the publishing path.
//!
//! The pipeline asks a [`Tracer`] for a [`ProducerSpan`] before it sends a record (the span's id
//! must be in the record's `traceparent` header), and hands it back, ended, when the broker's
//! acknowledgement arrives. Ending a span is a non-blocking `try_send` into a bounded queue of
//! `tracing.max_queue_size`; a background task takes batches of up to
//! `tracing.max_export_batch_size` every `tracing.scheduled_delay_ms` and calls the OTLP
//! exporter. Invariant: publishing never waits for tracing — a full queue drops the span and
//! counts it (`outbox_relay_spans_dropped_total`), a failed or slow export only costs spans.
//! The SDK's `BatchSpanProcessor` is not used: it cannot report its drops.
//!
//! Sampling: a span with a valid parent follows the parent's sampled flag; a root span (the row
//! carried no valid `traceparent`) is sampled when its trace id falls under
//! `tracing.sampling_ratio`, the rule of the SDK's `TraceIdRatioBased` sampler.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::counter;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanExporter, SpanLinks};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::config::tracing::{OtlpProtocol, TracingSettings};
use crate::ops::metrics::{SPANS_DROPPED, SPANS_EXPORTED, SPAN_EXPORT_ERRORS};

/// The exporter could not be built from the settings.
#[derive(Debug, thiserror::Error)]
#[error("[tracing] cannot start the OTLP {protocol} exporter for {url}: {cause}. Check tracing.otlp_endpoint")]
pub struct ExporterError {
    protocol: &'static str,
    url: String,
    cause: String,
}

/// What the pipeline knows about the record a span describes.
pub(crate) struct SpanFields<'a> {
    /// `messaging.system`: the sink plugin's name for its broker (`sink::trace_names`).
    pub(crate) system: &'static str,
    /// Topic, subject, routing key or stream.
    pub(crate) destination: &'a str,
    /// The event id (`messaging.message.id`).
    pub(crate) message_id: &'a [u8],
    /// The record key and the attribute the broker's conventions put it in
    /// (`messaging.kafka.message.key`); `None` for a broker without one.
    pub(crate) key: Option<(&'static str, &'a [u8])>,
    /// The partition the record was sent to, when the relay chose it.
    pub(crate) partition: Option<i32>,
    /// The row's `tracestate`, kept in the span context as read.
    pub(crate) tracestate: Option<&'a [u8]>,
}

/// A started PRODUCER span: its ids exist (for the record's `traceparent`); it is exported only
/// if `sampled`, once [`Tracer::end`] gets it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProducerSpan {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// The row's span; `None`: a root span.
    pub(crate) parent: Option<SpanId>,
    pub(crate) sampled: bool,
    tracestate: Option<String>,
    pub(crate) name: String,
    /// The transaction's commit time.
    pub(crate) start_unix_us: i64,
    pub(crate) attributes: Vec<KeyValue>,
}

impl ProducerSpan {
    /// The W3C `traceparent` naming this span: the consumer's span becomes its child.
    pub(crate) fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{}",
            self.trace_id,
            self.span_id,
            if self.sampled { "01" } else { "00" }
        )
    }

    /// The exportable span, ended at `end` (`error`: why the delivery failed).
    pub(crate) fn into_span_data(
        self,
        end: SystemTime,
        error: Option<String>,
        scope: &InstrumentationScope,
    ) -> SpanData {
        let start = UNIX_EPOCH + Duration::from_micros(u64::try_from(self.start_unix_us).unwrap_or(0));
        let trace_state = self
            .tracestate
            .as_deref()
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default();
        SpanData {
            span_context: SpanContext::new(self.trace_id, self.span_id, TraceFlags::SAMPLED, false, trace_state),
            parent_span_id: self.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: self.parent.is_some(),
            span_kind: SpanKind::Producer,
            name: Cow::Owned(self.name),
            start_time: start,
            // The broker may acknowledge before the clock passes the commit time of another host.
            end_time: end.max(start),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: error.map_or(Status::Unset, Status::error),
            instrumentation_scope: scope.clone(),
        }
    }
}

/// An ended span on its way to the exporter.
struct Ended {
    span: ProducerSpan,
    end: SystemTime,
    error: Option<String>,
}

/// Starts spans and queues ended ones; cheap to clone (one per pipeline thread).
#[derive(Debug, Clone)]
pub(crate) struct Tracer {
    queue: mpsc::Sender<Ended>,
    /// Root spans whose trace id's low 63 bits are below this are sampled.
    ratio_bound: u64,
}

impl std::fmt::Debug for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ended").field("span", &self.span.span_id).finish()
    }
}

impl Tracer {
    /// A span for a record about to be sent. `parent`: the row's `traceparent` if it is valid
    /// (the caller checks; an invalid one makes a root span). `None`: an unsampled root, for
    /// which nothing is written or exported.
    pub(crate) fn start(
        &self,
        parent: Option<&[u8]>,
        start_unix_us: i64,
        fields: &SpanFields<'_>,
    ) -> Option<ProducerSpan> {
        let ids = RandomIdGenerator::default();
        let (trace_id, parent_id, sampled) = match parent.and_then(parse_traceparent) {
            Some((trace_id, parent_id, flags)) => (trace_id, Some(parent_id), flags & 1 == 1),
            None => {
                let trace_id = ids.new_trace_id();
                if !self.samples(trace_id) {
                    return None;
                }
                (trace_id, None, true)
            }
        };
        let mut attributes = Vec::with_capacity(7);
        if sampled {
            attributes.extend([
                KeyValue::new("messaging.system", fields.system),
                KeyValue::new("messaging.destination.name", fields.destination.to_owned()),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.operation.name", "send"),
                KeyValue::new(
                    "messaging.message.id",
                    String::from_utf8_lossy(fields.message_id).into_owned(),
                ),
            ]);
            if let Some((attribute, key)) = fields.key.filter(|(_, k)| !k.is_empty()) {
                attributes.push(KeyValue::new(attribute, String::from_utf8_lossy(key).into_owned()));
            }
            if let Some(p) = fields.partition {
                attributes.push(KeyValue::new("messaging.destination.partition.id", p.to_string()));
            }
        }
        Some(ProducerSpan {
            trace_id,
            span_id: ids.new_span_id(),
            parent: parent_id,
            sampled,
            tracestate: fields
                .tracestate
                .filter(|_| sampled)
                .map(|t| String::from_utf8_lossy(t).into_owned()),
            name: if sampled {
                format!("send {}", fields.destination)
            } else {
                String::new()
            },
            start_unix_us,
            attributes,
        })
    }

    /// The `TraceIdRatioBased` rule: the trace id's low 63 bits against the ratio.
    fn samples(&self, trace_id: TraceId) -> bool {
        let low = u64::from_be_bytes(trace_id.to_bytes()[8..16].try_into().unwrap_or_default()) >> 1;
        low < self.ratio_bound
    }

    /// Ends `span` now; queued for export if it is sampled and the queue has room (else
    /// counted as dropped). Never waits.
    pub(crate) fn end(&self, span: ProducerSpan, error: Option<String>) {
        if !span.sampled {
            return;
        }
        let ended = Ended {
            span,
            end: SystemTime::now(),
            error,
        };
        if self.queue.try_send(ended).is_err() {
            counter!(SPANS_DROPPED, "reason" => "queue_full").increment(1);
        }
    }
}

/// A tracer whose ended spans stay in a queue of `capacity` for a test to read (no exporter).
#[cfg(test)]
pub(crate) fn test_tracer(ratio: f64, capacity: usize) -> (Tracer, TestSpans) {
    let (queue, rx) = mpsc::channel(capacity);
    (
        Tracer {
            queue,
            ratio_bound: ratio_bound(ratio),
        },
        TestSpans(rx),
    )
}

/// What [`test_tracer`]'s tracer queued.
#[cfg(test)]
pub(crate) struct TestSpans(mpsc::Receiver<Ended>);

#[cfg(test)]
impl TestSpans {
    /// The next ended span and its error, if one was queued.
    pub(crate) fn next(&mut self) -> Option<(ProducerSpan, Option<String>)> {
        self.0.try_recv().ok().map(|e| (e.span, e.error))
    }
}

/// The bound for [`Tracer::samples`]: 2^63 × ratio (1.0 samples every id).
fn ratio_bound(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else {
        (ratio.max(0.0) * (1u64 << 63) as f64) as u64
    }
}

/// A valid `traceparent`'s trace id, parent id and flags.
fn parse_traceparent(value: &[u8]) -> Option<(TraceId, SpanId, u8)> {
    let text = std::str::from_utf8(value).ok()?;
    let trace_id = TraceId::from_hex(text.get(3..35)?).ok()?;
    let span_id = SpanId::from_hex(text.get(36..52)?).ok()?;
    let flags = u8::from_str_radix(text.get(53..55)?, 16).ok()?;
    Some((trace_id, span_id, flags))
}

/// The export task; dropping every [`Tracer`] makes it export what is queued and stop.
pub(crate) struct ExportTask {
    handle: JoinHandle<()>,
    timeout: Duration,
}

impl ExportTask {
    /// Waits (at most one export timeout) for the last batch to go out.
    pub(crate) async fn finish(self) {
        let _ = tokio::time::timeout(self.timeout, self.handle).await;
    }
}

/// The OTLP exporter `settings` describe, built and dropped: `setup` and `setup --check` refuse
/// what [`start`] would (the same error, so the same words as `run`'s).
pub(crate) fn check(settings: &TracingSettings) -> Result<(), ExporterError> {
    exporter(settings).map(drop)
}

fn exporter(settings: &TracingSettings) -> Result<opentelemetry_otlp::SpanExporter, ExporterError> {
    let url = settings.export_url();
    let built = match settings.protocol {
        OtlpProtocol::HttpProtobuf => {
            use opentelemetry_otlp::WithExportConfig;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .with_timeout(settings.export_timeout)
                .build()
        }
        OtlpProtocol::Grpc => {
            use opentelemetry_otlp::WithExportConfig;
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url.clone())
                .with_timeout(settings.export_timeout)
                .build()
        }
    };
    built.map_err(|e| ExporterError {
        protocol: settings.protocol.label(),
        url,
        cause: e.to_string(),
    })
}

/// Builds the OTLP exporter and spawns its task on the current runtime.
pub(crate) fn start(settings: &TracingSettings) -> Result<(Tracer, ExportTask), ExporterError> {
    let mut exporter = exporter(settings)?;
    exporter.set_resource(
        &Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .build(),
    );
    let (queue, spans) = mpsc::channel(settings.max_queue_size);
    let handle = tokio::spawn(export_loop(exporter, spans, settings.clone()));
    Ok((
        Tracer {
            queue,
            ratio_bound: ratio_bound(settings.sampling_ratio),
        },
        ExportTask {
            handle,
            timeout: settings.export_timeout,
        },
    ))
}

/// Collects up to a batch or until the scheduled delay passes, exports, repeats; once every
/// sender is gone, exports the rest and ends.
async fn export_loop(exporter: impl SpanExporter, mut spans: mpsc::Receiver<Ended>, settings: TracingSettings) {
    let scope = InstrumentationScope::builder("outbox-relay")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let max = settings.max_export_batch_size;
    let mut pending: Vec<Ended> = Vec::with_capacity(max);
    let mut warned = false;
    loop {
        let deadline = tokio::time::Instant::now() + settings.scheduled_delay;
        let mut closed = false;
        while pending.len() < max {
            let room = max - pending.len();
            match tokio::time::timeout_at(deadline, spans.recv_many(&mut pending, room)).await {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if !pending.is_empty() {
            let batch: Vec<SpanData> = pending
                .drain(..)
                .map(|e| e.span.into_span_data(e.end, e.error, &scope))
                .collect();
            let n = batch.len() as u64;
            match tokio::time::timeout(settings.export_timeout, exporter.export(batch)).await {
                Ok(Ok(())) => {
                    counter!(SPANS_EXPORTED).increment(n);
                    warned = false;
                }
                outcome => {
                    counter!(SPAN_EXPORT_ERRORS).increment(1);
                    counter!(SPANS_DROPPED, "reason" => "export_failed").increment(n);
                    // Once per outage: the metric counts the rest.
                    if !warned {
                        let cause = match outcome {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("no answer within {} ms", settings.export_timeout.as_millis()),
                        };
                        warn!(endpoint = %settings.export_url(), error = %cause, spans = n, "[tracing] OTLP export failed; spans are dropped until it works again");
                        warned = true;
                    }
                }
            }
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn check_refuses_an_endpoint_the_exporter_cannot_use_as_start_would() {
        for protocol in ["http/protobuf", "grpc"] {
            let tracing = |endpoint: &str| {
                crate::config::test_support::settings(&format!(
                    "[tracing]\notlp_endpoint = \"{endpoint}\"\nprotocol = \"{protocol}\"\n"
                ))
                .tracing
                .expect("[tracing] configured")
            };
            let bad = tracing("http://no spaces in hosts:4318");
            let refused = check(&bad).expect_err("an unusable endpoint is refused");
            let started = start(&bad).err().expect("start refuses it too");
            assert_eq!(refused.to_string(), started.to_string());
            assert!(refused.to_string().contains("Check tracing.otlp_endpoint"), "{refused}");
            check(&tracing("http://127.0.0.1:4318")).expect("a usable endpoint passes");
        }
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn tracer(ratio: f64) -> (Tracer, mpsc::Receiver<Ended>) {
        let (queue, rx) = mpsc::channel(2);
        (
            Tracer {
                queue,
                ratio_bound: ratio_bound(ratio),
            },
            rx,
        )
    }

    fn fields() -> SpanFields<'static> {
        SpanFields {
            system: "kafka",
            destination: "orders",
            message_id: b"evt-1",
            key: Some(("messaging.kafka.message.key", b"agg-1")),
            partition: None,
            tracestate: Some(b"vendor=x"),
        }
    }

    fn attr(span: &ProducerSpan, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn a_valid_parent_is_continued_with_a_new_span_id() {
        let (t, _rx) = tracer(0.0);
        let span = t
            .start(Some(PARENT.as_bytes()), 1_700_000_000_000_000, &fields())
            .unwrap();
        assert_eq!(span.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert_ne!(span.span_id, span.parent.unwrap());
        assert!(span.sampled, "the parent's flag wins over sampling_ratio = 0");
        assert_eq!(span.name, "send orders");
        let tp = span.traceparent();
        assert_eq!(tp, format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", span.span_id));
        assert_eq!(attr(&span, "messaging.system").as_deref(), Some("kafka"));
        assert_eq!(attr(&span, "messaging.destination.name").as_deref(), Some("orders"));
        assert_eq!(attr(&span, "messaging.operation.type").as_deref(), Some("send"));
        assert_eq!(attr(&span, "messaging.operation.name").as_deref(), Some("send"));
        assert_eq!(attr(&span, "messaging.message.id").as_deref(), Some("evt-1"));
        assert_eq!(attr(&span, "messaging.kafka.message.key").as_deref(), Some("agg-1"));
        assert_eq!(attr(&span, "messaging.destination.partition.id"), None);
    }

    #[test]
    fn an_unsampled_parent_gives_an_unsampled_span_that_is_never_queued() {
        let (t, mut rx) = tracer(1.0);
        let parent = PARENT.replace("-01", "-00");
        let span = t.start(Some(parent.as_bytes()), 0, &fields()).unwrap();
        assert!(!span.sampled);
        assert!(span.traceparent().ends_with("-00"));
        assert!(span.attributes.is_empty(), "nothing is built for a span nobody sees");
        t.end(span, None);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn root_spans_follow_the_sampling_ratio() {
        let (all, _) = tracer(1.0);
        let span = all.start(None, 0, &fields()).unwrap();
        assert!(span.sampled && span.parent.is_none());
        let (none, _) = tracer(0.0);
        assert!((0..100).all(|_| none.start(None, 0, &fields()).is_none()));
        let (half, _) = tracer(0.5);
        let sampled = (0..2000).filter(|_| half.start(None, 0, &fields()).is_some()).count();
        assert!((800..1200).contains(&sampled), "{sampled} of 2000 at 0.5");
    }

    #[test]
    fn span_data_is_a_producer_span_from_commit_to_ack_with_the_failure() {
        let (t, _rx) = tracer(1.0);
        let mut f = fields();
        f.partition = Some(3);
        let span = t.start(Some(PARENT.as_bytes()), 1_700_000_000_000_000, &f).unwrap();
        assert_eq!(attr(&span, "messaging.destination.partition.id").as_deref(), Some("3"));
        let scope = InstrumentationScope::builder("test").build();
        let end = UNIX_EPOCH + Duration::from_micros(1_700_000_000_250_000);
        let data = span.clone().into_span_data(end, Some("broker down".into()), &scope);
        assert_eq!(data.span_kind, SpanKind::Producer);
        assert_eq!(data.name, "send orders");
        assert_eq!(data.span_context.span_id(), span.span_id);
        assert_eq!(data.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(data.parent_span_is_remote);
        assert_eq!(data.span_context.trace_state().header(), "vendor=x");
        assert_eq!(
            data.start_time,
            UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_000)
        );
        assert_eq!(
            data.end_time.duration_since(data.start_time).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(data.status, Status::error("broker down"));
        let early = span.into_span_data(UNIX_EPOCH, None, &scope);
        assert_eq!(early.end_time, early.start_time, "end never precedes start");
        assert_eq!(early.status, Status::Unset);
    }

    #[test]
    fn a_full_queue_drops_without_waiting() {
        let (t, mut rx) = tracer(1.0);
        for _ in 0..3 {
            let span = t.start(None, 0, &fields()).unwrap();
            t.end(span, None);
        }
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err(), "the third did not fit and was dropped");
    }

    #[tokio::test]
    async fn both_protocols_build_an_exporter_and_stop_when_the_tracers_are_gone() {
        for (protocol, port) in [("http/protobuf", 4318), ("grpc", 4317)] {
            let settings = crate::config::test_support::settings(&format!(
                "[tracing]\notlp_endpoint = \"http://127.0.0.1:{port}\"\nprotocol = \"{protocol}\"\n"
            ))
            .tracing
            .unwrap();
            let (tracer, task) = start(&settings).unwrap_or_else(|e| panic!("{protocol}: {e}"));
            drop(tracer);
            tokio::time::timeout(Duration::from_secs(5), task.handle)
                .await
                .expect("the export task ends once no tracer is left")
                .unwrap();
        }
    }
}
