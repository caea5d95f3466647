//! The short request/reply commands: publish, stop, subscribe, unsubscribe.

use std::io::{IsTerminal, Read};

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};

use crate::{
    bus::{BusConn, Resend},
    cli::{Delivery, PublishArgs, StopArgs, SubscribeArgs, TextOrJson, UnsubscribeArgs},
    exit::{clip, CliError, Result},
    print_stdout, validate,
};

fn unexpected(what: &str) -> CliError {
    CliError::runtime(format!("the bus answered {what} with an unexpected frame"))
}

/// The most data one event carries (the rule `publish --lines` shares).
pub const MAX_DATA: usize = proto::limits::MAX_PUBLISH_DATA;

/// DATA read from stdin to its end, without its final line end.
fn read_stdin_data() -> Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| CliError::usage(format!("cannot read DATA from stdin: {e}")))?;
    Ok(s.trim_end_matches(['\n', '\r']).to_owned())
}

pub async fn publish(args: PublishArgs, endpoint: &Endpoint) -> Result<()> {
    if args.lines {
        return crate::publish_lines::run(args, endpoint).await;
    }
    if args.id_prefix.is_some() {
        return Err(CliError::usage(
            "--id-prefix names the events of --lines; one event takes --id",
        ));
    }
    proto::pattern::check_event_type(&args.event_type).map_err(CliError::usage)?;
    if let Some(id) = &args.id {
        proto::limits::check_printable_id("--id", id).map_err(CliError::usage)?;
        proto::limits::check_event_id(id).map_err(|e| CliError::usage(format!("--id: {e}")))?;
    }
    // Without DATA, a piped stdin is the data (`echo '{…}' | dws event
    // publish k`, as `-` would read it); a terminal's is not.
    let piped = args.data.is_none() && !std::io::stdin().is_terminal();
    let data = match args.data.as_deref() {
        Some("-") => read_stdin_data()?,
        None if piped => read_stdin_data()?,
        Some(d) => d.to_owned(),
        None => String::new(),
    };
    let limit = MAX_DATA;
    if data.len() > limit {
        return Err(CliError::usage(format!(
            "event data is {} bytes; the most a frame carries is {limit}",
            data.len()
        )));
    }
    // A publish with an id may be sent again (the bus's dedup answers a
    // second copy with the first one's seq); one without must not be.
    let resend = if args.id.is_some() {
        Resend::Always
    } else {
        Resend::UnlessSent
    };
    let (mut bus, reply) = BusConn::open_and_request_with(endpoint, resend, |request_id| {
        C::Publish(v1::Publish {
            request_id,
            event_type: args.event_type.clone(),
            event_id: args.id.clone().unwrap_or_default(),
            data: data.clone(),
            headers: Default::default(),
        })
    })
    .await?;
    bus.bye().await;
    let S::PublishAck(ack) = reply else {
        return Err(unexpected("Publish"));
    };
    let line = serde_json::json!({
        "seq": ack.seq,
        "event_id": ack.event_id,
        "duplicate": ack.duplicate,
    });
    print_stdout(&format!("{line}\n"))
}

pub async fn stop(args: StopArgs, endpoint: &Endpoint) -> Result<()> {
    for id in &args.subscribe_id {
        validate::subscription_id("--subscribe-id", id)?;
    }
    let Some(mut bus) = BusConn::open(endpoint).await? else {
        return print_stdout(&match args.format {
            TextOrJson::Text => format!("bus not running (profile {})\n", endpoint.profile),
            TextOrJson::Json => format!(
                "{}\n",
                serde_json::json!({
                    "running": false,
                    "profile": endpoint.profile,
                    "socket": endpoint.socket_path,
                    "dry_run": args.dry_run,
                })
            ),
        });
    };
    let bus_pid = bus.hello.bus_pid;
    let reply = bus
        .request(|request_id| {
            C::StopRequest(v1::StopRequest {
                request_id,
                subscription_ids: args.subscribe_id.clone(),
                dry_run: args.dry_run,
            })
        })
        .await?;
    let S::StopReply(r) = reply else {
        return Err(unexpected("StopRequest"));
    };
    let would = if args.dry_run {
        "would stop"
    } else {
        "stopped"
    };
    let pids = |p: &[u32]| p.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut text = String::new();
    if args.subscribe_id.is_empty() {
        text.push_str(&format!(
            "{would} bus pid {bus_pid} ({} consumer(s){})\n",
            r.consumer_pids.len(),
            if r.consumer_pids.is_empty() {
                String::new()
            } else {
                format!(": pid {}", pids(&r.consumer_pids))
            }
        ));
        if r.bus_stopping {
            // Wait until the bus has closed us: it is then past its drain.
            let wait = async { while let Ok(Some(_)) = bus.next().await {} };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
        }
    } else {
        text.push_str(&format!(
            "{would} {} consumer(s) of subscription(s) {}{}\n",
            r.consumer_pids.len(),
            r.subscription_ids.join(","),
            if r.consumer_pids.is_empty() {
                String::new()
            } else {
                format!(" (pid {})", pids(&r.consumer_pids))
            }
        ));
        bus.bye().await;
        if !r.not_found.is_empty() {
            print_stdout(&stop_output(&args, bus_pid, &r, text))?;
            return Err(CliError::runtime(format!(
                "subscription(s) not found: {}",
                clip(&r.not_found.join(","))
            )));
        }
    }
    print_stdout(&stop_output(&args, bus_pid, &r, text))
}

