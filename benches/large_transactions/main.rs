//! Large transactions: pgoutput protocol 1 (`postgres.streaming = "off"`) against protocol 2
//! with streaming (the default), one run each, in one session on one machine.
//!
//! One PostgreSQL 15 cluster (the cdc_vs_polling benchmark's, `logical_decoding_work_mem` at its
//! default, 64 MB) and one Apache Kafka 4.3 broker (KRaft on loopback, from
//! `scripts/install-kafka.sh`). Per size of `--rows` (default 100,000 and 1,000,000) and per
//! protocol (alternating, protocol 1 first): a fresh database, `outbox-relay setup`, the relay
//! (`run`, the real binary, shipped defaults otherwise), then one `INSERT … SELECT
//! generate_series` transaction of that many outbox rows (8 aggregates, a 100-byte payload). A
//! consumer reads the topic from its start. Reported: the primary's `spill_bytes` and
//! `stream_bytes` for the slot (`pg_stat_replication_slots`), the time from the COMMIT returning
//! to the last event at the consumer, the relay's peak RSS (`VmHWM`), the largest stage the
//! relay kept on disk (sampled every 50 ms), and the CPU the PostgreSQL server used over the run.
//! A 1,000-row run first warms the broker and the server up and is not reported.
//!
//! Then the same per size with `relay.delivery = "exactly-once"` over Kafka transactions
//! (`[kafka] exactly_once = "transactions"`, shipped `relay.streamed_produce = "as-received"`),
//! protocol 1 against protocol 2: the consumer reads `read_committed` (librdkafka's default, as
//! in every run here), so "COMMIT → last event" is when the last record became visible to a
//! `read_committed` consumer — with protocol 2 the lone streamed transaction was produced into
//! an open Kafka transaction while it was written, and its COMMIT only has to commit that.
//! `--no-transactions` leaves these runs out, `--only-transactions` the others.
//! `--paced-writer` writes each transaction in statements of 10,000 rows 100 ms apart instead of
//! one statement (a bulk import that takes a while: the walsender keeps up with it).
//!
//! Two times after the COMMIT: when every record became visible to `read_committed` readers
//! (the partition's last stable offset reached its final value, sampled every 5 ms), and when
//! the last record arrived at a consumer reading from the start — which adds the consumer's own
//! reading of whatever became visible at once.
//!
//! `cargo bench --bench large_transactions` (about 10 minutes on 2 cores);
//! `-- --rows 20000` for a quick look. Not a timed test: nothing here fails on a figure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

#[allow(dead_code)]
#[path = "../cdc_vs_polling/broker.rs"]
mod broker;
#[allow(dead_code)]
#[path = "../cdc_vs_polling/pg.rs"]
mod pg;
#[allow(dead_code)]
#[path = "../cdc_vs_polling/procfs.rs"]
mod procfs;

const RELAY_BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");
const AGGREGATES: i64 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    V1,
    V2,
}

impl Protocol {
    fn streaming(self) -> &'static str {
        match self {
            Protocol::V1 => "off",
            Protocol::V2 => "auto",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Protocol::V1 => "protocol 1 (streaming off)",
            Protocol::V2 => "protocol 2, streaming (default)",
        }
    }
}

/// How the transaction is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// One `INSERT … SELECT generate_series` of every row.
    Single,
    /// `--paced-writer`: statements of [`PACED_ROWS`], [`PACED_PAUSE`] apart, one transaction.
    Paced,
}

const PACED_ROWS: i64 = 10_000;
const PACED_PAUSE: Duration = Duration::from_millis(100);

/// `relay.delivery`: at-least-once (the default) or exactly-once over Kafka transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    AtLeastOnce,
    Transactions,
}

impl Delivery {
    fn label(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at-least-once",
            Delivery::Transactions => "exactly-once, Kafka transactions",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "alo",
            Delivery::Transactions => "txn",
        }
    }

    /// The end of the relay's `[relay]` section and the start of its `[kafka]` section.
    fn config(self, db: &str) -> String {
        match self {
            Delivery::AtLeastOnce => "\n[kafka]".to_owned(),
            Delivery::Transactions => format!(
                "delivery = \"exactly-once\"\n\n[kafka]\nexactly_once = \"transactions\"\n\
                 checkpoint_topic = \"checkpoints_{db}\"\n\"transactional.id\" = \"bench-{db}\"\n"
            ),
        }
    }
}

/// One run's parameters.
#[derive(Debug, Clone, Copy)]
struct Case {
    rows: i64,
    protocol: Protocol,
    delivery: Delivery,
    writer: Writer,
}

