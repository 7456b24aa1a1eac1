//! A bounds-checked cursor over one received message.
//!
//! Every read checks the remaining length first and reports a [`Short`] instead of
//! panicking, so decoders built on it are panic-free on arbitrary input. Reads of byte runs
//! are zero-copy: they return `Bytes` that share the input's allocation.

use std::fmt::Write as _;

use bytes::{Buf, Bytes};

/// A read needed more bytes than were left. Callers add what they were reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short {
    pub(crate) needed: usize,
    pub(crate) remaining: usize,
}

/// The fixed-size big-endian reads, one per type: `u16()` reads a `u16` with `Bytes::get_u16`
/// once [`Reader::number`] found its width left.
macro_rules! numbers {
    ($($ty:ident => $get:ident),* $(,)?) => {
        $(
            pub(crate) fn $ty(&mut self) -> Result<$ty, Short> {
                self.number(Bytes::$get)
            }
        )*
    };
}

#[derive(Debug, Clone)]
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn ensure(&self, needed: usize) -> Result<(), Short> {
        let remaining = self.buf.len();
        if remaining < needed {
            return Err(Short { needed, remaining });
        }
        Ok(())
    }

    /// A fixed-size big-endian number: checks its width is left, then reads it with `get`.
    fn number<T>(&mut self, get: fn(&mut Bytes) -> T) -> Result<T, Short> {
        self.ensure(std::mem::size_of::<T>())?;
        Ok(get(&mut self.buf))
    }

    numbers! {
        u8 => get_u8,
        u16 => get_u16,
        u32 => get_u32,
        i32 => get_i32,
        u64 => get_u64,
        i64 => get_i64,
    }

    /// The next `n` bytes, sharing the input's allocation.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, Short> {
        self.ensure(n)?;
        Ok(self.buf.split_to(n))
    }

    /// A NUL-terminated string's bytes (without the NUL), or `None` when no NUL is left.
    pub(crate) fn cstr(&mut self) -> Option<Bytes> {
        let end = self.buf.iter().position(|&b| b == 0)?;
        let s = self.buf.split_to(end);
        // The NUL found above is now the first byte.
        self.buf.advance(1);
        Some(s)
    }

    /// Everything that is left.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }
}

/// Error-message helpers shared by the frame codec and the pgoutput decoder.
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A protocol byte as both hex and, when printable, the character the docs use for it.
pub(crate) fn show_byte(b: u8) -> String {
    let mut s = format!("0x{b:02X}");
    if b.is_ascii_graphic() {
        let _ = write!(s, " ('{}')", char::from(b));
    }
    s
}

/// The property every decoder built on [`Reader`] has: whatever it is given, it returns an error
/// rather than panicking.
#[cfg(test)]
pub(crate) mod fuzz {
    use bytes::Bytes;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    /// Fewer than `max_len` arbitrary bytes.
    fn noise(max_len: usize) -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..max_len).prop_map(Bytes::from)
    }

    /// One of `tags`, then fewer than `max_len` arbitrary bytes: input that gets past the
    /// decoder's first `match`.
    fn after_tag(tags: &[u8], max_len: usize) -> impl Strategy<Value = Bytes> {
        (prop::sample::select(tags.to_vec()), noise(max_len)).prop_map(|(tag, rest)| {
            let mut v = vec![tag];
            v.extend_from_slice(&rest);
            Bytes::from(v)
        })
    }

    /// Feeds `decode` fewer than `noise_len` arbitrary bytes, then one of `tags` followed by
    /// fewer than `rest_len` of them; a panic fails the test with the input that caused it.
    pub(crate) fn never_panics<T, E>(
        decode: fn(Bytes) -> Result<T, E>,
        tags: &[u8],
        noise_len: usize,
        rest_len: usize,
    ) {
        let config = Config {
            failure_persistence: None,
            ..Config::default()
        };
        for input in [noise(noise_len).boxed(), after_tag(tags, rest_len).boxed()] {
            TestRunner::new(config.clone())
                .run(&input, |bytes| {
                    let _ = decode(bytes);
                    Ok(())
                })
                .unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_reports_short_reads() {
        let mut r = Reader::new(Bytes::from_static(&[0, 1, 0, 0, 0, 2, 0xFF]));
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u32(), Ok(2));
        assert_eq!(
            r.u16(),
            Err(Short {
                needed: 2,
                remaining: 1
            })
        );
        // A failed read consumes nothing.
        assert_eq!(r.u8(), Ok(0xFF));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn cstr_needs_a_terminator() {
        let mut r = Reader::new(Bytes::from_static(b"ab\0cd"));
        assert_eq!(r.cstr().as_deref(), Some(&b"ab"[..]));
        assert_eq!(r.cstr(), None);
        assert_eq!(r.rest(), Bytes::from_static(b"cd"));
    }

    #[test]
    fn byte_runs_share_the_input() {
        let input = Bytes::from_static(b"hello");
        let mut r = Reader::new(input.clone());
        let head = r.bytes(4).unwrap();
        assert_eq!(head.as_ptr(), input.as_ptr());
        assert_eq!(
            r.bytes(2),
            Err(Short {
                needed: 2,
                remaining: 1
            })
        );
    }
}
