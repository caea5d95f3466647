//! `dws completions SHELL` and `dws manpages DIR`: shell completion scripts
//! and man pages generated from the clap definitions in [`crate::cli`], so
//! they can never disagree with `--help`. busd's own page comes from
//! `busd --generate-man DIR`.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::{
    cli::{Cli, CompletionsArgs, ManpagesArgs, VERSION},
    exit::{CliError, Result},
    print_stdout,
};

/// Prints the completion script for one shell: clap's, plus (bash, fish)
/// completion of subscription ids from the running bus.
pub fn completions(args: CompletionsArgs) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "dws", &mut out);
    let mut text = String::from_utf8_lossy(&out).into_owned();
    match args.shell {
        clap_complete::Shell::Bash => text.push_str(BASH_IDS),
        clap_complete::Shell::Fish => text.push_str(FISH_IDS),
        _ => {}
    }
    print_stdout(&text)
}

/// Bash: `--subscribe-id`, `unsubscribe` and `subscription VERB` complete
/// the running bus's subscription ids; everything else is clap's `_dws`.
const BASH_IDS: &str = r#"
# Subscription ids from the running bus (never starts one).
_dws_subscription_ids() {
    local profile=() i
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ "${COMP_WORDS[i]}" == --profile ]] && profile=(--profile "${COMP_WORDS[i+1]}")
    done
    "${COMP_WORDS[0]}" "${profile[@]}" event __subscription-ids 2>/dev/null
}
_dws_ids() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local sub="${COMP_WORDS[2]}"
    if [[ "$prev" == --subscribe-id ]] ||
        { [[ "${COMP_WORDS[1]}" == event && "$cur" != -* ]] &&
            { [[ "$sub" == unsubscribe && COMP_CWORD -ge 3 ]] ||
                [[ "$sub" == subscription && COMP_CWORD -ge 4 && "$prev" != --* ]]; }; }; then
        COMPREPLY=($(compgen -W "$(_dws_subscription_ids)" -- "$cur"))
        return 0
    fi
    _dws "$@"
}
complete -F _dws_ids -o bashdefault -o default dws
"#;

/// Fish: the same ids as candidates of `--subscribe-id`, `unsubscribe`
/// and `subscription VERB`.
const FISH_IDS: &str = r#"
# Subscription ids from the running bus (never starts one).
function __fish_dws_subscription_ids
    dws event __subscription-ids 2>/dev/null
end
complete -c dws -l subscribe-id -x -a "(__fish_dws_subscription_ids)"
complete -c dws -n "__fish_seen_subcommand_from unsubscribe" -x -a "(__fish_dws_subscription_ids)"
complete -c dws -n "__fish_seen_subcommand_from subscription; and __fish_seen_subcommand_from restart skip disable enable seek parked replay-parked info" -x -a "(__fish_dws_subscription_ids)"
"#;

/// `dws event __subscription-ids`: the running bus's subscription ids, one
/// a line; nothing (and exit 0) without a bus or on any error, so a
/// completion never prints noise.
pub async fn subscription_ids(endpoint: &proto::paths::Endpoint) -> Result<()> {
    let Ok(Some(fetched)) = crate::status::fetch(endpoint).await else {
        return Ok(());
    };
    let mut text = String::new();
    for s in &fetched.doc.subscriptions {
        text.push_str(&s.id);
        text.push('\n');
    }
    print_stdout(&text)
}

/// Writes every page into `args.dir` and prints their paths, one a line.
pub fn manpages(args: ManpagesArgs) -> Result<()> {
    let written = write_manpages(&args.dir).map_err(|e| {
        CliError::runtime(format!(
            "cannot write man pages into {}: {e}",
            crate::exit::clip(&args.dir.to_string_lossy())
        ))
    })?;
    let mut text = String::new();
    for p in written {
        text.push_str(&p.to_string_lossy());
        text.push('\n');
    }
    print_stdout(&text)
}