struct Figures {
    rows: i64,
    protocol: Protocol,
    delivery: Delivery,
    spill_bytes: i64,
    stream_bytes: i64,
    insert_s: f64,
    commit_to_last_s: f64,
    commit_to_visible_s: f64,
    relay_peak_rss_mib: f64,
    stage_peak_mib: f64,
    postgres_cpu_s: f64,
    relay_cpu_s: f64,
    walsender_cpu_s: f64,
}

fn main() -> Result<()> {
    let mut rows: Vec<i64> = vec![100_000, 1_000_000];
    let mut deliveries = vec![Delivery::AtLeastOnce, Delivery::Transactions];
    let mut writer = Writer::Single;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rows" => {
                rows = args
                    .next()
                    .context("--rows needs a comma-separated list")?
                    .split(',')
                    .map(|n| n.trim().replace('_', "").parse().context("--rows: a number"))
                    .collect::<Result<_>>()?;
            }
            "--no-transactions" => deliveries = vec![Delivery::AtLeastOnce],
            "--only-transactions" => deliveries = vec![Delivery::Transactions],
            "--paced-writer" => writer = Writer::Paced,
            // cargo bench passes --bench.
            "--bench" => {}
            other => bail!("unknown argument {other}; use --rows N[,N…] [--no-transactions | --only-transactions] [--paced-writer]"),
        }
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(run(&rows, &deliveries, writer))
}

async fn run(sizes: &[i64], deliveries: &[Delivery], writer: Writer) -> Result<()> {
    let pg = pg::BenchPg::start()?;
    pg.ready().await?;
    let broker = broker::Broker::start("kafka")?;
    eprintln!("PostgreSQL 15 on port {}, {}", pg.port(), broker.describe());
    let admin = pg::connect(&pg.url("postgres", "postgres")).await?;
    let postmaster = pg.postmaster_pid()?;
    // A warm-up run, not reported: the broker's first topic and the server's first slot cost
    // seconds that would go to whichever run came first.
    let warm_up = Case {
        rows: 1_000,
        protocol: Protocol::V2,
        delivery: Delivery::AtLeastOnce,
        writer: Writer::Single,
    };
    one_run(&pg, &admin, postmaster, &broker, warm_up).await?;
    let mut results = Vec::new();
    for &delivery in deliveries {
        for &rows in sizes {
            for protocol in [Protocol::V1, Protocol::V2] {
                let case = Case {
                    rows,
                    protocol,
                    delivery,
                    writer,
                };
                let figures = one_run(&pg, &admin, postmaster, &broker, case).await?;
                report(&figures);
                results.push(figures);
            }
        }
    }
    println!("{}", table(&results));
    Ok(())
}

fn report(figures: &Figures) {
    {
        {
            eprintln!(
                "{} rows, {}, {}: commit→visible {:.2} s, commit→last {:.1} s, spill {} B, stream {} B, relay peak RSS {:.0} MiB, stage {:.0} MiB, PostgreSQL CPU {:.1} s (walsender {:.1} s), relay CPU {:.1} s",
                figures.rows,
                figures.protocol.label(),
                figures.delivery.label(),
                figures.commit_to_visible_s,
                figures.commit_to_last_s,
                figures.spill_bytes,
                figures.stream_bytes,
                figures.relay_peak_rss_mib,
                figures.stage_peak_mib,
                figures.postgres_cpu_s,
                figures.walsender_cpu_s,
                figures.relay_cpu_s
            );
        }
    }
}

