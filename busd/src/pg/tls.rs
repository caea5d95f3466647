//! TLS to PostgreSQL: the URL's `sslmode` ([`split_sslmode`], [`Mode`]),
//! the CA file of `postgres_ca_file` ([`CaFile`]), the rustls configuration
//! ([`client_config`]) handed to `tokio-postgres` through the
//! `tokio-postgres-rustls` connector ([`connector`]), and what a failed
//! handshake means ([`handshake_failure`]).
//!
//! The rules (docs/cluster.md, "TLS"):
//! - `sslmode=disable`, or no `sslmode` at all: no TLS, as before TLS was
//!   supported. libpq's default `prefer` (and `allow`) is refused: it falls
//!   back to plaintext without saying so, which protects against nobody who
//!   can touch the network path, yet reads as if it did.
//! - `sslmode=require`: encrypted, the certificate not verified (libpq's
//!   meaning, kept so that a URL works as it does with `psql`); the
//!   handshake's signatures are still checked against the certificate.
//! - `sslmode=verify-full`: the certificate must chain to a CA of
//!   `postgres_ca_file` (else to the bundled Mozilla roots) and name the
//!   URL's host.
//! - `verify-ca` is refused: it checks the chain but not the name, so any
//!   certificate of the same CA would do; use `verify-full`.
//! - A CA file with anything but `verify-full` is refused (it would not be
//!   used), and so are the libpq file options in the URL (`sslrootcert`,
//!   `sslcert`, `sslkey`, …): the CA file is a profile key.
//! - Hosts that are all Unix sockets are reached without TLS, as libpq does:
//!   PostgreSQL has no TLS there, and nothing leaves the machine.
//!
//! Every refusal and every handshake failure that is not a broken
//! connection is a configuration error (exit 2); nothing here names the
//! URL or its password.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider},
    pki_types::{pem::PemObject, CertificateDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// What the URL's `sslmode` asks for, as busd understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No TLS (`disable`, or no `sslmode`).
    Disable,
    /// TLS, the certificate not verified (libpq's `require`).
    Require,
    /// TLS, the certificate verified: chain and host name.
    VerifyFull,
}

pub use super::tls_error::TlsSettingError;

impl Mode {
    /// The URL's `sslmode` value (`None`: absent) as a mode, or why it is
    /// refused.
    pub fn parse(value: Option<&str>) -> Result<Mode, TlsSettingError> {
        match value {
            None | Some("disable") => Ok(Mode::Disable),
            Some("require") => Ok(Mode::Require),
            Some("verify-full") => Ok(Mode::VerifyFull),
            Some("verify-ca") => Err(TlsSettingError::VerifyCa),
            Some("prefer") => Err(TlsSettingError::FallsBack("prefer")),
            Some("allow") => Err(TlsSettingError::FallsBack("allow")),
            Some(_) => Err(TlsSettingError::UnknownMode),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Require => "require",
            Mode::VerifyFull => "verify-full",
        }
    }
}

/// Whether a connection of `config` would leave the machine: a TCP host
/// (or `hostaddr`) that is not loopback (`localhost`, `127.0.0.0/8`, `::1`).
pub fn leaves_the_machine(config: &tokio_postgres::Config) -> bool {
    let loopback = |h: &str| {
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    config.get_hostaddrs().iter().any(|ip| !ip.is_loopback())
        || (config.get_hostaddrs().is_empty()
            && config.get_hosts().iter().any(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => !loopback(name),
                tokio_postgres::config::Host::Unix(_) => false,
            }))
}

/// libpq options of the URL that busd does not read: TLS material is not
/// taken from the URL.
const UNSUPPORTED: &[&str] = &[
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requiressl",
];

