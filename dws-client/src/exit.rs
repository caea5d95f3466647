//! The exit-code contract of `dws`, in one place: 0 on success (for
//! `consume`: the `exited` line was printed), [`RUNTIME`], [`USAGE`] or
//! [`PERMISSION`] on a failure. What each code covers is the table in
//! `docs/consume-contract.md` ("Exit codes"); a repository test checks
//! that it lists exactly 0 and the codes defined here.
//!
//! Every failure prints exactly one `Error: <message>` line on stderr. A
//! message repeats at most [`ECHO_CHARS`] characters of any one input
//! ([`clip`], [`quoted`]), and the printed line is capped at
//! [`MESSAGE_CHARS`] characters (`fail` in `lib.rs`), so a huge flag value or
//! a bus message that echoes one never turns into megabytes on stderr.

use std::fmt;

use proto::v1::ErrorCode;

pub const RUNTIME: u8 = 1;
pub const USAGE: u8 = 2;
pub const PERMISSION: u8 = 3;

/// Every exit code and what it means, in one sentence each (the man pages'
/// EXIT STATUS; docs/consume-contract.md has the full table).
pub const TABLE: [(u8, &str); 4] = [
    (0, "success (for consume: the exited line was printed, whatever the reason)"),
    (
        RUNTIME,
        "runtime failure: the bus is unreachable or failed, a protocol error, a subscription not found or attached elsewhere, an upstream error; retry with backoff",
    ),
    (
        USAGE,
        "usage or validation error: a bad flag or value, an invalid regex, a bad configuration value; fix the command, do not retry",
    ),
    (
        PERMISSION,
        "authentication or permission failure: a secret others can read, a refused directory or socket, credentials the upstream refused",
    ),
];

/// The most characters of a printed `Error:` message (a backstop for
/// messages from the bus, which may echo input too).
pub const MESSAGE_CHARS: usize = 1000;

pub use proto::limits::{clip, clip_to, quoted, ECHO_CHARS};

/// A failure that ends the command: its message and exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub code: u8,
    pub message: String,
    /// The bus went away before answering (it was exiting): the request may
    /// be retried on a fresh bus.
    pub bus_gone: bool,
}

impl CliError {
    pub fn runtime(message: impl Into<String>) -> CliError {
        CliError {
            code: RUNTIME,
            message: message.into(),
            bus_gone: false,
        }
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError {
            code: USAGE,
            message: message.into(),
            bus_gone: false,
        }
    }

    pub fn permission(message: impl Into<String>) -> CliError {
        CliError {
            code: PERMISSION,
            message: message.into(),
            bus_gone: false,
        }
    }

    /// The bus closed the connection before replying.
    pub fn bus_gone(message: impl Into<String>) -> CliError {
        CliError {
            code: RUNTIME,
            message: message.into(),
            bus_gone: true,
        }
    }

    /// Maps an `Error` frame from the bus to the exit code it stands for.
    pub fn from_bus(code: i32, message: &str) -> CliError {
        let code = match ErrorCode::try_from(code).unwrap_or(ErrorCode::Unspecified) {
            // About what the user gave: a bad flag value, an event too large
            // to ever be delivered.
            ErrorCode::BadRequest | ErrorCode::TooLarge => USAGE,
            ErrorCode::PermissionDenied => PERMISSION,
            // A bound of the bus (e.g. its connection table) is reached:
            // this client is refused, the bus itself is fine. Not "bus
            // gone": starting another bus would not help.
            ErrorCode::ResourceExhausted => RUNTIME,
            _ => RUNTIME,
        };
        CliError {
            code,
            message: message.to_owned(),
            bus_gone: false,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_error_codes_map_to_exit_codes() {
        let code = |c: ErrorCode| CliError::from_bus(c as i32, "m").code;
        assert_eq!(code(ErrorCode::BadRequest), USAGE);
        assert_eq!(code(ErrorCode::TooLarge), USAGE);
        assert_eq!(code(ErrorCode::PermissionDenied), PERMISSION);
        assert_eq!(code(ErrorCode::ResourceExhausted), RUNTIME);
        assert_eq!(code(ErrorCode::Internal), RUNTIME);
        assert_eq!(CliError::from_bus(9999, "m").code, RUNTIME);
        let e = CliError::from_bus(ErrorCode::ResourceExhausted as i32, "too many connections");
        assert!(!e.bus_gone, "a refusal is not a bus that went away");
        assert_eq!(e.message, "too many connections");
    }

    #[test]
    fn clip_keeps_short_input_and_cuts_long_input_on_a_char_boundary() {
        assert_eq!(clip("abc"), "abc");
        let long = "é".repeat(150);
        let c = clip(&long);
        assert_eq!(c, format!("{}…(300 bytes)", "é".repeat(100)));
        assert_eq!(clip_to("ééé", 2), "éé…(6 bytes)");
        assert_eq!(clip_to("abc", 3), "abc");
        assert_eq!(quoted("a b"), "\"a b\"");
        assert_eq!(
            quoted(&"x".repeat(101)),
            format!("\"{}\"…(101 bytes)", "x".repeat(100))
        );
    }
}
