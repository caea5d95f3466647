//! The exit-code contract of `dws`, in one place.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success (for `consume`: the `exited` line was printed) |
//! | 1 | runtime failure: bus unreachable, protocol error, subscription not found or attached elsewhere, upstream error |
//! | 2 | usage or validation error: bad flag or value, invalid regex, `--format json` without a bound |
//! | 3 | authentication or permission failure |
//!
//! Every failure prints exactly one `Error: <message>` line on stderr.

use std::fmt;

use proto::v1::ErrorCode;

pub const RUNTIME: u8 = 1;
pub const USAGE: u8 = 2;
pub const PERMISSION: u8 = 3;

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
            ErrorCode::BadRequest => USAGE,
            ErrorCode::PermissionDenied => PERMISSION,
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
