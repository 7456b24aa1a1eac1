//! The nemesis: network faults between the relays, PostgreSQL and each broker — silent cuts
//! (no RST), one-way partitions, a stalled broker, latency — under a steady load, judged
//! afterwards over everything the sink holds: 0 lost, first deliveries in per-aggregate commit
//! order, duplicates counted (0 in exactly-once mode), time to resume after each heal.
//!
//! The relays run in network namespaces of their own and reach PostgreSQL and the broker only
//! through the fault harness (`harness/net_fault.rs`, `harness/nemesis.rs`): Kafka is a real
//! broker of each test's own advertising the address the relays reach it at; NATS and Redis
//! are the shared servers behind a proxy of the test's own.
//!
//! Every scenario runs on Kafka, NATS and Redis (`nemesis::<scenario>::<sink>`). Durations: the
//! 2-minute silent broker cut and the 1-minute latency run are shortened in CI (20 s and 15 s);
//! `OUTBOX_RELAY_LONG_TESTS=1` runs them at the lengths, and adds the randomised run
//! (`nemesis::randomised::<sink>`, 10 minutes per sink by default, `OUTBOX_RELAY_NEMESIS_MINUTES`;
//! the seed is printed and `OUTBOX_RELAY_NEMESIS_SEED` replays it). The relay runs with its
//! shipped settings throughout; PostgreSQL with the harness's `wal_sender_timeout = 5s`.

use std::time::{Duration, Instant};

use crate::harness::fault_support::long_tests;
use crate::harness::nemesis::{Delivery, Load, ResumeStats, Rig, SinkKind};
use crate::harness::net_fault::{Dir, Mode};
use crate::harness::RelayProcess;

/// The harness clusters' `wal_sender_timeout`.
const WAL_SENDER_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on every "resumed" wait.
const RESUME_TIMEOUT: Duration = Duration::from_secs(240);
const LATENCY: Mode = Mode::Delay {
    base: Duration::from_millis(200),
    jitter: Duration::from_millis(150),
};

