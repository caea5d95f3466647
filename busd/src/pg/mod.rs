//! The one door to PostgreSQL, for the cluster store (`crate::store::postgres`)
//! and the cluster's coordination (`crate::cluster`, `crate::doctor`):
//! the profile keys ([`settings`]), [`PgSettings`] and [`PgError`],
//! connecting ([`connect`], [`listen`]) with TLS as the URL's `sslmode` says
//! ([`tls`]), the bound on every statement ([`bounded`]) and the schema
//! and its migrations ([`schema`]), the epoch fence of an owner's writes
//! ([`fence`]) and the subscriptions' definitions ([`definitions`]).
//!
//! Every session starts with `synchronous_commit=on` and is refused when
//! `SHOW synchronous_commit` says `off` anyway ([`lossy_commit`]): a
//! commit answered before its WAL is written could vanish in a server crash
//! after the bus acknowledged its events (and their seqs be reused).
//!
//! Connections ([`connect`]) are made with `tokio-postgres`, with TLS
//! (rustls) as the URL's `sslmode` says: `disable` (the default), `require`
//! or `verify-full`, with the CA file of `postgres_ca_file` ([`tls`] has
//! the rules). Each sets TCP keepalives on both ends (the server's
//! `tcp_keepalives_*` and `tcp_user_timeout` as startup options, so a host
//! that vanished without a FIN loses its session, and with it the lease,
//! within about [`LOSS_BOUND`]; a session left idle inside a transaction by
//! a host frozen mid-transaction is ended after
//! [`IDLE_IN_TRANSACTION_BOUND`], so its row lock cannot hold up a takeover
//! for longer), a connect bound, and an `application_name`
//! of `busd/<cluster>/<host>/<purpose>` that `pg_stat_activity` shows.
//!
//! The URL is a secret: [`PgSettings`]'s `Debug` shows it with the password
//! redacted, and no [`PgError`] contains the URL or the password — only
//! `host:port/db` and the server's message.

mod bound;
mod error;
pub use bound::{
    bounded, bounded_by, execute, no_answer, query, query_one, query_opt, sql, Params,
    MIGRATION_BOUND, OUTAGE_BOUND, STATEMENT_BOUND,
};
pub use error::{PgError, Refusal, Refused};
/// The driver's types this layer hands out: a session, its rows, a
/// transaction, what both can run statements on, a parameter's type.
/// Statements go through this layer's calls ([`query`], [`sql`], …).
pub use tokio_postgres::{types::Type, Client, GenericClient, Row, Transaction};
pub mod definitions;
pub mod fence;
pub mod log;
pub mod schema;
pub mod settings;
#[cfg(test)]
mod tests_tls;
pub mod tls;
mod tls_error;

use std::{fmt, future::poll_fn, time::Duration};

use tokio::{sync::mpsc, task::JoinHandle};
use tokio_postgres::{
    config::{Host, SslMode},
    tls::MakeTlsConnect,
    AsyncMessage, Config, Connection, NoTls, Socket,
};

use crate::section::Secret;

/// The TCP connect bound of one attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The bound of a whole connect: TCP, startup and authentication.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a silent network loss may go unnoticed by either end: keepalive
/// idle + interval × count, and the TCP user timeout for unacked data.
pub const LOSS_BOUND: Duration = Duration::from_secs(9);
/// How long a session may sit idle inside a transaction before the server
/// ends it. A frozen host (`SIGSTOP`, a paused VM) keeps answering
/// keepalives from its kernel, so only this frees the cluster row's lock it
/// holds between two statements of an append or an inbox take — the lock
/// the next owner's epoch bump waits for. Half of [`LOSS_BOUND`]: the
/// frozen owner's second such session, queued behind the first, gets the
/// lock when the first is ended and is ended in turn, so a takeover waits
/// about [`LOSS_BOUND`] at most. Far above the gap between two statements
/// of a healthy host (a round trip).
pub const IDLE_IN_TRANSACTION_BOUND: Duration = Duration::from_millis(4_500);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(3);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_COUNT: u32 = 3;

/// A seq as PostgreSQL stores it (`bigint`).
pub(crate) fn to_db(seq: u64) -> Result<i64, PgError> {
    i64::try_from(seq).map_err(|_| PgError::Other(format!("seq {seq} does not fit a bigint")))
}

/// A seq as the database gave it back.
pub(crate) fn from_db(seq: i64) -> Result<u64, PgError> {
    u64::try_from(seq)
        .map_err(|_| PgError::Other(format!("the database holds a negative seq ({seq})")))
}

