//! `busd`, the dws event bus daemon: one upstream event connection shared
//! with many short-lived local consumers over a Unix socket.
//!
//! Layout:
//! - [`config`]: flags and env knobs.
//! - [`lock`], [`socket`], [`ready`], [`logfile`]: start-up pieces, in the
//!   order [`run`] uses them.
//! - [`server`]: the accept loop; [`connection`]: one client connection.
//! - [`hub`]: all shared state; [`subscription`]: one subscription's
//!   delivery state machine; [`eventlog`]: the bounded in-memory log;
//!   [`pattern`]: what a subscription selects; [`where_filter`]: where its
//!   `--where` runs (a worker process), and [`judge`]: the thread that
//!   hands it the events.
//! - [`store`]: the storage boundary (disk, memory); [`commit`]: the one
//!   thread that writes to it.
//! - [`source`]: upstream sources behind one trait; [`upstream`]: the
//!   upstream-control boundary between the hub and the sources.
//! - [`shutdown`]: the one shutdown signal and its reason; [`clock`]: the
//!   wall clock.
//! - [`notify`]: the systemd readiness protocol of a supervised `--foreground` run
//!   (and its watchdog); [`activation`]: a listening socket passed by systemd.
//! - [`latency`]: the append-latency histogram (lock-free, for status).
//! - [`regular`]: data files (`config.toml`, secrets, the store's files) opened
//!   as regular files only, never blocking on a FIFO.

pub mod activation;
pub mod clock;
pub mod cluster;
pub mod commit;
pub mod config;
pub mod connection;
pub mod doctor;
pub mod eventlog;
pub mod exit;
pub mod hub;
pub mod judge;
pub mod latency;
pub mod lines;
pub mod lock;
pub mod logfile;
pub mod notify;
pub mod pattern;
pub mod pg;
pub mod profile;
pub mod ratelimit;
pub mod ready;
pub mod regular;
pub mod section;
pub mod server;
pub mod shutdown;
pub mod socket;
pub mod source;
pub mod store;
pub mod subscription;
pub mod upstream;
pub mod urls;
pub mod where_filter;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::Path,
    process::ExitCode,
    sync::{atomic::AtomicI64, Arc},
    time::{Duration, Instant},
};

use proto::{paths::Endpoint, v1::ByeReason};
use tokio_util::task::TaskTracker;

use crate::{
    config::Args,
    eventlog::Retention,
    hub::{HubConfig, HubOwner},
    lock::{BusLock, TryLock},
    ready::{ReadyPipe, StartError},
    source::SourceContext,
};

/// How long a starting bus waits for a busy `bus.lock` whose holder does not
/// answer (it is starting or exiting) before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Runs the daemon to completion and maps the outcome to an exit code:
/// 0 after a clean shutdown or when another bus already serves the profile,
/// 1 when start-up failed (the reason is on the ready pipe and stderr).
pub fn run(args: Args, notifier: notify::Notifier) -> ExitCode {
    let mut ready = match ReadyPipe::from_fd(args.ready_fd) {
        Ok(r) => r,
        Err(e) => return exit::Failure::from(e).exit(),
    };
    match start(args, notifier, &mut ready) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("start-up failed: {}", e.message);
            ready.failed(&e);
            exit::Failure::from(e).exit()
        }
    }
}

