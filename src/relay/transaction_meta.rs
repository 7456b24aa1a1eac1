//! Transaction metadata (`[transactions]`): per-event headers and BEGIN / END markers.
//!
//! Headers (`headers = true`), on every event the stream sends:
//!
//! | header | value |
//! |---|---|
//! | `outbox-relay-txn-id` | `<xid>:<commit LSN as a decimal>`, Debezium's PostgreSQL transaction id form |
//! | `outbox-relay-commit-lsn` | the commit record's LSN, `X/Y` |
//! | `outbox-relay-commit-ts-ms` | the commit time, ms since the Unix epoch |
//! | `outbox-relay-txn-index` | the event's position among its transaction's events, from 1 (Debezium's `total_order`) |
//! | `outbox-relay-txn-count` | how many events its transaction has (absent for a transaction too large to hold, below) |
//!
//! A transaction's events are those that pass `[filter]`, in commit order; an event
//! `relay.on_bad_event` skips or dead-letters keeps its place (the count says a consumer that
//! saw fewer where to look), and a replay numbers every event as the first session did.
//!
//! pgoutput announces no count in Begin, so with headers on the stream holds a transaction's
//! decoded events until its Commit (`stream.rs`, `Collecting`) and then sends them stamped.
//! The walsender sends a committed transaction in one go, so this costs an event only the
//! transfer time of the rest of its transaction. The hold is bounded by the in-flight budget
//! (`relay.max_in_flight` events, `relay.max_in_flight_bytes`): a transaction larger than that
//! is sent as it arrives, without the count header (a WARN says so; the END marker still has
//! its `event_count`).
//!
//! Markers (`topic = "…"`): before a transaction's first sent event a BEGIN record, and at its
//! Commit an END record, to that destination, in Debezium's transaction-metadata format (key
//! `{"id":…}`, value `{"status","id","ts_ms","event_count","data_collections"}`, JSON without
//! a schema envelope). A transaction that sends nothing (no outbox rows, or all filtered) has
//! no markers. Markers are records of their transaction like its events: the END marker is
//! handed to the sink before the transaction's Commit reaches the watermark, so the
//! transaction is confirmed only once its markers are acknowledged too; a replay after a crash
//! sends them again with the same ids (consumers deduplicate on the `id` header as for events).

use std::borrow::Cow;

use crate::config::ident::TableName;
use crate::postgres::lsn::Lsn;
use crate::sink::RecordHeader;

pub(crate) const HEADER_TXN_ID: &str = "outbox-relay-txn-id";
pub(crate) const HEADER_COMMIT_LSN: &str = "outbox-relay-commit-lsn";
pub(crate) const HEADER_COMMIT_TS_MS: &str = "outbox-relay-commit-ts-ms";
pub(crate) const HEADER_TXN_INDEX: &str = "outbox-relay-txn-index";
pub(crate) const HEADER_TXN_COUNT: &str = "outbox-relay-txn-count";

/// Which marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    Begin,
    End,
}

/// The open transaction, as far as its metadata goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenTxn {
    xid: u32,
    commit_lsn: Lsn,
    commit_time_us: i64,
    /// Events numbered so far.
    events: u32,
    /// The position (`EventRef::seq`) of the last event numbered: numbering it again (an event
    /// published again after a read-back) gives it the same index.
    last_seq: Option<u32>,
    /// How many events the transaction has, once known (`Collecting`).
    count: Option<u32>,
    /// Whether the BEGIN marker went out (the END marker follows only then).
    begun: bool,
    /// Per data collection (`schema.table`; `message` for logical messages), in first-seen order.
    collections: Vec<(String, u32)>,
}

/// The metadata of the stream's open transaction.
#[derive(Debug, Default)]
pub(crate) struct TxnMeta {
    open: Option<OpenTxn>,
}

