//! Broker loss on a real three-broker Apache Kafka cluster (issue 31, point 2): RF 3,
//! `min.insync.replicas = 2`, the relay's shipped `acks=all` + idempotence, a topic created up
//! front with three partitions. Every test holds the [`replicated_kafka`] lease (one at a time)
//! and leaves the three brokers running and the topic healthy, on the failure path too where it
//! can: brokers are restarted before anything is asserted, and [`rig`] revives any broker an
//! earlier, failed test left down.
//!
//! * [`leader_killed_under_load_loses_nothing_and_the_relay_keeps_running`]: kill -9 the leader
//!   of a partition being written, under a steady load; 0 lost, first deliveries in order per
//!   aggregate, the relay process never stops. Ten kills in a row behind `OUTBOX_RELAY_LONG_TESTS`.
//! * [`two_of_three_brokers_down_confirms_nothing_until_one_is_back`]: nothing confirmed past the
//!   commit made while two brokers are down, the log says the relay waits for Kafka, and it
//!   resumes when one broker is back. Behind `OUTBOX_RELAY_LONG_TESTS`: down for 330 s, past the
//!   shipped `message.timeout.ms` (300 s), so the session ends and replays meanwhile.
//! * [`whole_cluster_killed_and_restarted_under_load_loses_nothing`]: all three brokers killed
//!   and restarted (the controller stays) under load.
//!
//! They print their figures (`FIGURES …` lines) for docs/reliability.md ("Broker loss on a real
//! Kafka cluster"). Run them with
//! `cargo test --locked --features failpoints --test it kafka_replication:: -- --nocapture`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::Client;

use crate::harness::fault_support::{confirmed_reaches, long_tests, TxnProbe};
use crate::harness::kafka_real::ReplicatedLease;
use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// Partitions of the test topic (RF 3).
const PARTITIONS: i32 = 3;
/// How long the cluster may take to have every partition's full ISR back.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on the wait for the relay to catch up after the brokers are back.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);
/// What the relay logs (`src/relay/outage.rs`) once events have waited for an acknowledgement
/// for 5 s, and once acknowledgements arrive again.
const OUTAGE_NOTICE: &str = "Kafka has acknowledged nothing for";
const OUTAGE_OVER: &str = "Kafka acknowledges again after";

/// A test's share of the replicated cluster: the lease, the topic `order` (3 partitions, RF 3)
/// and a prepared database whose events all route to it.
struct Rig {
    lease: ReplicatedLease,
    client: Client,
    config: RelayConfig,
    url: String,
    topic: String,
}

impl Rig {
    fn cluster(&self) -> &'static KafkaCluster {
        self.lease.cluster
    }

    async fn confirmed(&self) -> u64 {
        confirmed_flush_lsn(&self.client, &self.config.slot).await.unwrap_or(0)
    }

    /// Restarts every broker that is down (the failure path of a test, or an earlier test's).
    async fn revive_all(&self) {
        for id in self.cluster().broker_ids() {
            if !self.cluster().running(id) {
                self.cluster().restart(id).await;
            }
        }
    }
}

async fn rig() -> Option<Rig> {
    let lease = replicated_kafka().await?;
    for id in lease.cluster.broker_ids() {
        if !lease.cluster.running(id) {
            eprintln!("kafka_replication: broker {id} was left down by an earlier test; restarting it");
            lease.cluster.restart(id).await;
        }
    }
    let topic = lease.topic("order");
    lease.cluster.create_topic_with(&topic, PARTITIONS, &[]).await;
    assert!(
        lease.cluster.wait_healthy(&topic, HEALTHY_TIMEOUT).await,
        "topic {topic} never had its full ISR"
    );
    let (db, client, config) = prepared_ns(OutboxSchema::A, &lease).await;
    // Every event to `<ns>.order`: per-aggregate order is observable in one topic.
    let config = config.route(PREFIX_REGEX, "${routedByValue}");
    let url = shared_cluster().await.url(&db);
    Some(Rig {
        lease,
        client,
        config,
        url,
        topic,
    })
}

/// Reads the topic from a thread of its own (a consumer assigned every partition from the
/// beginning; librdkafka follows leadership changes) and remembers when each record arrived:
/// Kafka hands out only records every in-sync replica has, i.e. what `acks=all` acknowledged.
struct Arrivals {
    /// (arrival, partition), in arrival order.
    arrivals: Arc<Mutex<Vec<(Instant, i32)>>>,
    stop: Arc<AtomicBool>,
}

