//! The peers, through the repository's own peer benchmark `dws-peers`
//! (next to this executable, or `--peers-bin`): one run of a workload, its
//! last stdout line parsed as `{"system", "version", "summary": {KEY:
//! {"median", "min", "max"}, ..., "lost_per_run": [..]}}`.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use dws_tests::{Sig, TestEnv};
use serde_json::Value;

use crate::{
    procs::{guarded, interrupted},
    Res, POLL,
};

/// What one `dws-peers` run reported.
#[derive(Debug)]
pub struct PeerRun {
    /// e.g. "redis", "nats".
    pub system: String,
    pub version: String,
    summary: Value,
    pub took: Duration,
}

impl PeerRun {
    /// The median of a summary key.
    pub fn median(&self, key: &str) -> Option<f64> {
        self.summary[key]["median"].as_f64()
    }

    /// Messages lost per run (one entry per run).
    pub fn lost(&self) -> Vec<u64> {
        self.summary["lost_per_run"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
            .unwrap_or_default()
    }
}

/// Parses the summary of a finished run: the last non-empty stdout line
/// must be a JSON object with a `summary` object.
pub fn parse_summary(stdout: &str, took: Duration) -> Result<PeerRun, String> {
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("no output")?;
    let v: Value = serde_json::from_str(last.trim())
        .map_err(|e| format!("its last line is not JSON ({e}): {last:?}"))?;
    if !v["summary"].is_object() {
        return Err(format!("its last line has no \"summary\" object: {last:?}"));
    }
    let text = |k: &str| v[k].as_str().unwrap_or("").to_owned();
    Ok(PeerRun {
        system: text("system"),
        version: text("version"),
        summary: v["summary"].clone(),
        took,
    })
}

/// "7.0.15" out of "Redis server v=7.0.15 sha=…", "v2.9.10" out of
/// "nats-server: v2.9.10"; else the whole string.
pub fn short_version(full: &str) -> &str {
    full.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .or_else(|| {
            full.split_whitespace()
                .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
        })
        .unwrap_or(full)
}

/// Where `dws-peers` is: `--peers-bin`, else next to this executable.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let p = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this executable: {e}"))?
            .parent()
            .ok_or("this executable has no directory")?
            .join("dws-peers"),
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found (build it: cargo build -p dws-tests --bins; or pass --peers-bin PATH)",
            p.display()
        ))
    }
}

/// An executable `name` on PATH.
pub fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            d.join(name)
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The server a workload needs on PATH, if any.
pub fn server_of(workload: &str) -> Option<&'static str> {
    if workload.starts_with("redis") {
        Some("redis-server")
    } else if workload.starts_with("nats") || workload.starts_with("jetstream") {
        Some("nats-server")
    } else {
        None
    }
}

/// Runs `dws-peers <workload> <args>` in its own temp dir (`--dir` there
/// when `with_dir`), stopped after `timeout` or on an interrupt (SIGTERM,
/// so it stops the servers it started, then SIGKILL).
pub fn run(
    bin: &Path,
    workload: &str,
    args: &[String],
    with_dir: bool,
    timeout: Duration,
) -> Res<PeerRun> {
    guarded(|| {
        let env = TestEnv::new();
        let mut argv: Vec<String> = vec![workload.to_owned()];
        argv.extend_from_slice(args);
        if with_dir {
            argv.push("--dir".into());
            argv.push(env.root().display().to_string());
        }
        let what = format!("{} {}", bin.display(), argv.join(" "));
        let started = Instant::now();
        let mut child = env.command(bin, &argv).spawn();
        while child.is_running() {
            let why = if interrupted() {
                Some("interrupted by a signal".to_string())
            } else if started.elapsed() >= timeout {
                Some(format!("did not finish within {timeout:?}"))
            } else {
                None
            };
            if let Some(why) = why {
                child.signal(Sig::SIGTERM);
                let grace = Instant::now() + Duration::from_secs(10);
                while child.is_running() && Instant::now() < grace {
                    thread::sleep(POLL);
                }
                return Err(format!("`{what}` {why}"));
            }
            thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_exit(Duration::from_secs(5));
        let took = started.elapsed();
        if out.code != Some(0) {
            let last = |s: &str| {
                s.lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(str::trim)
                    .map(str::to_owned)
            };
            let reason = last(&out.stderr)
                .or_else(|| last(&out.stdout))
                .unwrap_or_else(|| "no reason given".into());
            return Err(format!(
                "`{what}` failed ({}): {reason}",
                out.code.map_or("killed".into(), |c| format!("exit {c}"))
            ));
        }
        parse_summary(&out.stdout, took).map_err(|e| format!("`{what}`: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_is_the_summary() {
        let out = "starting redis-server\nrun 1: 1200000 deliveries/s\n\
                   {\"system\": \"redis\", \"version\": \"7.0.15\", \"summary\": {\"total_rate\": \
                   {\"median\": 1210000.5, \"min\": 1.0, \"max\": 2.0}, \"lost_per_run\": [0, 3]}}\n";
        let r = parse_summary(out, Duration::from_secs(1)).expect("parses");
        assert_eq!((r.system.as_str(), r.version.as_str()), ("redis", "7.0.15"));
        assert_eq!(r.median("total_rate"), Some(1210000.5));
        assert_eq!(r.median("p99_us"), None);
        assert_eq!(r.lost(), vec![0, 3]);
    }

    #[test]
    fn no_summary_is_an_error() {
        assert!(parse_summary("", Duration::ZERO).is_err());
        assert!(parse_summary("{\"summary\": 1}\n", Duration::ZERO).is_err());
        assert!(parse_summary("{\"summary\": {}}\ntrailing words\n", Duration::ZERO).is_err());
    }

    #[test]
    fn short_versions() {
        assert_eq!(
            short_version("Redis server v=7.0.15 sha=00000000:0 bits=64"),
            "7.0.15"
        );
        assert_eq!(short_version("nats-server: v2.9.10"), "v2.9.10");
        assert_eq!(
            short_version("ext4 on /dev/vda (/)"),
            "ext4 on /dev/vda (/)"
        );
    }

    #[test]
    fn servers_of_workloads() {
        assert_eq!(server_of("redis-streams-publish"), Some("redis-server"));
        assert_eq!(server_of("jetstream-fanout"), Some("nats-server"));
        assert_eq!(server_of("nats-fanout"), Some("nats-server"));
        assert_eq!(server_of("fdatasync-latency"), None);
    }
}
