#!/usr/bin/env node
// Run `dws event consume` from a program, the way an orchestrator should.
//
// Node.js 18+. A thin use of the dws-event-bus library (node/ in this
// repository, no dependencies), imported from the checkout. The same steps
// and output as examples/python/consume.py:
//
// 1. spawn `dws event consume ARGS...` with stdout and stderr piped and
//    stdin a pipe we hold (closing it stops the consumer, bounded or not:
//    if this process dies, its consumer dies with it);
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
//    map them to an action (ExitResult.action), restarting when that is right.
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
// (--stop-with stdin): the acks already written reach dws before the EOF.
// With --ack explicit the library counts --max-events itself and stops dws
// only after the last event's answer was written, so none is lost.
//
// It prints one JSON object per line on stdout: {"kind":"ready",...} for
// each run, {"kind":"event",...} per event and {"kind":"result",...} per
// run, whose "action" is what an orchestrator would do next. Diagnostics
// (gap lines, source state changes) go to stderr. Exit status: 0 when the
// last run ended in "done" or "stopped", 1 otherwise.

import { setTimeout as sleep } from "node:timers/promises";
import { Consumer, DwsError } from "../../node/index.js";

const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

// gap lines, `[event] source <state> (...)`, `Error: ...`
const forward = (line) => process.stderr.write(`consumer: ${line}\n`);

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
  const c = new Consumer(opts.consumeArgs, { dws: opts.dws, onDiagnostic: forward });
  current = c;
  let ready = null;
  try {
    ready = await c.start();
  } catch (e) {
    if (!(e instanceof DwsError)) throw e; // it exited (or timed out) first: the result says why
  }
  if (ready !== null) {
    emit({ kind: "ready", ...ready });
    if (stopRequested) c.stop(opts.stopWith);
    let handled = 0;
    for await (const ev of c) {
      // Handle the event here. This example only reports it, fails on
      // purpose on --fail-on DATA, gives up on --term-on DATA, and takes
      // --work seconds (sending progress) on --slow-on DATA.
      const data = ev.data;
      const ok = opts.failOn === null || data !== opts.failOn;
      const termed = opts.termOn !== null && data === opts.termOn;
      let progress = 0;
      if (opts.slowOn !== null && data === opts.slowOn) {
        const slowWork = () => sleep(opts.work * 1000); // a model call, a tool run...
        if (c.explicitAck) progress = await c.keepAlive(slowWork, opts.progressEvery * 1000);
        else await slowWork();
      }
      emit({
        kind: "event",
        seq: ev.seq,
        event_type: ev.event_type,
        data,
        redelivered: ev.redelivered,
        delivery: ev.delivery,
        handled: ok && !termed,
        progress,
        termed,
      });
      if (c.explicitAck) {
        if (termed) ev.term(`demo handler: ${JSON.stringify(data)} can never succeed`);
        else if (ok) ev.ack();
        else ev.nack();
      }
      handled++;
      if (opts.stopAfter !== null && handled === opts.stopAfter) c.stop(opts.stopWith);
    }
  }
  const r = await c.wait();
  emit({
    kind: "result",
    code: r.code,
    reason: r.reason,
    reported_events: r.count,
    lost_without_goodbye: r.lostWithoutGoodbye,
    error: r.error,
    action: r.action,
    why: r.why,
  });
  return r;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  // SIGTERM/SIGINT to us: pass it on as a clean stop, then report.
  for (const sig of ["SIGTERM", "SIGINT"]) {
    process.on(sig, () => {
      stopRequested = true;
      current?.stop("sigterm");
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
  process.exitCode = result.ok ? 0 : 1;
}

await main();