/// Where and as whom a host reaches its cluster.
#[derive(Clone)]
pub struct PgSettings {
    /// `postgres://user:password@host:port/db` (or libpq `key=value`).
    pub url: Secret,
    /// The cluster this host belongs to (default: the profile name).
    pub cluster: String,
    /// This host's name in the cluster.
    pub host: String,
    /// The CA certificates `sslmode=verify-full` trusts (`postgres_ca_file`);
    /// `None`: the bundled public CAs.
    pub ca: Option<tls::CaFile>,
    /// How long the upstream lease lasts without a renewal, on the
    /// database's clock (`cluster_lease`, `DWS_CLUSTER_LEASE`; see [`lease`]).
    pub lease: Duration,
}

#[cfg(test)]
impl PgSettings {
    /// Settings for a test: cluster `c1`, a 10 s lease, no CA file.
    pub(crate) fn for_test(url: &str, host: &str) -> PgSettings {
        PgSettings {
            url: Secret::new(url),
            cluster: "c1".into(),
            host: host.into(),
            ca: None,
            lease: Duration::from_secs(10),
        }
    }
}

impl fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSettings")
            .field("url", &redacted_url(self.url.expose()))
            .field("cluster", &self.cluster)
            .field("host", &self.host)
            .field("ca", &self.ca)
            .field("lease", &self.lease)
            .finish()
    }
}

/// What a connection-string parse error may say without echoing the input:
/// the option name of a bad value, the byte offset of a bad character; an
/// unknown option is not named (it could be a misplaced password).
fn parse_reason(e: &tokio_postgres::Error) -> String {
    let cause = std::error::Error::source(e)
        .map(|c| c.to_string())
        .unwrap_or_default();
    if cause.starts_with("invalid value for option `") {
        return cause;
    }
    if cause.starts_with("unknown option") {
        return "it names an unknown option".into();
    }
    if let Some((head, _)) = cause.split_once(':') {
        if head.starts_with("unexpected character at byte") {
            return head.to_owned();
        }
    }
    match cause.as_str() {
        "unexpected EOF"
        | "unterminated parameter"
        | "unterminated quoted connection parameter value" => cause,
        c if c.starts_with("invalid utf-8") => "it is not valid UTF-8 once decoded".into(),
        _ => "it is malformed".into(),
    }
}

/// `host:port/db` of a parsed URL, for messages (no user, no password).
pub fn target(config: &Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}:{port}", dir.display()),
            }
        })
        .collect();
    let db = config.get_dbname().or(config.get_user()).unwrap_or("?");
    format!("{}/{db}", hosts.join(","))
}

/// The URL as it may be shown: `postgres://user:<redacted>@host:port/db`,
/// rebuilt from the parsed fields (so a password in a query parameter or a
/// `key=value` string is not shown either).
pub fn redacted_url(url: &str) -> String {
    match url.parse::<Config>() {
        Ok(config) => {
            let user = config.get_user().unwrap_or("");
            let password = if config.get_password().is_some() {
                ":<redacted>"
            } else {
                ""
            };
            let at = if user.is_empty() && password.is_empty() {
                ""
            } else {
                "@"
            };
            format!("postgres://{user}{password}{at}{}", target(&config))
        }
        Err(_) => "<not a valid PostgreSQL URL; not shown>".into(),
    }
}

/// Parses and checks the URL, then applies what busd insists on: keepalives
/// on both ends, the connect bound, the application name.
pub fn config(settings: &PgSettings, purpose: &str) -> Result<Config, PgError> {
    config_and_mode(settings, purpose).map(|(config, _)| config)
}

