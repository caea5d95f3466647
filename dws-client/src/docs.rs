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

/// Prints the completion script for one shell.
pub fn completions(args: CompletionsArgs) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "dws", &mut out);
    print_stdout(&String::from_utf8_lossy(&out))
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
    let mut cmd = Cli::command();
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
    written.push(page.generate_to(dir)?);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        write_tree(sub, dir, written)?;
    }
    Ok(())
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