impl Arrivals {
    fn start(bootstrap: &str, topic: &str) -> Arrivals {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", unique_name("watch"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "50")
            .set("log_level", "0")
            .create()
            .expect("watch consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(topic, p, Offset::Beginning).expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let w = Arrivals {
            arrivals: Arc::default(),
            stop: Arc::default(),
        };
        let (arrivals, stop) = (Arc::clone(&w.arrivals), Arc::clone(&w.stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    arrivals.lock().unwrap().push((Instant::now(), m.partition()));
                }
            }
        });
        w
    }

    /// Records read so far.
    fn total(&self) -> i64 {
        self.arrivals.lock().unwrap().len() as i64
    }

    /// Waits (bounded) until `at_least` records were read.
    async fn wait_total(&self, at_least: i64, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(100), || async {
            self.total() >= at_least
        })
        .await
    }

    /// The longest pause in arrivals after `t` (counting from `t`) and when, after `t`, arrivals
    /// resumed after it: records acknowledged before a kill but read just after it do not count
    /// as "delivered after the kill", as a first arrival would. `None` without an arrival after `t`.
    fn stall_after(&self, t: Instant) -> Option<(Duration, Duration)> {
        let arrivals = self.arrivals.lock().unwrap();
        let mut prev = t;
        let mut best: Option<(Duration, Duration)> = None;
        for (at, _) in arrivals.iter().filter(|(at, _)| *at > t) {
            let gap = at.duration_since(prev);
            if best.is_none_or(|(g, _)| gap > g) {
                best = Some((gap, at.duration_since(t)));
            }
            prev = *at;
        }
        best
    }

    /// How long after `t` the first record arrived.
    fn first_after(&self, t: Instant) -> Option<Duration> {
        self.arrivals
            .lock()
            .unwrap()
            .iter()
            .find(|(at, _)| *at > t)
            .map(|(at, _)| at.duration_since(t))
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The partitions of `topic` that `broker` leads now.
async fn led_by(cluster: &KafkaCluster, topic: &str, broker: i32) -> Vec<i32> {
    let mut led = Vec::new();
    for p in 0..PARTITIONS {
        if cluster.leader_of(topic, p).await == Some(broker) {
            led.push(p);
        }
    }
    led
}

/// Reads everything back and checks it: every committed event (0 lost — asserted), first
/// deliveries in commit order per aggregate; returns (events, duplicates).
async fn read_back(rig: &Rig, committed: &Committed) -> (usize, usize) {
    let all: Vec<ExpectedEvent> = committed.all().cloned().collect();
    let records = rig.lease.collect(&["order"], all.len(), Duration::from_secs(180)).await;
    let got: HashSet<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").expect("id header")).into_owned())
        .collect();
    let lost = all.iter().filter(|e| !got.contains(&e.id)).count();
    eprintln!(
        "read back: {} events committed, {} records, {lost} lost",
        all.len(),
        records.len()
    );
    let dups = check_delivered(&all, &records, |_| "order".to_owned());
    check_order(committed, &records);
    (all.len(), dups)
}

/// The end of every scenario: everything read back and checked ([`read_back`]), the relay
/// still running ([`assert_relay_kept_running`]), its outage lines printed; returns (events,
/// duplicates, the relay's log).
async fn verdict(rig: &Rig, committed: &Committed, relay: &mut RelayProcess) -> (usize, usize, String) {
    let (events, dups) = read_back(rig, committed).await;
    assert_relay_kept_running(relay);
    let log = relay.log_text();
    print_outage_lines(&log);
    (events, dups, log)
}

/// The relay process is still running and its log shows neither an exit nor a fatal error.
fn assert_relay_kept_running(relay: &mut RelayProcess) {
    let log = relay.log_text();
    assert!(
        relay.try_exit_status().is_none(),
        "the relay exited during the broker loss; log:\n{log}"
    );
    // A session that ends ("stream stopped") and replays is the relay at work; these are not.
    for needle in ["fatal", "relay stopped"] {
        assert!(!log.contains(needle), "the relay logged {needle:?}; log:\n{log}");
    }
}

/// The relay's lines about the outage (its own and librdkafka's), for the record.
fn print_outage_lines(log: &str) {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("WARN") || l.contains("ERROR") || l.contains("acknowledges again") || l.contains("restarting")
        })
        .collect();
    eprintln!("relay log, {} WARN/ERROR/recovery lines (first 25):", lines.len());
    for l in lines.iter().take(25) {
        eprintln!("  {}", &l[..l.len().min(600)]);
    }
}

