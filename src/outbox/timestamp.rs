//! The record timestamp of an event: the mapped timestamp column's text, in Unix milliseconds.

/// Parses a `timestamp`/`timestamptz` rendered with `DateStyle=ISO, TimeZone=UTC`
/// (`2026-11-22 15:20:00.123456+00`, offset optional) into Unix milliseconds.
/// Values Kafka cannot carry (`infinity`, BC dates, before 1970) give `None`, and the record
/// then gets the producer's own timestamp.
pub(crate) fn parse_timestamp_ms(text: &[u8]) -> Option<i64> {
    // Byte-wise: this runs for every event, and the generic `str` splitting and parsing it
    // replaced cost as much as decoding the whole row (callgrind, benches/cdc_vs_polling).
    if !text.is_ascii() {
        return None;
    }
    let space = text.iter().position(|&b| b == b' ')?;
    let (date, rest) = (&text[..space], &text[space + 1..]);
    let mut d = date.splitn(3, |&b| b == b'-');
    let year = digits(d.next()?)?;
    let month = digits(d.next()?)?;
    let day = digits(d.next()?)?;
    if rest.ends_with(b"BC") || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (time, offset) = match rest.iter().position(|&b| b == b'+' || b == b'-') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    let mut t = time.splitn(3, |&b| b == b':');
    let hour = digits(t.next()?)?;
    let minute = digits(t.next()?)?;
    let sec_text = t.next()?;
    let (whole, frac) = match sec_text.iter().position(|&b| b == b'.') {
        Some(i) => (&sec_text[..i], &sec_text[i + 1..]),
        None => (sec_text, &[][..]),
    };
    let second = digits(whole)?;
    let mut millis: i64 = 0;
    for (i, &b) in frac.iter().take(3).enumerate() {
        if !b.is_ascii_digit() {
            return None;
        }
        millis += i64::from(b - b'0') * 10_i64.pow(2 - i as u32);
    }
    let offset_secs = match offset {
        None => 0,
        Some(o) => {
            let sign = if o.first() == Some(&b'-') { -1 } else { 1 };
            let mut parts = o[1..].split(|&b| b == b':');
            let h = digits(parts.next()?)?;
            let m = parts.next().map_or(Some(0), digits)?;
            let s = parts.next().map_or(Some(0), digits)?;
            sign * (h * 3600 + m * 60 + s)
        }
    };
    let days = days_from_civil(year, month as u32, day as u32);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    let ms = secs.checked_mul(1000)?.checked_add(millis)?;
    (ms >= 0).then_some(ms)
}

/// A field of 1 to 9 ASCII digits. PostgreSQL's fields are shorter (years end at 294276); the
/// bound keeps every later multiplication far from overflowing.
fn digits(field: &[u8]) -> Option<i64> {
    if field.is_empty() || field.len() > 9 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(field.iter().fold(0, |n, &b| n * 10 + i64::from(b - b'0')))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iso_timestamps() {
        assert_eq!(parse_timestamp_ms(b"1970-01-01 00:00:00+00"), Some(0));
        assert_eq!(
            parse_timestamp_ms(b"2026-11-22 15:20:00.123456+00"),
            Some(1_795_360_800_123)
        );
        assert_eq!(parse_timestamp_ms(b"2026-11-22 16:20:00.5+01"), Some(1_795_360_800_500));
        assert_eq!(parse_timestamp_ms(b"2026-11-22 15:20:00"), Some(1_795_360_800_000));
        assert_eq!(parse_timestamp_ms(b"2000-02-29 00:00:00-05:30"), Some(951_802_200_000));
        assert_eq!(parse_timestamp_ms(b"infinity"), None);
        assert_eq!(parse_timestamp_ms(b"0044-03-15 12:00:00+00 BC"), None);
        assert_eq!(parse_timestamp_ms(b"garbage here"), None);
        assert_eq!(parse_timestamp_ms(b"\xff"), None);
    }

    /// The `str`-based parser the byte-wise one replaced, kept as the oracle for well-formed input.
    fn reference_parse(text: &[u8]) -> Option<i64> {
        let s = std::str::from_utf8(text).ok()?;
        let (date, rest) = s.split_once(' ')?;
        let mut d = date.splitn(3, '-');
        let year: i64 = d.next()?.parse().ok()?;
        let month: u32 = d.next()?.parse().ok()?;
        let day: u32 = d.next()?.parse().ok()?;
        if rest.ends_with("BC") || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
            return None;
        }
        let (time, offset) = match rest.find(['+', '-']) {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let mut t = time.splitn(3, ':');
        let hour: i64 = t.next()?.parse().ok()?;
        let minute: i64 = t.next()?.parse().ok()?;
        let sec_text = t.next()?;
        let (whole, frac) = sec_text.split_once('.').unwrap_or((sec_text, ""));
        let second: i64 = whole.parse().ok()?;
        let mut millis: i64 = 0;
        for (i, c) in frac.chars().take(3).enumerate() {
            millis += i64::from(c.to_digit(10)?) * 10_i64.pow(2 - i as u32);
        }
        let offset_secs = match offset {
            None => 0,
            Some(o) => {
                let sign = if o.starts_with('-') { -1 } else { 1 };
                let mut parts = o[1..].split(':');
                let h: i64 = parts.next()?.parse().ok()?;
                let m: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
                let s: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
                sign * (h * 3600 + m * 60 + s)
            }
        };
        let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
        let ms = secs.checked_mul(1000)?.checked_add(millis)?;
        (ms >= 0).then_some(ms)
    }

    proptest::proptest! {
        /// Everything PostgreSQL renders for timestamp/timestamptz in ISO style, and near misses.
        #[test]
        fn byte_parser_agrees_with_the_reference(
            year in 1i64..=294_276, month in 0u32..=13, day in 0u32..=32,
            hour in 0u32..=24, minute in 0u32..=59, second in 0u32..=60,
            frac in proptest::option::of("[0-9]{1,6}"),
            offset in proptest::option::of((proptest::bool::ANY, 0u32..=15, proptest::option::of((0u32..=59, proptest::option::of(0u32..=59))))),
            bc in proptest::bool::ANY,
        ) {
            let mut text = format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}");
            if let Some(f) = frac {
                text.push('.');
                text.push_str(&f);
            }
            if let Some((negative, h, rest)) = offset {
                text.push_str(&format!("{}{h:02}", if negative { '-' } else { '+' }));
                if let Some((m, s)) = rest {
                    text.push_str(&format!(":{m:02}"));
                    if let Some(s) = s {
                        text.push_str(&format!(":{s:02}"));
                    }
                }
            }
            if bc {
                text.push_str(" BC");
            }
            proptest::prop_assert_eq!(parse_timestamp_ms(text.as_bytes()), reference_parse(text.as_bytes()), "{}", text);
        }

        #[test]
        fn byte_parser_never_panics(text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let _ = parse_timestamp_ms(&text);
        }
    }
}
