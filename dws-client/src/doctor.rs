//! `dws event doctor`: one line per check of what makes a bus work, each
//! `ok`, `warn` or `fail` with what to do; exit 1 when one fails.
//!
//! Checked here: the socket (runtime) directory and the work directory (a
//! private directory of the user's, or absent), the bus (running; a stale
//! one: `bus.lock` held but no answer on the socket; a socket file with no
//! process behind it) and the disk store (`FORMAT` readable, damaged ranges
//! from the running bus's status). Checked by `busd --doctor`, since only
//! the daemon reads the configuration: every profile of `config.toml` on its
//! own, the secret files each names, and whether a DingTalk source's
//! endpoints accept a TCP connection (a warning, never a failure), and for
//! a `store = "postgres"` profile what its start would try against the
//! database. `dws` itself still never connects upstream.
//!
//! Nothing here can hang or exhaust memory: the bus's files are opened as
//! busd opens them (`files`: non-blocking, regular files only, reads
//! bounded), and every check has a time bound (`busd --doctor` as a whole
//! [`BUSD_DOCTOR_WAIT`], the bus's Hello [`HELLO_WAIT`], its status
//! [`STATUS_WAIT`]).

use std::{fs, io::Read, os::unix::fs::MetadataExt, path::Path, time::Duration};

use proto::paths::Endpoint;
use serde::{Deserialize, Serialize};

use crate::{
    bus::BusConn,
    cli::{DoctorArgs, TextOrJson},
    exit::{clip, CliError, Result},
    files::{self, ReadError},
    print_stdout, spawn, status,
};

/// How long the bus check waits for the bus's Hello.
const HELLO_WAIT: Duration = Duration::from_secs(3);
/// How long the damage check waits for the running bus's status.
const STATUS_WAIT: Duration = Duration::from_secs(10);
/// How long `busd --doctor` may take for every profile (its own checks are
/// bounded: a TCP connect per endpoint, the database's steps); it is killed
/// after that, and the configuration check fails saying so.
pub const BUSD_DOCTOR_WAIT: Duration = Duration::from_secs(60);
/// The most bytes a `FORMAT` file may have (it holds one short line).
const FORMAT_MAX: usize = 4096;

/// One check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One line of the report (the JSON `checks[]` items, `schemas/doctor.schema.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub check: String,
    pub profile: String,
    pub status: Level,
    pub message: String,
    /// What to do; empty when nothing.
    #[serde(default)]
    pub hint: String,
}

fn check(name: &str, profile: &str, status: Level, message: String, hint: &str) -> Check {
    Check {
        check: name.to_owned(),
        profile: profile.to_owned(),
        status,
        message,
        hint: hint.to_owned(),
    }
}

/// Runs every check, prints them, and fails (exit 1) if one failed.
pub async fn run(args: DoctorArgs, endpoint: &Endpoint) -> Result<()> {
    let p = endpoint.profile.as_str();
    let mut checks = vec![
        private_dir("runtime_dir", p, &endpoint.socket_dir),
        private_dir("work_dir", p, &endpoint.work_dir),
    ];
    checks.extend(from_busd(endpoint, BUSD_DOCTOR_WAIT).await);
    let (bus, running) = bus(endpoint).await;
    checks.push(bus);
    checks.extend(store(endpoint, running).await);
    let failed = checks.iter().filter(|c| c.status == Level::Fail).count();
    let out = match args.format {
        TextOrJson::Text => render(&checks),
        TextOrJson::Json => format!(
            "{}\n",
            serde_json::json!({
                "ok": failed == 0,
                "profile": endpoint.profile,
                "checks": checks,
            })
        ),
    };
    print_stdout(&out)?;
    if failed > 0 {
        return Err(CliError::runtime(format!(
            "doctor: {failed} check(s) failed (see the fail lines above)"
        )));
    }
    Ok(())
}

/// The text report: `STATUS  CHECK[ (profile P)]: MESSAGE[; HINT]`.
pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        s.push_str(&format!("{:<4}  {}", c.status.word(), c.check));
        if !c.profile.is_empty() {
            s.push_str(&format!(" (profile {})", c.profile));
        }
        s.push_str(&format!(": {}", c.message.replace('\n', " ")));
        if !c.hint.is_empty() {
            s.push_str(&format!("; {}", c.hint));
        }
        s.push('\n');
    }
    s
}

/// What a directory the bus keeps files in must be, as busd checks it:
/// absent (created at start), or a real directory of this uid that group
/// and others cannot write.
pub fn dir_verdict(meta: Option<&fs::Metadata>, uid: u32) -> (Level, String, &'static str) {
    let Some(meta) = meta else {
        return (Level::Ok, "absent; the bus creates it (0700)".into(), "");
    };
    let ft = meta.file_type();
    if ft.is_symlink() || !ft.is_dir() {
        return (
            Level::Fail,
            "not a directory (a symbolic link or a file)".into(),
            "remove it; the bus creates the directory",
        );
    }
    if meta.uid() != uid {
        return (
            Level::Fail,
            format!("owned by uid {}, not by you (uid {uid})", meta.uid()),
            "remove it or point DWS_CONFIG_DIR / XDG_RUNTIME_DIR elsewhere",
        );
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return (
            Level::Fail,
            format!("group or world writable (mode {mode:04o})"),
            "run chmod 700 on it",
        );
    }
    (Level::Ok, format!("private (mode {mode:04o})"), "")
}

