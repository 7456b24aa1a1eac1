//! Adapter tests against a real Redis: the shared server on 127.0.0.1:6379 (CI starts it), and
//! private `redis-server` processes for the tests that stop a server. Every stream key is
//! unique to its test; every wait is bounded.

use std::borrow::Cow;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::publisher::RedisSink;
use super::*;
use crate::config::Settings;
use crate::sink::memory::record;
use crate::sink::{Completion, Completions, FailureKind, Handover, Sink};

const SHARED: &str = "redis://127.0.0.1:6379";
/// Appended after `[redis]`: the relay in exactly-once mode (the sink loads its dedup script).
const EXACTLY_ONCE: &str = "[relay]\ndelivery = \"exactly-once\"\n";

fn settings_for(url: &str, extra: &str) -> Settings {
    let text = format!(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:5432/app\"\n[sink]\nkind = \"redis\"\n[redis]\nurl = \"{url}\"\n{extra}"
    );
    Settings::from_toml_str(&text, Path::new("test.toml"), std::iter::empty()).expect("valid settings")
}

/// The `[redis]` section of settings made by [`settings_for`].
fn redis_of(settings: &Settings) -> &super::config::RedisSettings {
    settings.sink.section().expect("a [redis] section")
}

/// The sink as the relay creates it for `settings`.
async fn create_sink(
    settings: &Settings,
) -> Result<(RedisSink<u32>, crate::sink::Completions<u32>), crate::sink::SinkError> {
    let dedup = match settings.relay.delivery {
        crate::config::relay::Delivery::AtLeastOnce => super::publisher::Dedup::None,
        crate::config::relay::Delivery::ExactlyOnce => super::publisher::Dedup::Script,
    };
    RedisSink::create(redis_of(settings), dedup).await
}

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "outbox-relay-test:{prefix}:{}:{}:{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

async fn conn(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis is up")
}

async fn next(completions: &mut Completions<u32>) -> Completion<u32> {
    tokio::time::timeout(Duration::from_secs(10), completions.recv())
        .await
        .expect("a completion within 10 s")
        .expect("the channel is open")
}

