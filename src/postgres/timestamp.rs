//! PostgreSQL's wire timestamp: signed microseconds since 2000-01-01 00:00:00 UTC.
//!
//! The replication protocol sends `TimestampTz` values in this integer form regardless of
//! `DateStyle`. Conversions saturate rather than panic: the value comes from the network,
//! and PostgreSQL itself reserves `i64::MIN`/`i64::MAX` for `-infinity`/`infinity`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch (2000-01-01).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// A PostgreSQL timestamp: microseconds since 2000-01-01 00:00:00 UTC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// Microseconds since the Unix epoch, saturating at the `i64` range.
    pub fn to_unix_micros(self) -> i64 {
        self.0.saturating_add(PG_EPOCH_UNIX_MICROS)
    }

    /// The same instant as a `SystemTime`, saturating at what the platform can represent.
    pub fn to_system_time(self) -> SystemTime {
        let unix = self.to_unix_micros();
        let offset = Duration::from_micros(unix.unsigned_abs());
        if unix >= 0 {
            saturating_shift(UNIX_EPOCH, offset, SystemTime::checked_add)
        } else {
            saturating_shift(UNIX_EPOCH, offset, SystemTime::checked_sub)
        }
    }

    /// The instant `t` in PostgreSQL's form, saturating at the `i64` range.
    pub fn from_system_time(t: SystemTime) -> PgTimestamp {
        let unix = match t.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
            Err(before) => 0i64.saturating_sub(i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX)),
        };
        PgTimestamp(unix.saturating_sub(PG_EPOCH_UNIX_MICROS))
    }
}

/// Moves `base` by `offset` in one direction, stopping at the furthest instant the
/// platform's `SystemTime` can hold (its range differs between operating systems).
fn saturating_shift(
    base: SystemTime,
    offset: Duration,
    step: impl Fn(&SystemTime, Duration) -> Option<SystemTime>,
) -> SystemTime {
    if let Some(t) = step(&base, offset) {
        return t;
    }
    // Greedy binary descent: try ever smaller chunks of what is left. A chunk size can be
    // taken at most twice (two halves of the size that failed), so this ends within a few
    // hundred tries even for nanosecond-sized final steps.
    let mut t = base;
    let mut left = offset;
    let mut chunk = offset;
    while !left.is_zero() && !chunk.is_zero() {
        let size = chunk.min(left);
        match step(&t, size) {
            Some(next) => {
                t = next;
                left = left.saturating_sub(size);
            }
            None => chunk /= 2,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_epoch_is_2000_01_01() {
        assert_eq!(PgTimestamp(0).to_unix_micros(), 946_684_800_000_000);
        assert_eq!(
            PgTimestamp(0).to_system_time(),
            UNIX_EPOCH + Duration::from_secs(946_684_800)
        );
        assert_eq!(
            PgTimestamp::from_system_time(UNIX_EPOCH + Duration::from_secs(946_684_800)),
            PgTimestamp(0)
        );
    }

    #[test]
    fn round_trips_through_system_time() {
        for micros in [-PG_EPOCH_UNIX_MICROS - 1, -1, 1, 815_000_000_123_456] {
            let ts = PgTimestamp(micros);
            assert_eq!(PgTimestamp::from_system_time(ts.to_system_time()), ts);
        }
    }

    #[test]
    fn extremes_saturate_instead_of_panicking() {
        assert_eq!(PgTimestamp(i64::MAX).to_unix_micros(), i64::MAX);
        assert_eq!(PgTimestamp(i64::MIN).to_unix_micros(), i64::MIN + PG_EPOCH_UNIX_MICROS);
        let late = PgTimestamp(i64::MAX).to_system_time();
        let early = PgTimestamp(i64::MIN).to_system_time();
        assert!(late > UNIX_EPOCH && early < UNIX_EPOCH);
        assert_eq!(
            PgTimestamp::from_system_time(late),
            PgTimestamp(i64::MAX - PG_EPOCH_UNIX_MICROS)
        );
    }

    #[test]
    fn saturating_shift_stops_at_the_limit() {
        // A step that refuses to go past 10 s shows the descent lands exactly on the edge.
        let limit = UNIX_EPOCH + Duration::from_secs(10);
        let capped = |t: &SystemTime, d: Duration| t.checked_add(d).filter(|n| *n <= limit);
        let got = saturating_shift(UNIX_EPOCH, Duration::from_secs(1_000), capped);
        assert_eq!(got, limit);
    }
}
