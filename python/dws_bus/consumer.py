"""The synchronous consumer: runs `dws event consume` as a child process
with piped stdin/stdout/stderr, blocks on its ready line, yields events,
writes ack lines, stops it and reports how it ended. `_Core` is what the
sync and the asyncio consumer share: the lines of stderr and stdout as the
contract reads them, the explicit-ack bookkeeping and the result.

The child and its pipes are `_child.Child`'s: events are read ahead (held
for `keep_alive`), a run ends when the process exits (not when its pipes
close), and every wait has a bound: a `dws` that ignores SIGTERM is killed
after `stop_grace` seconds.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Union

from ._child import STDOUT_LINE_LIMIT, Child, Line
from ._contract import (ConsumeOptions, Duration, Event, ExitResult, Ready, ack_mode,
                        duration_arg, is_protocol_line, parse_event, parse_exit,
                        parse_ready, stderr_text, take_max_events, term_line)
from .errors import (BusShutdown, BusError, ContractError, DwsError, ExitTimeout, ReadyTimeout,
                     error_for_code)

Diagnostic = Callable[[str], None]

STOP_GRACE = 10.0
"""Seconds a `dws` has to exit after SIGTERM before it is killed (SIGKILL).
A clean exit takes about 4 s at most (2 s to finish stdout, 2 s to remove
an owned subscription), so only a `dws` that ignores SIGTERM meets it."""
EOF_GRACE = 10.0
"""Seconds an explicit-ack run has to exit after stdin EOF (its last acks
arrive first) before SIGTERM."""
KILL_WAIT = 10.0
"""Seconds to wait for the exit after SIGKILL (or after the last stop) before
giving up with ExitTimeout."""
IO_WAIT = 10.0
"""Seconds, after the exit, for the rest of the pipes to be passed on."""


def find_dws(dws: Optional[str] = None) -> str:
    """The `dws` to run: the argument, else env `DWS_BIN`, else `dws` on PATH."""
    if dws:
        return dws
    env = os.environ.get("DWS_BIN")
    if env:
        return env
    return shutil.which("dws") or "dws"


class _Core:
    """What both consumers share. The Child's callbacks (`_from_*`) run on
    its I/O thread; here they handle the lines at once, the asyncio
    consumer passes them to its loop first."""

    def __init__(self, args: Sequence[str], *, dws: Optional[str], env: Optional[Dict[str, str]],
                 decode_data: bool, on_diagnostic: Optional[Diagnostic],
                 stop_grace: float) -> None:
        rest = list(args)
        self.explicit_ack = ack_mode(rest) == "explicit"
        # With explicit acks the library counts --max-events itself.
        self.max_events: Optional[int] = None
        if self.explicit_ack:
            self.max_events, rest = take_max_events(rest)
        self.argv: List[str] = [find_dws(dws), "event", "consume"] + rest
        # dws ends every run at stdin EOF, a bounded one too (once its
        # acks are in).
        self.stdin_eof_exits = True
        self.decode_data = decode_data
        self.on_diagnostic = on_diagnostic
        self.env = env
        self.stop_grace = stop_grace
        self.ready: Optional[Ready] = None
        self.stderr_lines: List[str] = []
        self.held: Set[int] = set()
        self.handed = 0  # events handed to the program
        self._result: Optional[ExitResult] = None
        self._error: Optional[DwsError] = None  # a stderr line broke the contract
        self._lock = threading.Lock()
        self._child = Child(self.argv, env, on_stdout=self._from_stdout,
                            on_stderr=self._from_stderr, on_end=self._from_end,
                            on_flushed=self._from_flushed)

    @property
    def proc(self) -> Any:
        """The child's `subprocess.Popen` (None before start)."""
        return self._child.proc

    @property
    def result(self) -> Optional[ExitResult]:
        """The result once the run ended and was waited for, else None."""
        return self._result

    # -- the Child's callbacks (I/O thread) --------------------------------

    def _from_stdout(self, lines: List[Line]) -> None:
        self._stdout_lines(lines)

    def _from_stderr(self, lines: List[Line]) -> None:
        self._stderr_lines(lines)

    def _from_end(self) -> None:
        self._on_end()

    def _from_flushed(self) -> None:
        pass

    # -- the lines, as the contract reads them -----------------------------

    def _stderr_lines(self, lines: List[Line]) -> None:
        for raw, cut in lines:
            line = stderr_text(raw, cut)
            self.stderr_lines.append(line)
            try:
                ready = parse_ready(line)
            except ContractError as e:
                if self._error is None:
                    self._error = e
                self._on_ready_or_error()
                continue
            if ready is not None:
                if self.ready is None:
                    self.ready = ready
                    self._on_ready_or_error()
            elif not is_protocol_line(line) and self.on_diagnostic is not None:
                self.on_diagnostic(line)

    def _stdout_lines(self, lines: List[Line]) -> None:
        items: List[Union[Event, DwsError]] = []
        for raw, cut in lines:
            if cut:
                items.append(ContractError(
                    "an NDJSON line of %d bytes is over the limit of %d bytes (discarded)"
                    % (len(raw) + cut, STDOUT_LINE_LIMIT)))
                continue
            line = raw.decode("utf-8", "replace").strip()
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
            items.append(ev)
        if items:
            self._deliver(items)

    def _on_ready_or_error(self) -> None:
        raise NotImplementedError

    def _deliver(self, items: List[Union[Event, DwsError]]) -> None:
        raise NotImplementedError

    def _on_end(self) -> None:
        raise NotImplementedError

    # -- acks, limit, result -----------------------------------------------

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

    def _write(self, line: str) -> None:
        words = line.split()
        with self._lock:
            if words[0] == "ack-upto":
                self.held = {s for s in self.held if s > int(words[1])}
            elif words[0] != "progress":
                self.held.discard(int(words[1]))
        self._child.write((line + "\n").encode())

    def _limit_reached(self) -> bool:
        """The library's own --max-events (explicit acks) were handed out."""
        return self.max_events is not None and self.handed >= self.max_events

    def _final(self) -> ExitResult:
        """The result of the ended run; a contract error is kept in _error."""
        code = self._child.returncode
        assert code is not None
        try:
            result = parse_exit(code, self.stderr_lines)
        except ContractError as e:
            assert e.result is not None
            result = e.result
            if self._error is None:
                self._error = e
        if self._error is not None:
            self._error.with_result(result)
        elif self._limit_reached() and result.reason == "signal":
            # The library stopped it at its --max-events: what dws would
            # have said, had it counted (count: the events handed out).
            result = dataclasses.replace(result, reason="limit", count=self.handed)
        return result

    def _not_exited(self, timeout: Optional[float]) -> ExitTimeout:
        pid = self._child.proc.pid if self._child.proc is not None else None
        return ExitTimeout("dws (pid %s) did not exit within %ss" % (pid, timeout))


