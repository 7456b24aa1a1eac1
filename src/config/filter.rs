//! `[filter]`: which outbox events are published at all.
//!
//! ```toml
//! [filter]
//! include = ["order.*"]                  # route-by values to publish (default: all)
//! exclude = ["order.internal.*"]         # route-by values never to publish
//! where = { tenant = ["acme", "glob*"] } # other columns: the value must match one glob
//! ```
//!
//! An event passes when its route-by value matches an `include` glob (or `include` is empty),
//! matches no `exclude` glob, and every `where` column is not NULL and matches one of its globs.
//! Globs: `*` is any run of characters, `?` one character; nothing else is special.
//!
//! Invariant: the relay's own test ([`EventFilter::admits_values`]) and the row filter `setup`
//! writes into the publication on PostgreSQL 15+ ([`EventFilter::row_filter_sql`]) accept the
//! same rows, so pushing the filter down changes what is decoded, never what is published.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::ident::Ident;
use crate::config::{named, ConfigError};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct FilterSection {
    pub(crate) include: Vec<String>,
    pub(crate) exclude: Vec<String>,
    #[serde(rename = "where")]
    pub(crate) where_: BTreeMap<String, Vec<String>>,
}

/// One `*` / `?` glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Glob(String);

impl Glob {
    /// Whether `text` matches the whole glob (`*` any run, `?` one character).
    pub(crate) fn matches(&self, text: &str) -> bool {
        let pattern: Vec<char> = self.0.chars().collect();
        let text: Vec<char> = text.chars().collect();
        // Greedy matching with one backtrack point, the last `*`: linear in practice.
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            match pattern.get(p) {
                Some('*') => {
                    star = Some((p, t));
                    p += 1;
                }
                Some(&c) if c == '?' || c == text[t] => {
                    p += 1;
                    t += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        p = sp + 1;
                        t = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        pattern[p..].iter().all(|c| *c == '*')
    }

    /// A glob written on the command line (`replay --type`); `None` when empty.
    pub(crate) fn parse(text: &str) -> Option<Glob> {
        (!text.is_empty() && !text.contains('\0')).then(|| Glob(text.to_owned()))
    }

    /// The glob as an SQL `LIKE` pattern literal (quoted), `\` escaping `%`, `_` and itself.
    pub(crate) fn like_literal(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('\'');
        for c in self.0.chars() {
            match c {
                '*' => out.push('%'),
                '?' => out.push('_'),
                '%' | '_' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                '\'' => out.push_str("''"),
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    }
}

/// The validated `[filter]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFilter {
    pub(crate) include: Vec<Glob>,
    pub(crate) exclude: Vec<Glob>,
    /// (column, its globs), in column order; each column's index in
    /// `OutboxMapping::routing_columns` is set by [`EventFilter::place_columns`].
    pub(crate) where_: Vec<(Ident, Vec<Glob>)>,
    /// Where each `where_` column is in `OutboxMapping::routing_columns`.
    pub(crate) where_index: Vec<usize>,
}

impl FilterSection {
    /// `None`: the section filters nothing (all lists empty).
    pub(crate) fn validate(self) -> Result<Option<EventFilter>, ConfigError> {
        let globs = |key: &'static str, list: Vec<String>| -> Result<Vec<Glob>, ConfigError> {
            list.into_iter()
                .map(|g| {
                    if g.is_empty() || g.contains('\0') {
                        Err(ConfigError::Invalid {
                            key,
                            message: format!(
                                "has the pattern {g:?}; a pattern is non-empty text where `*` is any run of \
                                 characters and `?` one character, e.g. \"order.*\""
                            ),
                        })
                    } else {
                        Ok(Glob(g))
                    }
                })
                .collect()
        };
        let include = globs("filter.include", self.include)?;
        let exclude = globs("filter.exclude", self.exclude)?;
        let mut where_ = Vec::with_capacity(self.where_.len());
        for (column, patterns) in self.where_ {
            let ident = Ident::exact("filter.where", &column).map_err(named("filter.where"))?;
            if patterns.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "filter.where",
                    message: format!(
                        "column {column:?} has no patterns, which no row would match; list its values, e.g. \
                         {column} = [\"a\", \"b\"], or remove it"
                    ),
                });
            }
            where_.push((ident, globs("filter.where", patterns)?));
        }
        if include.is_empty() && exclude.is_empty() && where_.is_empty() {
            return Ok(None);
        }
        Ok(Some(EventFilter {
            include,
            exclude,
            where_,
            where_index: Vec::new(),
        }))
    }
}

impl EventFilter {
    /// Adds the `where` columns to `columns` (`OutboxMapping::routing_columns`, each once) and
    /// remembers where they are.
    pub(crate) fn place_columns(&mut self, columns: &mut Vec<(Ident, &'static str)>) {
        self.where_index = self
            .where_
            .iter()
            .map(|(column, _)| match columns.iter().position(|(c, _)| c == column) {
                Some(i) => i,
                None => {
                    columns.push((column.clone(), "filter.where"));
                    columns.len() - 1
                }
            })
            .collect();
    }

    /// Whether an event with this route-by value and these `routing_columns` values (`column(i)`,
    /// `None` = NULL or not UTF-8) is published.
    pub(crate) fn admits_values<'v>(&self, route_value: &str, column: impl Fn(usize) -> Option<&'v str>) -> bool {
        let any = |globs: &[Glob], v: &str| globs.iter().any(|g| g.matches(v));
        (self.include.is_empty() || any(&self.include, route_value))
            && !any(&self.exclude, route_value)
            && self
                .where_
                .iter()
                .zip(&self.where_index)
                .all(|((_, globs), i)| column(*i).is_some_and(|v| any(globs, v)))
    }

