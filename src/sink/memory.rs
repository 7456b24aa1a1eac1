//! An in-memory sink for unit tests: it keeps what it was sent, in order, and completes each
//! record when the test says so — delivered, refused or failed — so the pipeline's steps can be
//! tested without a broker.
//!
//! Its twin of the real adapters' contract: one completion per record taken, none for a record
//! refused in [`Sink::send`], nothing completed after [`Sink::abandon`].

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Completion, Completions, FailureKind, Handover, Refusal, Sealer, Sink, SinkFailure, SinkRecord};

/// A record as the sink received it, owning its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) destination: String,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
    /// `id` first, then the record's headers, then the extra ones, as a broker would get them.
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) dedup_key: Option<String>,
    pub(crate) timestamp_ms: Option<i64>,
}

impl Stored {
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

struct State<Tag> {
    /// Every record taken, in order.
    stored: Vec<Stored>,
    /// Taken and not completed yet.
    pending: VecDeque<Box<Tag>>,
    /// Refuse records to this destination in `send` (as a client refusing a name locally).
    refuse: Option<String>,
    /// Answer [`FailureKind::Full`] while this many records are pending (a client's queue).
    capacity: Option<usize>,
    abandoned: bool,
    /// Keys the caller released ([`Sink::release`]), in order, each with how many records the
    /// sink had taken by then.
    released: Vec<(Vec<u8>, usize)>,
    /// Checkpoints of the seals asked for, in order (each seal's tag waits in `pending` behind
    /// the records handed over before it).
    seals: Vec<u64>,
    /// `stored` when the last seal was asked for: an abort takes back what was stored after it
    /// (what a `read_committed` reader would never see).
    sealed_upto: usize,
    /// Aborts asked for, each with how many records it took back.
    aborts: Vec<usize>,
}

/// The sink; the test keeps a [`MemoryHandle`] to look and complete.
pub(crate) struct MemorySink<Tag> {
    state: Arc<Mutex<State<Tag>>>,
}

/// The test's side of a [`MemorySink`].
pub(crate) struct MemoryHandle<Tag> {
    state: Arc<Mutex<State<Tag>>>,
    tx: mpsc::UnboundedSender<Completion<Tag>>,
}

/// A sink that completes nothing until the test says so.
pub(crate) fn memory<Tag: Send + 'static>() -> (MemorySink<Tag>, MemoryHandle<Tag>, Completions<Tag>) {
    let state = Arc::new(Mutex::new(State {
        stored: Vec::new(),
        pending: VecDeque::new(),
        refuse: None,
        capacity: None,
        abandoned: false,
        released: Vec::new(),
        seals: Vec::new(),
        sealed_upto: 0,
        aborts: Vec::new(),
    }));
    let (tx, rx) = mpsc::unbounded_channel();
    (
        MemorySink {
            state: Arc::clone(&state),
        },
        MemoryHandle { state, tx },
        rx,
    )
}

impl<Tag: Send + 'static> Sink<Tag> for MemorySink<Tag> {
    fn send(&self, handover: Handover<'_, '_>, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        let record = handover.record;
        let mut state = self.state.lock().unwrap();
        if state.refuse.as_deref() == Some(&*record.destination) {
            return Err(Refusal::of(
                record,
                tag,
                FailureKind::Refused,
                "refused by the test".into(),
            ));
        }
        if state.capacity.is_some_and(|c| state.pending.len() >= c) {
            return Err(Refusal::of(
                record,
                tag,
                FailureKind::Full,
                "the test's queue is full".into(),
            ));
        }
        let mut headers = vec![("id".to_owned(), Some(record.event_id.to_vec()))];
        headers.extend(
            record
                .headers_with(handover.extra)
                .map(|(n, v)| (n.to_owned(), v.map(<[u8]>::to_vec))),
        );
        state.stored.push(Stored {
            destination: record.destination.clone().into_owned(),
            key: record.key.to_vec(),
            value: record.value.as_deref().map(<[u8]>::to_vec),
            headers,
            dedup_key: handover.dedup_key.map(str::to_owned),
            timestamp_ms: record.timestamp_ms,
        });
        state.pending.push_back(tag);
        Ok(())
    }

    fn abandon(self: Box<Self>, _wait: Duration) {
        let mut state = self.state.lock().unwrap();
        state.abandoned = true;
        state.pending.clear();
    }

    fn release(&self, key: &[u8]) {
        let mut state = self.state.lock().unwrap();
        let stored = state.stored.len();
        state.released.push((key.to_vec(), stored));
    }
}

