//! The PostgreSQL streaming-replication client: connection and authentication
//! ([`connection`]), the CopyBoth frame codec ([`frames`]), the pgoutput protocol version asked for ([`protocol`]) and error classification ([`error`]).

pub mod connection;
pub(crate) mod error;
pub mod frames;
pub(crate) mod protocol;
mod transport;
