//! outbox-relay: a transactional-outbox relay from PostgreSQL logical replication to a sink —
//! Kafka, NATS JetStream, RabbitMQ, Redis Streams, HTTP webhooks, Pub/Sub, SQS, SNS or Kinesis.
//!
//! The folders are the architecture (`docs/architecture.md` draws it), lowest layer first:
//!
//! | layer | modules | may import |
//! |---|---|---|
//! | leaves | [`config`], `failpoints`, `backoff` | nothing of the crate |
//! | adapters | [`postgres`], `sink` (the publish interface and its brokers), [`ops`] | `config` |
//! | domain | `outbox` | `config`, adapters |
//! | pipelines and control | `relay`, `poll`, [`control`], `retention` | the layers below (`poll` and `control` never `relay`'s internals; `relay` and `poll` start `retention`) |
//! | entry points | `demo`, [`cli`] | everything |
//!
//! `tests/it/layering.rs` fails the build's tests if an import goes upward.
//!
//! The public surface is what the binary, the integration tests, the fuzz target and the
//! benchmark use: [`cli::main`], [`config::Settings`], [`control`]'s `setup` / `status` /
//! `teardown` and their reports, the pgoutput decoder and frame codec ([`postgres`]), the latency
//! summary ([`ops`]) and the throwaway cluster (`demo`). Everything else is `pub(crate)`.

pub(crate) mod backoff;
pub mod cli;
pub mod config;
pub mod control;
#[cfg(feature = "demo")]
pub mod demo;
pub(crate) mod failpoints;
pub mod ops;
pub(crate) mod outbox;
pub(crate) mod poll;
pub mod postgres;
pub(crate) mod relay;
pub(crate) mod retention;
pub(crate) mod sink;
