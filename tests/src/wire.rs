//! A raw client of the bus socket for black-box tests: frames encoded with
//! `proto::codec::encode_frame` and decoded by hand ([`decode_frame`]: a
//! 4-byte big-endian length, then a `prost` decode), so a test does not
//! share the daemon's decoder. `dws-bench` reads its publish acks through
//! [`decode_frame`] too.

use std::{
    io::{ErrorKind, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use bytes::{Buf, BufMut, BytesMut};
use prost::Message;
use proto::v1::{client_frame, ClientFrame, Hello, ServerFrame};

/// A raw client connection.
pub struct Wire {
    pub s: UnixStream,
    buf: BytesMut,
}

impl Wire {
    pub fn connect(path: &Path) -> Wire {
        let s =
            UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        s.set_write_timeout(Some(Duration::from_secs(5)))
            .expect("write timeout");
        Wire {
            s,
            buf: BytesMut::new(),
        }
    }

    /// A connection that said Hello (this build's protocol) and got its
    /// HelloAck.
    pub fn greeted(path: &Path) -> Wire {
        let mut w = Wire::connect(path);
        w.hello(proto::PROTOCOL_VERSION);
        match w.read_frame(Duration::from_secs(30)).kind {
            Some(proto::v1::server_frame::Kind::HelloAck(_)) => w,
            other => panic!("expected HelloAck, got {other:?}"),
        }
    }

    /// Sends one client frame of this kind.
    pub fn request(&mut self, kind: client_frame::Kind) {
        self.send(&ClientFrame { kind: Some(kind) });
    }

    /// A raw client over a socket connected elsewhere (a test that wrote
    /// requests without reading starts reading them here).
    pub fn from_stream(s: UnixStream) -> Wire {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        Wire {
            s,
            buf: BytesMut::new(),
        }
    }

    pub fn send(&mut self, frame: &ClientFrame) {
        let mut b = BytesMut::new();
        proto::codec::encode_frame(frame, &mut b).expect("encode frame");
        self.s.write_all(&b).expect("write frame");
    }

    /// Writes `bytes` from another thread (on a clone of the socket), so the
    /// test can read replies meanwhile: a bus that stops reading a client
    /// whose replies pile up would otherwise deadlock a test that writes
    /// everything first. Write errors are ignored, as in [`Wire::send_raw`].
    pub fn send_in_background(&self, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
        let mut s = self.s.try_clone().expect("clone the socket");
        std::thread::spawn(move || {
            let _ = s.write_all(&bytes);
        })
    }

    /// Writes bytes the bus may refuse half-way; a write error is not a failure.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.s.write_all(bytes);
    }

    pub fn hello(&mut self, version: u32) {
        self.send(&ClientFrame {
            kind: Some(client_frame::Kind::Hello(Hello {
                protocol_version: version,
                client_pid: std::process::id(),
                client_name: "blackbox-wire".into(),
                build: "test".into(),
            })),
        });
    }

    /// Decodes one complete frame from the buffer, if there is one.
    pub fn take_frame(&mut self) -> Option<ServerFrame> {
        decode_frame(&mut self.buf).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Reads until one frame arrives; panics if none comes within `timeout`
    /// or the bus closes the connection first.
    pub fn read_frame(&mut self, timeout: Duration) -> ServerFrame {
        self.try_read_frame(timeout).unwrap_or_else(|| {
            panic!("no frame from the bus within {timeout:?} (or it closed the connection)")
        })
    }

    /// Reads one frame if it arrives within `timeout`; `None` on a timeout,
    /// EOF or reset.
    pub fn try_read_frame(&mut self, timeout: Duration) -> Option<ServerFrame> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(f) = self.take_frame() {
                return Some(f);
            }
            if Instant::now() >= deadline || self.read_some() != Got::More {
                return None;
            }
        }
    }

    /// Reads every frame until the bus closes the connection (EOF or reset);
    /// panics if it stays open for `timeout`.
    pub fn read_until_closed(&mut self, timeout: Duration) -> Vec<ServerFrame> {
        let deadline = Instant::now() + timeout;
        let mut frames = Vec::new();
        loop {
            while let Some(f) = self.take_frame() {
                frames.push(f);
            }
            assert!(
                Instant::now() < deadline,
                "the bus did not close the connection within {timeout:?}; frames so far: {frames:?}"
            );
            match self.read_some() {
                Got::More => {}
                Got::Closed => break,
                Got::Failed(e) => panic!("read from bus: {e}"),
            }
        }
        while let Some(f) = self.take_frame() {
            frames.push(f);
        }
        assert!(
            self.buf.is_empty(),
            "bus closed in the middle of a frame ({} bytes left)",
            self.buf.len()
        );
        frames
    }

    /// One read (bounded by the socket's read timeout) into the buffer.
    fn read_some(&mut self) -> Got {
        let mut chunk = [0u8; 64 * 1024];
        match self.s.read(&mut chunk) {
            Ok(0) => Got::Closed,
            Ok(n) => {
                self.buf.put_slice(&chunk[..n]);
                Got::More
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                Got::More
            }
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                Got::Closed
            }
            Err(e) => Got::Failed(e.to_string()),
        }
    }
}

