//! [`TlsSettingError`]: why the cluster store's TLS settings are refused
//! (an `sslmode` busd does not do, a CA file it cannot use).

/// Why a TLS setting is refused: an `sslmode` this bus does not do, or a
/// CA file it cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsSettingError {
    #[error(
        "sslmode=verify-ca is not supported: it checks the certificate's CA but not its \
         host name; use sslmode=verify-full (with postgres_ca_file for a private CA)"
    )]
    VerifyCa,
    #[error(
        "sslmode={0} is not supported: it falls back to an unencrypted connection without \
         saying so; use sslmode=verify-full (or require, or disable on a private network)"
    )]
    FallsBack(&'static str),
    #[error("sslmode has an unknown value; use disable, require or verify-full")]
    UnknownMode,
    #[error(
        "the URL sets {0}, which busd does not read: give the CA certificate file as \
         postgres_ca_file (or DWS_POSTGRES_CA_FILE); client certificates are not supported"
    )]
    UrlOption(&'static str),
    #[error("TLS setup failed: {0}")]
    Setup(String),
    #[error("cannot read {path}: {cause}")]
    Unreadable { path: String, cause: String },
    #[error("{path} is not a PEM certificate file: {cause}")]
    NotPem { path: String, cause: String },
    #[error("{path}: a certificate cannot be a CA: {cause}")]
    NotACa { path: String, cause: String },
    #[error("{path} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: String },
}
