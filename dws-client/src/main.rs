//! `dws` entry point: everything lives in the library; this maps argv to an
//! exit code.

use std::process::ExitCode;

fn main() -> ExitCode {
    dws_client::main_with_args(std::env::args().collect())
}
