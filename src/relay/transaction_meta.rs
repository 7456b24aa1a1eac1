//! Transaction metadata (`[transactions]`): per-event headers and BEGIN / END markers.
//!
//! Headers (`headers = true`), on every event the stream sends:
//!
//! | header | value |
//! |---|---|
//! | `outbox-relay-txn-id` | `<xid>:<commit LSN as a decimal>`, Debezium's PostgreSQL transaction id form |
//! | `outbox-relay-commit-lsn` | the commit record's LSN, `X/Y` |
//! | `outbox-relay-commit-ts-ms` | the commit time, ms since the Unix epoch |
//! | `outbox-relay-txn-index` | the event's position among its transaction's sent events, from 1 (Debezium's `total_order`) |
//!
//! The count of a transaction's events is known only at its Commit, after its events were
//! sent (pgoutput announces none in Begin, and holding a whole transaction back to stamp it on
//! each event would break the in-flight memory bound and add a transaction's decode time to
//! every event's latency): it is the END marker's `event_count`, as in Debezium.
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
    /// Events sent so far.
    sent: u32,
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
            sent: 0,
            collections: Vec::new(),
        });
    }

    /// One event of `table` (`None`: a logical message) is about to be sent: its index from 1,
    /// and whether it is the transaction's first (the BEGIN marker goes before it).
    pub(crate) fn next_event(&mut self, table: Option<&TableName>) -> Option<(u32, bool)> {
        let open = self.open.as_mut()?;
        open.sent += 1;
        let collection = table.map_or_else(
            || "message".to_owned(),
            |t| format!("{}.{}", t.schema.as_str(), t.name.as_str()),
        );
        match open.collections.iter_mut().find(|(c, _)| *c == collection) {
            Some((_, n)) => *n += 1,
            None => open.collections.push((collection, 1)),
        }
        Some((open.sent, open.sent == 1))
    }

    /// The open transaction, for its headers and markers.
    pub(crate) fn open(&self) -> Option<&OpenTxn> {
        self.open.as_ref()
    }

    /// The Commit: the transaction ends; `Some` when it sent events (its END marker is due).
    pub(crate) fn end(&mut self) -> Option<OpenTxn> {
        self.open.take().filter(|t| t.sent > 0)
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

    /// The headers of the event at `index`.
    pub(crate) fn headers(&self, index: u32) -> [RecordHeader<'static>; 4] {
        let h = |name: &'static str, value: String| (Cow::Borrowed(name), Some(Cow::Owned(value.into_bytes())));
        [
            h(HEADER_TXN_ID, self.id()),
            h(HEADER_COMMIT_LSN, self.commit_lsn.to_string()),
            h(HEADER_COMMIT_TS_MS, self.commit_ms().to_string()),
            h(HEADER_TXN_INDEX, index.to_string()),
        ]
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
                "event_count": self.sent,
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
        assert_eq!(meta.next_event(None), None, "outside a transaction");
        meta.begin(571, Lsn(53_195_829), 1_486_500_577_125_999);
        let sales = TableName::parse("t", "sales.outbox").unwrap();
        let billing = TableName::parse("t", "billing.outbox").unwrap();
        assert_eq!(meta.next_event(Some(&sales)), Some((1, true)));
        assert_eq!(meta.next_event(Some(&billing)), Some((2, false)));
        assert_eq!(meta.next_event(Some(&sales)), Some((3, false)));
        let open = meta.open().unwrap().clone();
        assert_eq!(open.id(), "571:53195829");
        let headers = open.headers(2);
        let text: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (&**n, v.as_deref().unwrap())).collect();
        assert_eq!(
            text,
            [
                ("outbox-relay-txn-id", &b"571:53195829"[..]),
                ("outbox-relay-commit-lsn", b"0/32BB435"),
                ("outbox-relay-commit-ts-ms", b"1486500577125"),
                ("outbox-relay-txn-index", b"2"),
            ]
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
        // A transaction that sent nothing has no END marker.
        meta.begin(572, Lsn(1), 0);
        assert_eq!(meta.end(), None);
    }
}
