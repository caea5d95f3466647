//! What a subscription selects: any of its event-key patterns
//! ([`proto::pattern::Pattern`]), then an optional regex filter on the event
//! type. Validated when the subscription is created, so a bad pattern or
//! regex never reaches the log.

use regex::Regex;

pub use proto::pattern::Pattern;

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
            && self
                .filter
                .as_ref()
                .is_none_or(|re| re.is_match(event_type))
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
    fn selector_filter() {
        let s = Selector::new(&["*".into()], "^chat\\.").unwrap();
        assert!(s.matches("chat.x"));
        assert!(!s.matches("im.x"));
        assert!(Selector::new(&["*".into()], "(").is_err());
        assert!(Selector::new(&[], "").is_err());
        let a = Selector::new(&["a".into(), "b.*".into()], "").unwrap();
        let b = Selector::new(&["b.*".into(), "a".into()], "").unwrap();
        assert!(a.same_spec(&b));
    }
}