fn private_dir(name: &str, profile: &str, dir: &Path) -> Check {
    let meta = fs::symlink_metadata(dir).ok();
    let uid = nix::unistd::geteuid().as_raw();
    let (level, what, hint) = dir_verdict(meta.as_ref(), uid);
    check(
        name,
        profile,
        level,
        format!("{}: {what}", dir.display()),
        hint,
    )
}

/// The checks of `busd --doctor` (configuration of every profile, secret
/// files, upstream reachability, a cluster's database), within `wait`.
async fn from_busd(endpoint: &Endpoint, wait: Duration) -> Vec<Check> {
    let p = endpoint.profile.as_str();
    match spawn::find_busd() {
        Ok(busd) => busd_doctor(&busd, p, wait).await,
        Err(e) => vec![check("config", p, Level::Fail, e.message, "")],
    }
}

/// Runs `busd --doctor --profile P`, killed after `wait`.
async fn busd_doctor(busd: &Path, p: &str, wait: Duration) -> Vec<Check> {
    let run = tokio::process::Command::new(busd)
        .args(["--doctor", "--profile", p])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(wait, run).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            return vec![check(
                "config",
                p,
                Level::Fail,
                format!("cannot run {}: {e}", busd.display()),
                "install busd next to dws, or set DWS_BUSD",
            )]
        }
        Err(_) => {
            return vec![check(
                "config",
                p,
                Level::Fail,
                format!(
                    "{} --doctor gave no answer within {}s (stopped)",
                    busd.display(),
                    wait.as_secs_f64()
                ),
                "a DNS lookup or a database that does not answer? run busd --doctor --profile \
                 PROFILE yourself to see which check waits",
            )]
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: Option<Vec<Check>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).ok())
        .collect();
    match parsed {
        Some(v) if out.status.success() && !v.is_empty() => v,
        _ => vec![check(
            "config",
            p,
            Level::Fail,
            format!(
                "{} --doctor failed ({}): {}",
                busd.display(),
                out.status,
                clip(String::from_utf8_lossy(&out.stderr).trim())
            ),
            "an older busd has no --doctor: install busd and dws from the same build",
        )],
    }
}

/// Whether `bus.lock` is held, and by which pid (as written in it, read
/// from the same descriptor, at most 64 bytes).
fn lock_holder(path: &Path) -> Option<Option<u32>> {
    use nix::fcntl::{Flock, FlockArg};
    let file = files::open(path).ok()?;
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err((file, _)) => {
            let mut text = String::new();
            let pid = file
                .take(64)
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            Some(pid)
        }
    }
}

/// The bus: running, stale, or not running. `true` when it answered.
async fn bus(endpoint: &Endpoint) -> (Check, bool) {
    let p = endpoint.profile.as_str();
    let socket = endpoint.socket_path.display();
    let held = lock_holder(&endpoint.lock_path());
    // A stopped bus accepts (the kernel queues) but never says Hello.
    let answered = tokio::time::timeout(HELLO_WAIT, BusConn::open(endpoint))
        .await
        .unwrap_or(Ok(None));
    let pid_of = |pid: Option<u32>| pid.map_or("?".to_owned(), |p| p.to_string());
    let c = |l, m, h| (check("bus", p, l, m, h), false);
    match (held, answered) {
        (_, Ok(Some(mut conn))) => {
            let pid = conn.hello.bus_pid;
            conn.bye().await;
            (
                check(
                    "bus",
                    p,
                    Level::Ok,
                    format!("running, pid {pid}, socket {socket}"),
                    "",
                ),
                true,
            )
        }
        (Some(pid), _) => c(
            Level::Fail,
            format!(
                "stale: pid {} holds {} but does not answer on {socket}",
                pid_of(pid),
                endpoint.lock_path().display()
            ),
            "a bus starting or exiting answers within seconds; otherwise it is stuck or \
             stopped: kill it (kill -CONT first if it was stopped), then run dws again",
        ),
        (None, Err(e)) => c(
            Level::Fail,
            format!("cannot ask the bus on {socket}: {}", e.message),
            "check the socket directory above",
        ),
        (None, Ok(None))
            if std::os::unix::net::UnixStream::connect(&endpoint.socket_path).is_ok() =>
        {
            c(
                Level::Fail,
                format!("something listens on {socket} but no bus answers"),
                "a systemd socket whose service does not start? see \
             systemctl --user status dws-bus@PROFILE.service and its journal",
            )
        }
        (None, Ok(None)) if fs::symlink_metadata(&endpoint.socket_path).is_ok() => c(
            Level::Warn,
            format!("a socket with no process behind it: {socket}"),
            "harmless: the next bus removes it; or remove it yourself",
        ),
        (None, Ok(None)) => c(
            Level::Ok,
            "not running; dws starts it on demand".to_owned(),
            "",
        ),
    }
}

