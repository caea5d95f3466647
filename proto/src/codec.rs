//! [`FrameCodec`]: a 4-byte big-endian length prefix followed by one protobuf
//! message.
//!
//! The decoder never reserves the length a peer *announces*: a buffer grows
//! only with the bytes that actually arrived, so a thousand peers that each
//! announce a 4 MiB frame and send one byte cost a thousand small buffers,
//! not 4 GiB.
//!
//! Decoding distinguishes "not enough bytes yet" (`Ok(None)`, handled by the
//! framed reader) from real violations: an oversized frame, a frame cut off by
//! EOF, or bytes that are not a valid message. Each is a distinct
//! [`CodecError`] so the bus can answer with the right `Error` code before it
//! closes the connection.

use std::{fmt, io, marker::PhantomData};

use bytes::{Buf, BufMut, BytesMut};
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

/// Largest frame body either side accepts or sends: 4 MiB. Large enough for
/// any event payload DingTalk sends (its clients cap at 1 MiB) and for a
/// status document; small enough that one bad peer cannot make the bus
/// allocate without bound.
pub const MAX_FRAME_LEN: usize = 4 * 1024 * 1024;

/// Why a frame could not be read or written.
#[derive(Debug)]
pub enum CodecError {
    /// The socket failed.
    Io(io::Error),
    /// The length prefix announced more than [`MAX_FRAME_LEN`] bytes.
    TooLarge,
    /// The peer closed the connection in the middle of a frame.
    Truncated,
    /// The frame body is not a valid message.
    Decode(prost::DecodeError),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Io(e) => write!(f, "i/o error: {e}"),
            CodecError::TooLarge => write!(f, "frame larger than {MAX_FRAME_LEN} bytes"),
            CodecError::Truncated => write!(f, "connection closed in the middle of a frame"),
            CodecError::Decode(e) => write!(f, "undecodable frame: {e}"),
        }
    }
}

impl std::error::Error for CodecError {}

impl From<io::Error> for CodecError {
    fn from(e: io::Error) -> Self {
        CodecError::Io(e)
    }
}

/// Bytes of the length prefix.
pub const PREFIX_LEN: usize = 4;

/// Decodes `In` frames and encodes `Out` frames.
pub struct FrameCodec<In, Out> {
    _types: PhantomData<fn(Out) -> In>,
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self::new()
    }
}

impl<In, Out> FrameCodec<In, Out> {
    pub fn new() -> Self {
        FrameCodec {
            _types: PhantomData,
        }
    }
}

impl<In: Message + Default, Out> Decoder for FrameCodec<In, Out> {
    type Item = In;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, CodecError> {
        let Some(head) = src.get(..PREFIX_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_FRAME_LEN {
            return Err(CodecError::TooLarge);
        }
        if src.len() < PREFIX_LEN + len {
            // Deliberately no `reserve(len)`: see the module doc.
            return Ok(None);
        }
        src.advance(PREFIX_LEN);
        let body = src.split_to(len);
        In::decode(body.freeze())
            .map(Some)
            .map_err(CodecError::Decode)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<In>, CodecError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(CodecError::Truncated),
        }
    }
}

impl<In, Out: Message> Encoder<Out> for FrameCodec<In, Out> {
    type Error = CodecError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), CodecError> {
        encode_frame(&item, dst)
    }
}

impl<In, Out: Message> Encoder<&Out> for FrameCodec<In, Out> {
    type Error = CodecError;

    fn encode(&mut self, item: &Out, dst: &mut BytesMut) -> Result<(), CodecError> {
        encode_frame(item, dst)
    }
}

/// Appends one length-prefixed frame to `dst` (the layout [`FrameCodec`]
/// decodes), written without an intermediate copy.
pub fn encode_frame(msg: &impl Message, dst: &mut BytesMut) -> Result<(), CodecError> {
    let len = msg.encoded_len();
    if len > MAX_FRAME_LEN {
        return Err(CodecError::TooLarge);
    }
    dst.reserve(4 + len);
    // `len` fits in u32 because MAX_FRAME_LEN does.
    dst.put_u32(len as u32);
    msg.encode(dst)
        .map_err(|e| CodecError::Io(io::Error::other(e)))
}

