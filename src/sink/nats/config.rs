//! `[nats]`: the NATS JetStream sink — the server URL(s), the stream events are stored in, and
//! the few client settings the relay exposes (docs/sink-nats.md).
//!
//! The URL may carry credentials (`nats://user:password@host:4222`, `nats://token@host:4222`);
//! it is kept in a [`NatsUrl`], whose `Debug`/`Display` mask them, and is never logged as is.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::sink::SinkSection;
use crate::config::{optional_number, ConfigError};
use crate::sink::plugin::{Absent, SectionSpec};
use crate::sink::requests::{Millis, RequestKeys, Requests};

/// NATS's default `max_payload` (1 MiB): the largest message (headers and payload) a server
/// accepts unless configured otherwise.
pub(crate) const DEFAULT_MAX_PAYLOAD: u64 = 1024 * 1024;
const DEFAULT_ACK_TIMEOUT_MS: u64 = 10_000;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
const MASK: &str = "********";

/// The raw `[nats]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NatsSection {
    /// One server or several, comma-separated: `nats://host:4222`, `tls://…`, `user:pass@` or
    /// `token@` in the URL.
    url: NatsUrl,
    /// The JetStream stream every event must land in.
    stream: String,
    /// The stream's subjects: `setup` creates the stream with them (it needs them when the
    /// stream is missing), and `run` checks the stream covers them. Left out, `run` takes the
    /// stream as it is. Either way a routed subject outside the stream's subjects is a bad event.
    #[serde(default, deserialize_with = "list_or_comma_string")]
    subjects: Option<Vec<String>>,
    /// The largest message the relay builds (headers and payload): the server's `max_payload`.
    #[serde(default, deserialize_with = "optional_number")]
    max_payload: Option<u64>,
    /// How long a publish waits for its PubAck before the record fails (transient).
    #[serde(default, deserialize_with = "optional_number")]
    ack_timeout_ms: Option<u64>,
    /// How long connecting may take.
    #[serde(default, deserialize_with = "optional_number")]
    connect_timeout_ms: Option<u64>,
    /// A NATS credentials file (`.creds`: JWT and NKey seed).
    #[serde(default)]
    creds_file: Option<PathBuf>,
    /// A PEM file of CA certificates to verify the server with (TLS is then required).
    #[serde(default)]
    tls_ca: Option<PathBuf>,
}

fn list_or_comma_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrString {
        L(Vec<String>),
        S(String),
    }
    Ok(Some(match ListOrString::deserialize(d)? {
        ListOrString::L(l) => l,
        ListOrString::S(s) => s.split(',').map(|p| p.trim().to_owned()).collect(),
    }))
}

/// The server URL(s) as configured: credentials inside, printed masked.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub(crate) struct NatsUrl(String);

impl NatsUrl {
    /// The real value, for the client library only.
    #[cfg(test)]
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Each server of the list, trimmed.
    pub(crate) fn servers(&self) -> Vec<&str> {
        self.0.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()
    }
}

/// A NATS URL list with the password (`user:password@`) or token (`token@`) masked.
pub(crate) fn redact_nats_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let (scheme, rest) = match part.find("://") {
                Some(i) => part.split_at(i + 3),
                None => ("", part),
            };
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => {
                    let userinfo = &rest[..at];
                    let shown = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:{MASK}"),
                        None => MASK.to_owned(),
                    };
                    format!("{scheme}{shown}{}", &rest[at..])
                }
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_nats_url(&self.0))
    }
}

impl std::fmt::Display for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_nats_url(&self.0))
    }
}

/// `[nats]`, validated.
#[derive(Debug, Clone)]
pub struct NatsSettings {
    pub(crate) url: NatsUrl,
    pub(crate) stream: String,
    /// `[nats] subjects`, if set (`setup` creates the stream with them; `run` checks it covers them).
    pub(crate) subjects: Option<Vec<String>>,
    pub(crate) max_payload: usize,
    /// `ack_timeout_ms`: how long a publish waits for its PubAck.
    pub(crate) requests: Requests,
    pub(crate) connect_timeout: Duration,
    pub(crate) creds_file: Option<PathBuf>,
    pub(crate) tls_ca: Option<PathBuf>,
}

