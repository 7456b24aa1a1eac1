//! The shared driver of request/response sinks: an adapter says how a record becomes a request
//! ([`Exchange::encode`]), how a request goes out and its reply comes back ([`Exchange::send`])
//! and what a reply means ([`Exchange::classify`]); the driver does the rest of [`Sink`] — the
//! queue, in-flight accounting, per-key order and the key fence, one completion per record,
//! stop and bounded abandon.
//!
//! Two ways to keep each key's order ([`Concurrency`]):
//! * **Pipelined**: requests go out one after another in hand-over order (each `send` settled
//!   before the next starts), and their replies are awaited together — publishes pipelined on
//!   one connection, the broker keeping the order of one connection.
//! * **Per key**: at most one request of a key is in flight, up to `max_keys` keys at once;
//!   a key's next request goes out only after the previous one's reply was acknowledged —
//!   what a transport without order between requests (HTTP) needs.
//!
//! Invariants (those of [`Sink`]):
//! * Nothing handed over after a record that failed `Transient` is sent: the first transient
//!   failure stops the driver, and every later record fails `Transient` unsent (the caller
//!   replays them after the failed one).
//! * After a refusal, the key is fenced ([`KeyFence`]) until the caller releases it; records of
//!   the key fail `Transient` unsent, reported after the refusal.
//! * Abandon drops what is queued, waits at most the given time for replies on the wire, then
//!   drops (cancels) the reply futures still pending: an adapter retrying inside its future
//!   stops there.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkFailure, SinkRecord};

/// What a reply means, in the driver's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The broker stored the record (or a duplicate of it): delivered.
    Acknowledged,
    /// The broker refused the record for what it is; sending it again cannot help
    /// (`relay.on_bad_event` decides). The cause, in the broker's words.
    Refused(String),
    /// The broker, the network or the client failed; a replay may succeed. The cause.
    Transient(String),
}

/// The future of one request's reply, owned by the driver (dropped to cancel it).
pub(crate) type ReplyFuture<R> = Pin<Box<dyn Future<Output = R> + Send>>;

/// What a request/response sink supplies to the driver. Implemented in `src/sink/<name>/`.
pub(crate) trait Exchange: Send + Sync + 'static {
    /// One record, ready to send (owned: built from the borrowed record in `encode`).
    type Request: Send + 'static;
    /// What comes back for one request.
    type Reply: Send + 'static;

    /// The broker's name for people, in causes ("RabbitMQ").
    fn name(&self) -> &'static str;

    /// The record as a request; `Err` says why the record can never be sent (it is refused on
    /// sight, nothing queued). `extra` headers follow the record's own; `dedup_key` is the
    /// exactly-once deduplication key, for a broker that deduplicates.
    fn encode(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
    ) -> Result<Self::Request, String>;

    /// Hands `request` to the broker. The returned future resolves once the request is on its
    /// way (written to the connection, or at once for a transport that sends in the reply
    /// future); its output is the future of the reply. The driver awaits the outer future
    /// before it sends anything else (that is the pipelined order) and may drop the reply
    /// future at any time (abandon, reply timeout), so it must be cancel-safe. An adapter may
    /// retry transient replies inside the reply future (with backoff), and classify them
    /// itself to decide. `Err`: the request could not be handed over (transient).
    fn send(&self, request: Self::Request) -> impl Future<Output = Result<ReplyFuture<Self::Reply>, String>> + Send;

    /// What `reply` means for its record.
    fn classify(&self, reply: Self::Reply) -> Outcome;

    /// What a reply is called, in the cause of a record whose reply did not come in time
    /// ("no PubAck within …").
    fn reply_name(&self) -> &'static str {
        "reply"
    }

    /// Closes the connection, once the driver has stopped (after abandon's bounded wait, or
    /// when the sink was dropped); bounded by the adapter ([`CLOSE_MARGIN`] at most).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// What [`Sink::abandon`] allows an adapter's [`Exchange::close`] beyond the wait for replies.
