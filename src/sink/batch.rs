//! The shared batcher of the sinks whose service takes several entries per call for one
//! destination and answers each entry on its own (SQS `SendMessageBatch`, SNS `PublishBatch`,
//! Kinesis `PutRecords`). A sink on the shared driver (`sink/driver.rs`) hands each encoded
//! entry to a [`Batcher`] in its `Exchange::send` and returns the batcher's reply future; the
//! service's part is a [`BatchSend`]: send one batch to one destination, say what became of each
//! entry.
//!
//! **Batches.** One task gathers handed-over entries into calls of up to
//! [`BatchLimits::max_entries`] entries for one destination, their sizes summing to at most
//! [`BatchLimits::max_bytes`], with at most [`BatchLimits::max_calls`] calls on the wire: while
//! all are busy, entries queue up and the next call takes a full batch at once, so batches fill
//! under load without a linger timer and a lone entry goes out at once. An entry larger than
//! `max_bytes` goes alone (the sink refuses what the service would refuse before handing over).
//!
//! **Failures.** Per entry: [`EntryAnswer::Stored`], [`EntryAnswer::Refused`] (the entry itself
//! is wrong: `relay.on_bad_event` decides) or [`EntryAnswer::Retry`]. A whole call:
//! [`CallError::Transient`] (network, timeout, 5xx, throttling, credentials),
//! [`CallError::Refused`] (the request was refused for its content: the batch is split and each
//! entry sent alone, so only the bad one is refused), [`CallError::Missing`] (the destination
//! does not exist: every entry refused). Entries to retry — and only those, never the stored
//! ones — are sent again with backoff (100 ms doubling to 5 s) for as long as it takes: the WAL
//! position stays held meanwhile, and the driver never sees a transient failure that would
//! replay every other aggregate.
//!
//! **Order.** The batcher keeps the order of hand-over within a destination. Per-key order is
//! the driver's (`Concurrency::PerKey`: at most one entry per key on the wire), so a batch holds
//! one entry per key and nothing of a key is sent past a failed entry.
//!
//! Invariant: a call task ends when its entries are answered or every waiter is gone (abandon);
//! [`Batcher::close`] (and dropping the batcher) aborts what is left, so nothing of an abandoned
//! sink is sent late. This file names no broker and no client crate.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tracing::{debug, warn};

use crate::sink::driver::ReplyFuture;

const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// One entry as the batcher sees it: where it goes and what it weighs.
pub(crate) trait BatchEntry: Send + Sync + 'static {
    /// The routed name (queue, topic, stream): a batch holds one destination's entries.
    fn destination(&self) -> &str;
    /// What the entry counts against [`BatchLimits::max_bytes`], as the service counts it.
    fn size(&self) -> usize;
}

/// What the service said of one entry of a call that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EntryAnswer {
    Stored,
    /// The entry is wrong for the service (a bad event); the words name the service's reason.
    Refused(String),
    /// Not stored, for a reason retrying may cure (throttling, an internal error).
    Retry(String),
}

/// Why a call failed as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Retry the same entries after a backoff.
    Transient(String),
    /// The request was refused for its content: a batch is split and each entry sent alone; an
    /// entry alone is refused with these words.
    Refused(String),
    /// The destination does not exist (for this account, region and credentials): every entry
    /// is refused with these words.
    Missing(String),
}

/// Sends one batch to one destination: the service's part of a batched sink.
pub(crate) trait BatchSend: Send + Sync + 'static {
    type Entry: BatchEntry;

    /// The service's name in logs (`"Amazon SQS"`).
    const NAME: &'static str;

    /// One call with `entries` (all for `destination`, at most `max_entries`). `Ok` holds one
    /// answer per entry, in the order of `entries` (an entry the service did not mention is
    /// [`EntryAnswer::Retry`]).
    fn send_batch(
        &self,
        destination: &str,
        entries: &[&Self::Entry],
    ) -> impl Future<Output = Result<Vec<EntryAnswer>, CallError>> + Send;
}

/// The limits of one sink's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchLimits {
    /// Entries per call (SQS and SNS: 10; Kinesis: 500).
    pub(crate) max_entries: usize,
    /// The sum of the entries' sizes per call (SQS: 256 KiB; Kinesis: 5 MiB).
    pub(crate) max_bytes: usize,
    /// Calls on the wire at once.
    pub(crate) max_calls: usize,
}

/// How an entry ended, for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Stored,
    Refused(String),
    /// The batcher ended without an answer (closed): the driver stops, the relay replays.
    Lost(String),
}

