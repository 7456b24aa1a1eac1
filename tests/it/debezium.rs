//! Conformance with Debezium 3.6 + Kafka Connect: the same outbox rows through Debezium (its
//! PostgreSQL connector, the Outbox EventRouter and Connect's converters, `harness::debezium`)
//! and through the relay with the same options in `[debezium]`, compared byte for byte: topic,
//! key, value, partition and headers (Debezium's own `__debezium.context.*` headers aside).
//!
//! Each variant is one combination of converters and EventRouter options over one payload column
//! (`jsonb`, `json`, `text`, `bytea`). Where Debezium's Connect task would stop on a row (an
//! expansion it cannot build), the relay treats the row as a bad event: with
//! `relay.on_bad_event = "skip"` here, it must not publish it. Skipped loudly without Java or
//! the jars (`scripts/install-debezium.sh`).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::Client;

use crate::harness::{
    confirmed_flush_lsn, current_wal_lsn, setup, shared_cluster, shared_kafka, unique_name, wait_until, Debezium,
    DebeziumRecord, Received, RelayConfig, RelayProcess,
};

const JSON: &str = "org.apache.kafka.connect.json.JsonConverter";
const STRING: &str = "org.apache.kafka.connect.storage.StringConverter";
const BINARY: &str = "io.debezium.converters.BinaryDataConverter";
const BYTE_ARRAY: &str = "org.apache.kafka.connect.converters.ByteArrayConverter";
/// The harness's real broker auto-creates topics with 4 partitions (as the mock cluster did);
/// Debezium's partition is computed for that.
const PARTITIONS: i32 = 4;
const TOPIC_PREFIX: &str = "conformance";
const PLACEMENTS: &str = "type:header:eventType,tenant:header,aggregatetype:envelope:atype,shard:partition";

const TABLE: &str = "CREATE TABLE public.outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    payload_json json,
    payload_text text,
    payload_bytes bytea,
    shard integer,
    tenant text
)";

/// One outbox row: the same content in every payload column that can hold it.
struct Row {
    aggregate_type: &'static str,
    aggregate_id: &'static str,
    /// `payload` (jsonb) and `payload_json` (json); `None` = NULL.
    json: Option<String>,
    /// `payload_text`; `None` = NULL.
    text: Option<String>,
    /// `payload_bytes`; `None` = NULL.
    bytes: Option<Vec<u8>>,
    shard: Option<i32>,
    tenant: Option<&'static str>,
}

fn json_row(i: usize, json: &str) -> Row {
    let aggregate_types = ["order", "customer", "Order.Events"];
    let aggregate_ids = ["a-1", "a-2", "ä-3", "aggregate with spaces"];
    let mut bytes = json.as_bytes().to_vec();
    // Binary content: bytes no text encoding would produce.
    bytes.extend_from_slice(&[0x00, 0xff, 0x10, i as u8]);
    Row {
        aggregate_type: aggregate_types[i % aggregate_types.len()],
        aggregate_id: aggregate_ids[i % aggregate_ids.len()],
        json: Some(json.to_owned()),
        text: Some(json.to_owned()),
        bytes: Some(bytes),
        shard: (i % 5 != 4).then_some((i % 4) as i32),
        tenant: (i % 3 != 2).then_some("tenant-ü"),
    }
}

