//! Which rows `replay` re-publishes: the command line's `--since`, `--until`, `--type`,
//! `--aggregate` and `--table`, checked, then turned into one SQL condition.
//!
//! Invariant: the condition is fixed when a replay starts — a bound relative to now (`24h`) is
//! resolved to an absolute time then, and a missing `--until` becomes "created before the
//! replay started" — and a resumed replay reuses it verbatim (it is in the state file), so
//! `--resume` selects the same rows however much later it runs.
//!
//! Windows are half-open: `--since` is inclusive, `--until` exclusive, so two adjacent windows
//! never replay a row twice.

use std::time::Duration;

use crate::config::filter::Glob;
use crate::config::ident::TableName;
use crate::config::retention::parse_duration;
use crate::config::Settings;

/// One end of the window, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bound {
    /// `id:N`: by the (integer) id column.
    Id(i64),
    /// A duration back from now (`24h`, `90m`), resolved when the replay starts.
    Ago(Duration),
    /// An RFC 3339 time, compared with the creation-time column.
    At(String),
}

impl Bound {
    /// Parses `--since` / `--until`; `flag` names it in the error.
    pub(crate) fn parse(flag: &str, text: &str) -> Result<Bound, String> {
        let text = text.trim();
        if let Some(id) = text.strip_prefix("id:") {
            return id.trim().parse().map(Bound::Id).map_err(|_| {
                format!("{flag} {text:?}: after `id:` comes a whole number, the outbox id to start at, e.g. id:41")
            });
        }
        if text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains(['-', ':']) {
            return parse_duration(text)
                .map(Bound::Ago)
                .map_err(|e| format!("{flag} {text:?} is not a duration back from now: {e}"));
        }
        if is_rfc3339(text) {
            return Ok(Bound::At(text.to_owned()));
        }
        Err(format!(
            "{flag} {text:?} is neither an RFC 3339 time (2026-05-01T12:00:00Z), a duration back from now (24h, 90m, \
             7d) nor an id (id:41)"
        ))
    }

    pub(crate) fn is_time(&self) -> bool {
        !matches!(self, Bound::Id(_))
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (a space for the `T` accepted too).
fn is_rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r.clone()).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !(digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10))
        || !matches!(b[10], b'T' | b't' | b' ')
        || !(digits(11..13) && b[13] == b':' && digits(14..16) && b[16] == b':' && digits(17..19))
    {
        return false;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    let z = rest.as_bytes();
    matches!(rest, "Z" | "z")
        || (z.len() == 6
            && matches!(z[0], b'+' | b'-')
            && z[1..3].iter().all(u8::is_ascii_digit)
            && z[3] == b':'
            && z[4..6].iter().all(u8::is_ascii_digit))
}

/// The selecting arguments, as parsed from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Criteria {
    pub(crate) since: Option<Bound>,
    pub(crate) until: Option<Bound>,
    /// `--type`: route-by values (globs); any of them.
    pub(crate) types: Vec<String>,
    /// `--aggregate`: key column values; any of them.
    pub(crate) aggregates: Vec<String>,
    /// `--table`: one of `outbox.table`; `None` = all of them.
    pub(crate) table: Option<String>,
}

impl Criteria {
    /// The outbox tables to replay, in `outbox.table` order.
    pub(crate) fn tables(&self, settings: &Settings) -> Result<Vec<TableName>, String> {
        let all = &settings.outbox.tables;
        let Some(wanted) = &self.table else {
            return Ok(all.clone());
        };
        let name = TableName::parse("--table", wanted).map_err(|e| e.to_string())?;
        if all.contains(&name) {
            return Ok(vec![name]);
        }
        Err(format!(
            "--table {wanted:?} is not an outbox table of this config; outbox.table lists: {}",
            settings.outbox.tables_display()
        ))
    }

    /// Whether `--since` or `--until` is a time (compared with the creation-time column).
    pub(crate) fn by_time(&self) -> bool {
        [&self.since, &self.until].into_iter().flatten().any(Bound::is_time)
    }

