//! The shared driver of request/response sinks: an adapter says how a record becomes a request,
//! how a request goes out and its reply comes back, and what a reply means; the driver does
//! the rest of [`Sink`] — the queue, in-flight accounting, per-key order and the key fence, one
//! completion per record, stop and bounded abandon.
//!
//! Every adapter supplies one [`Protocol`]: how a record becomes a request (`encode`, on the
//! caller's thread: a record the broker would refuse is refused on sight), what a reply means
//! (`classify`), its names, and how it closes. What differs is the transport, one of two:
//! * an [`Exchange`] hands back one reply future per request ([`Exchange::send`]) — HTTP,
//!   AMQP publisher confirms, the AWS batcher: whatever the client library resolves per
//!   request;
//! * a [`Connection`] writes requests onto one connection and reads every reply from one stream
//!   ([`Connection::next`], telling which request each answers) — NATS PubAcks on one
//!   subscription, Redis pipeline replies in command order. No future, channel or lock per
//!   reply: the driver's own task reads them (NATS drained 35-40 % slower on per-request reply
//!   futures, its single PubAck subscription saving what they cost).
//!
//! Two ways to keep each key's order ([`Concurrency`]):
//! * **Pipelined**: requests go out one after another in hand-over order (each write settled
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
//! * A [`Outcome::Fatal`] reply stops the driver like a transient one and becomes the sink's
//!   [`Sink::verdict`] (before its record's completion is sent): the relay stops with it
//!   instead of replaying into the same wall.
//! * Abandon drops what is queued, waits at most the given time for replies on the wire, then
//!   drops (cancels) the replies still pending: an adapter retrying inside its future stops
//!   there.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Handover, Refusal, Sink, SinkError, SinkFailure};

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
    /// Waiting cannot help: an operator must act (a certificate the relay does not trust,
    /// credentials refused). The problem AND the fix, in words for the operator: the relay
    /// stops with it ([`Sink::verdict`]), nothing confirmed past what was acknowledged.
    Fatal(String),
}

/// The future of one request's reply, owned by the driver (dropped to cancel it).
pub(crate) type ReplyFuture<R> = Pin<Box<dyn Future<Output = R> + Send>>;

/// What a request/response sink supplies to the driver, whichever transport carries its
/// requests ([`Exchange`] or [`Connection`]). Implemented in `src/sink/<name>/`.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// One record, ready to send (owned: built from the borrowed record in `encode`).
    type Request: Send + 'static;
    /// What comes back for one request.
    type Reply: Send + 'static;

    /// The broker's name for people, in causes ("RabbitMQ").
    const NAME: &'static str;

    /// The handed-over record as a request; `Err` says why the record can never be sent (it is
    /// refused on sight, nothing queued). Its `extra` headers follow the record's own; its
    /// `dedup_key` is the exactly-once deduplication key, for a broker that deduplicates.
    fn encode(&self, handover: Handover<'_, '_>) -> Result<Self::Request, String>;

    /// What `reply` means for its record.
    fn classify(&self, reply: Self::Reply) -> Outcome;

    /// What a reply is called, in the cause of a record whose reply did not come in time
    /// ("no PubAck within …").
    fn reply_name(&self) -> &'static str {
        "reply"
    }

    /// Closes what the adapter holds (a channel, a batcher), once the driver has stopped (after
    /// abandon's bounded wait, or when the sink was dropped) and closed the transport; bounded
    /// by the adapter ([`Protocol::close_margin`] at most).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// What [`Sink::abandon`] allows beyond its wait for the task to wind down and close the
    /// transport and the adapter; a connection that closes by being dropped needs little.
    fn close_margin(&self) -> Duration {
        CLOSE_MARGIN
    }
}

/// The transport of a [`Protocol`] whose broker answers each request with a future of its own.
pub(crate) trait Exchange: Protocol {
    /// Hands `request` to the broker. The returned future resolves once the request is on its
    /// way (written to the connection, or at once for a transport that sends in the reply
    /// future); its output is the future of the reply. The driver awaits the outer future
    /// before it sends anything else (that is the pipelined order) and may drop the reply
    /// future at any time (abandon, reply timeout), so it must be cancel-safe. An adapter may
    /// retry transient replies inside the reply future (with backoff), and classify them
    /// itself to decide. `Err`: the request could not be handed over (transient).
    fn send(&self, request: Self::Request) -> impl Future<Output = Result<ReplyFuture<Self::Reply>, String>> + Send;
}

