//! `dws event logs [-n N] [-f]`: the bus's `bus.log` for a profile, as
//! `journalctl -u` prints a unit's — all of it (the rotated `bus.log.1`
//! first) or its last N lines, then with `-f` every line it writes,
//! followed across a rotation (the file shrinks or is replaced: read again
//! from its start). The log is opened as busd's own files are
//! (`files::open`: regular files only, no symbolic link) and read a bounded
//! piece at a time. Never starts a bus.

use std::{
    io::{Read, Seek, SeekFrom, Write},
    os::unix::fs::MetadataExt,
    path::Path,
    time::Duration,
};

use proto::paths::Endpoint;

use crate::{
    cli::LogsArgs,
    exit::{CliError, Result},
    files,
};

/// Whole logs are at most this large (busd rotates at 4 MiB; two files).
const MAX_LOG: usize = 16 * 1024 * 1024;
/// How often `-f` looks for more.
const POLL: Duration = Duration::from_millis(200);

pub fn run(args: LogsArgs, endpoint: &Endpoint) -> Result<()> {
    let path = endpoint.log_path();
    let rotated = path.with_extension("log.1");
    let mut text = Vec::new();
    if let Ok(old) = files::read(&rotated, MAX_LOG) {
        text.extend(old);
    }
    let current = match files::read(&path, MAX_LOG) {
        Ok(b) => b,
        Err(files::ReadError::NotFound) => {
            return Err(CliError::runtime(format!(
                "no bus log for profile {} at {} (its bus has not run)",
                endpoint.profile,
                path.display()
            )))
        }
        Err(e) => {
            return Err(CliError::runtime(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    let mut at = current.len() as u64;
    text.extend(current);
    if let Some(n) = args.lines {
        text = last_lines(&text, n).to_vec();
    }
    if !write_out(&text)? || !args.follow {
        return Ok(());
    }
    follow(&path, &mut at)
}

/// The last `n` lines of `text` (a last line without `\n` counts).
fn last_lines(text: &[u8], n: u64) -> &[u8] {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

/// Writes to stdout; `false` when its reader went away (`… | head`).
fn write_out(bytes: &[u8]) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::runtime(format!("cannot write stdout: {e}"))),
    }
}

/// Prints what is appended to `path` from `at` on, until stdout closes;
/// a file that shrank or was replaced (rotation) is read from its start.
fn follow(path: &Path, at: &mut u64) -> Result<()> {
    let mut inode = std::fs::metadata(path).map_or(0, |m| m.ino());
    loop {
        std::thread::sleep(POLL);
        let Ok(meta) = std::fs::metadata(path) else {
            continue; // between the rotation's rename and the new file
        };
        if meta.ino() != inode || meta.len() < *at {
            inode = meta.ino();
            *at = 0;
        }
        if meta.len() == *at {
            continue;
        }
        let Ok(mut f) = files::open(path) else {
            continue;
        };
        if f.seek(SeekFrom::Start(*at)).is_err() {
            continue;
        }
        let mut chunk = Vec::new();
        let n = (&mut f)
            .take(MAX_LOG as u64)
            .read_to_end(&mut chunk)
            .unwrap_or(0);
        *at += n as u64;
        if !write_out(&chunk)? {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::last_lines;

    #[test]
    fn the_last_lines_are_the_tail_with_or_without_a_final_newline() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"", 1), b"");
    }
}