impl TxnMeta {
    /// A Begin: a new transaction, nothing sent yet.
    pub(crate) fn begin(&mut self, xid: u32, commit_lsn: Lsn, commit_time_us: i64) {
        self.open = Some(OpenTxn {
            xid,
            commit_lsn,
            commit_time_us,
            events: 0,
            last_seq: None,
            count: None,
            begun: false,
            collections: Vec::new(),
        });
    }

    /// The open transaction has `count` events (known before the first is numbered).
    pub(crate) fn set_count(&mut self, count: u32) {
        if let Some(open) = self.open.as_mut() {
            open.count = Some(count);
        }
    }

    /// The event at `seq` (its position among the transaction's decoded events) of `table`
    /// (`None`: a logical message) passed the filter: its index from 1. Numbering the same
    /// event again returns the same index.
    pub(crate) fn number(&mut self, seq: u32, table: Option<&TableName>) -> Option<u32> {
        let open = self.open.as_mut()?;
        if open.last_seq == Some(seq) {
            return Some(open.events);
        }
        open.last_seq = Some(seq);
        open.events += 1;
        let collection = table.map_or_else(
            || "message".to_owned(),
            |t| format!("{}.{}", t.schema.as_str(), t.name.as_str()),
        );
        match open.collections.iter_mut().find(|(c, _)| *c == collection) {
            Some((_, n)) => *n += 1,
            None => open.collections.push((collection, 1)),
        }
        Some(open.events)
    }

    /// The BEGIN marker is due: `Some` once per transaction, before its first sent record.
    pub(crate) fn begin_marker_due(&mut self) -> Option<&OpenTxn> {
        let open = self.open.as_mut()?;
        if open.begun {
            return None;
        }
        open.begun = true;
        Some(open)
    }

    /// The BEGIN marker [`begin_marker_due`](Self::begin_marker_due) gave was not taken (the
    /// sink's queue was full): it is due again.
    pub(crate) fn begin_marker_not_sent(&mut self) {
        if let Some(open) = self.open.as_mut() {
            open.begun = false;
        }
    }

    /// The END marker of `ended` ([`end`](Self::end)) was not taken (the sink's queue was
    /// full): the transaction is open again until its Commit is handed on once more.
    pub(crate) fn end_marker_not_sent(&mut self, ended: OpenTxn) {
        self.open = Some(ended);
    }

    /// The open transaction, for its headers and markers.
    pub(crate) fn open(&self) -> Option<&OpenTxn> {
        self.open.as_ref()
    }

    /// The Commit: the transaction ends; `Some` when its BEGIN marker went out (its END marker
    /// is due).
    pub(crate) fn end(&mut self) -> Option<OpenTxn> {
        self.open.take().filter(|t| t.begun)
    }
}

impl OpenTxn {
    /// Debezium's PostgreSQL transaction id: `<xid>:<LSN>`.
    pub(crate) fn id(&self) -> String {
        format!("{}:{}", self.xid, self.commit_lsn.0)
    }

    pub(crate) fn commit_lsn(&self) -> Lsn {
        self.commit_lsn
    }

    pub(crate) fn commit_ms(&self) -> i64 {
        self.commit_time_us.div_euclid(1000)
    }

