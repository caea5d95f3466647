//! The ready pipe's one message, in one place: how a spawned bus tells the
//! `dws` that spawned it whether start-up worked. One line, then the pipe is
//! closed:
//!
//! - `R`: ready, the socket accepts connections;
//! - `A`: another bus already serves this profile (connect to it);
//! - `E<reason>`: start-up failed (a runtime failure);
//! - `U<reason>`: failed because of a wrong setting (a usage error);
//! - `P<reason>`: failed because of a permission or credential problem.
//!
//! If the bus dies before writing, the reader sees EOF: [`ReadyVerdict::parse`]
//! gives `None`.

/// Why start-up failed, for the client's exit code (1, 2, 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Runtime,
    Usage,
    Permission,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyVerdict {
    Ready,
    AlreadyRunning,
    Failed(FailureKind, String),
}

impl ReadyVerdict {
    /// The line to write (newlines in a reason are folded to spaces).
    pub fn encode(&self) -> String {
        match self {
            ReadyVerdict::Ready => "R\n".into(),
            ReadyVerdict::AlreadyRunning => "A\n".into(),
            ReadyVerdict::Failed(kind, reason) => {
                let tag = match kind {
                    FailureKind::Runtime => 'E',
                    FailureKind::Usage => 'U',
                    FailureKind::Permission => 'P',
                };
                format!("{tag}{}\n", reason.replace(['\n', '\r'], " "))
            }
        }
    }

    /// What the spawner read; `None` for nothing (or nothing it knows).
    pub fn parse(text: &str) -> Option<ReadyVerdict> {
        let text = text.trim_end();
        let mut chars = text.chars();
        let tag = chars.next()?;
        let rest = chars.as_str().to_owned();
        Some(match tag {
            'R' => ReadyVerdict::Ready,
            'A' => ReadyVerdict::AlreadyRunning,
            'E' => ReadyVerdict::Failed(FailureKind::Runtime, rest),
            'U' => ReadyVerdict::Failed(FailureKind::Usage, rest),
            'P' => ReadyVerdict::Failed(FailureKind::Permission, rest),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_round_trips() {
        for v in [
            ReadyVerdict::Ready,
            ReadyVerdict::AlreadyRunning,
            ReadyVerdict::Failed(FailureKind::Runtime, "disk full".into()),
            ReadyVerdict::Failed(FailureKind::Usage, "bad value".into()),
            ReadyVerdict::Failed(FailureKind::Permission, "mode 0644".into()),
        ] {
            assert_eq!(ReadyVerdict::parse(&v.encode()), Some(v));
        }
        assert_eq!(ReadyVerdict::parse(""), None);
        assert_eq!(ReadyVerdict::parse("X?"), None);
        let folded = ReadyVerdict::Failed(FailureKind::Usage, "a\nb".into()).encode();
        assert_eq!(folded, "Ua b\n");
    }
}
