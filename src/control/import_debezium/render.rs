//! The generated TOML file: sections of comments and `key = value` lines, every key and value
//! quoted by the `toml` crate's rules (connector values are arbitrary text).

/// One line of a section.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Line {
    Comment(String),
    Set(String, toml::Value),
    /// Written commented out: the value could not be used as it is (the comment before says why).
    Disabled(String, toml::Value),
}

/// A TOML key: bare when TOML allows it, a quoted string otherwise (`"key.converter"`).
pub(crate) fn key(k: &str) -> String {
    if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        k.to_owned()
    } else {
        string(k)
    }
}

/// A TOML string literal with whatever escaping `s` needs.
pub(crate) fn string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML value on one line (strings quoted, tables inline, in key order).
pub(crate) fn value(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) if t.is_empty() => "{}".to_owned(),
        toml::Value::Table(t) => {
            let pairs: Vec<String> = t.iter().map(|(k, v)| format!("{} = {}", key(k), value(v))).collect();
            format!("{{ {} }}", pairs.join(", "))
        }
        other => other.to_string(),
    }
}

/// Appends `text` as `#` comment lines (one per line of `text`).
pub(crate) fn comment(out: &mut String, text: &str) {
    for line in text.lines() {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
    }
}

/// Appends `[name]` and its lines; a section with no lines is left out.
pub(crate) fn section(out: &mut String, name: &str, lines: &[Line]) {
    if lines.is_empty() {
        return;
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&format!("[{name}]\n"));
    for line in lines {
        match line {
            Line::Comment(text) => comment(out, text),
            Line::Set(k, v) => out.push_str(&format!("{} = {}\n", key(k), value(v))),
            Line::Disabled(k, v) => out.push_str(&format!("# {} = {}\n", key(k), value(v))),
        }
    }
}
