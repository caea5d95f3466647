//! What a subscription selects: any of its event-key patterns
//! ([`proto::pattern::Pattern`]), then an optional regex filter on the event
//! type, then its `--where` expressions (held here, judged by
//! `where_filter`). Validated when the subscription is created, so a bad pattern or
//! regex never reaches the log.
//!
//! Matching is indexed, not a scan over the patterns: exact keys sit in a
//! hash set, prefixes in another, and an event type is looked up once for
//! itself and once per `.`-separated prefix of it. So the cost of a match
//! grows with the depth of the event type, not with the number of patterns
//! (which is bounded too: [`proto::limits::MAX_PATTERNS`]). Fan-out asks
//! every subscription about every event, so the sets hash with `FxHash`
//! rather than SipHash (a sixth of busd's instructions at 16 consumers):
//! keys a client chose to collide cost at most a scan of its own
//! subscription's bounded patterns.

use rustc_hash::FxHashSet as HashSet;

use proto::limits::{clip, clip_to, MAX_FILTER_COMPILED, MAX_FILTER_LEN, MAX_PATTERNS};
use regex::{Regex, RegexBuilder};

use crate::eventlog::LoggedEvent;
use crate::where_filter::Wheres;

pub use proto::pattern::Pattern;

/// What a subscription selects: any of its patterns, then the optional filter.
#[derive(Debug, Clone)]
pub struct Selector {
    patterns: Vec<Pattern>,
    all: bool,
    exact: HashSet<String>,
    prefixes: HashSet<String>,
    filter: Option<Regex>,
    /// `--where` expressions, run only on events whose type matched.
    wheres: Option<Wheres>,
}

/// Why a subscription's keys, `--filter` or `--where` cannot select: the
/// message is the refusal the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("at least one event key is required")]
    NoKeys,
    #[error("{0} event keys in one subscription; the most is {MAX_PATTERNS}")]
    TooManyKeys(usize),
    #[error("invalid event key {0:?}: use an exact key (im.message), a prefix (im.*) or *")]
    InvalidKey(String),
    #[error("--filter regex of {0} bytes; the most is {MAX_FILTER_LEN}")]
    FilterTooLong(usize),
    #[error("invalid --filter regex: {0}")]
    InvalidFilter(String),
    /// A `--where` expression refused (`where_filter::Wheres::compile`).
    #[error("{0}")]
    Where(String),
}

impl Selector {
    /// A new subscription's selector: its keys by today's rule.
    pub fn new(patterns: &[String], filter: &str) -> Result<Selector, SelectorError> {
        Selector::make(patterns, filter, Pattern::parse)
    }

    /// A stored subscription's selector (restored, or defined by another
    /// cluster host): its keys by the rule they were stored under
    /// ([`Pattern::parse_stored`]), so a subscription an older build
    /// accepted is restored as it was.
    pub fn stored(patterns: &[String], filter: &str) -> Result<Selector, SelectorError> {
        Selector::make(patterns, filter, Pattern::parse_stored)
    }

    fn make(
        patterns: &[String],
        filter: &str,
        parse: fn(&str) -> Result<Pattern, String>,
    ) -> Result<Selector, SelectorError> {
        if patterns.is_empty() {
            return Err(SelectorError::NoKeys);
        }
        if patterns.len() > MAX_PATTERNS {
            return Err(SelectorError::TooManyKeys(patterns.len()));
        }
        let patterns = patterns
            .iter()
            .map(|p| parse(p).map_err(|_| SelectorError::InvalidKey(clip(p))))
            .collect::<Result<Vec<_>, _>>()?;
        if filter.len() > MAX_FILTER_LEN {
            return Err(SelectorError::FilterTooLong(filter.len()));
        }
        let filter = if filter.is_empty() {
            None
        } else {
            Some(
                RegexBuilder::new(filter)
                    .size_limit(MAX_FILTER_COMPILED)
                    .build()
                    .map_err(|e| {
                        SelectorError::InvalidFilter(clip_to(&e.to_string(), 300).to_string())
                    })?,
            )
        };
        let mut sel = Selector {
            all: false,
            exact: HashSet::default(),
            prefixes: HashSet::default(),
            patterns,
            filter,
            wheres: None,
        };
        for p in &sel.patterns {
            match p {
                Pattern::All => sel.all = true,
                Pattern::Exact(k) => {
                    sel.exact.insert(k.clone());
                }
                Pattern::Prefix(k) => {
                    sel.prefixes.insert(k.clone());
                }
            }
        }
        Ok(sel)
    }

    pub fn matches(&self, event_type: &str) -> bool {
        self.keys_match(event_type)
            && self
                .filter
                .as_ref()
                .is_none_or(|re| re.is_match(event_type))
    }

