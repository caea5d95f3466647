#!/usr/bin/env node
// Run `dws event consume` from a program, the way an orchestrator should.
//
// Node.js 18+, standard library only. The same steps and output as
// examples/python/consume.py:
//
// 1. spawn `dws event consume ARGS...` with stdout and stderr piped and
//    stdin a pipe we hold (closing it stops an unbounded consumer: if this
//    process dies, its consumer dies with it);
// 2. block on the `[event] ready ...` line before doing anything that must
//    be seen by the consumer (publishing, telling others it is up);
// 3. stream NDJSON events from stdout; with `--ack explicit`, write
//    `ack SEQ` on its stdin once an event is handled, or `nack SEQ` when
//    handling failed (it comes again; with --max-deliver, too many failures
//    make it poison and the subscription halts); a slow handler writes
//    `progress SEQ` while it works (well within --ack-wait) so its event is
//    not delivered again meanwhile, and `term SEQ REASON` for an event that
//    can never succeed (parked at once, see `dws event subscription parked`);
// 4. stop it with SIGTERM, or by closing its stdin, never with SIGKILL (a
//    killed consumer cannot remove its subscription);
// 5. read the exit code and the `[event] exited ... (reason: R)` line, and
//    map them to an action (see classify), restarting when that is right.
//
// Usage:
//   consume.mjs [--dws PATH] [--stop-after N] [--stop-with sigterm|stdin]
//               [--restarts N] [--fail-on DATA] [--term-on DATA]
//               [--slow-on DATA] [--work SECS] [--progress-every SECS]
//               -- CONSUME_ARGS...
//
// --fail-on DATA makes the demo handler fail on events whose data is DATA
// (nacked with --ack explicit); --term-on DATA makes it give up on them for
// good (term). --slow-on DATA makes it work --work SECS (default 3) on such
// events, writing `progress SEQ` every --progress-every SECS (default 1)
// meanwhile: an agent's model call or tool run that outlasts --ack-wait. If
// this process hangs or dies, the progress stops and the event comes again
// after --ack-wait. With --ack explicit, stop by closing stdin
// (--stop-with stdin): the acks already written reach dws before the EOF. A
// run that ends at --max-events may not read the last ack; that event comes
// again (at-least-once).
//
// It prints one JSON object per line on stdout: {"kind":"ready",...} for
// each run, {"kind":"event",...} per event and {"kind":"result",...} per
// run, whose "action" is what an orchestrator would do next. Diagnostics
// (gap lines, source state changes) go to stderr. Exit status: 0 when the
// last run ended in "done" or "stopped", 1 otherwise.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { once } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";

const READY_RE =
  /^\[event\] ready event_key=(\S*) bus_pid=(\d+) subscribe_id=(\S+)$/;
const EXITED_RE =
  /^\[event\] exited \u2014 received (\d+) event\(s\) in ([0-9.]+)s \(reason: ([a-z_]+)\)$/;
const LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye";

const ACTIONS = {
  limit: ["done", "--max-events reached"],
  timeout: ["done", "--duration elapsed"],
  signal: ["stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"],
  bus_shutdown: [
    "restart",
    "the bus stopped (dws event stop, SIGTERM) or this consumer was taken over," +
      " unsubscribed or stopped: run again (a durable --subscribe-id resumes)",
  ],
  source_lost: [
    "alert",
    "the upstream is gone for good (credentials, configuration): do not loop;" +
      " tell an operator",
  ],
  halted: [
    "inspect-poison",
    "the subscription halted at a poison event (delivered --max-deliver times" +
      " without an ack): an operator looks at it (dws event status) and runs" +
      " dws event subscription restart|skip ID; running again would stop again",
  ],
};
const BY_CODE = {
  1: ["retry", "runtime failure (bus unreachable, refused, protocol, store): retry with backoff"],
  2: ["fix-usage", "usage or validation error: retrying will not help"],
  3: ["fix-permissions", "authentication or permission failure: retrying will not help"],
};

/** The action for one finished run, as [action, why]. */
export function classify(code, reason, lostWithoutGoodbye) {
  if (code === 0 && reason === "bus_shutdown" && lostWithoutGoodbye) {
    return [
      "restart",
      "the bus vanished without goodbye (crash, kill -9): run again; events" +
        " sent but not acked come again marked redelivered",
    ];
  }
  if (code === 0 && Object.hasOwn(ACTIONS, reason)) return ACTIONS[reason];
  if (code in BY_CODE) return BY_CODE[code];
  if (code === 0) return ["inspect", `unknown exit reason ${JSON.stringify(reason)} (newer dws?)`];
  return ["inspect", `killed by a signal or unexpected exit status ${code}`];
}

