//! The short strings a logged event carries, held compactly: [`Name`] is
//! an interned, shared string (event types, routes and dedup scopes repeat
//! across events: one copy each, 16 bytes per event), [`Text`] an own
//! string that costs 16 bytes and no allocation when empty (event ids).

use std::{
    collections::HashSet,
    fmt,
    ops::Deref,
    sync::{Arc, Mutex},
};

#[derive(Default)]
struct Interner {
    names: HashSet<Arc<str>>,
    /// Prune names no event holds once the set grows past this.
    prune_at: usize,
}

static INTERNER: Mutex<Option<Interner>> = Mutex::new(None);

fn intern(s: &str) -> Arc<str> {
    let mut g = INTERNER.lock().unwrap_or_else(|p| p.into_inner());
    let i = g.get_or_insert_with(Interner::default);
    if let Some(hit) = i.names.get(s) {
        return hit.clone();
    }
    if i.names.len() >= i.prune_at {
        i.names.retain(|n| Arc::strong_count(n) > 1);
        i.prune_at = (i.names.len() * 2).max(1024);
    }
    let n: Arc<str> = Arc::from(s);
    i.names.insert(n.clone());
    n
}

/// An interned string: equal names share one allocation; the empty name
/// (no route, no scope) none, and no look-up.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Option<Arc<str>>);

impl Name {
    pub fn new(s: &str) -> Name {
        Name((!s.is_empty()).then(|| intern(s)))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
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
        let a = Name::from("x.interned");
        let b = Name::from(String::from("x.interned"));
        assert!(Arc::ptr_eq(a.0.as_ref().unwrap(), b.0.as_ref().unwrap()));
        assert_eq!(Name::new(""), Name::default());
        assert_eq!(std::mem::size_of::<Name>(), 16);
        assert_eq!(a, "x.interned");
        for i in 0..3000 {
            drop(Name::from(format!("x.gone.{i}")));
        }
        let n = INTERNER.lock().unwrap().as_ref().unwrap().names.len();
        assert!(n < 2500, "{n} names kept");
        assert!(Arc::ptr_eq(
            a.0.as_ref().unwrap(),
            Name::new("x.interned").0.as_ref().unwrap()
        ));
        assert_eq!(Text::from(""), Text::default());
        assert_eq!(Text::from("id-1"), "id-1");
        assert_eq!(std::mem::size_of::<Text>(), 16);
    }
}