/// The URL without its `sslmode` option(s), and the last `sslmode` value
/// (libpq's rule: the last one counts), for both URL forms
/// (`postgres://…?sslmode=…` and `key=value`), scanned the way
/// `tokio-postgres` parses them. A string that does not scan is returned
/// unchanged for `tokio-postgres` to refuse. `Err` names a libpq TLS option
/// busd does not take from the URL.
pub fn split_sslmode(url: &str) -> Result<(String, Option<String>), TlsSettingError> {
    let uri = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let scanned = if uri {
        scan_uri(url)
    } else {
        scan_key_values(url)
    };
    let Some(options) = scanned else {
        return Ok((url.to_owned(), None));
    };
    if let Some(k) = options
        .iter()
        .find_map(|o| UNSUPPORTED.iter().find(|k| **k == o.key))
    {
        return Err(TlsSettingError::UrlOption(k));
    }
    let mode = options
        .iter()
        .rfind(|o| o.key == "sslmode")
        .map(|o| o.value.clone());
    if mode.is_none() {
        return Ok((url.to_owned(), None));
    }
    let kept = options.iter().filter(|o| o.key != "sslmode");
    let out = if uri {
        // Everything up to the query, then the other options.
        let head = options.first().map_or(url.len(), |o| o.span.0);
        let rest: Vec<&str> = kept.map(|o| &url[o.span.0..o.span.1]).collect();
        let head = &url[..head];
        if rest.is_empty() {
            head.trim_end_matches('?').to_owned()
        } else {
            format!("{head}{}", rest.join("&"))
        }
    } else {
        let rest: Vec<&str> = kept.map(|o| &url[o.span.0..o.span.1]).collect();
        rest.join(" ")
    };
    Ok((out, mode))
}

/// One option of a URL: its key and value (decoded) and the byte span to
/// cut to remove it.
struct Opt {
    key: String,
    value: String,
    span: (usize, usize),
}

/// The query options of a `postgres://` URL (after the credentials' `@`,
/// after the first `?`), each span an `&`-separated segment.
fn scan_uri(url: &str) -> Option<Vec<Opt>> {
    let after_creds = url.find('@').map_or(0, |i| i + 1);
    let Some(q) = url[after_creds..].find('?').map(|i| after_creds + i + 1) else {
        return Some(vec![]);
    };
    let mut out = vec![];
    let mut start = q;
    while start < url.len() {
        let end = url[start..].find('&').map_or(url.len(), |i| start + i);
        let (k, v) = url[start..end].split_once('=')?;
        let decode = |s: &str| {
            percent_decode(s)
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        };
        out.push(Opt {
            key: decode(k),
            value: decode(v),
            span: (start, end),
        });
        start = end + 1;
    }
    Some(out)
}

/// `%XX` decoding (as `percent_encoding::percent_decode`: a `%` not
/// followed by two hex digits stays).
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(u8::try_from(h * 16 + l).ok()?);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Some(out)
}

/// The options of a libpq `key=value` string: `key = value` pairs split by
/// whitespace, a value plain (backslash escapes) or single-quoted.
fn scan_key_values(s: &str) -> Option<Vec<Opt>> {
    let mut it = s.char_indices().peekable();
    let mut out = vec![];
    loop {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = it.peek() else {
            return Some(out);
        };
        let mut key = String::new();
        while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        it.next_if(|(_, c)| *c == '=')?;
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = it.next_if(|(_, c)| *c == '\'').is_some();
        loop {
            match it.peek().copied() {
                None if quoted => return None,
                None => break,
                Some((_, '\'')) if quoted => {
                    it.next();
                    break;
                }
                Some((_, c)) if !quoted && c.is_whitespace() => break,
                Some((_, '\\')) => {
                    it.next();
                    if let Some((_, c)) = it.next() {
                        value.push(c);
                    }
                }
                Some((_, c)) => {
                    it.next();
                    value.push(c);
                }
            }
        }
        if value.is_empty() && !quoted {
            return None;
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        out.push(Opt {
            key,
            value,
            span: (start, end),
        });
    }
}

/// The CA certificates of `postgres_ca_file` (PEM), read once at start.
#[derive(Clone)]
pub struct CaFile {
    path: PathBuf,
    roots: Arc<RootCertStore>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFile({})", self.path.display())
    }
}