/// Entries of `stream`: each as its (field, value) pairs.
async fn xrange(c: &mut MultiplexedConnection, stream: &str) -> Vec<Vec<(String, Vec<u8>)>> {
    let v: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(c)
        .await
        .unwrap();
    let Value::Array(entries) = v else { panic!("{v:?}") };
    entries
        .into_iter()
        .map(|e| {
            let Value::Array(mut parts) = e else { panic!() };
            let Value::Array(fields) = parts.remove(1) else {
                panic!()
            };
            fields
                .chunks(2)
                .map(|p| {
                    let name: String = redis::from_redis_value_ref(&p[0]).unwrap();
                    let value: Vec<u8> = redis::from_redis_value_ref(&p[1]).unwrap();
                    (name, value)
                })
                .collect()
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    entry.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
}

async fn cleanup(c: &mut MultiplexedConnection, keys: &[&str]) {
    for k in keys {
        let _: () = redis::cmd("DEL")
            .arg(*k)
            .arg(format!("{k}{DEDUP_SUFFIX}"))
            .query_async(c)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn delivers_every_field_in_order_binary_safe() {
    let settings = settings_for(SHARED, "");
    let (sink, mut completions) = create_sink(&settings).await.unwrap();
    let stream = unique("fields");
    let binary: Vec<u8> = (0..=255u8).chain([0, 0, b'\r', b'\n']).collect();
    let headers: Vec<crate::sink::RecordHeader<'_>> = vec![
        (Cow::Borrowed("event-type"), Some(Cow::Borrowed(&b"OrderPlaced"[..]))),
        (Cow::Borrowed("nothing"), None),
    ];
    let mut first = record(&stream, b"agg-1", &binary, b"id-0");
    first.headers = Cow::Borrowed(&headers);
    first.timestamp_ms = Some(1_700_000_000_123);
    sink.send(
        Handover::of(&first).with_extra(&[("outbox-relay-index", b"7")]),
        Box::new(0),
    )
    .unwrap();
    let values: Vec<String> = (1..500).map(|i| format!("v{i}")).collect();
    let ids: Vec<String> = (1..500).map(|i| format!("id-{i}")).collect();
    for i in 1..500usize {
        let key: &[u8] = if i % 2 == 0 { b"agg-1" } else { b"agg-2" };
        sink.send(
            Handover::of(&record(&stream, key, values[i - 1].as_bytes(), ids[i - 1].as_bytes())),
            Box::new(i as u32),
        )
        .unwrap();
    }
    for i in 0..500u32 {
        let c = next(&mut completions).await;
        assert_eq!(*c.tag, i, "completions arrive in the order records were handed over");
        c.outcome.unwrap();
    }
    let mut c = conn(SHARED).await;
    let entries = xrange(&mut c, &stream).await;
    assert_eq!(entries.len(), 500);
    let names: Vec<&str> = entries[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "id",
            "key",
            "event-type",
            "nothing",
            "outbox-relay-index",
            "timestamp",
            "payload"
        ]
    );
    assert_eq!(
        field(&entries[0], "payload"),
        Some(binary.as_slice()),
        "bytes unchanged"
    );
    assert_eq!(field(&entries[0], "key"), Some(&b"agg-1"[..]));
    assert_eq!(field(&entries[0], "nothing"), Some(&b""[..]));
    assert_eq!(field(&entries[0], "timestamp"), Some(&b"1700000000123"[..]));
    for (i, e) in entries.iter().enumerate().skip(1) {
        assert_eq!(
            field(e, "id"),
            Some(format!("id-{i}").as_bytes()),
            "stream order = send order"
        );
        assert_eq!(field(e, "payload"), Some(format!("v{i}").as_bytes()));
        assert!(field(e, "timestamp").is_none());
    }
    Box::new(sink).abandon(Duration::from_secs(1));
    cleanup(&mut c, &[&stream]).await;
}

#[tokio::test]
async fn a_key_of_another_type_refuses_its_record_only() {
    let settings = settings_for(SHARED, EXACTLY_ONCE);
    let (sink, mut completions) = create_sink(&settings).await.unwrap();
    let mut c = conn(SHARED).await;
    let (bad, good) = (unique("wrongtype"), unique("good"));
    let _: () = redis::cmd("SET")
        .arg(&bad)
        .arg("a string")
        .query_async(&mut c)
        .await
        .unwrap();
    // Other keys than the refused records' (those of the refused key are fenced: below).
    sink.send(Handover::of(&record(&good, b"g", b"1", b"a")), Box::new(1))
        .unwrap();
    sink.send(Handover::of(&record(&bad, b"k", b"2", b"b")), Box::new(2))
        .unwrap();
    sink.send(Handover::of(&record(&good, b"h", b"3", b"c")), Box::new(3))
        .unwrap();
    // Exactly-once goes through the script: the refusal must keep its kind.
    sink.send(
        Handover::of(&record(&bad, b"k", b"4", b"d")).with_dedup_key(Some("src/0/1")),
        Box::new(4),
    )
    .unwrap();
    let outcomes: Vec<_> = [
        next(&mut completions).await,
        next(&mut completions).await,
        next(&mut completions).await,
        next(&mut completions).await,
    ]
    .into_iter()
    .map(|c| (*c.tag, c.outcome.map_err(|f| (f.kind, f.cause, f.destination))))
    .collect();
    assert!(outcomes[0].1.is_ok() && outcomes[2].1.is_ok(), "{outcomes:?}");
    for i in [1, 3] {
        let (kind, cause, destination) = outcomes[i].1.clone().unwrap_err();
        assert_eq!(kind, FailureKind::Refused, "{cause}");
        assert!(cause.contains("WRONGTYPE"), "{cause}");
        assert_eq!(destination, bad);
    }
    assert_eq!(xrange(&mut c, &good).await.len(), 2);
    // The refused key is fenced: a later record of it is not written before the caller decided
    // about the refused one, even to a stream that would take it; released, it is written.
    sink.send(Handover::of(&record(&good, b"k", b"5", b"e")), Box::new(5))
        .unwrap();
    let stopped = next(&mut completions).await.outcome.unwrap_err();
    assert_eq!(stopped.kind, FailureKind::Transient, "{stopped}");
    assert!(stopped.cause.contains("refused"), "{stopped}");
    sink.release(b"k");
    sink.send(Handover::of(&record(&good, b"k", b"6", b"f")), Box::new(6))
        .unwrap();
    assert!(next(&mut completions).await.outcome.is_ok());
    assert_eq!(xrange(&mut c, &good).await.len(), 3, "5 was never written");
    Box::new(sink).abandon(Duration::from_secs(1));
    cleanup(&mut c, &[&good, &bad]).await;
}

#[tokio::test]
async fn exactly_once_drops_replays_atomically_within_the_window() {
    let settings = settings_for(SHARED, &format!("dedup_max_keys = 3\n{EXACTLY_ONCE}"));
    let stream = unique("dedup");
    let dedup_set = format!("{stream}{DEDUP_SUFFIX}");
    let mut c = conn(SHARED).await;
    let keys: Vec<String> = (0..5).map(|i| format!("sys/slot/0/16B3D40/{i}")).collect();
    let send_all = |keys: Vec<String>| {
        let settings = &settings;
        let stream = &stream;
        async move {
            // A new instance each time, as after a crash.
            let (sink, mut completions) = create_sink(settings).await.unwrap();
            for (i, key) in keys.iter().enumerate() {
                sink.send(
                    Handover::of(&record(stream, b"k", b"v", b"id")).with_dedup_key(Some(key)),
                    Box::new(i as u32),
                )
                .unwrap();
            }
            for _ in 0..keys.len() {
                next(&mut completions)
                    .await
                    .outcome
                    .expect("a duplicate counts as delivered");
            }
            Box::new(sink).abandon(Duration::from_secs(1));
        }
    };
    send_all(keys.clone()).await;
    assert_eq!(xrange(&mut c, &stream).await.len(), 5);
    let kept: Vec<String> = redis::cmd("ZRANGE")
        .arg(&dedup_set)
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kept, keys[2..], "dedup_max_keys keeps the newest keys");
    // The replay of what the set holds is dropped.
    send_all(keys[2..].to_vec()).await;
    assert_eq!(xrange(&mut c, &stream).await.len(), 5);
    // A second source writing the same stream is never taken for a duplicate.
    send_all(vec!["other/slot/0/16B3D40/4".into()]).await;
    assert_eq!(xrange(&mut c, &stream).await.len(), 6);
    // Keys older than dedup_window_secs go when a newer one is added.
    let _: () = redis::cmd("ZADD")
        .arg(&dedup_set)
        .arg(1)
        .arg("ancient")
        .query_async(&mut c)
        .await
        .unwrap();
    send_all(vec!["sys/slot/0/16B3D40/5".into()]).await;
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&dedup_set)
        .arg("ancient")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(score, None);
    // Past the window a replay is a duplicate, never a loss.
    send_all(vec![keys[0].clone()]).await;
    assert_eq!(xrange(&mut c, &stream).await.len(), 8);
    cleanup(&mut c, &[&stream]).await;
}

