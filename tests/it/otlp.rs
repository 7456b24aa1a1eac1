//! `[tracing]` end to end: the relay streams an outbox table to the mock Kafka cluster and
//! exports one PRODUCER span per event over OTLP (HTTP/protobuf, and gRPC) to a test receiver
//! ([`crate::harness::otlp::Receiver`]). Checked: the
//! span's parent, ids, name, attributes and times against the row and its commit, and that the
//! record's `traceparent` names the relay's span; an unreachable collector leaves publishing
//! alone and is counted; `sampling_ratio = 0.0` without trace context exports nothing; `poll`
//! exports the same spans.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use tokio_postgres::Client;

use crate::harness::otlp::{hex, string_attr, Exported, Receiver};
use crate::harness::scrape::{with_http, Metrics};
use crate::harness::*;

const WAIT: Duration = Duration::from_secs(60);
const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const SCHEMA: &str = "
CREATE TABLE public.traced_outbox (
    id bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    traceparent text,
    tracestate text,
    dispatched_at timestamptz);
";

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A fresh database with [`SCHEMA`], routed to topic `order`; `trace_columns` maps the columns.
/// Spans are batched for 100 ms instead of the shipped second, so the tests wait less.
async fn database(bootstrap: &str, trace_columns: bool) -> (Client, RelayConfig) {
    let (client, config) = database_with_shipped_export(bootstrap, trace_columns).await;
    (client, config.set("tracing", "scheduled_delay_ms", 100i64))
}

/// [`database`] with the exporter's shipped batching (`scheduled_delay_ms` not set).
async fn database_with_shipped_export(bootstrap: &str, trace_columns: bool) -> (Client, RelayConfig) {
    let pg = shared_cluster().await;
    let db = unique_name("otlp");
    pg.create_database(&db).await;
    let client = pg.client(&db).await;
    client.batch_execute(SCHEMA).await.expect("schema");
    let mut config = RelayConfig::new(&pg.url(&db), bootstrap)
        .route(PREFIX_REGEX, "${routedByValue}")
        .set("outbox", "table", "public.traced_outbox");
    if trace_columns {
        config = config
            .set("outbox", "trace_column", "traceparent")
            .set("outbox", "tracestate_column", "tracestate");
    }
    (client, config)
}

/// An inserted row: its event id, and the host clock just before and after its COMMIT.
struct Committed {
    id: String,
    aggregate: &'static str,
    traceparent: Option<&'static str>,
    before: SystemTime,
    after: SystemTime,
}

