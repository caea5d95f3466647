//! `LineBatch`: NDJSON lines the bus renders once and sends as the same
//! bytes to every subscription that takes the same events as a first
//! delivery. Each line is the contract's line ([`crate::ndjson`]) without
//! its `subscribe_id`; the consumer knows its subscription id and inserts
//! `,"subscribe_id":"…"` at each line's cut ([`expand`]), which gives
//! exactly the bytes [`write_line`] renders for that subscription.
//!
//! Both sides share this file: the bus renders with [`render_line`] and
//! frames with [`frame_prefix`] and [`body_key`] (so the two large fields,
//! `cuts` and `body`, can be slices of one shared buffer, written without a
//! copy); `dws` expands with [`expand`], refusing any batch whose cuts do
//! not describe its body.

use std::fmt;

use bytes::{BufMut, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

use crate::{codec::CodecError, ndjson::write_line, MAX_FRAME_LEN};

/// Bytes of one line's cut in `LineBatch.cuts`: head length, line length.
pub const CUT_LEN: usize = 8;

const LINE_BATCH_FIELD: u32 = 15; // ServerFrame.kind.line_batch
const FIRST_SEQ_FIELD: u32 = 1;
const COUNT_FIELD: u32 = 2;
const CUTS_FIELD: u32 = 3;
const BODY_FIELD: u32 = 4;

/// Appends one event's line without `subscribe_id` to `body` and its cut
/// to `cuts` (a first delivery: `redelivered` false).
pub fn render_line(
    body: &mut Vec<u8>,
    cuts: &mut Vec<u8>,
    head: &[u8],
    tail: &[u8],
    delivery: u32,
) {
    let start = body.len();
    write_line(body, head, "", tail, false, delivery);
    cuts.extend_from_slice(&(head.len() as u32).to_le_bytes());
    cuts.extend_from_slice(&((body.len() - start) as u32).to_le_bytes());
}

/// Appends one event's raw line (`--format raw`: the payload and a
/// newline) to `body` and its cut (head 0: nothing is inserted) to `cuts`.
pub fn render_raw_line(body: &mut Vec<u8>, cuts: &mut Vec<u8>, data: &[u8]) {
    body.extend_from_slice(data);
    body.push(b'\n');
    cuts.extend_from_slice(&0u32.to_le_bytes());
    cuts.extend_from_slice(&(data.len() as u32 + 1).to_le_bytes());
}

/// What a consumer inserts at each cut: `,"subscribe_id":"<id>"`, JSON
/// escaped; empty for an empty id (the field is then omitted).
pub fn subscription_fragment(id: &str) -> Vec<u8> {
    let mut v = Vec::new();
    if !id.is_empty() {
        v.extend_from_slice(b",\"subscribe_id\":");
        let _ = serde_json::to_writer(&mut v, id);
    }
    v
}

/// The length of a `LineBatch` body field key plus its length varint.
fn bytes_field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// Appends a `ServerFrame{line_batch}` frame's bytes up to (and with) the
/// key of its `cuts`: the caller then appends `cuts_len` bytes of cuts,
/// [`body_key`], and `body_len` bytes of body. Fails if the frame would
/// exceed [`MAX_FRAME_LEN`].
pub fn frame_prefix(
    first_seq: u64,
    count: u32,
    cuts_len: usize,
    body_len: usize,
    dst: &mut BytesMut,
) -> Result<(), CodecError> {
    let inner = 1
        + encoded_len_varint(first_seq)
        + 1
        + encoded_len_varint(u64::from(count))
        + bytes_field_len(cuts_len)
        + bytes_field_len(body_len);
    let total = 1 + encoded_len_varint(inner as u64) + inner;
    if total > MAX_FRAME_LEN {
        return Err(CodecError::TooLarge);
    }
    dst.reserve(4 + total - cuts_len - body_len);
    dst.put_u32(total as u32);
    encode_key(LINE_BATCH_FIELD, WireType::LengthDelimited, dst);
    encode_varint(inner as u64, dst);
    encode_key(FIRST_SEQ_FIELD, WireType::Varint, dst);
    encode_varint(first_seq, dst);
    encode_key(COUNT_FIELD, WireType::Varint, dst);
    encode_varint(u64::from(count), dst);
    encode_key(CUTS_FIELD, WireType::LengthDelimited, dst);
    encode_varint(cuts_len as u64, dst);
    Ok(())
}

/// Appends the key of a `LineBatch`'s body (after its cuts).
pub fn body_key(body_len: usize, dst: &mut BytesMut) {
    encode_key(BODY_FIELD, WireType::LengthDelimited, dst);
    encode_varint(body_len as u64, dst);
}

/// A `LineBatch` whose cuts do not describe its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBatch;

impl fmt::Display for BadBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a line batch whose cuts do not match its lines")
    }
}

