//! The producer's partitioner, computed outside librdkafka: `murmur2_random`, the Java client's
//! default for keyed records (the relay's `partitioner` default, `config.rs`).
//!
//! Invariant: for a record with a non-empty key and no explicit partition, [`partition_for`]
//! answers exactly what librdkafka's `murmur2_random` chooses for the same partition count —
//! Kafka's `Utils.murmur2` of the key bytes, made positive (`& 0x7fffffff`), modulo the count.
//! A record without a key (librdkafka then picks a random partition) has no computable
//! partition: callers must not assume one.

/// Kafka's `org.apache.kafka.common.utils.Utils.murmur2` (seed `0x9747b28c`), bit for bit.
pub(crate) fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    let mut h: u32 = SEED ^ (length as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition `murmur2_random` gives a record keyed `key` in a topic of `partition_count`
/// partitions; `None` without a key (librdkafka picks at random) or without partitions.
pub(crate) fn partition_for(key: &[u8], partition_count: i32) -> Option<i32> {
    if key.is_empty() || partition_count <= 0 {
        return None;
    }
    Some((murmur2(key) & 0x7fff_ffff) % partition_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors (`UtilsTest.testMurmur2`).
    #[test]
    fn matches_the_java_client() {
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), *want, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn partitions_are_positive_and_keyless_records_have_none() {
        assert_eq!(partition_for(b"foobar", 1), Some(0));
        for n in 1..50 {
            let p = partition_for(b"21", n).unwrap();
            assert!((0..n).contains(&p));
        }
        assert_eq!(partition_for(b"", 3), None);
        assert_eq!(partition_for(b"x", 0), None);
    }
}
