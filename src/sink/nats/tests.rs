//! The adapter against a real server: the shared one at 127.0.0.1:4222 (JetStream on; CI
//! starts it), and, for authentication and connection loss, a `nats-server` of the test's own.
//! Every stream and subject prefix is unique to its test; every wait is bounded.

use std::borrow::Cow;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::config::NatsSection;
use super::publisher::{Publisher, KEY_HEADER, TIMESTAMP_HEADER};
use super::*;
use crate::sink::memory::send_taken;
use crate::sink::{Completions, FailureKind, Handover, Sink, SinkRecord};

const SHARED: &str = "nats://127.0.0.1:4222";
const WAIT: Duration = Duration::from_secs(20);

fn unique(what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{what}{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn nats_settings(url: &str, stream: &str, subjects: &[&str], extra: &str) -> NatsSettings {
    let subjects = match subjects {
        [] => String::new(),
        _ => format!(
            "subjects = [{}]",
            subjects
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let text = format!("url = \"{url}\"\nstream = \"{stream}\"\n{subjects}\n{extra}");
    toml::from_str::<NatsSection>(&text).unwrap().validate().unwrap()
}

/// A stream of its own (`T…`) holding `<prefix>.>`, created through `prepare`.
async fn fresh(url: &str) -> (NatsSettings, String) {
    let prefix = unique("t");
    let s = nats_settings(url, &unique("T"), &[&format!("{prefix}.>")], "ack_timeout_ms = 3000");
    let done = tokio::time::timeout(WAIT, Nats.prepare(&s)).await.unwrap().unwrap();
    assert!(done[0].starts_with("created"), "{done:?}");
    (s, prefix)
}

/// [`fresh`] on the shared server, and a publisher to it whose in-flight budget is `max_in_flight`.
async fn fresh_publisher(max_in_flight: usize) -> (NatsSettings, String, Publisher<u64>, Completions<u64>) {
    let (s, prefix) = fresh(SHARED).await;
    let (sink, rx) = Publisher::<u64>::create(&s, max_in_flight).await.unwrap();
    (s, prefix, sink, rx)
}

async fn stream_handle(s: &NatsSettings) -> jetstream::stream::Stream {
    let client = connect(s, None, None).await.unwrap();
    let js = jetstream::new(client);
    js.get_stream(&s.stream).await.unwrap()
}

async fn delete(s: &NatsSettings) {
    let client = connect(s, None, None).await.unwrap();
    let _ = jetstream::new(client).delete_stream(&s.stream).await;
}

fn record<'a>(subject: &'a str, key: &'a str, id: &'a [u8], value: &'a [u8]) -> SinkRecord<'a> {
    SinkRecord {
        timestamp_ms: Some(1_700_000_000_123),
        headers: Cow::Owned(vec![(Cow::Borrowed("tenant"), Some(Cow::Borrowed(&b"acme"[..])))]),
        ..crate::sink::memory::record(subject, key.as_bytes(), value, id)
    }
}

async fn take(rx: &mut Completions<u64>, n: usize) -> Vec<(u64, Result<(), crate::sink::SinkFailure>)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(c)) => out.push((*c.tag, c.outcome)),
            _ => panic!("{} of {n} completions within {WAIT:?}", out.len()),
        }
    }
    out
}

/// Hands over one record (key `k`, id `id`) to `subject` for each tag in `tags`; each is taken.
fn send_each(sink: &Publisher<u64>, subject: &str, tags: impl Iterator<Item = u64>) {
    for i in tags {
        send_taken(sink, Handover::of(&record(subject, "k", b"id", b"{}")), i);
    }
}

fn abandon(sink: Box<dyn Sink<u64>>) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || sink.abandon(Duration::from_secs(2)))
}

