//! The Redis sink instance on the shared driver (`sink/driver.rs`, a [`Protocol`] sink):
//! [`RedisStreams::encode`] turns a record into a stream entry on the caller's thread; the
//! driver writes what is queued into one pipeline on the instance's single connection
//! ([`Pipeline`]) and completes every record from its own reply, in order.
//!
//! Order across failures: commands on one connection run in the order they were written, and
//! a batch is written only after the previous batch's replies were all read (the connection
//! says it is not [`Connection::ready`] until then). The first batch that fails as a whole
//! (connection lost, reply timeout) or holds a reply that is not a refusal of the record itself
//! ends the instance: that batch and every later record complete as `Transient` without being
//! written, and the relay builds a new sink and replays. A reply lost with the connection may
//! still mean "stored": the replay makes that a duplicate (or, with exactly-once, the dedup set
//! drops it).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, ServerError, Value};
use tracing::info;

use super::config::RedisSettings;
use super::{connect, DEDUP_SCRIPT, DEDUP_SUFFIX, FIELD_ID, FIELD_KEY, FIELD_PAYLOAD, FIELD_TIMESTAMP, SINK};
use crate::sink::driver::{self, Arrival, Connection, DriverSink, Outcome, Protocol};
use crate::sink::{Completions, Handover, SinkError};

/// Records per pipeline, and bytes: enough to keep the connection busy, small enough that a
/// failure fails few records.
const BATCH_RECORDS: usize = 1024;
const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// The Redis sink: the driver running [`RedisStreams`] on a [`Pipeline`].
pub(crate) type RedisSink<Tag> = DriverSink<RedisStreams, Tag>;

/// One record as a stream entry.
pub(crate) struct Entry {
    stream: String,
    /// Field, value, field, value, …
    fields: Vec<Vec<u8>>,
    dedup_key: Option<String>,
    bytes: usize,
}

/// Whether the sink deduplicates (its records carry deduplication keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dedup {
    /// Plain `XADD`s.
    None,
    /// Each record with a key goes through the dedup script.
    Script,
}

/// What a record becomes and what a reply means.
pub(crate) struct RedisStreams {
    /// `[redis] max_message_bytes`: a larger record is refused on sight.
    max_message_bytes: usize,
}

impl<Tag: Send + Sync + 'static> DriverSink<RedisStreams, Tag> {
    /// Connects (loading the dedup script when records will carry deduplication keys) and
    /// starts the driver on the current runtime.
    pub(crate) async fn create(
        redis: &RedisSettings,
        dedup: Dedup,
    ) -> Result<(RedisSink<Tag>, Completions<Tag>), SinkError> {
        let mut conn = connect(redis).await?;
        // Only deduplication needs the script: a user without it needs no SCRIPT/EVALSHA.
        let script_sha = if dedup == Dedup::Script {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(DEDUP_SCRIPT)
                .query_async(&mut conn)
                .await
                .map_err(|e| SinkError {
                    sink: SINK,
                    cause: format!(
                        "cannot load the relay's dedup script on {}: {e}. relay.delivery = \"exactly-once\" needs \
                         the SCRIPT and EVALSHA commands (docs/sink-redis.md, Permissions)",
                        redis.url
                    ),
                    transient: e.is_io_error() || e.is_timeout() || e.is_connection_dropped(),
                })?;
            Some(sha)
        } else {
            None
        };
        let connection = Pipeline {
            conn,
            script_sha,
            window_ms: redis.dedup_window.as_millis() as u64,
            max_keys: redis.dedup_max_keys,
            pipe: redis::pipe(),
            written: Vec::new(),
            bytes: 0,
            batch: None,
            replies: VecDeque::new(),
            lost: false,
        };
        // The caller's budget bounds what is queued and the connection each batch; the
        // connection's response timeout ([redis] timeout_ms) bounds every batch's replies.
        let options = redis.requests.pipelined();
        let protocol = RedisStreams {
            max_message_bytes: redis.max_message_bytes,
        };
        Ok(driver::start_on(Arc::new(protocol), connection, options))
    }
}

impl Protocol for RedisStreams {
    type Request = Entry;
    type Reply = Value;

    const NAME: &'static str = SINK;

    fn encode(&self, handover: Handover<'_, '_>) -> Result<Entry, String> {
        let record = handover.record;
        let mut fields: Vec<Vec<u8>> = Vec::with_capacity(2 * (4 + record.headers.len() + handover.extra.len()));
        let mut push = |name: &str, value: &[u8]| {
            fields.push(name.as_bytes().to_vec());
            fields.push(value.to_vec());
        };
        push(FIELD_ID, record.event_id);
        push(FIELD_KEY, &record.key);
        for (name, value) in record.headers_with(handover.extra) {
            // Stream values cannot be null: a null header is an empty value.
            push(name, value.unwrap_or_default());
        }
        if let Some(ts) = record.timestamp_ms {
            push(FIELD_TIMESTAMP, ts.to_string().as_bytes());
        }
        if let Some(value) = &record.value {
            push(FIELD_PAYLOAD, value);
        }
        let bytes: usize = fields.iter().map(Vec::len).sum();
        if bytes > self.max_message_bytes {
            return Err(format!(
                "the stream entry would be {bytes} bytes, larger than [redis] max_message_bytes = {}",
                self.max_message_bytes
            ));
        }
        Ok(Entry {
            stream: record.destination.clone().into_owned(),
            fields,
            dedup_key: handover.dedup_key.map(str::to_owned),
            bytes,
        })
    }

