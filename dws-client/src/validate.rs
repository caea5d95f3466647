//! Flag validation shared by the commands: every check runs before anything
//! is sent to the bus, and every failure is a usage error (exit 2). A
//! message repeats at most the start of an invalid value ([`quoted`]).

use proto::{
    pattern::Pattern,
    v1::{StartPosition, UpstreamSpec},
};

use crate::{
    cli::{From, UpstreamArgs},
    exit::{clip, quoted, CliError, Result},
};

/// Event keys from the command line (each may hold several, joined by `,`),
/// each checked against the pattern syntax.
pub fn event_keys(args: &[String]) -> Result<Vec<String>> {
    let keys: Vec<String> = args
        .iter()
        .flat_map(|k| k.split(','))
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    for k in &keys {
        // The rule both sides share; its message says why, the key clipped.
        Pattern::parse(k).map_err(CliError::usage)?;
    }
    Ok(keys)
}

/// A subscription id given as `flag`.
pub fn subscription_id(flag: &str, id: &str) -> Result<()> {
    proto::limits::check_subscription_id(flag, id).map_err(CliError::usage)
}

/// The `--filter` regex; empty when absent.
pub fn filter(filter: Option<String>) -> Result<String> {
    let filter = filter.unwrap_or_default();
    if !filter.is_empty() {
        regex::Regex::new(&filter).map_err(|e| {
            let text = e.to_string();
            let detail = text.lines().last().unwrap_or_default().trim();
            let detail = detail.strip_prefix("error: ").unwrap_or(detail);
            CliError::usage(format!(
                "invalid --filter regex {}: {}",
                quoted(&filter),
                clip(detail)
            ))
        })?;
    }
    Ok(filter)
}

/// The `--where` jq expressions, each checked as the bus will check it
/// (size, syntax with the column, what it may say).
pub fn wheres(exprs: Vec<String>) -> Result<Vec<String>> {
    proto::where_expr::Program::compile(&exprs).map_err(|e| CliError::usage(e.0))?;
    Ok(exprs)
}

/// A bus that answers a Subscribe with `--where` without echoing the
/// expressions is older than `--where` and ignored them: say so rather
/// than deliver what they exclude.
pub fn where_echoed(wheres: &[String], sub: &proto::v1::Subscribed) -> Result<()> {
    if !wheres.is_empty() && sub.where_exprs.is_empty() {
        return Err(CliError::runtime(
            "the running bus is older than --where and ignored it: stop it (dws event stop) and run again",
        ));
    }
    Ok(())
}

/// The personal stream's event keys and the rule type each requires (the
/// reference CLI's registry).
const PERSONAL_KEYS: &[(&str, &str)] = &[
    ("user_im_message_receive_at", "at"),
    ("user_im_message_receive_o2o", "singleChat"),
    ("user_im_message_read_o2o", "singleChat"),
    ("user_im_message_recall_o2o", "singleChat"),
    ("user_im_message_reaction_o2o", "singleChat"),
    ("user_im_message_receive_user", "sender"),
    ("user_im_message_receive_group", "group"),
    ("user_im_message_read_group", "group"),
    ("user_im_message_recall_group", "group"),
    ("user_im_message_reaction_group", "group"),
    ("user_im_group_updated", "group"),
    ("user_im_group_member_added", "group"),
    ("user_im_group_member_exited", "group"),
    ("user_im_group_disbanded", "group"),
    ("user_im_message_receive_o2o_all", "all"),
    ("user_im_message_receive_group_all", "all"),
    ("user_oa_approval_task_created", "all"),
    ("user_oa_approval_task_finished", "all"),
    ("user_oa_approval_task_redirected", "all"),
    ("user_oa_approval_instance_started", "all"),
    ("user_oa_approval_instance_cc", "all"),
    ("user_oa_approval_instance_terminated", "all"),
    ("user_oa_approval_instance_finished", "all"),
];

const RULES: &[&str] = &["at", "singleChat", "sender", "group", "all"];