/// Ends a test's sink and deletes its stream.
async fn finish(sink: Publisher<u64>, s: &NatsSettings) {
    abandon(Box::new(sink)).await.unwrap();
    delete(s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn prepare_creates_accepts_and_refuses_and_probe_reports() {
    let (s, prefix) = fresh(SHARED).await;
    let again = Nats.prepare(&s).await.unwrap();
    assert!(again[0].contains("exists"), "{again:?}");
    let status = Nats.probe(&s).await.unwrap();
    assert!(status.contains("0 messages") && status.contains(&s.stream), "{status}");
    // Asking for more subjects than the stream holds: setup and run refuse, naming the fix.
    let wider = nats_settings(SHARED, &s.stream, &[&format!("{prefix}.>"), "elsewhere.>"], "");
    let e = Nats.prepare(&wider).await.unwrap_err();
    assert!(e.cause.contains("do not cover") && !e.transient, "{e}");
    let e = Publisher::<u64>::create(&wider, 10).await.err().unwrap();
    assert!(e.cause.contains("do not cover"), "{e}");
    // The stream as it is when [nats] subjects is left out.
    let as_is = nats_settings(SHARED, &s.stream, &[], "");
    assert!(Publisher::<u64>::create(&as_is, 10).await.is_ok());
    let e = Nats
        .prepare(&nats_settings(SHARED, &unique("NOSUBJ"), &[], ""))
        .await
        .unwrap_err();
    assert!(e.cause.contains("subjects is not set"), "{e}");
    // A missing stream: create tells to run setup.
    let missing = nats_settings(SHARED, &unique("NOPE"), &["nope.>"], "");
    let e = Publisher::<u64>::create(&missing, 10).await.err().unwrap();
    assert!(e.cause.contains("run `outbox-relay setup`") && !e.transient, "{e}");
    let e = Nats.probe(&missing).await.unwrap_err();
    assert!(e.cause.contains("does not exist"), "{e}");
    delete(&s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn delivered_in_order_with_headers_and_unchanged_value() {
    let (s, prefix, sink, mut rx) = fresh_publisher(1000).await;
    let n = 600u64;
    let subjects = [format!("{prefix}.orders"), format!("{prefix}.users.x")];
    for i in 0..n {
        let id = format!("id-{i}");
        let value = format!("{{\"n\":{i}, \"bytes\":\"\u{e9}\"}}");
        let key = format!("k{}", i % 7);
        let rec = record(&subjects[(i % 2) as usize], &key, id.as_bytes(), value.as_bytes());
        let pos = i.to_string();
        send_taken(&sink, Handover::of(&rec).with_extra(&[("x-pos", pos.as_bytes())]), i);
    }
    let done = take(&mut rx, n as usize).await;
    assert!(
        done.iter().all(|(_, o)| o.is_ok()),
        "{:?}",
        done.iter().find(|(_, o)| o.is_err())
    );
    let stream = stream_handle(&s).await;
    for seq in 1..=n {
        let m = stream.get_raw_message(seq).await.unwrap();
        let i = seq - 1;
        assert_eq!(m.subject.as_str(), subjects[(i % 2) as usize]);
        assert_eq!(
            &m.payload[..],
            format!("{{\"n\":{i}, \"bytes\":\"\u{e9}\"}}").as_bytes()
        );
        let h = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(h("id").as_deref(), Some(format!("id-{i}").as_str()));
        assert_eq!(h(KEY_HEADER).as_deref(), Some(format!("k{}", i % 7).as_str()));
        assert_eq!(h(TIMESTAMP_HEADER).as_deref(), Some("1700000000123"));
        assert_eq!(h("tenant").as_deref(), Some("acme"));
        assert_eq!(h("x-pos").as_deref(), Some(i.to_string().as_str()));
        assert_eq!(m.headers.get(async_nats::header::NATS_MESSAGE_ID), None);
    }
    finish(sink, &s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bad_records_are_refused_on_sight() {
    let (s, prefix, sink, mut rx) = fresh_publisher(10).await;
    let ok = format!("{prefix}.ok");
    let big = vec![b'x'; 1024 * 1024];
    let outside = format!("{}.other", unique("u"));
    let cases: Vec<(String, Vec<u8>, &str)> = vec![
        (ok.clone(), big, "max_payload"),
        (outside, b"{}".to_vec(), "covers"),
        (format!("{prefix}..gap"), b"{}".to_vec(), "empty token"),
        (format!("{prefix}.*"), b"{}".to_vec(), "wildcard"),
        (format!("{prefix}.a b"), b"{}".to_vec(), "whitespace"),
    ];
    for (i, (subject, value, why)) in cases.iter().enumerate() {
        let r = sink
            .send(Handover::of(&record(subject, "k", b"id", value)), Box::new(i as u64))
            .unwrap_err();
        assert_eq!(r.failure.kind, FailureKind::Refused, "{why}: {}", r.failure);
        assert!(r.failure.cause.contains(why), "{why}: {}", r.failure);
        assert_eq!(*r.tag, i as u64);
    }
    // A header value NATS cannot carry (a line break).
    let mut rec = record(&ok, "k", b"id", b"{}");
    rec.headers = Cow::Owned(vec![(Cow::Borrowed("h"), Some(Cow::Borrowed(&b"a\r\nb"[..])))]);
    let r = sink.send(Handover::of(&rec), Box::new(99)).unwrap_err();
    assert_eq!(r.failure.kind, FailureKind::Refused, "{}", r.failure);
    // The sink still works: nothing above reached the server.
    send_taken(&sink, Handover::of(&record(&ok, "k", b"id", b"{}")), 7);
    let done = take(&mut rx, 1).await;
    assert!(done[0].1.is_ok() && done[0].0 == 7);
    assert_eq!(stream_handle(&s).await.cached_info().state.messages, 1);
    finish(sink, &s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_msg_id_is_delivered_and_stored_once() {
    let (s, prefix, sink, mut rx) = fresh_publisher(10).await;
    let subject = format!("{prefix}.orders");
    for i in 0..3u64 {
        send_taken(
            &sink,
            Handover::of(&record(&subject, "k", b"id-1", b"{}")).with_dedup_key(Some("src/0/0")),
            i,
        );
    }
    send_taken(
        &sink,
        Handover::of(&record(&subject, "k", b"id-2", b"{}")).with_dedup_key(Some("src/0/1")),
        3,
    );
    let done = take(&mut rx, 4).await;
    assert!(done.iter().all(|(_, o)| o.is_ok()), "{done:?}");
    let stream = stream_handle(&s).await;
    assert_eq!(stream.cached_info().state.messages, 2);
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(
        first
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some("src/0/0"),
        "{:?}",
        first.headers
    );
    finish(sink, &s).await;
}

/// A port free now and never handed out before in this process: the kernel may give the same
/// port to two `bind(0)`s in a row once the first listener closed, and two servers of
/// concurrent tests on one port make one test talk to the other's server.
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// A `nats-server` of the test's own, killed when dropped.
struct OwnServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    /// Started on a port it chose itself (`-p -1`), read from its log: a port picked by the test
    /// and bound by the server later can be taken meanwhile by another test's listener (a proxy
    /// in front of a running server, in another test process), and the test would then talk to
    /// a server it cannot stop.
    fn start(args: &[&str]) -> OwnServer {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("nats.log");
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", "-1", "-sd", dir.path().to_str().unwrap()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("nats-server on PATH");
        // Owned at once: a panic below kills and reaps it (`Drop`).
        let mut server = OwnServer {
            child,
            port: 0,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let port = text
                .lines()
                .find_map(|l| l.split("Listening for client connections on 127.0.0.1:").nth(1))
                .and_then(|p| p.trim().parse::<u16>().ok());
            if let Some(port) = port {
                server.port = port;
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen within 10 s: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn connection_errors_say_whether_to_retry() {
    let port = free_port();
    let s = nats_settings(
        &format!("nats://127.0.0.1:{port}"),
        "S",
        &[">"],
        "connect_timeout_ms = 500",
    );
    let e = Publisher::<u64>::create(&s, 10).await.err().unwrap();
    assert!(e.transient, "{e}");
    let server = OwnServer::start(&["--user", "relay", "--pass", "right"]);
    let url = format!("nats://relay:wrong@127.0.0.1:{}", server.port);
    let s = nats_settings(&url, "S", &[">"], "connect_timeout_ms = 2000");
    let e = Publisher::<u64>::create(&s, 10).await.err().unwrap();
    assert!(!e.transient, "{e}");
    assert!(!e.to_string().contains("wrong"), "the password is masked: {e}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_connection_fails_everything_after_it() {
    let mut server = OwnServer::start(&["-js"]);
    let (s, prefix) = fresh(&format!("nats://127.0.0.1:{}", server.port)).await;
    let (sink, mut rx) = Publisher::<u64>::create(&s, 1000).await.unwrap();
    let subject = format!("{prefix}.orders");
    send_each(&sink, &subject, 0..100);
    let first = take(&mut rx, 100).await;
    assert!(first.iter().all(|(_, o)| o.is_ok()));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut taken = 0u64;
    for i in 100..200u64 {
        match sink.send(Handover::of(&record(&subject, "k", b"id", b"{}")), Box::new(i)) {
            Ok(()) => taken += 1,
            Err(r) => assert_eq!(r.failure.kind, FailureKind::Transient),
        }
    }
    let rest = take(&mut rx, taken as usize).await;
    assert!(
        rest.iter()
            .all(|(_, o)| o.as_ref().is_err_and(|f| f.kind == FailureKind::Transient)),
        "{rest:?}"
    );
    let started = Instant::now();
    abandon(Box::new(sink)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "current_thread")]
async fn abandon_drops_the_queue_and_returns_in_time() {
    let (s, prefix, sink, rx) = fresh_publisher(10_000).await;
    let subject = format!("{prefix}.orders");
    send_each(&sink, &subject, 0..5_000);
    let started = Instant::now();
    abandon(Box::new(sink)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    drop(rx);
    let stored = stream_handle(&s).await.cached_info().state.messages;
    assert!(stored <= 5_000, "{stored}");
    delete(&s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn records_that_waited_past_the_ack_timeout_are_not_sent_late() {
    let prefix = unique("t");
    let s = nats_settings(SHARED, &unique("T"), &[&format!("{prefix}.>")], "ack_timeout_ms = 300");
    Nats.prepare(&s).await.unwrap();
    let (sink, mut rx) = Publisher::<u64>::create(&s, 10).await.unwrap();
    let subject = format!("{prefix}.orders");
    send_each(&sink, &subject, 0..3);
    // A frozen process: the runtime's only thread blocked, so the publishing task cannot run.
    std::thread::sleep(Duration::from_millis(500));
    let done = take(&mut rx, 3).await;
    for (_, outcome) in &done {
        let failure = outcome.as_ref().unwrap_err();
        assert_eq!(failure.kind, FailureKind::Transient);
        assert!(
            failure.cause.contains("waited") || failure.cause.contains("earlier record failed"),
            "{failure}"
        );
    }
    assert_eq!(stream_handle(&s).await.cached_info().state.messages, 0);
    finish(sink, &s).await;
}

#[tokio::test(flavor = "current_thread")]
async fn prepare_and_probe_take_the_relay_settings() {
    let prefix = unique("t");
    let stream = unique("T");
    let text = format!(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:5432/app\"\n[sink]\nkind = \"nats\"\n\
         [nats]\nurl = \"{SHARED}\"\nstream = \"{stream}\"\nsubjects = [\"{prefix}.>\"]\n"
    );
    let settings =
        crate::config::Settings::from_toml_str(&text, std::path::Path::new("t.toml"), std::iter::empty()).unwrap();
    let done = crate::sink::prepare(&settings).await.unwrap();
    assert!(done[0].starts_with("created"), "{done:?}");
    let status = crate::sink::probe(&settings).await.unwrap();
    assert!(
        status.contains(&stream) && status.contains("duplicate window 120 s"),
        "{status}"
    );
    delete(settings.sink.section::<NatsSettings>().unwrap()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn several_servers_one_of_them_down() {
    let (s, prefix) = fresh(SHARED).await;
    let dead = free_port();
    let url = format!("nats://127.0.0.1:{dead}, {SHARED}");
    let several = nats_settings(&url, &s.stream, &[], "connect_timeout_ms = 500");
    let (sink, mut rx) = Publisher::<u64>::create(&several, 10).await.unwrap();
    send_taken(
        &sink,
        Handover::of(&record(&format!("{prefix}.a"), "k", b"id", b"{}")),
        1,
    );
    assert!(take(&mut rx, 1).await[0].1.is_ok());
    finish(sink, &s).await;
}

/// A record the stream refuses in its PubAck (larger than the stream's `max_msg_size`, within
/// the server's `max_payload`) fences its key: a later record of the key is not stored ahead of
/// it before the caller decided, other keys pass, and after `release` the key passes again.
#[tokio::test(flavor = "current_thread")]
async fn a_refusal_in_a_puback_fences_its_key_until_released() {
    let (s, prefix) = fresh(SHARED).await;
    let client = connect(&s, None, None).await.unwrap();
    let js = jetstream::new(client);
    let mut config = js.get_stream(&s.stream).await.unwrap().cached_info().config.clone();
    config.max_message_size = 512;
    js.update_stream(&config).await.unwrap();
    let (sink, mut rx) = Publisher::<u64>::create(&s, 10).await.unwrap();
    let subject = format!("{prefix}.orders");
    let big = vec![b'x'; 2048];
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-1", &big)), 1);
    let refused = take(&mut rx, 1).await.remove(0).1.unwrap_err();
    assert_eq!(refused.kind, FailureKind::Refused, "{refused}");
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-2", b"{}")), 2);
    send_taken(&sink, Handover::of(&record(&subject, "other", b"id-3", b"{}")), 3);
    let mut done = take(&mut rx, 2).await;
    done.sort_by_key(|(tag, _)| *tag);
    let stopped = done[0].1.as_ref().unwrap_err();
    assert_eq!(stopped.kind, FailureKind::Transient, "{stopped}");
    assert!(stopped.cause.contains("refused"), "{stopped}");
    assert!(done[1].1.is_ok(), "another key passes: {:?}", done[1]);
    sink.release(b"k");
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-4", b"{}")), 4);
    assert!(take(&mut rx, 1).await[0].1.is_ok());
    let stream = stream_handle(&s).await;
    assert_eq!(stream.cached_info().state.messages, 2, "id-3 and id-4 only");
    finish(sink, &s).await;
}

/// The stream gone after the sink connected: the server answers the record's reply subject with
/// 503 no responders, which fails it (and the sink) as transient, naming the stream.
#[tokio::test(flavor = "current_thread")]
async fn no_stream_for_the_subject_fails_transient_naming_the_stream() {
    let (s, prefix, sink, mut rx) = fresh_publisher(10).await;
    delete(&s).await;
    let subject = format!("{prefix}.orders");
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-1", b"{}")), 1);
    let failed = take(&mut rx, 1).await.remove(0).1.unwrap_err();
    assert_eq!(failed.kind, FailureKind::Transient, "{failed}");
    assert!(
        failed.cause.contains("no responders") && failed.cause.contains(&s.stream),
        "{failed}"
    );
    // Nothing more is sent after a failure.
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-2", b"{}")), 2);
    let after = take(&mut rx, 1).await.remove(0).1.unwrap_err();
    assert!(after.cause.contains("earlier record failed"), "{after}");
    abandon(Box::new(sink)).await.unwrap();
}

/// A server that stops answering (SIGSTOP: the connection stays open, no PubAck comes): every
/// record on the wire fails as transient once the ack timeout has passed, not later than a few
/// check periods after it, and none completes twice.
#[tokio::test(flavor = "current_thread")]
async fn records_without_a_puback_fail_after_the_ack_timeout() {
    no_puback_case(
        "ack_timeout_ms = 400",
        Duration::from_millis(400),
        Duration::from_secs(3),
    )
    .await;
}

/// The same with the shipped `ack_timeout_ms` (10 s; checked every 1 s): what users get.
#[tokio::test(flavor = "current_thread")]
async fn records_without_a_puback_fail_after_the_shipped_ack_timeout() {
    no_puback_case("", Duration::from_secs(10), Duration::from_secs(13)).await;
}

/// Records sent while the sink's own server is stopped fail after `timeout` and before `within`.
async fn no_puback_case(extra: &str, timeout: Duration, within: Duration) {
    let server = OwnServer::start(&["-js"]);
    let url = format!("nats://127.0.0.1:{}", server.port);
    let prefix = unique("t");
    let s = nats_settings(&url, &unique("T"), &[&format!("{prefix}.>")], extra);
    assert_eq!(s.requests.timeout, timeout);
    Nats.prepare(&s).await.unwrap();
    let (sink, mut rx) = Publisher::<u64>::create(&s, 100).await.unwrap();
    let subject = format!("{prefix}.orders");
    send_taken(&sink, Handover::of(&record(&subject, "k", b"id-0", b"{}")), 0);
    assert!(take(&mut rx, 1).await[0].1.is_ok());
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let sent = Instant::now();
    send_each(&sink, &subject, 1..=5);
    let done = take(&mut rx, 5).await;
    let waited = sent.elapsed();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    for (_, outcome) in &done {
        let failure = outcome.as_ref().unwrap_err();
        assert_eq!(failure.kind, FailureKind::Transient, "{failure}");
        assert!(
            failure.cause.contains("no PubAck within") || failure.cause.contains("earlier record failed"),
            "{failure}"
        );
    }
    assert!(
        done.iter()
            .any(|(_, o)| o.as_ref().unwrap_err().cause.contains("no PubAck within")),
        "{done:?}"
    );
    assert!(waited >= timeout && waited < within, "failed after {waited:?}");
    // Acks that come after the timeout complete nothing a second time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "a record completed twice");
    abandon(Box::new(sink)).await.unwrap();
}
