//! A client of the bus socket that publishes `bench.x` events (pipelined
//! floods, or a fixed rate) while a second thread drains the PublishAck
//! frames, decoded by the test wire decoder (`dws_tests::wire::decode_frame`).

use std::{
    collections::VecDeque,
    io::{Read, Write},
    net::Shutdown,
    os::unix::net::UnixStream,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use dws_tests::wire::decode_frame;
use proto::v1::{
    client_frame, server_frame, Bye, ByeReason, ClientFrame, Hello, Publish, ServerFrame,
};

use crate::{
    procs::{check_interrupted, thread_cpu_us},
    unix_nanos, Res, EVENT_TYPE,
};

/// How long the publisher waits without any PublishAck progress.
const ACK_STALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Socket read/write timeout of the publisher.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a paced publisher waits for a consumer that printed nothing.
const STALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Frames read off a socket through the test wire decoder. One read takes
/// whatever the socket holds (many acks at once in a flood), and the frames
/// are then decoded from the buffer without another read.
struct FrameReader {
    stream: UnixStream,
    buf: BytesMut,
    /// The read buffer, reused for every read (a fresh 256 KiB buffer per
    /// frame cost more than the rest of the ack path together).
    chunk: Vec<u8>,
}

impl FrameReader {
    fn new(stream: UnixStream) -> FrameReader {
        FrameReader {
            stream,
            buf: BytesMut::with_capacity(256 * 1024),
            chunk: vec![0u8; 256 * 1024],
        }
    }

    /// The next frame already read, if a whole one is buffered.
    fn buffered(&mut self) -> Res<Option<ServerFrame>> {
        decode_frame(&mut self.buf).map_err(|e| e.to_string())
    }

    /// Reads once (blocking) into the buffer; `false` on a clean EOF between
    /// frames.
    fn fill(&mut self) -> Res<bool> {
        loop {
            match self.stream.read(&mut self.chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(false),
                Ok(0) => {
                    return Err(format!(
                        "the bus closed the connection in the middle of a frame ({} bytes)",
                        self.buf.len()
                    ))
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&self.chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading from the bus: {e}")),
            }
        }
    }

    /// The next frame; `None` on a clean EOF between frames.
    fn next(&mut self) -> Res<Option<ServerFrame>> {
        loop {
            if let Some(f) = self.buffered()? {
                return Ok(Some(f));
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }
}

#[derive(Default)]
struct AckState {
    acked: u64,
    /// Why the ack reader stopped (error frame, Bye, EOF, bad frame).
    ended: Option<String>,
    /// With latency tracking: (request id, when its frame was written) of
    /// every unacknowledged publish, oldest first (the bus acks in order).
    sent_at: VecDeque<(u64, Instant)>,
    /// With latency tracking: write-to-PublishAck time of every ack, in ns.
    ack_latencies: Vec<u64>,
    /// CPU time of the ack reader thread over its life, in µs, set when it ends.
    reader_cpu_us: Option<f64>,
}

type Shared = Arc<(Mutex<AckState>, Condvar)>;

/// A client of the bus socket that publishes `bench.x` events; a second
/// thread drains the PublishAck frames.
pub struct Publisher {
    stream: UnixStream,
    acks: Shared,
    sent: u64,
    buf: BytesMut,
    /// Publish frames encoded into `buf` but not written yet.
    pending: u64,
    /// Record write-to-ack latencies (see [`Publisher::track_latency`]).
    track: bool,
    /// The one Publish frame, rewritten in place for every event: its event
    /// type is set once and its data string keeps its allocation, so a
    /// publish allocates nothing (a fresh frame cost three allocations and
    /// as many frees per event, a quarter of the publisher's CPU).
    frame: ClientFrame,
}

impl Publisher {
    pub fn connect(socket: &Path) -> Res<Publisher> {
        let mut stream = UnixStream::connect(socket)
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        stream
            .set_read_timeout(Some(SOCKET_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(SOCKET_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let hello = ClientFrame {
            kind: Some(client_frame::Kind::Hello(Hello {
                protocol_version: proto::PROTOCOL_VERSION,
                client_pid: std::process::id(),
                client_name: "dws-bench".into(),
                build: proto::BUILD.into(),
            })),
        };
        proto::encode_frame(&hello, &mut buf).map_err(|e| e.to_string())?;
        stream
            .write_all(&buf)
            .map_err(|e| format!("sending Hello: {e}"))?;
        buf.clear();
        let reader = stream
            .try_clone()
            .map_err(|e| format!("clone socket: {e}"))?;
        let mut frames = FrameReader::new(reader);
        match frames.next()? {
            Some(ServerFrame {
                kind: Some(server_frame::Kind::HelloAck(_)),
            }) => {}
            other => return Err(format!("expected HelloAck, got {other:?}")),
        }
        let acks: Shared = Arc::new((Mutex::new(AckState::default()), Condvar::new()));
        let shared = acks.clone();
        thread::spawn(move || drain_acks(frames, shared));
        Ok(Publisher {
            stream,
            acks,
            sent: 0,
            buf,
            pending: 0,
            track: false,
            frame: ClientFrame {
                kind: Some(client_frame::Kind::Publish(Publish {
                    request_id: 0,
                    event_type: EVENT_TYPE.into(),
                    event_id: String::new(),
                    data: String::new(),
                    headers: Default::default(),
                })),
            },
        })
    }

    /// Publishes events of this type from now on (default `bench.x`).
    pub fn set_event_type(&mut self, event_type: &str) {
        if let Some(client_frame::Kind::Publish(p)) = &mut self.frame.kind {
            p.event_type = event_type.to_owned();
        }
    }

    /// From now on, record for every publish the time between writing its
    /// frame and reading its PublishAck ([`Publisher::take_latencies`]).
    pub fn track_latency(&mut self) {
        self.track = true;
    }

    /// The write-to-ack latencies recorded so far, in ns, in ack order.
    pub fn take_latencies(&self) -> Vec<u64> {
        let mut st = self.acks.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut st.ack_latencies)
    }

    fn encode_publish(&mut self, size: usize) -> Res<()> {
        let Some(client_frame::Kind::Publish(p)) = &mut self.frame.kind else {
            return Err("the publisher's frame is not a Publish".into());
        };
        p.request_id = self.sent + 1;
        write_payload(&mut p.data, unix_nanos(), self.sent, size);
        proto::encode_frame(&self.frame, &mut self.buf).map_err(|e| e.to_string())?;
        self.sent += 1;
        self.pending += 1;
        Ok(())
    }

    fn flush(&mut self) -> Res<()> {
        if self.track && self.pending > 0 {
            // Recorded before the write, so before any of these acks can
            // arrive; request ids are `sent + 1` at encode time.
            let now = Instant::now();
            let mut st = self.acks.0.lock().unwrap_or_else(|p| p.into_inner());
            for id in self.sent - self.pending + 1..=self.sent {
                st.sent_at.push_back((id, now));
            }
        }
        self.pending = 0;
        if !self.buf.is_empty() {
            self.stream
                .write_all(&self.buf)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                        "the bus read nothing from the publisher for {SOCKET_TIMEOUT:?} (stuck?)"
                    ),
                    _ => format!("writing to the bus: {e}"),
                })?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Blocks until fewer than `limit` publishes are unacknowledged; returns
    /// the number acked so far.
    fn wait_acks_below(&self, limit: u64) -> Res<u64> {
        let (lock, cv) = &*self.acks;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut last_progress = (st.acked, Instant::now());
        while self.sent - st.acked >= limit.max(1) {
            if let Some(why) = &st.ended {
                return Err(format!(
                    "publisher connection ended after {} of {} acks: {why}",
                    st.acked, self.sent
                ));
            }
            check_interrupted()?;
            if st.acked != last_progress.0 {
                last_progress = (st.acked, Instant::now());
            } else if last_progress.1.elapsed() >= ACK_STALL_TIMEOUT {
                return Err(format!(
                    "no PublishAck for {ACK_STALL_TIMEOUT:?} ({} of {} acked): the bus stopped accepting publishes",
                    st.acked, self.sent
                ));
            }
            st = cv
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(st.acked)
    }

    /// Publishes `n` events as fast as possible, at most `inflight`
    /// unacknowledged, in batches of up to 64 frames per write. With
    /// `max_lag = (printed, lag)`, it also stays at most `lag` events ahead of
    /// what a consumer printed (so that consumer never loses events to
    /// retention). Returns the unix-nanos time of the first send.
    pub fn flood(
        &mut self,
        n: u64,
        size: usize,
        inflight: u64,
        max_lag: Option<(&AtomicU64, u64)>,
    ) -> Res<u64> {
        let first = unix_nanos();
        let mut lag_since: Option<(u64, Instant)> = None;
        while self.sent < n {
            check_interrupted()?;
            if let Some((printed, lag)) = max_lag {
                let p = printed.load(Ordering::Relaxed);
                if self.sent.saturating_sub(p) >= lag {
                    match lag_since {
                        Some((q, t)) if q == p && t.elapsed() >= STALL_TIMEOUT => {
                            return Err(format!(
                                "the consumer printed nothing for {STALL_TIMEOUT:?} ({p} of {} published)",
                                self.sent
                            ))
                        }
                        Some((q, _)) if q == p => {}
                        _ => lag_since = Some((p, Instant::now())),
                    }
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
            }
            let acked = self.wait_acks_below(inflight)?;
            let room = inflight - (self.sent - acked);
            let batch = room.min(64).min(n - self.sent);
            for _ in 0..batch {
                self.encode_publish(size)?;
            }
            self.flush()?;
        }
        self.wait_acks_below(1)?;
        Ok(first)
    }

    /// Publishes `n` events at `rate`/s, one write each. Returns the unix-nanos
    /// time of the first send.
    pub fn paced(&mut self, n: u64, size: usize, rate: u64, inflight: u64) -> Res<u64> {
        let start = Instant::now();
        let first = unix_nanos();
        for i in 0..n {
            let due = start + Duration::from_nanos(i.saturating_mul(1_000_000_000) / rate);
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if i % 256 == 0 {
                check_interrupted()?;
            }
            self.wait_acks_below(inflight)?;
            self.encode_publish(size)?;
            self.flush()?;
        }
        self.wait_acks_below(1)?;
        Ok(first)
    }

    /// Says goodbye and closes the connection. Returns the CPU time the ack
    /// reader thread used, in µs (`None` if it did not end within 2 s).
    pub fn close(mut self) -> Option<f64> {
        let bye = ClientFrame {
            kind: Some(client_frame::Kind::Bye(Bye {
                reason: ByeReason::ClientDone as i32,
                message: String::new(),
            })),
        };
        if proto::encode_frame(&bye, &mut self.buf).is_ok() {
            let _ = self.flush();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        let (lock, cv) = &*self.acks;
        let st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (st, _) = cv
            .wait_timeout_while(st, Duration::from_secs(2), |st| st.reader_cpu_us.is_none())
            .unwrap_or_else(|p| p.into_inner());
        st.reader_cpu_us
    }
}

/// Rewrites `data` as the payload of event `index` sent at `nanos`:
/// `"<nanos> <index> "` padded with `x` to `size` bytes (longer when the
/// prefix is), in the allocation `data` already has.
pub fn write_payload(data: &mut String, nanos: u64, index: u64, size: usize) {
    use std::fmt::Write as _;
    data.clear();
    // Writing into a String cannot fail.
    let _ = write!(data, "{nanos} {index} ");
    // Padded a slice at a time (a char at a time cost 5 µs per 4 KiB).
    const XS: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    let mut pad = size.saturating_sub(data.len());
    while pad > 0 {
        let n = pad.min(XS.len());
        data.push_str(&XS[..n]);
        pad -= n;
    }
}

/// Counts the PublishAck frames (checking their order) until the
/// connection ends; records why it ended. Every frame one read brought is
/// handled under one lock and one wake-up of the publisher.
fn drain_acks(mut frames: FrameReader, shared: Shared) {
    let (lock, cv) = &*shared;
    loop {
        let read = frames.fill();
        let now = Instant::now();
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(true) => loop {
                match frames.buffered() {
                    Ok(Some(f)) => on_frame(&mut st, f, now),
                    Ok(None) => break,
                    Err(e) => st.ended = Some(e),
                }
                if st.ended.is_some() {
                    break;
                }
            },
            Ok(false) => st.ended = Some("the bus closed the connection".into()),
            Err(e) => st.ended = Some(e),
        }
        let done = st.ended.is_some();
        if done {
            st.reader_cpu_us = Some(thread_cpu_us());
        }
        drop(st);
        cv.notify_all();
        if done {
            return;
        }
    }
}

/// One frame on the publisher's connection, read at `now`.
fn on_frame(st: &mut AckState, f: ServerFrame, now: Instant) {
    match f.kind {
        Some(server_frame::Kind::PublishAck(a)) => {
            if a.duplicate {
                st.ended = Some(format!(
                    "publish {} acknowledged as a duplicate",
                    a.request_id
                ));
            } else {
                st.acked += 1;
                match st.sent_at.pop_front() {
                    Some((id, at)) if id == a.request_id => st
                        .ack_latencies
                        .push(now.saturating_duration_since(at).as_nanos() as u64),
                    Some((id, _)) => {
                        st.ended = Some(format!(
                            "PublishAck for request {} while {id} was the oldest unacknowledged",
                            a.request_id
                        ))
                    }
                    None => {}
                }
            }
        }
        Some(server_frame::Kind::Error(e)) => {
            st.ended = Some(format!(
                "bus error {} (request {}): {}",
                e.code, e.request_id, e.message
            ));
        }
        Some(server_frame::Kind::Bye(b)) => {
            st.ended = Some(format!("bus said Bye (reason {}): {}", b.reason, b.message));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_the_send_time_and_index_padded_to_its_size() {
        let mut data = String::new();
        write_payload(&mut data, 1_700_000_000_123_456_789, 7, 40);
        assert_eq!(data.len(), 40);
        assert!(data.starts_with("1700000000123456789 7 x"), "{data}");
        assert!(data[22..].bytes().all(|b| b == b'x'), "{data}");
        let cap = data.capacity();
        write_payload(&mut data, 5, 12, 8);
        assert_eq!(data, "5 12 xxx");
        assert_eq!(data.capacity(), cap, "the allocation is reused");
        write_payload(&mut data, 123_456, 99, 4);
        assert_eq!(data, "123456 99 ", "never cut below its prefix");
    }
}