/// What a connection read: the reply to request `n`, or the end of trust in the connection.
pub(crate) enum Arrival<Reply> {
    /// The reply to the request written as number `n` (replies may come in any order; one
    /// whose request is no longer on the wire, e.g. timed out, is ignored).
    Reply(u64, Reply),
    /// No reply can be trusted to come any more (connection lost, replies dropped by the
    /// client): every request on the wire fails `Transient` with this cause, and the driver
    /// sends nothing more.
    Lost(String),
}

/// The transport of a [`Protocol`] whose replies come back on one stream: its connection, owned
/// by the driver's task, writes requests and reads every reply, so a reply costs no future,
/// channel or lock of its own.
pub(crate) trait Connection: Send + 'static {
    type Request: Send + 'static;
    type Reply: Send + 'static;

    /// Whether the connection takes another write now (a connection writing in batches says
    /// no while its batch is on the wire: records then wait in the driver's queue).
    fn ready(&self) -> bool {
        true
    }

    /// Writes request number `n` (numbered from 0 in the order the driver writes them; the
    /// reply names it). Resolves once the connection took it; the driver awaits it before the
    /// next write. `Err`: it could not be written (transient: the driver stops).
    fn write(&mut self, n: u64, request: Self::Request) -> impl Future<Output = Result<(), String>> + Send;

    /// Whether the connection gathers writes into batches: the driver then writes everything
    /// queued (while [`Connection::ready`]) before it calls [`Connection::flush`]. Otherwise it
    /// writes one record and looks at the replies before the next, so a failure stops what
    /// follows as early as it can.
    fn gathers(&self) -> bool {
        false
    }

    /// Called once the driver wrote what it had at hand: a connection that batches sends the
    /// batch now.
    fn flush(&mut self) {}

    /// The next reply, or [`Arrival::Lost`]. Polled whenever the driver waits (also with
    /// nothing on the wire, to notice a lost connection); must be cancel-safe (the driver drops
    /// it whenever another event comes first). Pending for ever when nothing can come.
    fn next(&mut self) -> impl Future<Output = Arrival<Self::Reply>> + Send;

    /// Closes the connection, once the driver has stopped (replies still pending are dropped
    /// with it); bounded ([`CLOSE_MARGIN`] at most).
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Records taken from the queue at once for a connection that gathers batches, between two
/// looks at stop and the replies.
const DRAIN_AT_ONCE: usize = 1024;

/// What [`Sink::abandon`] allows an adapter's [`Protocol::close`] beyond the wait for replies.
pub(crate) const CLOSE_MARGIN: Duration = Duration::from_secs(3);

/// How requests of different and of the same key may overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Concurrency {
    /// Sent in hand-over order, one write at a time; any number of replies awaited at once.
    Pipelined,
    /// At most one request in flight per key, up to `max_keys` keys at once.
    PerKey { max_keys: usize },
}

/// How the driver runs an adapter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriverOptions {
    pub(crate) concurrency: Concurrency,
    /// Requests on the wire at most (the caller's in-flight budget; at least 1).
    pub(crate) max_in_flight: usize,
    /// Bytes on the wire at most ([`SinkRecord::size`]); one request always goes.
    pub(crate) max_in_flight_bytes: usize,
    /// A reply not in after this fails its record `Transient` (one timer checks the oldest).
    /// `None`: the adapter bounds its replies itself.
    pub(crate) reply_timeout: Option<Duration>,
    /// A record that waited longer than this in the queue is not sent (`Transient`): a
    /// process frozen this long may have been replaced by a standby that replays.
    pub(crate) max_queue_wait: Option<Duration>,
    /// The same for a record carrying a deduplication key: a broker deduplicates only within
    /// its window, so what a frozen process still queues must not go out after the window
    /// closed on a copy a standby sent meanwhile.
    pub(crate) dedup_queue_wait: Option<Duration>,
    /// How long a driver dropped without [`Sink::abandon`] waits for replies on the wire.
    pub(crate) drop_wait: Duration,
}

#[cfg(test)]
impl DriverOptions {
    /// What an adapter's tests run the driver with: `concurrency`, 100 requests or 1 MiB on the
    /// wire, no timeouts, a second's wait when dropped.
    pub(crate) fn for_tests(concurrency: Concurrency) -> DriverOptions {
        DriverOptions {
            concurrency,
            max_in_flight: 100,
            max_in_flight_bytes: 1 << 20,
            reply_timeout: None,
            max_queue_wait: None,
            dedup_queue_wait: None,
            drop_wait: Duration::from_secs(1),
        }
    }
}