class Consumer(_Core):
    """One `dws event consume` child. Use `consume()` to build and start
    one, as a context manager (leaving it stops the child cleanly).

    Without `ack="explicit"` an event counts as handled once read; with it,
    call `ack(seq)` / `nack` / `progress` / `term` (or the same methods on
    the event). With explicit acks `--max-events N` is counted here: after
    the handler of the Nth event returned, the run is stopped (its acks
    reach `dws` first) and ends with reason `limit`."""

    def __init__(self, args: Sequence[str], *, dws: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                 on_diagnostic: Optional[Diagnostic] = None,
                 stop_grace: float = STOP_GRACE) -> None:
        super().__init__(args, dws=dws, env=env, decode_data=decode_data,
                         on_diagnostic=on_diagnostic, stop_grace=stop_grace)
        self._ready_or_exit = threading.Event()
        self._events: "queue.Queue[Optional[Union[Event, DwsError]]]" = queue.Queue()

    def _on_ready_or_error(self) -> None:
        self._ready_or_exit.set()

    def _deliver(self, items: List[Union[Event, DwsError]]) -> None:
        for item in items:
            self._events.put(item)

    def _on_end(self) -> None:
        self._events.put(None)
        self._ready_or_exit.set()

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Ready:
        """Spawns the child and blocks until its ready line. Raises the
        typed error of a run that failed first (UsageError, BusError,
        PermissionDenied), ContractError for a malformed ready line, or
        ReadyTimeout; the child is then stopped (SIGTERM, then SIGKILL
        after `stop_grace` seconds)."""
        try:
            self._child.start()
        except OSError as e:
            raise BusError("cannot run %s: %s" % (self.argv[0], e)) from e
        self._ready_or_exit.wait(timeout)
        if self.ready is not None and self._error is None:
            return self.ready
        timed_out = self._error is None and not self._child.exited.is_set()
        self._child.stop(self.stop_grace, KILL_WAIT)
        result = self._wait(KILL_WAIT)  # raises a ContractError of stderr
        if timed_out:
            raise ReadyTimeout("no ready line within %ss" % timeout, result)
        raise _failure(result)

    def stop(self, how: str = "sigterm") -> None:
        """Asks the child to finish cleanly (reason `signal`): SIGTERM, or
        with how="stdin" EOF on its stdin (acks written before reach it
        first). Never SIGKILL (only close() and a failed start() kill, and
        only a `dws` still running `stop_grace` seconds after SIGTERM)."""
        if self._child.proc is None:
            return
        if how == "stdin":
            self._child.close_stdin()
        elif how == "sigterm":
            self._child.signal(signal.SIGTERM)
        else:
            raise ValueError("how: sigterm or stdin")

    def wait(self, timeout: Optional[float] = None) -> ExitResult:
        """Waits for the exit and returns how the run ended (see
        ExitResult.check() to raise on a bad end); ExitTimeout when it did
        not end within `timeout` seconds (None: no bound). Once the
        library's own max_events were handed out, it stops the run first.
        A malformed exited line raises ContractError."""
        if self._limit_reached() and self._result is None:
            return self.close()
        return self._wait(timeout)

    def _wait(self, timeout: Optional[float]) -> ExitResult:
        if self._child.proc is None:
            raise DwsError("start() first")
        if self._result is None:
            if not self._child.exited.wait(timeout):
                raise self._not_exited(timeout)
            self._child.ended.wait(IO_WAIT)
            self._result = self._final()
        if self._error is not None:
            raise self._error
        return self._result

    def close(self) -> ExitResult:
        """Stops the child (unless it already ended) and waits: with
        explicit acks stdin is closed first (the acks written so far reach
        dws before the EOF, which ends the run), then SIGTERM,
        then SIGKILL after `stop_grace` seconds."""
        if self._child.proc is not None and not self._child.exited.is_set():
            if self.explicit_ack:
                self._child.close_stdin()
                self._child.exited.wait(EOF_GRACE)
            self._child.stop(self.stop_grace, KILL_WAIT)
        return self._wait(KILL_WAIT)

    def __enter__(self) -> "Consumer":
        if self._child.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- events ------------------------------------------------------------

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Yields each event as it arrives until the run ended (`wait()`
        says why). With `timeout`, also stops when no event came for that
        many seconds (the run goes on). An NDJSON line over the line limit
        raises ContractError here (the run goes on)."""
        while True:
            if self._limit_reached():
                self.close()
                return
            try:
                item = self._events.get(timeout=timeout)
            except queue.Empty:
                return
            if item is None:
                self._events.put(None)  # later calls end at once too
                return
            if isinstance(item, DwsError):
                raise item
            self.handed += 1
            yield item

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def keep_alive(self, every: float) -> "KeepAlive":
        """A context manager that writes `progress SEQ` for every held
        (read, unsettled) event each `every` seconds while a slow handler
        works: `with c.keep_alive(10): slow()`."""
        return KeepAlive(self, every)


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
            stop_grace: float = STOP_GRACE, **options: Any) -> Consumer:
    """Starts `dws event consume KEYS... [flags]` and returns the consumer
    once it is ready. Options are ConsumeOptions' fields (`subscribe_id`,
    `ack="explicit"`, `ack_wait="30s"`, `max_events`, `from_`, ...).
    `ready_timeout`: seconds to wait for the ready line; `stop_grace`:
    seconds a stopped `dws` has to exit before SIGKILL.

        with consume(["demo.*"], ack="explicit") as c:
            for ev in c:
                handle(ev.data)
                ev.ack()
    """
    opts = ConsumeOptions(keys=keys, **options)
    c = Consumer(opts.argv(), dws=dws, env=env, decode_data=decode_data,
                 on_diagnostic=on_diagnostic, stop_grace=stop_grace)
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