    /// The same test as a publication row filter (PostgreSQL 15+: `... WHERE (<this>)`), over
    /// the route-by column `route_by`. Values are compared as text (`::text`, as the relay
    /// sees them); every name is quoted and every pattern a quoted `LIKE` literal.
    pub(crate) fn row_filter_sql(&self, route_by: &Ident) -> String {
        let like_any = |column: &Ident, globs: &[Glob]| {
            let terms: Vec<String> = globs
                .iter()
                .map(|g| format!("{}::text LIKE {}", column.quoted(), g.like_literal()))
                .collect();
            format!("({})", terms.join(" OR "))
        };
        let mut terms = Vec::new();
        if !self.include.is_empty() {
            terms.push(like_any(route_by, &self.include));
        }
        if !self.exclude.is_empty() {
            // NOT over a NULL route-by value is NULL, which filters the row out: such a row is a
            // bad event for the relay anyway, never a record.
            terms.push(format!("NOT {}", like_any(route_by, &self.exclude)));
        }
        for (column, globs) in &self.where_ {
            terms.push(like_any(column, globs));
        }
        terms.join(" AND ")
    }

    /// The filter for people (logs, `status`).
    pub(crate) fn describe(&self) -> String {
        let list = |g: &[Glob]| g.iter().map(|g| format!("{:?}", g.0)).collect::<Vec<_>>().join(", ");
        let mut parts = Vec::new();
        if !self.include.is_empty() {
            parts.push(format!("include [{}]", list(&self.include)));
        }
        if !self.exclude.is_empty() {
            parts.push(format!("exclude [{}]", list(&self.exclude)));
        }
        for (column, globs) in &self.where_ {
            parts.push(format!("{} in [{}]", column.as_str(), list(globs)));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn glob(g: &str) -> Glob {
        Glob(g.into())
    }

    #[test]
    fn globs_match_the_whole_value() {
        assert!(glob("order.*").matches("order.placed"));
        assert!(glob("order.*").matches("order."));
        assert!(!glob("order.*").matches("orders.placed"));
        assert!(glob("*.placed").matches("order.placed"));
        assert!(glob("o?der").matches("order"));
        assert!(!glob("o?der").matches("oder"));
        assert!(glob("*").matches(""));
        assert!(glob("a*b*c").matches("aXbYbZc"));
        assert!(!glob("a*b*c").matches("aXbYbZ"));
        assert!(glob("100%_x").matches("100%_x"), "% and _ are literal in globs");
        assert!(!glob("100%_x").matches("100abcx"));
    }

    #[test]
    fn like_literals_escape_what_like_treats_specially() {
        assert_eq!(glob("order.*").like_literal(), "'order.%'");
        assert_eq!(glob("a_b%c\\d?").like_literal(), r"'a\_b\%c\\d_'");
        assert_eq!(glob("it's").like_literal(), "'it''s'");
    }

    #[test]
    fn the_row_filter_quotes_names_and_combines_the_parts() {
        let section: FilterSection = toml::from_str(
            "include = [\"order.*\", \"invoice.*\"]\nexclude = [\"*.internal\"]\nwhere = { Tenant = [\"acme\"] }\n",
        )
        .unwrap();
        let filter = section.validate().unwrap().unwrap();
        let sql = filter.row_filter_sql(&Ident::exact("k", "type").unwrap());
        assert_eq!(
            sql,
            r#"("type"::text LIKE 'order.%' OR "type"::text LIKE 'invoice.%') AND NOT ("type"::text LIKE '%.internal') AND ("Tenant"::text LIKE 'acme')"#
        );
        assert_eq!(
            filter.describe(),
            r#"include ["order.*", "invoice.*"], exclude ["*.internal"], Tenant in ["acme"]"#
        );
    }

    #[test]
    fn an_empty_section_filters_nothing_and_bad_patterns_are_refused() {
        assert_eq!(FilterSection::default().validate().unwrap(), None);
        let err = FilterSection {
            include: vec![String::new()],
            ..FilterSection::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("filter.include"), "{err}");
        let mut where_ = BTreeMap::new();
        where_.insert("tenant".to_owned(), Vec::new());
        let err = FilterSection {
            where_,
            ..FilterSection::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("no patterns"), "{err}");
    }

    #[test]
    fn where_columns_are_read_once_and_tested() {
        let section: FilterSection =
            toml::from_str("exclude = [\"audit.*\"]\nwhere = { tenant = [\"acme\", \"glob*\"] }\n").unwrap();
        let mut filter = section.validate().unwrap().unwrap();
        let mut columns = vec![(Ident::exact("k", "tenant").unwrap(), "route.topic")];
        filter.place_columns(&mut columns);
        assert_eq!(columns.len(), 1, "a column the templates read already is read once");
        assert!(filter.admits_values("order.placed", |_| Some("globex")));
        assert!(filter.admits_values("order.placed", |_| Some("acme")));
        assert!(!filter.admits_values("order.placed", |_| Some("initech")));
        assert!(!filter.admits_values("order.placed", |_| None), "NULL matches nothing");
        assert!(!filter.admits_values("audit.read", |_| Some("acme")));
    }

    proptest! {
        /// The glob agrees with the regex it stands for.
        #[test]
        fn globs_agree_with_their_regex(pattern in "[ab.*?]{0,8}", text in "[ab.]{0,10}") {
            let regex: String = pattern
                .chars()
                .map(|c| match c {
                    '*' => ".*".to_owned(),
                    '?' => ".".to_owned(),
                    c => regex::escape(&c.to_string()),
                })
                .collect();
            let re = regex::Regex::new(&format!("^(?s:{regex})$")).unwrap();
            prop_assert_eq!(glob(&pattern).matches(&text), re.is_match(&text));
        }
    }
}
