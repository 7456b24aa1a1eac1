//! outbox-relay: a transactional-outbox relay from PostgreSQL logical replication to Kafka.
//!
//! The folders are the architecture (`docs/architecture.md` draws it), lowest layer first:
//!
//! | layer | modules | may import |
//! |---|---|---|
//! | leaves | [`config`], [`failpoints`] | nothing of the crate |
//! | adapters | [`postgres`], [`kafka`], [`ops`] | `config` |
//! | domain | [`outbox`] | `config`, adapters |
//! | pipelines and control | [`relay`], [`poll`], [`control`] | the layers below (`poll` and `control` never `relay`'s internals) |
//! | entry points | [`demo`], [`cli`] | everything |
//!
//! `tests/it/layering.rs` fails the build's tests if an import goes upward.

pub mod cli;
pub mod config;
pub mod control;
#[cfg(feature = "demo")]
pub mod demo;
pub mod failpoints;
pub mod kafka;
pub mod ops;
pub mod outbox;
pub mod poll;
pub mod postgres;
pub mod relay;
