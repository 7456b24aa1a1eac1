//! Checks on what a test read back from Kafka against what it committed: every event arrived
//! (at least once) with the right key, payload and topic, and each aggregate's first deliveries
//! follow commit order.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::consumer::Received;
use super::workload::{Committed, ExpectedEvent};

/// Per key, the `id` headers in the order the consumer read them (offset order per partition).
pub fn ids_by_key(records: &[Received]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in records {
        let id = String::from_utf8_lossy(r.header("id").expect("id header")).into_owned();
        out.entry(r.key_str().expect("key").to_owned()).or_default().push(id);
    }
    out
}

/// Every committed event was received (at least once), with the right key, payload bytes and
/// topic; returns how many duplicates there were.
pub fn check_delivered(
    committed: &[ExpectedEvent],
    records: &[Received],
    topic_of: impl Fn(&ExpectedEvent) -> String,
) -> usize {
    let mut by_id: HashMap<String, Vec<&Received>> = HashMap::new();
    for r in records {
        let id = String::from_utf8_lossy(r.header("id").expect("every record has an id header")).into_owned();
        by_id.entry(id).or_default().push(r);
    }
    let mut missing = Vec::new();
    for ev in committed {
        match by_id.get(&ev.id) {
            None => missing.push(ev.id.clone()),
            Some(rs) => {
                for r in rs {
                    assert_eq!(r.key_str(), Some(ev.aggregate_id.as_str()), "key of event {}", ev.id);
                    assert_eq!(
                        r.payload_str(),
                        Some(ev.payload_text.as_str()),
                        "payload bytes of event {}",
                        ev.id
                    );
                    assert_eq!(r.topic, topic_of(ev), "topic of event {}", ev.id);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let expected: HashSet<&str> = committed.iter().map(|e| e.id.as_str()).collect();
    let unexpected: Vec<&String> = by_id.keys().filter(|id| !expected.contains(id.as_str())).collect();
    assert!(
        unexpected.is_empty(),
        "records for events that were never committed: {unexpected:?}"
    );
    records.len() - by_id.len()
}

/// First deliveries per aggregate must follow commit order.
pub fn check_order(committed: &Committed, records: &[Received]) {
    let received = ids_by_key(records);
    for (agg, events) in &committed.by_aggregate {
        let mut seen = HashSet::new();
        let firsts: Vec<&String> = received
            .get(agg)
            .map(|ids| ids.iter().filter(|id| seen.insert(id.as_str())).collect())
            .unwrap_or_default();
        let expected: Vec<&String> = events.iter().map(|e| &e.id).collect();
        assert_eq!(
            firsts, expected,
            "aggregate {agg}: first deliveries out of commit order"
        );
    }
}
