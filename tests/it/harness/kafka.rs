//! In-process Kafka: librdkafka's mock cluster behind a `Send + Sync` handle.
//!
//! What the mock does (librdkafka 2.12, as bundled by rdkafka-sys 4.10):
//! * Real TCP listeners on 127.0.0.1; any rdkafka client can bootstrap from
//!   [`MockKafka::bootstrap_servers`].
//! * Topics are auto-created when a client's Metadata request allows it (producers do by
//!   default; consumers default to `allow.auto.create.topics=false`) and when producing to
//!   an unknown topic. Auto-created topics get **4 partitions** and replication
//!   `min(3, brokers)`.
//! * The CreateTopics admin API is NOT implemented; use [`MockKafka::create_topic`], which
//!   goes through the mock's own control API.
//! * Consumer-group joins wait an initial rebalance delay of 3 s.
//! * [`MockKafka::all_brokers_down`] closes connections and refuses new ones without a
//!   leader change; produce requests then time out/retry on the client side.
//!
//! `rdkafka::mocking::MockCluster` holds a raw pointer and is neither `Send` nor `Sync`,
//! so it lives on a dedicated thread and this handle ships closures to it.

use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

/// The mock cluster type the closures of [`MockKafka::with_cluster`] receive.
pub type RawMock = MockCluster<'static, DefaultProducerContext>;

type Job = Box<dyn FnOnce(&RawMock) + Send>;

pub struct MockKafka {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<JoinHandle<()>>,
    bootstrap: String,
    brokers: i32,
}

impl MockKafka {
    /// Starts a mock cluster with `brokers` brokers (ids 1..=brokers).
    pub fn new(brokers: i32) -> MockKafka {
        let (tx, rx) = mpsc::channel::<Job>();
        let (boot_tx, boot_rx) = mpsc::channel::<Result<String, String>>();
        let thread = std::thread::Builder::new()
            .name("mock-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = boot_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = boot_tx.send(Ok(cluster.bootstrap_servers()));
                // Runs until every sender is gone (MockKafka dropped).
                for job in rx {
                    job(&cluster);
                }
            })
            .expect("spawn mock-kafka thread");
        let bootstrap = boot_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("mock cluster thread did not answer")
            .expect("create mock cluster");
        MockKafka {
            jobs: Mutex::new(Some(tx)),
            thread: Some(thread),
            bootstrap,
            brokers,
        }
    }

    /// `host:port,host:port…` of the mock brokers.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.clone()
    }

    pub fn broker_count(&self) -> i32 {
        self.brokers
    }

    /// Runs `f` on the thread that owns the mock cluster and returns its result; the
    /// escape hatch to the whole `MockCluster` API (error injection, RTT, leaders…).
    pub fn with_cluster<R, F>(&self, f: F) -> R
    where
        R: Send + 'static,
        F: FnOnce(&RawMock) -> R + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        self.jobs
            .lock()
            .unwrap()
            .as_ref()
            .expect("mock cluster stopped")
            .send(job)
            .expect("mock cluster thread gone");
        rx.recv_timeout(Duration::from_secs(30))
            .expect("mock cluster operation did not finish")
    }

    /// Creates `topic` with `partitions` partitions (replication `min(3, brokers)`).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let topic = topic.to_string();
        let rf = self.brokers.min(3);
        self.with_cluster(move |c| c.create_topic(&topic, partitions, rf))
            .expect("mock create_topic");
    }

    /// Drops all client connections and refuses new ones until
    /// [`all_brokers_up`](Self::all_brokers_up).
    pub fn all_brokers_down(&self) {
        self.with_cluster(|c| c.broker_down(-1)).expect("mock broker_down");
    }

    pub fn all_brokers_up(&self) {
        self.with_cluster(|c| c.broker_up(-1)).expect("mock broker_up");
    }

    pub fn broker_down(&self, broker_id: i32) {
        self.with_cluster(move |c| c.broker_down(broker_id))
            .expect("mock broker_down");
    }

    pub fn broker_up(&self, broker_id: i32) {
        self.with_cluster(move |c| c.broker_up(broker_id))
            .expect("mock broker_up");
    }

    /// Adds `delay` of round-trip time to every broker's responses.
    pub fn set_round_trip_time(&self, delay: Duration) {
        self.with_cluster(move |c| c.broker_round_trip_time(-1, delay))
            .expect("mock round trip time");
    }
}

impl Drop for MockKafka {
    fn drop(&mut self) {
        // Closing the channel ends the owner thread, which destroys the cluster.
        self.jobs.lock().unwrap().take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
