//! Reading a connector config the way Kafka Connect takes it: the JSON body of
//! `POST /connectors` (`{"name": …, "config": {…}}`) or the bare config object, or a Java
//! `.properties` file (`connect-standalone`'s connector file, loaded with
//! `java.util.Properties.load`). Either way the result is one flat map of option → string,
//! because that is all a connector ever sees.

use std::collections::BTreeMap;
use std::path::Path;

use super::ImportError;

/// A connector config as Kafka Connect hands it to the connector.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ConnectorConfig {
    /// The connector's name (`name`, at the top of the REST body or among the properties).
    pub(crate) name: Option<String>,
    /// Every option, by name. Later duplicates win, as in both Java parsers.
    pub(crate) options: BTreeMap<String, String>,
}

/// Parses `bytes` from `path`: JSON when the first non-blank character is `{` (a properties key
/// cannot sensibly start with one), Java properties otherwise.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<ConnectorConfig, ImportError> {
    // Properties.load(InputStream) reads ISO-8859-1; files written today are mostly UTF-8, so
    // UTF-8 is tried first and Latin-1 (every byte is a char) is the fallback.
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.to_owned(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let config = if text.trim_start().starts_with('{') {
        parse_json(path, text)?
    } else {
        parse_properties(path, text)?
    };
    if config.options.is_empty() {
        return Err(ImportError::Malformed {
            path: path.to_owned(),
            line: None,
            message: "holds no connector options; expected the JSON posted to Kafka Connect or a .properties file"
                .into(),
        });
    }
    Ok(config)
}

fn parse_json(path: &Path, text: &str) -> Result<ConnectorConfig, ImportError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| ImportError::Malformed {
        path: path.to_owned(),
        line: Some(e.line()),
        message: format!("is not valid JSON: {e}"),
    })?;
    let serde_json::Value::Object(top) = value else {
        return Err(malformed(
            path,
            "is JSON but not an object; expected {\"name\": …, \"config\": {…}} or the config object itself",
        ));
    };
    // The REST API's shape has a "config" object; the bare shape (PUT /connectors/x/config, and
    // many files in the wild) is the config itself.
    let (name, config) = match top.get("config") {
        Some(serde_json::Value::Object(config)) => (
            top.get("name").and_then(|n| n.as_str()).map(str::to_owned),
            config.clone(),
        ),
        Some(_) => return Err(malformed(path, "has a \"config\" member that is not an object")),
        None => (None, top),
    };
    let mut options = BTreeMap::new();
    for (key, value) in config {
        // Connect accepts JSON numbers and booleans for its string-typed options, as their text.
        let text = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Null => continue,
            serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                return Err(malformed(
                    path,
                    &format!("option {key:?} is a JSON array or object; connector options are strings"),
                ))
            }
        };
        options.insert(key, text);
    }
    let name = name.or_else(|| options.get("name").cloned());
    Ok(ConnectorConfig { name, options })
}

fn malformed(path: &Path, message: &str) -> ImportError {
    ImportError::Malformed {
        path: path.to_owned(),
        line: None,
        message: message.to_owned(),
    }
}

/// `java.util.Properties.load` semantics: `#`/`!` comment lines, `key=value`, `key: value` or
/// `key value`, a line ending in an odd number of backslashes continues on the next (whose
/// leading blanks are dropped), and `\t \n \r \f \uXXXX` escapes (any other escaped character
/// stands for itself, so `\=`, `\:`, `\ `, `\\`).
fn parse_properties(path: &Path, text: &str) -> Result<ConnectorConfig, ImportError> {
    let mut options = BTreeMap::new();
    let lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    let mut i = 0;
    while i < lines.len() {
        let first_line = i + 1;
        let start = lines[i].trim_start_matches(is_blank);
        i += 1;
        if start.is_empty() || start.starts_with('#') || start.starts_with('!') {
            continue;
        }
        // Join continuation lines into one logical line.
        let mut logical = String::from(start);
        while ends_in_odd_backslashes(&logical) {
            logical.pop();
            match lines.get(i) {
                Some(next) => {
                    logical.push_str(next.trim_start_matches(is_blank));
                    i += 1;
                }
                None => break,
            }
        }
        let (key, value) = split_key_value(&logical);
        let key = unescape(key).map_err(|m| line_error(path, first_line, m))?;
        let value = unescape(value).map_err(|m| line_error(path, first_line, m))?;
        options.insert(key, value);
    }
    let name = options.get("name").cloned();
    Ok(ConnectorConfig { name, options })
}

fn line_error(path: &Path, line: usize, message: String) -> ImportError {
    ImportError::Malformed {
        path: path.to_owned(),
        line: Some(line),
        message,
    }
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{c}')
}

fn ends_in_odd_backslashes(s: &str) -> bool {
    s.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

/// Splits a logical line at the first unescaped `=`, `:` or blank; blanks around the separator
/// (and one `=`/`:` after blanks) belong to neither side.
fn split_key_value(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    for (at, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || is_blank(c) {
            key_end = at;
            break;
        }
    }
    let key = &line[..key_end];
    let mut rest = line[key_end..].trim_start_matches(is_blank);
    if let Some(r) = rest.strip_prefix('=').or_else(|| rest.strip_prefix(':')) {
        rest = r.trim_start_matches(is_blank);
    }
    (key, rest)
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .ok_or_else(|| format!("malformed \\uXXXX escape \"\\u{hex}\" (four hex digits expected)"))?;
                // A UTF-16 surrogate pair arrives as two escapes; anything unpaired is invalid.
                let ch = if (0xD800..0xDC00).contains(&code) {
                    let low = chars
                        .as_str()
                        .strip_prefix("\\u")
                        .and_then(|r| r.get(..4))
                        .and_then(|h| u32::from_str_radix(h, 16).ok());
                    match low {
                        Some(low @ 0xDC00..=0xDFFF) => {
                            chars.by_ref().take(6).for_each(drop);
                            char::from_u32(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))
                        }
                        _ => None,
                    }
                } else {
                    char::from_u32(code)
                };
                out.push(
                    ch.ok_or_else(|| format!("\\u{hex} is not a character on its own (an unpaired UTF-16 surrogate)"))?,
                );
            }
            Some(other) => out.push(other),
            // A trailing lone backslash (a continuation at end of file) is dropped, as Java does.
            None => {}
        }
    }
    Ok(out)
}
