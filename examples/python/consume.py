#!/usr/bin/env python3
"""Run `dws event consume` from a program, the way an orchestrator should.

A thin use of the `dws_bus` library (python/ in this repository; standard
library only, Python 3.8+), which it imports from the checkout. What it
shows:

1. spawn `dws event consume ARGS...` with stdout and stderr piped and stdin a
   pipe we hold (closing it stops the consumer, bounded or not: if this
   process dies, its consumer dies with it);
2. block on the `[event] ready ...` line before doing anything that must be
   seen by the consumer (publishing, telling others it is up);
3. stream NDJSON events from stdout; with `--ack explicit`, write
   `ack SEQ` on its stdin once an event is handled, or `nack SEQ` when
   handling failed (it comes again; with --max-deliver, too many failures
   make it poison and the subscription halts); a slow handler writes
   `progress SEQ` while it works (well within --ack-wait) so its event is
   not delivered again meanwhile, and `term SEQ REASON` for an event that
   can never succeed (parked at once, see `dws event subscription parked`);
4. stop it with SIGTERM, or by closing its stdin, never with SIGKILL (a
   killed consumer cannot remove its subscription);
5. read the exit code and the `[event] exited ... (reason: R)` line, and map
   them to an action (`ExitResult.action`), restarting when that is right.

Usage:
    consume.py [--dws PATH] [--stop-after N] [--stop-with sigterm|stdin]
               [--restarts N] [--fail-on DATA] [--term-on DATA]
               [--slow-on DATA] [--work SECS] [--progress-every SECS]
               -- CONSUME_ARGS...

e.g.  consume.py -- 'demo.*' --max-events 2
      consume.py --stop-after 1 --stop-with stdin -- 'demo.*'
      consume.py --restarts 3 -- --subscribe-id s1
      consume.py --fail-on bad -- --subscribe-id s1 --ack explicit
      consume.py --slow-on big --work 90 --progress-every 10 \
          -- --subscribe-id s1 --ack explicit --ack-wait 30s

--fail-on DATA makes the demo handler fail on events whose data is DATA
(nacked with --ack explicit); --term-on DATA makes it give up on them for
good (term). --slow-on DATA makes it work --work SECS (default 3) on such
events, writing `progress SEQ` every --progress-every SECS (default 1)
meanwhile: an agent's model call or tool run that outlasts --ack-wait. If
this process hangs or dies, the progress stops and the event comes again
after --ack-wait. With --ack explicit, stop by closing stdin
(--stop-with stdin): the acks already written reach dws before the EOF.
With --ack explicit the library counts --max-events itself and stops dws
only after the last event's answer was written, so none is lost.

It prints one JSON object per line on stdout: {"kind": "ready", ...} for each
run, {"kind": "event", ...} per event, and {"kind": "result", ...} per run,
whose "action" is what an orchestrator would do next. Diagnostics (gap lines,
source state changes) are forwarded to stderr. Exit status: 0 when the last
run ended in "done" or "stopped", 1 otherwise.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

# Runs from a checkout without installing the library (pip install ./python).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from dws_bus import Consumer, DwsError, ExitResult  # noqa: E402


def emit(obj):
    print(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), flush=True)


def forward(line):
    # gap lines, `[event] source <state> (...)`, `Error: ...`
    print("consumer: " + line, file=sys.stderr, flush=True)


def result_record(r: ExitResult):
    return {
        "kind": "result",
        "code": r.code,
        "reason": r.reason,
        "reported_events": r.count,
        "lost_without_goodbye": r.lost_without_goodbye,
        "error": r.error,
        "action": r.action,
        "why": r.why,
    }


def run_once(opts, stop_requested):
    c = Consumer(opts.consume_args, dws=opts.dws, on_diagnostic=forward)
    current["consumer"] = c
    try:
        ready = c.start()
    except DwsError:
        ready = None  # it exited (or timed out) first: the result says why
    if ready is not None:
        emit(dict(kind="ready", **ready.as_dict()))
        if stop_requested.is_set():
            c.stop(opts.stop_with)
        handled = 0
        for ev in c.events():
            # Handle the event here. This example only reports it, fails on
            # purpose on --fail-on DATA, gives up on --term-on DATA, and takes
            # --work seconds (sending progress) on --slow-on DATA.
            data = ev.data
            ok = opts.fail_on is None or data != opts.fail_on
            termed = opts.term_on is not None and data == opts.term_on
            progress = 0
            if opts.slow_on is not None and data == opts.slow_on:
                if c.explicit_ack:
                    with c.keep_alive(opts.progress_every) as alive:
                        time.sleep(opts.work)  # a model call, a tool run...
                    progress = alive.rounds
                else:
                    time.sleep(opts.work)
            emit({
                "kind": "event",
                "seq": ev.seq,
                "event_type": ev.event_type,
                "data": data,
                "redelivered": ev.redelivered,
                "delivery": ev.delivery,
                "handled": ok and not termed,
                "progress": progress,
                "termed": termed,
            })
            if c.explicit_ack and termed:
                ev.term("demo handler: %s can never succeed" % json.dumps(data))
            elif c.explicit_ack and ok:
                ev.ack()
            elif c.explicit_ack:
                ev.nack()
            handled += 1
            if opts.stop_after is not None and handled == opts.stop_after:
                c.stop(opts.stop_with)
    result = c.wait()
    emit(result_record(result))
    return result


current = {"consumer": None}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dws", default=os.environ.get("DWS", "dws"), help="path of dws")
    p.add_argument("--stop-after", type=int, help="stop the consumer after N events")
    p.add_argument("--stop-with", choices=["sigterm", "stdin"], default="sigterm")
    p.add_argument("--restarts", type=int, default=0,
                   help="run again up to N times when the action is restart or retry")
    p.add_argument("--fail-on", metavar="DATA",
                   help="the demo handler fails on events whose data is DATA")
    p.add_argument("--term-on", metavar="DATA",
                   help="the demo handler gives up for good on events whose data is DATA")
    p.add_argument("--slow-on", metavar="DATA",
                   help="the demo handler works --work SECS on events whose data is DATA")
    p.add_argument("--work", type=float, default=3.0, metavar="SECS")
    p.add_argument("--progress-every", type=float, default=1.0, metavar="SECS")
    p.add_argument("consume_args", nargs=argparse.REMAINDER)
    opts = p.parse_args(argv)
    if opts.consume_args[:1] == ["--"]:
        opts.consume_args = opts.consume_args[1:]

    # SIGTERM/SIGINT to us: pass it on as a clean stop, then report.
    stop_requested = threading.Event()

    def on_signal(signum, frame):
        stop_requested.set()
        c = current["consumer"]
        if c is not None:
            c.stop("sigterm")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    backoff = 0.5
    for attempt in range(opts.restarts + 1):
        result = run_once(opts, stop_requested)
        if result.action not in ("restart", "retry") or stop_requested.is_set():
            break
        if attempt < opts.restarts:
            time.sleep(backoff if result.action == "retry" else 0)
            backoff = min(backoff * 2, 30)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
