//! The PostgreSQL adapter: everything that speaks to the database.
//!
//! - [`replication`]: our own replication-protocol transport (startup, auth, TLS,
//!   `START_REPLICATION`, CopyBoth frames split into a reader and a status writer);
//! - [`pgoutput`]: the pure, panic-free decoder of the pgoutput logical-decoding plugin;
//! - [`cursor`]: the byte cursor both share (the transport never imports the decoder);
//! - [`client`], [`tls`]: ordinary (control-plane) connections;
//! - [`failure`]: which errors are worth a reconnect, and how to explain them (both connections);
//! - [`lsn`]: WAL positions; [`slot`]: the one query and row type for a replication slot;
//!   [`publication`]: what a publication publishes beyond one table's inserts; [`role`]: what
//!   the connected role may do (REPLICATION, `pg_read_all_stats`, CREATE), by the server's rules.
//!
//! Invariant: this layer knows nothing of outbox events, Kafka or the relay; it imports only
//! `config`.

pub(crate) mod client;
pub(crate) mod cursor;
pub(crate) mod failure;
pub(crate) mod lsn;
pub mod pgoutput;
pub(crate) mod publication;
pub mod replication;
pub(crate) mod role;
pub(crate) mod slot;
pub(crate) mod timestamp;
pub(crate) mod tls;
