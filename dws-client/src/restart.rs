//! `dws event restart`: stop the running bus, wait until its process is
//! gone, and start the installed one (the upgrade path: an install puts a
//! new build in place, the running bus keeps the old code until restarted).

use std::time::{Duration, Instant};

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};

use crate::{
    bus::BusConn,
    cli::{RestartArgs, TextOrJson},
    exit::{CliError, Result},
    print_stdout,
};

/// How long the old bus may take to exit after it was asked to stop (it
/// drains its consumers and saves its state first).
const EXIT_DEADLINE: Duration = Duration::from_secs(60);

/// A bus as the hello frame names it.
struct Bus {
    pid: u32,
    version: String,
}

pub async fn restart(args: RestartArgs, endpoint: &Endpoint) -> Result<()> {
    let old = match BusConn::open(endpoint).await? {
        Some(bus) => Some(stop(bus).await?),
        None => None,
    };
    let mut bus = BusConn::open_or_spawn(endpoint).await?;
    let new = Bus {
        pid: bus.hello.bus_pid,
        version: bus.hello.bus_build.clone(),
    };
    bus.bye().await;
    print_stdout(&output(args.format, old.as_ref(), &new))
}

/// Asks the bus to stop and waits until its process has exited.
async fn stop(mut bus: BusConn) -> Result<Bus> {
    let old = Bus {
        pid: bus.hello.bus_pid,
        version: bus.hello.bus_build.clone(),
    };
    let reply = bus
        .request(|request_id| {
            C::StopRequest(v1::StopRequest {
                request_id,
                subscription_ids: vec![],
                dry_run: false,
            })
        })
        .await?;
    if !matches!(reply, S::StopReply(_)) {
        return Err(CliError::runtime(
            "the bus answered StopRequest with an unexpected frame",
        ));
    }
    // The bus closes us once it is past its drain.
    let closed = async { while let Ok(Some(_)) = bus.next().await {} };
    let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
    drop(bus);
    let deadline = Instant::now() + EXIT_DEADLINE;
    while alive(old.pid) {
        if Instant::now() >= deadline {
            return Err(CliError::runtime(format!(
                "the bus (pid {}) was asked to stop but has not exited after {} s; \
                 nothing was started (see its bus.log)",
                old.pid,
                EXIT_DEADLINE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(old)
}

/// The process exists (signal 0 is delivered or refused for permission).
fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

fn output(format: TextOrJson, old: Option<&Bus>, new: &Bus) -> String {
    match format {
        TextOrJson::Text => match old {
            Some(old) => format!(
                "restarted the bus: pid {} (version {}) stopped, pid {} (version {}) running\n",
                old.pid, old.version, new.pid, new.version
            ),
            None => format!(
                "no bus was running; started pid {} (version {})\n",
                new.pid, new.version
            ),
        },
        TextOrJson::Json => {
            let bus = |b: &Bus| serde_json::json!({"pid": b.pid, "version": b.version});
            format!(
                "{}\n",
                serde_json::json!({"old": old.map(bus), "new": bus(new)})
            )
        }
    }
}