async fn one_run(
    pg: &pg::BenchPg,
    admin: &tokio_postgres::Client,
    postmaster: u32,
    broker: &broker::Broker,
    case: Case,
) -> Result<Figures> {
    let Case {
        rows,
        protocol,
        delivery,
        writer,
    } = case;
    let db = format!("large_{rows}_{}_{}", protocol.streaming(), delivery.tag());
    pg::recreate_database(admin, &db).await?;
    let client = pg::connect(&pg.url("postgres", &db)).await?;
    client
        .batch_execute(
            "CREATE TABLE events_outbox (id bigserial PRIMARY KEY, aggregate_id uuid NOT NULL, type text NOT NULL,
                 payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), dispatched_at timestamptz)",
        )
        .await?;
    let topic = format!("order_{db}");
    broker.create_topic(&topic, 1).await?;
    let dir = tempfile::tempdir()?;
    let stage = dir.path().join("stage");
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "[postgres]\nurl = \"{}\"\nslot = \"{db}\"\npublication = \"{db}\"\nstreaming = \"{}\"\n\n\
             [outbox]\ntable = \"public.events_outbox\"\n\n\
             [route]\ntopic_replacement = \"{topic}\"\n\n\
             [relay]\nstage_dir = \"{}\"\n{}\n\"bootstrap.servers\" = \"{}\"\n",
            pg.url(pg::RELAY_ROLE, &db),
            protocol.streaming(),
            stage.display(),
            delivery.config(&db),
            broker.bootstrap(),
        ),
    )?;
    relay(&config, "setup")?.wait_bounded(Duration::from_secs(60))?;
    let mut child = relay(&config, "run")?;
    let consumer = Counter::start(broker.bootstrap(), &topic)?;
    let visibility = Visibility::start(broker.bootstrap(), &topic)?;
    wait_for_slot_active(&client, &db).await?;
    let sampler = StageSampler::start(stage.clone());
    let cpu_before = procfs::postgres_cpu(postmaster);
    let aggregates: Vec<String> = (0..AGGREGATES)
        .map(|i| format!("00000000-0000-4000-8000-{i:012}"))
        .collect();
    let started = Instant::now();
    // One statement, the fastest writer; or paced: the same rows in statements of PACED_ROWS,
    // PACED_PAUSE apart, in one transaction (a bulk import that takes a while).
    let insert = "INSERT INTO events_outbox (aggregate_id, type, payload)
                  SELECT ($1::text[])[(1 + g % $2::bigint)::int]::uuid, 'order.placed',
                         jsonb_build_object('seq', g, 'pad', repeat('x', 80))
                    FROM generate_series($3::bigint, $4::bigint) g";
    if writer == Writer::Paced {
        client.batch_execute("BEGIN").await?;
        let mut first = 1;
        while first <= rows {
            let last = (first + PACED_ROWS - 1).min(rows);
            client
                .execute(insert, &[&aggregates, &AGGREGATES, &first, &last])
                .await?;
            first = last + 1;
            tokio::time::sleep(PACED_PAUSE).await;
        }
        client.batch_execute("COMMIT").await?;
    } else {
        client
            .execute(insert, &[&aggregates, &AGGREGATES, &1i64, &rows])
            .await?;
    }
    let committed = Instant::now();
    let committed_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    eprintln!(
        "  COMMIT returned at {}.{:03} (Unix time)",
        committed_unix.as_secs(),
        committed_unix.subsec_millis()
    );
    let insert_s = committed.duration_since(started).as_secs_f64();
    let deadline = committed + Duration::from_secs(900);
    while consumer.count() < rows as u64 {
        if Instant::now() > deadline {
            bail!(
                "{rows} rows, {}: only {} of them arrived in 900 s; the relay's log:\n{}",
                protocol.label(),
                consumer.count(),
                std::fs::read_to_string(dir.path().join("relay.log")).unwrap_or_default()
            );
        }
        child.ensure_running()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = consumer.last_at().context("no record")?;
    let commit_to_last_s = last.saturating_duration_since(committed).as_secs_f64();
    let commit_to_visible_s = visibility
        .stop()
        .context("the read_committed end offset was never sampled")?
        .saturating_duration_since(committed)
        .as_secs_f64();
    let postgres_cpu_s = procfs::postgres_cpu(postmaster) - cpu_before;
    let relay_peak_rss_mib = procfs::vm_kib(child.pid(), "VmHWM").unwrap_or(0) as f64 / 1024.0;
    let relay_cpu_s = procfs::cpu_seconds(child.pid()).unwrap_or(0.0);
    let mut threads = procfs::threads(child.pid());
    threads.sort_by(|a, b| b.cpu.total_cmp(&a.cpu));
    eprintln!(
        "  relay CPU {relay_cpu_s:.1} s; busiest threads: {}",
        threads
            .iter()
            .take(4)
            .map(|t| format!("{} {:.1} s", t.name, t.cpu))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let walsender_cpu_s = walsender_cpu(&client, &db).await.unwrap_or(0.0);
    let stage_peak_mib = sampler.stop() as f64 / (1024.0 * 1024.0);
    let (spill_bytes, stream_bytes) = slot_stats(&client, &db).await?;
    child.stop()?;
    consumer.stop();
    drop(client);
    pg::drop_database(admin, &db).await?;
    Ok(Figures {
        rows,
        protocol,
        delivery,
        spill_bytes,
        stream_bytes,
        insert_s,
        commit_to_last_s,
        commit_to_visible_s,
        relay_peak_rss_mib,
        stage_peak_mib,
        postgres_cpu_s,
        relay_cpu_s,
        walsender_cpu_s,
    })
}

/// The CPU the slot's walsender used so far (decoding and sending), by its pid.
async fn walsender_cpu(client: &tokio_postgres::Client, slot: &str) -> Option<f64> {
    let pid: i32 = client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .ok()??
        .get::<_, Option<i32>>(0)?;
    procfs::cpu_seconds(pid as u32)
}

/// The slot's spill and stream counters, once the server's statistics show the transaction
/// (they are flushed asynchronously; at most 10 s).
async fn slot_stats(client: &tokio_postgres::Client, slot: &str) -> Result<(i64, i64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = client
            .query_one(
                "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?;
        let (spill, stream): (i64, i64) = (row.get(0), row.get(1));
        if spill + stream > 0 || Instant::now() > deadline {
            return Ok((spill, stream));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_for_slot_active(client: &tokio_postgres::Client, slot: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let active: Option<bool> = client
            .query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
            .await?
            .map(|r| r.get(0));
        if active == Some(true) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the relay did not start streaming from slot {slot} within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct RelayChild {
    child: Child,
}

fn relay(config: &Path, subcommand: &str) -> Result<RelayChild> {
    let bin = std::env::var_os("OUTBOX_RELAY_BENCH_BIN").unwrap_or_else(|| RELAY_BIN.into());
    let log = std::fs::File::create(config.with_file_name("relay.log"))?;
    let child = Command::new(bin)
        .arg(subcommand)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting outbox-relay")?;
    Ok(RelayChild { child })
}

impl RelayChild {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ensure_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => bail!("the relay exited: {status}"),
        }
    }

    fn wait_bounded(mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("outbox-relay exited with {status}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("outbox-relay did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// Counts the records of one topic from its start, on a thread of its own, and notes when the
/// last one arrived.
struct Counter {
    count: Arc<AtomicU64>,
    last: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counter {
    fn start(bootstrap: &str, topic: &str) -> Result<Counter> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("bench-{topic}"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()?;
        // Assigned, not subscribed: no group to join, so the first records are not held back
        // by a rebalance (the topic has one partition).
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition_offset(topic, 0, Offset::Beginning)?;
        consumer.assign(&partitions)?;
        let (count, last, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(None)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (count, last, stop) = (Arc::clone(&count), Arc::clone(&last), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                        if m.payload().is_some() {
                            count.fetch_add(1, Ordering::Relaxed);
                            *last.lock().unwrap() = Some(Instant::now());
                        }
                    }
                }
            })
        };
        Ok(Counter {
            count,
            last,
            stop,
            thread: Some(thread),
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn last_at(&self) -> Option<Instant> {
        *self.last.lock().unwrap()
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When every record became visible to a `read_committed` consumer: the partition's end offset
/// as a `read_committed` client sees it (ListOffsets at that isolation level answers the last
/// stable offset: no further than the first record of a Kafka transaction still open), sampled
/// every 5 ms; the answer is the first sample that reached the final end offset. Unlike the
/// arrival of the last record at a consumer, this leaves out how long a consumer takes to read
/// what became visible at once.
struct Visibility {
    samples: Arc<Mutex<Vec<(Instant, i64)>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Visibility {
    fn start(bootstrap: &str, topic: &str) -> Result<Visibility> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("bench-visibility-{topic}"))
            .set("isolation.level", "read_committed")
            .create()?;
        let (samples, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (samples, stop, topic) = (Arc::clone(&samples), Arc::clone(&stop), topic.to_owned());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, end)) = consumer.fetch_watermarks(&topic, 0, Duration::from_secs(2)) {
                        samples.lock().unwrap().push((Instant::now(), end));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Ok(Visibility { samples, stop, thread })
    }

    /// The first time the end offset reached its final value (sampled once more first).
    fn stop(self) -> Option<Instant> {
        std::thread::sleep(Duration::from_millis(50));
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let samples = self.samples.lock().unwrap();
        let last = samples.last()?.1;
        samples.iter().find(|(_, end)| *end >= last).map(|(at, _)| *at)
    }
}

/// The largest size the stage directory reached, sampled every 50 ms.
struct StageSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl StageSampler {
    fn start(dir: PathBuf) -> StageSampler {
        let (peak, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (peak, stop) = (Arc::clone(&peak), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(dir_bytes(&dir), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        StageSampler { peak, stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.peak.load(Ordering::Relaxed)
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                dir_bytes(&path)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

fn table(results: &[Figures]) -> String {
    let mut out = String::from(
        "| rows | protocol | delivery | insert (s) | COMMIT → all visible to read_committed (s) | COMMIT → last event at a consumer (s) | primary spill_bytes | primary stream_bytes | relay peak RSS (MiB) | relay stage on disk, peak (MiB) | PostgreSQL CPU (s) | walsender CPU (s) | relay CPU (s) |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for f in results {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.1} | {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
            f.rows,
            f.protocol.label(),
            f.delivery.label(),
            f.insert_s,
            f.commit_to_visible_s,
            f.commit_to_last_s,
            f.spill_bytes,
            f.stream_bytes,
            f.relay_peak_rss_mib,
            f.stage_peak_mib,
            f.postgres_cpu_s,
            f.walsender_cpu_s,
            f.relay_cpu_s
        ));
    }
    out
}
