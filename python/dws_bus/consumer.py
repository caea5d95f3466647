"""The synchronous consumer: runs `dws event consume` as a child process
with piped stdin/stdout/stderr, blocks on its ready line, yields events,
writes ack lines, stops it (SIGTERM or stdin EOF) and reports how it ended.
Two reader threads drain stdout and stderr so a slow handler never blocks
the child's diagnostics; events read ahead stay "held" for `keep_alive`.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set

from ._contract import (ConsumeOptions, Duration, Event, ExitResult, Ready, ack_mode,
                        duration_arg, is_bounded, is_protocol_line, parse_event, parse_exit,
                        parse_ready, term_line)
from .errors import BusShutdown, BusError, DwsError, ReadyTimeout, error_for_code

Diagnostic = Callable[[str], None]


def find_dws(dws: Optional[str] = None) -> str:
    """The `dws` to run: the argument, else env `DWS_BIN`, else `dws` on PATH."""
    if dws:
        return dws
    env = os.environ.get("DWS_BIN")
    if env:
        return env
    return shutil.which("dws") or "dws"


class Consumer:
    """One `dws event consume` child. Use `consume()` to build and start
    one, as a context manager (leaving it stops the child cleanly).

    Without `ack="explicit"` an event counts as handled once read; with it,
    call `ack(seq)` / `nack` / `progress` / `term` (or the same methods on
    the event)."""

    def __init__(self, args: Sequence[str], *, dws: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                 on_diagnostic: Optional[Diagnostic] = None) -> None:
        self.argv: List[str] = [find_dws(dws), "event", "consume"] + list(args)
        self.explicit_ack = ack_mode(args) == "explicit"
        self.stdin_eof_exits = not is_bounded(args)
        self.decode_data = decode_data
        self.on_diagnostic = on_diagnostic
        self.env = env
        self.proc: Optional["subprocess.Popen[str]"] = None
        self.ready: Optional[Ready] = None
        self.stderr_lines: List[str] = []
        self.held: Set[int] = set()
        self._result: Optional[ExitResult] = None
        self._ready_or_exit = threading.Event()
        self._stderr_done = threading.Event()
        self._lock = threading.Lock()
        self._events: "queue.Queue[Optional[Event]]" = queue.Queue()

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Ready:
        """Spawns the child and blocks until its ready line. Raises the
        typed error of a run that failed first (UsageError, BusError,
        PermissionDenied), or ReadyTimeout (the child is then stopped)."""
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, encoding="utf-8", errors="replace", bufsize=1,
                env=self.env)
        except OSError as e:
            raise BusError("cannot run %s: %s" % (self.argv[0], e)) from e
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        if not self._ready_or_exit.wait(timeout):
            self.stop()
            result = self.wait()
            raise ReadyTimeout("no ready line within %ss" % timeout, result)
        if self.ready is None:
            result = self.wait()
            raise _failure(result)
        return self.ready

    def stop(self, how: str = "sigterm") -> None:
        """Asks the child to finish cleanly (reason `signal`): SIGTERM, or
        with how="stdin" EOF on its stdin (acks written before reach it
        first). Never SIGKILL: a killed consumer cannot clean up."""
        if self.proc is None:
            return
        if how == "stdin":
            self._close_stdin()
        elif how == "sigterm":
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
        else:
            raise ValueError("how: sigterm or stdin")

    def wait(self, timeout: Optional[float] = None) -> ExitResult:
        """Waits for the exit and returns how the run ended (see
        ExitResult.check() to raise on a bad end)."""
        if self._result is not None:
            return self._result
        assert self.proc is not None, "start() first"
        code = self.proc.wait(timeout)
        self._stderr_done.wait(10)
        self._close_stdin()
        self._result = parse_exit(code, self.stderr_lines)
        return self._result

    @property
    def result(self) -> Optional[ExitResult]:
        """The result once `wait()` returned, else None."""
        return self._result

    def close(self) -> ExitResult:
        """Stops the child (SIGTERM, unless it already ended) and waits."""
        if self.proc is not None and self.proc.poll() is None:
            if self.explicit_ack:
                # The acks written so far reach dws before the EOF, which
                # ends an unbounded run; a bounded one gets SIGTERM after.
                self.stop("stdin")
                try:
                    self.proc.wait(10 if self.stdin_eof_exits else 2)
                except subprocess.TimeoutExpired:
                    pass
            self.stop("sigterm")
        return self.wait()

    def __enter__(self) -> "Consumer":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- events ------------------------------------------------------------

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Yields each event as it arrives until stdout closes (the run
        ended; `wait()` says why). With `timeout`, also stops when no event
        came for that many seconds (the run goes on)."""
        while True:
            try:
                ev = self._events.get(timeout=timeout)
            except queue.Empty:
                return
            if ev is None:
                self._events.put(None)  # later calls end at once too
                return
            yield ev

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    # -- explicit acks -----------------------------------------------------

    def ack(self, seq: int) -> None:
        """The event is handled; the bus may forget it."""
        self._write("ack %d" % seq)

    def ack_upto(self, seq: int) -> None:
        """Every event delivered up to `seq` and not yet settled is handled."""
        self._write("ack-upto %d" % seq)

    def nack(self, seq: int, delay: Optional[Duration] = None) -> None:
        """Handling failed: deliver it again (after `delay`)."""
        self._write("nack %d" % seq + ("" if delay is None else " " + duration_arg(delay)))

    def progress(self, seq: int) -> None:
        """Still working on it: its --ack-wait starts again."""
        self._write("progress %d" % seq)

    def term(self, seq: int, reason: str = "") -> None:
        """It can never succeed: park it now with `reason` (one line)."""
        self._write(term_line(seq, reason))

    def keep_alive(self, every: float) -> "KeepAlive":
        """A context manager that writes `progress SEQ` for every held
        (read, unsettled) event each `every` seconds while a slow handler
        works: `with c.keep_alive(10): slow()`."""
        return KeepAlive(self, every)

    # -- internals ---------------------------------------------------------

    def _write(self, line: str) -> None:
        words = line.split()
        with self._lock:
            if words[0] != "progress":
                if words[0] == "ack-upto":
                    self.held = {s for s in self.held if s > int(words[1])}
                else:
                    self.held.discard(int(words[1]))
            if self.proc is None or self.proc.stdin is None:
                return
            try:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # it is exiting

    def _close_stdin(self) -> None:
        with self._lock:
            if self.proc is not None and self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.rstrip("\n")
            self.stderr_lines.append(line)
            ready = parse_ready(line)
            if ready is not None and self.ready is None:
                self.ready = ready
                self._ready_or_exit.set()
            elif not is_protocol_line(line) and self.on_diagnostic is not None:
                self.on_diagnostic(line)
        self._ready_or_exit.set()
        self._stderr_done.set()

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            ev = parse_event(line, self.decode_data)
            if ev is None:
                if self.on_diagnostic is not None:
                    self.on_diagnostic("not an event: " + line[:200])
                continue
            ev._settle = self._write
            if self.explicit_ack:
                with self._lock:
                    self.held.add(ev.seq)
            self._events.put(ev)
        self._events.put(None)