/// Sessions the relay ended and started again (replays) while the broker was away.
fn session_restarts(log: &str) -> usize {
    log.matches("streaming started").count().saturating_sub(1)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

async fn leader_kills(rounds: usize, per_round: usize) {
    let Some(rig) = rig().await else { return };
    let cluster = rig.cluster();
    let started = Instant::now();
    let mut relay = RelayProcess::run_streaming(&rig.config).await;
    let marks = Arrivals::start(&cluster.bootstrap_servers(), &rig.topic);

    // A steady load: 4 writers, 40 aggregates, a 10 ms pause after each commit (a few hundred
    // events per second here), long enough to span every kill and recovery.
    let mut w = Workload::new(OutboxSchema::A, per_round * rounds, 40, 4);
    w.pause = Duration::from_millis(10);
    let url = rig.url.clone();
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    let mut failures = Vec::new();
    for round in 0..rounds {
        // Load flowing through Kafka before each kill.
        let flowing = marks.wait_total(marks.total() + 300, Duration::from_secs(60)).await;
        if !flowing {
            failures.push(format!("round {round}: no load reached Kafka within 60 s"));
            break;
        }
        let partition = round as i32 % PARTITIONS;
        let Some(victim) = cluster.leader_of(&rig.topic, partition).await else {
            failures.push(format!("round {round}: partition {partition} has no leader"));
            break;
        };
        let led = led_by(cluster, &rig.topic, victim).await;
        // The writers' pace around the kill (WAL written per second), for the record: a pause
        // in deliveries means little if nothing was being written.
        let wal_a = current_wal_lsn(&rig.client).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let kill_lsn = current_wal_lsn(&rig.client).await;
        let before = marks.total();
        let t_kill = Instant::now();
        cluster.kill(victim);
        // Confirmed past everything committed before the kill: every event up to then is in
        // Kafka, including those of the partitions the dead broker led.
        let ((caught_up, confirmed_after), wal_b) = tokio::join!(
            async {
                let ok = confirmed_reaches(&rig.client, &rig.config.slot, kill_lsn, RECOVERY_TIMEOUT).await;
                (ok, t_kill.elapsed())
            },
            async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                current_wal_lsn(&rig.client).await
            }
        );
        let to_confirmed = caught_up.then_some(confirmed_after);
        let new_leader = cluster.leader_of(&rig.topic, partition).await;
        cluster.restart(victim).await;
        let healthy = cluster.wait_healthy(&rig.topic, HEALTHY_TIMEOUT).await;
        // Arrivals are stamped as the watcher reads them: asked only now, nothing is missed.
        let stall = marks.stall_after(t_kill);
        eprintln!(
            "FIGURES leader kill {}/{rounds}: broker {victim} (leader of partitions {led:?}) killed with {before} \
             records read; partition {partition} led by {new_leader:?} afterwards; longest pause in deliveries {}, \
             deliveries resumed {} after the kill; kill -> confirmed_flush_lsn past the kill point {}; full ISR again \
             {:.1} s after the kill; WAL written {} B/s in the second before the kill, {} B/s in the 3 s after it",
            round + 1,
            secs(stall.map(|s| s.0)),
            secs(stall.map(|s| s.1)),
            secs(to_confirmed),
            t_kill.elapsed().as_secs_f64(),
            kill_lsn.saturating_sub(wal_a),
            wal_b.saturating_sub(kill_lsn) / 3
        );
        if !caught_up {
            failures.push(format!(
                "round {round}: confirmed_flush_lsn never passed {} (the WAL position at the kill)",
                format_lsn(kill_lsn)
            ));
        }
        if !healthy {
            failures.push(format!("round {round}: the topic's ISR never was full again"));
        }
        if !failures.is_empty() {
            break;
        }
    }
    rig.revive_all().await;
    assert!(failures.is_empty(), "{failures:?}; relay log:\n{}", relay.log_text());

    let committed = load.await.expect("workload");
    let (events, dups, log) = verdict(&rig, &committed, &mut relay).await;
    eprintln!(
        "FIGURES leader kills: {rounds} kill(s), {events} events, 0 lost, {dups} duplicates, {} session restart(s), \
         outage notices {}, {:.0} s in all",
        session_restarts(&log),
        log.matches(OUTAGE_NOTICE).count(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_under_load_loses_nothing_and_the_relay_keeps_running() {
    leader_kills(1, 6_000).await;
}

/// The long variant: ten leader kills in a row, each under load (`OUTBOX_RELAY_LONG_TESTS=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_ten_times_under_load_long() {
    if !long_tests() {
        eprintln!("skipped: set OUTBOX_RELAY_LONG_TESTS=1");
        return;
    }
    leader_kills(10, 6_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_of_three_brokers_down_confirms_nothing_until_one_is_back() {
    two_down(Duration::from_secs(30)).await;
}

/// The long variant: two brokers down for 330 s, longer than librdkafka's default
/// `message.timeout.ms` (300 s, which the relay ships): the waiting records expire, the relay
/// ends the session and replays from the slot, still confirming nothing, until a broker is
/// back (`OUTBOX_RELAY_LONG_TESTS=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_of_three_brokers_down_past_the_message_timeout_long() {
    if !long_tests() {
        eprintln!("skipped: set OUTBOX_RELAY_LONG_TESTS=1");
        return;
    }
    two_down(Duration::from_secs(330)).await;
}

async fn two_down(window: Duration) {
    let Some(mut rig) = rig().await else { return };
    let cluster = rig.cluster();
    let mut relay = RelayProcess::run_streaming(&rig.config).await;
    let marks = Arrivals::start(&cluster.bootstrap_servers(), &rig.topic);

    // Warm up: the producer knows the cluster, and everything so far is confirmed.
    let mut committed = run_workload(&rig.url, &Workload::new(OutboxSchema::A, 60, 12, 3)).await;
    assert!(
        marks.wait_total(60, Duration::from_secs(60)).await,
        "warm-up not delivered"
    );

    // Keep the broker that leads partition 0 (it stays the leader; the others move to it).
    let survivor = cluster
        .leader_of(&rig.topic, 0)
        .await
        .expect("partition 0 has a leader");
    let victims: Vec<i32> = cluster.broker_ids().into_iter().filter(|id| *id != survivor).collect();
    let t_kill = Instant::now();
    for id in &victims {
        cluster.kill(*id);
    }
    let acknowledged_at_kill = marks.total();

    // One transaction committed while two are down, over a dozen aggregates (all partitions).
    let mut tx_events = Vec::new();
    let tx = rig.client.transaction().await.expect("begin");
    let probe = TxnProbe::start(&tx).await;
    for _ in 0..12 {
        let agg = new_uuid();
        tx_events.push(insert_event(&tx, OutboxSchema::A, &agg, 0).await);
    }
    tx.commit().await.expect("commit");
    let point = probe.finish(&rig.client).await;
    for ev in &tx_events {
        committed.by_aggregate.insert(ev.aggregate_id.clone(), vec![ev.clone()]);
    }
    // And a load that keeps coming meanwhile.
    let mut w = Workload::new(OutboxSchema::A, 600, 24, 3);
    w.pause = Duration::from_millis(20);
    let url = rig.url.clone();
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    // Two brokers stay down for `window`: the confirmed position must stay before the commit,
    // and the log must say the relay waits for Kafka.
    let mut max_confirmed = 0;
    let mut polls = 0;
    while t_kill.elapsed() < window {
        max_confirmed = max_confirmed.max(rig.confirmed().await);
        polls += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let acknowledged_in_outage = marks.total() - acknowledged_at_kill;
    let noticed = relay.log_text().contains(OUTAGE_NOTICE);

    // One broker back: the ISR can reach min.insync.replicas = 2 again.
    let t_back = Instant::now();
    cluster.restart(victims[0]).await;
    let caught_up = confirmed_reaches(&rig.client, &rig.config.slot, point.end_lsn, RECOVERY_TIMEOUT).await;
    let to_confirmed = caught_up.then(|| t_back.elapsed());
    cluster.restart(victims[1]).await;
    let healthy = cluster.wait_healthy(&rig.topic, HEALTHY_TIMEOUT).await;
    let to_delivery = marks.first_after(t_back);

    assert!(polls > 10, "too few polls of confirmed_flush_lsn");
    assert!(
        max_confirmed < point.end_lsn,
        "confirmed_flush_lsn {} passed the end {} of a commit made while two of three brokers were down",
        format_lsn(max_confirmed),
        format_lsn(point.end_lsn)
    );
    assert_eq!(
        acknowledged_in_outage, 0,
        "Kafka acknowledged records with one in-sync replica (min.insync.replicas = 2)"
    );
    assert!(
        noticed,
        "the relay did not say it waits for Kafka ({OUTAGE_NOTICE:?}); log:\n{}",
        relay.log_text()
    );
    assert!(
        caught_up,
        "confirmed_flush_lsn never reached {} after a broker came back; log:\n{}",
        format_lsn(point.end_lsn),
        relay.log_text()
    );
    assert!(healthy, "the topic's ISR never was full again");
    assert!(
        relay.wait_for_log(OUTAGE_OVER, Duration::from_secs(10)).await,
        "no {OUTAGE_OVER:?} line; log:\n{}",
        relay.log_text()
    );

    let load = load.await.expect("workload");
    committed.by_aggregate.extend(load.by_aggregate);
    let (events, dups, log) = verdict(&rig, &committed, &mut relay).await;
    let notice = log
        .lines()
        .find(|l| l.contains(OUTAGE_NOTICE))
        .unwrap_or_default()
        .to_owned();
    eprintln!("relay's outage line: {notice}");
    eprintln!(
        "FIGURES two of three down: brokers {victims:?} down {:.1} s; {acknowledged_in_outage} records read \
         meanwhile; confirmed_flush_lsn stayed at or below {} < commit end {}; one broker back -> first new record \
         {}, -> confirmed past the commit {}; {events} events, 0 lost, {dups} duplicates, {} session restart(s)",
        t_back.duration_since(t_kill).as_secs_f64(),
        format_lsn(max_confirmed),
        format_lsn(point.end_lsn),
        secs(to_delivery),
        secs(to_confirmed),
        session_restarts(&log)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_cluster_killed_and_restarted_under_load_loses_nothing() {
    let Some(rig) = rig().await else { return };
    let cluster = rig.cluster();
    let mut relay = RelayProcess::run_streaming(&rig.config).await;
    let marks = Arrivals::start(&cluster.bootstrap_servers(), &rig.topic);

    let mut w = Workload::new(OutboxSchema::A, 5_000, 40, 4);
    w.pause = Duration::from_millis(10);
    let url = rig.url.clone();
    let load = tokio::spawn(async move { run_workload(&url, &w).await });

    let flowing = marks.wait_total(300, Duration::from_secs(60)).await;
    let kill_lsn = current_wal_lsn(&rig.client).await;
    let before = marks.total();
    let t_kill = Instant::now();
    for id in cluster.broker_ids() {
        cluster.kill(id);
    }
    // Down for 10 s under load (longer than the controller's 9 s broker session timeout, so
    // it fences all three), then all three back.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let t_back = Instant::now();
    for id in cluster.broker_ids() {
        cluster.restart(id).await;
    }
    let caught_up = confirmed_reaches(&rig.client, &rig.config.slot, kill_lsn, RECOVERY_TIMEOUT).await;
    let to_confirmed = caught_up.then(|| t_back.elapsed());
    let healthy = cluster.wait_healthy(&rig.topic, HEALTHY_TIMEOUT).await;
    let to_delivery = marks.first_after(t_back);
    assert!(flowing, "no load reached Kafka before the kill");
    assert!(
        caught_up,
        "confirmed_flush_lsn never passed {} (the WAL position at the kill); log:\n{}",
        format_lsn(kill_lsn),
        relay.log_text()
    );
    assert!(healthy, "the topic's ISR never was full again");

    let committed = load.await.expect("workload");
    let (events, dups, log) = verdict(&rig, &committed, &mut relay).await;
    eprintln!(
        "FIGURES whole cluster: 3 brokers killed with {before} records read, down {:.1} s; restart -> first \
         new record {}, -> confirmed past the kill point {}; {events} events, 0 lost, {dups} duplicates, {} session \
         restart(s)",
        t_back.duration_since(t_kill).as_secs_f64(),
        secs(to_delivery),
        secs(to_confirmed),
        session_restarts(&log)
    );
}
