//! From one claimed row (mapped columns as text) to the parts of its Kafka record.
//!
//! The same rules as the streaming path (`OutboxLayout::extract` and `StreamState::on_insert`):
//! id, key, route-by value and payload must not be NULL, the route-by value goes through the
//! same [`crate::outbox::routing::topic`], the timestamp column becomes the record timestamp, the
//! header columns become headers in the mapping's order (NULL gives a null header), and the `id`
//! header comes first. So a polled row and the same row streamed from the WAL give identical
//! records.

use std::borrow::Cow;

use bytes::Bytes;
use tokio_postgres::Row;

use crate::config::Settings;
use crate::kafka::producer::OutboundRecord;
use crate::outbox::event::{parse_timestamp_ms, BadEvent};
use crate::outbox::routing;

/// One claimed row's mapped values; built by [`ClaimedRow::from_row`], borrowed by the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedRow {
    pub id: String,
    pub key: String,
    pub route_value: String,
    pub payload: String,
    pub timestamp_ms: Option<i64>,
    /// (header name, value) in the mapping's order.
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// Why a claimed row cannot be published, with its id for the operator (`?` when the id itself
/// is the problem).
#[derive(Debug)]
pub struct RowError {
    pub id: String,
    pub cause: BadEvent,
}

impl ClaimedRow {
    /// `values` are the mapped columns' text in [`crate::config::outbox::OutboxMapping::columns`] order.
    pub fn from_values(settings: &Settings, values: &[Option<&str>]) -> Result<ClaimedRow, RowError> {
        let mapping = &settings.outbox;
        let columns = mapping.columns();
        let id_text = values.first().copied().flatten();
        let fail = |cause: BadEvent| RowError {
            id: id_text.unwrap_or("?").to_owned(),
            cause,
        };
        let required = |i: usize, role: &'static str| -> Result<String, RowError> {
            match values.get(i).copied().flatten() {
                Some(v) => Ok(v.to_owned()),
                None => Err(fail(BadEvent::Null {
                    column: columns[i].1.as_str().to_owned(),
                    role,
                })),
            }
        };
        let id = required(0, "event id")?;
        let key = required(1, "message key")?;
        let route_value = required(2, "route-by value")?;
        let payload = required(3, "payload")?;
        let mut next = 4;
        let timestamp_ms = if mapping.timestamp.is_some() {
            next += 1;
            values
                .get(4)
                .copied()
                .flatten()
                .and_then(|t| parse_timestamp_ms(t.as_bytes()))
        } else {
            None
        };
        let headers = mapping
            .headers
            .iter()
            .enumerate()
            .map(|(i, (_, name))| {
                let value = values
                    .get(next + i)
                    .copied()
                    .flatten()
                    .map(|v| Bytes::copy_from_slice(v.as_bytes()));
                (name.clone(), value)
            })
            .collect();
        Ok(ClaimedRow {
            id,
            key,
            route_value,
            payload,
            timestamp_ms,
            headers,
        })
    }

    /// Reads the claim query's row (see [`super::sql::PollSql::claim`]).
    pub fn from_row(settings: &Settings, row: &Row) -> Result<ClaimedRow, RowError> {
        let mut values = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            // Every column is `format(…)` text; a decoding failure is impossible short of a bug.
            let v: Option<&str> = row.try_get(i).map_err(|e| RowError {
                id: "?".into(),
                cause: BadEvent::Rejected(format!("column {i} of the claim is not text: {e}")),
            })?;
            values.push(v);
        }
        ClaimedRow::from_values(settings, &values)
    }

    /// The routed topic, checked against Kafka's naming rules.
    pub fn topic<'a>(&'a self, settings: &Settings) -> Result<Cow<'a, str>, RowError> {
        routing::topic(&settings.router, &self.route_value).map_err(|cause| RowError {
            id: self.id.clone(),
            cause,
        })
    }

    /// The record; `headers` must come from [`ClaimedRow::header_refs`].
    pub fn record<'a>(&'a self, topic: &'a str, headers: &'a [(&'a str, Option<Bytes>)]) -> OutboundRecord<'a> {
        OutboundRecord {
            topic,
            key: self.key.as_bytes(),
            payload: self.payload.as_bytes(),
            event_id: self.id.as_bytes(),
            timestamp_ms: self.timestamp_ms,
            headers,
        }
    }

    pub fn header_refs(&self) -> Vec<(&str, Option<Bytes>)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn settings(extra: &str) -> Settings {
        let text = format!(
            "[postgres]\nurl = \"postgres://relay@127.0.0.1/app\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n{extra}"
        );
        Settings::from_toml_str(&text, Path::new("t.toml"), std::iter::empty()).unwrap()
    }

    #[test]
    fn maps_columns_like_the_streaming_path() {
        let s = settings(
            "[outbox]\ntimestamp_column = \"created_at\"\nheader_columns = { a_col = \"x-a\", b_col = \"x-b\" }\n\
             [route]\ntopic_regex = '^(?<routedByValue>[^.]+)\\..*$'\n",
        );
        let row = ClaimedRow::from_values(
            &s,
            &[
                Some("42"),
                Some("agg-1"),
                Some("order.placed"),
                Some("{\"a\": 1}"),
                Some("1970-01-01 00:00:01.5+00"),
                None,
                Some("v"),
            ],
        )
        .unwrap();
        assert_eq!(row.topic(&s).unwrap(), "order");
        let headers = row.header_refs();
        let record = row.record("order", &headers);
        assert_eq!(record.event_id, b"42");
        assert_eq!(record.key, b"agg-1");
        assert_eq!(record.payload, b"{\"a\": 1}");
        assert_eq!(record.timestamp_ms, Some(1500));
        // BTreeMap order of the header columns, as the streaming path uses.
        assert_eq!(headers, vec![("x-a", None), ("x-b", Some(Bytes::from_static(b"v")))]);
    }

    #[test]
    fn null_required_columns_and_bad_topics_are_bad_events() {
        let s = settings("");
        let err = ClaimedRow::from_values(&s, &[Some("7"), None, Some("t"), Some("{}")]).unwrap_err();
        assert_eq!(err.id, "7");
        assert_eq!(
            err.cause,
            BadEvent::Null {
                column: "aggregate_id".into(),
                role: "message key"
            }
        );
        let err = ClaimedRow::from_values(&s, &[None, Some("k"), Some("t"), Some("{}")]).unwrap_err();
        assert_eq!(err.id, "?");
        let row = ClaimedRow::from_values(&s, &[Some("8"), Some("k"), Some("has space"), Some("{}")]).unwrap();
        let err = row.topic(&s).unwrap_err();
        assert_eq!(err.id, "8");
        assert!(matches!(err.cause, BadEvent::Topic(_)));
    }

    #[test]
    fn unparseable_timestamps_leave_the_record_timestamp_to_the_producer() {
        let s = settings("[outbox]\ntimestamp_column = \"created_at\"\n");
        let row =
            ClaimedRow::from_values(&s, &[Some("1"), Some("k"), Some("t"), Some("{}"), Some("infinity")]).unwrap();
        assert_eq!(row.timestamp_ms, None);
    }
}
