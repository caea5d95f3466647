//! `busd` entry point: parse flags, run, map the outcome to an exit code
//! ([`busd::exit`]).

use std::process::ExitCode;

use busd::exit::Failure;

fn main() -> ExitCode {
    // The `--where` filter worker busd starts for itself: nothing else runs.
    if std::env::args_os().nth(1).as_deref() == Some(busd::where_filter::worker::ARG.as_ref()) {
        return busd::where_filter::worker::main();
    }
    let argv: Vec<String> = std::env::args().collect();
    match busd::config::Args::parse_from_argv(&argv) {
        Ok(busd::config::Args {
            generate_man: Some(dir),
            ..
        }) => match busd::config::write_man_page(&dir) {
            Ok(page) => {
                println!("{}", page.display());
                ExitCode::SUCCESS
            }
            Err(source) => Failure::ManPage { dir, source }.exit(),
        },
        Ok(args) if args.doctor || args.print_socket_path => {
            let uid = nix::unistd::geteuid().as_raw();
            let env = proto::paths::Env::from_process(uid);
            match proto::paths::resolve(args.profile.as_deref(), &env) {
                Ok(ep) if args.print_socket_path => {
                    println!("{}", ep.socket_path.display());
                    ExitCode::SUCCESS
                }
                Ok(ep) => busd::doctor::run(&ep.config_root, &ep.profile),
                Err(e) => Failure::from(e).exit(),
            }
        }
        Ok(args) => {
            // Before any thread starts: a supervised run reports `starting`.
            let notifier = busd::notify::Notifier::init(args.foreground, args.profile.as_deref());
            busd::run(args, notifier)
        }
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
            let first = busd::config::name_the_variable(&first, &argv);
            if let Ok(mut pipe) =
                busd::ready::ReadyPipe::from_fd(busd::config::ready_fd_from_argv(&argv))
            {
                pipe.failed(&busd::ready::StartError::usage(first.clone()));
            }
            Failure::Usage(first).exit()
        }
    }
}
