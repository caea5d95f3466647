//! The `database` check of `busd --doctor` for a `store = "postgres"`
//! profile: what a start would try, in its order, read-only — the URL, a
//! connection (TCP, TLS as `sslmode` says, authentication, the session's
//! `synchronous_commit`), the schema version (newer than this busd: refused;
//! older or absent: the start migrates it, so the role must be allowed to
//! create tables), and the cluster's lease row (visible and writable by the
//! role). The first step that fails is named, with what to do; the whole
//! check is bounded ([`BOUND`]). Nothing is written: no migration, no row.

use std::time::Duration;

use super::{Check, Status};
use crate::pg::{self, schema::SCHEMA_VERSION, Client, PgError, PgSettings, Type};

/// The bound of each query step (a connect has its own, `STARTUP_TIMEOUT`).
const STEP_BOUND: Duration = Duration::from_secs(5);
/// The bound of the whole check.
pub const BOUND: Duration = Duration::from_secs(30);

/// A failed step: which, why, and what to do.
struct Failed {
    step: &'static str,
    why: String,
    hint: String,
}

fn failed(step: &'static str, why: impl Into<String>, hint: impl Into<String>) -> Failed {
    Failed {
        step,
        why: why.into(),
        hint: hint.into(),
    }
}

/// Runs the check on a runtime of its own, within [`BOUND`].
pub fn check(profile: &str, settings: &PgSettings) -> Check {
    let target = pg::config(settings, "doctor").map(|c| pg::target(&c));
    let shown = target.clone().unwrap_or_else(|_| "PostgreSQL".into());
    let result = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async {
            tokio::time::timeout(BOUND, steps(settings))
                .await
                .unwrap_or_else(|_| {
                    Err(failed(
                        "answer",
                        format!("no answer within {}s", BOUND.as_secs()),
                        "is the server overloaded, or a lock held? see its log",
                    ))
                })
        }),
        Err(e) => Err(failed("start", format!("cannot start a runtime: {e}"), "")),
    };
    let (status, message, hint) = match result {
        Ok(found) => (
            Status::Ok,
            format!("PostgreSQL at {shown}: {found}"),
            String::new(),
        ),
        Err(f) => {
            // The errors name the server themselves: once is enough.
            let at = format!("PostgreSQL at {shown}: ");
            let why = f.why.strip_prefix(&at).unwrap_or(&f.why);
            let why = why.strip_prefix("PostgreSQL: ").unwrap_or(why);
            (
                Status::Fail,
                format!(
                    "{at}step {} failed: {why}; a start would fail the same way",
                    f.step
                ),
                f.hint,
            )
        }
    };
    Check {
        check: "database",
        profile: profile.to_owned(),
        status,
        message,
        hint,
    }
}

/// The steps, in a start's order; what was found when all passed.
async fn steps(settings: &PgSettings) -> Result<String, Failed> {
    let (config, mode) = pg::config_and_mode(settings, "doctor").map_err(|e| {
        failed(
            "read the URL",
            e.to_string(),
            "fix the URL (postgres_url_file or DWS_POSTGRES_URL): \
             postgres://USER:PASSWORD@HOST:PORT/DATABASE[?sslmode=verify-full]",
        )
    })?;
    let user = config.get_user().unwrap_or("?").to_owned();
    let (client, driver) = pg::connect(settings, "doctor")
        .await
        .map_err(|e| connect_failed(&e))?;
    let found = after_connect(&client, settings, &user).await;
    driver.abort();
    let tls = match mode {
        pg::tls::Mode::Disable => "without TLS".to_owned(),
        m => format!("TLS (sslmode={})", m.as_str()),
    };
    Ok(format!(
        "connected {tls}, authenticated as {user}, {}",
        found?
    ))
}

/// Which step a failed connect failed at, from what it says.
fn connect_failed(e: &PgError) -> Failed {
    let why = e.to_string();
    let says = |w: &str| why.contains(w);
    match e {
        PgError::Auth(_) => failed(
            "authenticate",
            why,
            "check the user and password in the URL (postgres_url_file or DWS_POSTGRES_URL) \
             and the server's pg_hba.conf",
        ),
        _ if says("TLS") || says("certificate") || says("sslmode") => failed(
            "TLS",
            why,
            "make sslmode and postgres_ca_file match the server's certificate \
             (docs/cluster.md, TLS)",
        ),
        _ if says("synchronous_commit") => failed(
            "session",
            why,
            "connect to the server directly, not through a pooler that overrides settings",
        ),
        PgError::Unreachable(_) => failed(
            "connect",
            why,
            "is the server running and listening on that host and port (listen_addresses, \
             pg_hba.conf, a firewall)?",
        ),
        _ => failed(
            "connect",
            why,
            "check the database name in the URL and that the role may connect to it",
        ),
    }
}