    /// The headers of the event at `index`: the count's last, when known.
    pub(crate) fn headers<'a>(&self, index: u32) -> impl Iterator<Item = RecordHeader<'a>> + use<'a> {
        let h = |name: &'static str, value: String| (Cow::Borrowed(name), Some(Cow::Owned(value.into_bytes())));
        [
            Some(h(HEADER_TXN_ID, self.id())),
            Some(h(HEADER_COMMIT_LSN, self.commit_lsn.to_string())),
            Some(h(HEADER_COMMIT_TS_MS, self.commit_ms().to_string())),
            Some(h(HEADER_TXN_INDEX, index.to_string())),
            self.count.map(|count| h(HEADER_TXN_COUNT, count.to_string())),
        ]
        .into_iter()
        .flatten()
    }

    /// A marker's key and value, as Debezium's transaction topic holds them (JSON converter,
    /// schemas disabled).
    pub(crate) fn marker(&self, marker: Marker) -> (Vec<u8>, Vec<u8>) {
        let id = self.id();
        let key = serde_json::json!({ "id": id });
        let value = match marker {
            Marker::Begin => serde_json::json!({
                "status": "BEGIN",
                "id": id,
                "ts_ms": self.commit_ms(),
                "event_count": null,
                "data_collections": null,
            }),
            Marker::End => serde_json::json!({
                "status": "END",
                "id": id,
                "ts_ms": self.commit_ms(),
                "event_count": self.events,
                "data_collections": self
                    .collections
                    .iter()
                    .map(|(c, n)| serde_json::json!({ "data_collection": c, "event_count": n }))
                    .collect::<Vec<_>>(),
            }),
        };
        (key.to_string().into_bytes(), value.to_string().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_numbered_and_counted_per_collection() {
        let mut meta = TxnMeta::default();
        assert_eq!(meta.number(1, None), None, "outside a transaction");
        meta.begin(571, Lsn(53_195_829), 1_486_500_577_125_999);
        let sales = TableName::parse("t", "sales.outbox").unwrap();
        let billing = TableName::parse("t", "billing.outbox").unwrap();
        let text = |open: &OpenTxn, index| {
            open.headers(index)
                .map(|(n, v)| (n.into_owned(), String::from_utf8(v.unwrap().into_owned()).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(meta.number(1, Some(&sales)), Some(1));
        // An event published again after a read-back keeps its index; a filtered one (seq 3)
        // never asks for one.
        assert_eq!(meta.number(2, Some(&billing)), Some(2));
        assert_eq!(meta.number(2, Some(&billing)), Some(2));
        assert_eq!(meta.number(4, Some(&sales)), Some(3));
        assert!(meta.begin_marker_due().is_some());
        assert!(meta.begin_marker_due().is_none(), "one BEGIN per transaction");
        let open = meta.open().unwrap().clone();
        assert_eq!(open.id(), "571:53195829");
        let expected = |extra: &[(&str, &str)]| {
            [
                ("outbox-relay-txn-id", "571:53195829"),
                ("outbox-relay-commit-lsn", "0/32BB435"),
                ("outbox-relay-commit-ts-ms", "1486500577125"),
                ("outbox-relay-txn-index", "2"),
            ]
            .iter()
            .chain(extra)
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect::<Vec<_>>()
        };
        assert_eq!(
            text(&open, 2),
            expected(&[]),
            "no count unless the transaction was held whole"
        );
        meta.set_count(3);
        assert_eq!(
            text(meta.open().unwrap(), 2),
            expected(&[("outbox-relay-txn-count", "3")])
        );
        let (key, begin) = open.marker(Marker::Begin);
        assert_eq!(key, br#"{"id":"571:53195829"}"#);
        let begin: serde_json::Value = serde_json::from_slice(&begin).unwrap();
        assert_eq!(
            begin,
            serde_json::json!({"status":"BEGIN","id":"571:53195829","ts_ms":1_486_500_577_125_i64,"event_count":null,"data_collections":null})
        );
        let ended = meta.end().expect("events were sent");
        let end: serde_json::Value = serde_json::from_slice(&ended.marker(Marker::End).1).unwrap();
        assert_eq!(
            end,
            serde_json::json!({"status":"END","id":"571:53195829","ts_ms":1_486_500_577_125_i64,"event_count":3,
                "data_collections":[{"data_collection":"sales.outbox","event_count":2},
                                    {"data_collection":"billing.outbox","event_count":1}]})
        );
        // A transaction whose BEGIN marker never went out (nothing sent) has no END marker.
        meta.begin(572, Lsn(1), 0);
        assert_eq!(meta.number(1, Some(&sales)), Some(1));
        assert_eq!(meta.end(), None);
    }
}