/// Why bytes from the bus are not a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix exceeds `proto::MAX_FRAME_LEN`.
    TooLong(usize),
    /// The body is not a `ServerFrame`.
    Undecodable(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLong(len) => write!(f, "bus sent a frame of {len} bytes"),
            FrameError::Undecodable(e) => write!(f, "bus sent an undecodable frame: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Takes one complete frame (4-byte big-endian length + `ServerFrame`
/// protobuf body) off the front of `buf`; `Ok(None)` while it is incomplete
/// (nothing is consumed then).
pub fn decode_frame(buf: &mut BytesMut) -> Result<Option<ServerFrame>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > proto::MAX_FRAME_LEN {
        return Err(FrameError::TooLong(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(4);
    let body = buf.split_to(len);
    ServerFrame::decode(&body[..])
        .map(Some)
        .map_err(|e| FrameError::Undecodable(e.to_string()))
}

/// What one read brought.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    /// Data, or nothing yet: read again.
    More,
    /// EOF or reset.
    Closed,
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::v1::{server_frame, PublishAck};

    fn ack_bytes(id: u64) -> BytesMut {
        let frame = ServerFrame {
            kind: Some(server_frame::Kind::PublishAck(PublishAck {
                request_id: id,
                ..Default::default()
            })),
        };
        let body = frame.encode_to_vec();
        let mut b = BytesMut::new();
        b.put_u32(body.len() as u32);
        b.put_slice(&body);
        b
    }

    #[test]
    fn decodes_whole_frames_and_waits_for_partial_ones() {
        let mut all = ack_bytes(7);
        all.extend_from_slice(&ack_bytes(8));
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&all[..all.len() - 1]);
        let first = decode_frame(&mut buf).expect("valid").expect("complete");
        assert!(matches!(
            first.kind,
            Some(server_frame::Kind::PublishAck(PublishAck {
                request_id: 7,
                ..
            }))
        ));
        let left = buf.len();
        assert_eq!(decode_frame(&mut buf), Ok(None));
        assert_eq!(buf.len(), left, "an incomplete frame is not consumed");
        buf.extend_from_slice(&all[all.len() - 1..]);
        assert!(decode_frame(&mut buf).expect("valid").is_some());
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_oversized_and_garbage_frames() {
        let mut buf = BytesMut::new();
        buf.put_u32(proto::MAX_FRAME_LEN as u32 + 1);
        assert_eq!(
            decode_frame(&mut buf),
            Err(FrameError::TooLong(proto::MAX_FRAME_LEN + 1))
        );
        let mut buf = BytesMut::new();
        buf.put_u32(2);
        buf.put_slice(&[0xff, 0xff]);
        assert!(matches!(
            decode_frame(&mut buf),
            Err(FrameError::Undecodable(_))
        ));
    }
}
