//! Quantities for people: byte counts in binary units, instants in UTC.

/// Bytes in binary units for people: `512 B`, `1.5 KiB`, `16.0 MiB`, `2.3 GiB`.
pub(crate) fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let sign = if bytes < 0 { "-" } else { "" };
    let magnitude = bytes.unsigned_abs();
    if magnitude < 1024 {
        return format!("{sign}{magnitude} B");
    }
    let mut value = magnitude as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{sign}{value:.1} {}", UNITS[unit])
}

/// Microseconds since the Unix epoch as `2024-05-01T12:34:56.789012Z` (UTC, proleptic
/// Gregorian), e.g. for a value an operator pastes into `setup --backfill --since`.
pub(crate) fn utc_from_unix_us(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// Days since 1970-01-01 as (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A wall-clock instant as [`utc_from_unix_us`] renders it.
pub(crate) fn utc_from_system_time(t: std::time::SystemTime) -> String {
    let us = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    };
    utc_from_unix_us(us)
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, utc_from_system_time, utc_from_unix_us};

    #[test]
    fn system_times_render_like_unix_microseconds() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(1_709_210_096_123_456);
        assert_eq!(utc_from_system_time(t), "2024-02-29T12:34:56.123456Z");
    }

    #[test]
    fn utc_instants_render_like_rfc3339() {
        assert_eq!(utc_from_unix_us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc_from_unix_us(1_709_210_096_123_456), "2024-02-29T12:34:56.123456Z");
        assert_eq!(utc_from_unix_us(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn human_bytes_picks_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(16 * 1024 * 1024), "16.0 MiB");
        assert_eq!(human_bytes(5 * 1024 * 1024 * 1024 / 2), "2.5 GiB");
        assert_eq!(human_bytes(-2048), "-2.0 KiB");
        assert_eq!(human_bytes(i64::MIN), "-8.0 EiB");
    }
}
