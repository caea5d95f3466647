//! Network plumbing of the DingTalk sources: URLs (the `url` crate, plus the
//! one rule of which hosts may be reached without TLS), the TLS client
//! configuration (rustls with the `ring` provider and the webpki root store,
//! shared by the HTTP client and the WebSocket dial), and the HTTP client of
//! the JSON calls (`reqwest`, bounded in size and time).
//!
//! **The loopback rule** (owned by `crate::urls`, used here and by the
//! profile check): plain
//! `http://` / `ws://` is allowed only to `localhost`, `127.0.0.0/8` and
//! `::1` (tests, the demo); every other host needs `https://` / `wss://`.

use std::{sync::Arc, time::Duration};

pub use crate::urls::{check_http_url, check_transport, is_loopback, is_tls, parse, Url};

/// Largest HTTP response body accepted from the upstream.
pub const MAX_RESPONSE: usize = 1024 * 1024;

/// The URL without its query: safe to log (a query may carry a ticket).
pub fn redacted(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// `url` with the query parameters `pairs` appended (form-encoded).
pub fn with_query(url: &Url, pairs: &[(&str, String)]) -> Url {
    let mut u = url.clone();
    if !pairs.is_empty() {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
    }
    u
}

/// The WebSocket URL for `ticket` at `endpoint`: the query parameter
/// `ticket` set (form-encoded), every other parameter kept in order. With
/// `keep_embedded`, a non-empty `ticket` the endpoint already carries is
/// kept as it is (the personal stream's rule); otherwise it is replaced.
pub fn with_ticket(endpoint: &Url, ticket: &str, keep_embedded: bool) -> Url {
    let pairs: Vec<(String, String)> = endpoint.query_pairs().into_owned().collect();
    if keep_embedded && pairs.iter().any(|(k, v)| k == "ticket" && !v.is_empty()) {
        return endpoint.clone();
    }
    let mut u = endpoint.clone();
    u.set_query(None);
    {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs.iter().filter(|(k, _)| k != "ticket") {
            q.append_pair(k, v);
        }
        q.append_pair("ticket", ticket);
    }
    u
}

// ------------------------------------------------------------------ TLS

/// The test knob naming a PEM file of extra root certificates (a test CA
/// for a loopback `wss://`/`https://` fake); unset in production.
pub const EXTRA_CA_ENV: &str = "DWS_DINGTALK_EXTRA_CA_FILE";

/// Why the DingTalk sources' TLS client cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read {path}: {cause}")]
    Unreadable { path: String, cause: String },
    #[error("{path}: not a PEM certificate: {cause}")]
    NotPem { path: String, cause: String },
    #[error("{path}: unusable certificate: {cause}")]
    Unusable { path: String, cause: String },
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

/// The client TLS configuration: rustls with the `ring` provider, TLS 1.2
/// and 1.3, the webpki (Mozilla) root store (plus the certificates of
/// [`EXTRA_CA_ENV`], for tests), no client certificate.
pub fn tls_config() -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = std::env::var_os(EXTRA_CA_ENV).filter(|p| !p.is_empty()) {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let shown = || std::path::Path::new(&path).display().to_string();
        let pem = std::fs::read(&path).map_err(|e| TlsSetupError::Unreadable {
            path: shown(),
            cause: e.to_string(),
        })?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| TlsSetupError::NotPem {
                path: shown(),
                cause: format!("{e:?}"),
            })?;
            roots.add(cert).map_err(|e| TlsSetupError::Unusable {
                path: shown(),
                cause: e.to_string(),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Setup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

// ------------------------------------------------------------------ HTTP

/// A complete HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

/// The HTTP client of the upstream calls (`reqwest`): TLS from
/// [`tls_config`], HTTP/1.1, no redirects (a redirect must not carry
/// credentials elsewhere), no proxy (like the WebSocket dial), and every
/// request — connect, TLS, request, response body — bounded by `timeout`.
pub fn http_client(
    tls: &Arc<rustls::ClientConfig>,
    user_agent: &str,
    timeout: Duration,
) -> Result<reqwest::Client, NetError> {
    reqwest::Client::builder()
        .use_preconfigured_tls((**tls).clone())
        .user_agent(user_agent)
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|e| NetError::Setup(describe(&e)))
}

/// Why an HTTP call got no (whole) response. The messages carry neither
/// the URL's query nor the request body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Plain `http://` to a host that is not loopback.
    #[error(transparent)]
    Transport(#[from] crate::urls::UrlError),
    #[error("HTTP client setup failed: {0}")]
    Setup(String),
    /// No response (the `reqwest` error, its causes on one line).
    #[error("{0}")]
    Send(String),
    #[error("reading the response failed: {0}")]
    Read(String),
    #[error("response larger than {MAX_RESPONSE} bytes")]
    TooLarge,
}

/// Sends `req` (built for `url`) and reads the whole response, at most
/// [`MAX_RESPONSE`] bytes. Plain `http://` is refused unless `url` is a
/// loopback host. The error is a transport-level message without the URL's
/// query or the request body.
pub async fn send(url: &Url, req: reqwest::RequestBuilder) -> Result<Response, NetError> {
    check_transport(url)?;
    let mut resp = req.send().await.map_err(|e| NetError::Send(describe(&e)))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| NetError::Read(describe(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(NetError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A `reqwest` error with its causes on one line, without the URL.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "no response in time (timed out)".into();
    }
    let mut msg = match e.url() {
        Some(u) => e.to_string().replace(&format!(" ({u})"), ""),
        None => e.to_string(),
    };
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        cause = c.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_rebuild() {
        let u = parse("wss://wss-open-connection.dingtalk.com:443/connect").unwrap();
        assert_eq!(u.host_str(), Some("wss-open-connection.dingtalk.com"));
        assert_eq!(u.port_or_known_default(), Some(443));
        assert_eq!(u.path(), "/connect");
        let t = with_ticket(&u, "a b+c", false);
        assert_eq!(
            t.as_str(),
            "wss://wss-open-connection.dingtalk.com/connect?ticket=a+b%2Bc"
        );
        assert_eq!(
            redacted(&t),
            "wss://wss-open-connection.dingtalk.com/connect"
        );

        let u = parse("ws://127.0.0.1:9/gw/x?region=cn&ticket=old&b=2#frag").unwrap();
        let t = with_ticket(&u, "T-1", false);
        assert_eq!(t.as_str(), "ws://127.0.0.1:9/gw/x?region=cn&b=2&ticket=T-1");
        assert_eq!(
            with_ticket(&u, "T-1", true).as_str(),
            "ws://127.0.0.1:9/gw/x?region=cn&ticket=old&b=2",
            "an embedded ticket is kept"
        );
        let empty = parse("ws://127.0.0.1:9/c?ticket=&x=1").unwrap();
        assert_eq!(
            with_ticket(&empty, "T", true).as_str(),
            "ws://127.0.0.1:9/c?x=1&ticket=T",
            "an empty one is not"
        );
        assert!(is_loopback(&u));
        assert!(check_transport(&u).is_ok());

        let u = parse("ws://[::1]:8080").unwrap();
        assert_eq!((u.host_str(), u.path()), (Some("[::1]"), "/"));
        assert!(is_loopback(&u));

        assert!(check_transport(&parse("ws://example.com/connect").unwrap()).is_err());
        assert!(check_transport(&parse("wss://example.com/connect").unwrap()).is_ok());
        assert!(parse("ftp://x").is_err());
        assert!(parse("wss://u:p@x").is_err());
        assert!(parse("wss://x:99999").is_err());
        assert!(parse("wss:///p").is_err());
        assert!(parse("nope").is_err());
        assert_eq!(
            with_query(
                &parse("http://127.0.0.1/l").unwrap(),
                &[("a", "x y".into())]
            )
            .as_str(),
            "http://127.0.0.1/l?a=x+y"
        );
    }

    /// One rule for configured URLs and endpoints alike.
    #[test]
    fn the_loopback_rule() {
        for ok in [
            "https://api.dingtalk.com",
            "http://127.0.0.1:9/",
            "http://127.0.0.2:9/",
            "http://localhost/x",
            "http://LOCALHOST/x",
            "http://[::1]:8080/x",
        ] {
            assert!(check_http_url(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("http://example.com", "only for loopback hosts"),
            ("http://128.0.0.1", "only for loopback hosts"),
            ("http://[::2]/", "only for loopback hosts"),
            ("ftp://x", "not an http(s) URL"),
            ("ws://127.0.0.1/", "not an http(s) URL"),
            ("http:///x", "no host"),
        ] {
            let e = check_http_url(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        for (ws, ok) in [
            ("ws://127.0.0.2:9/c", true),
            ("ws://[::1]:9/c", true),
            ("ws://10.0.0.1/c", false),
        ] {
            assert_eq!(check_transport(&parse(ws).unwrap()).is_ok(), ok, "{ws}");
        }
    }
}