pub(crate) const CLOSE_MARGIN: Duration = Duration::from_secs(3);

/// How requests of different and of the same key may overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Concurrency {
    /// Sent in hand-over order, one `send` at a time; any number of replies awaited at once.
    // No adapter pipelines on the driver yet (NATS and Redis keep their own publishers).
    #[cfg_attr(not(test), allow(dead_code))]
    Pipelined,
    /// At most one request in flight per key, up to `max_keys` keys at once.
    PerKey { max_keys: usize },
}

/// How the driver runs an [`Exchange`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriverOptions {
    pub(crate) concurrency: Concurrency,
    /// Requests on the wire at most (the caller's in-flight budget; at least 1).
    pub(crate) max_in_flight: usize,
    /// Bytes on the wire at most ([`SinkRecord::size`]); one request always goes.
    pub(crate) max_in_flight_bytes: usize,
    /// A reply not in after this fails its record `Transient` (one timer checks the oldest).
    /// `None`: the adapter bounds its reply future itself.
    pub(crate) reply_timeout: Option<Duration>,
    /// A record that waited longer than this in the queue is not sent (`Transient`): a
    /// process frozen this long may have been replaced by a standby that replays.
    pub(crate) max_queue_wait: Option<Duration>,
    /// How long a driver dropped without [`Sink::abandon`] waits for replies on the wire.
    pub(crate) drop_wait: Duration,
}

/// A record taken by the driver.
struct Item<Request, Tag> {
    request: Request,
    tag: Box<Tag>,
    destination: String,
    event_id: String,
    key: KeyHash,
    size: usize,
    queued_at: Instant,
}

/// A record on the wire, by its sequence number.
struct OnWire<Tag> {
    tag: Box<Tag>,
    destination: String,
    event_id: String,
    key: KeyHash,
    size: usize,
    sent_at: Instant,
}

/// The [`Sink`] an [`Exchange`] becomes.
pub(crate) struct Driven<E: Exchange, Tag: Send + Sync + 'static> {
    exchange: Arc<E>,
    queue: mpsc::UnboundedSender<Item<E::Request, Tag>>,
    stop: watch::Sender<Option<Duration>>,
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    fence: Arc<KeyFence>,
}

/// Starts the driver task of `exchange` on the current tokio runtime.
pub(crate) fn start<E: Exchange, Tag: Send + Sync + 'static>(
    exchange: Arc<E>,
    options: DriverOptions,
) -> (Driven<E, Tag>, Completions<Tag>) {
    let (queue, queued) = mpsc::unbounded_channel();
    let (completions_tx, completions) = mpsc::unbounded_channel();
    let (stop, stopped) = watch::channel(None);
    let (done_tx, done) = std::sync::mpsc::channel();
    let fence = Arc::new(KeyFence::default());
    let task = Task {
        exchange: Arc::clone(&exchange),
        options,
        completions: completions_tx,
        fence: Arc::clone(&fence),
        on_wire: BTreeMap::new(),
        wire_bytes: 0,
        replies: FuturesUnordered::new(),
        next: 0,
        failed: None,
        keys: HashMap::new(),
        runnable: VecDeque::new(),
        held: None,
    };
    tokio::spawn(async move {
        task.run(queued, stopped).await;
        let _ = done_tx.send(());
    });
    (
        Driven {
            exchange,
            queue,
            stop,
            done: std::sync::Mutex::new(done),
            fence,
        },
        completions,
    )
}