    /// Refuses what cannot select anything sensible, naming the fix. (Whether each table has
    /// the creation-time column a time bound reads is the database's to say: `replay` asks it.)
    pub(crate) fn check(&self, settings: &Settings) -> Result<(), String> {
        if let Some(t) = self.types.iter().find(|t| Glob::parse(t).is_none()) {
            return Err(format!(
                "--type {t:?}: a pattern is non-empty text, `*` any run of characters, `?` one"
            ));
        }
        self.tables(settings).map(|_| ())
    }

    /// The selecting condition with relative bounds resolved: `now` is the replay's start as
    /// PostgreSQL's `timestamptz` text. Times are compared with the creation-time column
    /// (`Settings::created_at_column`, the one retention ages rows by); `created` says every
    /// selected table has it. Without `--until` (and with that column) rows created after the
    /// start are left to the stream.
    pub(crate) fn condition(&self, settings: &Settings, now: &str, created: bool) -> String {
        let mapping = &settings.outbox;
        let mut parts = Vec::new();
        let time_column = settings.created_at_column().0.quoted();
        let id = mapping.id.quoted();
        let at = |bound: &Bound| match bound {
            Bound::Ago(d) => format!(
                "({}::timestamptz - interval '{} milliseconds')",
                literal(now),
                d.as_millis()
            ),
            Bound::At(t) => format!("{}::timestamptz", literal(t)),
            Bound::Id(n) => n.to_string(),
        };
        if let Some(since) = &self.since {
            let column = if since.is_time() { &time_column } else { &id };
            parts.push(format!("{column} >= {}", at(since)));
        }
        match &self.until {
            Some(until) => {
                let column = if until.is_time() { &time_column } else { &id };
                parts.push(format!("{column} < {}", at(until)));
            }
            None if created => {
                parts.push(format!("{time_column} <= {}::timestamptz", literal(now)));
            }
            None => {}
        }
        if !self.types.is_empty() {
            let any: Vec<String> = self
                .types
                .iter()
                .filter_map(|t| Glob::parse(t))
                .map(|g| format!("{}::text LIKE {}", mapping.route_by.quoted(), g.like_literal()))
                .collect();
            parts.push(format!("({})", any.join(" OR ")));
        }
        if !self.aggregates.is_empty() {
            let any: Vec<String> = self.aggregates.iter().map(|a| literal(a)).collect();
            parts.push(format!("{}::text IN ({})", mapping.key.quoted(), any.join(", ")));
        }
        if parts.is_empty() {
            "true".to_owned()
        } else {
            parts.join(" AND ")
        }
    }

    /// A time `--since` as an SQL `timestamptz` expression (relative to `now()`); `None` for an
    /// id or no `--since`.
    pub(crate) fn since_sql(&self) -> Option<String> {
        match self.since.as_ref()? {
            Bound::At(t) => Some(format!("{}::timestamptz", literal(t))),
            Bound::Ago(d) => Some(format!("(now() - interval '{} milliseconds')", d.as_millis())),
            Bound::Id(_) => None,
        }
    }

    /// The arguments in one canonical line: what identifies "the same replay" for `--resume`.
    pub(crate) fn canonical(&self, to_topic: Option<&str>) -> String {
        let mut types = self.types.clone();
        types.sort();
        let mut aggregates = self.aggregates.clone();
        aggregates.sort();
        format!(
            "since={:?} until={:?} type={types:?} aggregate={aggregates:?} table={:?} to_topic={to_topic:?}",
            self.since, self.until, self.table
        )
    }
}

