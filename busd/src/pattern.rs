//! Event-key patterns and the subscription filter: which event types a
//! subscription wants. Validated when the subscription is created, so a bad
//! pattern or regex never reaches the log.

use std::fmt;

use regex::Regex;

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

/// What a subscription selects: any of its patterns, then the optional filter.
#[derive(Debug, Clone)]
pub struct Selector {
    pub patterns: Vec<Pattern>,
    pub filter: Option<Regex>,
}

impl Selector {
    pub fn new(patterns: &[String], filter: &str) -> Result<Selector, String> {
        if patterns.is_empty() {
            return Err("at least one event key is required".into());
        }
        let patterns = patterns
            .iter()
            .map(|p| Pattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let filter = if filter.is_empty() {
            None
        } else {
            Some(Regex::new(filter).map_err(|e| format!("invalid --filter regex: {e}"))?)
        };
        Ok(Selector { patterns, filter })
    }

    pub fn matches(&self, event_type: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(event_type))
            && self.filter.as_ref().is_none_or(|re| re.is_match(event_type))
    }

    pub fn pattern_strings(&self) -> Vec<String> {
        self.patterns.iter().map(ToString::to_string).collect()
    }

    pub fn filter_str(&self) -> &str {
        self.filter.as_ref().map_or("", Regex::as_str)
    }

    /// Same patterns (as a set) and same filter: used to make a repeated
    /// `subscribe --id` idempotent.
    pub fn same_spec(&self, other: &Selector) -> bool {
        let mut a = self.pattern_strings();
        let mut b = other.pattern_strings();
        a.sort();
        a.dedup();
        b.sort();
        b.dedup();
        a == b && self.filter_str() == other.filter_str()
    }
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
    }

    #[test]
    fn selector_filter() {
        let s = Selector::new(&["*".into()], "^chat\\.").unwrap();
        assert!(s.matches("chat.x"));
        assert!(!s.matches("im.x"));
        assert!(Selector::new(&["*".into()], "(").is_err());
        assert!(Selector::new(&[], "").is_err());
    }
}