    /// An error reply is the record's own fault (refused) or the server's (transient: the
    /// instance writes nothing more); anything else, a duplicate dropped by the script (0)
    /// included, is delivered.
    fn classify(&self, reply: Value) -> Outcome {
        match reply {
            Value::ServerError(e) if is_record_refusal(&e) => Outcome::Refused(e.to_string()),
            Value::ServerError(e) => Outcome::Transient(e.to_string()),
            _ => Outcome::Acknowledged,
        }
    }

    /// The connection closes by being dropped: abandon needs no time for it.
    fn close_margin(&self) -> std::time::Duration {
        std::time::Duration::from_millis(200)
    }
}

/// The replies of one written batch, when they come.
type BatchFuture = Pin<Box<dyn Future<Output = RedisResult<Vec<Value>>> + Send>>;

/// The instance's connection as the driver uses it: records gathered into one pipeline, written
/// when the driver flushes and nothing else is on the wire; replies read in command order.
struct Pipeline {
    conn: MultiplexedConnection,
    /// The dedup script's SHA1, loaded in exactly-once mode only.
    script_sha: Option<String>,
    window_ms: u64,
    max_keys: u64,
    /// The batch being gathered: its commands, their record numbers, their bytes.
    pipe: redis::Pipeline,
    written: Vec<u64>,
    bytes: usize,
    /// The batch on the wire: its record numbers and its replies.
    batch: Option<(Vec<u64>, BatchFuture)>,
    /// Replies read and not yet handed to the driver, in command order.
    replies: VecDeque<(u64, Value)>,
    /// Said [`Arrival::Lost`] already: nothing more comes from this connection.
    lost: bool,
}

impl Connection for Pipeline {
    type Request = Entry;
    type Reply = Value;

    fn gathers(&self) -> bool {
        true
    }

    fn ready(&self) -> bool {
        self.batch.is_none()
            && self.replies.is_empty()
            && self.written.len() < BATCH_RECORDS
            && self.bytes < BATCH_BYTES
    }

    async fn write(&mut self, n: u64, entry: Entry) -> Result<(), String> {
        match (&entry.dedup_key, &self.script_sha) {
            (None, _) => {
                self.pipe.cmd("XADD").arg(&entry.stream).arg("*").arg(&entry.fields);
            }
            (Some(_), None) => {
                return Err("a record with a dedup key, but the sink was created without its dedup script".into());
            }
            (Some(dedup), Some(sha)) => {
                self.pipe
                    .cmd("EVALSHA")
                    .arg(sha)
                    .arg(2)
                    .arg(&entry.stream)
                    .arg(format!("{}{DEDUP_SUFFIX}", entry.stream))
                    .arg(dedup)
                    .arg(self.window_ms)
                    .arg(self.max_keys)
                    .arg(&entry.fields);
            }
        }
        self.written.push(n);
        self.bytes += entry.bytes;
        Ok(())
    }

    fn flush(&mut self) {
        if self.batch.is_some() || self.written.is_empty() {
            return;
        }
        let pipe = std::mem::replace(&mut self.pipe, redis::pipe());
        let written = std::mem::take(&mut self.written);
        self.bytes = 0;
        let count = written.len();
        let mut conn = self.conn.clone();
        let replies: BatchFuture = Box::pin(async move { conn.send_packed_commands(&pipe, 0, count).await });
        self.batch = Some((written, replies));
    }

    async fn next(&mut self) -> Arrival<Value> {
        if self.lost {
            return std::future::pending().await;
        }
        if let Some((n, value)) = self.replies.pop_front() {
            return Arrival::Reply(n, value);
        }
        let Some((_, replies)) = &mut self.batch else {
            return std::future::pending().await;
        };
        let result = replies.await;
        let Some((written, _)) = self.batch.take() else {
            return std::future::pending().await;
        };
        match result {
            Ok(values) if values.len() == written.len() => {
                let duplicates = values.iter().filter(|v| matches!(v, Value::Int(0))).count();
                if duplicates > 0 {
                    info!(duplicates, "Redis dropped replayed records its dedup sets already held");
                }
                self.replies.extend(written.into_iter().zip(values));
                match self.replies.pop_front() {
                    Some((n, value)) => Arrival::Reply(n, value),
                    None => std::future::pending().await,
                }
            }
            Ok(values) => {
                self.lost = true;
                Arrival::Lost(format!("{} replies to a pipeline of {}", values.len(), written.len()))
            }
            Err(e) => {
                self.lost = true;
                Arrival::Lost(format!("the connection failed with commands in flight: {e}"))
            }
        }
    }
}

/// Whether Redis refused the command for what the record *is* (so sending it again can never
/// succeed): the stream key (or its dedup set) holds another type. Everything else — OOM,
/// READONLY, LOADING, NOSCRIPT, MISCONF, NOPERM, BUSY — is the server's state, and a replay
/// may succeed.
pub(crate) fn is_record_refusal(e: &ServerError) -> bool {
    e.code() == "WRONGTYPE"
}
