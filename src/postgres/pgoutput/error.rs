//! Why a pgoutput message could not be decoded.

use crate::postgres::cursor::{count, show_byte};

/// A malformed or unsupported pgoutput message.
///
/// `message` fields name the message being decoded ("Insert", "Relation", ...; empty while
/// reading the tag). `column` fields are the 1-based position among the columns sent, when
/// the problem is inside one column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "{} ends early while reading {}: need {}, {remaining} left",
        subject(message),
        place(reading, *column),
        count(*needed, "byte")
    )]
    UnexpectedEof {
        message: &'static str,
        reading: &'static str,
        column: Option<u16>,
        needed: usize,
        remaining: usize,
    },

    #[error(
        "unknown pgoutput message tag {}; protocol versions 1 and 2 define B, C, O, R, Y, I, U, D, T, M, S, E, c and A",
        show_byte(*.0)
    )]
    UnknownMessageTag(u8),

    #[error("unknown pgoutput tuple column kind {}; expected n, u, t or b", show_byte(*.0))]
    UnknownTupleKind(u8),

    #[error("unknown pgoutput old-tuple marker {}; expected K or O", show_byte(*.0))]
    UnknownOldTupleMarker(u8),

    #[error(
        "{} has tuple marker {} where {} was expected",
        subject(message),
        show_byte(*found),
        show_byte(*expected)
    )]
    UnexpectedTupleMarker {
        message: &'static str,
        expected: u8,
        found: u8,
    },

    #[error("{} has invalid UTF-8 in {}", subject(message), place(field, *column))]
    InvalidUtf8 {
        message: &'static str,
        field: &'static str,
        column: Option<u16>,
    },

    #[error(
        "{} ends inside {}: the string has no NUL terminator",
        subject(message),
        place(field, *column)
    )]
    UnterminatedString {
        message: &'static str,
        field: &'static str,
        column: Option<u16>,
    },

    #[error(
        "{} has {} after a complete message",
        subject(message),
        count(*remaining, "unexpected trailing byte")
    )]
    TrailingBytes { message: &'static str, remaining: usize },

    #[error(
        "{} declares a negative {} of {length}",
        subject(message),
        place(field, *column)
    )]
    NegativeLength {
        message: &'static str,
        field: &'static str,
        column: Option<u16>,
        length: i32,
    },
}

fn subject(message: &str) -> String {
    if message.is_empty() {
        "pgoutput message".to_owned()
    } else {
        format!("pgoutput {message} message")
    }
}

fn place(what: &str, column: Option<u16>) -> String {
    match column {
        Some(n) => format!("column {n} {what}"),
        None => what.to_owned(),
    }
}

/// An Insert whose column 3 value is cut short (the decoder's tests meet it too).
#[cfg(test)]
pub(super) const SHORT_INSERT_VALUE: DecodeError = DecodeError::UnexpectedEof {
    message: "Insert",
    reading: "value",
    column: Some(3),
    needed: 12,
    remaining: 4,
};

/// How [`SHORT_INSERT_VALUE`] reads.
#[cfg(test)]
pub(super) const SHORT_INSERT_VALUE_TEXT: &str =
    "pgoutput Insert message ends early while reading column 3 value: need 12 bytes, 4 left";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_sentences() {
        assert_eq!(SHORT_INSERT_VALUE.to_string(), SHORT_INSERT_VALUE_TEXT);
        let tag = DecodeError::UnexpectedEof {
            message: "",
            reading: "message tag",
            column: None,
            needed: 1,
            remaining: 0,
        };
        assert_eq!(
            tag.to_string(),
            "pgoutput message ends early while reading message tag: need 1 byte, 0 left"
        );
        assert_eq!(
            DecodeError::UnknownMessageTag(b'P').to_string(),
            "unknown pgoutput message tag 0x50 ('P'); protocol versions 1 and 2 define B, C, O, R, Y, I, U, D, T, M, S, E, c and A"
        );
        assert_eq!(
            DecodeError::UnknownTupleKind(0).to_string(),
            "unknown pgoutput tuple column kind 0x00; expected n, u, t or b"
        );
        assert_eq!(
            DecodeError::TrailingBytes {
                message: "Begin",
                remaining: 1
            }
            .to_string(),
            "pgoutput Begin message has 1 unexpected trailing byte after a complete message"
        );
        assert_eq!(
            DecodeError::NegativeLength {
                message: "Insert",
                field: "value length",
                column: Some(1),
                length: -2
            }
            .to_string(),
            "pgoutput Insert message declares a negative column 1 value length of -2"
        );
    }
}