/// A query within [`STEP_BOUND`], its failure that of `step`.
async fn query(
    client: &Client,
    step: &'static str,
    sql: &str,
    params: pg::Params<'_>,
) -> Result<Vec<pg::Row>, Failed> {
    match tokio::time::timeout(STEP_BOUND, pg::sql::query(client, sql, params)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(failed(step, e.to_string(), "")),
        Err(_) => Err(failed(
            step,
            format!("no answer within {}s", STEP_BOUND.as_secs()),
            "is a lock held? see pg_stat_activity",
        )),
    }
}

/// The schema and the lease row, read-only.
async fn after_connect(
    client: &Client,
    settings: &PgSettings,
    user: &str,
) -> Result<String, Failed> {
    let grant = |what: &str| {
        format!("as a superuser or the database's owner: GRANT {what} TO {user} (docs/cluster.md)")
    };
    let rows = query(
        client,
        "schema",
        "SELECT to_regclass('dws_schema_version') IS NOT NULL,
                has_schema_privilege(current_schema(), 'CREATE')",
        &[],
    )
    .await?;
    let (exists, may_create): (bool, bool) = rows
        .first()
        .map(|r| (r.get(0), r.get(1)))
        .unwrap_or((false, false));
    let version = if exists {
        let rows = query(
            client,
            "schema",
            "SELECT coalesce(max(version), 0) FROM dws_schema_version",
            &[],
        )
        .await?;
        rows.first().map_or(0, |r| r.get::<_, i32>(0))
    } else {
        0
    };
    let version = u32::try_from(version).unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(failed(
            "schema",
            format!(
                "the database has schema version {version}, newer than this busd's \
                 ({SCHEMA_VERSION}): another host runs a newer busd"
            ),
            "upgrade this host's busd",
        ));
    }
    if version < SCHEMA_VERSION && !may_create {
        return Err(failed(
            "schema",
            format!(
                "the schema is at version {version} and a start migrates it to {SCHEMA_VERSION}, \
                 but {user} may not create tables in its schema"
            ),
            grant("CREATE ON SCHEMA public"),
        ));
    }
    let schema = if version == SCHEMA_VERSION {
        format!("schema version {version}")
    } else {
        format!("schema version {version} (a start migrates it to {SCHEMA_VERSION})")
    };
    if version < 4 {
        // The lease row's columns come with version 4: nothing to read yet.
        return Ok(format!("{schema}; cluster {}", settings.cluster));
    }
    let rows = query(
        client,
        "lease row",
        // One privilege per call: a list is true when any one is held.
        "SELECT has_table_privilege('dws_cluster', 'SELECT')
            AND has_table_privilege('dws_cluster', 'INSERT')
            AND has_table_privilege('dws_cluster', 'UPDATE')",
        &[],
    )
    .await?;
    if !rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
        return Err(failed(
            "lease row",
            format!("{user} may not read and write dws_cluster, where the upstream lease is"),
            grant("SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public"),
        ));
    }
    let rows = query(
        client,
        "lease row",
        "SELECT owner_host, lease_expires_at > clock_timestamp(), epoch
         FROM dws_cluster WHERE cluster = $1",
        &[(&settings.cluster, Type::TEXT)],
    )
    .await?;
    let lease = match rows.first() {
        None => "no lease row yet (the first start creates it)".to_owned(),
        Some(r) => match (r.get::<_, Option<String>>(0), r.get::<_, Option<bool>>(1)) {
            (Some(owner), Some(true)) => {
                format!("lease held by {owner} (epoch {})", r.get::<_, i64>(2))
            }
            _ => "the lease is free (a start takes it)".to_owned(),
        },
    };
    Ok(format!("{schema}; cluster {}: {lease}", settings.cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connect_names_its_step() {
        let step = |e: PgError| connect_failed(&e).step;
        assert_eq!(
            step(PgError::Auth("password authentication failed".into())),
            "authenticate"
        );
        assert_eq!(
            step(PgError::Config(
                "PostgreSQL at h:1/d: the server's certificate does not verify".into()
            )),
            "TLS"
        );
        assert_eq!(
            step(PgError::Unreachable("cannot connect: refused".into())),
            "connect"
        );
        assert_eq!(
            step(PgError::Config(
                "synchronous_commit is off in busd's session".into()
            )),
            "session"
        );
        assert_eq!(
            step(PgError::Config("database \"x\" does not exist".into())),
            "connect"
        );
    }
}
