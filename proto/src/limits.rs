//! The bounds both binaries enforce, in one place: the bus refuses what is
//! over them with a clear error, and the client checks the same numbers
//! before it sends anything. See docs/guide.md ("Limits").

use crate::codec::MAX_FRAME_LEN;

/// Most event-key patterns in one subscription.
pub const MAX_PATTERNS: usize = 256;
/// How long an explicit-ack consumer's event may stay unacked before it is
/// delivered again, when neither the consumer nor its subscription says.
pub const DEFAULT_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Longest `--filter` regex, in bytes.
pub const MAX_FILTER_LEN: usize = 4096;
/// Compiled size limit of a `--filter` regex (the regex crate's own bound).
pub const MAX_FILTER_COMPILED: usize = 1 << 20;
/// Longest event id, in bytes.
pub const MAX_EVENT_ID_LEN: usize = 256;
/// The largest credit window a consumer may ask for
/// (`consume --max-in-flight`, `DWS_EVENT_BUS_WINDOW`).
pub const MAX_WINDOW: u32 = 65_536;

/// Most subscriptions one bus holds.
pub const MAX_SUBSCRIPTIONS: usize = 4096;
/// What a delivery adds to a stored event: the frame tags, the subscription
/// id (at most 64 bytes) and the redelivered flag, with room to spare.
pub const DELIVERY_OVERHEAD: usize = 128;
/// The largest encoded event the bus accepts: every delivery of it must fit
/// in one frame, so an event that is acked is also deliverable.
pub const MAX_EVENT_ENCODED: usize = MAX_FRAME_LEN - DELIVERY_OVERHEAD;
/// The most data one published event carries (`dws event publish`), leaving
/// room for the frame's other fields under the frame limit.
pub const MAX_PUBLISH_DATA: usize = MAX_FRAME_LEN - 64 * 1024;

/// Most steps of a redelivery backoff (`--backoff 1s,10s,1m`).
pub const MAX_BACKOFF_STEPS: usize = 16;
/// The longest step of a redelivery backoff: one day.
pub const MAX_BACKOFF_STEP_MS: u64 = 24 * 60 * 60 * 1000;
/// Most characters of a `term` reason the bus keeps.
pub const MAX_TERM_REASON_CHARS: usize = 256;

/// The longest duration accepted anywhere a user gives one (flags, env,
/// `config.toml`): 100 years. Longer ones are refused with a clear error,
/// so no timer computes a deadline past what `Instant` can hold.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(100 * 31_557_600);

/// `d` (the value of `what`), unless it is over [`MAX_DURATION`].
pub fn check_duration(what: &str, d: std::time::Duration) -> Result<std::time::Duration, String> {
    if d > MAX_DURATION {
        return Err(format!(
            "{what} is longer than the longest duration accepted (100 years)"
        ));
    }
    Ok(d)
}

/// `Subscribe.ttl_ms` meaning "lives until removed" (`--ttl never`).
pub const TTL_NEVER_MS: u64 = u64::MAX;

/// The TTL `Subscribe.ttl_ms` (or a stored record) asks for: `None` for 0
/// (the bus decides), `Duration::MAX` for [`TTL_NEVER_MS`] (never expires).
pub fn ttl_from_ms(ms: u64) -> Option<std::time::Duration> {
    match ms {
        0 => None,
        TTL_NEVER_MS => Some(std::time::Duration::MAX),
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}

/// The inverse of [`ttl_from_ms`]: `Duration::MAX` (or anything too long
/// for a u64 of milliseconds) is [`TTL_NEVER_MS`].
pub fn ttl_to_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(TTL_NEVER_MS)
}

/// The highest seq a bus ever assigns: 2^63 − 1, what a PostgreSQL
/// `bigint` holds. A store whose head is beyond it is refused at start; at
/// it, publishes are refused: a seq never wraps.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// The backoff rule: at most [`MAX_BACKOFF_STEPS`] steps, each at most
/// [`MAX_BACKOFF_STEP_MS`] (a step of 0 is allowed: at once).
pub fn check_backoff(steps_ms: &[u64]) -> Result<(), String> {
    if steps_ms.len() > MAX_BACKOFF_STEPS {
        return Err(format!(
            "--backoff has {} steps; at most {MAX_BACKOFF_STEPS}",
            steps_ms.len()
        ));
    }
    match steps_ms.iter().find(|&&ms| ms > MAX_BACKOFF_STEP_MS) {
        Some(ms) => Err(format!(
            "--backoff step {ms} ms is longer than one day ({MAX_BACKOFF_STEP_MS} ms)"
        )),
        None => Ok(()),
    }
}

/// How much of a user's input an error message repeats.
pub const ECHO_CHARS: usize = 100;

/// Shortens user input echoed in an error message: at most `max` chars,
/// then how long it really was.
pub fn clip_to(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…({} bytes)", &s[..at], s.len()),
    }
}