impl std::error::Error for BadBatch {}

/// Checks a whole batch (count, cuts, newline ends) and returns the bytes
/// of its first `take` lines as they are in `body` (nothing inserted): what
/// a consumer that inserts nothing (`--format raw`, an empty id) passes on
/// as a slice of the body.
pub fn checked_len(count: u32, cuts: &[u8], body: &[u8], take: usize) -> Result<usize, BadBatch> {
    if cuts.len() != count as usize * CUT_LEN {
        return Err(BadBatch);
    }
    let mut pos = 0usize;
    let mut taken = 0usize;
    for (i, (head, len)) in cut_pairs(cuts).enumerate() {
        let end = pos.checked_add(len).ok_or(BadBatch)?;
        if head > len || len == 0 || end > body.len() || body[end - 1] != b'\n' {
            return Err(BadBatch);
        }
        pos = end;
        if i < take {
            taken = end;
        }
    }
    if pos != body.len() {
        return Err(BadBatch);
    }
    Ok(taken)
}

/// Appends the first `take` lines of a batch to `out`, each with
/// `fragment` ([`subscription_fragment`]) inserted at its cut. Checks the
/// whole batch first ([`checked_len`]), so a bad one appends nothing.
pub fn expand(
    count: u32,
    cuts: &[u8],
    body: &[u8],
    take: usize,
    fragment: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), BadBatch> {
    let taken = checked_len(count, cuts, body, take)?;
    if fragment.is_empty() {
        // Nothing to insert: the lines as they are.
        out.extend_from_slice(&body[..taken]);
        return Ok(());
    }
    out.reserve(taken + fragment.len() * take.min(count as usize));
    let mut pos = 0;
    for (head, len) in cut_pairs(cuts).take(take) {
        out.extend_from_slice(&body[pos..pos + head]);
        out.extend_from_slice(fragment);
        out.extend_from_slice(&body[pos + head..pos + len]);
        pos += len;
    }
    Ok(())
}

/// Lines `first..first + count` of a whole batch (checked first, as
/// [`checked_len`] does): their cuts and body, a batch of their own.
pub fn sub_batch<'a>(
    total: u32,
    cuts: &'a [u8],
    body: &'a [u8],
    first: u32,
    count: u32,
) -> Result<(&'a [u8], &'a [u8]), BadBatch> {
    let end_line = first.checked_add(count).ok_or(BadBatch)?;
    if end_line > total {
        return Err(BadBatch);
    }
    checked_len(total, cuts, body, 0)?;
    let start: usize = cut_pairs(cuts).take(first as usize).map(|(_, l)| l).sum();
    let len: usize = cut_pairs(cuts)
        .skip(first as usize)
        .take(count as usize)
        .map(|(_, l)| l)
        .sum();
    let (f, e) = (first as usize * CUT_LEN, end_line as usize * CUT_LEN);
    Ok((&cuts[f..e], &body[start..start + len]))
}