/// Appends one `ServerFrame{event}` frame built from an event that was
/// encoded once (`base`, an encoded `v1::Event` without `subscription_id` and
/// `redelivered`) plus the two per-delivery fields.
///
/// Why: fan-out sends the same event to many consumers; re-encoding the whole
/// message (and cloning its strings) per consumer dominated the cost.
/// Protobuf allows fields in any order, so the per-delivery fields are simply
/// appended after the shared bytes.
pub fn encode_event_frame(
    base: &[u8],
    subscription_id: &str,
    redelivered: bool,
    delivery: u32,
    dst: &mut BytesMut,
) -> Result<(), CodecError> {
    use prost::encoding::{
        bool as pbool, encode_key, encode_varint, encoded_len_varint, uint32, WireType,
    };
    const EVENT_FIELD: u32 = 4; // ServerFrame.kind.event
    const SUBSCRIPTION_ID_FIELD: u32 = 7; // Event.subscription_id
    const REDELIVERED_FIELD: u32 = 13; // Event.redelivered
    const DELIVERY_FIELD: u32 = 14; // Event.delivery
    let sub = subscription_id.as_bytes();
    let mut extra = 0;
    if !sub.is_empty() {
        extra += 1 + encoded_len_varint(sub.len() as u64) + sub.len();
    }
    if redelivered {
        extra += pbool::encoded_len(REDELIVERED_FIELD, &redelivered);
    }
    if delivery != 0 {
        extra += uint32::encoded_len(DELIVERY_FIELD, &delivery);
    }
    let inner = base.len() + extra;
    let total = 1 + encoded_len_varint(inner as u64) + inner;
    if total > MAX_FRAME_LEN {
        return Err(CodecError::TooLarge);
    }
    dst.reserve(4 + total);
    dst.put_u32(total as u32);
    encode_key(EVENT_FIELD, WireType::LengthDelimited, dst);
    encode_varint(inner as u64, dst);
    dst.put_slice(base);
    if !sub.is_empty() {
        encode_key(SUBSCRIPTION_ID_FIELD, WireType::LengthDelimited, dst);
        encode_varint(sub.len() as u64, dst);
        dst.put_slice(sub);
    }
    if redelivered {
        pbool::encode(REDELIVERED_FIELD, &redelivered, dst);
    }
    if delivery != 0 {
        uint32::encode(DELIVERY_FIELD, &delivery, dst);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{client_frame::Kind, ClientFrame, Hello, ServerFrame};

    type Bus = FrameCodec<ClientFrame, ServerFrame>;

    fn hello() -> ClientFrame {
        ClientFrame {
            kind: Some(Kind::Hello(Hello {
                protocol_version: 1,
                client_pid: 7,
                client_name: "t".into(),
                build: "b".into(),
            })),
        }
    }

    #[test]
    fn round_trip_and_partial() {
        let mut buf = BytesMut::new();
        encode_frame(&hello(), &mut buf).unwrap();
        let full = buf.clone();
        let mut codec = Bus::new();
        let mut part = BytesMut::from(&full[..3]);
        assert!(codec.decode(&mut part).unwrap().is_none());
        let mut whole = full.clone();
        assert_eq!(codec.decode(&mut whole).unwrap(), Some(hello()));
        assert!(whole.is_empty());
    }

    #[test]
    fn too_large_is_distinct() {
        let mut buf = BytesMut::new();
        buf.put_u32((MAX_FRAME_LEN + 1) as u32);
        buf.put_slice(&[0; 16]);
        assert!(matches!(
            Bus::new().decode(&mut buf),
            Err(CodecError::TooLarge)
        ));
    }

    #[test]
    fn truncated_at_eof() {
        let mut buf = BytesMut::new();
        encode_frame(&hello(), &mut buf).unwrap();
        buf.truncate(buf.len() - 1);
        assert!(matches!(
            Bus::new().decode_eof(&mut buf),
            Err(CodecError::Truncated)
        ));
        let mut empty = BytesMut::new();
        assert!(Bus::new().decode_eof(&mut empty).unwrap().is_none());
    }

    #[test]
    fn event_frame_matches_full_encoding() {
        use crate::v1::{server_frame, Event};
        use prost::Message;
        let base = Event {
            seq: 9,
            event_id: "e".into(),
            event_type: "a.b".into(),
            data: "{}".into(),
            ..Event::default()
        };
        let mut dst = BytesMut::new();
        encode_event_frame(&base.encode_to_vec(), "s1", true, 3, &mut dst).unwrap();
        let got: ServerFrame = FrameCodec::<ServerFrame, ClientFrame>::new()
            .decode(&mut dst)
            .unwrap()
            .unwrap();
        let want = Event {
            subscription_id: "s1".into(),
            redelivered: true,
            delivery: 3,
            ..base
        };
        assert_eq!(got.kind, Some(server_frame::Kind::Event(want)));
    }

    #[test]
    fn garbage_is_decode_error() {
        let mut buf = BytesMut::new();
        buf.put_u32(4);
        buf.put_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            Bus::new().decode(&mut buf),
            Err(CodecError::Decode(_))
        ));
    }
}

