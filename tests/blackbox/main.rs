//! Black-box tests of the dws event bus: the real `dws` and `busd` binaries,
//! real Unix sockets, real signals, each test in its own temp dir (see the
//! `dws_tests` harness). Build the binaries first:
//!
//! ```text
//! cargo build --workspace --bins && cargo test -p dws-tests
//! ```
//!
//! Modules by area:
//! - [`acks`]: at-least-once processing: explicit acks on stdin, the ack
//!   wait, delivery counts, poison (halt, park) and the subscription verbs;
//!   [`slow`]: slow consumers (`progress`, `term`, `--backoff`, delayed
//!   events across retention and `kill -9`).
//! - [`bounds`]: every resource bounded under floods: requests pipelined
//!   without reading, disk use against retention and the dedup window,
//!   saves under a publish flood, the memory of rendered lines.
//! - [`exactness`]: acks name exactly what reached stdout (a parked event
//!   replayed behind higher seqs, an older client's cumulative ack), gaps
//!   reach the successor of a consumer that never read past them, bad ack
//!   lines with stderr unread.
//! - [`fanout`]: lines rendered once for every consumer of a fan-out,
//!   each with its own subscription id, next to a filtered subscription's;
//!   [`ring`]: the same lines read in place from the bus's line ring, byte
//!   for byte what the bytes give, and a stopped consumer holding ring
//!   batches stopping nobody else.
//! - [`cli_contract`]: the `dws event consume` / `publish` / `status`
//!   contract: exact stderr lines, exit codes, NDJSON, flags, stdin rule;
//!   [`publish_lines`]: `publish --lines`, one event per line of stdin,
//!   pipelined (order, refused lines, stdin ending early, id prefixes).
//! - [`lifecycle`]: how runs and the bus end: signals, `| head -1`, bus
//!   shutdown, idle shutdown, `stop`.
//! - [`subscriptions`]: named, owned and detached subscriptions: resume
//!   after `kill -9`, redelivery, takeover, TTL, gaps, stalled consumers,
//!   stop, status.
//! - [`reading`]: `consume` / `subscribe --from TIME`, `dws event get SEQ`,
//!   `subscription list` / `info` (against their schemas), `--data json`.
//! - [`sources`]: the exec source and profile configuration errors.
//! - [`dingtalk`]: the app stream against the loopback fake gateway
//!   (conformance IDs, reconnects, portal ticket mode).
//! - [`dingtalk_tls`]: both DingTalk sources over `https://`/`wss://`
//!   behind a TLS front with a test CA (SNI, certificate checks).
//! - [`personal`]: the personal stream against the fake: tickets, token
//!   refresh, frames in every spelling, the control plane.
//! - [`spawn`]: on-demand daemon start: one daemon for many clients, stale
//!   lock/socket recovery, socket permissions, `--dry-run`, `busd --foreground`.
//! - [`state_files`]: durable state and settings not trusted blindly: a
//!   `subscriptions.json` this build cannot restore is refused and kept,
//!   FIFOs where files belong, over-long durations, a non-UTF-8
//!   `config.toml`, named subscriptions without a TTL, TTL removals.
//! - [`durability`]: the on-disk store: its files and status, restart after
//!   `stop` and `kill -9`, torn tails, flipped bytes, format versions, a
//!   failed write, and `kill -9` chaos (local publish and DingTalk);
//!   [`damage`]: acknowledged events missing at either end of the log
//!   (segments emptied, truncated, zero-filled, removed, overwritten) are
//!   reported once as lost, never silently.
//! - [`retain`]: retention on disk: a subscription detached behind far
//!   more than the log's hot tail catches up in order from the segments,
//!   across `kill -9`, with busd's memory far below what it retains.
//! - [`postgres`]: the private PostgreSQL server harness (`dws_tests::pg`)
//!   the cluster store's tests run on: SCRAM over TCP, stop, crash and
//!   restart, servers side by side, nothing left behind.
//! - [`cluster`]: several hosts on one PostgreSQL: per-host fan-out,
//!   publishing from any host, subscriptions across hosts, the cluster in
//!   status, upstream failover, a lost lease, start-up errors;
//!   [`cluster_pg_restart`]: PostgreSQL restarted under a running cluster;
//!   [`cluster_shared`]: shared delivery across hosts; [`cluster_tls`]:
//!   TLS to PostgreSQL (verify-full, require, refusals).
//! - [`structure`]: no import circle in any crate nor the Python package,
//!   no process-wide mutable state in busd's rooms.
//! - [`repo`]: repository habits: a `//!` header on every source file, no
//!   oversized product file without a reason, busd's module boundaries, and
//!   docs that hold together (links and anchors resolve, one exit-code
//!   table, cited tests exist, nothing points outside the repository).
//! - [`wire`]: the frame protocol against bad peers while a real consumer
//!   keeps receiving.
//! - [`limits`]: every bound a client can hit (connections, unread replies,
//!   slow and partial frames, event size, status size, event types,
//!   subscriptions, patterns) refuses only that client; gaps reach the next
//!   consumer.
//! - [`messages`]: what a new user's mistakes get: errors that name what
//!   is valid, counts as words, a bare `busd` beside a bus, colour on a
//!   terminal only.
//! - [`client_abuse`]: `dws` under hostile or careless use: a bus killed
//!   under a consumer, non-UTF-8 argv, huge invalid input, a socket that
//!   never answers or refuses with an `Error` frame.
//! - [`work_queue`]: a `--delivery shared` subscription on one host split
//!   by several consumers, checked over a run with kill -9 of a consumer
//!   and of the bus; [`work_workers`]: its workers unequal (least loaded
//!   first; a killed, stopped or hung worker's jobs to the others; `stop`
//!   of every worker); [`work_checker`]: a checker over runs with a
//!   healthy, a hung, a stopped and a killed worker.
//! - [`workdir`]: the work dir, socket dir and bus files against planted
//!   symlinks, loose modes and foreign owners (exit 3, targets untouched).
//! - [`where_filter`]: `--where EXPR`, a jq expression on the event run by
//!   the bus: matching, refusal, the step bound, restart, re-attach, a
//!   cluster definition; [`where_limits`]: expressions written to hurt cost
//!   only their own subscription (others served, busd's memory its own, a
//!   restart not delayed).
//! - [`ecosystem`]: install script, completions and man pages, JSON
//!   Schemas against real output, `busd --foreground` under a fake systemd
//!   (`NOTIFY_SOCKET`) and the unit file, the Python and Node examples,
//!   `status --watch`, `bus.log` as JSON.
//! - [`service`]: the bus under systemd (socket activation that outlives
//!   `dws event stop`, the watchdog, the installed units) and
//!   `dws event doctor`.

mod acks;
mod bounds;
mod cli_contract;
mod client_abuse;
mod cluster;
mod cluster_pg_restart;
mod cluster_shared;
mod cluster_shared_faults;
mod cluster_tls;
mod damage;
mod dingtalk;
mod dingtalk_tls;
mod durability;
mod ecosystem;
mod exactness;
mod fanout;
mod lifecycle;
mod limits;
mod messages;
mod personal;
mod postgres;
mod publish_lines;
mod reading;
mod repo;
mod retain;
mod ring;
mod service;
mod slow;
mod sources;
mod spawn;
mod state_files;
mod structure;
mod subscriptions;
mod test_ca;
mod verb_flood;
mod where_filter;
mod where_limits;
mod wire;
mod work_checker;
mod work_queue;
mod work_workers;
mod workdir;
