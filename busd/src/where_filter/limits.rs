//! The bounds of `--where` evaluation, in one place (docs/guide.md
//! "Limits" states each). The step bound and the expression's size are
//! `proto::where_expr`'s, since `dws` checks them too.

use std::time::Duration;

/// CPU time one event may take, over all of one subscription's
/// expressions (the input's parsing not counted: it is linear in the
/// event, which is bounded). Past it the worker is killed by the kernel
/// (`SIGPROF`) and the event is a failure.
pub const CPU_BUDGET: Duration = Duration::from_millis(20);

/// The worker's data (heap and anonymous mappings, `RLIMIT_DATA`): past it
/// an allocation fails and the worker ends; the event is a failure.
pub const WORKER_MEMORY: u64 = 256 << 20;

/// Wall-clock time without an answer after which busd kills the worker
/// itself (a worker that is stopped, or starved of CPU far beyond its
/// budget): the backstop behind [`CPU_BUDGET`].
pub const STALL_AFTER: Duration = Duration::from_secs(5);

/// The worker's niceness: a filter's CPU yields to the bus's own work.
pub const WORKER_NICE: i32 = 10;

/// Most events of one subscription in one batch handed to the worker
/// (fewer when its events are costly: see `fair`).
pub const MAX_BATCH: usize = 64;

/// Most encoded bytes in one batch (at least one event).
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Distinct programs one worker compiles before busd starts a fresh one
/// (a worker keeps what it compiled).
pub const MAX_PROGRAMS_PER_WORKER: usize = 4096;
