//! `busd --doctor`: the checks only the daemon's own code can make, for
//! `dws event doctor` to render. Every profile of `config.toml` is loaded on
//! its own (so one bad section is one failed check, never a stop), which
//! also reads the secret files it names; a DingTalk source's endpoints get a
//! TCP connect with a short timeout (reported, never fatal); a
//! `store = "postgres"` profile gets what its start would try against the
//! database ([`database`]: connect, TLS, authenticate, schema, lease row),
//! a failure there being a failed check. Every check is time-bounded. One
//! JSON object per line on stdout: `{"check","profile","status","message","hint"}`.

mod database;

use std::{
    net::{TcpStream, ToSocketAddrs},
    path::Path,
    time::Duration,
};

use serde::Serialize;

use crate::profile::{self, ConfigError, EnvOverrides, SourceConfig};

/// How long one endpoint's TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one endpoint's check may take in all (the name's lookup too).
const REACH_BOUND: Duration = Duration::from_secs(8);

/// One check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub check: &'static str,
    pub profile: String,
    pub status: Status,
    pub message: String,
    pub hint: String,
}

/// Runs the checks for every profile in `<config_root>/config.toml` plus
/// `current` (the profile this run resolved), and prints them.
pub fn run(config_root: &Path, current: &str) -> std::process::ExitCode {
    let checks = checks(config_root, current, &EnvOverrides::from_process(), true);
    for c in &checks {
        match serde_json::to_string(c) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("busd: cannot encode a check: {e}"),
        }
    }
    std::process::ExitCode::SUCCESS
}

/// The checks, in order: the file, then each profile's configuration and
/// (with `network`) its source's endpoints.
pub fn checks(config_root: &Path, current: &str, env: &EnvOverrides, network: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let names = match profile::profile_names(config_root) {
        Ok(mut names) => {
            if !names.iter().any(|n| n == current) {
                names.push(current.to_owned());
            }
            names
        }
        Err(e) => {
            out.push(failed("config", current, &e));
            return out;
        }
    };
    for name in names {
        // The environment's source and store overrides apply to the
        // profile this run serves only: other profiles are read as written.
        let none = EnvOverrides::default();
        let env = if name == current { env } else { &none };
        match profile::load_profile(config_root, &name, env) {
            Err(e) => out.push(failed("config", &name, &e)),
            Ok(p) => {
                out.push(Check {
                    check: "config",
                    profile: name.clone(),
                    status: Status::Ok,
                    message: format!(
                        "source {}, store {}{}",
                        source_kind(&p.source),
                        p.store.kind.name(),
                        if endpoints(&p.source).is_empty() && p.store.postgres.is_none() {
                            ""
                        } else {
                            "; its secret files are readable and private"
                        }
                    ),
                    hint: String::new(),
                });
                if network {
                    for url in endpoints(&p.source) {
                        out.push(reach_bounded(&name, &url));
                    }
                    if let Some(pg) = &p.store.postgres {
                        out.push(database::check(&name, pg));
                    }
                }
            }
        }
    }
    out
}

fn failed(check: &'static str, profile: &str, e: &ConfigError) -> Check {
    let hint = match e {
        ConfigError::Invalid(_) => "fix the key or value the message names",
        ConfigError::Permission(_) => "chmod 600 the file named, or make it readable by you",
    };
    Check {
        check,
        profile: profile.to_owned(),
        status: Status::Fail,
        message: e.to_string(),
        hint: hint.to_owned(),
    }
}

fn source_kind(s: &SourceConfig) -> &'static str {
    match s {
        SourceConfig::Local => "local",
        SourceConfig::Exec(_) => "exec",
        SourceConfig::DingTalk(_) => "dingtalk",
        SourceConfig::Personal(_) => "personal",
    }
}

/// The upstream URLs a source connects to first.
fn endpoints(s: &SourceConfig) -> Vec<String> {
    match s {
        SourceConfig::Local | SourceConfig::Exec(_) => Vec::new(),
        SourceConfig::DingTalk(d) => {
            let mut v = vec![d.open_api.clone()];
            if let Some(p) = &d.portal {
                v.push(p.ticket_url.clone());
            }
            v
        }
        SourceConfig::Personal(p) => vec![p.ticket_url.clone(), p.control_base.clone()],
    }
}

/// `host:port` of an http(s)/ws(s) URL.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let u = url::Url::parse(url).ok()?;
    Some((u.host_str()?.to_owned(), u.port_or_known_default()?))
}

/// [`reach`] within [`REACH_BOUND`] (a name lookup has no timeout of its
/// own): past it, a warning, and the lookup is left behind.
fn reach_bounded(profile: &str, url: &str) -> Check {
    let (tx, rx) = std::sync::mpsc::channel();
    let (p, u) = (profile.to_owned(), url.to_owned());
    std::thread::spawn(move || {
        let _ = tx.send(reach(&p, &u));
    });
    rx.recv_timeout(REACH_BOUND).unwrap_or_else(|_| Check {
        check: "upstream",
        profile: profile.to_owned(),
        status: Status::Warn,
        message: format!(
            "{url}: no answer within {}s (the name's lookup or the connect)",
            REACH_BOUND.as_secs()
        ),
        hint: "check DNS and the network; the bus retries with backoff".into(),
    })
}

/// A TCP connect to the URL's host with [`CONNECT_TIMEOUT`]; a failure is a
/// warning: the bus retries with backoff, and the network may come later.
fn reach(profile: &str, url: &str) -> Check {
    let check = |status, message: String, hint: &str| Check {
        check: "upstream",
        profile: profile.to_owned(),
        status,
        message,
        hint: hint.to_owned(),
    };
    let Some((host, port)) = host_port(url) else {
        return check(Status::Warn, format!("cannot tell the host of {url}"), "");
    };
    let addrs = match (host.as_str(), port).to_socket_addrs() {
        Ok(a) => a.collect::<Vec<_>>(),
        Err(e) => {
            return check(
                Status::Warn,
                format!("{host}:{port}: cannot resolve: {e}"),
                "check DNS and the network; the bus retries with backoff",
            )
        }
    };
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(_) => return check(Status::Ok, format!("{host}:{port} accepts connections"), ""),
            Err(e) => last = e.to_string(),
        }
    }
    check(
        Status::Warn,
        format!("{host}:{port}: no TCP connection: {last}"),
        "check the network or a proxy; the bus retries with backoff",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_checked_on_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("config.toml"),
            "[profiles.typo]\nsoruce = \"local\"\n\n[profiles.ok]\nsource = \"local\"\n",
        )
        .unwrap();
        let c = checks(tmp.path(), "default", &EnvOverrides::default(), false);
        let by = |p: &str| c.iter().find(|c| c.profile == p).map(|c| c.status);
        assert_eq!(by("typo"), Some(Status::Fail));
        assert_eq!(by("ok"), Some(Status::Ok));
        assert_eq!(by("default"), Some(Status::Ok));
    }

    #[test]
    fn host_and_port_of_a_url() {
        assert_eq!(
            host_port("https://api.dingtalk.com/v1.0"),
            Some(("api.dingtalk.com".to_owned(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:8080/x"),
            Some(("127.0.0.1".to_owned(), 8080))
        );
        assert_eq!(host_port("not a url"), None);
    }
}
