//! The single integration-test binary (`cargo test --test it`).
//!
//! One binary keeps link time down and lets every test share one lazily started
//! PostgreSQL cluster (see `harness`). Add test modules as plain `mod` lines.

mod control_plane;
mod e2e_relay;
mod harness;
mod harness_smoke;