/// The disk store: its `FORMAT` file, and damage the running bus reports.
async fn store(endpoint: &Endpoint, running: bool) -> Vec<Check> {
    let p = endpoint.profile.as_str();
    let dir = endpoint.work_dir.join("store");
    let format = dir.join("FORMAT");
    let mut out = vec![match files::read(&format, FORMAT_MAX) {
        Ok(bytes) => {
            let (level, what, hint) = format_verdict(&bytes);
            check(
                "store",
                p,
                level,
                format!("{}: {what}", format.display()),
                hint,
            )
        }
        Err(ReadError::NotFound) => check(
            "store",
            p,
            Level::Ok,
            format!(
                "no disk store at {} yet (or not a disk store)",
                dir.display()
            ),
            "",
        ),
        Err(e @ (ReadError::NotRegular(_) | ReadError::TooLarge(_))) => check(
            "store",
            p,
            Level::Fail,
            format!("{}: {e}; the bus refuses to open it", format.display()),
            "move the store directory away to start empty (or put back the FORMAT file it had)",
        ),
        Err(e) => check(
            "store",
            p,
            Level::Fail,
            format!("cannot read {}: {e}", format.display()),
            "make the store directory yours and readable (chmod 700)",
        ),
    }];
    if running {
        let fetched = tokio::time::timeout(STATUS_WAIT, status::fetch(endpoint)).await;
        if let Ok(Ok(Some(st))) = fetched {
            let damaged = &st.doc.store.damaged;
            out.push(if damaged.is_empty() {
                check("store_damage", p, Level::Ok, "no damaged ranges".into(), "")
            } else {
                let ranges: Vec<String> = damaged
                    .iter()
                    .map(|d| format!("{}..={} in {}", d.from_seq, d.to_seq, d.file))
                    .collect();
                check(
                    "store_damage",
                    p,
                    Level::Warn,
                    format!("damaged ranges: {}", clip(&ranges.join(", "))),
                    "their events are lost and were reported as gaps; see dws event status",
                )
            });
        }
    }
    out
}

/// A `FORMAT` file this build's busd can read: `dws-event-store 1`.
pub fn format_verdict(bytes: &[u8]) -> (Level, String, &'static str) {
    let text = String::from_utf8_lossy(bytes);
    match text
        .trim()
        .strip_prefix("dws-event-store ")
        .and_then(|v| v.parse::<u32>().ok())
    {
        Some(1) => (Level::Ok, "format 1".into(), ""),
        Some(v) => (
            Level::Fail,
            format!("format {v}, which this build does not read"),
            "run the busd that wrote it",
        ),
        None => (
            Level::Fail,
            "not a dws event store format file".into(),
            "move the store directory away to start empty",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_must_be_absent_or_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(dir_verdict(None, uid).0, Level::Ok);
        let d = tmp.path().join("d");
        fs::create_dir(&d).expect("mkdir");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).expect("chmod");
        let meta = fs::symlink_metadata(&d).expect("stat");
        assert_eq!(dir_verdict(Some(&meta), uid).0, Level::Ok);
        assert_eq!(dir_verdict(Some(&meta), uid + 1).0, Level::Fail);
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).expect("chmod");
        let meta = fs::symlink_metadata(&d).expect("stat");
        let (l, m, h) = dir_verdict(Some(&meta), uid);
        assert_eq!(l, Level::Fail, "{m}");
        assert!(h.contains("chmod 700"));
    }

    #[test]
    fn a_busd_doctor_that_never_answers_is_stopped_at_its_bound() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let busd = tmp.path().join("busd");
        fs::write(&busd, "#!/bin/sh\nexec sleep 600\n").expect("write");
        fs::set_permissions(&busd, fs::Permissions::from_mode(0o700)).expect("chmod");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let started = std::time::Instant::now();
        let checks = rt.block_on(busd_doctor(&busd, "p", Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(60), "bounded");
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].status, Level::Fail);
        assert!(
            checks[0].message.contains("no answer within 0.3s"),
            "{checks:?}"
        );
    }

    #[test]
    fn format_files() {
        assert_eq!(format_verdict(b"dws-event-store 1\n").0, Level::Ok);
        assert_eq!(format_verdict(b"dws-event-store 99\n").0, Level::Fail);
        assert_eq!(format_verdict(b"\xff").0, Level::Fail);
    }

    #[test]
    fn one_line_per_check() {
        let c = vec![
            check("bus", "default", Level::Ok, "running".into(), ""),
            check("config", "typo", Level::Fail, "bad\nkey".into(), "fix it"),
        ];
        assert_eq!(
            render(&c),
            "ok    bus (profile default): running\nfail  config (profile typo): bad key; fix it\n"
        );
    }
}
