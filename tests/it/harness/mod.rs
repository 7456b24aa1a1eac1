//! Shared integration-test harness: real PostgreSQL, in-process or standalone Kafka,
//! the relay binary as a child process, and helpers to generate and check traffic.
//!
//! Every wait in here is bounded, and every process started here is tied to the test
//! process by a watchdog, so a crashed or killed test binary leaks no servers.
//!
//! # PostgreSQL ([`postgres`])
//! * [`shared_cluster()`]`.await -> &'static PgCluster`: one cluster per test binary,
//!   started on first use. Tests that only need a database of their own use it:
//!   `let db = unique_name("t"); pg.create_database(&db).await;`.
//!   If `OUTBOX_RELAY_TEST_PG_URL` is set (a `postgres://` URL of a superuser that may
//!   create databases and logical slots on a `wal_level=logical` server), that server is
//!   the shared cluster instead; it then has no TLS user ([`PgCluster::scram_url`] and
//!   [`PgCluster::ca_cert_path`] return `None`).
//! * [`PgCluster::start_dedicated`]`(&[("max_slot_wal_keep_size", "1MB")]).await ->
//!   Option<PgCluster>`: a private cluster for tests that stop, restart, kill or
//!   reconfigure the server. `None` (after a loud message) when the external server is
//!   in use: such tests must `return` then.
//! * Every local cluster is the library's throwaway cluster (`outbox_relay::demo::postgres`,
//!   also behind `outbox-relay demo` and the benchmark), configured by [`postgres`]:
//!   PostgreSQL 15 on 127.0.0.1 on a free port (never 5432),
//!   `wal_level=logical`, 128 slots, 64 senders, `wal_sender_timeout=5s`, `fsync=off`, TLS on with
//!   a throwaway CA ([`PgCluster::ca_cert_path`]); users: `postgres` (trust) and
//!   [`SCRAM_USER`] (superuser, SCRAM password [`SCRAM_PASSWORD`], TLS only except for
//!   replication connections).
//! * URLs: [`PgCluster::url`] (superuser, no password), [`PgCluster::scram_url`]
//!   (`sslmode=require`). Clients: [`PgCluster::client`] (connection task spawned on the
//!   caller's runtime).
//! * Slots/LSNs: [`confirmed_flush_lsn`], [`current_wal_lsn`], [`slot_row`],
//!   [`parse_lsn`]/[`format_lsn`].
//!
//! # Kafka
//! * [`MockKafka`]: librdkafka's in-process mock cluster with real TCP listeners. It
//!   auto-creates topics on first metadata/produce request (as a producer asks for them)
//!   with **4 partitions** (librdkafka's mock default), replication `min(3, brokers)`.
//!   Consumers do not auto-create. [`MockKafka::create_topic`] pre-creates with a chosen
//!   partition count (the mock does not implement the CreateTopics admin API).
//!   Consumer-group joins on the mock wait its 3 s initial-rebalance delay, which is why
//!   [`collect`] assigns partitions itself instead of joining a group.
//! * [`kafka_real`]: real Apache Kafka (KRaft) from `scripts/install-kafka.sh`: [`shared_kafka`]
//!   (one broker shared by the binary; each test gets a [`KafkaNs`], a topic prefix that
//!   [`RelayConfig::on_kafka`] and [`KafkaNs::collect`] apply), [`replicated_kafka`] (three
//!   brokers, RF 3, `min.insync.replicas = 2`, one test at a time) and [`KafkaCluster::start`]
//!   for a cluster of a test's own. The suites that prove the Kafka path use these; the
//!   mock cluster stays where a fault can be injected nowhere else.
//! * [`collect`] / [`collect_matching`] / [`collect_with`]: read what was published;
//!   [`produce`]: write one record.
//!
//! # The relay
//! [`RelayConfig`] renders the relay's TOML config (defaults match schema A);
//! [`RelayProcess::run`] starts `outbox-relay run --config …`, [`run_cmd`] runs one-shot
//! subcommands (`setup`, `status --json`, `teardown --yes`).
//!
//! # Workload
//! [`OutboxSchema`] A (`events_outbox`, bigserial ids) and B (`outbox`, uuid ids) plus an
//! `orders` table; [`run_workload`] commits N transactions over M aggregates from K tasks
//! and returns what was committed per aggregate in commit order; [`insert_rolled_back`]
//! and [`insert_multi_row`] cover the other shapes of writes.
//!
//! # Checks and scraping
//! [`check_delivered`] / [`check_order`] / [`ids_by_key`] (`checks.rs`) compare what was
//! collected with what was committed. [`scrape::http_get`] fetches a relay endpoint and
//! [`scrape::Metrics`] parses Prometheus text (`/metrics`).
//!
//! # Debezium
//! [`Debezium::get`] (`debezium.rs`): Debezium 3.6's embedded engine with the EventRouter and
//! Connect's converters (`tests/debezium/DebeziumOutbox.java`), `None` after [`needs::missing`]
//! where Java or the jars (`scripts/install-debezium.sh`) are missing.
//!
//! # Webhooks
//! [`webhook::WebhookReceiver`]: a real HTTP/1.1 receiver in the test process (hyper) that the
//! webhook sink posts to; the test scripts its answers (500s, 429 with `Retry-After`, slow, a 4xx
//! for marked events, down for a while and back on the same port) and reads what it accepted as
//! [`Received`] records.
//!
//! # AWS (moto)
//! [`moto::Moto`]: a `moto_server` of a test's own (from `scripts/ensure-moto.sh`'s venv; `None`
//! after [`needs::missing`] where it is missing), queues created with the AWS SDK, read back as
//! [`Received`] records once everything arrived (moto deduplicates FIFO messages only against
//! those still queued), and frozen / thawed (SIGSTOP / SIGCONT) for outages with state kept;
//! [`moto::aws_run`] / [`moto::aws_run_streaming`] start the relay with the test credentials.
//! [`moto_kinesis`]: Kinesis streams on the same moto, every shard read back from the start.
//!
//! # Faults
//! [`fault_support`]: commit LSNs of a transaction ([`fault_support::TxnProbe`]), the
//! "confirmed never passes an unacknowledged commit" check, logical messages, and
//! `OUTBOX_RELAY_LONG_TESTS` for the long variants of the failure suites.
//!
//! # Network faults (the nemesis)
//! [`net_fault`]: relays in network namespaces of their own, PostgreSQL and each broker at
//! addresses of their own behind a userspace proxy ([`net_fault::Proxy`]: pass, stall, delay,
//! reset), links cut silently (`blackhole` qdisc: no RST) one way or both, all undone on drop.
//! [`nemesis`]: the rig (a database and a sink — a Kafka broker of its own advertising the
//! proxied address, the shared NATS or Redis — reached only through a [`net_fault::FaultNet`]),
//! a steady load, the checker (lost, order of first deliveries, duplicates) and time to resume.
//! Relays run in a namespace through [`relay_process::NETNS`].
//!
//! # The conformance suite's sinks
//! [`conformance::SinkHarness`] (`conformance/`): one implementation per sink of what differs
//! per broker — its server and how to take it away, its config section, destinations made and
//! read back, what it promises (exactly-once or not, and how) and what it refuses (its bad
//! events). `tests/it/conformance.rs` runs every scenario through it for every sink.
//!
//! # Missing dependencies
//! [`needs::missing`] is the one place a test finds out that what it needs is not there (moto,
//! the emulator, a real Kafka, a PostgreSQL major, Debezium, …): locally a loud SKIPPING line
//! and the test returns; under CI (`CI` set, as `.ci/run` sets it) a failure naming what is
//! missing and the script that provides it.
//!
//! # Waiting
//! [`wait_until`] polls an async condition with a deadline; use it instead of sleeps.
#![allow(dead_code, unused_imports)]

