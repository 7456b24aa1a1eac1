//! Operating the process: metrics (every name in one place), health for the probes, the exact
//! commit-to-ack latency window, the HTTP server that serves them, logging, retry backoff with
//! a shutdown-aware wait, byte counts for people, and the OTLP span export of `[tracing]`.
//!
//! Invariant: used by the pipeline, the poller and the control plane; imports only `config`.

pub(crate) mod health;
pub(crate) mod http;
pub mod latency;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod retry;
pub(crate) mod tracing_export;
pub(crate) mod units;

/// A multi-threaded runtime with `workers` worker threads and every driver on; the error is a
/// sentence for stderr.
pub(crate) fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}
