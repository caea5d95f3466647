//! `dws` entry point: everything lives in the library; this maps argv to an
//! exit code.

use std::process::ExitCode;

fn main() -> ExitCode {
    // OS strings: an argument that is not UTF-8 is a usage error (exit 2),
    // not a panic in `std::env::args`.
    dws_client::main_with_os_args(std::env::args_os())
}
