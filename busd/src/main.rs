//! `busd` entry point: parse flags, run, map the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    match busd::config::Args::try_parse_from(&argv) {
        Ok(args) => busd::run(args),
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let msg = e.kind().to_string();
            let detail = e.to_string();
            let first = detail
                .lines()
                .next()
                .unwrap_or(&msg)
                .trim_start_matches("error: ")
                .to_owned();
            if let Ok(mut pipe) =
                busd::ready::ReadyPipe::from_fd(busd::config::ready_fd_from_argv(&argv))
            {
                pipe.failed(&busd::ready::StartError {
                    kind: busd::ready::FailureKind::Usage,
                    message: first.clone(),
                });
            }
            eprintln!("busd: {first}");
            ExitCode::from(2)
        }
    }
}
