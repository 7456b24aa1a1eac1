//! Quantities for people: byte counts in binary units.

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

#[cfg(test)]
mod tests {
    use super::human_bytes;

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
