#!/usr/bin/env python3
"""Run `dws event consume` from a program, the way an orchestrator should.

Standard library only (Python 3.8+). What it shows:

1. spawn `dws event consume ARGS...` with stdout and stderr piped and stdin a
   pipe we hold (closing it stops an unbounded consumer: if this process
   dies, its consumer dies with it);
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
   them to an action (see ACTIONS), restarting when that is the right thing.

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
(--stop-with stdin): the acks already written reach dws before the EOF. A
run that ends at --max-events may not read the last ack; that event comes
again (at-least-once).

It prints one JSON object per line on stdout: {"kind": "ready", ...} for each
run, {"kind": "event", ...} per event, and {"kind": "result", ...} per run,
whose "action" is what an orchestrator would do next. Diagnostics (gap lines,
source state changes) are forwarded to stderr. Exit status: 0 when the last
run ended in "done" or "stopped", 1 otherwise.
"""

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

READY_RE = re.compile(
    r"^\[event\] ready event_key=(?P<event_key>\S*) bus_pid=(?P<bus_pid>\d+)"
    r" subscribe_id=(?P<subscribe_id>\S+)$"
)
EXITED_RE = re.compile(
    r"^\[event\] exited \u2014 received (?P<count>\d+) event\(s\) in"
    r" (?P<secs>[0-9.]+)s \(reason: (?P<reason>[a-z_]+)\)$"
)
LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye"

# (exit code, reason) -> (action, why). Exit 0 always has a reason.
ACTIONS = {
    (0, "limit"): ("done", "--max-events reached"),
    (0, "timeout"): ("done", "--duration elapsed"),
    (0, "signal"): ("stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"),
    (0, "bus_shutdown"): (
        "restart",
        "the bus stopped (dws event stop, SIGTERM) or this consumer was taken over,"
        " unsubscribed or stopped: run again (a durable --subscribe-id resumes)",
    ),
    (0, "source_lost"): (
        "alert",
        "the upstream is gone for good (credentials, configuration): do not loop;"
        " tell an operator",
    ),
    (0, "halted"): (
        "inspect-poison",
        "the subscription halted at a poison event (delivered --max-deliver times"
        " without an ack): an operator looks at it (dws event status) and runs"
        " dws event subscription restart|skip ID; running again would stop again",
    ),
}
BY_CODE = {
    1: ("retry", "runtime failure (bus unreachable, refused, protocol, store): retry with backoff"),
    2: ("fix-usage", "usage or validation error: retrying will not help"),
    3: ("fix-permissions", "authentication or permission failure: retrying will not help"),
}


def classify(code, reason, lost_without_goodbye):
    """The action for one finished run, as (action, why)."""
    if code == 0 and reason == "bus_shutdown" and lost_without_goodbye:
        return (
            "restart",
            "the bus vanished without goodbye (crash, kill -9): run again; events"
            " sent but not acked come again marked redelivered",
        )
    if code == 0 and (0, reason) in ACTIONS:
        return ACTIONS[(0, reason)]
    if code in BY_CODE:
        return BY_CODE[code]
    if code == 0:
        return ("inspect", "unknown exit reason %r (newer dws?)" % reason)
    return ("inspect", "killed by a signal or unexpected exit status %r" % code)


