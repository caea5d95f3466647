//! Event-key patterns, shared by the bus (matching) and the client
//! (validating flags before anything is sent): exact `im.message`, prefix
//! `im.*` (the key itself and anything below it), catch-all `*`.
//!
//! A key is 1-256 bytes of `A-Z a-z 0-9 . _ - : /` whose `.`-separated
//! segments are none of them empty: `bad..key`, `.x` and `x.` name nothing
//! an upstream sends, so a subscription to one would wait forever; they are
//! refused ([`Pattern::parse`] says why), by `dws` before anything is sent
//! and by the bus for a publish or a subscription.

use std::fmt;

/// One event-key pattern: exact `im.message`, prefix `im.*`, or catch-all `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    /// Matches the prefix itself and anything below it: `im.*` matches
    /// `im.message` and `im.message.sent` but not `imx`.
    Prefix(String),
    All,
}

impl Pattern {
    pub fn parse(s: &str) -> Result<Pattern, String> {
        Pattern::check(s).map_err(|why| {
            format!(
                "invalid event key {}: {why}; use an exact key (im.message), a prefix (im.*) or *",
                crate::limits::quoted(s)
            )
        })
    }

    /// [`Pattern::parse`], with why a key is refused in a few words.
    pub fn check(s: &str) -> Result<Pattern, &'static str> {
        Pattern::checked(s, true)
    }

    /// A pattern a subscription was stored with: the rule of the build
    /// that stored it, which did not refuse empty segments yet (`a..b`).
    /// Such a subscription is restored as it was, never a refused start.
    pub fn parse_stored(s: &str) -> Result<Pattern, String> {
        Pattern::checked(s, false)
            .map_err(|why| format!("invalid event key {}: {why}", crate::limits::quoted(s)))
    }

    fn checked(s: &str, segments: bool) -> Result<Pattern, &'static str> {
        if s == "*" {
            return Ok(Pattern::All);
        }
        match s.strip_suffix(".*") {
            Some(prefix) => {
                check_key(prefix, segments).map(|()| Pattern::Prefix(prefix.to_owned()))
            }
            None => check_key(s, segments).map(|()| Pattern::Exact(s.to_owned())),
        }
    }

    pub fn matches(&self, event_type: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Exact(k) => k == event_type,
            Pattern::Prefix(p) => event_type
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.')),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::All => f.write_str("*"),
            Pattern::Exact(k) => f.write_str(k),
            Pattern::Prefix(p) => write!(f, "{p}.*"),
        }
    }
}

/// Why `k` is not a key (the part of a pattern before any `.*`), if it is
/// not; `segments`: empty segments are refused too.
fn check_key(k: &str, segments: bool) -> Result<(), &'static str> {
    if k.is_empty() {
        return Err("it is empty");
    }
    if k.len() > 256 {
        return Err("it is longer than 256 bytes");
    }
    if k.contains('*') {
        return Err("`*` stands alone or ends a prefix (im.*)");
    }
    if !k
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'))
    {
        return Err("it holds a character other than letters, digits and . _ - : /");
    }
    if segments && k.split('.').any(str::is_empty) {
        return Err("it has an empty segment (two dots in a row, or a dot at its start or end)");
    }
    Ok(())
}

/// `true` if `s` is a valid concrete event type (what `publish` accepts).
pub fn is_valid_event_type(s: &str) -> bool {
    matches!(Pattern::parse(s), Ok(Pattern::Exact(_)))
}

/// The event-type rule for publishing: an exact key, no wildcards.
pub fn check_event_type(t: &str) -> Result<(), String> {
    match Pattern::check(t) {
        Ok(Pattern::Exact(_)) => Ok(()),
        Ok(_) => Err(format!(
            "invalid event type {}: no wildcards in an event type (they are for subscribing); \
             publish one exact type, e.g. im.message",
            crate::limits::quoted(t)
        )),
        Err(why) => Err(format!(
            "invalid event type {}: {why}; publish one exact type (no wildcards), e.g. im.message",
            crate::limits::quoted(t)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_type_is_one_exact_key() {
        assert!(check_event_type("a.b").is_ok());
        assert!(check_event_type("a.*")
            .unwrap_err()
            .contains("no wildcards"));
        // Issue 44, item 7: the rule once, not twice.
        let e = check_event_type("bad key").unwrap_err();
        assert_eq!(e.matches("letters, digits").count(), 1, "{e}");
    }

    #[test]
    fn a_stored_key_with_an_empty_segment_is_still_read() {
        assert!(Pattern::parse("bad..key").is_err());
        assert_eq!(
            Pattern::parse_stored("bad..key").unwrap(),
            Pattern::Exact("bad..key".into())
        );
        assert_eq!(
            Pattern::parse_stored("x..*").unwrap(),
            Pattern::Prefix("x.".into())
        );
        assert!(Pattern::parse_stored("a b").is_err());
        assert!(Pattern::parse_stored("a.*.*").is_err());
    }

    #[test]
    fn patterns() {
        let p = Pattern::parse("im.*").unwrap();
        assert!(p.matches("im.message"));
        assert!(p.matches("im"));
        assert!(!p.matches("imx.message"));
        assert!(Pattern::parse("*").unwrap().matches("anything"));
        assert!(Pattern::parse("a.b").unwrap().matches("a.b"));
        assert!(!Pattern::parse("a.b").unwrap().matches("a.bc"));
        assert!(Pattern::parse("a b").is_err());
        assert!(Pattern::parse("").is_err());
        assert!(Pattern::parse("a.*.*").is_err());
        assert!(is_valid_event_type("a.b"));
        assert!(!is_valid_event_type("a.*"));
    }

    #[test]
    fn an_empty_segment_is_refused_with_why() {
        for bad in ["bad..key", ".x", "x.", "x..*", ".*", "a..b.*", "..", "."] {
            let e = Pattern::parse(bad).unwrap_err();
            assert!(
                e.contains("empty segment") || e.contains("empty"),
                "{bad}: {e}"
            );
            assert!(!is_valid_event_type(bad), "{bad}");
        }
        assert!(Pattern::parse("x..*")
            .unwrap_err()
            .contains("empty segment"));
        for good in ["a", "a.b", "a-b_c:d/e", "a.b.*", "im.message.sent"] {
            assert!(Pattern::parse(good).is_ok(), "{good}");
        }
        let e = Pattern::parse("a b").unwrap_err();
        assert!(e.contains("letters, digits"), "{e}");
        let e = Pattern::parse("*.x").unwrap_err();
        assert!(e.contains("`*` stands alone"), "{e}");
        assert!(Pattern::parse(&"x".repeat(300)).unwrap_err().len() < 300);
    }
}