function ackMode(args) {
  for (let i = 0; i < args.length; i++) {
    if (args[i].startsWith("--ack=")) return args[i].slice(6);
    if (args[i] === "--ack" && i + 1 < args.length) return args[i + 1];
  }
  return "write";
}

const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

/** One `dws event consume` child. */
export class Consumer {
  constructor(dws, consumeArgs) {
    this.argv = ["event", "consume", ...consumeArgs];
    this.dws = dws;
    this.explicitAck = ackMode(consumeArgs) === "explicit";
    this.stderrLines = [];
    this.ready = null;
    // Events read from stdout and not yet settled (--ack explicit): a slow
    // handler keeps all of them alive, also those queued behind the one it
    // works on (their ack wait runs too).
    this.held = new Set();
    this.queue = [];
    this.stdoutEnded = false;
    this.wake = null;
  }

  /** Spawns the consumer and resolves with the ready fields once its ready
   * line arrived, or null if it exited (or timed out) first. */
  start(timeoutMs = 30000) {
    this.child = spawn(this.dws, this.argv, { stdio: ["pipe", "pipe", "pipe"] });
    // A consumer that exits early closes stdin: ignore EPIPE on acks.
    this.child.stdin.on("error", () => {});
    this.exited = once(this.child, "close").then(([code, sig]) => (code === null ? sig : code));
    // Read ahead, so that events queued behind a slow one are held.
    const stdout = createInterface({ input: this.child.stdout });
    stdout.on("line", (line) => {
      if (!line.trim()) return;
      const ev = JSON.parse(line);
      if (this.explicitAck) this.held.add(ev.seq);
      this.queue.push(ev);
      this.wake?.();
    });
    stdout.on("close", () => {
      this.stdoutEnded = true;
      this.wake?.();
    });
    const stderr = createInterface({ input: this.child.stderr });
    this.stderrDone = once(stderr, "close");
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.stop("sigterm");
        resolve(null);
      }, timeoutMs);
      stderr.on("line", (line) => {
        this.stderrLines.push(line);
        const m = READY_RE.exec(line);
        if (m && this.ready === null) {
          this.ready = { event_key: m[1], bus_pid: Number(m[2]), subscribe_id: m[3] };
          clearTimeout(timer);
          resolve(this.ready);
        } else if (!EXITED_RE.test(line) && line !== LOST_WITHOUT_GOODBYE) {
          // gap lines, `[event] source <state> (...)`, `Error: ...`
          process.stderr.write(`consumer: ${line}\n`);
        }
      });
      this.child.on("error", (e) => {
        this.stderrLines.push(`Error: cannot run ${this.dws}: ${e.message}`);
      });
      this.exited.then(() => {
        clearTimeout(timer);
        resolve(this.ready);
      });
    });
  }

  /** Yields each event (an object) as it arrives, until stdout closes. */
  async *events() {
    for (;;) {
      if (this.queue.length) {
        yield this.queue.shift();
      } else if (this.stdoutEnded) {
        return;
      } else {
        await new Promise((resolve) => (this.wake = resolve));
        this.wake = null;
      }
    }
  }

  /** With `--ack explicit`: the event is handled, the bus may forget it. */
  ack(seq) {
    this.held.delete(seq);
    if (this.child.stdin.writable) this.child.stdin.write(`ack ${seq}\n`);
  }

  /** With `--ack explicit`: handling failed, deliver it again. */
  nack(seq) {
    this.held.delete(seq);
    if (this.child.stdin.writable) this.child.stdin.write(`nack ${seq}\n`);
  }

  /** With `--ack explicit`: still working on it; its ack wait starts again
   * (it is not delivered again meanwhile). */
  progress(seq) {
    if (this.child.stdin.writable) this.child.stdin.write(`progress ${seq}\n`);
  }

  /** With `--ack explicit`: it can never succeed; park it now with a reason
   * (one line). */
  term(seq, reason) {
    this.held.delete(seq);
    const line = reason.split(/\s+/).filter(Boolean).join(" ");
    if (this.child.stdin.writable) this.child.stdin.write(`term ${seq} ${line}\n`);
  }

  /** Awaits `work()` (a slow handler) while a timer writes `progress SEQ`
   * for every held event each `everyMs`; resolves with how many rounds it
   * wrote. */
  async workAlive(work, everyMs) {
    let sent = 0;
    const timer = setInterval(() => {
      for (const seq of this.held) this.progress(seq);
      sent++;
    }, everyMs);
    try {
      await work();
    } finally {
      clearInterval(timer);
    }
    return sent;
  }

  /** Asks the consumer to finish: SIGTERM, or EOF on its stdin. Both give a
   * clean exit (reason signal) that acks what reached stdout and removes a
   * subscription the run created. */
  stop(how) {
    if (how === "stdin") this.child.stdin.end();
    else if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
    }
  }

  /** Waits for the exit; resolves with the run's result. */
  async wait() {
    const code = await this.exited;
    await this.stderrDone;
    this.child.stdin.end();
    let exited = null;
    for (const line of this.stderrLines) {
      const m = EXITED_RE.exec(line);
      if (m) exited = { count: Number(m[1]), reason: m[3] };
    }
    const errors = this.stderrLines.filter((l) => l.startsWith("Error: "));
    const lost = this.stderrLines.includes(LOST_WITHOUT_GOODBYE);
    const reason = exited ? exited.reason : null;
    const [action, why] = classify(code, reason, lost);
    return {
      kind: "result",
      code,
      reason,
      reported_events: exited ? exited.count : null,
      lost_without_goodbye: lost,
      error: errors.length ? errors[0].slice("Error: ".length) : null,
      action,
      why,
    };
  }
}