class Consumer:
    """One `dws event consume` child."""

    def __init__(self, dws, consume_args):
        self.argv = [dws, "event", "consume"] + list(consume_args)
        self.explicit_ack = _ack_mode(consume_args) == "explicit"
        self.proc = None
        self.ready = None
        self.stderr_lines = []
        self._ready_or_exit = threading.Event()
        self._stderr_done = threading.Event()
        self._stdin_lock = threading.Lock()
        # Events read from stdout and not yet settled (--ack explicit): a
        # slow handler keeps all of them alive, also those queued behind
        # the one it works on (their ack wait runs too).
        self.held = set()
        self._events = queue.Queue()

    def start(self, timeout=30.0):
        """Spawns the consumer and blocks until its ready line. Returns the
        ready fields, or None if it exited (or timed out) first."""
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        if not self._ready_or_exit.wait(timeout):
            self.stop("sigterm")
        return self.ready

    def _read_stderr(self):
        for raw in self.proc.stderr:
            line = raw.rstrip("\n")
            self.stderr_lines.append(line)
            m = READY_RE.match(line)
            if m and self.ready is None:
                self.ready = m.groupdict()
                self.ready["bus_pid"] = int(self.ready["bus_pid"])
                self._ready_or_exit.set()
            elif not EXITED_RE.match(line) and line != LOST_WITHOUT_GOODBYE:
                # gap lines, `[event] source <state> (...)`, `Error: ...`
                print("consumer: " + line, file=sys.stderr, flush=True)
        self._ready_or_exit.set()
        self._stderr_done.set()

    def _read_stdout(self):
        # Reads ahead, so that events queued behind a slow one are held.
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                print("consumer: not JSON: " + line[:200], file=sys.stderr, flush=True)
                continue
            if self.explicit_ack:
                with self._stdin_lock:
                    self.held.add(ev["seq"])
            self._events.put(ev)
        self._events.put(None)

    def events(self):
        """Yields each event (a dict) as it arrives, until stdout closes."""
        while True:
            ev = self._events.get()
            if ev is None:
                return
            yield ev

    def ack(self, seq):
        """With `--ack explicit`: the event is handled, the bus may forget it."""
        self._write_stdin("ack %d\n" % seq)

    def nack(self, seq):
        """With `--ack explicit`: handling failed, deliver it again."""
        self._write_stdin("nack %d\n" % seq)

    def progress(self, seq):
        """With `--ack explicit`: still working on it; its ack wait starts
        again (it is not delivered again meanwhile)."""
        self._write_stdin("progress %d\n" % seq)

    def term(self, seq, reason):
        """With `--ack explicit`: it can never succeed; park it now with a
        reason (one line)."""
        self._write_stdin("term %d %s\n" % (seq, " ".join(reason.split())))

    def work_alive(self, work, every):
        """Runs `work()` (a slow handler) while a thread writes `progress
        SEQ` for every held event each `every` seconds; returns how many
        rounds it wrote."""
        done = threading.Event()
        sent = [0]

        def beat():
            while not done.wait(every):
                with self._stdin_lock:
                    held = sorted(self.held)
                for seq in held:
                    self.progress(seq)
                sent[0] += 1

        t = threading.Thread(target=beat, daemon=True)
        t.start()
        try:
            work()
        finally:
            done.set()
            t.join()
        return sent[0]

    def _write_stdin(self, text):
        words = text.split()
        with self._stdin_lock:
            if words[0] != "progress":
                self.held.discard(int(words[1]))
            try:
                self.proc.stdin.write(text)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass  # it is exiting

    def stop(self, how):
        """Asks the consumer to finish: SIGTERM, or EOF on its stdin. Both
        give a clean exit (reason signal) that acks what reached stdout and
        removes a subscription the run created."""
        if how == "stdin":
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        elif self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self):
        """Waits for the exit; returns the run's result (a dict)."""
        code = self.proc.wait()
        self._stderr_done.wait(10)
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        exited = None
        for line in self.stderr_lines:
            m = EXITED_RE.match(line)
            if m:
                exited = m.groupdict()
        errors = [l[len("Error: "):] for l in self.stderr_lines if l.startswith("Error: ")]
        lost = LOST_WITHOUT_GOODBYE in self.stderr_lines
        reason = exited["reason"] if exited else None
        action, why = classify(code, reason, lost)
        return {
            "kind": "result",
            "code": code,
            "reason": reason,
            "reported_events": int(exited["count"]) if exited else None,
            "lost_without_goodbye": lost,
            "error": errors[0] if errors else None,
            "action": action,
            "why": why,
        }


def _ack_mode(consume_args):
    for i, a in enumerate(consume_args):
        if a.startswith("--ack="):
            return a.split("=", 1)[1]
        if a == "--ack" and i + 1 < len(consume_args):
            return consume_args[i + 1]
    return "write"


def emit(obj):
    print(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), flush=True)


def run_once(opts, stop_requested):
    c = Consumer(opts.dws, opts.consume_args)
    current["consumer"] = c
    ready = c.start()
    if ready is not None:
        emit(dict(kind="ready", **ready))
        if stop_requested.is_set():
            c.stop(opts.stop_with)
        handled = 0
        for ev in c.events():
            # Handle the event here. This example only reports it, fails on
            # purpose on --fail-on DATA, gives up on --term-on DATA, and takes
            # --work seconds (sending progress) on --slow-on DATA.
            data = ev.get("data", "")
            ok = opts.fail_on is None or data != opts.fail_on
            termed = opts.term_on is not None and data == opts.term_on
            progress = 0
            if opts.slow_on is not None and data == opts.slow_on:
                slow_work = lambda: time.sleep(opts.work)  # a model call, a tool run...
                if c.explicit_ack:
                    progress = c.work_alive(slow_work, opts.progress_every)
                else:
                    slow_work()
            emit({
                "kind": "event",
                "seq": ev["seq"],
                "event_type": ev["event_type"],
                "data": ev.get("data", ""),
                "redelivered": ev["redelivered"],
                "delivery": ev.get("delivery", 1),
                "handled": ok and not termed,
                "progress": progress,
                "termed": termed,
            })
            if c.explicit_ack and termed:
                c.term(ev["seq"], "demo handler: %s can never succeed" % json.dumps(data))
            elif c.explicit_ack and ok:
                c.ack(ev["seq"])
            elif c.explicit_ack:
                c.nack(ev["seq"])
            handled += 1
            if opts.stop_after is not None and handled == opts.stop_after:
                c.stop(opts.stop_with)
    result = c.wait()
    emit(result)
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
        if c is not None and c.proc is not None:
            c.stop("sigterm")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    backoff = 0.5
    for attempt in range(opts.restarts + 1):
        result = run_once(opts, stop_requested)
        if result["action"] not in ("restart", "retry") or stop_requested.is_set():
            break
        if attempt < opts.restarts:
            time.sleep(backoff if result["action"] == "retry" else 0)
            backoff = min(backoff * 2, 30)
    return 0 if result["action"] in ("done", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