fn start(args: Args, notifier: notify::Notifier, ready: &mut ReadyPipe) -> Result<(), StartError> {
    let uid = nix::unistd::geteuid().as_raw();
    let env = proto::paths::Env::from_process(uid);
    let endpoint = proto::paths::resolve(args.profile.as_deref(), &env)
        .map_err(|e| StartError::runtime(e.to_string()))?;
    let profile = profile::load_profile(
        &endpoint.config_root,
        &endpoint.profile,
        &profile::EnvOverrides::from_process(),
    )?;
    // Taken before any thread starts; `None` unless systemd passed a socket.
    let activated = activation::inherited(&endpoint.socket_path)
        .map_err(|e| StartError::runtime(e.to_string()))?;
    make_private_dir(&endpoint.work_dir)?;
    init_logging(&endpoint.log_path(), args.foreground, args.log_format)?;

    server::raise_fd_limit();
    // One thread serves every connection: the publisher's task, the fan-out
    // and every consumer's writer run in the same turn, so an event costs
    // no cross-thread wake-up and the hub's lock is never contended by
    // another worker. Blocking work has its own threads (the committer,
    // tokio's blocking pool).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StartError::runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        // Signals first: a SIGTERM during start-up must be a clean stop.
        let (trigger, shutdown) = shutdown::channel();
        watch_signals(&trigger)?;
        let lock = match take_lock(&endpoint, activated.is_some()).await? {
            Ok(lock) => lock,
            Err(pid) => {
                tracing::info!("another bus already serves this profile");
                // Exit 0 (the profile is served), but never silently: a
                // person who ran `busd` sees why it returned at once.
                eprintln!(
                    "busd: a bus already serves profile {} (pid {}, socket {}); nothing to do",
                    endpoint.profile,
                    pid.map_or("?".to_owned(), |p| p.to_string()),
                    endpoint.socket_path.display()
                );
                ready.already_running();
                return Ok(());
            }
        };
        if activated.is_none() && socket_held_by_a_manager(&endpoint).await {
            // systemd listens there for a bus it starts on this connection:
            // leave the socket and the lock to that bus.
            tracing::info!(
                socket = %endpoint.socket_path.display(),
                "the socket is listened on by a service manager (socket activation); \
                 leaving the profile to the bus it starts"
            );
            eprintln!(
                "busd: a service manager listens on {} (socket activation); the bus it starts \
                 serves profile {}; nothing to do",
                endpoint.socket_path.display(),
                endpoint.profile
            );
            drop(lock);
            ready.already_running();
            return Ok(());
        }
        let listening = Listening {
            endpoint,
            activated,
            notifier,
        };
        serve(args, listening, profile, lock, trigger, shutdown, ready).await
    })
}

/// Creates the work dir `<config root>/events/<profile>` (0700) and checks
/// it and `events/` with the same rule as the socket dir
/// ([`socket::prepare_private_dir`]): a real directory, ours, not group or
/// world writable. The config root itself is created if missing, not checked.
fn make_private_dir(work_dir: &Path) -> Result<(), StartError> {
    let events = work_dir.parent().ok_or_else(|| {
        StartError::runtime(format!("work dir {} has no parent", work_dir.display()))
    })?;
    if let Some(root) = events.parent() {
        fs::create_dir_all(root).map_err(|e| {
            StartError::from_io(
                format!("cannot create config root {}: {e}", root.display()),
                &e,
            )
        })?;
    }
    socket::prepare_private_dir(events, "events directory")?;
    socket::prepare_private_dir(work_dir, "work directory")
}

fn init_logging(
    path: &Path,
    foreground: bool,
    format: config::LogFormat,
) -> Result<(), StartError> {
    use tracing_subscriber::{fmt::writer::MakeWriterExt, EnvFilter};
    let file = logfile::RotatingLog::open(path)?;
    let filter = EnvFilter::try_from_env("DWS_BUS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_env_filter(filter);
    // DWS_BUS_LOG_FORMAT=json: one JSON object per line, for log shippers.
    let result = match (format, foreground) {
        (config::LogFormat::Text, true) => {
            builder.with_writer(file.and(std::io::stderr)).try_init()
        }
        (config::LogFormat::Text, false) => builder.with_writer(file).try_init(),
        (config::LogFormat::Json, true) => builder
            .json()
            .with_writer(file.and(std::io::stderr))
            .try_init(),
        (config::LogFormat::Json, false) => builder.json().with_writer(file).try_init(),
    };
    result.map_err(|e| StartError::runtime(format!("cannot set up logging: {e}")))
}

fn watch_signals(trigger: &shutdown::ShutdownTrigger) -> Result<(), StartError> {
    use tokio::signal::unix::{signal, SignalKind};
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let mut s =
            signal(kind).map_err(|e| StartError::runtime(format!("cannot watch signals: {e}")))?;
        let t = trigger.clone();
        tokio::spawn(async move {
            if s.recv().await.is_some() {
                tracing::info!(signal = ?kind, "signal received");
                t.trigger(ByeReason::Shutdown);
            }
        });
    }
    Ok(())
}

