//! What is the HTTP webhook sink's own, end to end: real PostgreSQL → `outbox-relay run` (a child
//! process, `[sink] kind = "webhook"`) → the harness's HTTP receiver in the test process
//! (`harness/webhook.rs`), which records what it accepted and answers as each test scripts it:
//! `max_concurrency`, 5xx and 429 with `Retry-After`, slow endpoints (timeouts, and the shipped
//! defaults), an untrusted TLS certificate, Standard Webhooks signatures. The endpoint down for
//! 30 s, kill -9 under load, refusals (4xx) under each `relay.on_bad_event`, the exactly-once
//! refusal and two relays on one endpoint are the conformance suite's (`tests/it/conformance.rs`,
//! `harness/conformance/webhook.rs`).
//!
//! Every test has its own database and receiver; every wait is bounded.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::harness::tls::generate_server_tls;
use crate::harness::webhook::{Behaviour, WebhookReceiver};
use crate::harness::workload::{insert_event, new_uuid, Committed, ExpectedEvent, OutboxSchema, Workload};
use crate::harness::*;

/// Two Standard Webhooks secrets (the relay signs with both: rotation).
const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_B: &str = "whsec_dGhpcyBpcyBhIHNlY29uZCBzZWNyZXQgZm9yIHJvdGF0aW9u";

/// A database (schema A, `setup` done) and a relay config posting to `receiver`: URL
/// `<receiver>/hooks/${topic}`, topic = the first token of the type (`order.placed` → `order`).
/// Retries start at 50 ms and stay under 1 s unless a test sets otherwise.
async fn webhook_db(receiver: &WebhookReceiver, section: &[(&str, &str)]) -> (String, Client, RelayConfig) {
    let (db, client, config) = prepared_on(shared_cluster().await, "webhook", OutboxSchema::A, "127.0.0.1:1").await;
    let url = receiver.url();
    let mut all: Vec<(&str, &str)> = vec![("url", url.as_str())];
    all.extend_from_slice(section);
    let config = config
        .sink("webhook", &all)
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("relay", "reconnect_backoff_initial_ms", 100)
        .set("relay", "reconnect_backoff_max_ms", 500);
    (db, client, config)
}

/// Fast retries for the tests that script failures.
const FAST_RETRIES: &[(&str, &str)] = &[("retry_initial_ms", "50"), ("retry_max_ms", "800")];

fn order_topic(_: &ExpectedEvent) -> String {
    "order".to_owned()
}

fn all(committed: &Committed) -> Vec<ExpectedEvent> {
    committed.all().cloned().collect()
}

async fn streaming(config: &RelayConfig) -> RelayProcess {
    let relay = RelayProcess::run(config);
    assert!(
        relay.wait_for_log("streaming started", Duration::from_secs(30)).await,
        "{}",
        relay.log_text()
    );
    relay
}

/// 5,000 events over 50 aggregates at `max_concurrency = 16`: every event arrives once, each
/// aggregate's in commit order, with its headers; the receiver saw more than one request at once
/// but never more than 16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_order_per_aggregate_at_concurrency_16() {
    let receiver = WebhookReceiver::start().await;
    // A receiver that takes a moment, so requests overlap.
    receiver.set(Behaviour::Slow(Duration::from_millis(2)));
    let (db, _client, config) = webhook_db(&receiver, &[("max_concurrency", "16")]).await;
    let config = config.header_column("type", "x-event-type");
    let relay = streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let started = Instant::now();
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 5_000, 50, 4)).await;
    let expected = all(&committed);
    let records = receiver.collect(expected.len(), Duration::from_secs(180)).await;
    eprintln!(
        "webhook workload: {} events, {} received in {:?}, at most {} requests at once",
        expected.len(),
        records.len(),
        started.elapsed(),
        receiver.max_concurrent()
    );
    let dups = check_delivered(&expected, &records, order_topic);
    assert_eq!(dups, 0, "a clean run delivers exactly once");
    check_order(&committed, &records);
    let max = receiver.max_concurrent();
    assert!((2..=16).contains(&max), "requests in flight at once: {max}");
    let by_id: HashMap<String, &ExpectedEvent> = expected.iter().map(|e| (e.id.clone(), e)).collect();
    for hit in receiver.hits() {
        let id = hit.header("id").expect("id header");
        assert_eq!(hit.header("idempotency-key"), Some(id));
        assert_eq!(hit.header("content-type"), Some("application/json"));
        assert_eq!(hit.header("x-event-type"), Some(by_id[id].event_type.as_str()));
        assert!(hit.header("webhook-signature").is_none(), "no secret, no signature");
        assert!(hit.path.starts_with("/hooks/order"), "{}", hit.path);
    }
    assert!(relay.sigterm());
}

