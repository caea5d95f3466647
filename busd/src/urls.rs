//! URL rules shared by the profile check and the DingTalk sources: parsing
//! an absolute `http(s)`/`ws(s)` URL, and **the loopback rule**: plain
//! `http://` / `ws://` is allowed only to `localhost`, `127.0.0.0/8` and
//! `::1` (tests, the demo); every other host needs `https://` / `wss://`.

pub use url::Url;

/// Why a URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("not an absolute URL (no scheme://)")]
    NotAbsolute,
    #[error("no host")]
    NoHost,
    #[error("unsupported scheme {0:?}")]
    Scheme(String),
    #[error("{0}")]
    Syntax(#[from] url::ParseError),
    #[error("user info in URLs is not supported")]
    UserInfo,
    /// [`check_transport`]: plain scheme to a host that is not loopback.
    #[error("plain {scheme} to {host} refused: only loopback hosts may be reached without TLS")]
    PlainTransport { scheme: String, host: String },
    /// [`check_http_url`]: not `http(s)` (with why, if it did not parse).
    #[error("not an http(s) URL{}", .0.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    NotHttp(Option<Box<UrlError>>),
    #[error("plain http is allowed only for loopback hosts; use https")]
    PlainHttp,
}

/// Parses an absolute `http`, `https`, `ws` or `wss` URL with a host and no
/// user info. The fragment is dropped.
pub fn parse(s: &str) -> Result<Url, UrlError> {
    let s = s.trim();
    let (scheme, rest) = s.split_once("://").ok_or(UrlError::NotAbsolute)?;
    // WHATWG parsing would read `wss:///x` as host `x`: refuse it first.
    if rest.is_empty() || rest.starts_with(['/', '?', '#']) {
        return Err(UrlError::NoHost);
    }
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
        return Err(UrlError::Scheme(scheme));
    }
    let mut url = Url::parse(s)?;
    if url.host().is_none() {
        return Err(UrlError::NoHost);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::UserInfo);
    }
    url.set_fragment(None);
    Ok(url)
}

pub fn is_tls(url: &Url) -> bool {
    matches!(url.scheme(), "https" | "wss")
}

/// `localhost`, `127.0.0.0/8` or `::1`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Plain (unencrypted) schemes are allowed only to loopback hosts.
pub fn check_transport(url: &Url) -> Result<(), UrlError> {
    if is_tls(url) || is_loopback(url) {
        Ok(())
    } else {
        Err(UrlError::PlainTransport {
            scheme: url.scheme().to_owned(),
            host: url.host_str().unwrap_or("").to_owned(),
        })
    }
}

/// The rule for a configured base URL: `https://` anywhere, `http://` only
/// to a loopback host.
pub fn check_http_url(s: &str) -> Result<Url, UrlError> {
    let url = parse(s).map_err(|e| UrlError::NotHttp(Some(Box::new(e))))?;
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        "http" => Err(UrlError::PlainHttp),
        _ => Err(UrlError::NotHttp(None)),
    }
}
