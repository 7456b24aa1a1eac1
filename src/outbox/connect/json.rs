//! JSON text exactly as Kafka Connect's `JsonConverter` writes it (Jackson's `UTF8JsonGenerator`
//! with Connect's settings): no whitespace; strings escaped like Jackson (`"` and `\`, control
//! characters as `\b \t \n \f \r` or `\u00XX` with upper-case hex, characters beyond the Basic
//! Multilingual Plane as a `\uXXXX\uXXXX` surrogate pair, everything else as UTF-8);
//! doubles as Java's `Double.toString`; bytes as standard base64 with padding.
//!
//! Pure functions appending to a buffer; no allocation beyond the buffer's growth.

use std::fmt::Write as _;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `s` as a JSON string literal, escaped as Jackson escapes it.
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut plain_from = 0;
    for (i, c) in s.char_indices() {
        let escape: Option<&[u8]> = match c {
            '"' => Some(b"\\\""),
            '\\' => Some(b"\\\\"),
            '\u{08}' => Some(b"\\b"),
            '\t' => Some(b"\\t"),
            '\n' => Some(b"\\n"),
            '\u{0C}' => Some(b"\\f"),
            '\r' => Some(b"\\r"),
            _ => None,
        };
        let needs = escape.is_some() || (c as u32) < 0x20 || (c as u32) > 0xFFFF;
        if !needs {
            continue;
        }
        out.extend_from_slice(&s.as_bytes()[plain_from..i]);
        plain_from = i + c.len_utf8();
        match escape {
            Some(e) => out.extend_from_slice(e),
            None => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    unicode_escape(out, *unit);
                }
            }
        }
    }
    out.extend_from_slice(&s.as_bytes()[plain_from..]);
    out.push(b'"');
}

fn unicode_escape(out: &mut Vec<u8>, unit: u16) {
    out.extend_from_slice(b"\\u");
    for shift in [12, 8, 4, 0] {
        out.push(HEX[usize::from((unit >> shift) & 0xF)]);
    }
}

/// Appends `v` as Java's `Double.toString` prints it (which Jackson uses for a double): the
/// shortest digits that read back as `v`; plain notation with at least one fractional digit for
/// 10⁻³ ≤ |v| < 10⁷ (`100.0`, `0.001`), otherwise `d.dddE±n` (`1.0E7`, `2.5E-10`). Infinities and
/// NaN as Jackson writes them with Connect's settings: quoted.
///
/// Java before 19 printed a few values with more digits than needed (JDK-4511638, e.g.
/// `2.0E-3` is fine but `1.0E23` is printed `1.0E23` and `2.82879384806159E17` as
/// `2.82879384806159008E17`); this follows the corrected algorithm of Java 19 and later.
pub(crate) fn double(out: &mut Vec<u8>, v: f64) {
    if v.is_nan() {
        out.extend_from_slice(b"\"NaN\"");
        return;
    }
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"\"Infinity\"" } else { b"\"-Infinity\"" });
        return;
    }
    if v == 0.0 {
        out.extend_from_slice(if v.is_sign_negative() { b"-0.0" } else { b"0.0" });
        return;
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: `d[.ddd]e[-]n`.
    let mut sci = format!("{:e}", v.abs());
    if !sci.contains('.') {
        // Java always prints two significant digits (`d.dE…`), and of the two-digit decimals
        // that read back as `v` it takes the closest (`4.9E-324`, not `5.0E-324`).
        let two = format!("{:.1e}", v.abs());
        if two.parse::<f64>() == Ok(v.abs()) {
            sci = two;
        }
    }
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    if v.is_sign_negative() {
        out.push(b'-');
    }
    let mut text = String::with_capacity(digits.len() + 8);
    if (-3..7).contains(&exp) {
        if exp < 0 {
            text.push_str("0.");
            for _ in 0..(-exp - 1) {
                text.push('0');
            }
            text.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                text.push_str(&digits);
                for _ in digits.len()..int_len {
                    text.push('0');
                }
                text.push_str(".0");
            } else {
                text.push_str(&digits[..int_len]);
                text.push('.');
                text.push_str(&digits[int_len..]);
            }
        }
    } else {
        text.push_str(&digits[..1]);
        text.push('.');
        text.push_str(if digits.len() > 1 { &digits[1..] } else { "0" });
        let _ = write!(text, "E{exp}");
    }
    out.extend_from_slice(text.as_bytes());
}

/// Appends `bytes` as a JSON string of their standard base64 (with padding), as Jackson writes a
/// binary node.
pub(crate) fn base64(out: &mut Vec<u8>, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.push(b'"');
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        let sextets = [(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63];
        for (i, s) in sextets.iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[*s as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strings_escape_like_jackson() {
        assert_eq!(s(|o| string(o, "a\"b\\c")), r#""a\"b\\c""#);
        assert_eq!(s(|o| string(o, "\u{8}\t\n\u{c}\r")), r#""\b\t\n\f\r""#);
        assert_eq!(s(|o| string(o, "\u{0}\u{1f}\u{7f}")), "\"\\u0000\\u001F\u{7f}\"");
        assert_eq!(s(|o| string(o, "é / € 😀")), "\"é / € \\uD83D\\uDE00\"");
        assert_eq!(s(|o| string(o, "")), "\"\"");
    }

    #[test]
    fn doubles_print_like_java() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (100.0, "100.0"),
            (2.5, "2.5"),
            (-2.5, "-2.5"),
            (0.001, "0.001"),
            (0.0001, "1.0E-4"),
            (2.5e-10, "2.5E-10"),
            (1234567.0, "1234567.0"),
            (12345678.0, "1.2345678E7"),
            (1e7, "1.0E7"),
            (1e20, "1.0E20"),
            (std::f64::consts::PI, "3.141592653589793"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.7976931348623157e308, "1.7976931348623157E308"),
            (4.9e-324, "4.9E-324"),
            (123.456, "123.456"),
            (0.5, "0.5"),
            (5e-324 * 3.0, "1.5E-323"),
        ];
        for (v, want) in cases {
            assert_eq!(s(|o| double(o, *v)), *want, "{v}");
        }
        assert_eq!(s(|o| double(o, f64::INFINITY)), "\"Infinity\"");
    }

    #[test]
    fn base64_with_padding() {
        assert_eq!(s(|o| base64(o, b"")), "\"\"");
        assert_eq!(s(|o| base64(o, b"f")), "\"Zg==\"");
        assert_eq!(s(|o| base64(o, b"fo")), "\"Zm8=\"");
        assert_eq!(s(|o| base64(o, b"foo")), "\"Zm9v\"");
        assert_eq!(s(|o| base64(o, &[0, 1, 2, 0xff, 0xfe])), "\"AAEC//4=\"");
    }
}