/// A quoted SQL string literal.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(extra: &str) -> Settings {
        crate::config::test_support::settings(&format!("[outbox]\n{extra}"))
    }

    #[test]
    fn bounds_are_ids_durations_or_rfc3339_times() {
        assert_eq!(Bound::parse("--since", "id:41"), Ok(Bound::Id(41)));
        assert_eq!(
            Bound::parse("--since", "24h"),
            Ok(Bound::Ago(Duration::from_secs(86_400)))
        );
        assert_eq!(
            Bound::parse("--since", "1h30m"),
            Ok(Bound::Ago(Duration::from_secs(5_400)))
        );
        for t in [
            "2026-05-01T12:00:00Z",
            "2026-05-01T12:00:00.123+02:00",
            "2026-05-01 12:00:00-05:00",
        ] {
            assert_eq!(Bound::parse("--since", t), Ok(Bound::At(t.to_owned())), "{t}");
        }
        for bad in [
            "id:x",
            "yesterday",
            "2026-05-01",
            "2026-05-01T12:00:00",
            "24",
            "12:00:00Z",
        ] {
            let e = Bound::parse("--until", bad).unwrap_err();
            assert!(e.starts_with("--until"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_condition_is_half_open_and_quotes_every_value() {
        let s = settings("");
        let c = Criteria {
            since: Some(Bound::Ago(Duration::from_secs(3600))),
            until: Some(Bound::Id(100)),
            types: vec!["order.*".into(), "it's_".into()],
            aggregates: vec!["a'1".into()],
            table: None,
        };
        assert_eq!(
            c.condition(&s, "2026-05-01 12:00:00+00", true),
            "\"created_at\" >= ('2026-05-01 12:00:00+00'::timestamptz - interval '3600000 milliseconds') AND \
             \"id\" < 100 AND (\"type\"::text LIKE 'order.%' OR \"type\"::text LIKE 'it''s\\_') AND \
             \"aggregate_id\"::text IN ('a''1')"
        );
        // No --until: rows created after the start are the stream's.
        let open = Criteria {
            since: Some(Bound::At("2026-05-01T00:00:00Z".into())),
            ..Criteria::default()
        };
        assert_eq!(
            open.condition(&s, "2026-05-02 00:00:00+00", true),
            "\"created_at\" >= '2026-05-01T00:00:00Z'::timestamptz AND \"created_at\" <= '2026-05-02 00:00:00+00'::timestamptz"
        );
        assert_eq!(Criteria::default().condition(&settings(""), "x", false), "true");
        // The creation-time column is retention's, whatever the record timestamp is.
        let inserted = crate::config::test_support::settings(
            "[outbox]\ntimestamp_column = \"sent_at\"\n[retention]\nmode = \"delete\"\nkeep = \"7d\"\n\
             timestamp_column = \"inserted_at\"\n",
        );
        assert_eq!(
            open.condition(&inserted, "2026-05-02 00:00:00+00", true),
            "\"inserted_at\" >= '2026-05-01T00:00:00Z'::timestamptz AND \"inserted_at\" <= '2026-05-02 00:00:00+00'::timestamptz"
        );
    }

    #[test]
    fn a_time_bound_needs_no_record_timestamp_and_the_table_must_be_configured() {
        let s = settings("");
        let c = Criteria {
            since: Some(Bound::Ago(Duration::from_secs(60))),
            ..Criteria::default()
        };
        assert_eq!(c.check(&s), Ok(()));
        assert!(c.by_time());
        let by_id = Criteria {
            since: Some(Bound::Id(5)),
            table: Some("other".into()),
            ..Criteria::default()
        };
        assert!(by_id.check(&s).unwrap_err().contains("not an outbox table"));
        let ok = Criteria {
            table: Some("events_outbox".into()),
            ..by_id
        };
        assert_eq!(ok.tables(&s).unwrap(), s.outbox.tables);
    }

    #[test]
    fn the_canonical_form_ignores_the_order_of_repeated_flags() {
        let a = Criteria {
            types: vec!["b".into(), "a".into()],
            ..Criteria::default()
        };
        let b = Criteria {
            types: vec!["a".into(), "b".into()],
            ..Criteria::default()
        };
        assert_eq!(a.canonical(None), b.canonical(None));
        assert_ne!(a.canonical(None), a.canonical(Some("t")));
    }
}
