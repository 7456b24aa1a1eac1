//! The single integration-test binary (`cargo test --test it`).
//!
//! One binary keeps link time down and lets every test share one lazily started
//! PostgreSQL cluster (see `harness`). Add test modules as plain `mod` lines.

mod backfill;
mod control_plane;
mod demo;
mod deploy_docs;
mod e2e_relay;
mod examples;
mod failures;
mod fault_support;
mod ha_and_metrics;
mod harness;
mod harness_smoke;
mod layering;
mod poll;
mod stream_shapes;
