//! The filter worker: `busd` started by busd with [`ARG`], which judges
//! events for `--where` and nothing else. It sets its own limits first
//! (memory, no core file, a lower priority, killed with its parent), then
//! reads requests on stdin and answers on stdout (`wire`). Each event's
//! evaluation runs under a CPU timer ([`super::limits::CPU_BUDGET`]): past
//! it the kernel ends the process with `SIGPROF`, which busd reads as the
//! event's failure. An allocation past the memory bound ends it too
//! (Rust aborts). Whatever ends it, busd starts another.

use std::{
    collections::HashMap,
    io::{self, Read, Write},
    process::ExitCode,
    time::Duration,
};

use nix::{
    libc,
    sys::resource::{setrlimit, Resource},
};
use proto::where_expr::{Input, Program};

use super::{
    limits::{CPU_BUDGET, MAX_PROGRAMS_PER_WORKER, WORKER_MEMORY, WORKER_NICE},
    wire::{self, Answer, Request},
    Verdict, WhereFailure,
};

/// The first argument that makes `busd` a filter worker.
pub const ARG: &str = "__where-worker";

/// The event as expressions see it, from its encoding (bytes that do not
/// decode are an empty event).
pub fn input_of(encoded: &[u8]) -> Input {
    use prost::Message;
    let e = proto::v1::Event::decode(encoded).unwrap_or_default();
    Input::of(&e)
}

/// The worker's `main`: exit 0 at the end of its input, 3 when a limit
/// cannot be set or the input is not frames.
pub fn main() -> ExitCode {
    if let Err(e) = set_limits() {
        eprintln!("busd filter worker: cannot set its limits: {e}");
        return ExitCode::from(3);
    }
    match serve(io::stdin().lock(), io::stdout().lock(), Some(CPU_BUDGET)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("busd filter worker: {e}");
            ExitCode::from(3)
        }
    }
}

fn set_limits() -> nix::Result<()> {
    // Ends with busd (the thread that started it: the filter thread).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    if nix::unistd::getppid().as_raw() == 1 {
        // busd is already gone.
        std::process::exit(0);
    }
    setrlimit(Resource::RLIMIT_DATA, WORKER_MEMORY, WORKER_MEMORY)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    // SAFETY: setpriority has no memory effects; a failure only leaves
    // the priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, WORKER_NICE);
    }
    Ok(())
}

/// Arms (or, with zero, disarms) the CPU timer whose expiry ends the
/// process (`SIGPROF`'s default action).
fn cpu_timer(budget: Duration) {
    let value = libc::timeval {
        tv_sec: budget.as_secs() as libc::time_t,
        tv_usec: budget.subsec_micros() as libc::suseconds_t,
    };
    let t = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: value,
    };
    // SAFETY: a valid itimerval; the old value is not asked for.
    unsafe {
        libc::setitimer(libc::ITIMER_PROF, &t, std::ptr::null_mut());
    }
}

fn cpu_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

fn bad(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Answers requests until the end of `input`, each evaluation under the
/// CPU timer when `budget` is given (the timer is the whole process's: a
/// unit test gives none).
fn serve(mut input: impl Read, mut output: impl Write, budget: Option<Duration>) -> io::Result<()> {
    let mut programs: HashMap<Vec<String>, Option<Program>> = HashMap::new();
    let mut current: Option<Vec<String>> = None;
    let mut body = Vec::new();
    let mut out = Vec::with_capacity(64);
    loop {
        let mut len = [0u8; 4];
        match input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > wire::MAX_BODY {
            return Err(bad("a frame over its bound"));
        }
        body.resize(len, 0);
        input.read_exact(&mut body)?;
        match wire::request(&body).map_err(bad)? {
            Request::Program(exprs) => {
                let key: Vec<String> = exprs.iter().map(|s| s.to_string()).collect();
                if programs.len() >= MAX_PROGRAMS_PER_WORKER && !programs.contains_key(&key) {
                    programs.clear();
                }
                programs
                    .entry(key.clone())
                    .or_insert_with(|| Program::compile(&key).ok());
                current = Some(key);
            }
            Request::Eval { seq, event } => {
                let program = current.as_ref().and_then(|k| programs.get(k)?.as_ref());
                let input = input_of(event);
                let start = cpu_now();
                let verdict = match program {
                    Some(p) => {
                        if let Some(b) = budget {
                            cpu_timer(b);
                        }
                        let v = Verdict::of(p.matches(&input.0));
                        if budget.is_some() {
                            cpu_timer(Duration::ZERO);
                        }
                        v
                    }
                    None => Verdict::Failed(WhereFailure::Crashed),
                };
                let cpu_ns = u64::try_from((cpu_now() - start).as_nanos()).unwrap_or(u64::MAX);
                // The input goes before the answer: its memory is free
                // again by the time busd sends the next event.
                drop(input);
                out.clear();
                wire::answer(
                    &mut out,
                    &Answer {
                        seq,
                        verdict,
                        cpu_ns,
                    },
                );
                output.write_all(&out)?;
                output.flush()?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn requests_are_answered_in_order_until_the_input_ends() {
        let ev = |seq: u64, data: &str| {
            proto::v1::Event {
                seq,
                event_type: "a".into(),
                data: data.into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let mut input = Vec::new();
        // An eval before any program: no answer but a failure.
        wire::eval(&mut input, 1, &ev(1, "{}"));
        wire::program(&mut input, &[".data.n > 1".into()]);
        wire::eval(&mut input, 2, &ev(2, r#"{"n":2}"#));
        wire::eval(&mut input, 3, &ev(3, r#"{"n":1}"#));
        wire::eval(&mut input, 4, &ev(4, "text"));
        // A program that does not compile (busd never sends one).
        wire::program(&mut input, &[".a ==".into()]);
        wire::eval(&mut input, 5, &ev(5, "{}"));
        let mut output = Vec::new();
        serve(&input[..], &mut output, None).unwrap();
        let mut verdicts = vec![];
        let mut at = 0;
        while let Some((body, used)) = wire::split(&output[at..]).unwrap() {
            let a = wire::read_answer(body).unwrap();
            verdicts.push((a.seq, a.verdict));
            at += used;
        }
        assert_eq!(
            verdicts,
            [
                (1, Verdict::Failed(WhereFailure::Crashed)),
                (2, Verdict::Match),
                (3, Verdict::NoMatch),
                (4, Verdict::Failed(WhereFailure::Raised)),
                (5, Verdict::Failed(WhereFailure::Crashed)),
            ]
        );
    }
}