/// An [`Exchange`]'s wire: its reply futures, awaited together.
struct Requests<E: Exchange> {
    exchange: Arc<E>,
    replies: FuturesUnordered<ReplyFuture<(u64, E::Reply)>>,
}

impl<E: Exchange> Connection for Requests<E> {
    type Request = E::Request;
    type Reply = E::Reply;

    async fn write(&mut self, n: u64, request: E::Request) -> Result<(), String> {
        let reply = self.exchange.send(request).await?;
        self.replies.push(Box::pin(async move { (n, reply.await) }));
        Ok(())
    }

    async fn next(&mut self) -> Arrival<E::Reply> {
        match self.replies.next().await {
            Some((n, reply)) => Arrival::Reply(n, reply),
            None => std::future::pending().await,
        }
    }

    /// Cancels what is still pending, before the exchange closes ([`Protocol::close`]).
    async fn close(&mut self) {
        self.replies = FuturesUnordered::new();
    }
}

/// Whom a record's completion goes to, and what its failure names: the caller's tag, the
/// record's destination and event id.
struct Named<Tag> {
    tag: Box<Tag>,
    destination: String,
    event_id: String,
}

/// A record taken by the driver.
struct Item<Request, Tag> {
    request: Request,
    named: Named<Tag>,
    key: KeyHash,
    size: usize,
    queued_at: Instant,
    /// It carries a deduplication key ([`DriverOptions::dedup_queue_wait`]).
    deduplicated: bool,
}

/// A record on the wire, by its sequence number.
struct OnWire<Tag> {
    named: Named<Tag>,
    key: KeyHash,
    size: usize,
    sent_at: Instant,
}

/// The [`Sink`] an adapter becomes.
pub(crate) struct DriverSink<P: Protocol, Tag: Send + Sync + 'static> {
    protocol: Arc<P>,
    queue: mpsc::UnboundedSender<Item<P::Request, Tag>>,
    stop: watch::Sender<Option<Duration>>,
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    fence: Arc<KeyFence>,
    /// Set by the task at a [`Outcome::Fatal`] reply.
    verdict: Arc<Mutex<Option<SinkError>>>,
    /// Aborted when abandon gives up waiting: nothing more is written after it returned.
    task: tokio::task::AbortHandle,
}

/// The [`Sink`] an [`Exchange`] becomes.
pub(crate) type Driven<E, Tag> = DriverSink<E, Tag>;

/// Starts the driver task of `exchange` on the current tokio runtime.
pub(crate) fn start<E: Exchange, Tag: Send + Sync + 'static>(
    exchange: Arc<E>,
    options: DriverOptions,
) -> (Driven<E, Tag>, Completions<Tag>) {
    let connection = Requests {
        exchange: Arc::clone(&exchange),
        replies: FuturesUnordered::new(),
    };
    start_on(exchange, connection, options)
}

/// Starts the driver task of `protocol` on `connection`, on the current tokio runtime.
pub(crate) fn start_on<P, C, Tag>(
    protocol: Arc<P>,
    connection: C,
    options: DriverOptions,
) -> (DriverSink<P, Tag>, Completions<Tag>)
where
    P: Protocol,
    C: Connection<Request = P::Request, Reply = P::Reply>,
    Tag: Send + Sync + 'static,
{
    let (queue, queued) = mpsc::unbounded_channel();
    let (completions_tx, completions) = mpsc::unbounded_channel();
    let (stop, stopped) = watch::channel(None);
    let (done_tx, done) = std::sync::mpsc::channel();
    let fence = Arc::new(KeyFence::default());
    let verdict = Arc::new(Mutex::new(None));
    let task = Task {
        protocol: Arc::clone(&protocol),
        connection,
        options,
        completions: completions_tx,
        fence: Arc::clone(&fence),
        verdict: Arc::clone(&verdict),
        on_wire: BTreeMap::new(),
        wire_bytes: 0,
        next: 0,
        failed: None,
        keys: HashMap::new(),
        runnable: VecDeque::new(),
        held: None,
    };
    let task = tokio::spawn(async move {
        task.run(queued, stopped).await;
        let _ = done_tx.send(());
    })
    .abort_handle();
    (
        DriverSink {
            task,
            protocol,
            queue,
            stop,
            done: std::sync::Mutex::new(done),
            fence,
            verdict,
        },
        completions,
    )
}

