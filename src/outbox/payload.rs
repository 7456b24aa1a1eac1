//! How the payload column's value becomes the record value.
//!
//! Every source reads column values as PostgreSQL's text form (pgoutput's text format, the
//! poller's and the backfill's text selects). For `text`, `varchar`, `json` and `jsonb` that text
//! *is* the payload and passes through untouched, borrowed. A `bytea` payload (or a domain over
//! `bytea`) carries binary data — Avro, Protobuf, … — whose text form is `\x` and two hex digits
//! per byte (`bytea_output = hex`, which every connection of the relay pins): it is decoded back
//! to the bytes, as Debezium's `BinaryDataConverter` publishes them. A value that is not that form
//! is a [`BadEvent::Bytea`], never a panic.
//!
//! Whether the payload is binary is decided once per column type, not per row: for the stream
//! when the Relation is resolved (its column's type OID, see [`ByteaTypes`]), for the poller and
//! the backfill from the column type their preflight read.

use std::borrow::Cow;

use crate::outbox::bad_event::BadEvent;

/// `pg_type.oid` of `bytea`.
pub(crate) const BYTEA_OID: u32 = 17;

/// How the payload column's text becomes the record value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PayloadFormat {
    /// The text as it is (`text`, `varchar`, `json`, `jsonb`).
    #[default]
    Text,
    /// `\x…` hex text decoded to its bytes (`bytea`, or a domain over it).
    Bytea,
}

impl PayloadFormat {
    /// The record value of the payload column's text `raw`; `column` names the column, called
    /// only for an error. Text is borrowed; bytea is decoded into one allocation of exactly its
    /// length.
    pub(crate) fn value<'a>(self, raw: &'a [u8], column: impl FnOnce() -> String) -> Result<Cow<'a, [u8]>, BadEvent> {
        match self {
            PayloadFormat::Text => Ok(Cow::Borrowed(raw)),
            PayloadFormat::Bytea => decode_bytea_hex(raw).map(Cow::Owned).map_err(|cause| BadEvent::Bytea {
                column: column(),
                cause,
            }),
        }
    }
}

/// The type OIDs whose values are binary payloads: `bytea` and the domains over it (directly or
/// over another such domain), as the catalog listed them when the session started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ByteaTypes(Vec<u32>);

impl Default for ByteaTypes {
    /// `bytea` alone (no domains known).
    fn default() -> Self {
        ByteaTypes(vec![BYTEA_OID])
    }
}

impl ByteaTypes {
    /// `bytea` and the given domain OIDs.
    pub(crate) fn with_domains(domains: impl IntoIterator<Item = u32>) -> Self {
        let mut oids = vec![BYTEA_OID];
        oids.extend(domains.into_iter().filter(|&o| o != BYTEA_OID));
        ByteaTypes(oids)
    }

    /// The payload format of a column of type `type_oid`.
    pub(crate) fn format_of(&self, type_oid: u32) -> PayloadFormat {
        if self.0.contains(&type_oid) {
            PayloadFormat::Bytea
        } else {
            PayloadFormat::Text
        }
    }
}

/// Decodes PostgreSQL's hex `bytea` text (`\x` then an even number of hex digits, either case)
/// into its bytes. Strict: no whitespace, no escape format. The error says what is wrong.
pub(crate) fn decode_bytea_hex(text: &[u8]) -> Result<Vec<u8>, String> {
    let Some(digits) = text.strip_prefix(b"\\x") else {
        let start = String::from_utf8_lossy(&text[..text.len().min(8)]).into_owned();
        return Err(format!(
            "a bytea value must be in hex format (\\x…), but it starts with {start:?}; is bytea_output = escape forced on the server?"
        ));
    };
    if digits.len() % 2 != 0 {
        return Err(format!(
            "a hex bytea value has an odd number of hex digits ({})",
            digits.len()
        ));
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let digit = |at: usize| {
            hex_value(pair[at]).ok_or_else(|| {
                format!(
                    "a hex bytea value has an invalid digit {:?} at offset {}",
                    char::from(pair[at]),
                    2 + 2 * i + at
                )
            })
        };
        out.push(digit(0)? << 4 | digit(1)?);
    }
    Ok(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn valid_hex_decodes_to_its_bytes() {
        assert_eq!(
            decode_bytea_hex(b"\\x00ff80487A").unwrap(),
            vec![0x00, 0xFF, 0x80, 0x48, 0x7A]
        );
        assert_eq!(decode_bytea_hex(br"\x48656c6c6f").unwrap(), b"Hello");
    }

    #[test]
    fn an_empty_value_is_no_bytes() {
        assert_eq!(decode_bytea_hex(b"\\x").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn odd_length_is_refused() {
        let err = decode_bytea_hex(b"\\x0ff").unwrap_err();
        assert!(err.contains("odd number of hex digits (3)"), "{err}");
    }

    #[test]
    fn a_bad_digit_is_refused_with_its_offset() {
        let err = decode_bytea_hex(b"\\x00fg").unwrap_err();
        assert!(err.contains("'g'") && err.contains("offset 5"), "{err}");
        assert!(decode_bytea_hex(b"\\x00 f").is_err());
        assert!(decode_bytea_hex("\\x0é".as_bytes()).is_err());
    }

    #[test]
    fn the_prefix_is_required() {
        let err = decode_bytea_hex(b"48656c6c6f").unwrap_err();
        assert!(err.contains("hex format") && err.contains("\"48656c6c\""), "{err}");
        // Escape format, as with bytea_output = escape.
        assert!(decode_bytea_hex(b"Hello\\000").is_err());
        assert!(decode_bytea_hex(b"").is_err());
        assert!(decode_bytea_hex(b"\\").is_err());
    }

    #[test]
    fn text_is_borrowed_unchanged_and_bytea_is_decoded() {
        let raw = br#"{"a": "\x00"}"#;
        let text = PayloadFormat::Text.value(raw, String::new).unwrap();
        assert!(matches!(text, Cow::Borrowed(b) if b == raw));
        assert_eq!(
            PayloadFormat::Bytea
                .value(b"\\x00ff", || "payload".into())
                .unwrap()
                .as_ref(),
            [0x00, 0xFF]
        );
        let err = PayloadFormat::Bytea.value(b"\\x0", || "body".into()).unwrap_err();
        assert!(
            matches!(&err, BadEvent::Bytea { column, .. } if column == "body"),
            "{err}"
        );
        assert_eq!(err.label(), "bad_bytea");
        assert!(err.to_string().contains("\"body\""), "{err}");
    }

    #[test]
    fn bytea_and_its_domains_are_binary() {
        assert_eq!(ByteaTypes::default().format_of(BYTEA_OID), PayloadFormat::Bytea);
        assert_eq!(ByteaTypes::default().format_of(25), PayloadFormat::Text);
        let types = ByteaTypes::with_domains([16_500, 16_600]);
        assert_eq!(types.format_of(16_600), PayloadFormat::Bytea);
        assert_eq!(types.format_of(3802), PayloadFormat::Text);
    }

    proptest! {
        #[test]
        fn hex_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64), upper in any::<bool>()) {
            let hex: String = bytes.iter().map(|b| if upper { format!("{b:02X}") } else { format!("{b:02x}") }).collect();
            prop_assert_eq!(decode_bytea_hex(format!("\\x{hex}").as_bytes()).unwrap(), bytes);
        }

        #[test]
        fn arbitrary_input_never_panics(input in proptest::collection::vec(any::<u8>(), 0..32)) {
            let _ = decode_bytea_hex(&input);
        }
    }
}