impl NatsSection {
    pub(crate) fn validate(self) -> Result<NatsSettings, ConfigError> {
        let servers = self.url.servers();
        if servers.is_empty() {
            return Err(ConfigError::Invalid {
                key: "nats.url",
                message: "is empty; set it to the server, e.g. url = \"nats://127.0.0.1:4222\"".into(),
            });
        }
        for server in &servers {
            if server.parse::<async_nats::ServerAddr>().is_err() {
                return Err(ConfigError::Invalid {
                    key: "nats.url",
                    message: format!(
                        "{} is not a NATS server URL; expected e.g. nats://127.0.0.1:4222 (several comma-separated)",
                        redact_nats_url(server)
                    ),
                });
            }
        }
        let stream = self.stream.trim().to_owned();
        validate_stream_name(&stream).map_err(|m| ConfigError::Invalid {
            key: "nats.stream",
            message: format!("{stream:?} {m}"),
        })?;
        if self.subjects.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConfigError::Invalid {
                key: "nats.subjects",
                message:
                    "is empty; leave it out (the stream as it is) or list the stream's subjects, e.g. [\"outbox.>\"]"
                        .into(),
            });
        }
        let subjects = self.subjects;
        for s in subjects.iter().flatten() {
            validate_subject(s, true).map_err(|m| ConfigError::Invalid {
                key: "nats.subjects",
                message: format!("{s:?} {m}"),
            })?;
        }
        let max_payload = self.max_payload.unwrap_or(DEFAULT_MAX_PAYLOAD);
        if max_payload < 1024 {
            return Err(ConfigError::Invalid {
                key: "nats.max_payload",
                message: format!("{max_payload} is too small; leave it out (1 MiB) or set the server's max_payload"),
            });
        }
        Ok(NatsSettings {
            url: self.url,
            stream,
            subjects,
            max_payload: usize::try_from(max_payload).unwrap_or(usize::MAX),
            requests: REQUESTS.validate(None, None, self.ack_timeout_ms)?,
            connect_timeout: Millis {
                key: "nats.connect_timeout_ms",
                default: DEFAULT_CONNECT_TIMEOUT_MS,
                least: 1,
            }
            .validate(self.connect_timeout_ms)?,
            creds_file: self.creds_file,
            tls_ca: self.tls_ca,
        })
    }
}

/// `ack_timeout_ms`, checked as every request sink's timeout (NATS has no concurrency keys:
/// its publishes are pipelined on one connection).
const REQUESTS: RequestKeys = RequestKeys {
    concurrency: None,
    requests: None,
    timeout: Millis {
        key: "nats.ack_timeout_ms",
        default: DEFAULT_ACK_TIMEOUT_MS,
        least: 1,
    },
};

/// The sink's name for people, in errors and logs (the section's `name`).
pub(crate) const SINK: &str = "NATS JetStream";

/// The config half of `[nats]`, `[sink] kind = "nats"` (required).
pub(crate) const SECTION: SectionSpec<NatsSection, NatsSettings> = SectionSpec {
    kind: "nats",
    name: SINK,
    absent: Absent::Refused(
        "[sink] kind = \"nats\" needs a [nats] section: add `[nats]` with url = \"nats://host:4222\" and \
         stream = \"OUTBOX\" (docs/sink-nats.md)",
    ),
    validate: NatsSection::validate,
    binary_refused: Some(
        "is \"binary\" with [sink] kind = \"nats\": the CloudEvents NATS protocol binding (1.0.2) defines the \
         structured content mode only. Set mode = \"structured\"",
    ),
};

impl SinkSection for NatsSettings {}

/// JetStream's stream-name rule: printable, no whitespace, `.`, `*`, `>`, path separators.
pub(crate) fn validate_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty; name the JetStream stream, e.g. stream = \"OUTBOX\"".into());
    }
    if name.len() > 255 {
        return Err("is longer than 255 bytes".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "contains {c:?}; a stream name may not contain whitespace, '.', '*', '>', '/' or '\\'"
        ));
    }
    Ok(())
}

/// The NATS subject rule. `wildcards`: a stream's subject filter (`*` and a final `>` allowed);
/// otherwise a subject to publish to, where they are not.
pub(crate) fn validate_subject(subject: &str, wildcards: bool) -> Result<(), String> {
    // Every record is checked (routing, then the publisher): the common valid subject is
    // settled in one pass over its bytes, without allocating; anything else takes the long way,
    // which also words the error.
    if plainly_valid_subject(subject, wildcards) {
        return Ok(());
    }
    subject_error(subject, wildcards)
}

