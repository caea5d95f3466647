//! Where a profile's bus lives. Both `busd` and `dws` resolve the same
//! [`Endpoint`] from the same inputs, so they always meet at one socket.
//!
//! - Config root: `$DWS_CONFIG_DIR`, else `$HOME/.dws`.
//! - Profile: `--profile`, else `$DWS_PROFILE`, else `default`.
//! - Work dir: `<root>/events/<profile>/` (`bus.lock`, `bus.meta`, `bus.log`).
//! - Socket: `<base>/dws-event-<uid>/<hash>.sock` where `<base>` is the first of
//!   `$XDG_RUNTIME_DIR`, `$TMPDIR`, `/tmp` whose resulting path fits the
//!   107-byte `sun_path` limit, and `<hash>` is a stable hash of the absolute
//!   config root and the profile.

use std::{
    fmt,
    path::{Path, PathBuf},
};

/// The longest socket path that fits in `sockaddr_un.sun_path` (108 bytes
/// including the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The profile used when none is given.
pub const DEFAULT_PROFILE: &str = "default";

/// Everything a process needs to find (or become) a profile's bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub profile: String,
    pub config_root: PathBuf,
    pub work_dir: PathBuf,
    pub socket_dir: PathBuf,
    pub socket_path: PathBuf,
}

impl Endpoint {
    pub fn lock_path(&self) -> PathBuf {
        self.work_dir.join("bus.lock")
    }
    pub fn meta_path(&self) -> PathBuf {
        self.work_dir.join("bus.meta")
    }
    pub fn log_path(&self) -> PathBuf {
        self.work_dir.join("bus.log")
    }
}

/// Why an [`Endpoint`] could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    InvalidProfile(String),
    NoConfigRoot,
    SocketPathTooLong { shortest: PathBuf },
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::InvalidProfile(p) => write!(
                f,
                "invalid profile {p:?}: use 1-64 characters from A-Z a-z 0-9 . _ -"
            ),
            PathError::NoConfigRoot => {
                write!(f, "cannot find the config root: set DWS_CONFIG_DIR or HOME")
            }
            PathError::SocketPathTooLong { shortest } => write!(
                f,
                "socket path {} is longer than the {MAX_SOCKET_PATH}-byte limit of a unix socket: \
                 set XDG_RUNTIME_DIR or TMPDIR to a shorter directory",
                shortest.display()
            ),
        }
    }
}

impl std::error::Error for PathError {}

/// The inputs of resolution, read from the environment by [`Env::from_process`]
/// and written by hand in tests.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub profile: Option<String>,
    pub config_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    pub tmpdir: Option<PathBuf>,
    pub uid: u32,
}

fn non_empty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Env {
    /// Reads `DWS_PROFILE`, `DWS_CONFIG_DIR`, `HOME`, `XDG_RUNTIME_DIR`, `TMPDIR`.
    pub fn from_process(uid: u32) -> Env {
        Env {
            profile: non_empty("DWS_PROFILE"),
            config_dir: non_empty("DWS_CONFIG_DIR").map(PathBuf::from),
            home: non_empty("HOME").map(PathBuf::from),
            xdg_runtime_dir: non_empty("XDG_RUNTIME_DIR").map(PathBuf::from),
            tmpdir: non_empty("TMPDIR").map(PathBuf::from),
            uid,
        }
    }
}

/// Resolves the endpoint of `profile` (a `--profile` value overrides the env).
pub fn resolve(profile: Option<&str>, env: &Env) -> Result<Endpoint, PathError> {
    let profile = profile
        .map(str::to_owned)
        .or_else(|| env.profile.clone())
        .unwrap_or_else(|| DEFAULT_PROFILE.to_owned());
    if !crate::is_valid_id(&profile) || profile.starts_with('.') {
        return Err(PathError::InvalidProfile(profile));
    }
    let root = match (&env.config_dir, &env.home) {
        (Some(dir), _) => dir.clone(),
        (None, Some(home)) => home.join(".dws"),
        (None, None) => return Err(PathError::NoConfigRoot),
    };
    let config_root = std::path::absolute(&root).unwrap_or(root);
    let work_dir = config_root.join("events").join(&profile);

    let hash = fnv1a64(
        config_root
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .chain(b"\0")
            .chain(profile.as_bytes()),
    );
    let leaf = format!("{hash:016x}.sock");
    let dir_name = format!("dws-event-{}", env.uid);
    let bases = [
        env.xdg_runtime_dir.clone(),
        env.tmpdir.clone(),
        Some(PathBuf::from("/tmp")),
    ];
    let mut shortest: Option<PathBuf> = None;
    for base in bases.into_iter().flatten() {
        let socket_dir = base.join(&dir_name);
        let socket_path = socket_dir.join(&leaf);
        if fits(&socket_path) {
            return Ok(Endpoint {
                profile,
                config_root,
                work_dir,
                socket_dir,
                socket_path,
            });
        }
        if shortest.as_ref().is_none_or(|s| len(&socket_path) < len(s)) {
            shortest = Some(socket_path);
        }
    }
    Err(PathError::SocketPathTooLong {
        shortest: shortest.unwrap_or_default(),
    })
}

fn len(p: &Path) -> usize {
    p.as_os_str().len()
}

fn fits(p: &Path) -> bool {
    len(p) <= MAX_SOCKET_PATH
}

/// FNV-1a, 64 bit: stable across builds and platforms (unlike `DefaultHasher`),
/// so every version of `dws` finds every version of `busd`.
fn fnv1a64<'a>(bytes: impl Iterator<Item = &'a u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Env {
        Env {
            config_dir: Some("/cfg".into()),
            xdg_runtime_dir: Some("/run/user/1000".into()),
            uid: 1000,
            ..Env::default()
        }
    }

    #[test]
    fn default_layout() {
        let e = resolve(None, &env()).unwrap();
        assert_eq!(e.profile, "default");
        assert_eq!(e.work_dir, PathBuf::from("/cfg/events/default"));
        assert_eq!(e.socket_dir, PathBuf::from("/run/user/1000/dws-event-1000"));
        assert!(e.socket_path.to_string_lossy().ends_with(".sock"));
    }

    #[test]
    fn profiles_get_distinct_sockets() {
        let a = resolve(Some("a"), &env()).unwrap();
        let b = resolve(Some("b"), &env()).unwrap();
        assert_ne!(a.socket_path, b.socket_path);
        let mut other = env();
        other.config_dir = Some("/cfg2".into());
        assert_ne!(
            resolve(Some("a"), &other).unwrap().socket_path,
            a.socket_path
        );
    }

    #[test]
    fn long_runtime_dir_falls_back() {
        let mut e = env();
        e.xdg_runtime_dir = Some(PathBuf::from(format!("/{}", "x".repeat(120))));
        let ep = resolve(None, &e).unwrap();
        assert!(ep.socket_dir.starts_with("/tmp"));
        e.tmpdir = Some(PathBuf::from(format!("/{}", "y".repeat(120))));
        assert!(resolve(None, &e).unwrap().socket_dir.starts_with("/tmp/"));
    }

    #[test]
    fn bad_profile() {
        assert!(matches!(
            resolve(Some("../x"), &env()),
            Err(PathError::InvalidProfile(_))
        ));
        assert!(matches!(
            resolve(Some(".."), &env()),
            Err(PathError::InvalidProfile(_))
        ));
    }
}