/// The memory sink's [`Sealer`]: a seal is completed, like a record, when the test delivers it
/// (after the records before it).
pub(crate) struct MemorySealer<Tag> {
    state: Arc<Mutex<State<Tag>>>,
}

impl<Tag: Send + 'static> Sealer<Tag> for MemorySealer<Tag> {
    fn seal(&self, checkpoint: u64, _label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        let mut state = self.state.lock().unwrap();
        state.seals.push(checkpoint);
        state.sealed_upto = state.stored.len();
        state.pending.push_back(tag);
        Ok(())
    }

    fn abort(&self, _label: &str, tag: Box<Tag>) -> Result<(), Refusal<Tag>> {
        let mut state = self.state.lock().unwrap();
        let upto = state.sealed_upto;
        let taken = state.stored.len() - upto;
        state.stored.truncate(upto);
        state.aborts.push(taken);
        state.pending.push_back(tag);
        Ok(())
    }
}

impl<Tag> MemoryHandle<Tag> {
    /// A sealer of the sink's records (sink transactions).
    pub(crate) fn sealer(&self) -> MemorySealer<Tag> {
        MemorySealer {
            state: Arc::clone(&self.state),
        }
    }

    /// Every record the sink took, in order.
    pub(crate) fn stored(&self) -> Vec<Stored> {
        self.state.lock().unwrap().stored.clone()
    }

    /// What `look` sees of each record taken and not completed, oldest first.
    pub(crate) fn pending_with<R>(&self, look: impl Fn(&Tag) -> R) -> Vec<R> {
        self.state.lock().unwrap().pending.iter().map(|t| look(t)).collect()
    }

    /// Records taken and not completed.
    pub(crate) fn pending(&self) -> usize {
        self.state.lock().unwrap().pending.len()
    }

    /// The checkpoints of the seals asked for, in order.
    pub(crate) fn seals(&self) -> Vec<u64> {
        self.state.lock().unwrap().seals.clone()
    }

    /// The aborts asked for, each with how many records it took back from [`stored`](Self::stored).
    pub(crate) fn aborts(&self) -> Vec<usize> {
        self.state.lock().unwrap().aborts.clone()
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.state.lock().unwrap().abandoned
    }

    /// The keys the caller released, in order, each with how many records were taken by then.
    pub(crate) fn released(&self) -> Vec<(Vec<u8>, usize)> {
        self.state.lock().unwrap().released.clone()
    }

    /// From now on `send` refuses records to `destination` (a local refusal: no completion).
    pub(crate) fn refuse(&self, destination: &str) {
        self.state.lock().unwrap().refuse = Some(destination.to_owned());
    }

    /// Answers `Full` while `capacity` records are pending (`None`: never).
    pub(crate) fn capacity(&self, capacity: Option<usize>) {
        self.state.lock().unwrap().capacity = capacity;
    }

    /// Completes the oldest `n` pending records as delivered.
    pub(crate) fn deliver(&self, n: usize) {
        self.complete(n, |_| Ok(()));
    }

    /// Completes the oldest pending record with a failure of `kind`.
    pub(crate) fn fail_next(&self, kind: FailureKind, cause: &str) {
        self.complete(1, |_| {
            Err(SinkFailure {
                kind,
                destination: String::new(),
                partition: None,
                event_id: None,
                cause: cause.to_owned(),
            })
        });
    }

    fn complete(&self, n: usize, outcome: impl Fn(&Tag) -> Result<(), SinkFailure>) {
        let mut state = self.state.lock().unwrap();
        for _ in 0..n {
            let Some(tag) = state.pending.pop_front() else { return };
            let outcome = outcome(&tag);
            let _ = self.tx.send(Completion { tag, outcome });
        }
    }
}

