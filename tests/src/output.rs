//! [`Output`]: a finished process — status, everything it wrote, the bus
//! log tail at that moment — and the assertions tests make on it (exit
//! code, a clean end, one `Error:` line, the JSON a command prints);
//! plus the log tail every failure message carries.

use std::{fmt, path::Path, time::Duration};

use crate::contract::Exited;

/// A finished process: status, everything it wrote, and the bus log tail at
/// that moment. `Display` prints all of it, for assertion messages.
pub struct Output {
    pub display: String,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub bus_log: String,
    pub elapsed: Duration,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "unknown".into(),
        };
        write!(
            f,
            "command: {}\nstatus: {status}\nelapsed: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            self.display, self.elapsed, self.stdout, self.stderr, self.bus_log
        )
    }
}

impl Output {
    pub fn stdout_lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// Asserts the exit code.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "expected exit code {code}\n{self}");
        self
    }

    /// The one `[event] exited ...` line, parsed strictly.
    pub fn exited(&self) -> Exited {
        let lines: Vec<&str> = self
            .stderr_lines()
            .into_iter()
            .filter(|l| l.starts_with("[event] exited"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "expected exactly one `exited` line on stderr\n{self}"
        );
        Exited::parse(lines[0])
            .unwrap_or_else(|e| panic!("malformed exited line {:?}: {e}\n{self}", lines[0]))
    }

    /// Asserts a clean end: exit 0, no `Error:` line, the ready line first and
    /// the exited line last on stderr, every stderr line starting `[event] `,
    /// with `reason` and `count`. Returns the exited line.
    pub fn assert_clean_exit(&self, reason: &str, count: u64) -> Exited {
        self.assert_code(0);
        let lines = self.stderr_lines();
        assert!(
            !lines.iter().any(|l| l.starts_with("Error:")),
            "clean exit must not print an Error: line\n{self}"
        );
        for l in &lines {
            assert!(
                l.starts_with("[event] "),
                "stderr line {l:?} does not start with `[event] `\n{self}"
            );
        }
        let ex = self.exited();
        assert_eq!(
            lines.last().copied(),
            Some(ex.line.as_str()),
            "the exited line must be the last stderr line\n{self}"
        );
        assert_eq!(ex.reason, reason, "exit reason\n{self}");
        assert_eq!(ex.count, count, "event count in the exited line\n{self}");
        ex
    }

    /// Asserts a clean end with reason `source_lost` and no event; returns
    /// the `[event] source lost (…)` line, which says why.
    pub fn assert_source_lost(&self) -> String {
        self.assert_clean_exit("source_lost", 0);
        self.stderr_lines()
            .into_iter()
            .find(|l| l.starts_with("[event] source lost"))
            .unwrap_or_else(|| panic!("no `[event] source lost` line\n{self}"))
            .to_owned()
    }

    /// Asserts a failure: `code`, no `exited` line, exactly one line starting
    /// `Error: `. Returns that line.
    pub fn assert_error(&self, code: i32) -> String {
        self.assert_code(code);
        let lines = self.stderr_lines();
        assert!(
            !lines.iter().any(|l| l.contains("[event] exited")),
            "a failed run must not print an exited line\n{self}"
        );
        let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("Error: ")).collect();
        assert_eq!(
            errors.len(),
            1,
            "expected exactly one `Error: ` line on stderr\n{self}"
        );
        assert!(
            errors[0].len() > "Error: ".len(),
            "empty error message\n{self}"
        );
        errors[0].to_string()
    }

    /// Parses stdout as the one JSON line `dws event publish` prints.
    pub fn publish_json(&self) -> serde_json::Value {
        self.assert_code(0);
        let lines = self.stdout_lines();
        assert_eq!(
            lines.len(),
            1,
            "publish must print exactly one line on stdout\n{self}"
        );
        serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("publish output is not JSON ({e})\n{self}"))
    }

    /// Parses every stdout line as JSON.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout_lines()
            .iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON ({e})\n{self}"))
            })
            .collect()
    }
}

/// Asserts that `secret` (named `name` in the message) appears in none of
/// `places`, given as `(what, text)`.
pub fn assert_absent(name: &str, secret: &str, places: &[(&str, &str)]) {
    for (what, text) in places {
        assert!(!text.contains(secret), "{name} appears in {what}:\n{text}");
    }
}

/// How a process ended, in words.
pub(crate) fn describe_status(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{st:?}"),
    }
}

/// How many lines of a log a failure message shows.
const TAIL_LINES: usize = 40;

/// The last [`TAIL_LINES`] lines of `text`.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].join("\n")
}

/// The last lines of the file `path` (empty if it is missing).
pub(crate) fn tail_of(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    last_lines(&String::from_utf8_lossy(&bytes))
}

/// The tail of the log `path` under a header naming it, for failure messages.
pub(crate) fn log_section(path: &Path) -> String {
    let tail = tail_of(path);
    if tail.is_empty() {
        format!("--- {} (tail): <missing or empty> ---", path.display())
    } else {
        format!("--- {} (tail) ---\n{tail}", path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(code: Option<i32>, stdout: &str, stderr: &str) -> Output {
        Output {
            display: "dws event consume x".into(),
            code,
            signal: None,
            stdout: stdout.into(),
            stderr: stderr.into(),
            bus_log: String::new(),
            elapsed: Duration::from_millis(5),
        }
    }

    #[test]
    fn a_clean_exit_is_checked_line_by_line() {
        let stderr = "[event] ready event_key=x bus_pid=7 subscribe_id=s\n\
                      [event] exited \u{2014} received 1 event(s) in 0.010s (reason: signal)\n";
        let ex = output(Some(0), "{}\n", stderr).assert_clean_exit("signal", 1);
        assert_eq!(ex.seconds_text, "0.010");
        let bad = std::panic::catch_unwind(|| {
            output(Some(0), "", &format!("{stderr}stray\n")).assert_clean_exit("signal", 1)
        });
        assert!(bad.is_err(), "a stray stderr line is not a clean exit");
    }

    #[test]
    fn an_error_is_exactly_one_error_line() {
        let out = output(Some(3), "", "Error: no bus\n");
        assert_eq!(out.assert_error(3), "Error: no bus");
        let two = output(Some(3), "", "Error: a\nError: b\n");
        assert!(std::panic::catch_unwind(|| two.assert_error(3)).is_err());
        let shown = out.to_string();
        assert!(shown.contains("status: exit code 3"), "{shown}");
        assert!(shown.contains("Error: no bus"), "{shown}");
    }

    #[test]
    fn a_tail_is_the_last_forty_lines() {
        let text: String = (0..100).map(|i| format!("l{i}\n")).collect();
        let tail = last_lines(&text);
        assert!(tail.starts_with("l60\n") && tail.ends_with("l99"), "{tail}");
        assert_eq!(last_lines("a\nb"), "a\nb");
        assert!(log_section(Path::new("/nonexistent/bus.log")).contains("<missing or empty>"));
    }
}
