//! `dws event subscription VERB ID`: the operator verbs (`list` and
//! `info` are in [`crate::reading`]). Each sends one
//! `SubscriptionControl` request and prints the subscription's state after
//! it (text, or the bus's JSON document with `--format json`). A verb the
//! subscription's state does not allow is exit 1 (the bus says why).

use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S},
};
use serde_json::Value;

use crate::{
    bus::BusConn,
    cli::{SubscriptionVerb, TextOrJson, VerbArgs},
    exit::{CliError, Result},
    print_stdout, validate,
};

pub async fn run(verb: SubscriptionVerb, endpoint: &Endpoint) -> Result<()> {
    let (name, args, target, seqs) = match verb {
        SubscriptionVerb::List(a) => return crate::reading::list(a, endpoint).await,
        SubscriptionVerb::Info(a) => return crate::reading::info(a, endpoint).await,
        SubscriptionVerb::Restart(a) => ("restart", a, String::new(), vec![]),
        SubscriptionVerb::Skip(a) => ("skip", a, String::new(), vec![]),
        SubscriptionVerb::Disable(a) => ("disable", a, String::new(), vec![]),
        SubscriptionVerb::Enable(a) => ("enable", a, String::new(), vec![]),
        SubscriptionVerb::Parked(a) => ("parked", a, String::new(), vec![]),
        SubscriptionVerb::Seek(s) => ("seek", s.verb, seek_target(&s.to)?, vec![]),
        SubscriptionVerb::ReplayParked(r) => ("replay-parked", r.verb, String::new(), r.seqs),
    };
    validate::subscription_id("subscription id", &args.id)?;
    let Some(mut bus) = BusConn::open(endpoint).await? else {
        return Err(CliError::runtime(format!(
            "cannot {name} subscription {}: {}",
            crate::exit::clip(&args.id),
            crate::status::not_running_line(endpoint, None).trim_end()
        )));
    };
    let reply = bus
        .request(|request_id| {
            C::SubscriptionControl(v1::SubscriptionControl {
                request_id,
                subscription_id: args.id.clone(),
                verb: name.into(),
                dry_run: args.dry_run,
                target: target.clone(),
                seqs: seqs.clone(),
            })
        })
        .await?;
    bus.bye().await;
    let S::SubscriptionState(state) = reply else {
        return Err(CliError::runtime(
            "the bus answered a subscription verb with an unexpected frame",
        ));
    };
    let doc: Value = serde_json::from_str(&state.json)
        .map_err(|e| CliError::runtime(format!("the bus sent a bad state document: {e}")))?;
    match args.format {
        TextOrJson::Json => print_stdout(&format!("{doc}\n")),
        TextOrJson::Text => print_stdout(&render(&args, &doc)),
    }
}

/// `--to`: earliest, latest, a seq, or an RFC 3339 time (sent as `t:<ms>`).
fn seek_target(to: &str) -> Result<String> {
    match to {
        "earliest" | "latest" => Ok(to.into()),
        t if t.parse::<u64>().is_ok() => Ok(t.into()),
        t => crate::start::parse_time_ms(t)
            .map(|ms| format!("t:{ms}"))
            .ok_or_else(|| {
                CliError::usage(format!(
                    "--to {}: use earliest, latest, a seq or a time like 2026-11-30T12:00:00Z",
                    crate::exit::quoted(t)
                ))
            }),
    }
}

/// `1 delivery`, `3 deliveries`.
fn deliveries(n: &Value) -> String {
    crate::reading::deliveries(n.as_u64().unwrap_or(0))
}

/// The text form: one `key: value` line per field that matters.
fn render(args: &VerbArgs, doc: &Value) -> String {
    let mut out = String::new();
    let field = |k: &str| doc.get(k).cloned().unwrap_or(Value::Null);
    let prefix = if args.dry_run { "(dry run) " } else { "" };
    out.push_str(&format!(
        "{prefix}subscription {}: {}{}\n",
        args.id,
        field("state").as_str().unwrap_or("?"),
        if field("changed") == Value::Bool(true) {
            ""
        } else {
            " (unchanged)"
        }
    ));
    if let Some(h) = doc.get("halted").filter(|h| !h.is_null()) {
        out.push_str(&format!(
            "  halted at seq {} (event {}) after {}\n",
            h["seq"],
            h["event_id"],
            deliveries(&h["deliveries"])
        ));
    }
    for k in [
        "cursor",
        "head_seq",
        "pending",
        "in_flight",
        "head_attempts",
        "parked",
    ] {
        out.push_str(&format!("  {k}: {}\n", field(k)));
    }
    if let Some(seek) = doc.get("seek") {
        out.push_str(&format!(
            "  seek: from seq {}, {} event(s) before it no longer retained\n",
            seek["from_seq"], seek["gone"]
        ));
    }
    if let Some(list) = doc.get("parked_events").and_then(Value::as_array) {
        for p in list {
            out.push_str(&format!(
                "  parked seq {} {} {} ({})",
                p["seq"],
                p["event_type"],
                p["event_id"],
                deliveries(&p["deliveries"])
            ));
            if let Some(reason) = p.get("reason").and_then(Value::as_str) {
                out.push_str(&format!(": {}", proto::limits::quoted(reason)));
            }
            out.push('\n');
            if let Some(data) = p.get("data").and_then(Value::as_str) {
                // One line, at most 100 characters of it (`--format json`
                // has the first 1,024 bytes).
                out.push_str(&format!(
                    "    data {}\n",
                    proto::limits::quoted(&data.replace(['\n', '\r'], " "))
                ));
            }
        }
    }
    out
}