pub mod checks;
pub mod conformance;
pub mod consumer;
pub mod debezium;
pub mod fault_support;
pub mod kafka;
pub mod kafka_real;
pub mod moto;
pub mod moto_kinesis;
pub mod moto_sns;
pub mod nats;
pub mod needs;
pub mod nemesis;
pub mod net_fault;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod pubsub;
pub mod rabbitmq;
pub mod redis;
pub mod relay_process;
pub mod scrape;
pub mod tls;
pub mod util;
pub mod webhook;
pub mod workload;

pub use checks::{check_delivered, check_order, ids_by_key};
pub use consumer::{collect, collect_matching, collect_with, produce, Received, Topics};
pub use debezium::{Debezium, DebeziumRecord};
pub use kafka::MockKafka;
pub use kafka_real::{replicated_kafka, shared_kafka, ClusterSpec, KafkaCluster, KafkaNs, SaslSsl};
pub use postgres::{
    confirmed_flush_lsn, current_wal_lsn, format_lsn, inserts_held_by_slot, invalidate_slot, parse_lsn,
    pg_bin_for_major, shared_cluster, skip_missing_major, slot_row, url_as, PgCluster, SlotRow, EXTERNAL_PG_ENV,
    PINNED_PG_VERSIONS, SCRAM_PASSWORD, SCRAM_USER, SUPPORTED_MAJORS,
};
pub use relay_process::{
    prepared, prepared_ns, prepared_on, run_cmd, setup, RelayConfig, RelayProcess, PREFIX_REGEX, RELAY_BIN,
};
pub use util::{free_port, unique_name, wait_until};
pub use workload::{
    create_schema, create_schema_a, create_schema_b, insert_multi_row, insert_rolled_back, run_workload, Committed,
    ExpectedEvent, OutboxSchema, Workload,
};
