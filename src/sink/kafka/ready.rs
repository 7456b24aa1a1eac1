//! Before a producer's first record to a topic: wait (bounded) until the leader of every
//! partition has made the partition's log.
//!
//! A broker names a new partition's leader in its metadata before that leader has made the
//! partition's log (on a loaded machine, the four logs of an auto-created topic were made one
//! after another over 100 ms). A record produced in that moment is refused and retried by the
//! client — and the first batch of such a partition was seen acknowledged and never stored
//! (docs/reliability.md, section 10, defect 5). ListOffsets is answered only by a leader that
//! has the log, so once every partition answers it, records go to logs that exist.
//!
//! Invariant: the wait is per topic and per producer, once; it ends at [`READY_WAIT`] whatever
//! the cluster says (a topic that does not exist and is not created is then left to the
//! producer, which names it: `producer::explain`), and it never holds the lock the
//! delivery-report callback needs. The waits of one producer together never exceed
//! [`READY_WAIT`] either: the wait blocks the caller's thread (the relay's stream, whose status
//! updates must keep going out), and a cluster that let one topic's wait run out (a broker down,
//! a partition without a leader) would hold every further topic just as long; once the budget is
//! spent, further topics are produced to without a wait, as a topic whose wait ran out is.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use tracing::debug;

use super::topic_config::controller_id;

/// The bound on one topic's wait: an auto-created topic's logs take a few hundred ms.
pub(crate) const READY_WAIT: Duration = Duration::from_secs(2);
/// Between two looks.
const PAUSE: Duration = Duration::from_millis(50);
/// One metadata or ListOffsets request.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1000);

/// The topics this producer has checked, and how long it waited for them in all.
#[derive(Debug, Default)]
pub(crate) struct ReadyTopics(Mutex<Checked>);

#[derive(Debug, Default)]
struct Checked {
    topics: HashSet<String>,
    waited: Duration,
}

/// How a topic's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Checked before by this producer.
    Known,
    /// Every partition's leader answered ListOffsets. `controller`: the metadata names a
    /// controller among its brokers (librdkafka's mock cluster does not), which a topic's
    /// configuration is asked of (`topic_limit.rs`).
    Ready { waited: Duration, controller: bool },
    /// [`READY_WAIT`] passed: the producer goes ahead (and reports what the cluster says).
    GaveUp,
    /// This producer's waits used up [`READY_WAIT`] already: not checked.
    Spent,
}

impl Readiness {
    /// Whether the topic's configuration may be asked now (`topic_limit.rs`): the cluster
    /// answered this wait, and names a controller to ask. A topic seen first while it did not
    /// is not asked anything more, so an unreachable cluster holds the caller once, and a
    /// cluster without a controller (the demo's mock) not at all.
    pub(crate) fn configs_askable(self) -> bool {
        matches!(self, Readiness::Ready { controller: true, .. })
    }
}

impl ReadyTopics {
    /// Returns once `topic` is known to be ready, or after waiting for it (see module docs).
    pub(crate) fn ensure<C: ClientContext>(&self, client: &Client<C>, topic: &str) -> Readiness {
        let left = {
            let mut checked = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if checked.topics.contains(topic) {
                return Readiness::Known;
            }
            let left = READY_WAIT.saturating_sub(checked.waited);
            if left < PAUSE {
                checked.topics.insert(topic.to_owned());
                debug!(
                    topic,
                    "not waiting for the topic's partitions: this producer's waits used up their bound"
                );
                return Readiness::Spent;
            }
            left
        };
        let started = Instant::now();
        let outcome = wait_ready(client, topic, left);
        match outcome {
            Readiness::Ready { waited, .. } if waited > PAUSE => {
                debug!(topic, waited_ms = waited.as_millis() as u64, "topic's partitions ready")
            }
            Readiness::GaveUp => debug!(
                topic,
                "topic's partitions not all ready within the wait; producing anyway"
            ),
            _ => {}
        }
        let mut checked = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        checked.waited += started.elapsed();
        checked.topics.insert(topic.to_owned());
        outcome
    }
}

fn wait_ready<C: ClientContext>(client: &Client<C>, topic: &str, bound: Duration) -> Readiness {
    let started = Instant::now();
    let deadline = started + bound;
    loop {
        if let Some(controller) = all_partitions_answer(client, topic, deadline) {
            return Readiness::Ready {
                waited: started.elapsed(),
                controller,
            };
        }
        if Instant::now() + PAUSE >= deadline {
            return Readiness::GaveUp;
        }
        std::thread::sleep(PAUSE);
    }
}

/// Whether the metadata names the topic with partitions that all have a leader, and each of
/// them answers ListOffsets, before `deadline`; `Some`: they do, and whether the metadata's
/// brokers include the controller it names.
fn all_partitions_answer<C: ClientContext>(client: &Client<C>, topic: &str, deadline: Instant) -> Option<bool> {
    let timeout =
        || Some(deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT)).filter(|t| !t.is_zero());
    let metadata = client.fetch_metadata(Some(topic), timeout()?).ok()?;
    let t = metadata.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() || t.partitions().is_empty() {
        return None;
    }
    let ready = t
        .partitions()
        .iter()
        .all(|p| p.leader() >= 0 && timeout().is_some_and(|left| client.fetch_watermarks(topic, p.id(), left).is_ok()));
    let controller = controller_id(client);
    ready.then(|| metadata.brokers().iter().any(|b| Some(b.id()) == controller))
}

#[cfg(test)]
mod tests {
    //! Against librdkafka's mock cluster.

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};
    use rdkafka::ClientConfig;

    use super::*;

    fn producer(bootstrap: &str) -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .expect("producer")
    }

    #[test]
    fn an_existing_topic_is_ready_at_once_and_checked_once() {
        let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("made", 3, 1).expect("topic");
        let p = producer(&cluster.bootstrap_servers());
        let ready = ReadyTopics::default();
        assert!(matches!(ready.ensure(p.client(), "made"), Readiness::Ready { .. }));
        assert_eq!(ready.ensure(p.client(), "made"), Readiness::Known);
    }

    #[test]
    fn an_unreachable_cluster_ends_the_wait_at_its_bound() {
        // Nothing listens on port 1: no metadata, no ListOffsets.
        let p = producer("127.0.0.1:1");
        let started = Instant::now();
        assert_eq!(
            wait_ready(p.client(), "nowhere", Duration::from_millis(300)),
            Readiness::GaveUp
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_producer_s_waits_together_stay_within_one_bound() {
        // Nothing listens on port 1: the first topic's wait runs out, the next ones are not held.
        let p = producer("127.0.0.1:1");
        let ready = ReadyTopics::default();
        let started = Instant::now();
        assert_eq!(ready.ensure(p.client(), "a"), Readiness::GaveUp);
        assert_eq!(ready.ensure(p.client(), "b"), Readiness::Spent);
        assert_eq!(ready.ensure(p.client(), "c"), Readiness::Spent);
        assert_eq!(ready.ensure(p.client(), "a"), Readiness::Known);
        let held = started.elapsed();
        assert!(held < READY_WAIT + Duration::from_millis(900), "held {held:?}");
    }
}