/// An entry waiting for its batch, and where its answer goes.
struct Pending<E> {
    entry: E,
    answer: oneshot::Sender<Answer>,
}

/// The tasks still running, aborted on close.
#[derive(Default)]
struct Tasks(Mutex<Vec<AbortHandle>>);

impl Tasks {
    fn track(&self, handle: AbortHandle) {
        let mut tasks = self.0.lock().expect("batch tasks");
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    fn abort_all(&self) {
        for t in self.0.lock().expect("batch tasks").drain(..) {
            t.abort();
        }
    }
}

/// The handle a sink's exchange holds: entries in, one answer each out.
pub(crate) struct Batcher<S: BatchSend> {
    queue: mpsc::UnboundedSender<Pending<S::Entry>>,
    tasks: Arc<Tasks>,
}

impl<S: BatchSend> Batcher<S> {
    /// Starts the batch task on the current runtime.
    pub(crate) fn start(sender: S, limits: BatchLimits) -> Batcher<S> {
        let (queue, rx) = mpsc::unbounded_channel();
        let tasks = Arc::new(Tasks::default());
        let limits = BatchLimits {
            max_entries: limits.max_entries.max(1),
            max_calls: limits.max_calls.max(1),
            ..limits
        };
        let handle = tokio::spawn(batch_loop(rx, Arc::new(sender), limits, tasks.clone()));
        tasks.track(handle.abort_handle());
        Batcher { queue, tasks }
    }

    /// Hands `entry` over; the reply future is its answer (cancel-safe: dropping it abandons the
    /// entry, which is then not sent again).
    pub(crate) fn submit(&self, entry: S::Entry) -> Result<ReplyFuture<Answer>, String> {
        let (answer, reply) = oneshot::channel();
        self.queue
            .send(Pending { entry, answer })
            .map_err(|_| format!("the {} batcher has stopped", S::NAME))?;
        let name = S::NAME;
        Ok(Box::pin(async move {
            // A call task never drops an answer it owes, but an aborted one (close) does.
            reply
                .await
                .unwrap_or_else(|_| Answer::Lost(format!("the {name} batch ended without an answer")))
        }))
    }