/// `dws.1` and one page per (sub)command, named after its path
/// (`dws-event-consume.1`); the `help` subcommands get none.
pub fn write_manpages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // No `help` subcommand: it would be listed as a `dws-help(1)` page that
    // is never written.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Sets every subcommand's display name (`dws-event-consume`).
    cmd.build();
    let mut written = Vec::new();
    write_tree(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_tree(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let page = clap_mangen::Man::new(cmd.clone())
        .source(format!("dws {VERSION}"))
        .manual("dws event bus");
    let path = dir.join(page.get_filename());
    let mut text = Vec::new();
    page.render_title(&mut text)?;
    page.render_name_section(&mut text)?;
    page.render_synopsis_section(&mut text)?;
    page.render_description_section(&mut text)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        page.render_options_section(&mut text)?;
    }
    if cmd.has_subcommands() {
        page.render_subcommands_section(&mut text)?;
    }
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    text.extend_from_slice(exit_status_section().as_bytes());
    if let Some(examples) = examples(name) {
        text.extend_from_slice(examples_section(examples).as_bytes());
    }
    if cmd.get_version().is_some() {
        page.render_version_section(&mut text)?;
    }
    std::fs::write(&path, text)?;
    written.push(path);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

/// Text as a roff line: backslashes, hyphens and a leading control
/// character escaped.
fn roff_text(t: &str) -> String {
    let t = t.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// EXIT STATUS, the same table for every page (`exit.rs`).
fn exit_status_section() -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in crate::exit::TABLE {
        s.push_str(&format!(".TP\n{code}\n{}\n", roff_text(meaning)));
    }
    s.push_str(&format!(
        ".PP\n{}\n",
        roff_text("Every failure prints exactly one line starting with Error: on stderr.")
    ));
    s
}

fn examples_section(examples: &[(&str, &str)]) -> String {
    let mut s = String::from(".SH EXAMPLES\n");
    for (what, cmd) in examples {
        s.push_str(&format!(
            ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
            roff_text(what),
            roff_text(cmd)
        ));
    }
    s
}

/// The examples of a page, by its name.
fn examples(page: &str) -> Option<&'static [(&'static str, &'static str)]> {
    Some(match page {
        "dws" | "dws-event" => &[
            (
                "Stream events as NDJSON until two have arrived:",
                "dws event consume 'demo.*' --max-events 2",
            ),
            ("Publish one:", "dws event publish demo.hello '{\"n\":1}'"),
            ("See the bus and its subscriptions:", "dws event status"),
        ],
        "dws-event-consume" => &[
            (
                "Every event of two types, one JSON line each, until interrupted:",
                "dws event consume im.message approval.created",
            ),
            (
                "A durable subscription that resumes where it stopped, acking on stdin:",
                "dws event consume --subscribe-id agent --ack explicit --ack-wait 30s",
            ),
            (
                "One event, then exit 0 with reason limit:",
                "dws event consume 'demo.*' --max-events 1 --format raw",
            ),
        ],
        "dws-event-publish" => &[
            (
                "Publish with an id, so a retry is not appended twice:",
                "dws event publish demo.hello '{\"n\":1}' --id order-42",
            ),
            ("Payload from stdin:", "echo '{\"n\":2}' | dws event publish demo.hello -"),
        ],
        "dws-event-status" => &[
            ("A table of the bus, its consumers and subscriptions:", "dws event status"),
            (
                "Metrics for node_exporter's textfile collector, every minute from cron:",
                "dws event status --format prometheus > /var/lib/node_exporter/dws.prom.$$ && mv /var/lib/node_exporter/dws.prom.$$ /var/lib/node_exporter/dws.prom",
            ),
            ("Watch it refresh:", "dws event status --watch --interval 1s"),
        ],
        "dws-event-subscribe" => &[(
            "A named subscription that keeps events while nobody is attached:",
            "dws event subscribe 'im.*' --id agent --max-deliver 5 --on-poison park",
        )],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_for_dws_and_each_event_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_manpages(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "dws.1",
            "dws-event.1",
            "dws-event-consume.1",
            "dws-event-publish.1",
            "dws-event-status.1",
            "dws-event-stop.1",
            "dws-event-subscribe.1",
            "dws-event-unsubscribe.1",
            "dws-completions.1",
            "dws-manpages.1",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        let consume = std::fs::read_to_string(dir.path().join("dws-event-consume.1")).unwrap();
        assert!(consume.contains(".TH dws-event-consume 1"), "{consume}");
        assert!(
            consume.contains("kill \\-9"),
            "the long help is the description"
        );
        assert!(consume.contains(".SH \"EXIT STATUS\""), "{consume}");
        assert!(consume.contains(".SH EXAMPLES"), "{consume}");
        assert!(consume.contains("dws event consume \\-\\-subscribe\\-id agent"));
        for page in &written {
            let text = std::fs::read_to_string(page).unwrap();
            assert!(!text.contains("dws\\-help"), "{}: {text}", page.display());
            // Every page another page names exists.
            for name in text.split(|c: char| c.is_whitespace() || c == ',') {
                if let Some(base) = name.strip_suffix("(1)") {
                    let file = format!("{}.1", base.replace("\\-", "-"));
                    assert!(
                        names.contains(&file),
                        "{} names {file}, not written",
                        page.display()
                    );
                }
            }
        }
    }

    #[test]
    fn completion_scripts_name_the_subcommands() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
            clap_complete::Shell::Elvish,
            clap_complete::Shell::PowerShell,
        ] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "dws", &mut out);
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.contains("consume") && text.contains("max-events"),
                "{shell}"
            );
        }
    }
}
