//! Network plumbing of the DingTalk stream sources: a small URL type (enough
//! for the configured base URLs and the WebSocket endpoint a ticket comes
//! with, whose query carries the ticket and must be redacted), the TLS
//! client configuration (rustls with the `ring` provider and the webpki
//! root store, shared by the HTTP client and the WebSocket dial), and the
//! HTTP client of the JSON calls (`reqwest`, bounded in size and time).
//! Plain `http://` / `ws://` is refused unless the host is a loopback
//! address (tests, the demo).

use std::{fmt, sync::Arc, time::Duration};

/// Largest HTTP response body accepted from the upstream.
pub const MAX_RESPONSE: usize = 1024 * 1024;

/// A parsed absolute URL: `scheme://host[:port][/path][?query]`. Fragments
/// are dropped; user info is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub scheme: String,
    /// Host as written, IPv6 literals without brackets.
    pub host: String,
    pub port: Option<u16>,
    /// Always starts with `/` (an empty path becomes `/`).
    pub path: String,
    /// Without the leading `?`; empty when there is none.
    pub query: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Url, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or("not an absolute URL (no scheme://)")?;
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
            return Err(format!("unsupported scheme {scheme:?}"));
        }
        let rest = rest.split('#').next().unwrap_or("");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if authority.contains('@') {
            return Err("user info in URLs is not supported".into());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("unterminated IPv6 literal")?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or("garbage after IPv6 literal")?),
            };
            (h.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (authority.to_owned(), None),
            }
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        if !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
        {
            return Err("invalid host".into());
        }
        let port = match port {
            None => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| format!("invalid port {p:?}"))?,
            ),
        };
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        let path = if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        };
        if path.bytes().any(|b| b <= b' ' || b == 0x7f)
            || query.bytes().any(|b| b <= b' ' || b == 0x7f)
        {
            return Err("whitespace or control characters in URL".into());
        }
        Ok(Url {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            path,
            query: query.to_owned(),
        })
    }

    pub fn is_tls(&self) -> bool {
        matches!(self.scheme.as_str(), "https" | "wss")
    }

    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(if self.is_tls() { 443 } else { 80 })
    }

    /// `127.0.0.0/8`, `::1` or `localhost`.
    pub fn is_loopback(&self) -> bool {
        if self.host == "localhost" {
            return true;
        }
        match self.host.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.is_loopback(),
            Err(_) => false,
        }
    }

    /// Plain (unencrypted) schemes are allowed only to loopback hosts.
    pub fn check_transport(&self) -> Result<(), String> {
        if self.is_tls() || self.is_loopback() {
            Ok(())
        } else {
            Err(format!(
                "plain {} to {} refused: only loopback hosts may be reached without TLS",
                self.scheme, self.host
            ))
        }
    }

    /// `host[:port]` as it goes in a `Host` header / URL authority.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }

    /// Path plus query, as in an HTTP request line.
    pub fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }

    /// The same URL with query parameter `name` set to `value`
    /// (percent-encoded): an existing `name` parameter is replaced, every
    /// other parameter is kept as it was, in order.
    pub fn with_query_param(&self, name: &str, value: &str) -> Url {
        let mut parts: Vec<String> = self
            .query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| p.split('=').next() != Some(name))
            .map(str::to_owned)
            .collect();
        parts.push(format!(
            "{}={}",
            percent_encode(name),
            percent_encode(value)
        ));
        Url {
            query: parts.join("&"),
            ..self.clone()
        }
    }

    /// The URL without its query: safe to log (the query carries the ticket).
    pub fn redacted(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority(), self.path)
    }
}

impl fmt::Display for Url {
    /// The full URL, query included. Never log this for a WebSocket endpoint
    /// with a ticket; use [`Url::redacted`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            self.authority(),
            self.path_and_query()
        )
    }
}

/// RFC 3986 unreserved characters pass; everything else is `%XX`.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// ------------------------------------------------------------------ TLS

/// The client TLS configuration: rustls with the `ring` provider, TLS 1.2
/// and 1.3, the webpki (Mozilla) root store, no client certificate.
pub fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
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
) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .use_preconfigured_tls((**tls).clone())
        .user_agent(user_agent)
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|e| format!("HTTP client setup failed: {}", describe(&e)))
}

/// Sends `req` (built for `url`) and reads the whole response, at most
/// [`MAX_RESPONSE`] bytes. Plain `http://` is refused unless `url` is a
/// loopback host. The error is a transport-level message without the URL's
/// query or the request body.
pub async fn send(url: &Url, req: reqwest::RequestBuilder) -> Result<Response, String> {
    url.check_transport()?;
    let mut resp = req.send().await.map_err(|e| describe(&e))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading the response failed: {}", describe(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
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
        let u = Url::parse("wss://wss-open-connection.dingtalk.com:443/connect").unwrap();
        assert_eq!(u.host, "wss-open-connection.dingtalk.com");
        assert_eq!(u.port, Some(443));
        assert_eq!(u.path, "/connect");
        let t = u.with_query_param("ticket", "a b+c");
        assert_eq!(
            t.to_string(),
            "wss://wss-open-connection.dingtalk.com:443/connect?ticket=a%20b%2Bc"
        );
        assert_eq!(
            t.redacted(),
            "wss://wss-open-connection.dingtalk.com:443/connect"
        );

        let u = Url::parse("ws://127.0.0.1:9/gw/x?region=cn&ticket=old&b=2#frag").unwrap();
        let t = u.with_query_param("ticket", "T-1");
        assert_eq!(
            t.to_string(),
            "ws://127.0.0.1:9/gw/x?region=cn&b=2&ticket=T-1"
        );
        assert!(u.is_loopback());
        assert!(u.check_transport().is_ok());

        let u = Url::parse("ws://[::1]:8080").unwrap();
        assert_eq!(
            (u.host.as_str(), u.path.as_str(), u.authority()),
            ("::1", "/", "[::1]:8080".into())
        );
        assert!(u.is_loopback());

        assert!(Url::parse("ws://example.com/connect")
            .unwrap()
            .check_transport()
            .is_err());
        assert!(Url::parse("wss://example.com/connect")
            .unwrap()
            .check_transport()
            .is_ok());
        assert!(Url::parse("ftp://x").is_err());
        assert!(Url::parse("wss://u:p@x").is_err());
        assert!(Url::parse("wss://x:99999").is_err());
        assert!(Url::parse("wss:///p").is_err());
        assert!(Url::parse("nope").is_err());
    }
}