/// One scenario as a test per sink.
macro_rules! on_every_sink {
    ($scenario:ident $(, $arg:expr)*) => {
        mod $scenario {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn kafka() {
                super::$scenario(SinkKind::Kafka $(, $arg)*).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nats() {
                super::$scenario(SinkKind::Nats $(, $arg)*).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis() {
                super::$scenario(SinkKind::Redis $(, $arg)*).await
            }
        }
    };
}

async fn streaming(relay: &RelayProcess) {
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
}

async fn standing_by(relay: &RelayProcess) {
    assert!(
        relay.wait_for_log("standing by", Duration::from_secs(60)).await,
        "{}",
        relay.log_text()
    );
}

/// The holder cut from PostgreSQL (`dir`) while its broker link stays up; a standby on the other
/// side of the cut must take the slot over once PostgreSQL lets it go, and the old holder, healed,
/// must stand by. `Both`: a silent two-way cut for 4 × `wal_sender_timeout`. `FromService`: the
/// holder hears nothing but its status updates still reach PostgreSQL (which then never times the
/// walsender out: the holder must notice the silence itself).
async fn holder_cut_from_postgres(kind: SinkKind, dir: Dir, delivery: Delivery) {
    let Some(mut rig) = Rig::new(kind, delivery).await else {
        return;
    };
    let what = format!("holder cut from PostgreSQL ({dir:?})");
    let (a_ns, a) = rig.relay();
    streaming(&a).await;
    let (_, b) = rig.relay();
    standing_by(&b).await;
    let stood_by_before = a.log_text().matches("standing by").count();
    let load = Load::steady(&rig.db_url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut = Instant::now();
    rig.net.cut(a_ns, rig.pg, dir);
    assert!(
        b.wait_for_log("streaming started", RESUME_TIMEOUT).await,
        "{what}: the standby never took over; standby log:\n{}\nholder log:\n{}",
        b.log_text(),
        a.log_text()
    );
    let takeover = cut.elapsed();
    // The cut lasts at least 4 × wal_sender_timeout, and 5 s past the takeover.
    let hold = (WAL_SENDER_TIMEOUT * 4).max(takeover + Duration::from_secs(5));
    tokio::time::sleep(hold.saturating_sub(cut.elapsed())).await;
    let healed = Instant::now();
    rig.net.heal(a_ns, rig.pg);
    let resumed = rig.resumed(healed, RESUME_TIMEOUT).await;
    let resumed = resumed.unwrap_or_else(|| panic!("{what}: no progress {RESUME_TIMEOUT:?} after the heal"));
    // The old holder, reachable again, finds the slot taken and stands by (it must not exit).
    let a_stands_by = crate::harness::wait_until(Duration::from_secs(60), Duration::from_millis(200), || async {
        a.log_text().matches("standing by").count() > stood_by_before
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = rig.finish(load, &what).await;
    eprintln!(
        "nemesis {what} [{kind:?}, {delivery:?}]: cut {:.1} s, standby streaming {:.1} s after the cut, resumed {:.1} s after the heal, old holder standing by again: {a_stands_by}; {v}",
        hold.as_secs_f64(),
        takeover.as_secs_f64(),
        resumed.as_secs_f64()
    );
    let mut a = a;
    assert!(
        a.try_exit_status().is_none(),
        "{what}: the old holder exited:\n{}",
        a.log_text()
    );
    assert!(a_stands_by, "{what}: the old holder never stood by:\n{}", a.log_text());
    if delivery == Delivery::ExactlyOnce {
        // Before the fix the holder went on "sending" status updates into the cut link, never
        // counted as stale, and published what its dead walsender had sent once the link healed.
        assert!(
            a.log_text().contains("heard nothing from PostgreSQL"),
            "{what}: the cut-off holder did not stop on the silence:\n{}",
            a.log_text()
        );
    }
}

async fn pg_cut_standby_takes_over(kind: SinkKind) {
    holder_cut_from_postgres(kind, Dir::Both, Delivery::AtLeastOnce).await
}
on_every_sink!(pg_cut_standby_takes_over);

async fn split_brain_at_least_once(kind: SinkKind) {
    holder_cut_from_postgres(kind, Dir::FromService, Delivery::AtLeastOnce).await
}
on_every_sink!(split_brain_at_least_once);

async fn split_brain_exactly_once(kind: SinkKind) {
    holder_cut_from_postgres(kind, Dir::FromService, Delivery::ExactlyOnce).await
}
on_every_sink!(split_brain_exactly_once);

/// One relay under the steady load; 3 s in, `fault` (on the relay's namespace `r`) for `hold`,
/// then `heal`; the time until the slot's confirmed position passes the heal, and the checker.
async fn fault_then_heal(
    kind: SinkKind,
    delivery: Delivery,
    what: &str,
    hold: Duration,
    fault: impl FnOnce(&mut Rig, usize),
    heal: impl FnOnce(&mut Rig, usize),
) {
    let Some(mut rig) = Rig::new(kind, delivery).await else {
        return;
    };
    let (r, relay) = rig.relay();
    streaming(&relay).await;
    let load = Load::steady(&rig.db_url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    fault(&mut rig, r);
    tokio::time::sleep(hold).await;
    let healed = Instant::now();
    heal(&mut rig, r);
    let resumed = rig.resumed(healed, RESUME_TIMEOUT).await.unwrap_or_else(|| {
        panic!(
            "{what}: no progress {RESUME_TIMEOUT:?} after the heal:\n{}",
            relay.log_text()
        )
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = rig.finish(load, what).await;
    eprintln!(
        "nemesis {what} [{kind:?}, {delivery:?}]: resumed {:.1} s after the heal; {v}",
        resumed.as_secs_f64()
    );
}

/// The relay's link to the broker cut silently (no RST) both ways for `secs` (2 minutes in the
/// long run, 20 s in CI), PostgreSQL reachable throughout.
async fn broker_cut_silently(kind: SinkKind) {
    let secs = if long_tests() { 120 } else { 20 };
    fault_then_heal(
        kind,
        Delivery::AtLeastOnce,
        &format!("broker cut silently {secs} s"),
        Duration::from_secs(secs),
        |rig, r| rig.net.cut(r, rig.broker, Dir::Both),
        |rig, r| rig.net.heal(r, rig.broker),
    )
    .await
}
on_every_sink!(broker_cut_silently);

/// Exactly-once, the relay's link to the broker cut one way (relay → broker: its requests vanish
/// without an RST) for 12 s, past the 10 s message timeout exactly-once sets: the session ends
/// with produce requests in its connections' send buffers, and the kernel retransmits them
/// after the heal — with its backed-off timer, seconds after the next session could have read
/// back. Kafka's read-back must wait for them, or the replay publishes their events again
/// (docs/reliability.md, section 10, "Defects the nemesis found", 4: 3 duplicates before the
/// fix, seed 10445526625421661482).
async fn broker_cut_one_way_exactly_once(kind: SinkKind) {
    fault_then_heal(
        kind,
        Delivery::ExactlyOnce,
        "relay -> broker cut 12 s, exactly-once",
        Duration::from_secs(12),
        |rig, r| rig.net.cut(r, rig.broker, Dir::ToService),
        |rig, r| rig.net.heal(r, rig.broker),
    )
    .await
}
on_every_sink!(broker_cut_one_way_exactly_once);

/// The broker stalled: its proxy accepts and answers nothing, on open connections too, for `secs`.
async fn broker_stalled(kind: SinkKind, delivery: Delivery, secs: u64) {
    fault_then_heal(
        kind,
        delivery,
        &format!("broker stalled {secs} s"),
        Duration::from_secs(secs),
        |rig, _| rig.net.proxy(rig.broker).set_mode(Mode::Stall),
        |rig, _| rig.net.proxy(rig.broker).set_mode(Mode::Pass),
    )
    .await
}

async fn broker_stalled_at_least_once(kind: SinkKind) {
    broker_stalled(kind, Delivery::AtLeastOnce, 30).await
}
on_every_sink!(broker_stalled_at_least_once);

/// In exactly-once mode the relay shortens `message.timeout.ms` to 10 s: a 30 s stall expires
/// records on the wire.
async fn broker_stalled_exactly_once(kind: SinkKind) {
    broker_stalled(kind, Delivery::ExactlyOnce, 30).await
}

mod broker_stalled_exactly_once {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn kafka() {
        super::broker_stalled_exactly_once(SinkKind::Kafka).await
    }

    /// Kafka only (its `message.timeout.ms`): a stall of 1.5 × the 10 s message timeout. The
    /// records handed over in its first 5 s expire during it and fail the session; those handed
    /// over in the next 5 s are still queued at the heal. They must not reach Kafka ahead of the
    /// expired ones' replay, or the read-back skips them and first deliveries leave commit order
    /// (docs/reliability.md, section 10, "Defects the nemesis found", 2: every aggregate out of
    /// order before the fix).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn kafka_past_the_message_timeout() {
        super::broker_stalled(SinkKind::Kafka, Delivery::ExactlyOnce, 15).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn nats() {
        super::broker_stalled_exactly_once(SinkKind::Nats).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis() {
        super::broker_stalled_exactly_once(SinkKind::Redis).await
    }
}

/// Exactly-once, the broker stalled 15 s (past the 10 s message timeout: the session fails
/// with produce requests that TCP acknowledged long ago waiting in the peer), then serving new
/// connections while it holds those opened before the stall 10 s more: the next session reads
/// back and replays on new connections, and the old session's requests land afterwards — a
/// stalled broker recovering one socket at a time, or a middlebox. Kafka's read-back must fence
/// them with the topic's timestamp bound before it reads, or they publish their events twice
/// (docs/reliability.md, section 10, "Defects the nemesis found", 6). NATS and Redis deduplicate
/// on the broker.
async fn broker_holds_old_requests_exactly_once(kind: SinkKind) {
    let what = "broker stalled 15 s, then holding the old connections 10 s more, exactly-once";
    let Some(mut rig) = Rig::new(kind, Delivery::ExactlyOnce).await else {
        return;
    };
    let (_, relay) = rig.relay();
    streaming(&relay).await;
    let load = Load::steady(&rig.db_url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let proxy = rig.net.proxy(rig.broker);
    let old = proxy.mark();
    proxy.set_mode(Mode::Stall);
    tokio::time::sleep(Duration::from_secs(15)).await;
    proxy.set_mode(Mode::HoldBefore(old));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let healed = Instant::now();
    rig.net.proxy(rig.broker).set_mode(Mode::Pass);
    let resumed = rig.resumed(healed, RESUME_TIMEOUT).await.unwrap_or_else(|| {
        panic!(
            "{what}: no progress {RESUME_TIMEOUT:?} after the heal:\n{}",
            relay.log_text()
        )
    });
    // The held requests land (or are refused) now; the checker reads after them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let v = rig.finish(load, what).await;
    eprintln!(
        "nemesis {what} [{kind:?}]: resumed {:.1} s after the heal (the old connections served); {v}",
        resumed.as_secs_f64()
    );
    if kind == SinkKind::Kafka && std::env::var_os("OUTBOX_RELAY_NEMESIS_NO_TIMESTAMP_BOUND").is_none() {
        assert!(
            relay.log_text().contains("waiting until the topic's timestamp bound"),
            "{what}: the read-back did not fence the old session's requests with the topic's bound:\n{}",
            relay.log_text()
        );
    }
}
on_every_sink!(broker_holds_old_requests_exactly_once);

/// 200 ms ± 150 ms on every link (PostgreSQL and the broker) for a minute (15 s in CI), with a
/// standby beside the holder: events keep flowing during it, nothing is lost or reordered.
async fn latency_every_link(kind: SinkKind) {
    let secs = if long_tests() { 60 } else { 15 };
    let Some(mut rig) = Rig::new(kind, Delivery::AtLeastOnce).await else {
        return;
    };
    let (_, a) = rig.relay();
    streaming(&a).await;
    let (_, b) = rig.relay();
    standing_by(&b).await;
    let load = Load::steady(&rig.db_url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.net.all_proxies(LATENCY);
    let start_lsn = rig.confirmed().await.unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let during = rig.confirmed().await.unwrap_or(0);
    let healed = Instant::now();
    rig.net.all_proxies(Mode::Pass);
    let resumed = rig
        .resumed(healed, RESUME_TIMEOUT)
        .await
        .unwrap_or_else(|| panic!("no progress {RESUME_TIMEOUT:?} after the latency:\n{}", a.log_text()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = rig.finish(load, &format!("latency 200±150 ms {secs} s")).await;
    eprintln!(
        "nemesis latency {secs} s [{kind:?}]: confirmed advanced during it: {}; caught up {:.1} s after; {v}",
        during > start_lsn,
        resumed.as_secs_f64()
    );
    assert!(during > start_lsn, "no event confirmed during {secs} s of latency");
}
on_every_sink!(latency_every_link);

/// splitmix64: the randomised run's schedule from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const FAULT_KINDS: [&str; 6] = [
    "postgres cut (both ways)",
    "postgres cut (postgres → relay)",
    "broker cut (both ways)",
    "broker cut (relay → broker)",
    "broker stalled",
    "latency 200±150 ms on every link",
];

/// The randomised run: two relays under the steady load, random faults from [`FAULT_KINDS`] on
/// a random relay (5–45 s each, 3–10 s apart) for `OUTBOX_RELAY_NEMESIS_MINUTES` (10), then the
/// checker over everything consumed. Long-test switch only.
async fn randomised(kind: SinkKind, delivery: Delivery) {
    if !long_tests() {
        eprintln!("randomised nemesis: OUTBOX_RELAY_LONG_TESTS=1 runs it");
        return;
    }
    let minutes: f64 = std::env::var("OUTBOX_RELAY_NEMESIS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10.0);
    let seed: u64 = std::env::var("OUTBOX_RELAY_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128() as u64);
    eprintln!(
        "randomised nemesis [{kind:?}, {delivery:?}]: seed {seed}, {minutes} min (replay: OUTBOX_RELAY_NEMESIS_SEED={seed})"
    );
    let mut rng = Rng(seed);
    let Some(mut rig) = Rig::new(kind, delivery).await else {
        return;
    };
    let (_, a) = rig.relay();
    streaming(&a).await;
    let (_, b) = rig.relay();
    standing_by(&b).await;
    let relays = [a, b];
    let load = Load::steady(&rig.db_url);
    let mut stats = ResumeStats::default();
    let end = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let mut faults = 0;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(3 + rng.below(8))).await;
        let fault = rng.below(FAULT_KINDS.len() as u64) as usize;
        let r = 1 + rng.below(2) as usize;
        let hold = Duration::from_secs(5 + rng.below(41));
        let label = FAULT_KINDS[fault];
        let on = if fault < 4 {
            format!(" on relay {r}")
        } else {
            String::new()
        };
        eprintln!(
            "randomised nemesis [{kind:?}, {delivery:?}]: fault {faults}: {label}{on} for {:.0} s",
            hold.as_secs_f64()
        );
        match fault {
            0 => rig.net.cut(r, rig.pg, Dir::Both),
            1 => rig.net.cut(r, rig.pg, Dir::FromService),
            2 => rig.net.cut(r, rig.broker, Dir::Both),
            3 => rig.net.cut(r, rig.broker, Dir::ToService),
            4 => rig.net.proxy(rig.broker).set_mode(Mode::Stall),
            _ => rig.net.all_proxies(LATENCY),
        }
        tokio::time::sleep(hold).await;
        let healed = Instant::now();
        rig.net.heal_all();
        let took = rig.resumed(healed, RESUME_TIMEOUT).await.unwrap_or_else(|| {
            panic!(
                "seed {seed}: no progress {RESUME_TIMEOUT:?} after healing {label}; relay logs:\n{}\n-----\n{}",
                relays[0].log_text(),
                relays[1].log_text()
            )
        });
        eprintln!(
            "randomised nemesis [{kind:?}, {delivery:?}]: resumed {:.1} s after the heal",
            took.as_secs_f64()
        );
        stats.record(label, took);
        faults += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = rig.finish(load, &format!("randomised, seed {seed}")).await;
    eprintln!("randomised nemesis [{kind:?}, {delivery:?}] seed {seed}: {minutes} min, {faults} faults; {v}\n{stats}");
    drop(relays);
}

async fn randomised_at_least_once(kind: SinkKind) {
    randomised(kind, Delivery::AtLeastOnce).await
}
on_every_sink!(randomised_at_least_once);

async fn randomised_exactly_once(kind: SinkKind) {
    randomised(kind, Delivery::ExactlyOnce).await
}
on_every_sink!(randomised_exactly_once);

/// Kafka's other exactly-once strategy under the same faults: the next producer's
/// `init_transactions` fences every late write of the ones before it, wherever it was held
/// (a kernel's send buffer, a stalled broker, a middlebox), which a read-back cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_kafka_transactions() {
    randomised(SinkKind::Kafka, Delivery::KafkaTransactions).await
}
