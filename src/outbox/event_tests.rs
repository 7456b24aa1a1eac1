//! [`OutboxEvent`] from every source, and its record.

use std::borrow::Cow;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::config::Settings;
use crate::outbox::layout::OutboxLayout;
use crate::postgres::pgoutput::{ColumnValue, Relation, RelationColumn, TupleData};

fn settings(extra: &str) -> Settings {
    let text = format!(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1/app\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n{extra}"
    );
    Settings::from_toml_str(&text, Path::new("t.toml"), std::iter::empty()).unwrap()
}

/// A timestamp column, two header columns and a prefix-routing rule.
const FULL: &str =
    "[outbox]\ntimestamp_column = \"created_at\"\nheader_columns = { a_col = \"x-a\", b_col = \"x-b\" }\n\
                    [route]\ntopic_regex = '^(?<routedByValue>[^.]+)\\..*$'\n";

fn relation(names: &[&str]) -> Relation {
    Relation {
        oid: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: names
            .iter()
            .map(|n| RelationColumn {
                flags: 0,
                name: (*n).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn tuple(values: &[Option<&str>]) -> TupleData {
    TupleData {
        columns: values
            .iter()
            .map(|v| {
                v.map_or(ColumnValue::Null, |t| {
                    ColumnValue::Text(Bytes::copy_from_slice(t.as_bytes()))
                })
            })
            .collect(),
    }
}

/// The outbox table as pgoutput describes it: the mapped columns in another order than the
/// mapping's, and an unmapped one in between.
const TABLE: [&str; 8] = [
    "b_col",
    "payload",
    "note",
    "id",
    "type",
    "created_at",
    "aggregate_id",
    "a_col",
];

/// The same row as [`TABLE`]'s tuple and as mapped columns in `OutboxMapping::columns` order.
struct Row<'a> {
    id: &'a str,
    key: &'a str,
    route: &'a str,
    payload: &'a str,
    created_at: Option<&'a str>,
    a: Option<&'a str>,
    b: Option<&'a str>,
}

impl<'a> Row<'a> {
    fn streamed(&self) -> TupleData {
        tuple(&[
            self.b,
            Some(self.payload),
            Some("unmapped"),
            Some(self.id),
            Some(self.route),
            self.created_at,
            Some(self.key),
            self.a,
        ])
    }

    fn columns(&self) -> Vec<Option<&'a str>> {
        vec![
            Some(self.id),
            Some(self.key),
            Some(self.route),
            Some(self.payload),
            self.created_at,
            self.a,
            self.b,
        ]
    }
}

const ROW: Row<'static> = Row {
    id: "42",
    key: "agg-1",
    route: "order.placed",
    payload: "{\"a\": 1}",
    created_at: Some("1970-01-01 00:00:01.5+00"),
    a: None,
    b: Some("v"),
};

#[test]
fn maps_columns_like_the_streaming_path() {
    let s = settings(FULL);
    let values = ROW.columns();
    let event = OutboxEvent::from_columns(&s.outbox, &values).unwrap();
    let record = event.record(&s.router).unwrap();
    assert_eq!(record.topic, "order");
    assert_eq!(record.event_id, b"42");
    assert_eq!(record.key, b"agg-1");
    assert_eq!(record.payload, b"{\"a\": 1}");
    assert_eq!(record.timestamp_ms, Some(1500));
    // BTreeMap order of the header columns, as the streaming path uses.
    assert_eq!(
        record.headers.as_ref(),
        [
            (Cow::Borrowed("x-a"), None),
            (Cow::Borrowed("x-b"), Some(Cow::Borrowed(&b"v"[..])))
        ]
    );
}

#[test]
fn every_source_gives_the_same_record_for_the_same_content() {
    let s = settings(FULL);
    let layout = OutboxLayout::resolve(&s.outbox, &relation(&TABLE)).unwrap();
    let streamed = ROW.streamed();
    let from_wal = layout.extract(&relation(&TABLE), &streamed).unwrap();
    // The poller's claim borrows from the query's row; the backfill reads owned strings.
    let polled_values = ROW.columns();
    let polled = OutboxEvent::from_columns(&s.outbox, &polled_values).unwrap();
    let pending: Vec<Option<String>> = ROW.columns().iter().map(|v| v.map(str::to_owned)).collect();
    let pending_values: Vec<Option<&str>> = pending.iter().map(Option::as_deref).collect();
    let backfilled = OutboxEvent::from_columns(&s.outbox, &pending_values).unwrap();
    assert_eq!(from_wal, polled);
    assert_eq!(from_wal, backfilled);
    let record = from_wal.record(&s.router).unwrap();
    assert_eq!(record, polled.record(&s.router).unwrap());
    assert_eq!(record, backfilled.record(&s.router).unwrap());
    assert_eq!(record, from_wal.clone().into_owned().record(&s.router).unwrap());

    // A message carries no timestamp or headers: compare with a row mapped without them.
    let plain = settings("[route]\ntopic_regex = '^(?<routedByValue>[^.]+)\\..*$'\n");
    let message =
        OutboxEvent::from_message(br#"{"type":"order.placed","aggregate_id":"agg-1","id":42,"payload":{"a": 1}}"#)
            .unwrap();
    let table = relation(&["id", "aggregate_id", "type", "payload"]);
    let row = tuple(&[Some("42"), Some("agg-1"), Some("order.placed"), Some("{\"a\": 1}")]);
    let plain_layout = OutboxLayout::resolve(&plain.outbox, &table).unwrap();
    let from_wal = plain_layout.extract(&table, &row).unwrap();
    let values = [Some("42"), Some("agg-1"), Some("order.placed"), Some("{\"a\": 1}")];
    let polled = OutboxEvent::from_columns(&plain.outbox, &values).unwrap();
    let record = message.record(&plain.router).unwrap();
    assert_eq!(record.topic, "order");
    assert_eq!(record, from_wal.record(&plain.router).unwrap());
    assert_eq!(record, polled.record(&plain.router).unwrap());
}

#[test]
fn a_streamed_row_is_borrowed_not_copied() {
    let s = settings(FULL);
    let table = relation(&TABLE);
    let layout = OutboxLayout::resolve(&s.outbox, &table).unwrap();
    let streamed = ROW.streamed();
    let event = layout.extract(&table, &streamed).unwrap();
    let borrowed = |c: &Cow<'_, [u8]>| matches!(c, Cow::Borrowed(_));
    assert!(borrowed(&event.id) && borrowed(&event.key) && borrowed(&event.payload));
    assert!(matches!(event.route_value, Cow::Borrowed(_)));
    assert!(event
        .headers
        .iter()
        .all(|(name, value)| matches!(name, Cow::Borrowed(_)) && value.as_ref().is_none_or(borrowed)));
    // The default rule routes to the value itself without building a topic.
    let default = settings("");
    let record = OutboxEvent::from_columns(&default.outbox, &[Some("1"), Some("k"), Some("t"), Some("{}")]).unwrap();
    assert!(matches!(
        record.record(&default.router).unwrap().topic,
        Cow::Borrowed("t")
    ));
}

#[test]
fn null_required_columns_and_bad_topics_are_bad_events() {
    let s = settings("");
    let values = [Some("7"), None, Some("t"), Some("{}")];
    let err = OutboxEvent::from_columns(&s.outbox, &values).unwrap_err();
    assert_eq!(OutboxEvent::id_of_columns(&values), "7");
    assert_eq!(
        err,
        BadEvent::Null {
            column: "aggregate_id".into(),
            role: "message key"
        }
    );
    let values = [None, Some("k"), Some("t"), Some("{}")];
    assert!(OutboxEvent::from_columns(&s.outbox, &values).is_err());
    assert_eq!(OutboxEvent::id_of_columns(&values), "?");
    let values = [Some("8"), Some("k"), Some("has space"), Some("{}")];
    let event = OutboxEvent::from_columns(&s.outbox, &values).unwrap();
    assert_eq!(OutboxEvent::id_of_columns(&values), "8");
    assert!(matches!(event.record(&s.router).unwrap_err(), BadEvent::Topic(_)));
}

#[test]
fn unparseable_timestamps_leave_the_record_timestamp_to_the_producer() {
    let s = settings("[outbox]\ntimestamp_column = \"created_at\"\n");
    let values = [Some("1"), Some("k"), Some("t"), Some("{}"), Some("infinity")];
    let event = OutboxEvent::from_columns(&s.outbox, &values).unwrap();
    assert_eq!(event.timestamp_ms, None);
}

#[test]
fn streamed_rows_that_are_no_event_name_the_column() {
    let s = settings(FULL);
    let table = relation(&TABLE);
    let layout = OutboxLayout::resolve(&s.outbox, &table).unwrap();
    let with = |i: usize, value: ColumnValue| {
        let mut t = ROW.streamed();
        t.columns[i] = value;
        t
    };
    let null_type = with(4, ColumnValue::Null);
    assert_eq!(
        layout.extract(&table, &null_type).unwrap_err(),
        BadEvent::Null {
            column: "type".into(),
            role: "route-by value"
        }
    );
    assert_eq!(layout.id_for_error(&null_type), b"42");
    let not_utf8 = with(4, ColumnValue::Text(Bytes::from_static(b"\xff")));
    assert!(
        matches!(layout.extract(&table, &not_utf8).unwrap_err(), BadEvent::NotUtf8 { column, .. } if column == "type")
    );
    let binary = with(1, ColumnValue::Binary(Bytes::from_static(b"\x00")));
    assert_eq!(
        layout.extract(&table, &binary).unwrap_err(),
        BadEvent::Binary {
            column: "payload".into()
        }
    );
    let null_id = with(3, ColumnValue::Null);
    assert_eq!(layout.id_for_error(&null_id), b"?");
    let mut short = ROW.streamed();
    short.columns.truncate(5);
    assert_eq!(
        layout.extract(&table, &short).unwrap_err(),
        BadEvent::ShortTuple { got: 5, expected: 8 }
    );
    // A NULL header column is a null header, not a bad event.
    let null_header = with(0, ColumnValue::Null);
    let event = layout.extract(&table, &null_header).unwrap();
    assert_eq!(event.headers[1], (Cow::Borrowed("x-b"), None));
}

proptest! {
    #[test]
    fn a_streamed_row_and_the_same_row_read_with_sql_give_one_record(
        id in "[0-9]{1,8}", key in "\\PC{0,12}", route in "[a-z]{1,8}(\\.[a-z]{1,8})?", payload in "\\PC{0,40}",
        created_at in proptest::option::of("20[0-9]{2}-0[1-9]-1[0-9] 1[0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?\\+00"),
        a in proptest::option::of("\\PC{0,8}"), b in proptest::option::of("\\PC{0,8}"),
    ) {
        let s = settings(FULL);
        let table = relation(&TABLE);
        let layout = OutboxLayout::resolve(&s.outbox, &table).unwrap();
        let row = Row {
            id: &id, key: &key, route: &route, payload: &payload,
            created_at: created_at.as_deref(), a: a.as_deref(), b: b.as_deref(),
        };
        let streamed = row.streamed();
        let from_wal = layout.extract(&table, &streamed).unwrap();
        let values = row.columns();
        let polled = OutboxEvent::from_columns(&s.outbox, &values).unwrap();
        prop_assert_eq!(from_wal.record(&s.router).unwrap(), polled.record(&s.router).unwrap());
        prop_assert_eq!(from_wal.timestamp_ms.is_some(), created_at.is_some());
    }
}
