//! The Redis sink instance: `send` copies the record into a channel; one tokio task drains it in
//! batches, each one pipeline on the instance's single connection, and completes every record
//! from its own reply, in order.
//!
//! Order across failures: commands on one connection run in the order they were written, and
//! the task writes a batch only after the previous batch's replies arrived. The first batch
//! that fails as a whole (connection lost, reply timeout) or holds a reply that is not a
//! refusal of the record itself ends the instance: that batch and every later record complete
//! as `Transient` without being written, and the relay builds a new sink and replays. A reply
//! lost with the connection may still mean "stored": the replay makes that a duplicate (or,
//! with exactly-once, the dedup set drops it).

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ServerError, Value};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{connect, DEDUP_SCRIPT, DEDUP_SUFFIX, FIELD_ID, FIELD_KEY, FIELD_PAYLOAD, FIELD_TIMESTAMP, SINK};
use crate::config::redis::RedisSettings;
use crate::config::relay::Delivery;
use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

/// Records per pipeline, and bytes: enough to keep the connection busy, small enough that a
/// failure fails few records.
const BATCH_RECORDS: usize = 1024;
const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// One record as the task writes it.
struct Item<Tag> {
    tag: Box<Tag>,
    stream: String,
    event_id: String,
    /// Field, value, field, value, …
    fields: Vec<Vec<u8>>,
    dedup_key: Option<String>,
    bytes: usize,
    key: KeyHash,
}

pub(crate) struct RedisSink<Tag> {
    tx: mpsc::UnboundedSender<Item<Tag>>,
    stop: watch::Sender<bool>,
    /// `[redis] max_message_bytes`: a larger record is refused in `send`.
    max_message_bytes: usize,
    /// The task says it ended (its connection dropped) here.
    ended: std::sync::Mutex<std_mpsc::Receiver<()>>,
    task: tokio::task::JoinHandle<()>,
    /// Keys with a refused record the caller has not released (closed by the writer).
    fence: Arc<KeyFence>,
}

