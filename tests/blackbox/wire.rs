//! The frame protocol against bad peers, over the real socket of a real bus.
//! Each test attaches a real `dws event consume` first, then opens raw
//! connections that send garbage, an oversized length prefix, a truncated
//! frame or a wrong protocol version. The bus must answer an `Error` frame
//! where it can (FRAME_TOO_LARGE, BAD_REQUEST, UNSUPPORTED_VERSION), close
//! that connection, and keep serving: the consumer still receives events
//! published afterwards and the daemon is the same process.
//!
//! Frames are encoded with `proto::codec::encode_frame` and decoded by hand
//! (4-byte big-endian length + `prost` decode) so the test does not share the
//! daemon's decoder.

use std::{net::Shutdown, time::Duration};

use bytes::{BufMut, BytesMut};
use dws_tests::{wire::Wire, Child, Sig, TestEnv, EXIT_TIMEOUT};
use proto::v1::{server_frame, ErrorCode, ServerFrame};

const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

fn error_codes(frames: &[ServerFrame]) -> Vec<ErrorCode> {
    frames
        .iter()
        .filter_map(|f| match &f.kind {
            Some(server_frame::Kind::Error(e)) => Some(e.code()),
            _ => None,
        })
        .collect()
}

/// Frames a bad peer may get before the close: Error and Bye (plus the
/// connection-level Heartbeat / SourceState, which say nothing about it).
fn assert_only_errors_or_bye(frames: &[ServerFrame]) {
    use server_frame::Kind;
    for f in frames {
        assert!(
            matches!(
                f.kind,
                Some(Kind::Error(_))
                    | Some(Kind::Bye(_))
                    | Some(Kind::Heartbeat(_))
                    | Some(Kind::SourceState(_))
            ),
            "unexpected frame to a bad peer: {f:?} (all: {frames:?})"
        );
    }
}

fn expect_hello_ack(w: &mut Wire) -> proto::v1::HelloAck {
    match w.read_frame(CLOSE_TIMEOUT).kind {
        Some(server_frame::Kind::HelloAck(a)) => a,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// A bus with one real consumer attached, which received one event.
struct Live {
    consumer: Child,
    env: TestEnv,
    bus_pid: i32,
    socket: std::path::PathBuf,
}

fn live_bus() -> Live {
    let env = TestEnv::new();
    let mut consumer = env.dws(["event", "consume", "wire.k"]).spawn();
    let bus_pid = consumer.wait_ready().bus_pid;
    env.publish("wire.k", "before", &[]);
    consumer.wait_stdout_lines(1, EXIT_TIMEOUT);
    let socket = env.bus_meta_socket().expect("bus.meta names the socket");
    Live {
        consumer,
        env,
        bus_pid,
        socket,
    }
}

impl Live {
    /// The bus is the same process and the consumer still receives.
    fn assert_still_serving(mut self) {
        assert!(
            dws_tests::is_live(self.bus_pid),
            "busd died\n{}",
            self.env.bus_log_tail()
        );
        assert_eq!(
            self.env.busd_pids(),
            vec![self.bus_pid],
            "the same single busd"
        );
        self.env.publish("wire.k", "after", &[]);
        let lines = self.consumer.wait_stdout_lines(2, EXIT_TIMEOUT);
        assert!(
            lines[1].contains("\"data\":\"after\""),
            "{}",
            self.consumer.report()
        );
        // A fresh connection still gets a HelloAck.
        let mut w = Wire::connect(&self.socket);
        w.hello(proto::PROTOCOL_VERSION);
        expect_hello_ack(&mut w);
        self.consumer.signal(Sig::SIGTERM);
        self.consumer
            .wait_exit(EXIT_TIMEOUT)
            .assert_clean_exit("signal", 2);
    }
}

#[test]
fn hello_with_the_current_version_gets_hello_ack_naming_the_bus() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.hello(proto::PROTOCOL_VERSION);
    let ack = expect_hello_ack(&mut w);
    assert_eq!(ack.protocol_version, proto::PROTOCOL_VERSION);
    assert_eq!(ack.bus_pid as i32, live.bus_pid);
    drop(w);
    live.assert_still_serving();
}

#[test]
fn undecodable_frame_gets_bad_request_and_close_while_others_keep_receiving() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    let mut b = BytesMut::new();
    b.put_u32(4);
    b.put_slice(&[0xff, 0xff, 0xff, 0xff]);
    w.send_raw(&b);
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames),
        vec![ErrorCode::BadRequest],
        "frames: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn garbage_bytes_get_an_error_and_close_while_others_keep_receiving() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.send_raw(b"GET / HTTP/1.1\r\nHost: bus\r\n\r\n this is not a frame \x00\x01\x02\xfe\xff");
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames).len(),
        1,
        "one Error frame before the close: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn oversized_length_prefix_gets_frame_too_large_and_close_while_others_keep_receiving() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.hello(proto::PROTOCOL_VERSION);
    expect_hello_ack(&mut w);
    let mut b = BytesMut::new();
    b.put_u32((proto::MAX_FRAME_LEN + 1) as u32);
    b.put_slice(&[0u8; 16]);
    w.send_raw(&b);
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames),
        vec![ErrorCode::FrameTooLarge],
        "frames: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn oversized_length_prefix_as_first_frame_gets_frame_too_large() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.send_raw(&u32::MAX.to_be_bytes());
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames),
        vec![ErrorCode::FrameTooLarge],
        "frames: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn truncated_frame_then_half_close_gets_an_error_and_close_while_others_keep_receiving() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.hello(proto::PROTOCOL_VERSION);
    expect_hello_ack(&mut w);
    let mut b = BytesMut::new();
    b.put_u32(100);
    b.put_slice(&[0x0a; 10]);
    w.send_raw(&b);
    w.s.shutdown(Shutdown::Write).expect("half-close");
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames).len(),
        1,
        "an Error frame is possible after our half-close, so one is expected: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn wrong_protocol_version_gets_unsupported_version_and_close() {
    let live = live_bus();
    let mut w = Wire::connect(&live.socket);
    w.hello(proto::PROTOCOL_VERSION + 1);
    let frames = w.read_until_closed(CLOSE_TIMEOUT);
    assert_only_errors_or_bye(&frames);
    assert_eq!(
        error_codes(&frames),
        vec![ErrorCode::UnsupportedVersion],
        "frames: {frames:?}"
    );
    live.assert_still_serving();
}

#[test]
fn connections_closed_at_once_or_mid_frame_do_not_disturb_the_bus() {
    let live = live_bus();
    // Connect and close without a byte.
    drop(Wire::connect(&live.socket));
    // Close in the middle of a length prefix.
    let mut w = Wire::connect(&live.socket);
    w.send_raw(&[0, 0]);
    drop(w);
    // Close in the middle of a body without half-close first.
    let mut w = Wire::connect(&live.socket);
    w.hello(proto::PROTOCOL_VERSION);
    let mut b = BytesMut::new();
    b.put_u32(50);
    b.put_slice(&[1, 2, 3]);
    w.send_raw(&b);
    drop(w);
    live.assert_still_serving();
}