/// The receiver answers 500 to the first 40 requests, then 429 with `Retry-After: 1` to the
/// next 3: everything arrives, in order per aggregate, and the request after each 429 came no
/// sooner than the receiver asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_500s_and_429_retry_after_are_retried_in_order() {
    let receiver = WebhookReceiver::start().await;
    let (db, _client, config) = webhook_db(&receiver, FAST_RETRIES).await;
    let relay = streaming(&config).await;
    receiver.set(Behaviour::Fail {
        status: 500,
        count: 40,
        retry_after: None,
    });
    receiver.then(Behaviour::Fail {
        status: 429,
        count: 3,
        retry_after: Some("1".into()),
    });
    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 300, 10, 2)).await;
    let expected = all(&committed);
    let records = receiver.collect(expected.len(), Duration::from_secs(120)).await;
    check_delivered(&expected, &records, order_topic);
    check_order(&committed, &records);
    let hits = receiver.hits();
    assert_eq!(hits.iter().filter(|h| h.status == 500).count(), 40);
    let throttled: Vec<_> = hits.iter().filter(|h| h.status == 429).collect();
    assert_eq!(throttled.len(), 3);
    for t in throttled {
        let id = t.header("id").unwrap();
        let next = hits
            .iter()
            .find(|h| h.at > t.at && h.header("id") == Some(id))
            .expect("the throttled event is sent again");
        let waited = next.at - t.at;
        assert!(
            waited >= Duration::from_millis(900),
            "Retry-After: 1 not honoured: {waited:?}"
        );
    }
    let log = relay.log_text();
    assert!(
        log.contains("HTTP 500"),
        "the retries are logged with the reply:\n{log}"
    );
    assert!(relay.sigterm());
}

/// An endpoint slower than `timeout_ms` (400 ms per answer, timeout 200 ms) for the first
/// few seconds: the timed-out requests are sent again, nothing is lost, first deliveries keep
/// commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_slow_endpoint_times_out_and_retries() {
    let receiver = WebhookReceiver::start().await;
    let mut section = FAST_RETRIES.to_vec();
    section.push(("timeout_ms", "200"));
    let (db, client, config) = webhook_db(&receiver, &section).await;
    let relay = streaming(&config).await;
    receiver.set(Behaviour::Slow(Duration::from_millis(400)));
    let mut committed = Committed::default();
    let aggs: Vec<String> = (0..4).map(|_| new_uuid()).collect();
    for seq in 0..20u64 {
        let agg = &aggs[seq as usize % aggs.len()];
        let ev = insert_event(&client, OutboxSchema::A, agg, seq).await;
        committed.by_aggregate.entry(agg.clone()).or_default().push(ev);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        receiver.received().is_empty() || relay.log_text().contains("timed out"),
        "{}",
        relay.log_text()
    );
    receiver.set(Behaviour::Accept);
    let expected = all(&committed);
    let records = receiver.collect(expected.len(), Duration::from_secs(60)).await;
    check_delivered(&expected, &records, order_topic);
    check_order(&committed, &records);
    assert!(relay.log_text().contains("timed out"), "{}", relay.log_text());
    let _ = db;
    assert!(relay.sigterm());
}

/// A slow endpoint with the shipped defaults (10 s timeout, 16 aggregates at once, retries
/// 100 ms to 30 s): answers taking 1.5 s are waited for, not retried — each event arrives
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_slow_endpoint_with_shipped_defaults() {
    let receiver = WebhookReceiver::start().await;
    receiver.set(Behaviour::Slow(Duration::from_millis(1_500)));
    let (db, _client, config) = webhook_db(&receiver, &[]).await;
    let relay = streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 60, 20, 2)).await;
    let expected = all(&committed);
    let records = receiver.collect(expected.len(), Duration::from_secs(60)).await;
    let dups = check_delivered(&expected, &records, order_topic);
    assert_eq!(dups, 0, "1.5 s is within the default 10 s timeout: no retry");
    check_order(&committed, &records);
    assert_eq!(receiver.hits().len(), expected.len());
    assert!(relay.sigterm());
}