/// Payloads covering key order, whitespace, numbers, unicode, escapes, nesting, large values,
/// nulls, arrays and what Debezium's expansion keeps or fails on; then NULL and empty payloads.
fn rows() -> Vec<Row> {
    let deep = format!("{}1{}", "{\"d\": ".repeat(40), "}".repeat(40));
    let large = format!("{{\"blob\": \"{}\", \"n\": 1}}", "x".repeat(100_000));
    let payloads: Vec<String> = [
        r#"{"b": 1, "a": 2, "c": {"z": 1, "y": 2}}"#,
        r#"{ "spaced" :  [ 1 , 2 ] ,"x":"y" }"#,
        r#"{"i": 2147483647, "j": -2147483648, "l": 2147483648, "min": -9223372036854775808}"#,
        r#"{"pi": 3.14159265358979323846264338327950288, "tiny": 0.00000000025, "e": 1E2, "z": 0.0, "half": 0.5, "k": 1234567.0, "m": 12345678.9}"#,
        r#"{"big": 12345678901234567890123}"#,
        r#"{"huge": 1.5e300}"#,
        r#"{"u": "é ü 漢字 😀 \u00e9 \ud83d\ude00", "ünïcödé kéy": 1}"#,
        r#"{"esc": "line\nbreak\ttab \"quoted\" back\\slash \/ \u0001 \u001f \u007f"}"#,
        r#"{"order": {"id": 7, "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2, "note": "gift"}], "meta": {"tags": ["x", "y"], "empty": {}}}}"#,
        r#"{"a": null, "b": [1, null, 3], "c": {"d": null}}"#,
        r#"{"list": [], "n": 1}"#,
        r#"{"mixed": [1, "two"]}"#,
        r#"{"nums": [1, 2.5]}"#,
        r#"{"onlynull": [null, null]}"#,
        r#"{"xs": [{"v": 1}, {"v": "s"}]}"#,
        r#"{"nested": [[1, 2], [3]]}"#,
        r#"[1, 2, 3]"#,
        r#"[]"#,
        r#""just a string""#,
        r#"42"#,
        r#"true"#,
        r#"null"#,
        r#"{}"#,
        r#"{"a": 1, "b": 2, "a": 3}"#,
        r#"{"": 1}"#,
        r#"{"a-b": 1, "1x": 2, "with space": 3, "t": true, "f": false}"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([deep, large])
    .collect();
    let mut rows: Vec<Row> = payloads.iter().enumerate().map(|(i, p)| json_row(i, p)).collect();
    let blank = |text: &str, bytes: Vec<u8>| Row {
        aggregate_type: "order",
        aggregate_id: "a-1",
        json: None,
        text: Some(text.to_owned()),
        bytes: Some(bytes),
        shard: Some(1),
        tenant: None,
    };
    rows.push(Row {
        text: None,
        bytes: None,
        ..blank("", Vec::new())
    });
    rows.push(blank("", Vec::new()));
    rows.push(blank(" \t ", vec![0x20]));
    rows
}

/// A Debezium configuration: converters and EventRouter options by their own names (the relay
/// gets them verbatim in `[debezium]`), over one payload column.
struct Variant {
    name: &'static str,
    payload_column: &'static str,
    options: &'static [(&'static str, &'static str)],
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "string",
        payload_column: "payload",
        options: &[("key.converter", STRING), ("value.converter", STRING)],
    },
    Variant {
        name: "string-text",
        payload_column: "payload_text",
        options: &[("key.converter", STRING), ("value.converter", STRING)],
    },
    Variant {
        name: "json",
        payload_column: "payload",
        options: &[
            ("key.converter", JSON),
            ("key.converter.schemas.enable", "false"),
            ("value.converter", JSON),
            ("value.converter.schemas.enable", "false"),
        ],
    },
    Variant {
        name: "json-schemas",
        payload_column: "payload",
        options: &[("key.converter", JSON), ("value.converter", JSON)],
    },
    Variant {
        name: "json-text-schemas",
        payload_column: "payload_text",
        options: &[("key.converter", JSON), ("value.converter", JSON)],
    },
    Variant {
        name: "json-expand",
        payload_column: "payload",
        options: &[
            ("key.converter", STRING),
            ("value.converter", JSON),
            ("value.converter.schemas.enable", "false"),
            ("table.expand.json.payload", "true"),
        ],
    },
    Variant {
        name: "json-expand-schemas",
        payload_column: "payload",
        options: &[
            ("key.converter", JSON),
            ("value.converter", JSON),
            ("table.expand.json.payload", "true"),
        ],
    },
    Variant {
        name: "json-expand-json-column",
        payload_column: "payload_json",
        options: &[
            ("key.converter", JSON),
            ("key.converter.schemas.enable", "false"),
            ("value.converter", JSON),
            ("value.converter.schemas.enable", "false"),
            ("table.expand.json.payload", "true"),
        ],
    },
    Variant {
        name: "json-expand-optional-bytes",
        payload_column: "payload",
        options: &[
            ("value.converter", JSON),
            ("table.expand.json.payload", "true"),
            ("table.json.payload.null.behavior", "optional_bytes"),
        ],
    },
    Variant {
        name: "binary",
        payload_column: "payload_bytes",
        options: &[("key.converter", STRING), ("value.converter", BINARY)],
    },
    Variant {
        name: "byte-array",
        payload_column: "payload_bytes",
        options: &[("key.converter", STRING), ("value.converter", BYTE_ARRAY)],
    },
    Variant {
        name: "bytes-json-schemas",
        payload_column: "payload_bytes",
        options: &[("key.converter", STRING), ("value.converter", JSON)],
    },
    Variant {
        name: "placements-schemas",
        payload_column: "payload",
        options: &[
            ("key.converter", JSON),
            ("value.converter", JSON),
            ("table.fields.additional.placement", PLACEMENTS),
            ("topic.prefix", TOPIC_PREFIX),
        ],
    },
    Variant {
        name: "placements",
        payload_column: "payload_text",
        options: &[
            ("key.converter", STRING),
            ("value.converter", JSON),
            ("value.converter.schemas.enable", "false"),
            ("table.fields.additional.placement", PLACEMENTS),
        ],
    },
    Variant {
        name: "placements-expand",
        payload_column: "payload",
        options: &[
            ("key.converter", STRING),
            ("value.converter", JSON),
            ("table.expand.json.payload", "true"),
            (
                "table.fields.additional.placement",
                "type:header:eventType,aggregatetype:envelope:atype",
            ),
            ("topic.prefix", TOPIC_PREFIX),
        ],
    },
    Variant {
        name: "tombstones-string",
        payload_column: "payload_text",
        options: &[
            ("key.converter", STRING),
            ("value.converter", STRING),
            ("route.tombstone.on.empty.payload", "true"),
        ],
    },
    Variant {
        name: "tombstones-json",
        payload_column: "payload",
        options: &[
            ("key.converter", JSON),
            ("value.converter", JSON),
            ("value.converter.schemas.enable", "false"),
            ("route.tombstone.on.empty.payload", "true"),
        ],
    },
];

