//! Why talking to PostgreSQL failed ([`PgError`]), classified for the exit
//! code of a failed start and for retrying: the server's SQLSTATE, a lost
//! connection, a refused connect. A statement the server refused because
//! of the data it met (a constraint, a lost race: [`Refused`]) keeps its
//! kind, for the callers that answer it themselves. Messages never contain
//! the URL or the password.

use std::fmt;

use tokio_postgres::error::SqlState;

use super::tls;
use crate::ready::StartError;

/// Why talking to PostgreSQL failed, classified for the exit code of a
/// failed start. Messages never contain the URL or the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgError {
    /// The URL cannot be used (malformed, no host, unsupported TLS mode, no
    /// such database): exit 2.
    Config(String),
    /// Bad credentials or a missing permission: exit 3.
    Auth(String),
    /// The server cannot be reached, is starting or shutting down, or the
    /// connection broke: exit 1, worth retrying.
    Unreachable(String),
    /// This host lost the upstream lease: another host owns the cluster's
    /// upstream now (see [`fence::check_epoch`]).
    Fenced(String),
    /// The server refused a statement because of the data it met (see
    /// [`Refused`]): exit 1.
    Refused(Refused),
    /// Anything else (including a schema newer than this busd): exit 1.
    Other(String),
}

/// Why the server refused a statement, for the callers that answer it
/// themselves (a lost race retried, a repeated id named, a row that went
/// away meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `unique_violation` (23505).
    Unique,
    /// `foreign_key_violation` (23503).
    ForeignKey,
    /// `serialization_failure` (40001).
    Serialization,
    /// `deadlock_detected` (40P01).
    Deadlock,
}

/// A statement the server refused: the [`Refusal`], the constraint it
/// names, the server's detail (or message) and the whole message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub why: Refusal,
    pub constraint: Option<String>,
    pub detail: String,
    message: String,
}

impl Refusal {
    fn of(code: &SqlState) -> Option<Refusal> {
        [
            (SqlState::UNIQUE_VIOLATION, Refusal::Unique),
            (SqlState::FOREIGN_KEY_VIOLATION, Refusal::ForeignKey),
            (SqlState::T_R_SERIALIZATION_FAILURE, Refusal::Serialization),
            (SqlState::T_R_DEADLOCK_DETECTED, Refusal::Deadlock),
        ]
        .into_iter()
        .find_map(|(c, r)| (c == *code).then_some(r))
    }
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgError::Config(m)
            | PgError::Auth(m)
            | PgError::Unreachable(m)
            | PgError::Fenced(m)
            | PgError::Other(m)
            | PgError::Refused(Refused { message: m, .. }) => f.write_str(m),
        }
    }
}

impl From<PgError> for StartError {
    fn from(e: PgError) -> StartError {
        use crate::ready::FailureKind as K;
        let kind = match e {
            PgError::Config(_) => K::Usage,
            PgError::Auth(_) => K::Permission,
            PgError::Unreachable(_)
            | PgError::Fenced(_)
            | PgError::Refused(_)
            | PgError::Other(_) => K::Runtime,
        };
        StartError {
            kind,
            message: e.to_string(),
        }
    }
}

/// How a SQLSTATE is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Config,
    Auth,
    Unreachable,
    Other,
}

/// Class 28 (authorization) and `insufficient_privilege` are credentials or
/// permissions; a missing database is the URL's fault; class 08
/// (connection), `too_many_connections` and the shutdown/startup states of
/// class 57P are transient.
fn class_of(code: &SqlState) -> Class {
    let c = code.code();
    if c.starts_with("28") || *code == SqlState::INSUFFICIENT_PRIVILEGE {
        Class::Auth
    } else if *code == SqlState::UNDEFINED_DATABASE {
        Class::Config
    } else if c.starts_with("08")
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
    {
        Class::Unreachable
    } else {
        Class::Other
    }
}

fn make(class: Class, message: String) -> PgError {
    match class {
        Class::Config => PgError::Config(message),
        Class::Auth => PgError::Auth(message),
        Class::Unreachable => PgError::Unreachable(message),
        Class::Other => PgError::Other(message),
    }
}

/// The innermost `io::Error` under `e`, if any.
fn io_cause(e: &tokio_postgres::Error) -> Option<&std::io::Error> {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cause = c.source();
    }
    None
}

impl PgError {
    /// Whether the server refused the statement for `why`.
    pub fn refused(&self, why: Refusal) -> bool {
        matches!(self, PgError::Refused(r) if r.why == why)
    }

