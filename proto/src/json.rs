//! JSON strings and integers written byte for byte as `serde_json` writes
//! them, for the lines the bus renders for every event a consumer reads
//! (`ndjson::parts`). `serde_json` looks up every byte of a string in its
//! escape table; a payload is mostly bytes that need no escape, so here
//! eight bytes at a time are checked at once and copied as a run.
//!
//! The rules (serde_json's): `"` and `\` are escaped with a backslash;
//! backspace, form feed, newline, carriage return and tab by their short
//! escapes; every other byte below 0x20 as `\u00XX` with lowercase hex;
//! everything else, 0x7f and non-ASCII included, as it is.

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

/// Whether any of the eight bytes in `w` is below 0x20, `"` or `\`.
fn any_to_escape(w: u64) -> bool {
    let below_space = w.wrapping_sub(0x20 * ONES) & !w & HIGH;
    let quote = w ^ (u64::from(b'"') * ONES);
    let quote = quote.wrapping_sub(ONES) & !quote & HIGH;
    let backslash = w ^ (u64::from(b'\\') * ONES);
    let backslash = backslash.wrapping_sub(ONES) & !backslash & HIGH;
    (below_space | quote | backslash) != 0
}

/// The escape of byte `b`, if it needs one: the character after the
/// backslash (`u` for `\u00XX`).
fn escape_of(b: u8) -> Option<u8> {
    match b {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        b'\n' => Some(b'n'),
        b'\r' => Some(b'r'),
        b'\t' => Some(b't'),
        0..=0x1f => Some(b'u'),
        _ => None,
    }
}

/// Appends `s` as a JSON string, quotes included.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            if !any_to_escape(u64::from_ne_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        i += 1;
        let Some(e) = escape_of(b) else {
            continue;
        };
        out.extend_from_slice(&bytes[run..i - 1]);
        run = i;
        if e == b'u' {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.push(b'\\');
            out.push(e);
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Appends an integer as JSON writes it.
pub fn write_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ours(s: &str) -> String {
        let mut out = vec![];
        write_str(&mut out, s);
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn every_byte_below_0x80_as_serde_json_writes_it() {
        for b in 0u8..0x80 {
            let s = format!("ab{}cdefghij{}", b as char, b as char);
            assert_eq!(ours(&s), serde_json::to_string(&s).unwrap(), "byte {b:#x}");
        }
    }

    #[test]
    fn runs_around_escapes_and_at_the_ends() {
        for s in [
            "",
            "\"",
            "\\\\",
            "12345678\"",
            "\"12345678",
            "é😀\u{7f}\u{1}",
            "{\"pad\":\"pppppppppppppppp\"}",
        ] {
            assert_eq!(ours(s), serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }

    proptest! {
        #[test]
        fn any_string_as_serde_json_writes_it(s in ".{0,80}|[a-z\"\\\\\u{0}-\u{1f}\u{7f}é]{0,40}") {
            prop_assert_eq!(ours(&s), serde_json::to_string(&s).unwrap());
        }

        #[test]
        fn any_integer_as_serde_json_writes_it(a in any::<i64>(), b in any::<u64>()) {
            let mut out = vec![];
            write_int(&mut out, a);
            write_int(&mut out, b);
            prop_assert_eq!(String::from_utf8(out).unwrap(), format!("{a}{b}"));
        }
    }
}