/// The upstream half of a personal-stream subscription, or `None` when the
/// run asks for nothing upstream (no personal flag, no `user_*` key).
pub fn upstream(keys: &[String], args: &UpstreamArgs) -> Result<Option<UpstreamSpec>> {
    let personal_key = keys.iter().any(|k| k.starts_with("user_"));
    if !args.any() && !personal_key {
        return Ok(None);
    }
    let [key] = keys else {
        return Err(CliError::usage(
            "a personal-stream subscription takes exactly one event key (e.g. user_im_message_receive_o2o)",
        ));
    };
    if matches!(Pattern::parse(key), Ok(Pattern::Prefix(_) | Pattern::All)) {
        return Err(CliError::usage(format!(
            "{}: a personal-stream subscription needs an exact event key, not a pattern",
            clip(key)
        )));
    }
    let known = PERSONAL_KEYS
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, r)| *r);
    let rule = match (&args.rule, known) {
        (Some(r), _) if !RULES.contains(&r.as_str()) => {
            return Err(CliError::usage(format!(
                "invalid --rule {}: use one of {}",
                quoted(r),
                RULES.join(", ")
            )))
        }
        (Some(r), Some(k)) if r != k => {
            return Err(CliError::usage(format!(
                "{} takes --rule {k}, not {}",
                clip(key),
                clip(r)
            )))
        }
        (Some(r), _) => r.clone(),
        (None, Some(k)) => k.to_owned(),
        (None, None) => {
            return Err(CliError::usage(format!(
                "{} is not a known personal event key: give its --rule ({})",
                clip(key),
                RULES.join(", ")
            )))
        }
    };
    let targets = usize::from(args.user.is_some()) + usize::from(args.open_dingtalk_id.is_some());
    match rule.as_str() {
        "singleChat" | "sender" if targets != 1 || args.group.is_some() => {
            return Err(CliError::usage(format!(
                "rule {rule} needs exactly one of --user or --open-dingtalk-id (and no --group)"
            )))
        }
        "group" if args.group.is_none() || targets > 0 => return Err(CliError::usage(
            "rule group needs --group OPEN_CONVERSATION_ID (and no --user or --open-dingtalk-id)",
        )),
        "at" | "all" if targets > 0 || args.group.is_some() => {
            return Err(CliError::usage(format!(
                "rule {rule} takes no --user, --open-dingtalk-id or --group"
            )))
        }
        _ => {}
    }
    if args.query.iter().any(|q| q.trim().is_empty()) {
        return Err(CliError::usage("--query must not be empty"));
    }
    // Any JSON, like the reference's `BuildFilter` (registry.go).
    if let Some(f) = &args.filter_json {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(f) {
            return Err(CliError::usage(format!("invalid --filter-json: {e}")));
        }
    }
    Ok(Some(UpstreamSpec {
        rule_type: rule,
        user: args.user.clone().unwrap_or_default(),
        open_dingtalk_id: args.open_dingtalk_id.clone().unwrap_or_default(),
        group: args.group.clone().unwrap_or_default(),
        query: args.query.clone(),
        filter_json: args.filter_json.clone().unwrap_or_default(),
        name: args.name.as_deref().unwrap_or("").trim().to_owned(),
    }))
}

/// `--from` as the wire's start position, seq and time (unix ms).
pub fn start(from: Option<From>) -> (StartPosition, u64, i64) {
    match from.unwrap_or(From::Latest) {
        From::Latest => (StartPosition::StartLatest, 0, 0),
        From::Earliest => (StartPosition::StartEarliest, 0, 0),
        From::Seq(n) => (StartPosition::StartSeq, n, 0),
        From::Time(ms) => (StartPosition::StartTime, 0, ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_and_checked() {
        assert_eq!(
            event_keys(&["a,b.*".into(), "c".into()]).unwrap(),
            ["a", "b.*", "c"]
        );
        assert_eq!(
            event_keys(&["a b".into()]).unwrap_err().code,
            crate::exit::USAGE
        );
    }

    #[test]
    fn personal_rules() {
        let keys = |k: &str| vec![k.to_owned()];
        let none = UpstreamArgs::default();
        assert_eq!(upstream(&keys("im.x"), &none).unwrap(), None);
        let at = upstream(&keys("user_im_message_receive_at"), &none)
            .unwrap()
            .unwrap();
        assert_eq!(at.rule_type, "at");
        let err = upstream(&keys("user_im_message_receive_o2o"), &none).unwrap_err();
        assert!(
            err.message.contains("exactly one of --user"),
            "{}",
            err.message
        );
        let o2o = UpstreamArgs {
            user: Some("u1".into()),
            ..none.clone()
        };
        assert_eq!(
            upstream(&keys("user_im_message_receive_o2o"), &o2o)
                .unwrap()
                .unwrap()
                .user,
            "u1"
        );
        let g = UpstreamArgs {
            rule: Some("at".into()),
            ..none.clone()
        };
        assert!(upstream(&keys("user_im_group_updated"), &g)
            .unwrap_err()
            .message
            .contains("takes --rule group"));
        let bad = UpstreamArgs {
            filter_json: Some("[1".into()),
            ..none.clone()
        };
        assert!(upstream(&keys("user_im_message_receive_at"), &bad).is_err());
        assert!(upstream(&keys("user_unknown"), &none)
            .unwrap_err()
            .message
            .contains("give its --rule"));
        assert!(upstream(&["user_im_message_receive_at".into(), "b".into()], &none).is_err());
    }

    #[test]
    fn filter_message_is_one_line() {
        let e = filter(Some("(".into())).unwrap_err();
        assert_eq!(e.message, "invalid --filter regex \"(\": unclosed group");
        assert_eq!(filter(None).unwrap(), "");
    }

    #[test]
    fn messages_repeat_only_the_start_of_long_input() {
        let long = format!("({}", "a".repeat(200_000));
        let e = filter(Some(long)).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
        assert!(
            e.message.starts_with("invalid --filter regex \"(aaa"),
            "{}",
            e.message
        );
        assert!(
            e.message.ends_with("…(200001 bytes): unclosed group"),
            "{}",
            e.message
        );

        let key = format!("a b{}", "c".repeat(200_000));
        let e = event_keys(&[key]).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
        assert!(
            e.message.starts_with("invalid event key \"a bccc"),
            "{}",
            e.message
        );

        let e = subscription_id("--id", &"x".repeat(100_000)).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);

        let args = UpstreamArgs {
            rule: Some("r".repeat(100_000)),
            ..UpstreamArgs::default()
        };
        let e = upstream(&["user_im_message_receive_at".into()], &args).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
        let e = upstream(
            &[format!("user_{}", "k".repeat(100_000))],
            &UpstreamArgs::default(),
        )
        .unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
    }
}