    /// Aborts every task: nothing more is sent.
    pub(crate) fn close(&self) {
        self.tasks.abort_all();
    }
}

impl<S: BatchSend> Drop for Batcher<S> {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Takes handed-over entries into batches while a call slot is free (module docs).
async fn batch_loop<S: BatchSend>(
    mut rx: mpsc::UnboundedReceiver<Pending<S::Entry>>,
    sender: Arc<S>,
    limits: BatchLimits,
    tasks: Arc<Tasks>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_calls));
    let mut queued: VecDeque<Pending<S::Entry>> = VecDeque::new();
    loop {
        if queued.is_empty() {
            match rx.recv().await {
                Some(p) => queued.push_back(p),
                None => return,
            }
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        while let Ok(p) = rx.try_recv() {
            queued.push_back(p);
        }
        let batch = take_batch(&mut queued, limits);
        let handle = tokio::spawn(deliver(sender.clone(), batch, Some(slot)));
        tasks.track(handle.abort_handle());
    }
}

/// The first queued entry and more for its destination, in order, within the limits.
fn take_batch<E: BatchEntry>(queued: &mut VecDeque<Pending<E>>, limits: BatchLimits) -> Vec<Pending<E>> {
    let Some(first) = queued.pop_front() else {
        return Vec::new();
    };
    let mut bytes = first.entry.size();
    let mut batch = vec![first];
    let mut rest = VecDeque::with_capacity(queued.len());
    while let Some(p) = queued.pop_front() {
        if batch.len() < limits.max_entries
            && p.entry.destination() == batch[0].entry.destination()
            && bytes + p.entry.size() <= limits.max_bytes
        {
            bytes += p.entry.size();
            batch.push(p);
        } else {
            rest.push_back(p);
        }
    }
    *queued = rest;
    batch
}

/// Sends `batch` (one destination) until each entry is stored or refused, or nobody waits
/// anymore. `slot`: the call slot, held until the batch is done (`None`: the parent's).
async fn deliver<S: BatchSend>(sender: Arc<S>, batch: Vec<Pending<S::Entry>>, slot: Option<OwnedSemaphorePermit>) {
    let _slot = slot;
    let Some(destination) = batch.first().map(|p| p.entry.destination().to_owned()) else {
        return;
    };
    let mut todo = batch;
    let mut backoff = RETRY_INITIAL;
    let mut attempt = 0u32;
    loop {
        // Abandoned entries (the driver dropped their replies) are not sent again.
        todo.retain(|p| !p.answer.is_closed());
        if todo.is_empty() {
            return;
        }
        let entries: Vec<&S::Entry> = todo.iter().map(|p| &p.entry).collect();
        let result = sender.send_batch(&destination, &entries).await;
        let failure = match result {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                let mut retry = Vec::new();
                let mut cause = String::new();
                for p in todo {
                    match answers.next() {
                        Some(EntryAnswer::Stored) => {
                            let _ = p.answer.send(Answer::Stored);
                        }
                        Some(EntryAnswer::Refused(why)) => {
                            let _ = p.answer.send(Answer::Refused(why));
                        }
                        Some(EntryAnswer::Retry(why)) => {
                            cause = why;
                            retry.push(p);
                        }
                        None => {
                            cause = "the answer did not mention the entry".into();
                            retry.push(p);
                        }
                    }
                }
                todo = retry;
                if todo.is_empty() {
                    return;
                }
                format!("{} of the batch's entries failed ({cause})", todo.len())
            }
            Err(CallError::Missing(why)) => {
                for p in todo {
                    let _ = p.answer.send(Answer::Refused(why.clone()));
                }
                return;
            }
            Err(CallError::Refused(why)) if todo.len() == 1 => {
                let p = todo.pop().expect("one entry");
                let _ = p.answer.send(Answer::Refused(why));
                return;
            }
            Err(CallError::Refused(why)) => {
                debug!(sink = S::NAME, destination = %destination, cause = %why, entries = todo.len(),
                    "a batch was refused as a whole; sending each entry alone");
                for p in todo {
                    Box::pin(deliver(sender.clone(), vec![p], None)).await;
                }
                return;
            }
            Err(CallError::Transient(why)) => why,
        };
        attempt += 1;
        if attempt == 1 || attempt.is_power_of_two() {
            warn!(
                sink = S::NAME,
                destination = %destination,
                entries = todo.len(),
                attempt,
                cause = %failure,
                "{} did not store a batch; retrying (the WAL position is held meanwhile)",
                S::NAME
            );
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Debug, Clone)]
    struct Item {
        to: &'static str,
        size: usize,
        name: &'static str,
    }

    impl BatchEntry for Item {
        fn destination(&self) -> &str {
            self.to
        }

        fn size(&self) -> usize {
            self.size
        }
    }

    fn pending(to: &'static str, size: usize) -> (Pending<Item>, oneshot::Receiver<Answer>) {
        let (answer, rx) = oneshot::channel();
        (
            Pending {
                entry: Item { to, size, name: "" },
                answer,
            },
            rx,
        )
    }

    const LIMITS: BatchLimits = BatchLimits {
        max_entries: 10,
        max_bytes: 1000,
        max_calls: 1,
    };

    #[test]
    fn batches_take_one_destination_the_entry_limit_and_the_byte_limit_in_order() {
        let mut queued = VecDeque::new();
        let mut keep = Vec::new();
        for i in 0..25 {
            let (p, rx) = pending(if i % 5 == 4 { "b" } else { "a" }, 10);
            queued.push_back(p);
            keep.push(rx);
        }
        let first = take_batch(&mut queued, LIMITS);
        assert_eq!(first.len(), 10);
        assert!(first.iter().all(|p| p.entry.to == "a"));
        assert_eq!(queued.len(), 15);
        assert_eq!(queued.front().unwrap().entry.to, "b", "the rest keep their order");
        let second = take_batch(&mut queued, LIMITS);
        assert_eq!(second.len(), 5, "every b");
        assert!(second.iter().all(|p| p.entry.to == "b"));
        let small = BatchLimits {
            max_bytes: 35,
            ..LIMITS
        };
        assert_eq!(take_batch(&mut queued, small).len(), 3, "30 bytes fit in 35, 40 do not");
        let mut big = VecDeque::new();
        big.push_back(pending("a", 100).0);
        assert_eq!(
            take_batch(&mut big, small).len(),
            1,
            "the first entry goes alone even at the limit"
        );
        let many = BatchLimits {
            max_entries: 500,
            max_bytes: usize::MAX,
            ..LIMITS
        };
        let mut lots: VecDeque<_> = (0..600).map(|_| pending("k", 1).0).collect();
        assert_eq!(take_batch(&mut lots, many).len(), 500);
    }

