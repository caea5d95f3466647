//! Event-key patterns, shared by the bus (matching) and the client
//! (validating flags before anything is sent): exact `im.message`, prefix
//! `im.*` (the key itself and anything below it), catch-all `*`.

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
        let valid_key = |k: &str| {
            !k.is_empty()
                && k.len() <= 256
                && k.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/')
                })
        };
        if s == "*" {
            return Ok(Pattern::All);
        }
        if let Some(prefix) = s.strip_suffix(".*") {
            if valid_key(prefix) {
                return Ok(Pattern::Prefix(prefix.to_owned()));
            }
        } else if valid_key(s) {
            return Ok(Pattern::Exact(s.to_owned()));
        }
        Err(format!(
            "invalid event key {s:?}: use an exact key (im.message), a prefix (im.*) or *"
        ))
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

/// `true` if `s` is a valid concrete event type (what `publish` accepts).
pub fn is_valid_event_type(s: &str) -> bool {
    matches!(Pattern::parse(s), Ok(Pattern::Exact(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