/// What `stop` prints: the text line(s), or the JSON object.
fn stop_output(args: &StopArgs, bus_pid: u32, r: &v1::StopReply, text: String) -> String {
    match args.format {
        TextOrJson::Text => text,
        TextOrJson::Json => format!(
            "{}\n",
            serde_json::json!({
                "running": true,
                "dry_run": args.dry_run,
                "scope": if args.subscribe_id.is_empty() { "bus" } else { "subscriptions" },
                "bus_pid": bus_pid,
                "bus_stopping": r.bus_stopping,
                "consumer_pids": r.consumer_pids,
                "subscription_ids": r.subscription_ids,
                "not_found": r.not_found,
            })
        ),
    }
}

pub async fn subscribe(args: SubscribeArgs, endpoint: &Endpoint) -> Result<()> {
    let keys = validate::event_keys(&args.keys)?;
    if let Some(id) = &args.id {
        validate::subscription_id("--id", id)?;
    }
    let filter = validate::filter(args.filter)?;
    let wheres = validate::wheres(args.where_exprs)?;
    let (start, start_seq, start_unix_ms) = validate::start(args.from);
    let upstream = validate::upstream(&keys, &args.upstream)?;
    let (max_deliver, on_poison) = crate::consume::poison(&args.poison)?;
    let backoff_ms = crate::consume::backoff(&args.poison)?;
    let (mut bus, reply) = BusConn::open_and_request(endpoint, |request_id| {
        C::Subscribe(v1::Subscribe {
            request_id,
            subscription_id: args.id.clone().unwrap_or_default(),
            patterns: keys.clone(),
            filter: filter.clone(),
            where_exprs: wheres.clone(),
            start: start as i32,
            start_seq,
            start_unix_ms,
            ttl_ms: args.ttl.map_or(0, proto::limits::ttl_to_ms),
            attach: false,
            takeover: false,
            must_exist: false,
            owned: false,
            window: 0,
            upstream: upstream.clone(),
            max_deliver,
            on_poison: on_poison as i32,
            backoff_ms: backoff_ms.clone(),
            default_ack_wait_ms: args.ack_wait.map_or(0, |d| d.as_millis() as u64),
            shared: args.delivery == Delivery::Shared,
            ..v1::Subscribe::default()
        })
    })
    .await?;
    bus.bye().await;
    let S::Subscribed(sub) = reply else {
        return Err(unexpected("Subscribe"));
    };
    validate::where_echoed(&wheres, &sub)?;
    let text = match args.format {
        TextOrJson::Text => format!("{}\n", sub.subscription_id),
        TextOrJson::Json => format!(
            "{}\n",
            serde_json::json!({
                "id": sub.subscription_id,
                "created": sub.created,
                "patterns": sub.patterns,
                "filter": (!sub.filter.is_empty()).then_some(&sub.filter),
                "where": sub.where_exprs,
                "cursor": sub.cursor,
                "head_seq": sub.head_seq,
            })
        ),
    };
    print_stdout(&text)
}

pub async fn unsubscribe(args: UnsubscribeArgs, endpoint: &Endpoint) -> Result<()> {
    for id in &args.ids {
        validate::subscription_id("subscription id", id)?;
    }
    let Some(mut bus) = BusConn::open(endpoint).await? else {
        return Err(CliError::runtime(format!(
            "subscription(s) not found: {} (bus not running)",
            clip(&args.ids.join(","))
        )));
    };
    let reply = bus
        .request(|request_id| {
            C::Unsubscribe(v1::Unsubscribe {
                request_id,
                subscription_ids: args.ids.clone(),
            })
        })
        .await?;
    bus.bye().await;
    let S::Unsubscribed(r) = reply else {
        return Err(unexpected("Unsubscribe"));
    };
    match args.format {
        TextOrJson::Text if !r.removed.is_empty() => {
            print_stdout(&format!("removed {}\n", r.removed.join(",")))?;
        }
        TextOrJson::Text => {}
        TextOrJson::Json => print_stdout(&format!(
            "{}\n",
            serde_json::json!({"removed": r.removed, "not_found": r.not_found})
        ))?,
    }
    if !r.not_found.is_empty() {
        return Err(CliError::runtime(format!(
            "subscription(s) not found: {}",
            clip(&r.not_found.join(","))
        )));
    }
    Ok(())
}
