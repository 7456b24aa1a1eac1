//! The HTTP endpoints of `outbox-relay run` (`[http] listen`; no server when it is absent):
//!
//! * `GET /metrics` — Prometheus text format (names in `src/ops/metrics.rs`);
//! * `GET /healthz` — 200 while the process runs (liveness);
//! * `GET /readyz` — 200 while streaming with lag under `ready_max_lag_seconds`, or standing by
//!   with a healthy slot (or, for `outbox-relay poll`, while polling); 503 otherwise. The body
//!   says why, in one line;
//! * `GET /latency[?reset=true]` — exact commit-to-ack percentiles (JSON, see `crate::ops::latency`)
//!   since start or the last reset; `reset=true` closes that window and opens a new one.
//!
//! The Prometheus recorder is installed without its own listener; this server renders it. The
//! server lives as long as the returned [`HttpServer`] (it keeps answering while the relay drains
//! on shutdown, so a probe does not kill a draining relay).
//!
//! Nothing served here contains configuration values, so no secret can leak through it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::http::HttpSettings;
use crate::ops::health::RelayHealth;
use crate::ops::metrics::{COMMIT_TO_ACK_BUCKETS, COMMIT_TO_ACK_SECONDS};

/// How often histogram samples are folded and idle state pruned between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error("cannot listen on {addr} ([http] listen): {source}. Pick a free address, or remove the key to run without the HTTP endpoints")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot install the Prometheus metrics recorder: {0}")]
    Recorder(#[from] metrics_exporter_prometheus::BuildError),
}

/// The running server; dropping it stops the server.
pub(crate) struct HttpServer {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct AppState {
    metrics: PrometheusHandle,
    health: Arc<RelayHealth>,
    ready_max_lag: Duration,
}

/// Installs the metrics recorder and starts serving, if `[http] listen` is set.
pub(crate) async fn start(settings: &HttpSettings, health: Arc<RelayHealth>) -> Result<Option<HttpServer>, HttpError> {
    let Some(addr) = settings.listen else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| HttpError::Bind { addr, source })?;
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(COMMIT_TO_ACK_SECONDS.to_owned()), COMMIT_TO_ACK_BUCKETS)?
        .install_recorder()?;
    crate::ops::metrics::describe();
    health.set_mode(health.mode()); // the gauge was a no-op before the recorder existed

    let upkeep_handle = metrics.clone();
    let upkeep = tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            upkeep_handle.run_upkeep();
        }
    });
    let state = Arc::new(AppState {
        metrics,
        health,
        ready_max_lag: settings.ready_max_lag,
    });
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/latency", get(latency))
        .with_state(state);
    let server = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "the HTTP endpoints stopped");
        }
    });
    info!(listen = %addr, "serving /metrics, /healthz, /readyz and /latency");
    Ok(Some(HttpServer {
        tasks: vec![server, upkeep],
    }))
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], state.metrics.render())
}

async fn latency(uri: Uri) -> impl IntoResponse {
    let reset = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "reset=true" || kv == "reset=1"));
    let summary = crate::ops::latency::commit_to_ack().summary(reset);
    let body = serde_json::to_string(&summary).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body + "\n")
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, String) {
    match state.health.readiness(state.ready_max_lag) {
        Ok(why) => (StatusCode::OK, format!("ready: {why}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}