/// [`config`] and the TLS mode of its connections: the URL's `sslmode`,
/// checked against the CA file (see [`tls`]).
pub fn config_and_mode(
    settings: &PgSettings,
    purpose: &str,
) -> Result<(Config, tls::Mode), PgError> {
    let (url, sslmode) =
        tls::split_sslmode(settings.url.expose()).map_err(|e| PgError::Config(e.to_string()))?;
    let mut config = url.parse::<Config>().map_err(|e| {
        PgError::Config(format!(
            "the PostgreSQL URL is not valid ({}); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            parse_reason(&e)
        ))
    })?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(PgError::Config(
            "the PostgreSQL URL names no host; expected postgres://USER:PASSWORD@HOST:PORT/DATABASE"
                .into(),
        ));
    }
    if sslmode.is_none() && config.get_ssl_mode() != SslMode::Prefer {
        // The scan missed an sslmode tokio-postgres read: never guess.
        return Err(PgError::Config(format!(
            "PostgreSQL URL for {}: its sslmode could not be read; write it as \
             postgres://…?sslmode=MODE",
            target(&config)
        )));
    }
    let mode = tls::Mode::parse(sslmode.as_deref())
        .map_err(|why| PgError::Config(format!("PostgreSQL URL for {}: {why}", target(&config))))?;
    if let (Some(ca), true) = (&settings.ca, mode != tls::Mode::VerifyFull) {
        return Err(PgError::Config(format!(
            "PostgreSQL URL for {}: a CA file is set ({}), but sslmode={} does not verify the \
             server's certificate; add sslmode=verify-full to the URL",
            target(&config),
            ca.path().display(),
            mode.as_str()
        )));
    }
    // Unix sockets have no TLS in PostgreSQL (libpq ignores sslmode there).
    let all_unix = !config.get_hosts().is_empty()
        && config.get_hostaddrs().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, Host::Unix(_)));
    let mode = if all_unix { tls::Mode::Disable } else { mode };
    config.ssl_mode(match mode {
        tls::Mode::Disable => SslMode::Disable,
        tls::Mode::Require | tls::Mode::VerifyFull => SslMode::Require,
    });
    let server_side = format!(
        "-c tcp_keepalives_idle={} -c tcp_keepalives_interval={} -c tcp_keepalives_count={} -c tcp_user_timeout={} \
         -c idle_in_transaction_session_timeout={} -c synchronous_commit=on",
        KEEPALIVE_IDLE.as_secs(),
        KEEPALIVE_INTERVAL.as_secs(),
        KEEPALIVE_COUNT,
        LOSS_BOUND.as_millis(),
        IDLE_IN_TRANSACTION_BOUND.as_millis()
    );
    let options = match config.get_options() {
        Some(o) if !o.trim().is_empty() => format!("{o} {server_side}"),
        _ => server_side,
    };
    config
        .options(options)
        .application_name(format!(
            "busd/{}/{}/{purpose}",
            settings.cluster, settings.host
        ))
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_COUNT)
        .tcp_user_timeout(LOSS_BOUND);
    Ok((config, mode))
}

/// The task that drives one connection: it ends with `Ok` when the client
/// side was dropped, with the classified error when the session broke.
pub type Driver = JoinHandle<Result<(), PgError>>;

/// Opens one session for `purpose` (`lease`, `store`, …: the last part of
/// its `application_name`). The returned [`Driver`] must keep running for
/// the client to work; it logs server notices.
pub async fn connect(settings: &PgSettings, purpose: &str) -> Result<(Client, Driver), PgError> {
    open(settings, purpose, None).await
}

/// How many notifications a [`listen`]er queues before it drops new ones.
pub const NOTIFY_QUEUE: usize = 1024;

/// A session that `LISTEN`s on `channels` (lower-case SQL identifiers, such
/// as [`log::LOG_CHANNEL`]): its driver forwards each notification's payload
/// to the receiver, dropping it when the queue is full (listeners also poll,
/// so a dropped wake-up only delays them). Payloads do not say their
/// channel: the log's is `cluster:head`, the inbox's just the cluster (a
/// cluster name has no `:`). The receiver ends when the session does.
pub async fn listen(
    settings: &PgSettings,
    purpose: &str,
    channels: &[&str],
) -> Result<(Client, Driver, mpsc::Receiver<String>), PgError> {
    let mut sql = String::new();
    for c in channels {
        let plain = !c.is_empty()
            && c.len() <= 63
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !plain {
            return Err(PgError::Other(format!(
                "cannot LISTEN on {c:?}: use a lower-case identifier"
            )));
        }
        sql.push_str(&format!("LISTEN {c};"));
    }
    let (tx, rx) = mpsc::channel(NOTIFY_QUEUE);
    let (client, driver) = open(settings, purpose, Some(tx)).await?;
    let listening = bounded("LISTEN", async {
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| PgError::query(&e))
    })
    .await;
    if let Err(e) = listening {
        driver.abort();
        return Err(e);
    }
    Ok((client, driver, rx))
}

