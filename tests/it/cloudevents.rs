//! `[cloudevents]` and `outbox.trace_column` end to end: the relay streams two outbox tables (a
//! `jsonb` and a `bytea` payload) to the mock Kafka cluster, and the records are read back with
//! the official Python CloudEvents SDK (`cloudevents.kafka.from_binary` / `from_structured`, in
//! a venv that scripts/install-cloudevents-sdk.sh makes) as well as checked byte for byte where
//! the Kafka binding fixes the bytes (binary mode's value is the payload; the structured content
//! type). A third test checks the W3C `traceparent` pass-through without `[cloudevents]`: valid
//! and invalid values are published untouched, invalid ones counted. On RabbitMQ (the AMQP
//! binding) the properties are checked against the binding's rules directly, then — as the SDK
//! has no AMQP reader — renamed one to one to the Kafka binding's names (`cloudEvents:x` →
//! `ce_x`, the `content_type` property → `content-type`: the only differences between the two
//! bindings) and read with the Kafka reader.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::process::wait_child;
use crate::harness::scrape::{with_http, Metrics};
use crate::harness::*;

const WAIT: Duration = Duration::from_secs(60);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TABLES: [&str; 2] = ["public.ce_json", "public.ce_bytes"];

const SCHEMA: &str = "
CREATE TABLE public.ce_json (
    id bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenant text,
    traceparent text,
    tracestate text,
    dispatched_at timestamptz);
CREATE TABLE public.ce_bytes (
    id bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    type text NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenant text,
    traceparent text,
    tracestate text,
    dispatched_at timestamptz);
-- Event ids unique across both tables (consumers deduplicate on them).
SELECT setval('public.ce_bytes_id_seq', 1000);
";