/// EventRouter options of a variant (the converters and `topic.prefix` are not the router's).
fn is_router_option(key: &str) -> bool {
    !key.contains("converter") && key != "topic.prefix"
}

fn spec(db: &str, port: u16, records: usize) -> serde_json::Value {
    let variants: Vec<serde_json::Value> = VARIANTS
        .iter()
        .map(|v| {
            let mut smt = serde_json::Map::new();
            for (k, val) in [
                ("table.field.event.id", "id"),
                ("table.field.event.key", "aggregateid"),
                ("route.by.field", "aggregatetype"),
                ("table.field.event.payload", v.payload_column),
            ] {
                smt.insert(k.into(), val.into());
            }
            let mut converters = serde_json::Map::new();
            for (k, val) in v.options {
                if is_router_option(k) {
                    smt.insert((*k).into(), (*val).into());
                } else if k.contains("converter") {
                    converters.insert((*k).into(), (*val).into());
                }
            }
            serde_json::json!({"name": v.name, "smt": smt, "converters": converters})
        })
        .collect();
    serde_json::json!({
        "connector": {
            "database.hostname": "127.0.0.1",
            "database.port": port.to_string(),
            "database.user": "postgres",
            "database.password": "unused",
            "database.dbname": db,
            "slot.name": unique_name("dbz"),
            "publication.name": unique_name("dbz_pub"),
            "publication.autocreate.mode": "filtered",
            "table.include.list": "public.outbox",
            "topic.prefix": TOPIC_PREFIX,
        },
        "records": records,
        "partitions": PARTITIONS,
        "variants": variants,
    })
}

