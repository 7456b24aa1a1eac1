//! Operating the process: metrics (every name in one place), health for the probes, the exact
//! commit-to-ack latency window, the HTTP server that serves them, logging, retry backoff with
//! a shutdown-aware wait, and byte counts for people.
//!
//! Invariant: used by the pipeline, the poller and the control plane; imports only `config`.

pub mod health;
pub mod http;
pub mod latency;
pub mod logging;
pub mod metrics;
pub mod retry;
pub mod units;