/// What was inserted, to compare with what was read back.
#[derive(Debug, Clone)]
struct Row {
    table: &'static str,
    id: String,
    aggregate: String,
    /// The payload's bytes as the relay must publish them in binary mode (`jsonb`'s text, or
    /// the `bytea`'s bytes).
    payload: Vec<u8>,
    created_ms: i64,
    tenant: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// A fresh database with [`SCHEMA`], and a relay config streaming both tables (routed to topic
/// `order`) with the trace columns mapped.
async fn database(bootstrap: &str) -> (String, Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("ce");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(SCHEMA).await.expect("schema");
    let config = RelayConfig::new(&pg.url(&db), bootstrap)
        .route(PREFIX_REGEX, "${routedByValue}")
        .set(
            "outbox",
            "table",
            toml::Value::Array(TABLES.iter().map(|t| toml::Value::String((*t).into())).collect()),
        )
        .set("outbox", "trace_column", "traceparent")
        .set("outbox", "tracestate_column", "tracestate");
    (db, client, config)
}

/// Inserts one `order.placed` row; `payload_sql` is an SQL expression of the payload column's type.
async fn insert(
    client: &Client,
    table: &'static str,
    aggregate: &str,
    payload_sql: &str,
    tenant: Option<&str>,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> Row {
    let bytes_expr = if table == "public.ce_bytes" {
        "payload"
    } else {
        "convert_to(payload::text, 'UTF8')"
    };
    let row = client
        .query_one(
            &format!(
                "INSERT INTO {table} (aggregate_id, type, payload, tenant, traceparent, tracestate) \
                 VALUES ($1, 'order.placed', {payload_sql}, $2, $3, $4) \
                 RETURNING id::text, {bytes_expr}, floor(extract(epoch FROM created_at) * 1000)::bigint"
            ),
            &[&aggregate, &tenant, &traceparent, &tracestate],
        )
        .await
        .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
    Row {
        table,
        id: row.get(0),
        aggregate: aggregate.to_owned(),
        payload: row.get(1),
        created_ms: row.get(2),
        tenant: tenant.map(str::to_owned),
        traceparent: traceparent.map(str::to_owned),
        tracestate: tracestate.map(str::to_owned),
    }
}

/// The rows both CloudEvents tests insert: attributes present and absent, a JSON and a binary
/// payload, a valid and an invalid traceparent.
async fn insert_rows(client: &Client) -> Vec<Row> {
    vec![
        insert(
            client,
            TABLES[0],
            "agg-1",
            r#"'{"total": 42, "note": "ü \"quoted\""}'::jsonb"#,
            Some("acme"),
            Some(TRACEPARENT),
            Some("vendor=1"),
        )
        .await,
        insert(client, TABLES[0], "agg-2", "'[1, 2, 3]'::jsonb", None, None, None).await,
        insert(
            client,
            TABLES[1],
            "agg-3",
            r"'\x00ff10c3'::bytea",
            Some("acme"),
            Some("not-a-traceparent"),
            None,
        )
        .await,
    ]
}

async fn cloudevents_round_trip(mode: &str) {
    let kafka = MockKafka::new(1);
    let (db, client, config) = database(&kafka.bootstrap_servers()).await;
    let mut extensions = toml::Table::new();
    extensions.insert("tenant".into(), toml::Value::String("tenant".into()));
    let config =
        config
            .set("cloudevents", "mode", mode)
            .set("cloudevents", "extensions", toml::Value::Table(extensions));
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let rows = insert_rows(&client).await;
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    let by_id: BTreeMap<String, &Received> = records
        .iter()
        .map(|r| {
            (
                String::from_utf8_lossy(r.header("id").expect("id header")).into_owned(),
                r,
            )
        })
        .collect();

    // What the binding fixes byte for byte, read without the SDK.
    for row in &rows {
        let record = by_id[&row.id];
        assert_eq!(record.key_str(), Some(row.aggregate.as_str()));
        let source = format!("/outbox-relay/{db}/{}", row.table);
        if mode == "binary" {
            assert_eq!(
                record.payload.as_deref(),
                Some(&row.payload[..]),
                "binary mode: the value is the payload"
            );
            assert_eq!(record.header("ce_specversion"), Some(&b"1.0"[..]));
            assert_eq!(record.header("ce_id"), Some(row.id.as_bytes()));
            assert_eq!(record.header("ce_source"), Some(source.as_bytes()));
            assert_eq!(record.header("ce_type"), Some(&b"order.placed"[..]));
            assert_eq!(record.header("ce_subject"), Some(row.aggregate.as_bytes()));
            assert_eq!(
                record.header("ce_traceparent"),
                row.traceparent.as_deref().map(str::as_bytes)
            );
            assert_eq!(
                record.header("traceparent"),
                None,
                "binary mode names it ce_traceparent"
            );
        } else {
            assert_eq!(
                record.header("content-type"),
                Some(&b"application/cloudevents+json; charset=UTF-8"[..])
            );
            let envelope: serde_json::Value =
                serde_json::from_slice(record.payload.as_deref().expect("a value")).expect("a JSON envelope");
            assert_eq!(envelope["specversion"], "1.0");
            assert_eq!(envelope["source"], source.as_str());
            assert_eq!(
                envelope["datacontenttype"],
                if row.table == TABLES[1] {
                    "application/octet-stream"
                } else {
                    "application/json"
                }
            );
            assert_eq!(
                record.header("traceparent"),
                row.traceparent.as_deref().map(str::as_bytes)
            );
        }
    }

    check_with_sdk(mode, &db, &rows, &records).await;
}

/// Reads `records` back with the SDK in `mode` and compares every attribute and the data with
/// the inserted `rows` (of database `db`).
async fn check_with_sdk(mode: &str, db: &str, rows: &[Row], records: &[Received]) {
    let Some(read) = read_with_sdk(mode, records).await else {
        return;
    };
    for (record, event) in records.iter().zip(&read) {
        let id = String::from_utf8_lossy(record.header("id").unwrap()).into_owned();
        let row = rows.iter().find(|r| r.id == id).expect("a record of an inserted row");
        let attrs = &event["attributes"];
        let text = |name: &str| attrs.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        assert_eq!(text("specversion").as_deref(), Some("1.0"), "{event}");
        assert_eq!(text("id").as_deref(), Some(row.id.as_str()), "{event}");
        assert_eq!(
            text("source"),
            Some(format!("/outbox-relay/{db}/{}", row.table)),
            "{event}"
        );
        assert_eq!(text("type").as_deref(), Some("order.placed"), "{event}");
        assert_eq!(text("subject").as_deref(), Some(row.aggregate.as_str()), "{event}");
        assert_eq!(text("partitionkey").as_deref(), Some(row.aggregate.as_str()), "{event}");
        assert_eq!(
            event["time_ms"].as_i64(),
            Some(row.created_ms),
            "time is created_at: {event}"
        );
        assert_eq!(text("tenant"), row.tenant, "{event}");
        assert_eq!(text("traceparent"), row.traceparent, "{event}");
        assert_eq!(text("tracestate"), row.tracestate, "{event}");
        let binary = row.table == TABLES[1];
        if mode == "binary" {
            // Structured mode's datacontenttype the SDK takes from the record's content-type
            // header (the envelope's own is checked above).
            let expected = if binary {
                "application/octet-stream"
            } else {
                "application/json"
            };
            assert_eq!(text("datacontenttype").as_deref(), Some(expected), "{event}");
        }
        let data = &event["data"];
        if binary {
            assert_eq!(data["bytes_hex"].as_str(), Some(hex(&row.payload).as_str()), "{event}");
        } else if mode == "binary" {
            // The SDK's binary reader hands over the value's bytes as they are.
            assert_eq!(data["bytes_hex"].as_str(), Some(hex(&row.payload).as_str()), "{event}");
        } else {
            let inserted: serde_json::Value = serde_json::from_slice(&row.payload).unwrap();
            assert_eq!(data["json"], inserted, "JSON data inline: {event}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_reads_back_with_the_sdk() {
    cloudevents_round_trip("binary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_reads_back_with_the_sdk() {
    cloudevents_round_trip("structured").await;
}

/// The polling relayer reads the trace and extension columns too: each row's polled record is
/// the streamed one, header for header and byte for byte (binary mode, `time` from the timestamp
/// column in both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_polled_rows_give_the_streamed_records() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = database(&kafka.bootstrap_servers()).await;
    let mut extensions = toml::Table::new();
    extensions.insert("tenant".into(), toml::Value::String("tenant".into()));
    let config = config
        .set("cloudevents", "extensions", toml::Value::Table(extensions))
        .set("poll", "interval_ms", 20);
    setup(&config).await;
    let mut relay = RelayProcess::run_streaming(&config).await;
    let rows = insert_rows(&client).await;
    let streamed = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(streamed.len(), rows.len(), "{}", relay.log_text());
    assert!(relay.sigterm());
    assert!(
        relay.wait_exit(Duration::from_secs(30)).await.is_some(),
        "the relay stops"
    );

    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(
        out.status.success(),
        "setup --poll: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let poller = RelayProcess::poll(&config);
    let all = collect(&kafka.bootstrap_servers(), &["order"], 2 * rows.len(), WAIT).await;
    assert_eq!(all.len(), 2 * rows.len(), "{}", poller.log_text());
    for row in &rows {
        let both: Vec<&Received> = all
            .iter()
            .filter(|r| r.header("id") == Some(row.id.as_bytes()))
            .collect();
        assert_eq!(both.len(), 2, "row {} streamed once and polled once", row.id);
        assert_eq!(both[0].key, both[1].key);
        assert_eq!(both[0].payload, both[1].payload);
        assert_eq!(
            both[0].headers, both[1].headers,
            "row {}: the same headers in the same order",
            row.id
        );
        assert_eq!(both[0].header("ce_tenant"), row.tenant.as_deref().map(str::as_bytes));
        assert_eq!(
            both[0].header("ce_traceparent"),
            row.traceparent.as_deref().map(str::as_bytes)
        );
    }
}

/// NATS (structured mode, the only one its binding defines) and Redis (binary mode, the Kafka
/// binding's `ce_*` names as stream fields: Redis has no binding) carry the same CloudEvents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_on_nats_and_redis_read_back_with_the_sdk() {
    use crate::harness::nats::{NatsStream, SHARED_NATS};
    use crate::harness::redis::{read_streams_until, SHARED_REDIS};

    let mut extensions = toml::Table::new();
    extensions.insert("tenant".into(), toml::Value::String("tenant".into()));

    let stream = NatsStream::create(SHARED_NATS).await;
    // The Kafka address is a placeholder: `sink(…)` drops the [kafka] section.
    let (db, client, config) = database("127.0.0.1:1").await;
    let config = config
        .sink("nats", &stream.section())
        .route(PREFIX_REGEX, &format!("{}.${{routedByValue}}", stream.prefix))
        .set("cloudevents", "mode", "structured")
        .set("cloudevents", "extensions", toml::Value::Table(extensions.clone()));
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let rows = insert_rows(&client).await;
    let records = stream.collect(rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    assert!(records
        .iter()
        .all(|r| r.header("content-type") == Some(&b"application/cloudevents+json; charset=UTF-8"[..])));
    check_with_sdk("structured", &db, &rows, &records).await;
    drop(relay);
    stream.delete().await;

    let prefix = unique_name("ce");
    let (db, client, config) = database("127.0.0.1:1").await;
    let config = config
        .sink("redis", &[("url", SHARED_REDIS)])
        .route(PREFIX_REGEX, &format!("{prefix}.${{routedByValue}}"))
        .set("cloudevents", "mode", "binary")
        .set("cloudevents", "extensions", toml::Value::Table(extensions));
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let rows = insert_rows(&client).await;
    let records = read_streams_until(SHARED_REDIS, &[format!("{prefix}.order")], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    for record in &records {
        let row = rows
            .iter()
            .find(|r| Some(r.aggregate.as_str()) == record.key_str())
            .unwrap();
        assert_eq!(
            record.payload.as_deref(),
            Some(&row.payload[..]),
            "binary mode: the payload field is the payload"
        );
    }
    check_with_sdk("binary", &db, &rows, &records).await;
}

/// RabbitMQ, both modes (the AMQP protocol binding 1.0.2): binary mode's attributes are the
/// `cloudEvents:`-prefixed application properties (AMQP 0-9-1 headers, which RabbitMQ maps to
/// AMQP 1.0 application-properties) and `datacontenttype` the `content_type` property;
/// structured mode's `content_type` is the JSON event format's. The relay's own `id`/`key`
/// headers and `message_id` stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_on_rabbitmq_follow_the_amqp_binding_and_read_back_with_the_sdk() {
    use crate::harness::rabbitmq::{RabbitFixture, RABBITMQ_URL};

    let mut extensions = toml::Table::new();
    extensions.insert("tenant".into(), toml::Value::String("tenant".into()));
    for mode in ["binary", "structured"] {
        let fx = RabbitFixture::new(&["#"]).await;
        let (db, client, config) = database("127.0.0.1:1").await;
        let config = config
            .sink("rabbitmq", &[("url", RABBITMQ_URL), ("exchange", &fx.exchange)])
            .set("cloudevents", "mode", mode)
            .set("cloudevents", "extensions", toml::Value::Table(extensions.clone()));
        setup(&config).await;
        let relay = RelayProcess::run_streaming(&config).await;
        let rows = insert_rows(&client).await;
        let records = fx.collect(rows.len(), WAIT).await;
        assert_eq!(records.len(), rows.len(), "{mode}: {}", relay.log_text());
        for record in &records {
            let id = String::from_utf8_lossy(record.header("id").expect("the id header")).into_owned();
            let row = rows.iter().find(|r| r.id == id).expect("a record of an inserted row");
            assert_eq!(record.header("message_id"), Some(row.id.as_bytes()), "{mode}");
            assert_eq!(
                record.key.as_deref(),
                Some(row.aggregate.as_bytes()),
                "{mode}: the key header"
            );
            assert!(
                record.header("content-type").is_none() && !record.headers.iter().any(|(n, _)| n.starts_with("ce_")),
                "{mode}: no Kafka-binding names left: {:?}",
                record.headers
            );
            if mode == "binary" {
                let source = format!("/outbox-relay/{db}/{}", row.table);
                assert_eq!(
                    record.payload.as_deref(),
                    Some(&row.payload[..]),
                    "the body is the payload"
                );
                let content_type = if row.table == TABLES[1] {
                    "application/octet-stream"
                } else {
                    "application/json"
                };
                assert_eq!(record.header("content_type"), Some(content_type.as_bytes()));
                for (name, value) in [
                    ("cloudEvents:specversion", Some(&b"1.0"[..])),
                    ("cloudEvents:id", Some(row.id.as_bytes())),
                    ("cloudEvents:source", Some(source.as_bytes())),
                    ("cloudEvents:type", Some(&b"order.placed"[..])),
                    ("cloudEvents:subject", Some(row.aggregate.as_bytes())),
                    ("cloudEvents:tenant", row.tenant.as_deref().map(str::as_bytes)),
                    ("cloudEvents:traceparent", row.traceparent.as_deref().map(str::as_bytes)),
                    ("cloudEvents:tracestate", row.tracestate.as_deref().map(str::as_bytes)),
                    ("cloudEvents:datacontenttype", None),
                    ("traceparent", None),
                ] {
                    assert_eq!(record.header(name), value, "{name} of row {}", row.id);
                }
                assert!(record.header("cloudEvents:time").is_some(), "time from created_at");
            } else {
                assert_eq!(
                    record.header("content_type"),
                    Some(&b"application/cloudevents+json; charset=UTF-8"[..])
                );
                assert!(!record.headers.iter().any(|(n, _)| n.starts_with("cloudEvents:")));
                assert_eq!(
                    record.header("traceparent"),
                    row.traceparent.as_deref().map(str::as_bytes)
                );
            }
        }
        // The one-to-one renaming to the Kafka binding, so the SDK's reader checks the rest.
        let as_kafka: Vec<Received> = records
            .iter()
            .map(|r| Received {
                headers: r
                    .headers
                    .iter()
                    .filter_map(|(name, value)| {
                        let name = match (name.strip_prefix("cloudEvents:"), name.as_str()) {
                            (Some(attribute), _) => format!("ce_{attribute}"),
                            (None, "content_type") => "content-type".to_owned(),
                            (None, "id" | "key") => name.clone(),
                            (None, _) => return None,
                        };
                        Some((name, value.clone()))
                    })
                    .collect(),
                ..r.clone()
            })
            .collect();
        check_with_sdk(mode, &db, &rows, &as_kafka).await;
        drop(relay);
        fx.clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_off_traceparent_passes_through_and_invalid_ones_are_counted() {
    let kafka = MockKafka::new(1);
    let (_db, client, config) = database(&kafka.bootstrap_servers()).await;
    let (config, addr) = with_http(&config);
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let json = "'{}'::jsonb";
    let rows = vec![
        insert(&client, TABLES[0], "valid", json, None, Some(TRACEPARENT), Some("a=1")).await,
        insert(&client, TABLES[0], "invalid", json, None, Some("ff-zz"), None).await,
        insert(&client, TABLES[0], "null", json, None, None, Some("orphan=1")).await,
    ];
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    for row in &rows {
        let record = records
            .iter()
            .find(|r| r.key_str() == Some(row.aggregate.as_str()))
            .expect("every row published");
        assert_eq!(
            record.header("traceparent"),
            row.traceparent.as_deref().map(str::as_bytes),
            "{}: the value as written, valid or not; none for NULL",
            row.aggregate
        );
        // A tracestate travels only with its traceparent.
        let tracestate = row.traceparent.as_ref().and(row.tracestate.as_deref());
        assert_eq!(record.header("tracestate"), tracestate.map(str::as_bytes));
        assert!(record.header("ce_specversion").is_none(), "not a CloudEvent");
    }
    let counted = wait_until(Duration::from_secs(10), Duration::from_millis(200), || async {
        Metrics::scrape(&addr)
            .await
            .is_some_and(|m| m.value("outbox_relay_traceparent_invalid_total", &[]) == 1.0)
    })
    .await;
    assert!(
        counted,
        "one invalid traceparent counted: {:?}",
        Metrics::scrape(&addr).await
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads every record with the SDK (`from_binary` or `from_structured`): per record its
/// attributes, its data (`{"json": …}` or `{"bytes_hex": …}`) and `time` in Unix ms. `None`,
/// after `needs::missing` (a loud SKIPPING line; a failure under CI), when the SDK cannot be
/// installed.
const READER: &str = r#"
import json, sys
from datetime import datetime, timedelta, timezone
from cloudevents.kafka import KafkaMessage, from_binary, from_structured

request = json.load(sys.stdin)
out = []
for m in request["records"]:
    headers = {name: bytes.fromhex(v) for name, v in m["headers"]}
    key = bytes.fromhex(m["key"]) if m["key"] is not None else None
    message = KafkaMessage(headers, key, bytes.fromhex(m["value"]))
    if request["mode"] == "binary":
        event = from_binary(message, data_unmarshaller=lambda b: b)
    else:
        event = from_structured(message)
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in event.get_attributes().items()}
    data = event.get_data()
    data = {"bytes_hex": data.hex()} if isinstance(data, (bytes, bytearray)) else {"json": data}
    time_ms = None
    if attrs.get("time"):
        t = datetime.fromisoformat(attrs["time"].replace("Z", "+00:00"))
        time_ms = (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)
    out.append({"attributes": attrs, "data": data, "time_ms": time_ms})
json.dump(out, sys.stdout)
"#;

async fn read_with_sdk(mode: &str, records: &[Received]) -> Option<Vec<serde_json::Value>> {
    let python = sdk_python()?;
    let request = serde_json::json!({
        "mode": mode,
        "records": records.iter().map(|r| serde_json::json!({
            "headers": r.headers.iter().map(|(n, v)| (n.clone(), hex(v))).collect::<Vec<_>>(),
            "key": r.key.as_deref().map(hex),
            "value": hex(r.payload.as_deref().unwrap_or_default()),
        })).collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("read_cloudevents.py");
    std::fs::write(&script, READER).expect("write the reader");
    let out_path = dir.path().join("out.json");
    let err_path = dir.path().join("err.txt");
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run the SDK reader");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .expect("feed the reader");
    let status = wait_child(&mut child, Duration::from_secs(60)).await;
    if status.is_none() {
        let _ = child.kill();
    }
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "the CloudEvents SDK could not read the records ({status:?}): {stderr}"
    );
    let read: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&out_path).unwrap()).expect("the reader's JSON");
    assert_eq!(read.len(), records.len());
    Some(read)
}

/// The venv's python with `cloudevents` importable, installing it first if needed.
fn sdk_python() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let python = cache.join("outbox-relay/venv-cloudevents/bin/python");
    let usable = || {
        Command::new(&python)
            .args(["-c", "import cloudevents.kafka"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !usable() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install-cloudevents-sdk.sh");
        let _ = Command::new("bash").arg(script).status();
    }
    if usable() {
        Some(python)
    } else {
        crate::harness::needs::missing(
            crate::harness::needs::CLOUDEVENTS_SDK,
            "the CloudEvents SDK read-back",
            &format!(
                "{} cannot import cloudevents; the records were checked without the SDK only",
                python.display()
            ),
        );
        None
    }
}
