//! An embedded Kafka for the demo (`demo.rs`): librdkafka's mock cluster, with real TCP listeners on
//! 127.0.0.1, so the relay and the consumer use it exactly like a broker.
//!
//! `MockCluster` is neither `Send` nor `Sync`, so it lives on a thread of its own until the
//! handle is dropped. The demo topic is created up front (4 partitions, replicated 3 times);
//! other topics are auto-created on first produce.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

const BROKERS: i32 = 3;
const PARTITIONS: i32 = 4;

pub(crate) struct EmbeddedKafka {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    bootstrap: String,
}

impl EmbeddedKafka {
    /// Starts the cluster with `topic` already created, so the first events do not wait for
    /// auto-creation.
    pub(crate) fn start(topic: &str) -> Result<EmbeddedKafka, String> {
        let topic = topic.to_owned();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (boot_tx, boot_rx) = mpsc::channel::<Result<String, String>>();
        let thread = std::thread::Builder::new()
            .name("demo-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::<DefaultProducerContext>::new(BROKERS) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = boot_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let created = cluster.create_topic(&topic, PARTITIONS, BROKERS.min(3));
                let _ = boot_tx.send(created.map(|()| cluster.bootstrap_servers()).map_err(|e| e.to_string()));
                // Lives until the handle says stop or is dropped.
                let _ = stop_rx.recv();
                drop(cluster);
            })
            .map_err(|e| format!("starting the embedded Kafka thread: {e}"))?;
        let bootstrap = boot_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "Kafka: the embedded Kafka did not start within 30 s".to_owned())?
            .map_err(|e| format!("Kafka: {e}"))?;
        Ok(EmbeddedKafka {
            stop: Some(stop_tx),
            thread: Some(thread),
            bootstrap,
        })
    }

    pub(crate) fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