async fn insert(
    client: &mut Client,
    aggregate: &'static str,
    traceparent: Option<&'static str>,
    tracestate: Option<&str>,
) -> Committed {
    let txn = client.transaction().await.expect("begin");
    let id: String = txn
        .query_one(
            "INSERT INTO public.traced_outbox (aggregate_id, type, payload, traceparent, tracestate) \
             VALUES ($1, 'order.placed', '{}'::jsonb, $2, $3) RETURNING id::text",
            &[&aggregate, &traceparent, &tracestate],
        )
        .await
        .expect("insert")
        .get(0);
    let before = SystemTime::now();
    txn.commit().await.expect("commit");
    let after = SystemTime::now();
    Committed {
        id,
        aggregate,
        traceparent,
        before,
        after,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_one_producer_span_per_event_child_of_the_row_and_named_in_the_header() {
    let kafka = MockKafka::new(1);
    let receiver = Receiver::start().await;
    let (mut client, config) = database(&kafka.bootstrap_servers(), true).await;
    let config = config.set("tracing", "otlp_endpoint", receiver.endpoint.clone());
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let rows = vec![
        insert(&mut client, "with-parent", Some(TRACEPARENT), Some("vendor=1")).await,
        insert(&mut client, "no-parent", None, None).await,
        insert(&mut client, "invalid", Some("ff-zz"), None).await,
    ];
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    let spans = receiver.wait_for(rows.len()).await;
    assert_eq!(
        spans.len(),
        rows.len(),
        "one span per event: {spans:#?}\n{}",
        relay.log_text()
    );
    // Let a late duplicate show up, if the relay sent one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.spans().len(), rows.len(), "exactly one span per event");

    let by_id: BTreeMap<String, &Exported> = spans
        .iter()
        .map(|r| (string_attr(&r.span.attributes, "messaging.message.id").unwrap(), r))
        .collect();
    for row in &rows {
        let received = by_id
            .get(&row.id)
            .unwrap_or_else(|| panic!("a span for event {}", row.id));
        let span = &received.span;
        let attr = |k: &str| string_attr(&span.attributes, k);
        assert_eq!(received.service.as_deref(), Some("outbox-relay"));
        assert_eq!(span.kind, SpanKind::Producer as i32, "{span:?}");
        assert_eq!(span.name, "send order");
        assert_eq!(attr("messaging.system").as_deref(), Some("kafka"));
        assert_eq!(attr("messaging.destination.name").as_deref(), Some("order"));
        assert_eq!(attr("messaging.operation.type").as_deref(), Some("send"));
        assert_eq!(attr("messaging.operation.name").as_deref(), Some("send"));
        assert_eq!(attr("messaging.kafka.message.key").as_deref(), Some(row.aggregate));
        // Started at the commit (PostgreSQL's clock is this host's), ended at the ack.
        let slack = 5_000_000; // 5 ms
        assert!(
            span.start_time_unix_nano + slack >= unix_nanos(row.before)
                && span.start_time_unix_nano <= unix_nanos(row.after) + slack,
            "{}: start {} not within the commit [{}, {}]",
            row.aggregate,
            span.start_time_unix_nano,
            unix_nanos(row.before),
            unix_nanos(row.after)
        );
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano, "{span:?}");

        let record = records
            .iter()
            .find(|r| r.key_str() == Some(row.aggregate))
            .expect("every row published");
        let header = record
            .header("traceparent")
            .map(|h| String::from_utf8_lossy(h).into_owned());
        let own = format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id));
        match row.aggregate {
            "with-parent" => {
                assert_eq!(hex(&span.trace_id), PARENT_TRACE, "the row's trace");
                assert_eq!(hex(&span.parent_span_id), PARENT_SPAN, "child of the row's span");
                assert_eq!(
                    header.as_deref(),
                    Some(own.as_str()),
                    "the header names the relay's span"
                );
                assert_eq!(
                    record.header("tracestate"),
                    Some(&b"vendor=1"[..]),
                    "tracestate as read"
                );
                assert_eq!(span.trace_state, "vendor=1");
            }
            "no-parent" => {
                assert!(span.parent_span_id.is_empty(), "a root span: {span:?}");
                assert_ne!(hex(&span.trace_id), PARENT_TRACE);
                assert_eq!(header.as_deref(), Some(own.as_str()), "a root gets a header naming it");
            }
            _ => {
                assert!(
                    span.parent_span_id.is_empty(),
                    "an invalid parent makes a root: {span:?}"
                );
                assert_eq!(header.as_deref(), row.traceparent, "an invalid value passes untouched");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_collector_down_publishing_goes_on_and_lost_spans_are_counted() {
    let kafka = MockKafka::new(1);
    let (mut client, config) = database(&kafka.bootstrap_servers(), true).await;
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let config = config
        .set("tracing", "otlp_endpoint", nobody)
        .set("tracing", "export_timeout_ms", 1000i64);
    let (config, addr) = with_http(&config);
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let mut rows = Vec::new();
    for i in 0..20 {
        let aggregate: &'static str = Box::leak(format!("agg-{i}").into_boxed_str());
        let tp = if i % 2 == 0 { Some(TRACEPARENT) } else { None };
        rows.push(insert(&mut client, aggregate, tp, None).await);
    }
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "every event delivered: {}", relay.log_text());
    let counted = wait_until(Duration::from_secs(20), Duration::from_millis(200), || async {
        Metrics::scrape(&addr).await.is_some_and(|m| {
            m.value("outbox_relay_span_export_errors_total", &[]) >= 1.0
                && m.sum("outbox_relay_spans_dropped_total") >= 1.0
        })
    })
    .await;
    let metrics = Metrics::scrape(&addr).await;
    assert!(counted, "export errors and dropped spans counted: {metrics:?}");
    let metrics = metrics.unwrap();
    assert_eq!(metrics.value("outbox_relay_spans_exported_total", &[]), 0.0);
    assert!(
        metrics.value("outbox_relay_spans_dropped_total", &[("reason", "export_failed")]) >= 1.0,
        "{metrics:?}"
    );
    assert!(
        relay.wait_for_log("OTLP export failed", Duration::from_secs(5)).await,
        "one warning: {}",
        relay.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_sampling_ratio_zero_without_trace_context_exports_nothing() {
    let kafka = MockKafka::new(1);
    let receiver = Receiver::start().await;
    let (mut client, config) = database(&kafka.bootstrap_servers(), false).await;
    let config =
        config
            .set("tracing", "otlp_endpoint", receiver.endpoint.clone())
            .set("tracing", "sampling_ratio", 0.0);
    let (config, addr) = with_http(&config);
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let mut rows = Vec::new();
    for aggregate in ["a", "b", "c"] {
        rows.push(insert(&mut client, aggregate, None, None).await);
    }
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    assert!(
        records.iter().all(|r| r.header("traceparent").is_none()),
        "an unsampled root is sent as read"
    );
    // Several scheduled delays (100 ms) after the acks: anything queued would be out by now.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(receiver.spans().is_empty(), "{:?}", receiver.spans());
    let metrics = Metrics::scrape(&addr).await.expect("metrics");
    assert_eq!(metrics.value("outbox_relay_spans_exported_total", &[]), 0.0);
    assert_eq!(metrics.sum("outbox_relay_spans_dropped_total"), 0.0);
}

/// `outbox-relay poll` exports the same spans, started at the row's timestamp column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_polled_rows_get_producer_spans_from_their_timestamp() {
    let kafka = MockKafka::new(1);
    let receiver = Receiver::start().await;
    let (client, config) = database(&kafka.bootstrap_servers(), true).await;
    let config = config
        .set("tracing", "otlp_endpoint", receiver.endpoint.clone())
        .set("poll", "interval_ms", 20i64);
    let out = run_cmd(&["setup", "--poll"], &config).await;
    assert!(
        out.status.success(),
        "setup --poll: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut created = BTreeMap::new();
    for (aggregate, tp) in [("with-parent", Some(TRACEPARENT)), ("no-parent", None)] {
        let row = client
            .query_one(
                "INSERT INTO public.traced_outbox (aggregate_id, type, payload, traceparent) \
                 VALUES ($1, 'order.placed', '{}'::jsonb, $2) \
                 RETURNING id::text, floor(extract(epoch FROM created_at) * 1000)::bigint",
                &[&aggregate, &tp],
            )
            .await
            .expect("insert");
        created.insert(row.get::<_, String>(0), (aggregate, row.get::<_, i64>(1)));
    }
    let poller = RelayProcess::poll(&config);
    let records = collect(&kafka.bootstrap_servers(), &["order"], created.len(), WAIT).await;
    assert_eq!(records.len(), created.len(), "{}", poller.log_text());
    let spans = receiver.wait_for(created.len()).await;
    assert_eq!(spans.len(), created.len(), "{spans:#?}\n{}", poller.log_text());
    for exported in &spans {
        let span = &exported.span;
        let id = string_attr(&span.attributes, "messaging.message.id").expect("message id");
        let (aggregate, created_ms) = created[&id];
        assert_eq!(
            (span.kind, span.name.as_str()),
            (SpanKind::Producer as i32, "send order")
        );
        assert_eq!(
            span.start_time_unix_nano,
            created_ms as u64 * 1_000_000,
            "{aggregate}: the row's timestamp"
        );
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
        let record = records.iter().find(|r| r.key_str() == Some(aggregate)).unwrap();
        let own = format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id));
        assert_eq!(record.header("traceparent"), Some(own.as_bytes()), "{aggregate}");
        if aggregate == "with-parent" {
            assert_eq!(
                (hex(&span.trace_id), hex(&span.parent_span_id)),
                (PARENT_TRACE.to_owned(), PARENT_SPAN.to_owned())
            );
        } else {
            assert!(span.parent_span_id.is_empty());
        }
    }
}

/// `protocol = "grpc"`: the same spans reach a gRPC collector (the OTLP `TraceService`), with
/// the exporter's shipped batching — what users get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_over_grpc_exports_the_same_spans() {
    let kafka = MockKafka::new(1);
    let receiver = Receiver::start_grpc().await;
    let (mut client, config) = database_with_shipped_export(&kafka.bootstrap_servers(), true).await;
    let config = config
        .set("tracing", "protocol", "grpc")
        .set("tracing", "otlp_endpoint", receiver.endpoint.clone());
    setup(&config).await;
    let relay = RelayProcess::run_streaming(&config).await;
    let rows = vec![
        insert(&mut client, "with-parent", Some(TRACEPARENT), None).await,
        insert(&mut client, "no-parent", None, None).await,
    ];
    let records = collect(&kafka.bootstrap_servers(), &["order"], rows.len(), WAIT).await;
    assert_eq!(records.len(), rows.len(), "{}", relay.log_text());
    let spans = receiver.wait_for(rows.len()).await;
    assert_eq!(spans.len(), rows.len(), "{spans:#?}\n{}", relay.log_text());
    for row in &rows {
        let received = spans
            .iter()
            .find(|e| string_attr(&e.span.attributes, "messaging.message.id").as_deref() == Some(row.id.as_str()))
            .unwrap_or_else(|| panic!("a span for event {}", row.id));
        let span = &received.span;
        assert_eq!(received.service.as_deref(), Some("outbox-relay"));
        assert_eq!(
            (span.kind, span.name.as_str()),
            (SpanKind::Producer as i32, "send order")
        );
        let record = records.iter().find(|r| r.key_str() == Some(row.aggregate)).unwrap();
        let own = format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id));
        assert_eq!(record.header("traceparent"), Some(own.as_bytes()), "{}", row.aggregate);
        if row.traceparent.is_some() {
            assert_eq!(
                (hex(&span.trace_id), hex(&span.parent_span_id)),
                (PARENT_TRACE.to_owned(), PARENT_SPAN.to_owned())
            );
        } else {
            assert!(span.parent_span_id.is_empty(), "a root span: {span:?}");
        }
    }
    drop(relay);
}
