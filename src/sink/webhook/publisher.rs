//! The webhook sink's driver: [`Sink::send`] turns a record into a request on sight (a record
//! HTTP cannot carry is refused at once) and queues it for one tokio task that sends at most
//! one request per aggregate key at a time, up to `max_concurrency` keys at once, and reports one
//! completion per record.
//!
//! Order: a key's next request leaves only once the previous one was answered for good —
//! delivered (2xx, after however many transient retries) or refused (4xx). A refusal closes the
//! key's fence ([`KeyFence`]) before its completion is reported; the key's requests queued
//! behind it then fail `Transient` without being sent, and so do the key's records handed over
//! until the caller releases it. So nothing of an aggregate reaches the receiver ahead of an
//! earlier event of it.
//!
//! Abandon: queued requests are dropped, and the ones on the wire are given at most the wait to
//! finish, then dropped (which closes their connections); the next sink replays them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::client::{Client, Undeliverable};
use super::request::{Encoder, Request};
use crate::config::cloudevents::CloudEventsMode;
use crate::config::webhook::{WebhookSettings, WebhookUrl};
use crate::sink::fence::{stopped_cause, KeyFence, KeyHash};
use crate::sink::{Completion, Completions, FailureKind, Refusal, Sink, SinkError, SinkFailure, SinkRecord};

/// One record on its way: its request, and what its completion needs.
struct Outgoing<Tag> {
    request: Request,
    destination: String,
    key: KeyHash,
    tag: Box<Tag>,
}

pub(crate) struct Publisher<Tag: Send + Sync + 'static> {
    encoder: Encoder,
    queue: mpsc::UnboundedSender<Outgoing<Tag>>,
    stop: watch::Sender<Option<Duration>>,
    done: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    fence: Arc<KeyFence>,
}

impl<Tag: Send + Sync + 'static> Publisher<Tag> {
    /// Builds the client and spawns the sending task on the current runtime. Nothing is
    /// connected yet: the first request opens the first connection.
    pub(crate) fn create(
        settings: &WebhookSettings,
        cloudevents: Option<CloudEventsMode>,
    ) -> Result<(Publisher<Tag>, Completions<Tag>), SinkError> {
        let encoder = Encoder::new(settings, cloudevents).map_err(|cause| SinkError {
            sink: super::SINK,
            cause,
            transient: false,
        })?;
        let client = Client::new(settings)?;
        let (queue, queued) = mpsc::unbounded_channel();
        let (completions_tx, completions) = mpsc::unbounded_channel();
        let (stop, stopped) = watch::channel(None);
        let (done_tx, done) = std::sync::mpsc::channel();
        let fence = Arc::new(KeyFence::default());
        let task = Task {
            client,
            url: settings.url.clone(),
            max_concurrency: settings.max_concurrency,
            completions: completions_tx,
            fence: Arc::clone(&fence),
            waiting: HashMap::new(),
            ready: VecDeque::new(),
        };
        tokio::spawn(async move {
            task.run(queued, stopped).await;
            let _ = done_tx.send(());
        });
        debug!(url = %settings.url, max_concurrency = settings.max_concurrency, "webhook sink ready");
        Ok((
            Publisher {
                encoder,
                queue,
                stop,
                done: std::sync::Mutex::new(done),
                fence,
            },
            completions,
        ))
    }
}

impl<Tag: Send + Sync + 'static> Sink<Tag> for Publisher<Tag> {
    /// HTTP does not deduplicate: `dedup_key` is unused (exactly-once is refused at start).
    fn send(
        &self,
        record: &SinkRecord<'_>,
        extra: &[(&str, &[u8])],
        _dedup_key: Option<&str>,
        tag: Box<Tag>,
    ) -> Result<(), Refusal<Tag>> {
        let refusal = |tag, kind, cause| Refusal {
            tag,
            failure: SinkFailure {
                kind,
                destination: record.destination.to_string(),
                partition: None,
                event_id: Some(String::from_utf8_lossy(record.event_id).into_owned()),
                cause,
            },
        };
        let request = match self.encoder.encode(record, extra) {
            Ok(request) => request,
            Err(cause) => return Err(refusal(tag, FailureKind::Refused, cause)),
        };
        self.fence.admit(
            &record.key,
            tag,
            |tag| {
                self.queue
                    .send(Outgoing {
                        request,
                        destination: record.destination.to_string(),
                        key: KeyHash::of(&record.key),
                        tag,
                    })
                    .map_err(|e| {
                        refusal(
                            e.0.tag,
                            FailureKind::Transient,
                            "the webhook sink has stopped".into(),
                        )
                    })
            },
            |tag| Err(refusal(tag, FailureKind::Transient, stopped_cause())),
        )
    }

    fn abandon(self: Box<Self>, wait: Duration) {
        let _ = self.stop.send(Some(wait));
        fail::fail_point!("publisher::abandon", |_| crate::failpoints::crash("publisher::abandon"));
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if done.recv_timeout(wait + Duration::from_millis(200)).is_err() {
            warn!("abandoned webhook sink did not stop in time");
        }
    }

    fn release(&self, key: &[u8]) {
        self.fence.open(key);
    }
}