impl<E: Exchange, Tag: Send + Sync + 'static> Sink<Tag> for Driven<E, Tag> {
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        let event_id = String::from_utf8_lossy(record.event_id).into_owned();
        let refusal = |tag, kind, cause| Refusal {
            tag,
            failure: SinkFailure {
                kind,
                destination: record.destination.to_string(),
                partition: None,
                event_id: Some(event_id.clone()),
                cause,
            },
        };
        let request = match self.exchange.encode(record, extra, dedup_key) {
            Ok(request) => request,
            Err(cause) => return Err(refusal(tag, FailureKind::Refused, cause)),
        };
        self.queue
            .send(Item {
                request,
                tag,
                destination: record.destination.to_string(),
                event_id: event_id.clone(),
                key: KeyHash::of(&record.key),
                size: record.size(),
                queued_at: Instant::now(),
            })
            .map_err(|e| {
                refusal(
                    e.0.tag,
                    FailureKind::Transient,
                    format!("the {} sink has stopped", self.exchange.name()),
                )
            })
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        let _ = self.stop.send(Some(wait));
        // Crash tests: die while the abandoned sink's requests may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        // The task waits at most `wait` itself; the margin covers its wind-down and close.
        if done.recv_timeout(wait + CLOSE_MARGIN).is_err() {
            warn!(sink = self.exchange.name(), "abandoned sink did not stop in time");
        }
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }
}

/// The driver's task: owns the queue's receiving end, the wire and the completions.
struct Task<E: Exchange, Tag> {
    exchange: Arc<E>,
    options: DriverOptions,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    fence: Arc<KeyFence>,
    /// By sequence number: the first entry is the oldest on the wire.
    on_wire: BTreeMap<u64, OnWire<Tag>>,
    wire_bytes: usize,
    replies: FuturesUnordered<ReplyFuture<(u64, E::Reply)>>,
    next: u64,
    /// Set at the first transient failure: nothing is sent after it.
    failed: Option<String>,
    /// Per key: its records waiting behind the one on the wire (`Concurrency::PerKey`), and
    /// whether one is on the wire.
    keys: HashMap<KeyHash, KeyQueue<E::Request, Tag>>,
    /// Keys with nothing on the wire and a record waiting for a free slot, oldest first.
    runnable: VecDeque<KeyHash>,
    /// A record taken from the queue that waits for room on the wire (pipelined).
    held: Option<Item<E::Request, Tag>>,
}

struct KeyQueue<Request, Tag> {
    busy: bool,
    waiting: VecDeque<Item<Request, Tag>>,
}