/// An HTTPS receiver whose certificate the relay does not trust (a throwaway CA, no
/// `tls_ca`): the relay stops at the first event with an error naming the problem and the fix
/// (not retrying for ever with the WAL held), confirms nothing past it; with `tls_ca` naming
/// the CA, the next run delivers the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_untrusted_tls_certificate_stops_the_relay_naming_the_fix() {
    let tls = generate_server_tls();
    let receiver = WebhookReceiver::start_tls(&tls).await;
    let (_db, client, config) = webhook_db(&receiver, FAST_RETRIES).await;
    let ev = insert_event(&client, OutboxSchema::A, &new_uuid(), 1).await;
    let mut relay = RelayProcess::run(&config);
    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log_text();
    assert!(status.is_some_and(|s| !s.success()), "the relay stops; log:\n{log}");
    assert!(
        log.contains("TLS certificate is rejected") && log.contains("set [webhook] tls_ca"),
        "the error names the problem and the fix; log:\n{log}"
    );
    assert!(receiver.hits().is_empty(), "nothing reached the receiver");

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    let fixed = config.sink(
        "webhook",
        &[
            ("url", receiver.url().as_str()),
            ("tls_ca", ca.to_str().unwrap()),
            ("retry_initial_ms", "50"),
            ("retry_max_ms", "800"),
        ],
    );
    // The event was not confirmed by the stopped relay: the next one delivers it.
    let relay = streaming(&fixed).await;
    let received = receiver.collect(1, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 1, "log:\n{}", relay.log_text());
    assert_eq!(received[0].header("id"), Some(ev.id.as_bytes()));
}

/// The venv's python with `standardwebhooks` importable, installing it first if needed.
fn standardwebhooks_python() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let python = cache.join("outbox-relay/venv-standardwebhooks/bin/python");
    let usable = || {
        Command::new(&python)
            .args(["-c", "from standardwebhooks.webhooks import Webhook"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !usable() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install-standardwebhooks.sh");
        let _ = Command::new("bash").arg(script).status();
    }
    if usable() {
        Some(python)
    } else {
        crate::harness::needs::missing(
            crate::harness::needs::STANDARD_WEBHOOKS,
            "the Standard Webhooks library check",
            &format!("{} cannot import standardwebhooks", python.display()),
        );
        None
    }
}

/// The official library verifies what `script` reads on stdin: one JSON object per line
/// (`secret`, `body`, `headers`); prints one line per request, "ok" or the library's error.
const VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
for line in sys.stdin:
    r = json.loads(line)
    try:
        Webhook(r["secret"]).verify(r["body"].encode(), r["headers"], json_parse=False)
        print("ok")
    except Exception as e:
        print("refused: %r" % e)
"#;

/// Requests signed with two secrets (rotation): the official Python library verifies every
/// captured request with each secret alone, and refuses one whose body was changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_webhook_signatures_verify_with_the_official_library() {
    let receiver = WebhookReceiver::start().await;
    let secrets = format!("{SECRET_A}, {SECRET_B}");
    let (db, _client, config) = webhook_db(&receiver, &[("secret", secrets.as_str())]).await;
    let relay = streaming(&config).await;
    let url = shared_cluster().await.url(&db);
    let committed = run_workload(&url, &Workload::new(OutboxSchema::A, 50, 5, 2)).await;
    let expected = all(&committed);
    let records = receiver.collect(expected.len(), Duration::from_secs(60)).await;
    check_delivered(&expected, &records, order_topic);
    assert!(relay.sigterm());
    let hits = receiver.hits();
    for hit in &hits {
        let sig = hit.header("webhook-signature").expect("signed");
        assert_eq!(sig.split(' ').count(), 2, "one signature per secret: {sig}");
        assert_eq!(hit.header("webhook-id"), hit.header("id"));
    }
    let Some(python) = standardwebhooks_python() else {
        return;
    };
    let mut input = String::new();
    let mut cases = 0;
    for hit in &hits {
        let headers: serde_json::Map<String, serde_json::Value> = hit
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    serde_json::Value::String(String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect();
        for (secret, body) in [
            (SECRET_A, String::from_utf8(hit.body.clone()).unwrap()),
            (SECRET_B, String::from_utf8(hit.body.clone()).unwrap()),
            (SECRET_A, format!("{} ", String::from_utf8(hit.body.clone()).unwrap())),
        ] {
            input.push_str(&serde_json::json!({"secret": secret, "body": body, "headers": headers}).to_string());
            input.push('\n');
            cases += 1;
        }
    }
    let mut child = Command::new(python)
        .args(["-c", VERIFY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().expect("python output");
    let text = String::from_utf8_lossy(&out.stdout);
    let verdicts: Vec<&str> = text.lines().collect();
    assert_eq!(verdicts.len(), cases, "{}", String::from_utf8_lossy(&out.stderr));
    for (i, chunk) in verdicts.chunks(3).enumerate() {
        assert_eq!(chunk[0], "ok", "request {i} with the first secret");
        assert_eq!(chunk[1], "ok", "request {i} with the second secret");
        assert!(chunk[2].starts_with("refused"), "a changed body verifies: {}", chunk[2]);
    }
    eprintln!(
        "standardwebhooks verified {} requests with each of 2 secrets",
        hits.len()
    );
}
