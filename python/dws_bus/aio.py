"""The asyncio consumer: the same contract as `consumer.py` on asyncio
subprocess streams. `ack()` and friends only queue a line on the child's
stdin (they do not block); `await c.drain()` waits until it is written.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Sequence, Set

from ._contract import (ConsumeOptions, Duration, Event, ExitResult, Ready, ack_mode,
                        duration_arg, is_bounded, is_protocol_line, parse_event, parse_exit,
                        parse_ready, term_line)
from .consumer import Diagnostic, _failure, find_dws
from .errors import BusError, BusShutdown, ReadyTimeout

# An event line may be as large as the bus allows; asyncio's default line
# limit (64 KiB) is too small.
LINE_LIMIT = 64 * 1024 * 1024


class AsyncConsumer:
    """One `dws event consume` child driven by asyncio. Build and start one
    with `await consume_async(...)`; `async with` stops it on leaving."""

    def __init__(self, args: Sequence[str], *, dws: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                 on_diagnostic: Optional[Diagnostic] = None) -> None:
        self.argv: List[str] = [find_dws(dws), "event", "consume"] + list(args)
        self.explicit_ack = ack_mode(args) == "explicit"
        self.stdin_eof_exits = not is_bounded(args)
        self.decode_data = decode_data
        self.on_diagnostic = on_diagnostic
        self.env = env
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.ready: Optional[Ready] = None
        self.stderr_lines: List[str] = []
        self.held: Set[int] = set()
        self._result: Optional[ExitResult] = None
        self._ready = asyncio.Event()
        self._events: "asyncio.Queue[Optional[Event]]" = asyncio.Queue()
        self._tasks: List["asyncio.Task[None]"] = []

    async def start(self, timeout: float = 30.0) -> Ready:
        """Spawns the child and waits for its ready line; raises the typed
        error of a run that failed first, or ReadyTimeout."""
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env, limit=LINE_LIMIT)
        except OSError as e:
            raise BusError("cannot run %s: %s" % (self.argv[0], e)) from e
        self._tasks = [asyncio.ensure_future(self._read_stderr()),
                       asyncio.ensure_future(self._read_stdout())]
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            self.stop()
            raise ReadyTimeout("no ready line within %ss" % timeout, await self.wait())
        if self.ready is None:
            raise _failure(await self.wait())
        return self.ready

    def stop(self, how: str = "sigterm") -> None:
        """Asks the child to finish cleanly: SIGTERM, or EOF on stdin."""
        if self.proc is None:
            return
        if how == "stdin":
            self._close_stdin()
        elif how == "sigterm":
            if self.proc.returncode is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        else:
            raise ValueError("how: sigterm or stdin")

    async def wait(self) -> ExitResult:
        """Waits for the exit; returns how the run ended."""
        if self._result is not None:
            return self._result
        assert self.proc is not None, "start() first"
        code = await self.proc.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._close_stdin()
        self._result = parse_exit(code, self.stderr_lines)
        return self._result

    @property
    def result(self) -> Optional[ExitResult]:
        return self._result

    async def close(self) -> ExitResult:
        """Stops the child (unless it already ended) and waits."""
        if self.proc is not None and self.proc.returncode is None:
            if self.explicit_ack:
                await self.drain()
                self.stop("stdin")
                try:
                    await asyncio.wait_for(asyncio.shield(self.proc.wait()),
                                           10 if self.stdin_eof_exits else 2)
                except asyncio.TimeoutError:
                    pass
            self.stop("sigterm")
        return await self.wait()

    async def __aenter__(self) -> "AsyncConsumer":
        if self.proc is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def events(self) -> AsyncIterator[Event]:
        """Yields each event until stdout closes (the run ended)."""
        while True:
            ev = await self._events.get()
            if ev is None:
                self._events.put_nowait(None)
                return
            yield ev

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    def ack(self, seq: int) -> None:
        self._write("ack %d" % seq)

    def ack_upto(self, seq: int) -> None:
        self._write("ack-upto %d" % seq)

    def nack(self, seq: int, delay: Optional[Duration] = None) -> None:
        self._write("nack %d" % seq + ("" if delay is None else " " + duration_arg(delay)))

    def progress(self, seq: int) -> None:
        self._write("progress %d" % seq)

    def term(self, seq: int, reason: str = "") -> None:
        self._write(term_line(seq, reason))

    async def drain(self) -> None:
        """Waits until the ack lines written so far left for the child."""
        if self.proc is not None and self.proc.stdin is not None:
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass

    async def keep_alive(self, work: Awaitable[Any], every: float) -> int:
        """Awaits `work` (a slow handler) while writing `progress SEQ` for
        every held event each `every` seconds; returns how many rounds."""
        rounds = 0

        async def beat() -> None:
            nonlocal rounds
            while True:
                await asyncio.sleep(every)
                for seq in sorted(self.held):
                    self.progress(seq)
                rounds += 1

        t = asyncio.ensure_future(beat())
        try:
            await work
        finally:
            t.cancel()
        return rounds

    def _write(self, line: str) -> None:
        words = line.split()
        if words[0] == "ack-upto":
            self.held = {s for s in self.held if s > int(words[1])}
        elif words[0] != "progress":
            self.held.discard(int(words[1]))
        stdin = self.proc.stdin if self.proc is not None else None
        if stdin is None or stdin.is_closing():
            return
        try:
            stdin.write((line + "\n").encode())
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass

    def _close_stdin(self) -> None:
        stdin = self.proc.stdin if self.proc is not None else None
        if stdin is not None and not stdin.is_closing():
            try:
                stdin.close()
            except (BrokenPipeError, OSError):
                pass

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            async for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.stderr_lines.append(line)
                ready = parse_ready(line)
                if ready is not None and self.ready is None:
                    self.ready = ready
                    self._ready.set()
                elif not is_protocol_line(line) and self.on_diagnostic is not None:
                    self.on_diagnostic(line)
        finally:
            self._ready.set()

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            async for raw in self.proc.stdout:
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
                    self.held.add(ev.seq)
                self._events.put_nowait(ev)
        finally:
            self._events.put_nowait(None)


async def consume_async(keys: Sequence[str] = (), *, dws: Optional[str] = None,
                        env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                        on_diagnostic: Optional[Diagnostic] = None,
                        ready_timeout: float = 30.0, **options: Any) -> AsyncConsumer:
    """Starts `dws event consume` and returns the consumer once ready:

        async with await consume_async(["demo.*"], ack="explicit") as c:
            async for ev in c:
                await handle(ev.data)
                ev.ack()
    """
    opts = ConsumeOptions(keys=keys, **options)
    c = AsyncConsumer(opts.argv(), dws=dws, env=env, decode_data=decode_data,
                      on_diagnostic=on_diagnostic)
    await c.start(ready_timeout)
    return c


async def consume_forever_async(keys: Sequence[str] = (), *, restarts: Optional[int] = None,
                                retries: int = 5, max_backoff: float = 30.0,
                                on_ready: Optional[Callable[[Ready], None]] = None,
                                **kwargs: Any) -> AsyncIterator[Event]:
    """`consume_forever` for asyncio: runs again after `bus_shutdown`,
    retries exit 1 with backoff, returns or raises on every other end.
    Leaving an `async for` early does not close an async generator at once:
    wrap it in `contextlib.aclosing(...)` (or call `aclose()`) so the
    current child is stopped right away."""
    done = 0
    failures = 0
    while True:
        try:
            c = await consume_async(keys, **kwargs)
        except BusError:
            failures += 1
            if failures > retries:
                raise
            await asyncio.sleep(min(0.5 * 2 ** (failures - 1), max_backoff))
            continue
        failures = 0
        if on_ready is not None and c.ready is not None:
            on_ready(c.ready)
        try:
            async for ev in c:
                yield ev
        finally:
            result = await c.close()
        try:
            result.check()
            return
        except BusShutdown:
            done += 1
            if restarts is not None and done > restarts:
                raise