async fn open(
    settings: &PgSettings,
    purpose: &str,
    notify: Option<mpsc::Sender<String>>,
) -> Result<(Client, Driver), PgError> {
    let (config, mode) = config_and_mode(settings, purpose)?;
    let target = target(&config);
    // process-wide: the transport is logged once per process, not per session.
    static NOTED: std::sync::Once = std::sync::Once::new();
    NOTED.call_once(|| note_transport(&config, mode, settings.ca.as_ref(), &target));
    let (client, driver) = match mode {
        tls::Mode::Disable => {
            let (client, connection) = start(&config, NoTls, &target, mode, None).await?;
            (client, drive(connection, target.clone(), notify))
        }
        tls::Mode::Require | tls::Mode::VerifyFull => {
            let ca = settings.ca.as_ref();
            let rustls = tls::client_config(mode, ca).map_err(|e| PgError::Other(e.to_string()))?;
            let make = tls::connector(rustls);
            let (client, connection) = start(&config, make, &target, mode, ca).await?;
            (client, drive(connection, target.clone(), notify))
        }
    };
    if let Err(e) = bounded(
        "SHOW synchronous_commit",
        check_synchronous_commit(&client, &target),
    )
    .await
    {
        driver.abort();
        return Err(e);
    }
    Ok((client, driver))
}

/// Says once in `bus.log` how this busd reaches PostgreSQL; a warning when
/// an unencrypted connection leaves the machine.
fn note_transport(config: &Config, mode: tls::Mode, ca: Option<&tls::CaFile>, target: &str) {
    match (mode, ca) {
        (tls::Mode::Disable, _) if tls::leaves_the_machine(config) => tracing::warn!(
            target: "busd::postgres",
            "PostgreSQL at {target}: the connection is not encrypted (no sslmode, or \
             sslmode=disable): the network path sees events and queries; outside a private \
             network use sslmode=verify-full"
        ),
        (tls::Mode::Disable, _) => {
            tracing::info!(target: "busd::postgres", "PostgreSQL at {target}: without TLS")
        }
        (_, Some(ca)) => tracing::info!(
            target: "busd::postgres",
            "PostgreSQL at {target}: TLS, sslmode={}, CA file {}",
            mode.as_str(),
            ca.path().display()
        ),
        (_, None) => tracing::info!(
            target: "busd::postgres",
            "PostgreSQL at {target}: TLS, sslmode={}",
            mode.as_str()
        ),
    }
}

/// Connects within [`STARTUP_TIMEOUT`], the failure classified.
async fn start<T>(
    config: &Config,
    tls: T,
    target: &str,
    mode: tls::Mode,
    ca: Option<&tls::CaFile>,
) -> Result<(Client, Connection<Socket, T::Stream>), PgError>
where
    T: MakeTlsConnect<Socket>,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<Socket>>::Future: Send,
{
    tokio::time::timeout(STARTUP_TIMEOUT, config.connect(tls))
        .await
        .map_err(|_| {
            PgError::Unreachable(format!(
                "PostgreSQL at {target}: no answer within {}s",
                STARTUP_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| PgError::connect(&e, target, mode, ca))
}

/// What `SHOW synchronous_commit` must not say: with `off`, a commit is
/// answered before its WAL is written, so a server crash loses events the
/// bus acknowledged (and the owner then reuses their seqs).
pub(crate) fn lossy_commit(setting: &str) -> Option<String> {
    (setting.trim().eq_ignore_ascii_case("off")).then(|| {
        format!(
            "synchronous_commit is {setting} in busd's session although busd asks for on: \
             something between busd and the server (a pooler, a forced setting) overrides it, \
             and an acknowledged event could be lost in a server crash"
        )
    })
}

/// Refuses a session whose commits are not durable when answered (see
/// [`lossy_commit`]): busd sets `synchronous_commit=on` at start-up
/// ([`config`]) and checks that it held.
async fn check_synchronous_commit(client: &Client, target: &str) -> Result<(), PgError> {
    let row = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .map_err(|e| PgError::query(&e))?;
    let setting: String = row.try_get(0).map_err(|e| PgError::query(&e))?;
    match lossy_commit(&setting) {
        Some(why) => Err(PgError::Config(format!("PostgreSQL at {target}: {why}"))),
        None => Ok(()),
    }
}

/// The task that drives `connection`: notices logged, notifications to
/// `notify`.
fn drive<S>(
    mut connection: Connection<Socket, S>,
    target: String,
    notify: Option<mpsc::Sender<String>>,
) -> Driver
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                None => return Ok(()),
                Some(Ok(AsyncMessage::Notice(n))) => {
                    tracing::debug!(target: "busd::postgres", "{target}: {}", n.message());
                }
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(tx) = &notify {
                        // Full: dropped (the listener polls too); closed:
                        // nobody listens any more.
                        let _ = tx.try_send(n.payload().to_owned());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(PgError::query(&e)),
            }
        }
    })
}
