//! Colour on a terminal, as cargo does it, and nowhere else: the `Error:`
//! word in bold red, `usage:` and `tip:` in bold, and `--help` in cargo's
//! palette (headings bold green, flags bold cyan). Never on a pipe or a
//! file (a program reading stderr sees exactly the contract's bytes), never
//! with `NO_COLOR` set (no-color.org) or `TERM=dumb`; `CLICOLOR_FORCE`
//! (set, not `0`) forces it. [`wanted`] decides (pure, unit-tested).

use std::{ffi::OsString, io::IsTerminal};

use clap::builder::styling::{AnsiColor, Effects, Styles};

/// Whether to colour a stream that is (`terminal`) or is not a terminal,
/// with the environment `var` gives.
pub fn wanted(terminal: bool, var: impl Fn(&str) -> Option<OsString>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.is_empty());
    if set("NO_COLOR") {
        return false;
    }
    if var("CLICOLOR_FORCE").is_some_and(|v| !v.is_empty() && v != "0") {
        return true;
    }
    terminal && var("TERM").is_none_or(|t| t != "dumb")
}

/// [`wanted`] for stderr in this process.
pub fn on_stderr() -> bool {
    wanted(std::io::stderr().is_terminal(), |v| std::env::var_os(v))
}

/// [`wanted`] for stdout in this process.
pub fn on_stdout() -> bool {
    wanted(std::io::stdout().is_terminal(), |v| std::env::var_os(v))
}

/// Cargo's palette for clap's help and usage.
pub fn styles() -> Styles {
    let bold = |c: AnsiColor| c.on_default().effects(Effects::BOLD);
    Styles::plain()
        .header(bold(AnsiColor::Green))
        .usage(bold(AnsiColor::Green))
        .literal(bold(AnsiColor::Cyan))
        .placeholder(AnsiColor::Cyan.on_default())
        .error(bold(AnsiColor::Red))
        .valid(bold(AnsiColor::Cyan))
        .invalid(bold(AnsiColor::Yellow))
}

const BOLD_RED: &str = "\x1b[1m\x1b[31m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// The one error line as printed: `Error: <message>`, coloured when
/// `colour` (the `Error:` word; in a usage error's message the words
/// `usage:` and `tip:`).
pub fn error_line(message: &str, colour: bool) -> String {
    if !colour {
        return format!("Error: {message}");
    }
    let mut m = message.to_owned();
    for word in ["usage:", "tip:"] {
        m = m.replace(&format!("; {word} "), &format!("; {BOLD}{word}{RESET} "));
    }
    format!("{BOLD_RED}Error:{RESET} {m}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn colour_on_a_terminal_only_and_never_with_no_color() {
        assert!(wanted(true, env(&[])));
        assert!(!wanted(false, env(&[])), "a pipe or a file");
        assert!(!wanted(true, env(&[("NO_COLOR", "1")])));
        assert!(
            wanted(true, env(&[("NO_COLOR", "")])),
            "an empty NO_COLOR is unset"
        );
        assert!(!wanted(true, env(&[("TERM", "dumb")])));
        assert!(wanted(false, env(&[("CLICOLOR_FORCE", "1")])));
        assert!(!wanted(false, env(&[("CLICOLOR_FORCE", "0")])));
        assert!(!wanted(
            false,
            env(&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")])
        ));
    }

    #[test]
    fn the_error_word_and_usage_are_coloured_only_when_asked() {
        let m = "unexpected argument '--x' found; tip: a similar argument exists; usage: dws event";
        assert_eq!(error_line(m, false), format!("Error: {m}"));
        let c = error_line(m, true);
        assert!(
            c.starts_with("\x1b[1m\x1b[31mError:\x1b[0m unexpected"),
            "{c:?}"
        );
        assert!(c.contains("; \x1b[1musage:\x1b[0m dws"), "{c:?}");
        assert!(c.contains("; \x1b[1mtip:\x1b[0m a similar"), "{c:?}");
    }
}