/// The (head, line) lengths of `cuts`, ignoring a trailing partial cut.
fn cut_pairs(cuts: &[u8]) -> impl Iterator<Item = (usize, usize)> + Clone + '_ {
    cuts.chunks_exact(CUT_LEN).map(|c| {
        let head = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
        let len = u32::from_le_bytes([c[4], c[5], c[6], c[7]]) as usize;
        (head, len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ndjson, v1, v1::server_frame::Kind as S};
    use proptest::prelude::*;
    use prost::Message;

    fn event(seq: u64, data: &str, headers: bool) -> v1::Event {
        v1::Event {
            seq,
            event_id: format!("id-{seq}"),
            event_type: "demo.hello".into(),
            data: data.into(),
            headers: if headers {
                [("k".to_owned(), "v\"".to_owned())].into()
            } else {
                Default::default()
            },
            received_at_unix_ms: 10,
            ..Default::default()
        }
    }

    #[test]
    fn a_sub_batch_is_exactly_its_lines() {
        let (mut body, mut cuts) = (vec![], vec![]);
        for i in 0..5 {
            render_line(
                &mut body,
                &mut cuts,
                b"{\"seq\":1",
                format!("\"n\":{i}").as_bytes(),
                1,
            );
        }
        let (c, b) = sub_batch(5, &cuts, &body, 1, 3).unwrap();
        let mut whole = vec![];
        expand(5, &cuts, &body, 5, b"", &mut whole).unwrap();
        let lines: Vec<&[u8]> = whole.split_inclusive(|&x| x == b'\n').collect();
        assert_eq!(b, lines[1..4].concat());
        assert_eq!(c.len(), 3 * CUT_LEN);
        assert!(sub_batch(5, &cuts, &body, 3, 3).is_err());
        assert!(sub_batch(5, &cuts, &body, u32::MAX, 2).is_err());
        assert!(sub_batch(4, &cuts, &body, 0, 1).is_err());
        assert_eq!(sub_batch(5, &cuts, &body, 5, 0).unwrap().1, b"");
    }

    /// Frames a batch the way the bus does (prefix, cuts, key, body) and
    /// decodes it the way the consumer does.
    fn roundtrip(first_seq: u64, count: u32, cuts: &[u8], body: &[u8]) -> v1::LineBatch {
        let mut dst = BytesMut::new();
        frame_prefix(first_seq, count, cuts.len(), body.len(), &mut dst).unwrap();
        dst.extend_from_slice(cuts);
        body_key(body.len(), &mut dst);
        dst.extend_from_slice(body);
        let len = u32::from_be_bytes([dst[0], dst[1], dst[2], dst[3]]) as usize;
        assert_eq!(len, dst.len() - 4);
        match v1::ServerFrame::decode(dst.split_off(4).freeze()).unwrap() {
            v1::ServerFrame {
                kind: Some(S::LineBatch(b)),
            } => b,
            other => panic!("not a line batch: {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn an_expanded_batch_is_exactly_each_subscriptions_lines(
            datas in prop::collection::vec(".{0,20}", 1..5),
            sub in prop_oneof!["", "[a-z0-9-]{1,12}", ".{0,8}"],
            delivery in 0u32..3, headers in any::<bool>(), take in 0usize..6,
        ) {
            let events: Vec<_> = datas.iter().enumerate()
                .map(|(i, d)| event(7 + i as u64, d, headers)).collect();
            let (mut body, mut cuts, mut want) = (vec![], vec![], vec![]);
            for (i, e) in events.iter().enumerate() {
                let (head, tail) = ndjson::parts(e);
                render_line(&mut body, &mut cuts, &head, &tail, delivery);
                if i < take {
                    ndjson::write_line(&mut want, &head, &sub, &tail, false, delivery);
                }
            }
            let b = roundtrip(7, events.len() as u32, &cuts, &body);
            prop_assert_eq!(b.first_seq, 7);
            let mut got = vec![];
            expand(b.count, &b.cuts, &b.body, take, &subscription_fragment(&sub), &mut got).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
        }

        #[test]
        fn any_cuts_and_body_expand_or_are_refused_without_panic(
            count in 0u32..4, cuts in prop::collection::vec(any::<u8>(), 0..40),
            body in prop::collection::vec(any::<u8>(), 0..40), take in 0usize..5,
        ) {
            let mut out = vec![];
            if expand(count, &cuts, &body, take, b"X", &mut out).is_err() {
                prop_assert!(out.is_empty());
            }
        }
    }

    #[test]
    fn raw_lines_expand_to_themselves() {
        let (mut body, mut cuts) = (vec![], vec![]);
        render_raw_line(&mut body, &mut cuts, b"a\nb");
        render_raw_line(&mut body, &mut cuts, b"");
        let b = roundtrip(3, 2, &cuts, &body);
        let mut out = vec![];
        expand(b.count, &b.cuts, &b.body, 1, b"", &mut out).unwrap();
        assert_eq!(out, b"a\nb\n", "cut by count, not by newline");
        out.clear();
        expand(b.count, &b.cuts, &b.body, 2, b"", &mut out).unwrap();
        assert_eq!(out, b"a\nb\n\n");
        assert_eq!(checked_len(b.count, &b.cuts, &b.body, 0), Ok(0));
        assert_eq!(checked_len(b.count, &b.cuts, &b.body, 1), Ok(4));
        assert_eq!(checked_len(b.count, &b.cuts, &b.body, 9), Ok(5));
        assert_eq!(checked_len(3, &b.cuts, &b.body, 1), Err(BadBatch));
    }

    #[test]
    fn cuts_that_do_not_cover_the_body_are_refused() {
        let (head, tail) = ndjson::parts(&event(1, "x", false));
        let (mut body, mut cuts) = (vec![], vec![]);
        render_line(&mut body, &mut cuts, &head, &tail, 1);
        let mut out = vec![];
        assert_eq!(expand(2, &cuts, &body, 1, b"", &mut out), Err(BadBatch));
        let mut longer = body.clone();
        longer.push(b'\n');
        assert_eq!(expand(1, &cuts, &longer, 1, b"", &mut out), Err(BadBatch));
        assert!(out.is_empty());
        expand(1, &cuts, &body, 1, b"", &mut out).unwrap();
        assert_eq!(out, body);
    }
}