impl<E: Exchange, Tag: Send + Sync + 'static> Task<E, Tag> {
    async fn run(
        mut self,
        mut queued: mpsc::UnboundedReceiver<Item<E::Request, Tag>>,
        mut stop: watch::Receiver<Option<Duration>>,
    ) {
        let mut wait = self.options.drop_wait;
        let period = self.options.reply_timeout.map_or(Duration::from_secs(3600), |t| {
            (t / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
        });
        // One timer for every reply timeout, running only while something is on the wire.
        let mut overdue = tokio::time::interval(period);
        overdue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let timed = self.options.reply_timeout.is_some();
        loop {
            let room = self.has_room();
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_ok() {
                        wait = stop.borrow().unwrap_or(wait);
                    }
                    break;
                }
                Some((n, reply)) = self.replies.next(), if !self.replies.is_empty() => self.reply(n, reply).await,
                _ = overdue.tick(), if timed && !self.on_wire.is_empty() => self.time_out_overdue().await,
                next = queued.recv(), if room => match next {
                    Some(item) => self.take(item).await,
                    None => break,
                },
            }
        }
        // Abandoned (or the sink dropped): drop what is queued, wait (bounded) for what is on
        // the wire, so a replay cannot be overtaken by stragglers; then cancel the rest.
        queued.close();
        while queued.try_recv().is_ok() {}
        self.keys.clear();
        self.runnable.clear();
        self.held = None;
        let drain = async {
            while !self.on_wire.is_empty() {
                match self.replies.next().await {
                    Some((n, reply)) => {
                        self.settle(n, reply);
                    }
                    None => break,
                }
            }
        };
        if tokio::time::timeout(wait, drain).await.is_err() {
            warn!(
                sink = self.exchange.name(),
                pending = self.on_wire.len(),
                "abandoned sink gave up waiting for its replies"
            );
        }
        // Cancel what is still pending before the connection goes.
        self.replies = FuturesUnordered::new();
        self.exchange.close().await;
    }

    /// Whether another record may be taken from the queue now.
    fn has_room(&self) -> bool {
        match self.options.concurrency {
            // A record waiting for room blocks the queue: the order is the queue's.
            Concurrency::Pipelined => self.held.is_none(),
            // Records wait in their key's queue; the caller's budget bounds them.
            Concurrency::PerKey { .. } => true,
        }
    }

    /// Whether the wire has room for a request of `size` bytes.
    fn wire_room(&self, size: usize) -> bool {
        let count = self.on_wire.len();
        let slots = match self.options.concurrency {
            Concurrency::Pipelined => self.options.max_in_flight.max(1),
            Concurrency::PerKey { max_keys } => max_keys.max(1).min(self.options.max_in_flight.max(1)),
        };
        count == 0 || (count < slots && self.wire_bytes + size <= self.options.max_in_flight_bytes)
    }

    /// A record from the queue.
    async fn take(&mut self, item: Item<E::Request, Tag>) {
        match self.options.concurrency {
            Concurrency::Pipelined => {
                if self.wire_room(item.size) {
                    self.dispatch(item).await;
                } else {
                    self.held = Some(item);
                }
            }
            Concurrency::PerKey { .. } => {
                let key = item.key;
                let entry = self.keys.entry(key).or_insert_with(|| KeyQueue {
                    busy: false,
                    waiting: VecDeque::new(),
                });
                let idle = !entry.busy && entry.waiting.is_empty();
                entry.waiting.push_back(item);
                if idle {
                    self.runnable.push_back(key);
                }
                self.fill().await;
            }
        }
    }

    /// Per key: sends the head of the oldest runnable keys while there is room.
    async fn fill(&mut self) {
        while let Some(&key) = self.runnable.front() {
            let Some(size) = self.keys.get(&key).and_then(|q| q.waiting.front()).map(|i| i.size) else {
                self.runnable.pop_front();
                continue;
            };
            if !self.wire_room(size) {
                return;
            }
            self.runnable.pop_front();
            let Some(queue) = self.keys.get_mut(&key) else {
                continue;
            };
            let Some(item) = queue.waiting.pop_front() else {
                continue;
            };
            queue.busy = true;
            if !self.dispatch(item).await {
                // Not sent (failed unsent): the key's next record may go.
                self.key_done(key);
            }
        }
    }

    /// The key's request was answered (or not sent): its next record becomes runnable.
    fn key_done(&mut self, key: KeyHash) {
        if let Some(queue) = self.keys.get_mut(&key) {
            queue.busy = false;
            if queue.waiting.is_empty() {
                self.keys.remove(&key);
            } else {
                self.runnable.push_back(key);
            }
        }
    }

    /// Sends one record unless it must fail unsent; `true` when it went on the wire.
    async fn dispatch(&mut self, item: Item<E::Request, Tag>) -> bool {
        if let Some(cause) = &self.failed {
            let cause = format!("not sent: an earlier record failed ({cause})");
            self.complete(
                item.tag,
                item.destination,
                item.event_id,
                Err((FailureKind::Transient, cause)),
            );
            return false;
        }
        if self.fence.is_closed(item.key) {
            self.complete(
                item.tag,
                item.destination,
                item.event_id,
                Err((FailureKind::Transient, stopped_cause())),
            );
            return false;
        }
        let waited = item.queued_at.elapsed();
        if self.options.max_queue_wait.is_some_and(|max| waited > max) {
            let cause = format!(
                "not sent: it waited {} ms in the queue, more than the reply timeout",
                waited.as_millis()
            );
            self.failed = Some(cause.clone());
            self.complete(
                item.tag,
                item.destination,
                item.event_id,
                Err((FailureKind::Transient, cause)),
            );
            return false;
        }
        let n = self.next;
        self.next += 1;
        match self.exchange.send(item.request).await {
            Ok(reply) => {
                self.replies.push(Box::pin(async move { (n, reply.await) }));
                self.wire_bytes += item.size;
                self.on_wire.insert(
                    n,
                    OnWire {
                        tag: item.tag,
                        destination: item.destination,
                        event_id: item.event_id,
                        key: item.key,
                        size: item.size,
                        sent_at: Instant::now(),
                    },
                );
                true
            }
            Err(e) => {
                let cause = format!("send failed: {e}");
                self.failed = Some(cause.clone());
                self.complete(
                    item.tag,
                    item.destination,
                    item.event_id,
                    Err((FailureKind::Transient, cause)),
                );
                false
            }
        }
    }

    /// A reply while running: settles its record, then sends what waited for room.
    async fn reply(&mut self, n: u64, reply: E::Reply) {
        let key = self.settle(n, reply);
        self.after_wire_freed(key).await;
    }

    async fn after_wire_freed(&mut self, key: Option<KeyHash>) {
        match self.options.concurrency {
            Concurrency::Pipelined => {
                if let Some(item) = self.held.take() {
                    if self.wire_room(item.size) {
                        self.dispatch(item).await;
                    } else {
                        self.held = Some(item);
                    }
                }
            }
            Concurrency::PerKey { .. } => {
                if let Some(key) = key {
                    self.key_done(key);
                }
                self.fill().await;
            }
        }
    }

    /// Settles record `n` with `reply`; its key, if it was still on the wire.
    fn settle(&mut self, n: u64, reply: E::Reply) -> Option<KeyHash> {
        let rec = self.on_wire.remove(&n)?; // timed out already
        self.wire_bytes = self.wire_bytes.saturating_sub(rec.size);
        let key = rec.key;
        match self.exchange.classify(reply) {
            Outcome::Acknowledged => self.complete(rec.tag, rec.destination, rec.event_id, Ok(())),
            Outcome::Transient(cause) => {
                self.failed.get_or_insert_with(|| cause.clone());
                self.complete(
                    rec.tag,
                    rec.destination,
                    rec.event_id,
                    Err((FailureKind::Transient, cause)),
                );
            }
            Outcome::Refused(cause) => {
                // Later records of the key wait for the caller's decision (`sink/fence.rs`).
                let fence = Arc::clone(&self.fence);
                fence.close_then(key, || {
                    self.complete(
                        rec.tag,
                        rec.destination,
                        rec.event_id,
                        Err((FailureKind::Refused, cause)),
                    );
                });
            }
        }
        Some(key)
    }

    /// Records on the wire longer than the reply timeout fail (transient), and with them the
    /// driver.
    async fn time_out_overdue(&mut self) {
        let Some(timeout) = self.options.reply_timeout else {
            return;
        };
        while let Some(entry) = self.on_wire.first_entry() {
            let waited = entry.get().sent_at.elapsed();
            if waited <= timeout {
                break;
            }
            let rec = entry.remove();
            self.wire_bytes = self.wire_bytes.saturating_sub(rec.size);
            let cause = format!(
                "no {} within the reply timeout ({} ms)",
                self.exchange.reply_name(),
                timeout.as_millis()
            );
            self.failed.get_or_insert_with(|| cause.clone());
            self.complete(
                rec.tag,
                rec.destination,
                rec.event_id,
                Err((FailureKind::Transient, cause)),
            );
            self.after_wire_freed(Some(rec.key)).await;
        }
    }

    fn complete(
        &mut self,
        tag: Box<Tag>,
        destination: String,
        event_id: String,
        outcome: Result<(), (FailureKind, String)>,
    ) {
        let outcome = outcome.map_err(|(kind, cause)| SinkFailure {
            kind,
            destination,
            partition: None,
            event_id: Some(event_id),
            cause,
        });
        let _ = self.completions.send(Completion { tag, outcome });
    }
}