/// User input for an error message: unchanged up to [`ECHO_CHARS`]
/// characters, else its start and `…(N bytes)`.
pub fn clip(s: &str) -> String {
    clip_to(s, ECHO_CHARS)
}

/// User input quoted like `{:?}` for an error message: `"abc"`, or for long
/// input its first [`ECHO_CHARS`] characters quoted and `…(N bytes)` after
/// the closing quote.
pub fn quoted(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => format!("{s:?}"),
        Some((at, _)) => format!("{:?}…({} bytes)", &s[..at], s.len()),
    }
}

/// The subscription-id rule (`[A-Za-z0-9._-]{1,64}`) with its message;
/// `what` names the id in it (`--subscribe-id`, `subscription id`).
pub fn check_subscription_id(what: &str, id: &str) -> Result<(), String> {
    if crate::is_valid_id(id) {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} {}: use 1-64 characters from A-Z a-z 0-9 . _ -",
            quoted(id)
        ))
    }
}

/// The event-id rule: 1 to [`MAX_EVENT_ID_LEN`] bytes.
pub fn check_event_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_EVENT_ID_LEN {
        Err(format!(
            "event id must be 1-{MAX_EVENT_ID_LEN} bytes (got {})",
            id.len()
        ))
    } else {
        Ok(())
    }
}

/// Characters an id a person types may not hold: control characters
/// (newline, BEL, …) and the bidirectional-text controls (an RTL override
/// makes an id read as another); anything else prints as itself.
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// An id given on the command line (`--id`, `--id-prefix`, named by
/// `what`): non-empty and printable ([`unprintable`]), so the ids a bus
/// shows are unambiguous.
pub fn check_printable_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(format!("{what} is empty: give at least one character"));
    }
    match id.chars().find(|&c| unprintable(c)) {
        Some(c) => Err(format!(
            "{what} {} holds the control character U+{:04X}: use printable characters",
            quoted(id),
            c as u32
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_typed_id_is_printable_and_not_empty() {
        use super::check_printable_id as check;
        for bad in [
            "",
            "a\nb",
            "bell\u{7}",
            "ab\u{202E}cd",
            "\u{2066}x",
            "tab\t",
        ] {
            assert!(check("--id-prefix", bad).is_err(), "{bad:?}");
        }
        for good in ["a", "job-7", "事件", "é", "a b"] {
            assert_eq!(check("--id", good), Ok(()), "{good:?}");
        }
        let e = check("--id-prefix", "a\nb").unwrap_err();
        assert!(e.contains("U+000A") && e.contains("--id-prefix"), "{e}");
    }

    #[test]
    fn a_ttl_round_trips_through_milliseconds() {
        use std::time::Duration;
        assert_eq!(super::ttl_from_ms(0), None);
        for d in [Duration::from_secs(600), Duration::MAX, super::MAX_DURATION] {
            assert_eq!(super::ttl_from_ms(super::ttl_to_ms(d)), Some(d));
        }
    }

    #[test]
    fn durations_over_a_century_are_refused() {
        use std::time::Duration;
        assert_eq!(
            super::check_duration("x", super::MAX_DURATION),
            Ok(super::MAX_DURATION)
        );
        let err = super::check_duration("--ttl", Duration::MAX).unwrap_err();
        assert!(
            err.starts_with("--ttl is longer") && err.contains("100 years"),
            "{err}"
        );
        assert!(std::time::Instant::now()
            .checked_add(super::MAX_DURATION)
            .is_some());
    }

    use super::*;

    #[test]
    fn the_id_and_type_rules_say_what_is_wrong() {
        assert!(check_subscription_id("--id", "s.1_x-Y").is_ok());
        let e = check_subscription_id("--id", "a b").unwrap_err();
        assert_eq!(
            e,
            "invalid --id \"a b\": use 1-64 characters from A-Z a-z 0-9 . _ -"
        );
        assert!(check_event_id("").is_err());
        assert!(check_event_id(&"x".repeat(257))
            .unwrap_err()
            .contains("1-256"));
    }

    #[test]
    fn the_backoff_rule_bounds_steps_and_their_length() {
        assert!(check_backoff(&[]).is_ok());
        assert!(check_backoff(&[0, 1000, MAX_BACKOFF_STEP_MS]).is_ok());
        assert!(check_backoff(&[MAX_BACKOFF_STEP_MS + 1])
            .unwrap_err()
            .contains("one day"));
        assert!(check_backoff(&[1; MAX_BACKOFF_STEPS + 1])
            .unwrap_err()
            .contains("at most 16"));
    }

    #[test]
    fn clip_keeps_short_input_and_cuts_long_input_on_a_char_boundary() {
        assert_eq!(clip_to("abc", 5), "abc");
        assert_eq!(clip_to("ééé", 2), "éé…(6 bytes)");
        assert!(clip(&"x".repeat(1 << 20)).len() < 200);
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
    }
}