    /// Whether a failure may pass with an outage: the server or the session
    /// went away, not a refusal (credentials, schema, a fenced epoch, a gap).
    pub fn is_transient(&self) -> bool {
        matches!(self, PgError::Unreachable(_))
    }

    /// A failed query or a broken session. The server's message, never a
    /// value of ours.
    pub fn query(e: &tokio_postgres::Error) -> PgError {
        if let Some(db) = e.as_db_error() {
            let message = format!("PostgreSQL: {} ({})", db.message(), db.code().code());
            if let Some(why) = Refusal::of(db.code()) {
                return PgError::Refused(Refused {
                    why,
                    constraint: db.constraint().map(str::to_owned),
                    detail: db.detail().unwrap_or_else(|| db.message()).to_owned(),
                    message,
                });
            }
            return make(class_of(db.code()), message);
        }
        if e.is_closed() || io_cause(e).is_some() {
            let why = io_cause(e).map_or_else(|| e.to_string(), |io| io.to_string());
            return PgError::Unreachable(format!("PostgreSQL: connection lost: {why}"));
        }
        PgError::Other(format!("PostgreSQL: {e}"))
    }

    /// A failed connect to `target` (`host:port/db`) under TLS `mode`.
    pub(super) fn connect(
        e: &tokio_postgres::Error,
        target: &str,
        mode: tls::Mode,
        ca: Option<&tls::CaFile>,
    ) -> PgError {
        if let Some(db) = e.as_db_error() {
            return make(
                class_of(db.code()),
                format!("PostgreSQL at {target}: {}", db.message()),
            );
        }
        let cause = std::error::Error::source(e).map(|c| c.to_string());
        match (e.to_string().as_str(), cause) {
            ("authentication error", why) => PgError::Auth(format!(
                "PostgreSQL at {target}: authentication failed ({})",
                why.unwrap_or_else(|| "no reason given".into())
            )),
            ("invalid configuration", Some(why)) => {
                PgError::Config(format!("PostgreSQL URL for {target}: {why}"))
            }
            ("error performing TLS handshake", _) => {
                match tls::handshake_failure(e, target, mode, ca) {
                    tls::Failure::Config(m) => PgError::Config(m),
                    tls::Failure::Broken(m) => PgError::Unreachable(m),
                }
            }
            _ if io_cause(e).is_some() || e.is_closed() => {
                let why = io_cause(e).map_or_else(|| e.to_string(), |io| io.to_string());
                PgError::Unreachable(format!("PostgreSQL at {target}: cannot connect: {why}"))
            }
            (top, _) => PgError::Other(format!("PostgreSQL at {target}: {top}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_postgres::error::SqlState;

    use super::{class_of, Class, Refusal};

    #[test]
    fn postgres_sqlstates_are_classified() {
        for (code, class) in [
            (SqlState::INVALID_PASSWORD, Class::Auth),
            (SqlState::INVALID_AUTHORIZATION_SPECIFICATION, Class::Auth),
            (SqlState::INSUFFICIENT_PRIVILEGE, Class::Auth),
            (SqlState::UNDEFINED_DATABASE, Class::Config),
            (SqlState::CONNECTION_FAILURE, Class::Unreachable),
            (SqlState::ADMIN_SHUTDOWN, Class::Unreachable),
            (SqlState::CANNOT_CONNECT_NOW, Class::Unreachable),
            (SqlState::TOO_MANY_CONNECTIONS, Class::Unreachable),
            (SqlState::UNIQUE_VIOLATION, Class::Other),
            (SqlState::T_R_SERIALIZATION_FAILURE, Class::Other),
        ] {
            assert_eq!(class_of(&code), class, "{}", code.code());
        }
    }

    #[test]
    fn refusals_a_caller_answers_keep_their_kind() {
        for (code, why) in [
            (SqlState::UNIQUE_VIOLATION, Some(Refusal::Unique)),
            (SqlState::FOREIGN_KEY_VIOLATION, Some(Refusal::ForeignKey)),
            (
                SqlState::T_R_SERIALIZATION_FAILURE,
                Some(Refusal::Serialization),
            ),
            (SqlState::T_R_DEADLOCK_DETECTED, Some(Refusal::Deadlock)),
            (SqlState::INSUFFICIENT_PRIVILEGE, None),
            (SqlState::ADMIN_SHUTDOWN, None),
        ] {
            assert_eq!(Refusal::of(&code), why, "{}", code.code());
        }
    }
}
