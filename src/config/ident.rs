//! SQL identifiers taken from configuration.
//!
//! Table and column names reach SQL text (`CREATE PUBLICATION … FOR TABLE …`, `SELECT … FROM …`),
//! so they are parsed with PostgreSQL's own rules and re-emitted quoted; a hostile name can never
//! break out of its identifier. The rules follow the parser: an unquoted name is folded to lower
//! case and may only contain letters, digits, `_` and `$` (not first); a double-quoted name is kept
//! exactly, with `""` standing for one `"`. Names longer than `NAMEDATALEN - 1` (63 bytes) would be
//! silently truncated by the server, so they are rejected here instead.
//!
//! Slot and publication names travel inside replication commands and option strings
//! (`publication_names '…'`), where quoting rules differ; they are restricted to the plain form
//! PostgreSQL documents for slot names: lower-case letters, digits and underscores.

use std::fmt;

/// The longest identifier PostgreSQL keeps without truncating (NAMEDATALEN - 1).
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 63;

/// Why a configured name is unusable, phrased for the person editing the config file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentError {
    #[error("{what} is empty; set it to a name such as \"outbox_relay\"")]
    Empty { what: &'static str },
    #[error("{what} {value:?} is longer than 63 bytes; PostgreSQL would truncate it. Use a shorter name")]
    TooLong { what: &'static str, value: String },
    #[error("{what} {value:?} has an unterminated double quote; close it, e.g. \"\\\"MyTable\\\"\"")]
    UnterminatedQuote { what: &'static str, value: String },
    #[error(
        "{what} {value:?} has characters an unquoted SQL name cannot have; \
         write it as a double-quoted identifier (\"\\\"{value}\\\"\") if that is really its name"
    )]
    InvalidUnquoted { what: &'static str, value: String },
    #[error("{what} {value:?} must be lower-case letters, digits and underscores (at most 63), e.g. \"outbox_relay\"")]
    InvalidSimpleName { what: &'static str, value: String },
    #[error("{what} {value:?} has more than two dot-separated parts; write it as schema.table")]
    TooManyParts { what: &'static str, value: String },
    #[error("{what} {value:?} contains a NUL character")]
    Nul { what: &'static str, value: String },
}

/// One SQL identifier, stored in its exact (case-preserved, unquoted) form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    /// Parses one identifier using SQL rules (see module docs).
    pub(crate) fn parse(what: &'static str, text: &str) -> Result<Self, IdentError> {
        let parts = split_qualified(what, text)?;
        match parts.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(IdentError::InvalidUnquoted {
                what,
                value: text.to_owned(),
            }),
        }
    }

    /// A name taken verbatim, as the catalogs store it: how Debezium options name columns (its
    /// field names are the column names, case and all). Refuses only what no column can be named.
    pub(crate) fn exact(what: &'static str, name: &str) -> Result<Self, IdentError> {
        if name.contains('\0') {
            return Err(IdentError::Nul {
                what,
                value: name.to_owned(),
            });
        }
        if name.is_empty() {
            return Err(IdentError::InvalidUnquoted {
                what,
                value: String::new(),
            });
        }
        Ok(Ident(name.to_owned()))
    }

    /// The name as the catalogs store it (what pgoutput Relation messages carry).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as SQL text, always double-quoted.
    pub(crate) fn quoted(&self) -> String {
        quote_ident(&self.0)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

/// A schema-qualified table name; `schema` defaults to `public` when the config omits it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    pub(crate) schema: Ident,
    pub(crate) name: Ident,
}

impl TableName {
    pub(crate) fn parse(what: &'static str, text: &str) -> Result<Self, IdentError> {
        let mut parts = split_qualified(what, text)?;
        match parts.len() {
            1 => Ok(TableName {
                schema: Ident("public".into()),
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.remove(1);
                Ok(TableName {
                    schema: parts.remove(0),
                    name,
                })
            }
            _ => Err(IdentError::TooManyParts {
                what,
                value: text.to_owned(),
            }),
        }
    }

    /// `"schema"."table"`, safe to splice into SQL.
    pub(crate) fn quoted(&self) -> String {
        format!("{}.{}", self.schema.quoted(), self.name.quoted())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

/// A slot or publication name: `[a-z0-9_]{1,63}`, safe inside replication commands unquoted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SimpleName(String);

impl SimpleName {
    pub(crate) fn parse(what: &'static str, text: &str) -> Result<Self, IdentError> {
        if text.is_empty() {
            return Err(IdentError::Empty { what });
        }
        let ok = text.len() <= MAX_IDENTIFIER_BYTES
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(IdentError::InvalidSimpleName {
                what,
                value: text.to_owned(),
            });
        }
        Ok(SimpleName(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SimpleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Double-quotes an identifier, doubling embedded quotes.
pub(crate) fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn split_qualified(what: &'static str, text: &str) -> Result<Vec<Ident>, IdentError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(IdentError::Empty { what });
    }
    if trimmed.contains('\0') {
        return Err(IdentError::Nul {
            what,
            value: text.to_owned(),
        });
    }
    let mut parts = Vec::new();
    let mut chars = trimmed.chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                if c == '"' {
                    if chars.peek() == Some(&'"') {
                        chars.next();
                        part.push('"');
                    } else {
                        closed = true;
                        break;
                    }
                } else {
                    part.push(c);
                }
            }
            if !closed {
                return Err(IdentError::UnterminatedQuote {
                    what,
                    value: text.to_owned(),
                });
            }
            if part.is_empty() {
                return Err(IdentError::Empty { what });
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                part.push(c);
                chars.next();
            }
            let valid = part
                .chars()
                .next()
                .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
            if !valid {
                return Err(IdentError::InvalidUnquoted {
                    what,
                    value: text.to_owned(),
                });
            }
            part = part.to_ascii_lowercase();
        }
        if part.len() > MAX_IDENTIFIER_BYTES {
            return Err(IdentError::TooLong {
                what,
                value: text.to_owned(),
            });
        }
        parts.push(Ident(part));
        match chars.next() {
            None => break,
            Some('.') => continue,
            Some(_) => {
                return Err(IdentError::InvalidUnquoted {
                    what,
                    value: text.to_owned(),
                })
            }
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unquoted_names_fold_to_lower_case() {
        let t = TableName::parse("outbox.table", "Public.Events_Outbox").unwrap();
        assert_eq!(t.schema.as_str(), "public");
        assert_eq!(t.name.as_str(), "events_outbox");
        assert_eq!(t.quoted(), r#""public"."events_outbox""#);
    }

    #[test]
    fn quoted_names_keep_case_dots_and_quotes() {
        let t = TableName::parse("outbox.table", r#""Sales Dept"."Out""box.v2""#).unwrap();
        assert_eq!(t.schema.as_str(), "Sales Dept");
        assert_eq!(t.name.as_str(), "Out\"box.v2");
        assert_eq!(t.quoted(), r#""Sales Dept"."Out""box.v2""#);
    }

    #[test]
    fn schema_defaults_to_public() {
        let t = TableName::parse("outbox.table", "outbox").unwrap();
        assert_eq!(t.schema.as_str(), "public");
    }

    #[test]
    fn injection_attempts_are_rejected_or_neutralised() {
        assert!(TableName::parse("t", "outbox; DROP TABLE x").is_err());
        assert!(TableName::parse("t", "a.b.c").is_err());
        assert!(TableName::parse("t", "\"open").is_err());
        assert!(Ident::parse("c", "id--").is_err());
        let q = Ident::parse("c", r#""x"";drop""#).unwrap();
        assert_eq!(q.quoted(), r#""x"";drop""#);
        assert!(SimpleName::parse("slot", "Slot").is_err());
        assert!(SimpleName::parse("slot", "a'b").is_err());
        assert!(SimpleName::parse("slot", "").is_err());
        assert!(SimpleName::parse("slot", &"a".repeat(64)).is_err());
        assert!(SimpleName::parse("slot", "outbox_relay_1").is_ok());
    }

    #[test]
    fn literal_quoting_doubles_single_quotes() {}
}
