//! The wire protocol of the dws event bus, shared by `busd` and `dws`.
//!
//! Layout:
//! - [`v1`]: the prost types generated from `proto/bus.proto` (package `dws.bus.v1`).
//! - [`codec`]: [`FrameCodec`], the only place that knows the length prefix and
//!   calls `prost::Message::decode`.
//! - [`pattern`]: event-key patterns (`a.b`, `a.*`, `*`).
//! - [`limits`]: the bounds both sides enforce.
//! - [`ndjson`]: the NDJSON event line of the consume contract.
//! - [`json`]: JSON strings written as serde_json writes them, faster.
//! - [`lines`]: `LineBatch`, lines rendered once for every subscription.
//! - [`ready`]: the ready pipe's verdict between a spawned bus and `dws`.
//! - [`paths`]: where a profile's work dir and socket live; both sides must agree.
//! - [`status`]: the status document of `dws event status`, filled by the bus.
//! - [`time`]: `sleep_until_opt`, an optional deadline for `select!` loops.
//!
//! This crate does no socket I/O.

pub mod codec;
pub mod duration;
pub mod file_type;
pub mod json;
pub mod limits;
pub mod lines;
pub mod ndjson;
pub mod paths;
pub mod pattern;
pub mod ready;
pub mod ring;
pub mod status;
pub mod time;
pub mod where_expr;

/// Generated protocol types (package `dws.bus.v1`).
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/dws.bus.v1.rs"));
}

pub use codec::{encode_event_frame, encode_frame, CodecError, FrameCodec, MAX_FRAME_LEN};

/// Version of the protocol spoken by this build. A bus answers a Hello with a
/// different version with `Error{UNSUPPORTED_VERSION}`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Version string of this build, reported in Hello/HelloAck and `bus.meta`.
/// What this build's bus understands beyond [`PROTOCOL_VERSION`], sent in
/// `HelloAck.features`: additions an older bus of the same protocol version
/// would misread or refuse, so a client uses them only when listed.
pub const FEATURES: &[&str] = &[
    FEATURE_START_TIME,
    FEATURE_GET_EVENT,
    FEATURE_ACK_WAIT_DEFAULT,
    FEATURE_LINE_RING,
    FEATURE_ACK_RUNS,
];
/// `Ack.runs`: events acked a run of consecutive seqs at a time (an older
/// bus would skip the field and ack nothing).
pub const FEATURE_ACK_RUNS: &str = "ack_runs";
/// The line ring (`ring`): `RingRequest` (an older bus closes the
/// connection), `Subscribe.ring_batches`, `Ack.ring_read`.
pub const FEATURE_LINE_RING: &str = "line_ring";
/// `Subscribe.default_ack_wait_ms`, and `ack_wait_ms = 0` meaning the
/// subscription's default (an older bus would read 0 as 1 ms).
pub const FEATURE_ACK_WAIT_DEFAULT: &str = "ack_wait_default";
/// `Subscribe.start = START_TIME` (an older bus would start at the latest).
pub const FEATURE_START_TIME: &str = "start_time";
/// The `GetEvent` frame (an older bus closes the connection).
pub const FEATURE_GET_EVENT: &str = "get_event";

pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// What `dws --version` and `busd --version` print after their name: the
/// build and the protocol version (the workspace builds both from one
/// version, so the two always agree).
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (protocol 1)");

/// Codec for the bus side: decodes client frames, encodes server frames.
pub type ServerCodec = FrameCodec<v1::ClientFrame, v1::ServerFrame>;
/// Codec for the client side: decodes server frames, encodes client frames.
pub type ClientCodec = FrameCodec<v1::ServerFrame, v1::ClientFrame>;

/// `true` if `id` is a valid subscription id: `[A-Za-z0-9._-]{1,64}`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The lower-case name of a source state, as shown by status and consume.
pub fn source_status_name(s: v1::SourceStatus) -> &'static str {
    match s {
        v1::SourceStatus::Unknown => "unknown",
        v1::SourceStatus::Connecting => "connecting",
        v1::SourceStatus::Connected => "connected",
        v1::SourceStatus::Reconnecting => "reconnecting",
        v1::SourceStatus::Lost => "lost",
    }
}

/// The lower-case name of a Bye reason, as used in logs and messages.
pub fn bye_reason_name(reason: v1::ByeReason) -> &'static str {
    use v1::ByeReason as R;
    match reason {
        R::Unspecified => "unspecified",
        R::ClientDone => "client_done",
        R::Shutdown => "shutdown",
        R::Idle => "idle",
        R::StopRequest => "stop_request",
        R::SubscriptionStopped => "subscription_stopped",
        R::Unsubscribed => "unsubscribed",
        R::TakenOver => "taken_over",
        R::SourceLost => "source_lost",
        R::VersionMismatch => "version_mismatch",
        R::Halted => "halted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_build_and_the_protocol() {
        assert_eq!(
            VERSION_LINE,
            format!("{BUILD} (protocol {PROTOCOL_VERSION})")
        );
    }

    #[test]
    fn ids() {
        assert!(is_valid_id("a.b_c-9"));
        assert!(is_valid_id(&"x".repeat(64)));
        assert!(!is_valid_id(&"x".repeat(65)));
        assert!(!is_valid_id(""));
        assert!(!is_valid_id("a b"));
        assert!(!is_valid_id("a/b"));
    }
}