#[cfg(test)]
mod tests {
    //! The driver against an in-process exchange whose replies the test scripts: order, the
    //! per-key limit, the fence, the stop after a transient failure, timeouts and abandon.

    use std::borrow::Cow;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// What the test exchange answers for a record, by its value.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Script {
        /// Acknowledged after this many milliseconds.
        AckAfter(u64),
        Refuse,
        Transient,
        /// Never answers.
        Hang,
    }

    #[derive(Default)]
    struct Seen {
        /// Requests in the order `send` saw them: (key, value).
        sent: Vec<(String, u32)>,
        in_flight_per_key: HashMap<String, usize>,
        max_per_key: usize,
        in_flight: usize,
        max_in_flight: usize,
    }

    struct TestExchange {
        seen: Arc<Mutex<Seen>>,
        /// Reply futures dropped before they finished (cancelled).
        cancelled: Arc<AtomicUsize>,
    }

    struct Request {
        key: String,
        value: u32,
        script: Script,
    }

    /// Counts a reply future dropped unfinished, and keeps the in-flight counts right.
    struct Guard {
        seen: Arc<Mutex<Seen>>,
        cancelled: Arc<AtomicUsize>,
        key: String,
        finished: bool,
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let mut seen = self.seen.lock().unwrap();
            *seen.in_flight_per_key.get_mut(&self.key).unwrap() -= 1;
            seen.in_flight -= 1;
            if !self.finished {
                self.cancelled.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    impl Exchange for TestExchange {
        type Request = Request;
        type Reply = Script;

        fn name(&self) -> &'static str {
            "test"
        }

        fn encode(&self, record: &SinkRecord<'_>, _: &[(&str, &[u8])], _: Option<&str>) -> Result<Request, String> {
            let text = std::str::from_utf8(record.value.as_deref().unwrap_or_default()).unwrap();
            if text == "bad" {
                return Err("refused on sight".into());
            }
            let (value, script) = text.split_once(':').unwrap();
            let script = match script {
                "refuse" => Script::Refuse,
                "transient" => Script::Transient,
                "hang" => Script::Hang,
                ms => Script::AckAfter(ms.parse().unwrap()),
            };
            Ok(Request {
                key: String::from_utf8(record.key.to_vec()).unwrap(),
                value: value.parse().unwrap(),
                script,
            })
        }

        async fn send(&self, request: Request) -> Result<ReplyFuture<Script>, String> {
            {
                let mut seen = self.seen.lock().unwrap();
                seen.sent.push((request.key.clone(), request.value));
                let per_key = seen.in_flight_per_key.entry(request.key.clone()).or_default();
                *per_key += 1;
                let per_key = *per_key;
                seen.max_per_key = seen.max_per_key.max(per_key);
                seen.in_flight += 1;
                seen.max_in_flight = seen.max_in_flight.max(seen.in_flight);
            }
            let guard = Guard {
                seen: Arc::clone(&self.seen),
                cancelled: Arc::clone(&self.cancelled),
                key: request.key,
                finished: false,
            };
            Ok(Box::pin(async move {
                // Moved whole into the future: dropped with it.
                let mut guard = guard;
                match request.script {
                    Script::AckAfter(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Script::Hang => std::future::pending::<()>().await,
                    Script::Refuse | Script::Transient => {}
                }
                guard.finished = true;
                request.script
            }))
        }

        fn classify(&self, reply: Script) -> Outcome {
            match reply {
                Script::AckAfter(_) => Outcome::Acknowledged,
                Script::Refuse => Outcome::Refused("the broker refused it".into()),
                Script::Transient | Script::Hang => Outcome::Transient("the broker is busy".into()),
            }
        }
    }

    fn options(concurrency: Concurrency) -> DriverOptions {
        DriverOptions {
            concurrency,
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            reply_timeout: Some(Duration::from_secs(5)),
            max_queue_wait: None,
            drop_wait: Duration::from_secs(1),
        }
    }

    struct Fixture {
        sink: Box<Driven<TestExchange, u32>>,
        completions: Completions<u32>,
        seen: Arc<Mutex<Seen>>,
        cancelled: Arc<AtomicUsize>,
    }

    fn fixture(options: DriverOptions) -> Fixture {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let cancelled = Arc::new(AtomicUsize::new(0));
        let exchange = Arc::new(TestExchange {
            seen: Arc::clone(&seen),
            cancelled: Arc::clone(&cancelled),
        });
        let (sink, completions) = start(exchange, options);
        Fixture {
            sink: Box::new(sink),
            completions,
            seen,
            cancelled,
        }
    }

    fn send(sink: &Driven<TestExchange, u32>, key: &str, value: &str, tag: u32) -> Result<(), Refusal<u32>> {
        let record = SinkRecord {
            destination: Cow::Borrowed("d"),
            key: Cow::Owned(key.as_bytes().to_vec()),
            value: Some(Cow::Owned(value.as_bytes().to_vec())),
            event_id: b"id",
            timestamp_ms: None,
            headers: Cow::Borrowed(&[]),
            partition: None,
        };
        sink.send(&record, &[], None, Box::new(tag))
    }

    /// The next `n` completions as (tag, outcome kind), bounded in time.
    async fn next(completions: &mut Completions<u32>, n: usize) -> Vec<(u32, Option<FailureKind>)> {
        let mut out = Vec::new();
        for _ in 0..n {
            let c = tokio::time::timeout(Duration::from_secs(10), completions.recv())
                .await
                .expect("a completion in time")
                .expect("the channel open");
            out.push((*c.tag, c.outcome.err().map(|f| f.kind)));
        }
        out
    }

    #[tokio::test(flavor = "current_thread")]
    async fn per_key_one_request_per_key_up_to_the_limit_and_each_key_in_order() {
        let mut fx = fixture(options(Concurrency::PerKey { max_keys: 4 }));
        // 8 keys × 6 records, varied reply times so that replies of different keys overtake.
        let mut tag = 0;
        for i in 0..6u32 {
            for k in 0..8u32 {
                send(&fx.sink, &format!("k{k}"), &format!("{i}:{}", (k * 7 + i * 3) % 5), tag).unwrap();
                tag += 1;
            }
        }
        let done = next(&mut fx.completions, 48).await;
        assert!(done.iter().all(|(_, kind)| kind.is_none()), "{done:?}");
        let seen = fx.seen.lock().unwrap();
        assert_eq!(seen.max_per_key, 1, "at most one request of a key in flight");
        assert_eq!(seen.max_in_flight, 4, "up to max_keys keys at once");
        for k in 0..8u32 {
            let values: Vec<u32> = seen
                .sent
                .iter()
                .filter(|(key, _)| *key == format!("k{k}"))
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(values, (0..6).collect::<Vec<_>>(), "key k{k} sent in order");
        }
        // Each key's completions arrive in its order too.
        let mut last: HashMap<u32, u32> = HashMap::new();
        for (tag, _) in done {
            let (key, i) = (tag % 8, tag / 8);
            if let Some(prev) = last.insert(key, i) {
                assert!(prev < i, "key {key}: completion {i} after {prev}");
            }
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn pipelined_sends_in_hand_over_order_with_replies_overlapping() {
        let mut fx = fixture(options(Concurrency::Pipelined));
        for i in 0..20u32 {
            send(&fx.sink, "same", &format!("{i}:{}", 20 - i), i).unwrap();
        }
        let done = next(&mut fx.completions, 20).await;
        assert!(done.iter().all(|(_, kind)| kind.is_none()), "{done:?}");
        let seen = fx.seen.lock().unwrap();
        assert_eq!(
            seen.sent.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
        assert!(seen.max_in_flight > 1, "replies are awaited together");
        // Later records answered sooner: completions come in reply order, not hand-over order.
        assert_ne!(
            done.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_record_fences_its_key_until_released() {
        for concurrency in [Concurrency::Pipelined, Concurrency::PerKey { max_keys: 8 }] {
            let mut fx = fixture(options(concurrency));
            let refused = send(&fx.sink, "k", "bad", 0).unwrap_err();
            assert_eq!(refused.failure.kind, FailureKind::Refused, "refused on sight");
            send(&fx.sink, "k", "1:refuse", 1).unwrap();
            let first = next(&mut fx.completions, 1).await;
            assert_eq!(first, vec![(1, Some(FailureKind::Refused))], "{concurrency:?}");
            send(&fx.sink, "k", "2:0", 2).unwrap();
            send(&fx.sink, "other", "3:0", 3).unwrap();
            let mut then = next(&mut fx.completions, 2).await;
            then.sort_by_key(|(tag, _)| *tag);
            assert_eq!(
                then,
                vec![(2, Some(FailureKind::Transient)), (3, None)],
                "{concurrency:?}"
            );
            fx.sink.release(b"k");
            send(&fx.sink, "k", "4:0", 4).unwrap();
            assert_eq!(next(&mut fx.completions, 1).await, vec![(4, None)], "{concurrency:?}");
            let sent: Vec<u32> = fx.seen.lock().unwrap().sent.iter().map(|(_, v)| *v).collect();
            assert!(!sent.contains(&2), "the fenced record was not sent: {sent:?}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn after_a_transient_failure_nothing_more_is_sent() {
        for concurrency in [Concurrency::Pipelined, Concurrency::PerKey { max_keys: 1 }] {
            let mut fx = fixture(options(concurrency));
            send(&fx.sink, "a", "0:transient", 0).unwrap();
            send(&fx.sink, "b", "1:50", 1).unwrap();
            send(&fx.sink, "c", "2:0", 2).unwrap();
            let first = next(&mut fx.completions, 1).await;
            assert_eq!(first, vec![(0, Some(FailureKind::Transient))], "{concurrency:?}");
            let rest = next(&mut fx.completions, 2).await;
            match concurrency {
                // The second was on the wire already (pipelined): it completes; the third not.
                Concurrency::Pipelined => {
                    assert!(rest.contains(&(2, Some(FailureKind::Transient))), "{rest:?}");
                }
                // One key at a time: neither went out.
                Concurrency::PerKey { .. } => {
                    assert_eq!(
                        rest,
                        vec![(1, Some(FailureKind::Transient)), (2, Some(FailureKind::Transient))]
                    );
                }
            }
            let sent: Vec<u32> = fx.seen.lock().unwrap().sent.iter().map(|(_, v)| *v).collect();
            assert!(!sent.contains(&2), "{concurrency:?}: {sent:?}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reply_not_in_time_fails_its_record() {
        let mut opts = options(Concurrency::PerKey { max_keys: 2 });
        opts.reply_timeout = Some(Duration::from_millis(100));
        let mut fx = fixture(opts);
        send(&fx.sink, "a", "0:hang", 0).unwrap();
        let started = Instant::now();
        assert_eq!(
            next(&mut fx.completions, 1).await,
            vec![(0, Some(FailureKind::Transient))]
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        send(&fx.sink, "b", "1:0", 1).unwrap();
        assert_eq!(
            next(&mut fx.completions, 1).await,
            vec![(1, Some(FailureKind::Transient))]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn abandon_drops_the_queue_waits_bounded_and_cancels_what_hangs() {
        let mut opts = options(Concurrency::PerKey { max_keys: 2 });
        opts.reply_timeout = None;
        let fx = fixture(opts);
        send(&fx.sink, "a", "0:hang", 0).unwrap();
        send(&fx.sink, "b", "1:hang", 1).unwrap();
        // Queued behind the two keys on the wire: dropped, never sent.
        send(&fx.sink, "a", "2:0", 2).unwrap();
        send(&fx.sink, "c", "3:0", 3).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Fixture {
            sink,
            mut completions,
            seen,
            cancelled,
        } = fx;
        let started = Instant::now();
        tokio::task::spawn_blocking(move || sink.abandon(Duration::from_millis(200)))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(cancelled.load(Ordering::SeqCst), 2, "both hanging replies dropped");
        assert_eq!(seen.lock().unwrap().sent.len(), 2, "nothing queued was sent");
        assert!(completions.recv().await.is_none(), "no completion for what was dropped");
    }
}