/// Whether `subject` is valid for certain: ASCII without whitespace or control characters,
/// 1..=4096 bytes, no empty token, wildcards only as whole tokens (and only if allowed), `>` last.
fn plainly_valid_subject(subject: &str, wildcards: bool) -> bool {
    if subject.is_empty() || subject.len() > 4096 {
        return false;
    }
    let mut tokens = subject.as_bytes().split(|&b| b == b'.').peekable();
    while let Some(token) = tokens.next() {
        match token {
            [] => return false,
            [b'*'] if wildcards => {}
            [b'>'] if wildcards && tokens.peek().is_none() => {}
            // Whitespace and control characters, DEL and anything not ASCII (whose Unicode
            // whitespace the worded rule judges), or a wildcard inside a token.
            _ if token.iter().any(|&b| b <= b' ' || b >= 0x7f || b == b'*' || b == b'>') => return false,
            _ => {}
        }
    }
    true
}

/// The rule of [`validate_subject`], worded: `Err` says what is wrong.
fn subject_error(subject: &str, wildcards: bool) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is empty; a NATS subject needs at least one token".into());
    }
    if subject.len() > 4096 {
        return Err("is longer than 4096 bytes".into());
    }
    if let Some(c) = subject.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("contains {c:?}; NATS subjects may not contain whitespace"));
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Err("has an empty token (a leading, trailing or doubled '.')".into());
        }
        let is_wild = *token == "*" || *token == ">";
        if is_wild && !wildcards {
            return Err(format!(
                "has the wildcard token {token:?}; a message is published to a concrete subject"
            ));
        }
        if *token == ">" && i + 1 != tokens.len() {
            return Err("has '>' before its last token".into());
        }
        if !is_wild && (token.contains('*') || token.contains('>')) {
            return Err(format!("has {token:?}: '*' and '>' are only wildcards as whole tokens"));
        }
    }
    Ok(())
}