/// What a finished request reports: the key it held and its outcome.
type Finished<Tag> = (Outgoing<Tag>, Result<(), Undeliverable>);

struct Task<Tag> {
    client: Client,
    url: WebhookUrl,
    max_concurrency: usize,
    completions: mpsc::UnboundedSender<Completion<Tag>>,
    fence: Arc<KeyFence>,
    /// Every busy key (a request on the wire, or records waiting for a slot): its records not
    /// sent yet, in hand-over order. A key absent here is idle.
    waiting: HashMap<KeyHash, VecDeque<Outgoing<Tag>>>,
    /// Keys with nothing on the wire and records to send, waiting for a free slot, oldest first
    /// (their records are in `waiting`).
    ready: VecDeque<KeyHash>,
}

impl<Tag: Send + Sync + 'static> Task<Tag> {
    async fn run(
        mut self,
        mut queued: mpsc::UnboundedReceiver<Outgoing<Tag>>,
        mut stop: watch::Receiver<Option<Duration>>,
    ) {
        let mut on_wire = FuturesUnordered::new();
        // Dropped without abandon: the wire gets no grace.
        let mut wait = Duration::ZERO;
        let mut open = true;
        loop {
            // Fill free slots with the keys that waited longest.
            while on_wire.len() < self.max_concurrency {
                let Some(key) = self.ready.pop_front() else { break };
                if let Some(out) = self.waiting.get_mut(&key).and_then(VecDeque::pop_front) {
                    on_wire.push(self.deliver(out));
                }
            }
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_ok() {
                        wait = stop.borrow().unwrap_or(wait);
                    }
                    break;
                }
                Some((out, outcome)) = on_wire.next() => self.finished(out, outcome),
                next = queued.recv(), if open => match next {
                    Some(out) => self.take(out),
                    None => open = false,
                },
                else => break,
            }
        }
        // Abandoned: what is queued is dropped; what is on the wire may finish within `wait`,
        // its completions still reported (the caller may read them or not).
        queued.close();
        while queued.try_recv().is_ok() {}
        self.waiting.clear();
        let drain = async {
            while let Some((out, outcome)) = on_wire.next().await {
                self.finished(out, outcome);
            }
        };
        if tokio::time::timeout(wait, drain).await.is_err() {
            debug!("abandoned webhook sink dropped the requests still on the wire");
        }
    }

    /// A record handed over: queued behind its key's request when the key is busy (on the wire
    /// or already waiting for a slot), else its key becomes ready for the next free slot.
    fn take(&mut self, out: Outgoing<Tag>) {
        if self.fence.is_closed(out.key) {
            self.report(out, Err((FailureKind::Transient, stopped_cause())));
            return;
        }
        let key = out.key;
        match self.waiting.get_mut(&key) {
            Some(line) => line.push_back(out),
            None => {
                self.waiting.insert(key, VecDeque::from([out]));
                self.ready.push_back(key);
            }
        }
    }

    fn deliver(&self, out: Outgoing<Tag>) -> impl std::future::Future<Output = Finished<Tag>> + Send + 'static {
        let client = self.client.clone();
        let shown = self.url.shown_for(&out.destination);
        async move {
            let outcome = client.deliver(&out.request, &shown).await;
            (out, outcome)
        }
    }

    /// A request answered for good: its completion, then the key's next request (or, after a
    /// refusal, the key's queue failed behind the closed fence).
    fn finished(&mut self, out: Outgoing<Tag>, outcome: Result<(), Undeliverable>) {
        let key = out.key;
        match outcome {
            Ok(()) => self.report(out, Ok(())),
            Err(Undeliverable::Refused(cause)) => {
                let completions = self.completions.clone();
                self.fence.close_then(key, || {
                    let _ = completions.send(completion(out, Err((FailureKind::Refused, cause))));
                });
                for behind in self.waiting.remove(&key).unwrap_or_default() {
                    self.report(behind, Err((FailureKind::Transient, stopped_cause())));
                }
                return;
            }
        }
        match self.waiting.get(&key) {
            Some(line) if !line.is_empty() => self.ready.push_back(key),
            _ => {
                self.waiting.remove(&key);
            }
        }
    }

    fn report(&self, out: Outgoing<Tag>, outcome: Result<(), (FailureKind, String)>) {
        let _ = self.completions.send(completion(out, outcome));
    }
}

fn completion<Tag>(out: Outgoing<Tag>, outcome: Result<(), (FailureKind, String)>) -> Completion<Tag> {
    Completion {
        tag: out.tag,
        outcome: outcome.map_err(|(kind, cause)| SinkFailure {
            kind,
            destination: out.destination,
            partition: None,
            event_id: Some(out.request.event_id),
            cause,
        }),
    }
}
