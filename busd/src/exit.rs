//! The exit-code contract of `busd`, in one place: [`TABLE`] says what each
//! code means, [`Failure`] is every way a run ends in failure and
//! [`Failure::code`] the one mapping from a failure to its code. A failure
//! prints exactly one `busd: <message>` line on stderr ([`Failure::exit`]).
//!
//! The spawning `dws` does not read these codes: a start-up failure's class
//! (runtime, usage, permission) travels on the ready pipe
//! ([`crate::ready::FailureKind`]), which `dws` maps to its own exit codes.

use std::{path::PathBuf, process::ExitCode};

use crate::ready::{ReadyFdError, StartError};

pub const RUNTIME: u8 = 1;
pub const USAGE: u8 = 2;

/// Every exit code and what it means, in one sentence each.
pub const TABLE: [(u8, &str); 3] = [
    (
        0,
        "success: a clean shutdown, another bus already serves the profile, or an informational run (--help, --version, --doctor, --print-socket-path, --generate-man)",
    ),
    (
        RUNTIME,
        "start-up failed (its class is on the ready pipe for the spawning dws), or the man page could not be written",
    ),
    (
        USAGE,
        "a bad command line: an unknown flag or value, a wrong --ready-fd, a profile the paths refuse",
    ),
];

/// Why a `busd` run failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The command line is wrong (clap's first line).
    #[error("{0}")]
    Usage(String),
    /// `--ready-fd` is not usable.
    #[error(transparent)]
    ReadyFd(#[from] ReadyFdError),
    /// The profile's paths cannot be resolved (`--doctor`,
    /// `--print-socket-path`).
    #[error(transparent)]
    Paths(#[from] proto::paths::PathError),
    /// Start-up failed.
    #[error(transparent)]
    Start(#[from] StartError),
    /// `--generate-man DIR` could not write the page.
    #[error("cannot write the man page into {}: {source}", dir.display())]
    ManPage {
        dir: PathBuf,
        source: std::io::Error,
    },
}

impl Failure {
    /// The exit code of this failure.
    pub fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) | Failure::ReadyFd(_) | Failure::Paths(_) => USAGE,
            Failure::Start(_) | Failure::ManPage { .. } => RUNTIME,
        }
    }

    /// Prints the one `busd: <message>` line and gives the exit code.
    pub fn exit(&self) -> ExitCode {
        eprintln!("busd: {self}");
        ExitCode::from(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ready::FailureKind;

    #[test]
    fn every_failure_has_a_code_in_the_table() {
        let failures = [
            Failure::Usage("unexpected argument".into()),
            Failure::ReadyFd(ReadyFdError::Stdio(1)),
            Failure::Start(StartError::runtime("disk full")),
            Failure::Start(StartError::permission("mode 0644")),
            Failure::ManPage {
                dir: "/x".into(),
                source: std::io::Error::other("read-only"),
            },
        ];
        for f in &failures {
            assert!(TABLE.iter().any(|(c, _)| *c == f.code()), "{f:?}");
            assert_ne!(f.code(), 0);
        }
        assert_eq!(failures[0].code(), USAGE);
        assert_eq!(failures[1].code(), USAGE);
        // The class of a start-up failure goes to the ready pipe; the exit
        // code is 1 whatever it is.
        assert_eq!(failures[3].code(), RUNTIME);
        let start = StartError::usage("bad value");
        assert_eq!(start.kind, FailureKind::Usage);
        assert_eq!(Failure::from(start).code(), RUNTIME);
    }

    #[test]
    fn messages_are_unchanged() {
        assert_eq!(
            Failure::ReadyFd(ReadyFdError::Stdio(2)).to_string(),
            "--ready-fd 2: must be 3 or more"
        );
        assert_eq!(
            Failure::Start(StartError::runtime("the store failed: x")).to_string(),
            "the store failed: x"
        );
        assert_eq!(
            Failure::ManPage {
                dir: "/m".into(),
                source: std::io::Error::other("nope"),
            }
            .to_string(),
            "cannot write the man page into /m: nope"
        );
    }
}
