//! URL rules shared by the profile check and the DingTalk sources: parsing
//! an absolute `http(s)`/`ws(s)` URL, and **the loopback rule**: plain
//! `http://` / `ws://` is allowed only to `localhost`, `127.0.0.0/8` and
//! `::1` (tests, the demo); every other host needs `https://` / `wss://`.

pub use url::Url;

/// Parses an absolute `http`, `https`, `ws` or `wss` URL with a host and no
/// user info. The fragment is dropped.
pub fn parse(s: &str) -> Result<Url, String> {
    let s = s.trim();
    let (scheme, rest) = s
        .split_once("://")
        .ok_or("not an absolute URL (no scheme://)")?;
    // WHATWG parsing would read `wss:///x` as host `x`: refuse it first.
    if rest.is_empty() || rest.starts_with(['/', '?', '#']) {
        return Err("no host".into());
    }
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
        return Err(format!("unsupported scheme {scheme:?}"));
    }
    let mut url = Url::parse(s).map_err(|e| e.to_string())?;
    if url.host().is_none() {
        return Err("no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("user info in URLs is not supported".into());
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
pub fn check_transport(url: &Url) -> Result<(), String> {
    if is_tls(url) || is_loopback(url) {
        Ok(())
    } else {
        Err(format!(
            "plain {} to {} refused: only loopback hosts may be reached without TLS",
            url.scheme(),
            url.host_str().unwrap_or("")
        ))
    }
}

/// The rule for a configured base URL: `https://` anywhere, `http://` only
/// to a loopback host.
pub fn check_http_url(s: &str) -> Result<Url, String> {
    let url = parse(s).map_err(|e| format!("not an http(s) URL ({e})"))?;
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        "http" => Err("plain http is allowed only for loopback hosts; use https".into()),
        _ => Err("not an http(s) URL".into()),
    }
}
