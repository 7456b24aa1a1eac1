//! Where a record came from, in its headers: what the exactly-once strategies that look at the
//! sink (read-back, transactions) write on every record and recognise when they read one back.
//!
//! Every such record carries three headers after its own: [`HEADER_SOURCE`]
//! (`<database system identifier>/<slot>`: which relay wrote it), [`HEADER_COMMIT_LSN`] (its
//! transaction's commit LSN, PostgreSQL's text form) and [`HEADER_INDEX`] (its 0-based index
//! among that transaction's outbox events). Positions order by commit LSN, then index — the
//! order in which the relay writes every destination.

use std::io::Write as _;

use crate::config::Settings;
use crate::postgres::lsn::Lsn;
use crate::relay::quarantine::EventRef;
use crate::sink::HeaderGet;

/// `<database system identifier>/<slot>`: which relay wrote the record.
pub(crate) const HEADER_SOURCE: &str = "outbox-relay-source";
/// The commit LSN of the record's transaction, as PostgreSQL prints it (`16/B374D848`).
pub(crate) const HEADER_COMMIT_LSN: &str = "outbox-relay-commit-lsn";
/// The record's 0-based index among its transaction's outbox events (decimal).
pub(crate) const HEADER_INDEX: &str = "outbox-relay-index";

/// [`HEADER_SOURCE`]'s value for this relay.
pub(super) fn source(settings: &Settings, system_id: &str) -> String {
    format!("{system_id}/{}", settings.postgres.slot)
}

/// The headers that carry `at` written by `source`, formatted into `buf`.
pub(super) fn headers<'b>(source: &'b str, at: EventRef, buf: &'b mut [u8; 40]) -> [(&'static str, &'b [u8]); 3] {
    let (lsn, index) = buf.split_at_mut(20);
    let lsn_len = {
        let mut w = &mut lsn[..];
        let _ = write!(w, "{}", at.commit_lsn);
        20 - w.len()
    };
    let index_len = {
        let mut w = &mut index[..];
        let _ = write!(w, "{}", at.seq);
        20 - w.len()
    };
    [
        (HEADER_SOURCE, source.as_bytes()),
        (HEADER_COMMIT_LSN, &lsn[..lsn_len]),
        (HEADER_INDEX, &index[..index_len]),
    ]
}

/// The position of a record `source` wrote, from its headers (`None`: another writer's).
pub(super) fn of_record(h: &dyn HeaderGet, source: &str) -> Option<EventRef> {
    if h.get(HEADER_SOURCE)? != source.as_bytes() {
        return None;
    }
    let commit_lsn = std::str::from_utf8(h.get(HEADER_COMMIT_LSN)?)
        .ok()?
        .parse::<Lsn>()
        .ok()?;
    let seq = std::str::from_utf8(h.get(HEADER_INDEX)?).ok()?.parse::<u32>().ok()?;
    Some(EventRef { commit_lsn, seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_name_the_source() {
        let mut buf = [0u8; 40];
        let source = "7000000000000000001/outbox_relay";
        let headers = headers(source, EventRef::at(0x16_B374_D848, 42), &mut buf);
        let owned: Vec<(String, Vec<u8>)> = headers.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect();
        assert_eq!(
            owned,
            vec![
                (HEADER_SOURCE.to_owned(), b"7000000000000000001/outbox_relay".to_vec()),
                (HEADER_COMMIT_LSN.to_owned(), b"16/B374D848".to_vec()),
                (HEADER_INDEX.to_owned(), b"42".to_vec()),
            ]
        );
    }

    #[test]
    fn own_records_are_recognised_by_source() {
        struct Pairs<'a>(&'a [(&'a str, &'a [u8])]);
        impl HeaderGet for Pairs<'_> {
            fn get(&self, name: &str) -> Option<&[u8]> {
                self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
            }
        }
        let position = |headers: &[(&str, &[u8])]| of_record(&Pairs(headers), "1/s");
        let good: [(&str, &[u8]); 3] = [
            (HEADER_SOURCE, b"1/s"),
            (HEADER_COMMIT_LSN, b"0/200"),
            (HEADER_INDEX, b"3"),
        ];
        assert_eq!(position(&good), Some(EventRef::at(0x200, 3)));
        let other: [(&str, &[u8]); 3] = [
            (HEADER_SOURCE, b"2/s"),
            (HEADER_COMMIT_LSN, b"0/200"),
            (HEADER_INDEX, b"3"),
        ];
        assert_eq!(position(&other), None);
        assert_eq!(position(&good[..2]), None);
    }
}
