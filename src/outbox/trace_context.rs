//! W3C Trace Context: whether a `traceparent` read from `outbox.trace_column` is well formed.
//!
//! The relay passes the value on untouched either way (a consumer may understand what we do not,
//! and an event is never held back for its tracing); the check only feeds the
//! `outbox_relay_traceparent_invalid_total` metric, so operators see producers writing garbage.
//! Invariant: pure and allocation-free; [`check_traceparent`] accepts exactly what the W3C
//! recommendation (Trace Context Level 1, "traceparent Header") lets a receiver parse.

/// Why a `traceparent` is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TraceParentError {
    #[error("is {0} bytes long; a version-00 traceparent is exactly 55 (00-<32 hex>-<16 hex>-<2 hex>)")]
    Length(usize),
    #[error("does not have '-' between its four fields")]
    Separator,
    #[error("has a version that is not two lower-case hex digits")]
    Version,
    #[error("has version ff, which is forbidden")]
    VersionFf,
    #[error("has a trace-id that is not 32 lower-case hex digits")]
    TraceId,
    #[error("has an all-zero trace-id")]
    ZeroTraceId,
    #[error("has a parent-id that is not 16 lower-case hex digits")]
    ParentId,
    #[error("has an all-zero parent-id")]
    ZeroParentId,
    #[error("has trace-flags that are not two lower-case hex digits")]
    Flags,
}

/// Length of a version-00 `traceparent`: `vv-` + 32 + `-` + 16 + `-` + 2.
const LEN: usize = 55;

/// Checks `value` against the `traceparent` grammar: `version-traceid-parentid-flags`, lower-case
/// hex, version not `ff`, ids not all zero. Version `00` must be exactly 55 bytes; a later
/// version may carry more after a `-` (the spec's forward compatibility).
pub(crate) fn check_traceparent(value: &[u8]) -> Result<(), TraceParentError> {
    if value.len() < LEN {
        return Err(TraceParentError::Length(value.len()));
    }
    let version = &value[0..2];
    if !is_lower_hex(version) {
        return Err(TraceParentError::Version);
    }
    if version == b"ff" {
        return Err(TraceParentError::VersionFf);
    }
    if version == b"00" && value.len() != LEN {
        return Err(TraceParentError::Length(value.len()));
    }
    if value.len() > LEN && value[LEN] != b'-' {
        return Err(TraceParentError::Separator);
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return Err(TraceParentError::Separator);
    }
    let (trace_id, parent_id, flags) = (&value[3..35], &value[36..52], &value[53..55]);
    if !is_lower_hex(trace_id) {
        return Err(TraceParentError::TraceId);
    }
    if trace_id.iter().all(|&b| b == b'0') {
        return Err(TraceParentError::ZeroTraceId);
    }
    if !is_lower_hex(parent_id) {
        return Err(TraceParentError::ParentId);
    }
    if parent_id.iter().all(|&b| b == b'0') {
        return Err(TraceParentError::ZeroParentId);
    }
    if !is_lower_hex(flags) {
        return Err(TraceParentError::Flags);
    }
    Ok(())
}

fn is_lower_hex(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_is_valid() {
        assert_eq!(check_traceparent(VALID.as_bytes()), Ok(()));
        assert_eq!(
            check_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            Ok(())
        );
        // A later version may append fields after a '-'.
        assert_eq!(
            check_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever"),
            Ok(())
        );
    }

    #[test]
    fn each_broken_rule_is_named() {
        let check = |s: &str| check_traceparent(s.as_bytes());
        use TraceParentError::*;
        assert_eq!(check(""), Err(Length(0)));
        assert_eq!(check(&VALID[..54]), Err(Length(54)));
        assert_eq!(check(&format!("{VALID}-")), Err(Length(56)), "version 00 is exactly 55");
        assert_eq!(
            check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"),
            Err(Separator)
        );
        assert_eq!(check(&VALID.replacen("00-", "ff-", 1)), Err(VersionFf));
        assert_eq!(check(&VALID.replacen("00-", "0g-", 1)), Err(Version));
        assert_eq!(check(&VALID.replacen("00-", "0A-", 1)), Err(Version));
        assert_eq!(check(&VALID.replace('-', "_")), Err(Separator));
        assert_eq!(check(&VALID.replace("4bf9", "4BF9")), Err(TraceId));
        assert_eq!(
            check("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Err(ZeroTraceId)
        );
        assert_eq!(check(&VALID.replace("00f067aa", "00f067zz")), Err(ParentId));
        assert_eq!(
            check("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Err(ZeroParentId)
        );
        assert_eq!(check(&VALID.replace("b7-01", "b7-0x")), Err(Flags));
        assert!(Length(54).to_string().contains("55"));
    }

    proptest! {
        #[test]
        fn generated_valid_values_pass(
            trace in "[0-9a-f]{31}[1-9a-f]", parent in "[1-9a-f][0-9a-f]{15}", flags in "[0-9a-f]{2}",
        ) {
            let v = format!("00-{trace}-{parent}-{flags}");
            prop_assert_eq!(check_traceparent(v.as_bytes()), Ok(()));
        }

        #[test]
        fn arbitrary_bytes_never_panic(value in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = check_traceparent(&value);
        }
    }
}
