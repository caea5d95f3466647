//! The contract's lines, parsed strictly: `[event] ready …` (what a
//! consumer prints once attached) and `[event] exited — …` (its last
//! line), and the exit reasons the contract knows.

/// `[event] ready event_key=<keys joined by ,> bus_pid=<pid> subscribe_id=<id>`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub event_key: String,
    pub bus_pid: i32,
    pub subscribe_id: String,
}

impl Ready {
    pub fn parse(line: &str) -> Result<Ready, String> {
        let rest = line
            .strip_prefix("[event] ready event_key=")
            .ok_or("does not start with `[event] ready event_key=`")?;
        let (keys, rest) = rest.split_once(" bus_pid=").ok_or("no ` bus_pid=`")?;
        let (pid, id) = rest
            .split_once(" subscribe_id=")
            .ok_or("no ` subscribe_id=`")?;
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bus_pid {pid:?} is not a number"));
        }
        if !proto::is_valid_id(id) {
            return Err(format!("subscribe_id {id:?} is not a valid id"));
        }
        if keys.is_empty() || keys.contains(' ') {
            return Err(format!("event_key {keys:?}"));
        }
        Ok(Ready {
            event_key: keys.to_owned(),
            bus_pid: pid.parse().map_err(|e| format!("bus_pid: {e}"))?,
            subscribe_id: id.to_owned(),
        })
    }
}

/// `[event] exited — received <N> event(s) in <S>s (reason: <reason>)`
#[derive(Debug, Clone, PartialEq)]
pub struct Exited {
    pub line: String,
    pub count: u64,
    /// `<S>` exactly as printed.
    pub seconds_text: String,
    pub seconds: f64,
    pub reason: String,
}

/// The exit reasons of the contract.
pub const REASONS: [&str; 8] = [
    "limit",
    "timeout",
    "signal",
    "bus_shutdown",
    "source_lost",
    "halted",
    "taken_over",
    "stopped",
];

impl Exited {
    pub fn parse(line: &str) -> Result<Exited, String> {
        let rest = line
            .strip_prefix("[event] exited \u{2014} received ")
            .ok_or("does not start with `[event] exited — received ` (em dash U+2014)")?;
        let (n, rest) = rest
            .split_once(" event(s) in ")
            .ok_or("no ` event(s) in `")?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("count {n:?} is not a number"));
        }
        let (s, rest) = rest.split_once("s (reason: ").ok_or("no `s (reason: `")?;
        let (int, frac) = s
            .split_once('.')
            .ok_or(format!("seconds {s:?} have no decimal point"))?;
        if int.is_empty()
            || !int.bytes().all(|b| b.is_ascii_digit())
            || frac.len() != 3
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(format!("seconds {s:?} are not <digits>.<3 digits>"));
        }
        let reason = rest.strip_suffix(')').ok_or("does not end with `)`")?;
        if !REASONS.contains(&reason) {
            return Err(format!("unknown reason {reason:?}"));
        }
        Ok(Exited {
            line: line.to_owned(),
            count: n.parse().map_err(|e| format!("count: {e}"))?,
            seconds_text: s.to_owned(),
            seconds: s.parse().map_err(|e| format!("seconds: {e}"))?,
            reason: reason.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contract_lines() {
        let r = Ready::parse("[event] ready event_key=a.b,c.* bus_pid=42 subscribe_id=sub-1")
            .expect("ready");
        assert_eq!(r.event_key, "a.b,c.*");
        assert_eq!(r.bus_pid, 42);
        assert_eq!(r.subscribe_id, "sub-1");
        assert!(Ready::parse("[event] ready event_key=a bus_pid=x subscribe_id=s").is_err());

        let e =
            Exited::parse("[event] exited \u{2014} received 2 event(s) in 0.031s (reason: limit)")
                .expect("exited");
        assert_eq!(
            (e.count, e.seconds_text.as_str(), e.reason.as_str()),
            (2, "0.031", "limit")
        );
        assert!(
            Exited::parse("[event] exited - received 2 event(s) in 0.031s (reason: limit)")
                .is_err()
        );
        assert!(Exited::parse(
            "[event] exited \u{2014} received 2 event(s) in 0.03s (reason: limit)"
        )
        .is_err());
        assert!(Exited::parse(
            "[event] exited \u{2014} received 2 event(s) in 0.031s (reason: bored)"
        )
        .is_err());
    }
}