fn relay_config(url: &str, bootstrap: &str, v: &Variant) -> RelayConfig {
    let mut c = RelayConfig::new(url, bootstrap).route("(?<routedByValue>.*)", "outbox.event.${routedByValue}");
    c.table = "public.outbox".into();
    c.key_column = "aggregateid".into();
    c.route_by_column = "aggregatetype".into();
    c.payload_column = v.payload_column.into();
    c.timestamp_column = None;
    let mut c = c.set("relay", "on_bad_event", "skip");
    for (k, val) in v.options {
        let value = match *val {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            other => toml::Value::String(other.into()),
        };
        c = c.set("debezium", k, value);
    }
    c
}

/// Inserts the rows, a few per transaction, and returns their ids in commit order.
async fn insert(client: &Client, rows: &[Row]) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in rows.chunks(4) {
        client.batch_execute("BEGIN").await.expect("begin");
        for r in chunk {
            let row = client
                .query_one(
                    "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, payload_json, \
                       payload_text, payload_bytes, shard, tenant) \
                     VALUES (gen_random_uuid(), $1, $2, 'created', $3::text::jsonb, $3::text::json, $4, $5, $6, $7) \
                     RETURNING id::text",
                    &[
                        &r.aggregate_type,
                        &r.aggregate_id,
                        &r.json,
                        &r.text,
                        &r.bytes,
                        &r.shard,
                        &r.tenant,
                    ],
                )
                .await
                .expect("insert outbox row");
            ids.push(row.get::<_, String>(0));
        }
        client.batch_execute("COMMIT").await.expect("commit");
    }
    ids
}

fn show(bytes: &Option<Vec<u8>>) -> String {
    match bytes {
        None => "null".into(),
        Some(b) if b.len() > 300 => format!("{}… ({} bytes)", String::from_utf8_lossy(&b[..300]), b.len()),
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
    }
}

/// Where two byte strings first differ, with context, for a failure message.
fn first_difference(a: &Option<Vec<u8>>, b: &Option<Vec<u8>>) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return format!("relay {}, debezium {}", show(a), show(b));
    };
    let at = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(120);
    let window = |s: &[u8]| String::from_utf8_lossy(&s[from.min(s.len())..(at + 120).min(s.len())]).into_owned();
    format!(
        "first difference at byte {at} (lengths {} / {}):\n relay:    …{}…\n debezium: …{}…",
        a.len(),
        b.len(),
        window(a),
        window(b)
    )
}