/// A record for tests, to `destination` keyed `key`.
pub(crate) fn record<'a>(destination: &'a str, key: &'a [u8], value: &'a [u8], id: &'a [u8]) -> SinkRecord<'a> {
    SinkRecord {
        destination: Cow::Borrowed(destination),
        key: Cow::Borrowed(key),
        value: Some(Cow::Borrowed(value)),
        event_id: id,
        timestamp_ms: None,
        headers: Cow::Borrowed(&[]),
        partition: None,
    }
}

#[cfg(test)]
/// A record as `[cloudevents]` binary mode renders it (the Kafka binding's header names), for
/// the tests of each sink's own binding.
pub(crate) fn binary_ce_record<'a>(destination: &'a str, id: &'a [u8]) -> SinkRecord<'a> {
    let h = |n: &'static str, v: &'static [u8]| (Cow::Borrowed(n), Some(Cow::Borrowed(v)));
    SinkRecord {
        destination: Cow::Borrowed(destination),
        key: Cow::Borrowed(b"order-7"),
        value: Some(Cow::Borrowed(b"{\"total\":12}")),
        event_id: id,
        timestamp_ms: Some(1_700_000_000_123),
        headers: Cow::Owned(vec![
            h("ce_specversion", b"1.0"),
            (Cow::Borrowed("ce_id"), Some(Cow::Borrowed(id))),
            h("ce_source", b"/outbox-relay/app/public.outbox"),
            h("ce_type", b"orders.created"),
            h("ce_time", b"2023-11-14T22:13:20.123Z"),
            h("ce_subject", b"order-7"),
            h("content-type", b"application/vnd.acme+json"),
            h("ce_tenant", b"acme"),
            h(
                "ce_traceparent",
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            h("region", b"eu"),
        ]),
        partition: None,
    }
}

/// Hands `handover` to `sink` with `tag`, in a test that expects the sink to take it: waits
/// while the sink answers `Full` (as every caller does: `sink::send_waiting`), at most 10 s, and
/// panics with the refusal's failure otherwise.
#[cfg(test)]
pub(crate) fn send_taken<Tag, S: Sink<Tag> + ?Sized>(sink: &S, handover: Handover<'_, '_>, tag: Tag) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut tag = Box::new(tag);
    loop {
        match sink.send(handover, tag) {
            Err(r) if r.failure.is_full() && std::time::Instant::now() < deadline => {
                tag = r.tag;
                std::thread::sleep(crate::sink::ROOM_RETRY);
            }
            sent => return sent.map_err(|r| r.failure).unwrap(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_completes_once_per_record_taken() {
        let (sink, handle, mut completions) = memory::<u32>();
        sink.send(
            Handover::of(&record("a", b"k", b"1", b"id1")).with_extra(&[("x", b"y")]),
            Box::new(1),
        )
        .unwrap();
        handle.refuse("bad");
        let refused = sink
            .send(Handover::of(&record("bad", b"k", b"2", b"id2")), Box::new(2))
            .unwrap_err();
        assert_eq!(*refused.tag, 2);
        assert!(refused.failure.is_refusal());
        sink.send(Handover::of(&record("a", b"k", b"3", b"id3")), Box::new(3))
            .unwrap();
        let stored = handle.stored();
        assert_eq!(stored.len(), 2);
        assert_eq!(stored[0].header("id"), Some(&b"id1"[..]));
        assert_eq!(stored[0].header("x"), Some(&b"y"[..]));
        handle.deliver(1);
        handle.fail_next(FailureKind::Transient, "down");
        let first = completions.try_recv().unwrap();
        assert_eq!((*first.tag, first.outcome.is_ok()), (1, true));
        let second = completions.try_recv().unwrap();
        assert_eq!(*second.tag, 3);
        assert_eq!(second.outcome.unwrap_err().kind, FailureKind::Transient);
        assert!(completions.try_recv().is_err());
        Box::new(sink).abandon(Duration::ZERO);
        assert!(handle.abandoned());
    }
}