#[test]
fn stream_key_rule() {
    for legal in ["orders.events", "{tenant}:orders"] {
        assert!(check_stream_key(legal).is_ok(), "{legal:?}");
    }
    // Empty, a newline, too long, a dedup set's name.
    let long = "x".repeat(MAX_STREAM_KEY_LEN + 1);
    for illegal in ["", "a\nb", &long, "orders:outbox-relay-dedup"] {
        assert!(check_stream_key(illegal).is_err(), "{illegal:?}");
    }
    let settings = settings_for(SHARED, "max_message_bytes = 1000");
    assert_eq!(Redis.limits(redis_of(&settings)).max_message_bytes, 1000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (sink, _completions) = create_sink(&settings).await.unwrap();
        let big = vec![b'x'; 1000];
        let refusal = sink
            .send(Handover::of(&record("never-written", b"k", &big, b"id")), Box::new(7))
            .unwrap_err();
        assert_eq!((*refusal.tag, refusal.failure.kind), (7, FailureKind::Refused));
        assert!(
            refusal.failure.cause.contains("max_message_bytes"),
            "{}",
            refusal.failure.cause
        );
        Box::new(sink).abandon(Duration::from_secs(1));
    });
    assert_eq!(
        Redis.limits(redis_of(&settings_for(SHARED, ""))).max_message_bytes,
        512 * 1024 * 1024
    );
}

/// A private `redis-server` on a free port; killed on drop.
pub(crate) struct PrivateRedis {
    child: Child,
    pub(crate) port: u16,
}

/// A loopback port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PrivateRedis {
    pub(crate) fn start(extra: &[&str]) -> PrivateRedis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server on {port} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateRedis { child, port }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test]
async fn a_lost_connection_fails_everything_after_it_and_nothing_is_written_later() {
    let mut server = PrivateRedis::start(&[]);
    let settings = settings_for(&server.url(), "timeout_ms = 2000");
    let (sink, mut completions) = create_sink(&settings).await.unwrap();
    sink.send(Handover::of(&record("s", b"k", b"1", b"a")), Box::new(0))
        .unwrap();
    next(&mut completions).await.outcome.unwrap();
    server.kill();
    for i in 1..=50u32 {
        sink.send(Handover::of(&record("s", b"k", b"2", b"b")), Box::new(i))
            .unwrap();
    }
    for i in 1..=50u32 {
        let c = next(&mut completions).await;
        assert_eq!(*c.tag, i);
        assert_eq!(c.outcome.unwrap_err().kind, FailureKind::Transient);
    }
    let started = Instant::now();
    Box::new(sink).abandon(Duration::from_secs(2));
    assert!(started.elapsed() < Duration::from_secs(3));
    // A new instance cannot connect while the server is down: transient.
    let err = create_sink(&settings).await.err().unwrap();
    assert!(err.transient, "{err}");
}