/// Compares one variant's records; returns (identical, rows Debezium fails on).
fn compare(v: &Variant, ids: &[String], expected: &[&DebeziumRecord], got: &[Received]) -> (usize, usize) {
    let by_id: BTreeMap<&[u8], Vec<&Received>> = got.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r.header("id").unwrap_or_default()).or_default().push(r);
        m
    });
    let (mut identical, mut fails) = (0, 0);
    for want in expected {
        let id = ids[want.seq].as_bytes();
        let relay = by_id.get(id).map(Vec::as_slice).unwrap_or_default();
        if let Some(error) = &want.error {
            assert!(
                relay.is_empty(),
                "[{}] row {} ({}): Debezium's task stops on it ({error}); the relay must treat it as a bad event, \
                 but published {:?}",
                v.name,
                want.seq,
                ids[want.seq],
                relay.iter().map(|r| show(&r.payload)).collect::<Vec<_>>()
            );
            fails += 1;
            continue;
        }
        assert_eq!(
            relay.len(),
            1,
            "[{}] row {} ({}): relay records {relay:?}",
            v.name,
            want.seq,
            ids[want.seq]
        );
        let r = relay[0];
        let ctx = format!("[{}] row {} ({})", v.name, want.seq, ids[want.seq]);
        assert_eq!(Some(&r.topic), want.topic.as_ref(), "{ctx}: topic");
        assert!(r.key == want.key, "{ctx}: key {}", first_difference(&r.key, &want.key));
        assert!(
            r.payload == want.value,
            "{ctx}: value {}",
            first_difference(&r.payload, &want.value)
        );
        assert_eq!(Some(r.partition), want.partition, "{ctx}: partition");
        let want_headers: Vec<(String, Vec<u8>)> = want
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
            .collect();
        assert_eq!(r.headers, want_headers, "{ctx}: headers");
        identical += 1;
    }
    (identical, fails)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_byte_identical_to_debezium_for_every_supported_combination() {
    let Some(debezium) = Debezium::get() else { return };
    let pg = shared_cluster().await;
    let db = unique_name("dbz_conf");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(TABLE).await.expect("create outbox");

    // Every relay variant's slot exists before the rows are written, like Debezium's.
    let url = pg.url(&db);
    let configs: Vec<RelayConfig> = VARIANTS.iter().map(|v| relay_config(&url, "127.0.0.1:9", v)).collect();
    for c in &configs {
        setup(c).await;
    }
    let rows = rows();
    let run = debezium
        .start(&spec(&db, pg.port(), rows.len()), Duration::from_secs(90))
        .await;
    let ids = insert(&client, &rows).await;
    let records = run.finish(Duration::from_secs(90)).await;
    assert_eq!(
        records.len(),
        rows.len() * VARIANTS.len(),
        "one record per row and variant"
    );

    let mut summary = Vec::new();
    for (v, config) in VARIANTS.iter().zip(configs) {
        let expected: Vec<&DebeziumRecord> = records.iter().filter(|r| r.variant == v.name).collect();
        let publishable = expected.iter().filter(|r| r.error.is_none()).count();
        let Some(kafka) = shared_kafka().await else { return };
        let config = config.on_kafka(&kafka);
        let relay = RelayProcess::run(&config);
        let got = kafka
            .collect_matching("^outbox\\.event\\.", publishable, Duration::from_secs(30))
            .await;
        drop(relay);
        let (identical, fails) = compare(v, &ids, &expected, &got);
        assert_eq!(
            got.len(),
            identical,
            "[{}] the relay published records Debezium has no match for",
            v.name
        );
        summary.push(format!(
            "{:<28} {identical:>3} identical, {fails:>2} rows Debezium's task stops on (bad events for the relay)",
            v.name
        ));
    }
    eprintln!(
        "Debezium 3.6 conformance, {} rows:\n  {}",
        rows.len(),
        summary.join("\n  ")
    );
    // 18 slots: give them back to the shared cluster.
    drop(client);
    pg.drop_database(&db).await;
}

