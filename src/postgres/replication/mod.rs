//! The PostgreSQL streaming-replication client: connection and authentication
//! ([`connection`]), the CopyBoth frame codec ([`frames`]) and error classification ([`error`]).

pub mod connection;
pub(crate) mod error;
pub mod frames;
mod transport;
