//! `dws event publish --lines`: one real `dws` process fed N lines of
//! 256 B on stdin (pipelined over one connection), into a fresh bus on the
//! fsync disk store with no consumers. Events/s is N over the whole run of
//! `dws`, from its start (connecting included) to its exit, after its
//! summary said every line was published; the median of `--durable-runs`.

use std::time::Duration;

use serde_json::Value;

use crate::{
    durable::{median_of, start_bus},
    opts::{Opts, StoreSel},
    procs::{guarded, BusEnv},
    Res, EVENT_TYPE,
};

/// Bound of one `dws event publish --lines` run.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// The line size of the row.
const SIZE: usize = 256;

pub struct LinesResult {
    pub rate: f64,
    pub secs: f64,
}

/// `lines` lines of `size` bytes: `<index> ` padded with `x`.
fn input(lines: u64, size: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(lines as usize * (size + 1));
    for i in 0..lines {
        let start = buf.len();
        buf.extend_from_slice(format!("{i} ").as_bytes());
        buf.resize(start + size.max(buf.len() - start), b'x');
        buf.push(b'\n');
    }
    buf
}

pub fn run_lines(store: StoreSel, lines: u64, size: usize) -> Res<LinesResult> {
    let mut env = BusEnv::new(&store.env());
    start_bus(&env, store)?;
    let head_before = env.status()?["log"]["head_seq"].as_u64().unwrap_or(0);
    let data = input(lines, size);
    let out = guarded(|| {
        Ok(env
            .env
            .dws(["event", "publish", EVENT_TYPE, "--lines"])
            .stdin_bytes(data)
            .run_with_timeout(RUN_TIMEOUT))
    })?;
    if out.code != Some(0) {
        return Err(format!(
            "`dws event publish --lines` failed ({:?}): {}\n{}",
            out.code,
            out.stderr.trim(),
            env.log_tail()
        ));
    }
    let summary: Value = serde_json::from_str(out.stdout.trim())
        .map_err(|e| format!("the summary is not JSON ({e}): {}", out.stdout))?;
    if summary["published"].as_u64() != Some(lines) {
        return Err(format!("{lines} lines, but the summary says {summary}"));
    }
    let head = env.status()?["log"]["head_seq"].as_u64().unwrap_or(0);
    if head < head_before + lines {
        return Err(format!(
            "{lines} lines published, but the log head moved only from {head_before} to {head}"
        ));
    }
    env.stop()?;
    let secs = out.elapsed.as_secs_f64();
    Ok(LinesResult {
        rate: lines as f64 / secs.max(1e-9),
        secs,
    })
}

/// The row: `--lines-events` lines of 256 B on the fsync disk store.
pub fn run_lines_row(opts: &Opts, failures: &mut Vec<String>) {
    let store = StoreSel::DISK_FSYNC;
    let n = opts.lines_events;
    println!();
    println!(
        "`dws event publish {EVENT_TYPE} --lines`: one dws process, {n} lines of 256 B on stdin, \
         pipelined over one connection, disk store fsync, no consumers"
    );
    println!(
        "(events/s = lines / dws's run from start to exit; median of {} run(s), each on a fresh bus)",
        opts.durable_runs
    );
    match median_of(
        opts.durable_runs,
        |r: &LinesResult| r.rate,
        || run_lines(store, n, SIZE),
    ) {
        Ok(r) => println!(
            "  {:>5}  {:>7} lines  {:>10.0} events/s  ({:.2} s)",
            store.durability, n, r.rate, r.secs
        ),
        Err(e) => {
            println!(
                "  {:>5}  {:>7} lines  FAILED (see below)",
                store.durability, n
            );
            failures.push(format!("publish --lines: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_line_has_its_size_and_index() {
        let buf = super::input(3, 8);
        assert_eq!(buf, b"0 xxxxxx\n1 xxxxxx\n2 xxxxxx\n");
    }
}
