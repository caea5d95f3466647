//! The short strings a logged event carries, held compactly: [`Name`] is
//! a shared string (event types, routes and dedup scopes repeat across
//! events: an [`Interner`] gives every equal one the same copy, 16 bytes
//! per event), [`Text`] an own string that costs 16 bytes and no
//! allocation when empty (event ids). An interner is owned by whoever
//! makes events in numbers (the hub's ingest, a store's recovery), never
//! shared by the whole process.

use std::{collections::HashSet, fmt, ops::Deref, sync::Arc};

/// Gives equal names one copy.
#[derive(Debug, Default)]
pub struct Interner {
    names: HashSet<Arc<str>>,
    /// Prune names no event holds once the set grows past this.
    prune_at: usize,
}

impl Interner {
    /// `s` as a name, shared with every equal name this interner gave.
    pub fn name(&mut self, s: &str) -> Name {
        if s.is_empty() {
            return Name::default();
        }
        if let Some(hit) = self.names.get(s) {
            return Name(Some(hit.clone()));
        }
        if self.names.len() >= self.prune_at {
            self.names.retain(|n| Arc::strong_count(n) > 1);
            self.prune_at = (self.names.len() * 2).max(1024);
        }
        let n: Arc<str> = Arc::from(s);
        self.names.insert(n.clone());
        Name(Some(n))
    }

    /// Names kept (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.len()
    }
}

/// An interned string: equal names share one allocation; the empty name
/// (no route, no scope) none, and no look-up.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Option<Arc<str>>);

impl Name {
    /// A name of its own (not shared with equal ones: see [`Interner`]).
    pub fn new(s: &str) -> Name {
        Name((!s.is_empty()).then(|| Arc::from(s)))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }

    /// The same allocation (both empty, or one shared string): equal
    /// without comparing bytes. Equal names from one [`Interner`] are.
    pub fn same(&self, other: &Name) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name::new(&s)
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name::new(s)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An own string; empty costs no allocation.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Text(Option<Box<str>>);

impl Text {
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text((!s.is_empty()).then(|| s.into_boxed_str()))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text((!s.is_empty()).then(|| s.into()))
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! str_eq {
    ($t:ty) => {
        impl PartialEq<str> for $t {
            fn eq(&self, o: &str) -> bool {
                self.as_str() == o
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, o: &&str) -> bool {
                self.as_str() == *o
            }
        }
        impl PartialEq<String> for $t {
            fn eq(&self, o: &String) -> bool {
                self.as_str() == o.as_str()
            }
        }
        impl PartialEq<$t> for String {
            fn eq(&self, o: &$t) -> bool {
                self.as_str() == o.as_str()
            }
        }
        impl PartialEq<$t> for &str {
            fn eq(&self, o: &$t) -> bool {
                *self == o.as_str()
            }
        }
    };
}
str_eq!(Name);
str_eq!(Text);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy_and_unused_ones_are_pruned() {
        let mut i = Interner::default();
        let a = i.name("x.interned");
        let b = i.name(&String::from("x.interned"));
        assert!(Arc::ptr_eq(a.0.as_ref().unwrap(), b.0.as_ref().unwrap()));
        assert_eq!(a, Name::from("x.interned"), "equal by content");
        assert!(!Arc::ptr_eq(
            a.0.as_ref().unwrap(),
            Name::from("x.interned").0.as_ref().unwrap()
        ));
        assert_eq!(Name::new(""), Name::default());
        assert_eq!(i.name(""), Name::default());
        assert_eq!(std::mem::size_of::<Name>(), 16);
        assert_eq!(a, "x.interned");
        for n in 0..3000 {
            drop(i.name(&format!("x.gone.{n}")));
        }
        assert!(i.len() < 2500, "{} names kept", i.len());
        assert!(Arc::ptr_eq(
            a.0.as_ref().unwrap(),
            i.name("x.interned").0.as_ref().unwrap()
        ));
        assert_eq!(Text::from(""), Text::default());
        assert_eq!(Text::from("id-1"), "id-1");
        assert_eq!(std::mem::size_of::<Text>(), 16);
    }
}
