//! The single integration-test binary (`cargo test --test it`).
//!
//! One binary keeps link time down and lets every test share one lazily started
//! PostgreSQL cluster (see `harness`). Layout: the test suites are the files next to this
//! one (add them as plain `mod` lines); everything they share — servers, the relay process,
//! workloads, checks, fault helpers — lives under `harness/`, and no suite imports another.

mod backfill;
mod backpressure;
mod cloudevents;
mod conformance;
mod control_plane;
mod debezium;
mod debezium_slot;
mod demo;
mod deploy_docs;
mod e2e_relay;
mod exactly_once;
mod examples;
mod failover;
mod failures;
mod first_steps;
mod ha_and_metrics;
mod harness;
mod harness_smoke;
mod import_debezium;
mod journal;
mod kafka_replication;
mod kafka_settings;
mod kafka_transactions;
mod layering;
mod multi_table;
mod nemesis;
mod otlp;
mod outage_logs;
mod pg_versions;
mod poll;
mod replay;
mod retention;
mod roles;
mod sink_kinesis;
mod sink_nats;
mod sink_pubsub;
mod sink_rabbitmq;
mod sink_redis;
mod sink_sns;
mod sink_sqs;
mod sink_webhook;
mod stream_shapes;
mod streaming;
