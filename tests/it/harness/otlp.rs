//! Test OTLP collectors keeping every span with its resource's `service.name`: over HTTP, a small
//! HTTP/1.1 server taking `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` (decoded
//! with the `opentelemetry-proto` types); over gRPC, the generated `TraceService` server on
//! tonic's transport. Used by the relay's `[tracing]` tests and the examples' end-to-end trace.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::util::wait_until;

/// One exported span with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct Exported {
    pub service: Option<String>,
    pub span: Span,
}

/// A test OTLP/HTTP collector: `POST /v1/traces` with a protobuf body, answered 200.
pub struct Receiver {
    /// `http://127.0.0.1:<port>`, for `[tracing] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
        let sink = Arc::clone(&spans);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let sink = Arc::clone(&sink);
                tokio::spawn(async move {
                    let _ = serve(stream, sink).await;
                });
            }
        });
        Receiver { endpoint, spans, task }
    }

    /// The same over gRPC: `endpoint` is for `[tracing] protocol = "grpc"`.
    pub async fn start_grpc() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
        let service = TraceServiceServer::new(GrpcSink(Arc::clone(&spans)));
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        Receiver { endpoint, spans, task }
    }

    pub fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans once at least `n` arrived, or what arrived within 60 s.
    pub async fn wait_for(&self, n: usize) -> Vec<Exported> {
        wait_until(Duration::from_secs(60), Duration::from_millis(100), || async {
            self.spans().len() >= n
        })
        .await;
        self.spans()
    }
}

/// Keeps every span of an export request with its resource's `service.name`.
fn keep(sink: &Mutex<Vec<Exported>>, request: ExportTraceServiceRequest) {
    let mut spans = sink.lock().unwrap();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| string_attr(&r.attributes, "service.name"));
        for ss in rs.scope_spans {
            spans.extend(ss.spans.into_iter().map(|span| Exported {
                service: service.clone(),
                span,
            }));
        }
    }
}

struct GrpcSink(Arc<Mutex<Vec<Exported>>>);

#[tonic::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// One keep-alive connection: requests until the client closes it.
async fn serve(stream: tokio::net::TcpStream, sink: Arc<Mutex<Vec<Exported>>>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut request_line = String::new();
        if read.read_line(&mut request_line).await? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            read.read_line(&mut line).await?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        read.read_exact(&mut body).await?;
        let status = if request_line.starts_with("POST /v1/traces ") {
            match ExportTraceServiceRequest::decode(&body[..]) {
                Ok(request) => {
                    keep(&sink, request);
                    "200 OK"
                }
                Err(_) => "400 Bad Request",
            }
        } else {
            "404 Not Found"
        };
        let response =
            format!("HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
        write.write_all(response.as_bytes()).await?;
    }
}

pub fn string_attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => s.clone(),
            AnyValue::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

/// Lowercase hex, as W3C trace context writes ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
