//! A bus pointed at the fake: the `[profiles.default]` lines of a profile
//! whose app stream (`source = "dingtalk"`) or personal stream (`source =
//! "personal"`) is this fake, the backoff knobs that keep reconnects within
//! a test's patience, and a [`TestEnv`] set up with both.

use std::ffi::OsString;

use super::FakeDingTalk;
use crate::TestEnv;

/// The reconnect backoff of a bus under test: 100 ms to 1 s.
pub const FAST_BACKOFF: [(&str, &str); 2] = [
    ("DWS_DINGTALK_BACKOFF_MIN_MS", "100"),
    ("DWS_DINGTALK_BACKOFF_MAX_MS", "1000"),
];

impl FakeDingTalk {
    /// The profile lines of the app stream on this fake: its client id and
    /// secret, `open_api` its base URL, then `extra` (whole lines, e.g.
    /// `"max_attempts = 0\n"`).
    pub fn app_profile(&self, extra: &str) -> String {
        self.app_profile_at(&self.base_url(), extra)
    }

    /// [`FakeDingTalk::app_profile`] reached at `open_api` (a TLS front
    /// before this fake).
    pub fn app_profile_at(&self, open_api: &str, extra: &str) -> String {
        format!(
            "source = \"dingtalk\"\nclient_id = \"{}\"\nclient_secret = \"{}\"\nopen_api = \"{open_api}\"\n{extra}",
            self.client_id(),
            self.client_secret(),
        )
    }

    /// The profile lines of the personal stream on this fake: `mcp_base`
    /// its base URL, the user's token in `token_file`, then `extra` (which
    /// names the `client_id`, as the personal source requires).
    pub fn personal_profile(&self, token_file: &str, extra: &str) -> String {
        personal_profile_at(&self.base_url(), token_file, extra)
    }
}

/// The personal-stream profile lines for an MCP base `mcp_base` (the fake,
/// or a TLS front before it), see [`FakeDingTalk::personal_profile`].
pub fn personal_profile_at(mcp_base: &str, token_file: &str, extra: &str) -> String {
    format!(
        "source = \"personal\"\nmcp_base = \"{mcp_base}\"\naccess_token_file = \"{token_file}\"\n{extra}"
    )
}

/// [`FAST_BACKOFF`] with `knobs` added; a knob of the same name replaces
/// the default.
pub fn fast_backoff_with<K: AsRef<str>, V: AsRef<str>>(knobs: &[(K, V)]) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = FAST_BACKOFF
        .iter()
        .filter(|(k, _)| !knobs.iter().any(|(k2, _)| k2.as_ref() == *k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.extend(
        knobs
            .iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())),
    );
    vars
}

/// A [`TestEnv`] whose bus has [`fast_backoff_with`]`(knobs)` and whose
/// default profile is `section` (see [`FakeDingTalk::app_profile`]).
pub fn dingtalk_env<K: AsRef<str>, V: AsRef<str>>(section: &str, knobs: &[(K, V)]) -> TestEnv {
    let vars: Vec<(OsString, OsString)> = fast_backoff_with(knobs)
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let env = TestEnv::with_env(&vars);
    env.write_default_profile(section);
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_replace_the_default_backoff_and_add_to_it() {
        let none: [(&str, &str); 0] = [];
        assert_eq!(
            fast_backoff_with(&none),
            [
                ("DWS_DINGTALK_BACKOFF_MIN_MS".into(), "100".into()),
                ("DWS_DINGTALK_BACKOFF_MAX_MS".into(), "1000".into())
            ]
        );
        let v = fast_backoff_with(&[("DWS_DINGTALK_BACKOFF_MIN_MS", "1000"), ("X", "1")]);
        assert_eq!(
            v,
            [
                (
                    "DWS_DINGTALK_BACKOFF_MAX_MS".to_string(),
                    "1000".to_string()
                ),
                ("DWS_DINGTALK_BACKOFF_MIN_MS".into(), "1000".into()),
                ("X".into(), "1".into())
            ]
        );
    }

    #[test]
    fn a_personal_profile_names_the_fake_and_the_token_file() {
        assert_eq!(
            personal_profile_at("http://127.0.0.1:9", "token", "client_id = \"c\"\n"),
            "source = \"personal\"\nmcp_base = \"http://127.0.0.1:9\"\naccess_token_file = \"token\"\nclient_id = \"c\"\n"
        );
    }
}
