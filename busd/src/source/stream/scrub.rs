//! Redaction of secrets (credentials, tokens, tickets) in text that is about
//! to be logged, stored in the source state or shown to a consumer.

/// The secrets known so far and the text they are replaced by.
#[derive(Clone, Default)]
pub struct Scrub {
    needles: Vec<String>,
}

impl Scrub {
    pub fn new(secret: &str) -> Scrub {
        let mut s = Scrub::default();
        s.add(secret);
        s
    }

    /// Adds a value to hide, with the forms it takes in a URL query
    /// (form-encoded, and with `%20` for spaces). Very short values are not
    /// worth mangling messages for.
    pub fn add(&mut self, value: &str) {
        if value.len() < 4 || self.needles.iter().any(|n| n == value) {
            return;
        }
        let form: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        // Form encoding writes a space as `+` and a `+` as `%2B`: every `+`
        // left is a space.
        let percent = form.replace('+', "%20");
        for n in [form, percent] {
            if n != value && !self.needles.contains(&n) {
                self.needles.push(n);
            }
        }
        self.needles.push(value.to_owned());
    }

    /// Adds every value of `other`.
    pub fn extend(&mut self, other: &Scrub) {
        for n in &other.needles {
            if !self.needles.contains(n) {
                self.needles.push(n.clone());
            }
        }
    }

    pub fn clean(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for n in &self.needles {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), "<redacted>");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_secrets_and_their_url_forms() {
        let mut s = Scrub::new("s3cr3t/+=");
        s.add("tick-et 1");
        s.add("abc"); // too short to bother
        let text = "a s3cr3t/+= b s3cr3t%2F%2B%3D c tick-et%201 d tick-et 1 e tick-et+1 abc";
        assert_eq!(
            s.clean(text),
            "a <redacted> b <redacted> c <redacted> d <redacted> e <redacted> abc"
        );
        let mut t = Scrub::default();
        t.extend(&s);
        assert_eq!(t.clean("s3cr3t/+="), "<redacted>");
    }
}
