//! Network plumbing of the DingTalk source: a small URL type (enough for the
//! gateway base URL and the WebSocket endpoint the gateway hands out), the
//! TLS client configuration (rustls with the `ring` provider and the webpki
//! root store), and a minimal HTTP/1.1 client for the one JSON `POST` the
//! app stream needs (`connections/open`).
//!
//! The HTTP client sends `Connection: close`, reads the whole response
//! (bounded in size and time) and understands `Content-Length`, chunked
//! transfer encoding and read-to-EOF bodies. Plain `http://` / `ws://` is
//! refused unless the host is a loopback address (tests, the demo).

use std::{fmt, sync::Arc, time::Duration};

use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

/// Largest HTTP response accepted from the gateway.
const MAX_RESPONSE: usize = 1024 * 1024;

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
    pub body: Vec<u8>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// `POST url` with a JSON body; returns the response, or why there is none
/// (a transport-level message without the request body). The whole exchange
/// (connect, TLS, request, response) is bounded by `timeout`.
pub async fn post_json(
    url: &Url,
    body: &[u8],
    user_agent: &str,
    tls: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<Response, String> {
    match tokio::time::timeout(timeout, post_json_inner(url, body, user_agent, tls)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no response within {}s", timeout.as_secs_f64())),
    }
}

async fn post_json_inner(
    url: &Url,
    body: &[u8],
    user_agent: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Response, String> {
    url.check_transport()?;
    let addr = (url.host.as_str(), url.port_or_default());
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", url.authority()))?;
    let _ = tcp.set_nodelay(true);
    let mut stream: Box<dyn Io> = if url.is_tls() {
        let mut cfg = (**tls).clone();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(url.host.clone())
            .map_err(|e| format!("invalid TLS server name: {e}"))?;
        let s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with {} failed: {e}", url.authority()))?;
        Box::new(s)
    } else {
        Box::new(tcp)
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\n\
         User-Agent: {user_agent}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.path_and_query(),
        url.authority(),
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    stream
        .write_all(&req)
        .await
        .map_err(|e| format!("sending the request failed: {e}"))?;
    stream
        .flush()
        .await
        .map_err(|e| format!("sending the request failed: {e}"))?;
    read_response(&mut stream).await
}

async fn read_response<R: AsyncRead + Unpin + ?Sized>(r: &mut R) -> Result<Response, String> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    let mut eof = false;
    loop {
        if let Some(resp) = try_parse(&buf, eof)? {
            return Ok(resp);
        }
        if eof {
            return Err(if buf.is_empty() {
                "connection closed without a response".into()
            } else {
                "connection closed in the middle of the response".into()
            });
        }
        if buf.len() > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
        }
        match r.read(&mut chunk).await {
            Ok(0) => eof = true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A TLS peer that closes without close_notify after a complete
            // read-to-EOF body: treat as EOF, the parser decides.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => eof = true,
            Err(e) => return Err(format!("reading the response failed: {e}")),
        }
    }
}

/// Parses a response once it is complete; `Ok(None)` means "need more bytes".
fn try_parse(buf: &[u8], eof: bool) -> Result<Option<Response>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed HTTP response: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    if (100..200).contains(&status) {
        // An interim response (100 Continue): skip it.
        return try_parse(&buf[head_len..], eof);
    }
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let rest = &buf[head_len..];
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return Ok(decode_chunked(rest)?.map(|body| Response { status, body }));
    }
    if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("invalid Content-Length {len:?}"))?;
        if len > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
        }
        if rest.len() >= len {
            return Ok(Some(Response {
                status,
                body: rest[..len].to_vec(),
            }));
        }
        return Ok(None);
    }
    if status == 204 || status == 304 {
        return Ok(Some(Response {
            status,
            body: vec![],
        }));
    }
    // No framing: the body runs to EOF.
    Ok(eof.then(|| Response {
        status,
        body: rest.to_vec(),
    }))
}

/// Decodes a complete chunked body, or `Ok(None)` if more bytes are needed.
fn decode_chunked(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| "malformed chunk size")?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("malformed chunk size {size_hex:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            // Trailers are ignored; the body is complete once the size-0
            // chunk is here (we do not reuse the connection).
            return Ok(Some(body));
        }
        if body.len() + size > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
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

    #[test]
    fn responses() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let r = try_parse(full, false).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        assert!(try_parse(&full[..full.len() - 1], false).unwrap().is_none());

        let chunked = b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let r = try_parse(chunked, false).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice()), (401, &b"abcde"[..]));
        assert!(try_parse(&chunked[..60], false).unwrap().is_none());

        let eof = b"HTTP/1.0 500 Oops\r\n\r\nbody";
        assert!(try_parse(eof, false).unwrap().is_none());
        assert_eq!(try_parse(eof, true).unwrap().unwrap().body, b"body");

        let cont = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(try_parse(cont, false).unwrap().unwrap().status, 200);
        assert!(try_parse(b"garbage\r\n\r\n", false).is_err());
    }
}