/// Property tests: any frames, split at any boundaries, truncated anywhere,
/// or any bytes at all — the decoder returns exactly the frames that were
/// sent, asks for more, or names the violation; it never panics and never
/// allocates what a length prefix merely announces.
#[cfg(test)]
mod props {
    use super::*;
    use crate::v1::{client_frame::Kind, Ack, ClientFrame, Publish, StatusRequest};
    use proptest::prelude::*;

    type Bus = FrameCodec<ClientFrame, crate::v1::ServerFrame>;

    fn frame() -> impl Strategy<Value = ClientFrame> {
        prop_oneof![
            (
                any::<u64>(),
                "[a-z.]{1,20}",
                ".{0,40}",
                prop::collection::vec(any::<u8>(), 0..2000)
            )
                .prop_map(|(request_id, event_type, event_id, data)| ClientFrame {
                    kind: Some(Kind::Publish(Publish {
                        request_id,
                        event_type,
                        event_id,
                        data: String::from_utf8_lossy(&data).into_owned(),
                        ..Publish::default()
                    })),
                }),
            any::<u64>().prop_map(|seq| ClientFrame {
                kind: Some(Kind::Ack(Ack {
                    seq,
                    ..Ack::default()
                })),
            }),
            any::<u64>().prop_map(|request_id| ClientFrame {
                kind: Some(Kind::StatusRequest(StatusRequest { request_id })),
            }),
        ]
    }

    fn encode_all(frames: &[ClientFrame]) -> Vec<u8> {
        let mut b = BytesMut::new();
        for f in frames {
            encode_frame(f, &mut b).unwrap();
        }
        b.to_vec()
    }

    /// Feeds `bytes` in chunks ending at `cuts`, decoding after each chunk.
    fn decode_in_chunks(bytes: &[u8], cuts: &[usize]) -> (Vec<ClientFrame>, BytesMut) {
        let mut codec = Bus::new();
        let mut buf = BytesMut::new();
        let mut out = vec![];
        let mut at = 0;
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        ends.push(bytes.len());
        ends.sort_unstable();
        for end in ends {
            buf.extend_from_slice(&bytes[at..end.max(at)]);
            at = end.max(at);
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                out.push(f);
            }
            // Never more capacity than the bytes that arrived (plus slack).
            assert!(buf.capacity() <= bytes.len().max(64) * 2 + 64);
        }
        (out, buf)
    }

    proptest! {
        #[test]
        fn frames_split_anywhere_decode_to_the_same_frames(
            frames in prop::collection::vec(frame(), 0..20),
            cuts in prop::collection::vec(any::<usize>(), 0..30),
        ) {
            let bytes = encode_all(&frames);
            let (got, rest) = decode_in_chunks(&bytes, &cuts);
            prop_assert_eq!(got, frames);
            prop_assert!(rest.is_empty());
        }

        #[test]
        fn a_truncated_stream_yields_a_prefix_then_truncated_at_eof(
            frames in prop::collection::vec(frame(), 1..10),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = encode_all(&frames);
            let cut = cut.index(bytes.len());
            let (got, mut rest) = decode_in_chunks(&bytes[..cut], &[]);
            prop_assert!(got.len() < frames.len());
            prop_assert_eq!(&got[..], &frames[..got.len()]);
            let eof = Bus::new().decode_eof(&mut rest);
            if rest.is_empty() {
                prop_assert!(matches!(eof, Ok(None)));
            } else {
                prop_assert!(matches!(eof, Err(CodecError::Truncated)));
            }
        }

        #[test]
        fn an_oversized_prefix_is_refused_before_its_body_arrives(
            len in (MAX_FRAME_LEN as u64 + 1)..=u32::MAX as u64,
            body in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut buf = BytesMut::new();
            buf.put_u32(len as u32);
            buf.put_slice(&body);
            prop_assert!(matches!(Bus::new().decode(&mut buf), Err(CodecError::TooLarge)));
        }

        #[test]
        fn any_bytes_never_panic_and_never_reserve_the_announced_length(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut buf = BytesMut::from(&bytes[..]);
            let cap = buf.capacity();
            let _ = Bus::new().decode(&mut buf);
            prop_assert!(buf.capacity() <= cap);
        }
    }
}