/// `[debezium]` renders rows the same in every mode: the records `poll` publishes for rows are
/// byte for byte the ones `run` publishes for the same rows (same key, value, headers,
/// partition), with expansion, an envelope, header and partition placements and a NULL payload.
/// Needs no Debezium: the streaming side is checked against Debezium above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_writes_the_same_debezium_records_as_run() {
    let pg = shared_cluster().await;
    let db = unique_name("dbz_poll");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(TABLE).await.expect("create outbox");
    client
        .batch_execute(
            // clock_timestamp(): the poller claims in created_at order, which must be the commit
            // order here (Debezium names an envelope schema after the first event of a shape).
            "ALTER TABLE public.outbox ADD COLUMN created_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
             ADD COLUMN dispatched_at timestamptz",
        )
        .await
        .expect("poll columns");
    let variant = Variant {
        name: "poll-and-run",
        payload_column: "payload",
        options: &[
            ("key.converter", STRING),
            ("value.converter", JSON),
            ("table.expand.json.payload", "true"),
            ("table.fields.additional.placement", PLACEMENTS),
            ("topic.prefix", TOPIC_PREFIX),
        ],
    };
    let url = pg.url(&db);
    let Some(streamed_kafka) = shared_kafka().await else {
        return;
    };
    let streamed = relay_config(&url, &streamed_kafka.bootstrap_servers(), &variant).on_kafka(&streamed_kafka);
    setup(&streamed).await;
    // `poll` stops on a bad event (it never skips), so leave out the rows Debezium's expansion
    // fails on, `[]` included (no envelope around a dropped schema); the streaming side of those
    // is checked against Debezium above.
    let debezium_fails = ["\"big\"", "\"huge\"", "\"xs\"", "[1, 2, 3]"];
    let rows: Vec<Row> = rows()
        .into_iter()
        .filter(|r| {
            r.json
                .as_deref()
                .is_none_or(|j| j != "[]" && !debezium_fails.iter().any(|f| j.contains(f)))
        })
        .collect();
    let ids = insert(&client, &rows).await;

    let relay = RelayProcess::run(&streamed);
    // Everything is decided once the slot confirmed the end of the WAL: then read what came.
    let end = current_wal_lsn(&client).await;
    let confirmed = wait_until(Duration::from_secs(30), Duration::from_millis(100), || async {
        confirmed_flush_lsn(&client, &streamed.slot)
            .await
            .is_some_and(|l| l >= end)
    })
    .await;
    assert!(confirmed, "the relay did not confirm the rows: {}", relay.log_text());
    let from_run = streamed_kafka
        .collect_matching("^outbox\\.event\\.", ids.len(), Duration::from_secs(5))
        .await;
    drop(relay);

    let Some(polled_kafka) = shared_kafka().await else {
        return;
    };
    let mut polled = relay_config(&url, &polled_kafka.bootstrap_servers(), &variant)
        .on_kafka(&polled_kafka)
        .set("relay", "on_bad_event", "fail")
        .set("poll", "dispatched_column", "dispatched_at")
        .set("poll", "interval_ms", 20);
    polled.timestamp_column = None;
    let out = crate::harness::run_cmd(&["setup", "--poll"], &polled).await;
    assert!(
        out.status.success(),
        "setup --poll: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let poller = RelayProcess::poll(&polled);
    let from_poll = polled_kafka
        .collect_matching("^outbox\\.event\\.", from_run.len(), Duration::from_secs(30))
        .await;
    let poll_log = poller.log_text();
    drop(poller);

    // The same records: polled rows come in created_at order, so compare by id.
    // Offsets and produce timestamps differ by nature; everything else must not.
    let by_id = |records: &[Received]| -> BTreeMap<Vec<u8>, Received> {
        records
            .iter()
            .map(|r| {
                let id = r.header("id").unwrap_or_default().to_vec();
                (
                    id,
                    Received {
                        offset: 0,
                        timestamp_ms: None,
                        ..r.clone()
                    },
                )
            })
            .collect()
    };
    assert_eq!(from_run.len(), ids.len(), "run published every row");
    assert_eq!(
        from_poll.len(),
        from_run.len(),
        "poll and run publish the same rows (the rest are bad events); poll's log:\n{poll_log}"
    );
    let (polled, streamed) = (by_id(&from_poll), by_id(&from_run));
    for (id, want) in &streamed {
        let got = polled
            .get(id)
            .unwrap_or_else(|| panic!("poll did not publish {}", String::from_utf8_lossy(id)));
        assert!(
            got == want,
            "{}: poll {:?} {}\n vs run {:?} {}",
            String::from_utf8_lossy(id),
            (&got.topic, got.partition, &got.headers),
            first_difference(&got.payload, &want.payload),
            (&want.topic, want.partition, &want.headers),
            show(&want.key)
        );
    }
    drop(client);
    pg.drop_database(&db).await;
}