function parseArgs(argv) {
  const opts = {
    dws: process.env.DWS || "dws",
    stopAfter: null,
    stopWith: "sigterm",
    restarts: 0,
    failOn: null,
    termOn: null,
    slowOn: null,
    work: 3,
    progressEvery: 1,
  };
  let i = 0;
  for (; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      i++;
      break;
    } else if (a === "--dws") opts.dws = argv[++i];
    else if (a === "--stop-after") opts.stopAfter = Number(argv[++i]);
    else if (a === "--stop-with") opts.stopWith = argv[++i];
    else if (a === "--restarts") opts.restarts = Number(argv[++i]);
    else if (a === "--fail-on") opts.failOn = argv[++i];
    else if (a === "--term-on") opts.termOn = argv[++i];
    else if (a === "--slow-on") opts.slowOn = argv[++i];
    else if (a === "--work") opts.work = Number(argv[++i]);
    else if (a === "--progress-every") opts.progressEvery = Number(argv[++i]);
    else break;
  }
  if (!["sigterm", "stdin"].includes(opts.stopWith)) {
    process.stderr.write("--stop-with: sigterm or stdin\n");
    process.exit(2);
  }
  opts.consumeArgs = argv.slice(i);
  return opts;
}

let current = null;
let stopRequested = false;

async function runOnce(opts) {
  const c = new Consumer(opts.dws, opts.consumeArgs);
  current = c;
  const ready = await c.start();
  if (ready !== null) {
    emit({ kind: "ready", ...ready });
    if (stopRequested) c.stop(opts.stopWith);
    let handled = 0;
    for await (const ev of c.events()) {
      // Handle the event here. This example only reports it, fails on
      // purpose on --fail-on DATA, gives up on --term-on DATA, and takes
      // --work seconds (sending progress) on --slow-on DATA.
      const data = ev.data ?? "";
      const ok = opts.failOn === null || data !== opts.failOn;
      const termed = opts.termOn !== null && data === opts.termOn;
      let progress = 0;
      if (opts.slowOn !== null && data === opts.slowOn) {
        const slowWork = () => sleep(opts.work * 1000); // a model call, a tool run...
        if (c.explicitAck) progress = await c.workAlive(slowWork, opts.progressEvery * 1000);
        else await slowWork();
      }
      emit({
        kind: "event",
        seq: ev.seq,
        event_type: ev.event_type,
        data: ev.data ?? "",
        redelivered: ev.redelivered,
        delivery: ev.delivery ?? 1,
        handled: ok && !termed,
        progress,
        termed,
      });
      if (c.explicitAck) {
        if (termed) c.term(ev.seq, `demo handler: ${JSON.stringify(data)} can never succeed`);
        else if (ok) c.ack(ev.seq);
        else c.nack(ev.seq);
      }
      handled++;
      if (opts.stopAfter !== null && handled === opts.stopAfter) c.stop(opts.stopWith);
    }
  }
  const result = await c.wait();
  emit(result);
  return result;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  // SIGTERM/SIGINT to us: pass it on as a clean stop, then report.
  for (const sig of ["SIGTERM", "SIGINT"]) {
    process.on(sig, () => {
      stopRequested = true;
      if (current && current.child) current.stop("sigterm");
    });
  }
  let result;
  let backoffMs = 500;
  for (let attempt = 0; attempt <= opts.restarts; attempt++) {
    result = await runOnce(opts);
    if (!["restart", "retry"].includes(result.action) || stopRequested) break;
    if (attempt < opts.restarts && result.action === "retry") {
      await sleep(backoffMs);
      backoffMs = Math.min(backoffMs * 2, 30000);
    }
  }
  process.exitCode = ["done", "stopped"].includes(result.action) ? 0 : 1;
}

await main();
