//! Flag validation shared by the commands: every check runs before anything
//! is sent to the bus, and every failure is a usage error (exit 2).

use proto::{pattern::Pattern, v1::StartPosition};

use crate::{
    cli::From,
    exit::{CliError, Result},
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
        Pattern::parse(k).map_err(CliError::usage)?;
    }
    Ok(keys)
}

/// A subscription id given as `flag`.
pub fn subscription_id(flag: &str, id: &str) -> Result<()> {
    if proto::is_valid_id(id) {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "invalid {flag} {id:?}: use 1-64 characters from A-Z a-z 0-9 . _ -"
        )))
    }
}

/// The `--filter` regex; empty when absent.
pub fn filter(filter: Option<String>) -> Result<String> {
    let filter = filter.unwrap_or_default();
    if !filter.is_empty() {
        regex::Regex::new(&filter).map_err(|e| {
            let text = e.to_string();
            let detail = text.lines().last().unwrap_or_default().trim();
            let detail = detail.strip_prefix("error: ").unwrap_or(detail);
            CliError::usage(format!("invalid --filter regex {filter:?}: {detail}"))
        })?;
    }
    Ok(filter)
}

/// `--from` as the wire's start position.
pub fn start(from: Option<From>) -> (StartPosition, u64) {
    match from.unwrap_or(From::Latest) {
        From::Latest => (StartPosition::StartLatest, 0),
        From::Earliest => (StartPosition::StartEarliest, 0),
        From::Seq(n) => (StartPosition::StartSeq, n),
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
    fn filter_message_is_one_line() {
        let e = filter(Some("(".into())).unwrap_err();
        assert_eq!(e.message, "invalid --filter regex \"(\": unclosed group");
        assert_eq!(filter(None).unwrap(), "");
    }
}