    fn keys_match(&self, t: &str) -> bool {
        if self.all || self.exact.contains(t) {
            return true;
        }
        if self.prefixes.is_empty() {
            return false;
        }
        // `a.*` matches `a` and everything below it: look up `t` itself and
        // every prefix of it that ends before a `.`.
        self.prefixes.contains(t)
            || t.match_indices('.')
                .any(|(i, _)| self.prefixes.contains(&t[..i]))
    }

    /// The same selector with `--where` expressions (none: unchanged).
    pub fn with_where(mut self, exprs: &[String]) -> Result<Selector, SelectorError> {
        self.wheres = Wheres::compile(exprs).map_err(|e| SelectorError::Where(e.0))?;
        Ok(self)
    }

    /// The `--where` expressions, as given.
    pub fn where_strs(&self) -> &[String] {
        self.wheres.as_ref().map_or(&[], Wheres::exprs)
    }

    /// Whether a subscription bound to `upstream_id` wants `e` by its
    /// route, keys and filter: a damaged placeholder always (its type is
    /// unknown: every subscription must stop at it). The `--where`
    /// expressions are judged apart, off the hub lock (`where_filter`).
    pub fn selects_keys(&self, e: &LoggedEvent, upstream_id: Option<&str>) -> bool {
        selects_by(e, upstream_id, |t| self.matches(t))
    }

    /// Whether events it selects by their keys wait for a `--where` verdict.
    pub fn has_where(&self) -> bool {
        self.wheres.is_some()
    }

    /// The `--where` expressions, compiled.
    pub fn wheres(&self) -> Option<&Wheres> {
        self.wheres.as_ref()
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
        let mut wa = self.where_strs().to_vec();
        let mut wb = other.where_strs().to_vec();
        wa.sort();
        wa.dedup();
        wb.sort();
        wb.dedup();
        a == b && self.filter_str() == other.filter_str() && wa == wb
    }

    /// What a refusal of a different spec adds after the filter: nothing
    /// when neither side has `--where` expressions, else this side's.
    pub fn where_note(&self, other: &Selector) -> String {
        match (self.where_strs(), other.where_strs()) {
            ([], []) => String::new(),
            ([], _) => " and no --where".into(),
            (w, _) => format!(" and --where {w:?}"),
        }
    }
}

/// The rule of [`Selector::selects_keys`], the keys' verdict on the event's
/// type given by `matches` (fan-out passes one it may have cached).
pub fn selects_by(
    e: &LoggedEvent,
    upstream_id: Option<&str>,
    matches: impl FnOnce(&crate::eventlog::Name) -> bool,
) -> bool {
    e.damaged || (e.routed_to(upstream_id) && matches(&e.event_type))
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
        let w = |x: &[&str]| {
            let exprs: Vec<String> = x.iter().map(|s| s.to_string()).collect();
            Selector::new(&["a".into()], "")
                .unwrap()
                .with_where(&exprs)
                .unwrap()
        };
        assert!(w(&[".x", ".y"]).same_spec(&w(&[".y", ".x"])));
        assert!(!w(&[".x"]).same_spec(&w(&[".y"])));
        assert!(!w(&[".x"]).same_spec(&w(&[])));
        assert_eq!(w(&[".x"]).where_note(&w(&[])), " and --where [\".x\"]");
        assert_eq!(w(&[]).where_note(&w(&[".x"])), " and no --where");
        assert_eq!(w(&[]).where_note(&w(&[])), "");
    }

    #[test]
    fn the_index_agrees_with_the_patterns() {
        let keys: Vec<String> = ["a.b", "c.*", "d.e.*", "x"].map(String::from).to_vec();
        let s = Selector::new(&keys, "").unwrap();
        let pats: Vec<Pattern> = keys.iter().map(|k| Pattern::parse(k).unwrap()).collect();
        for t in [
            "a.b", "a.bc", "a", "c", "c.x", "c.x.y", "cx", "d", "d.e", "d.e.f", "d.ef", "x", "x.y",
            "y",
        ] {
            assert_eq!(s.matches(t), pats.iter().any(|p| p.matches(t)), "{t}");
        }
    }

    #[test]
    fn bounds_are_enforced_with_short_messages() {
        let many: Vec<String> = (0..=MAX_PATTERNS).map(|i| format!("k{i}")).collect();
        assert!(Selector::new(&many, "")
            .unwrap_err()
            .to_string()
            .contains("the most is"));
        let long = "a".repeat(MAX_FILTER_LEN + 1);
        assert!(Selector::new(&["*".into()], &long).is_err());
        let huge_key = "é".repeat(1 << 18);
        assert!(
            Selector::new(&[huge_key], "")
                .unwrap_err()
                .to_string()
                .len()
                < 400
        );
        // A regex whose compiled form is over the limit.
        assert!(Selector::new(&["*".into()], "\\w{1000}\\w{1000}").is_err());
    }
}