class KeepAlive:
    """Writes progress for the held events while its block runs; `rounds`
    says how many times it did."""

    def __init__(self, consumer: Consumer, every: float) -> None:
        self.consumer = consumer
        self.every = every
        self.rounds = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._done.wait(self.every):
            with self.consumer._lock:
                held = sorted(self.consumer.held)
            for seq in held:
                self.consumer.progress(seq)
            self.rounds += 1

    def __enter__(self) -> "KeepAlive":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


def _failure(result: ExitResult) -> DwsError:
    """The error of a run that ended before its ready line."""
    if result.code != 0:
        return error_for_code(result.code, result.error or "dws exited with %d" % result.code,
                              result)
    return DwsError("dws exited before its ready line (reason: %s)" % result.reason, result)


def consume(keys: Sequence[str] = (), *, dws: Optional[str] = None,
            env: Optional[Dict[str, str]] = None, decode_data: bool = False,
            on_diagnostic: Optional[Diagnostic] = None, ready_timeout: float = 30.0,
            **options: Any) -> Consumer:
    """Starts `dws event consume KEYS... [flags]` and returns the consumer
    once it is ready. Options are ConsumeOptions' fields (`subscribe_id`,
    `ack="explicit"`, `ack_wait="30s"`, `max_events`, `from_`, ...).

        with consume(["demo.*"], ack="explicit") as c:
            for ev in c:
                handle(ev.data)
                ev.ack()
    """
    opts = ConsumeOptions(keys=keys, **options)
    c = Consumer(opts.argv(), dws=dws, env=env, decode_data=decode_data,
                 on_diagnostic=on_diagnostic)
    c.start(ready_timeout)
    return c


def consume_forever(keys: Sequence[str] = (), *, restarts: Optional[int] = None,
                    retries: int = 5, max_backoff: float = 30.0,
                    on_ready: Optional[Callable[[Ready], None]] = None,
                    **kwargs: Any) -> Iterator[Event]:
    """Yields events across runs: when a run ends with `bus_shutdown` (the
    bus stopped or crashed) it starts again at once, up to `restarts` times
    (None: no limit); a runtime failure (exit 1) is retried up to `retries`
    times in a row with backoff. Other ends return (limit, timeout, a stop)
    or raise (UsageError, PermissionDenied, SourceLost, Halted, BusError).
    Use a durable `subscribe_id` so nothing is missed between runs.
    Leaving the loop early stops the current child cleanly."""
    done = 0
    failures = 0
    while True:
        try:
            c = consume(keys, **kwargs)
        except BusError:
            failures += 1
            if failures > retries:
                raise
            time.sleep(min(0.5 * 2 ** (failures - 1), max_backoff))
            continue
        failures = 0
        if on_ready is not None and c.ready is not None:
            on_ready(c.ready)
        try:
            for ev in c:
                yield ev
        finally:
            result = c.close()
        try:
            result.check()
            return
        except BusShutdown:
            done += 1
            if restarts is not None and done > restarts:
                raise