#[tokio::test]
async fn abandon_drops_what_is_queued() {
    let settings = settings_for(SHARED, "");
    let (sink, completions) = create_sink(&settings).await.unwrap();
    let stream = unique("abandon");
    for i in 0..20_000u32 {
        sink.send(Handover::of(&record(&stream, b"k", b"v", b"id")), Box::new(i))
            .unwrap();
    }
    let started = Instant::now();
    Box::new(sink).abandon(Duration::from_secs(5));
    assert!(started.elapsed() < Duration::from_secs(6));
    drop(completions);
    let mut c = conn(SHARED).await;
    let len = xrange(&mut c, &stream).await.len();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        xrange(&mut c, &stream).await.len(),
        len,
        "nothing written after abandon returned"
    );
    assert!(len < 20_000, "queued records were dropped ({len} written)");
    cleanup(&mut c, &[&stream]).await;
}

#[tokio::test]
async fn connection_errors_say_whether_to_retry() {
    let port = free_port();
    let down = settings_for(&format!("redis://127.0.0.1:{port}"), "timeout_ms = 1000");
    let err = create_sink(&down).await.err().unwrap();
    assert!(err.transient, "{err}");
    let server = PrivateRedis::start(&["--requirepass", "right"]);
    let wrong = settings_for(&format!("redis://:wrong-s3cret@127.0.0.1:{}", server.port), "");
    let err = create_sink(&wrong).await.err().unwrap();
    assert!(!err.transient, "{err}");
    assert!(!err.to_string().contains("wrong-s3cret"), "{err}");
    let right = settings_for(&format!("redis://:right@127.0.0.1:{}", server.port), "");
    let (sink, mut completions) = create_sink(&right).await.unwrap();
    sink.send(Handover::of(&record("s", b"k", b"v", b"id")), Box::new(1))
        .unwrap();
    next(&mut completions).await.outcome.unwrap();
    Box::new(sink).abandon(Duration::from_secs(1));
}

#[tokio::test]
async fn prepare_and_probe_tell_version_and_persistence() {
    let settings = settings_for(SHARED, "");
    let lines = Redis.prepare(redis_of(&settings)).await.unwrap();
    assert!(
        lines[0].starts_with("Redis ") && lines[0].contains("reachable"),
        "{lines:?}"
    );
    let status = Redis.probe(redis_of(&settings)).await.unwrap();
    assert!(status.contains("persistence"), "{status}");
    let dir = tempfile::tempdir().unwrap();
    let aof = PrivateRedis::start(&["--appendonly", "yes", "--dir", dir.path().to_str().unwrap()]);
    let settings = settings_for(&aof.url(), "");
    let lines = Redis.prepare(redis_of(&settings)).await.unwrap();
    assert_eq!(lines.len(), 1, "no warning with AOF on: {lines:?}");
    assert!(Redis.probe(redis_of(&settings)).await.unwrap().contains("AOF on"));
    let plain = PrivateRedis::start(&[]);
    let settings = settings_for(&plain.url(), "");
    let lines = Redis.prepare(redis_of(&settings)).await.unwrap();
    assert!(lines.iter().any(|l| l.contains("in memory")), "{lines:?}");
    assert!(Redis.probe(redis_of(&settings)).await.unwrap().contains("in memory"));
    let port = free_port();
    let down = settings_for(&format!("redis://127.0.0.1:{port}"), "timeout_ms = 500");
    assert!(Redis.prepare(redis_of(&down)).await.unwrap_err().transient);
    assert!(Redis.probe(redis_of(&down)).await.unwrap_err().transient);
}

#[tokio::test]
async fn at_least_once_loads_no_script_and_fails_a_dedup_key_instead_of_writing_it_unchecked() {
    let settings = settings_for(SHARED, "");
    let (sink, mut completions) = create_sink(&settings).await.unwrap();
    let stream = unique("no-script");
    sink.send(
        Handover::of(&record(&stream, b"k", b"v", b"id")).with_dedup_key(Some("src/0/1")),
        Box::new(1),
    )
    .unwrap();
    let c = next(&mut completions).await;
    assert_eq!(c.outcome.unwrap_err().kind, FailureKind::Transient);
    let mut c = conn(SHARED).await;
    assert!(xrange(&mut c, &stream).await.is_empty());
    Box::new(sink).abandon(Duration::from_secs(1));
}