impl<Tag: Send + Sync + 'static> RedisSink<Tag> {
    /// Connects (loading the dedup script) and spawns the task on the current runtime.
    pub(crate) async fn create(
        redis: &RedisSettings,
        delivery: Delivery,
    ) -> Result<(RedisSink<Tag>, Completions<Tag>), SinkError> {
        let mut conn = connect(redis).await?;
        // Only exactly-once needs the script: an at-least-once user needs no SCRIPT/EVALSHA.
        let script_sha = if delivery == Delivery::ExactlyOnce {
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
        let (tx, rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let (ended_tx, ended) = std_mpsc::channel();
        let fence = Arc::new(KeyFence::default());
        let writer = Writer {
            fence: Arc::clone(&fence),
            conn,
            script_sha,
            window_ms: redis.dedup_window.as_millis() as u64,
            max_keys: redis.dedup_max_keys,
            done: done_tx,
            dead: None,
        };
        let task = tokio::spawn(async move {
            writer.run(rx, stop_rx).await;
            let _ = ended_tx.send(());
        });
        Ok((
            RedisSink {
                tx,
                stop,
                max_message_bytes: redis.max_message_bytes,
                ended: std::sync::Mutex::new(ended),
                task,
                fence,
            },
            done_rx,
        ))
    }
}

struct Writer<Tag> {
    conn: MultiplexedConnection,
    /// The dedup script's SHA1, loaded in exactly-once mode only.
    script_sha: Option<String>,
    window_ms: u64,
    max_keys: u64,
    done: mpsc::UnboundedSender<Completion<Tag>>,
    /// Why this instance stopped writing: every later record fails with it.
    dead: Option<String>,
    /// Keys with a refused record the caller has not released: their records are not written.
    fence: Arc<KeyFence>,
}

impl<Tag> Writer<Tag> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Item<Tag>>, mut stop: watch::Receiver<bool>) {
        loop {
            let first = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                item = rx.recv() => match item {
                    Some(item) => item,
                    None => return,
                },
            };
            let mut bytes = first.bytes;
            let mut batch = vec![first];
            while batch.len() < BATCH_RECORDS && bytes < BATCH_BYTES {
                match rx.try_recv() {
                    Ok(item) => {
                        bytes += item.bytes;
                        batch.push(item);
                    }
                    Err(_) => break,
                }
            }
            if *stop.borrow() {
                return;
            }
            self.write(batch).await;
        }
    }

    fn complete(&self, item: Item<Tag>, outcome: Result<(), (FailureKind, String)>) {
        let outcome = outcome.map_err(|(kind, cause)| SinkFailure {
            kind,
            destination: item.stream,
            partition: None,
            event_id: Some(item.event_id),
            cause,
        });
        // The receiver is gone only while the caller abandons this sink.
        let _ = self.done.send(Completion { tag: item.tag, outcome });
    }

    async fn write(&mut self, mut batch: Vec<Item<Tag>>) {
        if let Some(cause) = &self.dead {
            let cause = format!("not sent: an earlier command of this Redis connection failed ({cause})");
            for item in batch {
                self.complete(item, Err((FailureKind::Transient, cause.clone())));
            }
            return;
        }
        if batch.iter().any(|item| self.fence.is_closed(item.key)) {
            let (stopped, open): (Vec<_>, Vec<_>) = batch.into_iter().partition(|item| self.fence.is_closed(item.key));
            for item in stopped {
                self.complete(item, Err((FailureKind::Transient, stopped_cause())));
            }
            if open.is_empty() {
                return;
            }
            batch = open;
        }
        if self.script_sha.is_none() && batch.iter().any(|i| i.dedup_key.is_some()) {
            let cause =
                "a record with a dedup key, but relay.delivery is not exactly-once (no dedup script)".to_owned();
            self.fail_all(batch, cause);
            return;
        }
        let mut pipe = redis::pipe();
        for item in &batch {
            match (&item.dedup_key, &self.script_sha) {
                (None, _) | (Some(_), None) => {
                    pipe.cmd("XADD").arg(&item.stream).arg("*").arg(&item.fields);
                }
                (Some(dedup), Some(sha)) => {
                    pipe.cmd("EVALSHA")
                        .arg(sha)
                        .arg(2)
                        .arg(&item.stream)
                        .arg(format!("{}{DEDUP_SUFFIX}", item.stream))
                        .arg(dedup)
                        .arg(self.window_ms)
                        .arg(self.max_keys)
                        .arg(&item.fields);
                }
            }
        }
        let replies = self.conn.send_packed_commands(&pipe, 0, batch.len()).await;
        match replies {
            Ok(values) if values.len() == batch.len() => {
                let mut duplicates = 0usize;
                for (item, value) in batch.into_iter().zip(values) {
                    let outcome = match value {
                        Value::ServerError(e) => Err(self.classify(&e)),
                        Value::Int(0) => {
                            duplicates += 1;
                            Ok(())
                        }
                        _ => Ok(()),
                    };
                    if matches!(outcome, Err((FailureKind::Refused, _))) {
                        // Later records of the key wait for the caller's decision (`sink/fence.rs`).
                        let fence = Arc::clone(&self.fence);
                        fence.close_then(item.key, || self.complete(item, outcome));
                    } else {
                        self.complete(item, outcome);
                    }
                }
                if duplicates > 0 {
                    info!(duplicates, "Redis dropped replayed records its dedup sets already held");
                }
            }
            Ok(values) => {
                let cause = format!("{} replies to a pipeline of {}", values.len(), batch.len());
                self.fail_all(batch, cause);
            }
            Err(e) => {
                let cause = format!("the connection failed with commands in flight: {e}");
                self.fail_all(batch, cause);
            }
        }
    }

    fn fail_all(&mut self, batch: Vec<Item<Tag>>, cause: String) {
        warn!(records = batch.len(), %cause, "Redis sink stops: replaying through a new connection");
        for item in batch {
            self.complete(item, Err((FailureKind::Transient, cause.clone())));
        }
        self.dead = Some(cause);
    }

    /// An error reply: the record's own fault (refused), or the server's (transient, and the
    /// instance writes nothing more).
    fn classify(&mut self, e: &ServerError) -> (FailureKind, String) {
        let cause = e.to_string();
        if is_record_refusal(e) {
            (FailureKind::Refused, cause)
        } else {
            if self.dead.is_none() {
                warn!(%cause, "Redis refused a command for a reason of its own: replaying through a new connection");
                self.dead = Some(cause.clone());
            }
            (FailureKind::Transient, cause)
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

impl<Tag: Send + Sync + 'static> Sink<Tag> for RedisSink<Tag> {
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        let mut fields: Vec<Vec<u8>> = Vec::with_capacity(2 * (4 + record.headers.len() + extra.len()));
        let mut push = |name: &str, value: &[u8]| {
            fields.push(name.as_bytes().to_vec());
            fields.push(value.to_vec());
        };
        push(FIELD_ID, record.event_id);
        push(FIELD_KEY, &record.key);
        for (name, value) in record.headers_with(extra) {
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
            return Err(Refusal {
                tag,
                failure: SinkFailure {
                    kind: FailureKind::Refused,
                    destination: record.destination.clone().into_owned(),
                    partition: None,
                    event_id: Some(String::from_utf8_lossy(record.event_id).into_owned()),
                    cause: format!(
                        "the stream entry would be {bytes} bytes, larger than [redis] max_message_bytes = {}",
                        self.max_message_bytes
                    ),
                },
            });
        }
        let item = Item {
            tag,
            stream: record.destination.clone().into_owned(),
            event_id: String::from_utf8_lossy(record.event_id).into_owned(),
            bytes,
            fields,
            dedup_key: dedup_key.map(str::to_owned),
            key: KeyHash::of(&record.key),
        };
        self.tx.send(item).map_err(|mpsc::error::SendError(item)| Refusal {
            tag: item.tag,
            failure: SinkFailure {
                kind: FailureKind::Transient,
                destination: item.stream,
                partition: None,
                event_id: Some(item.event_id),
                cause: "the Redis sink's writer has stopped".into(),
            },
        })
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        let RedisSink {
            tx, stop, ended, task, ..
        } = *self;
        let _ = stop.send(true);
        drop(tx);
        // The task finishes the batch on the wire (its replies complete as usual), then drops
        // what is queued and its connection.
        let ended = ended.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ended.recv_timeout(wait).is_err() {
            warn!(
                ?wait,
                "abandoned Redis sink still had commands in flight; closing its connection"
            );
            // Dropping the task drops the connection, whose driver stops writing.
            task.abort();
        }
    }
}
