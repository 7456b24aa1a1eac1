//! Keeping secrets out of logs, status output and metrics.
//!
//! Connection strings carry passwords in two shapes: URLs (`postgres://user:pw@host/db`) and
//! libpq key/value strings (`host=… password=pw`). Every place that prints a connection string
//! goes through [`redact_connection_string`]; configuration values that are secrets are wrapped in
//! [`Secret`], whose `Debug`/`Display` never show the value.

use std::fmt;

const MASK: &str = "********";

/// A configuration value that must never be printed.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct Secret(String);

impl Secret {
    #[cfg(test)]
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The real value, for handing to a client library only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_connection_string(&self.0))
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_connection_string(&self.0))
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Replaces the password of a URL or key/value connection string with a mask.
/// Strings without a password come back unchanged (so it is safe on any text).
pub(crate) fn redact_connection_string(s: &str) -> String {
    if let Some(scheme_end) = s.find("://") {
        let rest_start = scheme_end + 3;
        let rest = &s[rest_start..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let mut out = String::with_capacity(s.len());
        out.push_str(&s[..rest_start]);
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push(':');
                        out.push_str(MASK);
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        out.push_str(&redact_query_password(&rest[authority_end..]));
        return out;
    }
    redact_key_value_password(s)
}

fn redact_query_password(query: &str) -> String {
    let Some(qpos) = query.find('?') else {
        return query.to_owned();
    };
    let (path, params) = query.split_at(qpos + 1);
    let redacted: Vec<String> = params
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if is_secret_key(k) => format!("{k}={MASK}"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}{}", redacted.join("&"))
}

fn redact_key_value_password(s: &str) -> String {
    // libpq key/value: `key=value` pairs separated by spaces; values may be single-quoted.
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let key_start = rest[..eq].rfind(char::is_whitespace).map_or(0, |i| i + 1);
        let key = rest[key_start..eq].trim();
        out.push_str(&rest[..=eq]);
        let after = &rest[eq + 1..];
        let value_len = if let Some(quoted) = after.strip_prefix('\'') {
            let mut end = None;
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '\'' if !escaped => {
                        end = Some(i + 2);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            end.unwrap_or(after.len())
        } else {
            after.find(char::is_whitespace).unwrap_or(after.len())
        };
        if is_secret_key(key) {
            out.push_str(MASK);
        } else {
            out.push_str(&after[..value_len]);
        }
        rest = &after[value_len..];
    }
    out.push_str(rest);
    out
}

/// Configuration keys (Postgres or librdkafka) whose values are secrets.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password") || k.contains("secret") || k.ends_with(".key.pem") || k == "sslpassword"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_url_passwords() {
        assert_eq!(
            redact_connection_string("postgres://relay:s3cr%40t@db:5432/app?sslmode=require"),
            "postgres://relay:********@db:5432/app?sslmode=require"
        );
        assert_eq!(
            redact_connection_string("postgresql://u:p@h/db?password=x&sslmode=require"),
            "postgresql://u:********@h/db?password=********&sslmode=require"
        );
        assert_eq!(redact_connection_string("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn masks_key_value_passwords() {
        assert_eq!(
            redact_connection_string("host=db user=u password=hunter2 dbname=app"),
            "host=db user=u password=******** dbname=app"
        );
        assert_eq!(
            redact_connection_string("host=db password='a b\\' c' dbname=app"),
            "host=db password=******** dbname=app"
        );
    }

    #[test]
    fn secret_never_prints_its_password() {
        let s = Secret::new("postgres://u:topsecret@h/db");
        assert!(!format!("{s:?} {s}").contains("topsecret"));
        assert_eq!(s.expose(), "postgres://u:topsecret@h/db");
    }
}