    /// A scripted service: each entry named `retry` fails its first call, `bad` is refused,
    /// a batch holding `poison` is refused as a whole, destination `gone` is missing.
    #[derive(Default)]
    struct Scripted {
        calls: Mutex<Vec<(String, Vec<&'static str>)>>,
        seen: Mutex<HashMap<&'static str, u32>>,
    }

    impl BatchSend for Arc<Scripted> {
        type Entry = Item;

        const NAME: &'static str = "scripted";

        async fn send_batch(&self, destination: &str, entries: &[&Item]) -> Result<Vec<EntryAnswer>, CallError> {
            let names: Vec<&'static str> = entries.iter().map(|e| e.name).collect();
            self.calls.lock().unwrap().push((destination.to_owned(), names.clone()));
            if destination == "gone" {
                return Err(CallError::Missing("no such destination".into()));
            }
            if names.contains(&"poison") {
                return Err(CallError::Refused("poison refused".into()));
            }
            let mut seen = self.seen.lock().unwrap();
            Ok(names
                .iter()
                .map(|n| {
                    let count = seen.entry(n).or_default();
                    *count += 1;
                    match *n {
                        "bad" => EntryAnswer::Refused("bad refused".into()),
                        "retry" if *count == 1 => EntryAnswer::Retry("throttled".into()),
                        _ => EntryAnswer::Stored,
                    }
                })
                .collect())
        }
    }

    async fn run(script: &Arc<Scripted>, items: &[(&'static str, &'static str)]) -> Vec<Answer> {
        // One call slot, and the first entry goes alone: hand everything over before it answers.
        let batcher = Batcher::start(script.clone(), LIMITS);
        let replies: Vec<_> = items
            .iter()
            .map(|&(to, name)| batcher.submit(Item { to, size: 1, name }).unwrap())
            .collect();
        let mut answers = Vec::new();
        for r in replies {
            answers.push(
                tokio::time::timeout(Duration::from_secs(10), r)
                    .await
                    .expect("an answer"),
            );
        }
        answers
    }

    #[tokio::test]
    async fn only_unstored_entries_are_retried_and_a_refused_batch_is_split() {
        let script = Arc::new(Scripted::default());
        let answers = run(
            &script,
            &[("a", "ok1"), ("a", "retry"), ("a", "bad"), ("a", "ok2"), ("gone", "x")],
        )
        .await;
        assert_eq!(
            answers,
            [
                Answer::Stored,
                Answer::Stored,
                Answer::Refused("bad refused".into()),
                Answer::Stored,
                Answer::Refused("no such destination".into())
            ]
        );
        let calls = script.calls.lock().unwrap().clone();
        let retried: Vec<_> = calls.iter().filter(|(_, n)| n.contains(&"retry")).collect();
        assert_eq!(retried.len(), 2, "{calls:?}");
        assert_eq!(
            retried[1].1,
            ["retry"],
            "the stored and refused entries are not sent again"
        );

        let script = Arc::new(Scripted::default());
        let answers = run(&script, &[("a", "ok0"), ("a", "ok1"), ("a", "poison"), ("a", "ok2")]).await;
        assert_eq!(
            answers,
            [
                Answer::Stored,
                Answer::Stored,
                Answer::Refused("poison refused".into()),
                Answer::Stored
            ]
        );
        let calls = script.calls.lock().unwrap().clone();
        let singles: Vec<_> = calls.iter().filter(|(_, n)| n.len() == 1).map(|(_, n)| n[0]).collect();
        assert!(
            singles.ends_with(&["ok1", "poison", "ok2"]),
            "split in order: {calls:?}"
        );
    }

    #[tokio::test]
    async fn close_ends_every_wait_with_lost() {
        #[derive(Clone)]
        struct Never;
        impl BatchSend for Never {
            type Entry = Item;
            const NAME: &'static str = "never";
            async fn send_batch(&self, _: &str, _: &[&Item]) -> Result<Vec<EntryAnswer>, CallError> {
                std::future::pending().await
            }
        }
        let batcher = Batcher::start(Never, LIMITS);
        let reply = batcher
            .submit(Item {
                to: "a",
                size: 1,
                name: "x",
            })
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        batcher.close();
        let answer = tokio::time::timeout(Duration::from_secs(5), reply)
            .await
            .expect("answered");
        assert!(matches!(answer, Answer::Lost(_)), "{answer:?}");
    }
}