impl<P: Protocol, Tag: Send + Sync + 'static> Sink<Tag> for DriverSink<P, Tag> {
    fn send(&self, handover: Handover<'_, '_>, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        let Handover { record, dedup_key, .. } = handover;
        let request = match self.protocol.encode(handover) {
            Ok(request) => request,
            Err(cause) => return Err(Refusal::of(record, tag, FailureKind::Refused, cause)),
        };
        self.queue
            .send(Item {
                request,
                named: Named {
                    tag,
                    destination: record.destination.to_string(),
                    event_id: String::from_utf8_lossy(record.event_id).into_owned(),
                },
                key: KeyHash::of(&record.key),
                size: record.size(),
                queued_at: Instant::now(),
                deduplicated: dedup_key.is_some(),
            })
            .map_err(|e| {
                let cause = format!("the {} sink has stopped", P::NAME);
                Refusal::of(record, e.0.named.tag, FailureKind::Transient, cause)
            })
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        let _ = self.stop.send(Some(wait));
        // Crash tests: die while the abandoned sink's requests may still be on the wire.
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        // The task waits at most `wait` itself; the margin covers its wind-down and close.
        if done.recv_timeout(wait + self.protocol.close_margin()).is_err() {
            warn!(sink = P::NAME, "abandoned sink did not stop in time");
            // Its connection goes with the task.
            self.task.abort();
        }
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }

    fn verdict(&self) -> Option<SinkError> {
        self.verdict.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The driver's task: owns the queue's receiving end, the connection and the completions.
struct Task<P: Protocol, C, Tag> {
    protocol: Arc<P>,
    connection: C,
    options: DriverOptions,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    fence: Arc<KeyFence>,
    verdict: Arc<Mutex<Option<SinkError>>>,
    /// By sequence number: the first entry is the oldest on the wire.
    on_wire: BTreeMap<u64, OnWire<Tag>>,
    wire_bytes: usize,
    next: u64,
    /// Set at the first transient failure: nothing is sent after it.
    failed: Option<String>,
    /// Per key: its records waiting behind the one on the wire (`Concurrency::PerKey`), and
    /// whether one is on the wire.
    keys: HashMap<KeyHash, KeyQueue<P::Request, Tag>>,
    /// Keys with nothing on the wire and a record waiting for a free slot, oldest first.
    runnable: VecDeque<KeyHash>,
    /// A record taken from the queue that waits for room on the wire (pipelined).
    held: Option<Item<P::Request, Tag>>,
}

struct KeyQueue<Request, Tag> {
    busy: bool,
    waiting: VecDeque<Item<Request, Tag>>,
}

impl<P, C, Tag> Task<P, C, Tag>
where
    P: Protocol,
    C: Connection<Request = P::Request, Reply = P::Reply>,
    Tag: Send + Sync + 'static,
{
    async fn run(
        mut self,
        mut queued: mpsc::UnboundedReceiver<Item<P::Request, Tag>>,
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
                arrival = self.connection.next() => {
                    match arrival {
                        Arrival::Reply(n, reply) => {
                            let key = self.settle(n, reply);
                            self.after_wire_freed(key).await;
                        }
                        Arrival::Lost(cause) => self.lost(cause).await,
                    }
                    self.connection.flush();
                }
                _ = overdue.tick(), if timed && !self.on_wire.is_empty() => {
                    self.time_out_overdue().await;
                    self.connection.flush();
                }
                next = queued.recv(), if room => match next {
                    Some(item) => {
                        self.take(item).await;
                        // A batch: what else is queued goes out with it (one flush), a bounded
                        // number before stop and replies are looked at again.
                        for _ in 0..DRAIN_AT_ONCE {
                            if !self.connection.gathers() || !self.has_room() {
                                break;
                            }
                            match queued.try_recv() {
                                Ok(item) => self.take(item).await,
                                Err(_) => break,
                            }
                        }
                        self.connection.flush();
                    }
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
        self.connection.flush();
        let drain = async {
            while !self.on_wire.is_empty() {
                match self.connection.next().await {
                    Arrival::Reply(n, reply) => {
                        self.settle(n, reply);
                    }
                    Arrival::Lost(cause) => {
                        self.fail_on_wire(&cause);
                        break;
                    }
                }
            }
        };
        if tokio::time::timeout(wait, drain).await.is_err() {
            warn!(
                sink = P::NAME,
                pending = self.on_wire.len(),
                "abandoned sink gave up waiting for its replies"
            );
        }
        self.connection.close().await;
        self.protocol.close().await;
    }

    /// Whether another record may be taken from the queue now.
    fn has_room(&self) -> bool {
        match self.options.concurrency {
            // A record waiting for room blocks the queue: the order is the queue's.
            Concurrency::Pipelined => self.held.is_none() && self.connection.ready(),
            // Records wait in their key's queue; the caller's budget bounds them.
            Concurrency::PerKey { .. } => true,
        }
    }

    /// Whether the wire has room for a request of `size` bytes.
    fn wire_room(&self, size: usize) -> bool {
        if !self.connection.ready() {
            return false;
        }
        let count = self.on_wire.len();
        let slots = match self.options.concurrency {
            Concurrency::Pipelined => self.options.max_in_flight.max(1),
            Concurrency::PerKey { max_keys } => max_keys.max(1).min(self.options.max_in_flight.max(1)),
        };
        count == 0 || (count < slots && self.wire_bytes + size <= self.options.max_in_flight_bytes)
    }

    /// A record from the queue.
    async fn take(&mut self, item: Item<P::Request, Tag>) {
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
    async fn dispatch(&mut self, item: Item<P::Request, Tag>) -> bool {
        if let Some(cause) = &self.failed {
            let cause = format!("not sent: an earlier record failed ({cause})");
            self.complete(item.named, Err((FailureKind::Transient, cause)));
            return false;
        }
        if self.fence.is_closed(item.key) {
            self.complete(item.named, Err((FailureKind::Transient, stopped_cause())));
            return false;
        }
        let waited = item.queued_at.elapsed();
        let max_wait = match item.deduplicated {
            true => self.options.dedup_queue_wait.or(self.options.max_queue_wait),
            false => self.options.max_queue_wait,
        };
        if max_wait.is_some_and(|max| waited > max) {
            let cause = format!(
                "not sent: it waited {} ms in the queue, more than the reply timeout",
                waited.as_millis()
            );
            self.fail(&cause);
            self.complete(item.named, Err((FailureKind::Transient, cause)));
            return false;
        }
        let n = self.next;
        self.next += 1;
        match self.connection.write(n, item.request).await {
            Ok(()) => {
                self.wire_bytes += item.size;
                self.on_wire.insert(
                    n,
                    OnWire {
                        named: item.named,
                        key: item.key,
                        size: item.size,
                        sent_at: Instant::now(),
                    },
                );
                true
            }
            Err(e) => {
                let cause = format!("send failed: {e}");
                self.fail(&cause);
                self.complete(item.named, Err((FailureKind::Transient, cause)));
                false
            }
        }
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

    /// The first failure stops the driver: nothing is sent after it.
    fn fail(&mut self, cause: &str) {
        if self.failed.is_none() {
            warn!(
                sink = P::NAME,
                %cause,
                "sink failed; it sends nothing more (what follows fails unsent)"
            );
            self.failed = Some(cause.to_owned());
        }
    }

    /// The connection can no longer be trusted: what is on the wire fails, nothing more is sent.
    async fn lost(&mut self, cause: String) {
        let keys = self.fail_on_wire(&cause);
        match self.options.concurrency {
            Concurrency::Pipelined => self.after_wire_freed(None).await,
            Concurrency::PerKey { .. } => {
                for key in keys {
                    self.key_done(key);
                }
                self.fill().await;
            }
        }
    }

    /// Fails every record on the wire with `cause`, in the order they were sent; their keys.
    fn fail_on_wire(&mut self, cause: &str) -> Vec<KeyHash> {
        self.fail(cause);
        self.wire_bytes = 0;
        let mut keys = Vec::with_capacity(self.on_wire.len());
        for (_, rec) in std::mem::take(&mut self.on_wire) {
            keys.push(rec.key);
            self.complete(rec.named, Err((FailureKind::Transient, cause.to_owned())));
        }
        keys
    }

    /// Settles record `n` with `reply`; its key, if it was still on the wire.
    fn settle(&mut self, n: u64, reply: P::Reply) -> Option<KeyHash> {
        let rec = self.on_wire.remove(&n)?; // timed out already
        self.wire_bytes = self.wire_bytes.saturating_sub(rec.size);
        let key = rec.key;
        match self.protocol.classify(reply) {
            Outcome::Acknowledged => self.complete(rec.named, Ok(())),
            Outcome::Transient(cause) => {
                self.fail(&cause);
                self.complete(rec.named, Err((FailureKind::Transient, cause)));
            }
            Outcome::Fatal(cause) => {
                // The verdict first: a caller that sees the failed record finds it there.
                let verdict = SinkError {
                    sink: P::NAME,
                    cause: cause.clone(),
                    transient: false,
                };
                self.verdict
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(verdict);
                self.fail(&cause);
                self.complete(rec.named, Err((FailureKind::Transient, cause)));
            }
            Outcome::Refused(cause) => {
                // Later records of the key wait for the caller's decision (`sink/fence.rs`).
                let fence = Arc::clone(&self.fence);
                fence.close_then(key, || {
                    self.complete(rec.named, Err((FailureKind::Refused, cause)));
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
                self.protocol.reply_name(),
                timeout.as_millis()
            );
            self.fail(&cause);
            self.complete(rec.named, Err((FailureKind::Transient, cause)));
            self.after_wire_freed(Some(rec.key)).await;
        }
    }

    fn complete(&mut self, named: Named<Tag>, outcome: Result<(), (FailureKind, String)>) {
        let Named {
            tag,
            destination,
            event_id,
        } = named;
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
        Fatal,
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

    impl Protocol for TestExchange {
        type Request = Request;
        type Reply = Script;

        const NAME: &'static str = "test";

        fn encode(&self, handover: Handover<'_, '_>) -> Result<Request, String> {
            let record = handover.record;
            let text = std::str::from_utf8(record.value.as_deref().unwrap_or_default()).unwrap();
            if text == "bad" {
                return Err("refused on sight".into());
            }
            let (value, script) = text.split_once(':').unwrap();
            let script = match script {
                "refuse" => Script::Refuse,
                "transient" => Script::Transient,
                "fatal" => Script::Fatal,
                "hang" => Script::Hang,
                ms => Script::AckAfter(ms.parse().unwrap()),
            };
            Ok(Request {
                key: String::from_utf8(record.key.to_vec()).unwrap(),
                value: value.parse().unwrap(),
                script,
            })
        }

        fn classify(&self, reply: Script) -> Outcome {
            match reply {
                Script::AckAfter(_) => Outcome::Acknowledged,
                Script::Refuse => Outcome::Refused("the broker refused it".into()),
                Script::Transient | Script::Hang => Outcome::Transient("the broker is busy".into()),
                Script::Fatal => Outcome::Fatal("the certificate is not trusted; set the CA".into()),
            }
        }
    }

    impl Exchange for TestExchange {
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
                    Script::Refuse | Script::Transient | Script::Fatal => {}
                }
                guard.finished = true;
                request.script
            }))
        }
    }

    fn options(concurrency: Concurrency) -> DriverOptions {
        DriverOptions {
            concurrency,
            max_in_flight: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            reply_timeout: Some(Duration::from_secs(5)),
            max_queue_wait: None,
            dedup_queue_wait: None,
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
        let record = crate::sink::memory::record("d", key.as_bytes(), value.as_bytes(), b"id");
        sink.send(Handover::of(&record), Box::new(tag))
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
    async fn a_fatal_reply_becomes_the_verdict_and_stops_the_driver() {
        let mut fx = fixture(options(Concurrency::PerKey { max_keys: 1 }));
        assert!(fx.sink.verdict().is_none());
        send(&fx.sink, "a", "0:fatal", 0).unwrap();
        send(&fx.sink, "b", "1:0", 1).unwrap();
        // The record is not lost: it fails transient (the WAL position is held) ...
        assert_eq!(
            next(&mut fx.completions, 2).await,
            vec![(0, Some(FailureKind::Transient)), (1, Some(FailureKind::Transient))]
        );
        // ... and the sink says why waiting cannot help, for the relay to stop with.
        let verdict = fx.sink.verdict().expect("a verdict after a fatal reply");
        assert!(!verdict.transient);
        assert_eq!(verdict.cause, "the certificate is not trusted; set the CA");
        let sent: Vec<u32> = fx.seen.lock().unwrap().sent.iter().map(|(_, v)| *v).collect();
        assert_eq!(sent, vec![0], "nothing sent after the fatal reply");
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
