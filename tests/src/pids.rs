//! Processes seen by pid, from outside: `/proc` (liveness, argv, the scan
//! for a test's own `busd`), signals, and freezing a process (`SIGSTOP`)
//! at a moment a probe chooses.

use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::POLL;

fn read_proc(pid: i32, what: &str) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/{what}")).ok()
}

/// Pids of the live `busd` processes (exe or argv[0] `busd`, or the file
/// `busd`) whose environment holds `DWS_CONFIG_DIR=<cfg_dir>`, sorted.
pub fn busd_pids_with_config_dir(cfg_dir: &Path, busd: &Path) -> Vec<i32> {
    let mut needle = b"DWS_CONFIG_DIR=".to_vec();
    needle.extend_from_slice(cfg_dir.as_os_str().as_bytes());
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if is_busd(pid, busd) && environ_has(pid, &needle) && is_live(pid) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

fn is_busd(pid: i32, busd: &Path) -> bool {
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        if names_busd(exe.as_os_str().as_bytes(), busd) {
            return true;
        }
    }
    read_proc(pid, "cmdline").is_some_and(|c| {
        let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
        Path::new(OsStr::from_bytes(argv0)).file_name() == Some(OsStr::new("busd"))
    })
}

/// Whether `exe` (a `/proc/<pid>/exe` link, maybe ending ` (deleted)`)
/// is `busd` itself or any file named `busd`.
fn names_busd(exe: &[u8], busd: &Path) -> bool {
    let exe = exe.strip_suffix(b" (deleted)").unwrap_or(exe);
    let exe = Path::new(OsStr::from_bytes(exe));
    exe == busd || exe.file_name() == Some(OsStr::new("busd"))
}

fn environ_has(pid: i32, needle: &[u8]) -> bool {
    read_proc(pid, "environ").is_some_and(|e| e.split(|b| *b == 0).any(|kv| kv == needle))
}

/// A field of `/proc/PID/status` in kB (`VmRSS`, `VmHWM`); 0 when
/// unreadable.
pub fn proc_kb(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `true` if `pid` exists and is not a zombie.
pub fn is_live(pid: i32) -> bool {
    read_proc(pid, "stat").is_some_and(|stat| stat_is_live(&stat))
}

/// Whether a `/proc/<pid>/stat` line names a process that is neither a
/// zombie nor dead: "pid (comm) S ...", the state follows the last ')'.
fn stat_is_live(stat: &[u8]) -> bool {
    let Some(close) = stat.iter().rposition(|b| *b == b')') else {
        return false;
    };
    !matches!(stat.get(close + 2), Some(b'Z') | Some(b'X') | None)
}

/// The argv of every process on the machine, one per line: where a secret
/// must never show up.
pub fn all_process_argv() -> String {
    let mut argvs = String::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            argvs.push_str(&String::from_utf8_lossy(&cmdline).replace('\0', " "));
            argvs.push('\n');
        }
    }
    argvs
}

/// Waits until `pid` is gone (or a zombie).
pub fn wait_pid_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_live(pid) {
            return true;
        }
        thread::sleep(POLL);
    }
    !is_live(pid)
}

/// Sends `sig` to `pid`, panicking if it cannot.
pub fn signal_pid(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill -{sig} {pid}: {e}"));
}

/// Freezes `pid` at a moment `probe` approves of, trying up to `tries`
/// times: stop it (`SIGSTOP`), give what was in flight for it elsewhere
/// (a database server, say) 100 ms to settle, and ask `probe`. `Some`:
/// the process stays stopped and the answer is returned. `None`: thaw it
/// (`SIGCONT`), let it run `pause`, try again. `None` after the last try
/// (the process runs).
pub fn freeze_when<T>(
    pid: i32,
    tries: usize,
    pause: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    for _ in 0..tries {
        signal_pid(pid, Signal::SIGSTOP);
        thread::sleep(Duration::from_millis(100));
        if let Some(found) = probe() {
            return Some(found);
        }
        signal_pid(pid, Signal::SIGCONT);
        thread::sleep(pause);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_state_follows_the_last_parenthesis() {
        assert!(stat_is_live(b"42 (busd) S 1 42 42"));
        assert!(stat_is_live(b"42 (a) b) R 1"), "a comm holding ')'");
        assert!(!stat_is_live(b"42 (busd) Z 1 42"));
        assert!(!stat_is_live(b"42 (busd) X 1 42"));
        assert!(!stat_is_live(b"42 (busd)"));
        assert!(!stat_is_live(b"garbage"));
    }

    #[test]
    fn busd_is_known_by_its_file_name_even_when_deleted() {
        let busd = Path::new("/t/target/debug/busd");
        assert!(names_busd(b"/t/target/debug/busd", busd));
        assert!(names_busd(b"/t/target/debug/busd (deleted)", busd));
        assert!(names_busd(b"/tmp/dwst1/bin/busd", busd));
        assert!(!names_busd(b"/usr/bin/sleep", busd));
        assert!(!names_busd(b"/t/target/debug/busd-old", busd));
    }

    #[test]
    fn freeze_when_stops_at_the_first_approving_probe_and_thaws_otherwise() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id() as i32;
        let state = || {
            let stat = read_proc(pid, "stat").unwrap_or_default();
            let close = stat.iter().rposition(|b| *b == b')').unwrap_or(0);
            stat.get(close + 2).copied()
        };
        let mut asked = 0;
        let got = freeze_when(pid, 5, Duration::from_millis(1), || {
            asked += 1;
            (asked == 3).then(&state)
        });
        assert_eq!(got, Some(Some(b'T')), "stopped while the probe runs");
        assert_eq!(asked, 3);
        signal_pid(pid, Signal::SIGCONT);
        assert_eq!(
            freeze_when(pid, 2, Duration::from_millis(1), || None::<()>),
            None
        );
        thread::sleep(Duration::from_millis(50));
        assert_ne!(state(), Some(b'T'), "thawed after the last try");
        let _ = child.kill();
        let _ = child.wait();
    }
}