/// Takes `bus.lock`, or returns `Err(pid)` (the holder's, as written in the
/// lock) if a live bus already answers on the socket. A busy lock whose holder does not answer is a bus that is starting
/// or exiting: wait for it, up to [`LOCK_WAIT`]. A socket-activated bus
/// (`activated`) holds the socket itself, so an answer there proves nothing:
/// it only waits, then fails (the unit's restart tries again).
async fn take_lock(
    endpoint: &Endpoint,
    activated: bool,
) -> Result<Result<BusLock, Option<u32>>, StartError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match lock::try_lock(&endpoint.lock_path())? {
            TryLock::Acquired(l) => return Ok(Ok(l)),
            TryLock::Busy(pid) => {
                if !activated
                    && tokio::net::UnixStream::connect(&endpoint.socket_path)
                        .await
                        .is_ok()
                {
                    return Ok(Err(pid));
                }
                if Instant::now() >= deadline {
                    return Err(StartError::runtime(format!(
                        "{} is held by pid {} which does not answer on {}",
                        endpoint.lock_path().display(),
                        pid.map_or("?".to_owned(), |p| p.to_string()),
                        endpoint.socket_path.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Whether something listens on the profile's socket while we hold
/// `bus.lock`: no bus can (it would hold the lock), so it is a service
/// manager's socket unit, which [`socket::bind`] must not replace.
async fn socket_held_by_a_manager(endpoint: &Endpoint) -> bool {
    tokio::net::UnixStream::connect(&endpoint.socket_path)
        .await
        .is_ok()
}

/// Writes `bus.meta` atomically: `bus.meta.tmp` is created exclusively with
/// `O_NOFOLLOW` (a stale regular file is removed first; anything else there
/// is refused), then renamed over `bus.meta`.
fn write_meta(endpoint: &Endpoint) -> Result<(), StartError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let now = std::time::SystemTime::now();
    let meta = serde_json::json!({
        "pid": std::process::id(),
        "version": proto::BUILD,
        "protocol_version": proto::PROTOCOL_VERSION,
        "profile": endpoint.profile,
        "started_at": humantime::format_rfc3339_millis(now).to_string(),
        "started_at_unix_ms": clock::now_ms(),
        "socket": endpoint.socket_path,
        "work_dir": endpoint.work_dir,
        "log": endpoint.log_path(),
    });
    let path = endpoint.meta_path();
    let tmp = path.with_extension("meta.tmp");
    // rename replaces whatever is at bus.meta without following it; a planted
    // non-file there is refused all the same, as everywhere in the work dir.
    if let Ok(m) = fs::symlink_metadata(&path) {
        socket::refuse_unless_regular(&path, m.file_type())?;
    }
    socket::remove_stale_file(&tmp)?;
    let mut file = socket::open_private_file(
        &tmp,
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600),
    )?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(format!("{meta:#}\n").as_bytes()))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| StartError::from_io(format!("cannot write {}: {e}", path.display()), &e))
}

/// The disk store's directory.
fn store_dir_of(endpoint: &Endpoint) -> std::path::PathBuf {
    endpoint.work_dir.join("store")
}

/// Refuses to start over a disk store's `subscriptions.json` this build
/// cannot restore as it was saved ([`subscription::check_snapshot`]); the
/// file is left as it is. (The cluster store's snapshot is this host's
/// instance of definitions other hosts created: its cursors may run ahead
/// of this host's head, so it is not held to the same check.)
fn check_recovered(
    config: &store::StoreConfig,
    dir: &Path,
    recovered: &store::Recovered,
) -> Result<(), StartError> {
    let (store::StoreKind::Disk, Some(snap)) = (config.kind, &recovered.snapshot) else {
        return Ok(());
    };
    subscription::check_snapshot(snap).map_err(|e| {
        StartError::runtime(format!(
            "cannot open the store: {}: {e}; this busd ({}) cannot restore it as it was saved, \
             so it refuses to start and leaves the file as it is (run the busd that wrote it, \
             or move the file away to start without the stored subscriptions)",
            dir.join("subscriptions.json").display(),
            proto::BUILD
        ))
    })
}

/// What a start made before it was ready (`bus.meta`, the socket it bound,
/// never one systemd passed): removed when the start fails (dropped before
/// `bus.lock` is released, so only the lock's holder unlinks the socket),
/// kept once it is ready ([`StartedFiles::disarm`]).
struct StartedFiles {
    meta: Option<std::path::PathBuf>,
    socket: Option<std::path::PathBuf>,
}

impl StartedFiles {
    fn disarm(&mut self) {
        self.meta = None;
        self.socket = None;
    }
}

impl Drop for StartedFiles {
    fn drop(&mut self) {
        for path in [self.socket.take(), self.meta.take()].into_iter().flatten() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Where the bus listens: its endpoint, the socket systemd passed, if any,
/// and what it tells its service manager.
struct Listening {
    endpoint: Endpoint,
    activated: Option<std::os::unix::net::UnixListener>,
    notifier: notify::Notifier,
}

async fn serve(
    args: Args,
    listening: Listening,
    profile: profile::Profile,
    lock: BusLock,
    trigger: shutdown::ShutdownTrigger,
    shutdown: shutdown::Shutdown,
    ready: &mut ReadyPipe,
) -> Result<(), StartError> {
    let Listening {
        endpoint,
        activated,
        notifier,
    } = listening;
    write_meta(&endpoint)?;
    // Until the bus is ready, a failed start removes what it made: a socket
    // left behind would answer nobody (the doctor warned of it), and
    // bus.meta would name a bus that never ran.
    let mut unready = StartedFiles {
        meta: Some(endpoint.meta_path()),
        socket: None,
    };
    let owns_socket = activated.is_none();
    let std_listener = match activated {
        Some(l) => {
            tracing::info!(socket = %endpoint.socket_path.display(), "socket passed by systemd");
            l
        }
        None => {
            socket::prepare_dir(&endpoint.socket_dir)?;
            let l = socket::bind(&endpoint.socket_path)?;
            unready.socket = Some(endpoint.socket_path.clone());
            l
        }
    };
    let listener = tokio::net::UnixListener::from_std(std_listener).map_err(|e| {
        StartError::runtime(format!(
            "cannot listen on {}: {e}",
            endpoint.socket_path.display()
        ))
    })?;

    // The store before the socket: a bus that cannot recover its state
    // serves nobody (and says why on the ready pipe). A cluster's database
    // is checked first, so a bad URL, bad credentials or missing rights get
    // their own exit code.
    if let Some(pg) = &profile.store.postgres {
        store::postgres::store::preflight(pg).await?;
    }
    let store_dir = store_dir_of(&endpoint);
    let ids_dir = store_dir.clone();
    // The epoch this host appends to a cluster's log under (0: not the owner).
    let epoch = Arc::new(AtomicI64::new(0));
    let mut store = store::open(
        &profile.store,
        store_dir,
        epoch.clone(),
        args.retention_events,
    );
    let recovered = store
        .recover()
        .map_err(|e| StartError::runtime(format!("cannot open the store: {e}")))?;
    check_recovered(&profile.store, &store_dir_of(&endpoint), &recovered)?;
    // The disk store keeps the dedup window's ids of released segments
    // apart from them (`store::dedup_ids`), so retention alone bounds it.
    let dedup_ids = match profile.store.kind {
        store::StoreKind::Disk => {
            let (loaded, skipped) = store::dedup_ids::load(&ids_dir)
                .map_err(|e| StartError::runtime(format!("cannot open the store: {e}")))?;
            if skipped > 0 {
                tracing::warn!(
                    skipped,
                    "store recovery: {} had lines torn by a crash (their ids are still in \
                     the log) or failing their checksum (an id only there may be accepted \
                     once more); skipped",
                    store::dedup_ids::FILE
                );
            }
            let ids = store::dedup_ids::DedupIds::new(
                ids_dir,
                profile.store.durability == store::Durability::Fsync,
                args.dedup_capacity,
                loaded.clone(),
                &recovered.events,
            );
            Some((ids, loaded))
        }
        _ => None,
    };

    let source = source::from_config(&profile.source);
    let hub = HubOwner::new(
        HubConfig {
            profile: endpoint.profile.clone(),
            socket: endpoint.socket_path.clone(),
            work_dir: endpoint.work_dir.clone(),
            retention: Retention {
                max_events: usize::try_from(args.retention_events).unwrap_or(usize::MAX),
                max_bytes: usize::try_from(args.retention_bytes).unwrap_or(usize::MAX),
                hot_events: usize::try_from(args.hot_events).unwrap_or(usize::MAX),
            },
            default_ttl: args.default_ttl,
            default_window: args.window,
            // A cluster's log refuses a duplicate id anywhere in what it
            // retains (its unique index): the dedup window must cover the
            // retained log, or an old id redelivered upstream would reach
            // the database and stop the owner.
            dedup_capacity: usize::try_from(match profile.store.kind {
                store::StoreKind::Postgres => args.dedup_capacity.max(args.retention_events),
                _ => args.dedup_capacity,
            })
            .unwrap_or(usize::MAX),
            dedup_keeps_retained: profile.store.kind == store::StoreKind::Postgres,
            idle_timeout: args.idle_timeout,
            source_kind: source.kind().to_owned(),
            inline_commit: profile.store.kind == store::StoreKind::Memory,
            clustered: profile.store.postgres.is_some(),
        },
        trigger,
        source.upstream_control(),
        recovered,
        store.info(),
    );
    let dedup_ids = dedup_ids.map(|(ids, loaded)| {
        hub.seed_dedup(&loaded);
        ids
    });
    // Mark the store in use: until the clean snapshot at exit, a restart
    // treats every pending event as possibly delivered.
    store
        .save(&hub.startup_snapshot())
        .map_err(|e| StartError::runtime(format!("cannot write the store: {e}")))?;
    let committer = commit::spawn(hub.commit_port(), store, dedup_ids)
        .map_err(|e| StartError::runtime(format!("cannot start the committer thread: {e}")))?;
    // `--where` runs in its own thread and worker process, never under the
    // hub lock; restored events it must judge again wait for it there.
    judge::spawn(hub.filter_handle(), judge::Evaluator::worker())
        .map_err(|e| StartError::runtime(format!("cannot start the filter thread: {e}")))?;
    tracing::info!(
        pid = std::process::id(),
        profile = %endpoint.profile,
        socket = %endpoint.socket_path.display(),
        idle_timeout = ?args.idle_timeout,
        "bus ready"
    );
    ready.ready();
    unready.disarm();
    notify::ready(&notifier, &hub.status_reader(), &endpoint, shutdown.clone());

    let tracker = TaskTracker::new();
    let housekeeping = tokio::spawn(hub.housekeeping(shutdown.clone()));
    // Runs as long as the runtime: the committer's wake-ups go through it.
    tokio::spawn(hub.wake_relay());
    // In a cluster only the lease holder runs the upstream source: a fresh
    // one each time it becomes the owner.
    let (source_task, link) = match profile.store.postgres.clone() {
        Some(pg) => {
            let link = cluster::Link::new(pg, hub.replica_port(), epoch);
            drop(source);
            let config = profile.source.clone();
            let make: cluster::SourceFactory = Box::new(move || source::from_config(&config));
            cluster::spawn(link.clone(), make, shutdown.clone());
            (None, Some(link))
        }
        None => {
            let task = tokio::spawn(source.run(SourceContext {
                hub: hub.source_handle(),
                shutdown: shutdown.clone(),
            }));
            (Some(task), None)
        }
    };
    let reason = server::run(listener, hub.sessions(), link, shutdown, &tracker).await;
    tracing::info!(reason = proto::bye_reason_name(reason), "shutting down");
    notify::stopping(&notifier, reason);

    // No new client may reach this bus: remove the socket first, so a client
    // arriving now spawns a successor, which waits for our lock. A socket
    // systemd passed stays: systemd starts the successor on the next client.
    if owns_socket {
        let _ = fs::remove_file(&endpoint.socket_path);
    }
    tracker.close();
    if tokio::time::timeout(
        connection::DRAIN_TIMEOUT + Duration::from_secs(1),
        tracker.wait(),
    )
    .await
    .is_err()
    {
        tracing::warn!("drain deadline passed with connections still open");
    }
    if let Some(source_task) = source_task {
        let _ = tokio::time::timeout(Duration::from_secs(1), source_task).await;
    }
    housekeeping.abort();
    // Flush what is staged and save the subscriptions, marked clean.
    hub.close_store();
    let _ = tokio::task::spawn_blocking(move || committer.join()).await;
    let store_error = hub.store_error();
    let _ = fs::remove_file(endpoint.meta_path());
    drop(lock);
    if let Some(e) = store_error {
        tracing::info!("bus exited after a store failure");
        return Err(StartError::runtime(format!("the store failed: {e}")));
    }
    tracing::info!("bus exited");
    Ok(())
}