/// Whether the subject filter `filter` (wildcards allowed) matches every subject `inner` (a
/// subject or a filter) matches. Token by token, without collecting (it runs per record).
pub(crate) fn filter_covers(filter: &str, inner: &str) -> bool {
    let mut inner_tokens = inner.as_bytes().split(|&b| b == b'.');
    for ft in filter.as_bytes().split(|&b| b == b'.') {
        if ft == b">" {
            return inner_tokens.next().is_some();
        }
        let Some(st) = inner_tokens.next() else { return false };
        match (ft, st) {
            (b"*", b">") => return false,
            (b"*", _) => {}
            (a, b) if a == b => {}
            _ => return false,
        }
    }
    inner_tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter rule as first written (one `Vec` per call), which the per-record version must match.
    fn reference_filter_covers(filter: &str, inner: &str) -> bool {
        let f: Vec<&str> = filter.split('.').collect();
        let s: Vec<&str> = inner.split('.').collect();
        for (i, ft) in f.iter().enumerate() {
            if *ft == ">" {
                return s.len() > i;
            }
            let Some(st) = s.get(i) else { return false };
            match (*ft, *st) {
                ("*", ">") => return false,
                ("*", _) => {}
                (a, b) if a == b => {}
                _ => return false,
            }
        }
        f.len() == s.len()
    }

    proptest::proptest! {
        #[test]
        fn subject_rules_agree_with_the_reference(
            subject in "[a-z*>. \t\u{7f}\u{a0}é-]{0,12}",
            filter in "[a-z*>.]{0,8}",
            wildcards in proptest::bool::ANY,
        ) {
            // The one-pass check only ever says "valid" where the worded rule does.
            proptest::prop_assert_eq!(
                validate_subject(&subject, wildcards),
                subject_error(&subject, wildcards)
            );
            proptest::prop_assert_eq!(
                filter_covers(&filter, &subject),
                reference_filter_covers(&filter, &subject)
            );
        }
    }

    fn section(toml: &str) -> Result<NatsSettings, String> {
        let s: NatsSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_goes_with_the_kind() {
        use crate::config::test_support::load;
        let base = "[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n";
        let load_text = |t: &str| {
            crate::config::Settings::from_toml_str(t, std::path::Path::new("t.toml"), std::iter::empty())
                .map_err(|e| e.to_string())
        };
        let ok = load_text(&format!(
            "{base}[sink]\nkind = \"nats\"\n[nats]\nurl = \"nats://u:pw@127.0.0.1:4222\"\nstream = \"OUTBOX\"\n"
        ))
        .unwrap();
        assert_eq!(ok.sink.label(), "nats");
        assert_eq!(ok.sink.section::<NatsSettings>().unwrap().stream, "OUTBOX");
        assert!(!format!("{ok:?}").contains(":pw@127.0.0.1:4222"));
        let e = load_text(&format!("{base}[sink]\nkind = \"nats\"\n")).unwrap_err();
        assert!(e.contains("needs a [nats] section"), "{e}");
        let e = load("[nats]\nurl = \"nats://h:4222\"\nstream = \"S\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("remove the section"), "{e}");
        let env = load_text(&format!("{base}[sink]\nkind = \"nats\"\n"));
        assert!(env.is_err());
        let ok = crate::config::Settings::from_toml_str(
            &format!("{base}[sink]\nkind = \"nats\"\n"),
            std::path::Path::new("t.toml"),
            [
                ("OUTBOX_RELAY__NATS__URL".to_owned(), "nats://127.0.0.1:4333".to_owned()),
                ("OUTBOX_RELAY__NATS__STREAM".to_owned(), "S2".to_owned()),
            ],
        )
        .unwrap();
        assert_eq!(
            ok.sink.section::<NatsSettings>().unwrap().url.expose(),
            "nats://127.0.0.1:4333"
        );
    }

    #[test]
    fn defaults_and_keys() {
        let s = section("url = \"nats://127.0.0.1:4222\"\nstream = \"OUTBOX\"").unwrap();
        assert_eq!(s.subjects, None);
        assert_eq!(s.max_payload, 1024 * 1024);
        assert_eq!(s.requests.timeout, Duration::from_secs(10));
        let s = section(
            "url = \"nats://a:4222, nats://b:4222\"\nstream = \"S\"\nsubjects = \"outbox.>, dlq\"\nmax_payload = \"2048\"\nack_timeout_ms = 500",
        )
        .unwrap();
        assert_eq!(s.url.servers(), vec!["nats://a:4222", "nats://b:4222"]);
        assert_eq!(s.subjects, Some(vec!["outbox.>".to_owned(), "dlq".to_owned()]));
        assert_eq!(s.max_payload, 2048);
        assert_eq!(s.requests.timeout, Duration::from_millis(500));
    }

    #[test]
    fn errors_name_the_key() {
        let e = section("url = \"nats://h:4222\"\nstream = \"a.b\"").unwrap_err();
        assert!(e.contains("nats.stream"), "{e}");
        let e = section("url = \"nats://h:4222\"\nstream = \"S\"\nsubjects = [\"a.>.b\"]").unwrap_err();
        assert!(e.contains("nats.subjects"), "{e}");
        let e = section("url = \"\"\nstream = \"S\"").unwrap_err();
        assert!(e.contains("nats.url"), "{e}");
        let e = section("url = \"nats://h:4222\"\nstream = \"S\"\nbogus = 1").unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn credentials_are_masked() {
        let url = NatsUrl("nats://relay:s3cret@h1:4222,nats://tok3n@h2:4222,nats://h3:4222".into());
        let shown = format!("{url} {url:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("tok3n"), "{shown}");
        assert!(
            shown.contains("relay:********@h1:4222") && shown.contains("nats://h3:4222"),
            "{shown}"
        );
    }

    #[test]
    fn subject_rules() {
        assert!(validate_subject("orders.created", false).is_ok());
        for bad in ["", "a..b", ".a", "a.", "a b", "a.*", "a.>", "a*b"] {
            assert!(validate_subject(bad, false).is_err(), "{bad:?}");
        }
        assert!(validate_subject("a.*.>", true).is_ok());
        assert!(validate_subject("a.>.b", true).is_err());
    }

    #[test]
    fn coverage() {
        assert!(filter_covers(">", "a.b"));
        assert!(filter_covers("a.>", "a.b.c"));
        assert!(!filter_covers("a.>", "a"));
        assert!(filter_covers("a.*", "a.b"));
        assert!(!filter_covers("a.*", "a.b.c"));
        assert!(filter_covers("a.*.c", "a.*.c"));
        assert!(!filter_covers("a.*", "a.>"));
        assert!(filter_covers(">", "a.>"));
        assert!(!filter_covers("a.b", "a.c"));
    }
}