impl CaFile {
    /// Reads every certificate of the PEM file at `path`; refuses a file
    /// without one, or with one rustls cannot use as a trust anchor.
    pub fn load(path: &Path) -> Result<CaFile, TlsSettingError> {
        let shown = || path.display().to_string();
        // A FIFO there is refused at once, never waited on.
        let pem = crate::regular::read(path, crate::regular::Follow::Yes)
            .map(|(bytes, _)| bytes)
            .map_err(|e| TlsSettingError::Unreadable {
                path: shown(),
                cause: e.to_string(),
            })?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| TlsSettingError::NotPem {
                path: shown(),
                cause: e.to_string(),
            })?;
            roots.add(cert).map_err(|e| TlsSettingError::NotACa {
                path: shown(),
                cause: e.to_string(),
            })?;
        }
        if roots.is_empty() {
            return Err(TlsSettingError::NoCertificate { path: shown() });
        }
        Ok(CaFile {
            path: path.to_owned(),
            roots: Arc::new(roots),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The rustls client configuration for `mode` (not [`Mode::Disable`]): the
/// `ring` provider, TLS 1.2 and 1.3, no client certificate.
pub fn client_config(mode: Mode, ca: Option<&CaFile>) -> Result<ClientConfig, TlsSettingError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSettingError::Setup(e.to_string()))?;
    let config = match (mode, ca) {
        (Mode::VerifyFull, Some(ca)) => builder.with_root_certificates(ca.roots.clone()),
        (Mode::VerifyFull, None) => {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            builder.with_root_certificates(roots)
        }
        (Mode::Require | Mode::Disable, _) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider))),
    };
    Ok(config.with_no_client_auth())
}

/// `sslmode=require`: any certificate is accepted (libpq's meaning); the
/// handshake's signatures must still be made by its key.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `tokio-postgres`'s TLS hook over `config`: one handshake per host,
/// named by the URL's host (an IP address is checked as one; a host that
/// is no TLS server name fails at its handshake). The session offers SCRAM
/// the `tls-server-end-point` channel binding, so `channel_binding=require`
/// in the URL works.
pub fn connector(config: ClientConfig) -> tokio_postgres_rustls::MakeRustlsConnect {
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

/// What a failed TLS handshake with `target` (`host:port/db`) means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A configuration that cannot work: exit 2.
    Config(String),
    /// The connection broke during the handshake: exit 1, retried.
    Broken(String),
}

/// Classifies `e`, a `tokio-postgres` error of kind TLS, under `mode`
/// with `ca` (for messages).
pub fn handshake_failure(
    e: &tokio_postgres::Error,
    target: &str,
    mode: Mode,
    ca: Option<&CaFile>,
) -> Failure {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let rustls_error = c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(r) = rustls_error {
            return Failure::Config(rustls_failure(r, target, mode, ca));
        }
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::InvalidInput {
                return Failure::Config(format!(
                    "PostgreSQL at {target}: sslmode={}: {io}",
                    mode.as_str()
                ));
            }
            return Failure::Broken(format!(
                "PostgreSQL at {target}: the connection broke during the TLS handshake: {io}"
            ));
        }
        let text = c.to_string();
        if text.contains("does not support TLS") {
            return Failure::Config(format!(
                "PostgreSQL at {target}: sslmode={} but the server does not offer TLS (its ssl \
                 setting is off); turn TLS on in the server, or use sslmode=disable on a private \
                 network",
                mode.as_str()
            ));
        }
        cause = c.source();
    }
    Failure::Config(format!(
        "PostgreSQL at {target}: the TLS handshake failed (sslmode={}): {e}",
        mode.as_str()
    ))
}

fn rustls_failure(r: &rustls::Error, target: &str, mode: Mode, ca: Option<&CaFile>) -> String {
    use rustls::CertificateError as C;
    let roots = ca.map_or_else(
        || "the bundled public CAs (set postgres_ca_file for a private CA)".to_owned(),
        |ca| format!("the CA file {}", ca.path().display()),
    );
    match r {
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!(
                "PostgreSQL at {target}: the server's certificate is not valid for this host name \
                 (sslmode=verify-full checks it): {r}; connect by a name the certificate lists"
            )
        }
        rustls::Error::InvalidCertificate(_) => format!(
            "PostgreSQL at {target}: the server's certificate does not verify against {roots}: {r}"
        ),
        _ => format!(
            "PostgreSQL at {target}: the TLS handshake failed (sslmode={}): {r}",
            mode.as_str()
        ),
    }
}
