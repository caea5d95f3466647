"""The asyncio consumer: the same contract and child as `consumer.py`
(the lines are handled on the event loop, the pipes by the child's own
threads, so an exit is seen even while a grandchild holds them). `ack()`
and friends only queue a line for the child's stdin (they never block);
`await c.drain()` waits until it is written.
"""

from __future__ import annotations

import asyncio
import signal
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Generator, List, Optional,
                    Sequence, Union)

from ._child import Line
from ._contract import ConsumeOptions, Event, ExitResult, Ready
from .consumer import (EOF_GRACE, KILL_WAIT, STOP_GRACE, Diagnostic, _Core,
                       _failure)
from .errors import BusError, BusShutdown, DwsError, ReadyTimeout


class AsyncConsumer(_Core):
    """One `dws event consume` child driven by asyncio. Build and start one
    with `consume_async(...)` (`async with consume_async(...) as c`, or
    `c = await consume_async(...)`); `async with` stops it on leaving."""

    def __init__(self, args: Sequence[str], *, dws: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                 on_diagnostic: Optional[Diagnostic] = None,
                 stop_grace: float = STOP_GRACE) -> None:
        super().__init__(args, dws=dws, env=env, decode_data=decode_data,
                         on_diagnostic=on_diagnostic, stop_grace=stop_grace)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._flushed = asyncio.Event()
        self._events: "asyncio.Queue[Optional[Union[Event, DwsError]]]" = asyncio.Queue()

    # The child's threads hand everything to the loop, in order.

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _from_stdout(self, lines: List[Line]) -> None:
        self._post(self._stdout_lines, lines)

    def _from_stderr(self, lines: List[Line]) -> None:
        self._post(self._stderr_lines, lines)

    def _from_end(self) -> None:
        self._post(self._on_end)

    def _from_flushed(self) -> None:
        self._post(self._flushed.set)

    def _on_ready_or_error(self) -> None:
        self._ready.set()

    def _deliver(self, items: List[Union[Event, DwsError]]) -> None:
        for item in items:
            self._events.put_nowait(item)

    def _on_end(self) -> None:
        self._events.put_nowait(None)
        self._ready.set()
        self._ended.set()
        self._flushed.set()

    # -- lifecycle ---------------------------------------------------------

    async def start(self, timeout: float = 30.0) -> Ready:
        """Spawns the child and waits for its ready line; raises the typed
        error of a run that failed first, ContractError for a malformed
        ready line, or ReadyTimeout (the child is then stopped: SIGTERM,
        then SIGKILL after `stop_grace` seconds)."""
        self._loop = asyncio.get_running_loop()
        try:
            self._child.start()
        except OSError as e:
            raise BusError("cannot run %s: %s" % (self.argv[0], e)) from e
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        if self.ready is not None and self._error is None:
            return self.ready
        timed_out = self._error is None and not self._child.exited.is_set()
        await self._stop(self.stop_grace)
        result = await self._wait(KILL_WAIT)  # raises a ContractError of stderr
        if timed_out:
            raise ReadyTimeout("no ready line within %ss" % timeout, result)
        raise _failure(result)

    def stop(self, how: str = "sigterm") -> None:
        """Asks the child to finish cleanly: SIGTERM, or EOF on stdin."""
        if self._child.proc is None:
            return
        if how == "stdin":
            self._child.close_stdin()
        elif how == "sigterm":
            self._child.signal(signal.SIGTERM)
        else:
            raise ValueError("how: sigterm or stdin")

    async def _ended_within(self, timeout: Optional[float]) -> bool:
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _stop(self, grace: float) -> None:
        """SIGTERM; SIGKILL when it did not exit within `grace` seconds."""
        self._child.signal(signal.SIGTERM)
        if not await self._ended_within(grace):
            self._child.signal(signal.SIGKILL)
            await self._ended_within(KILL_WAIT)

    async def wait(self) -> ExitResult:
        """Waits for the exit; returns how the run ended (a malformed
        exited line raises ContractError). Once the library's own
        max_events were handed out, it stops the run first."""
        if self._limit_reached() and self._result is None:
            return await self.close()
        return await self._wait(None)

    async def _wait(self, timeout: Optional[float]) -> ExitResult:
        if self._child.proc is None:
            raise DwsError("start() first")
        if self._result is None:
            if not await self._ended_within(timeout):
                raise self._not_exited(timeout)
            self._result = self._final()
        if self._error is not None:
            raise self._error
        return self._result

    async def close(self) -> ExitResult:
        """Stops the child (unless it already ended) and waits: with
        explicit acks stdin is closed first (the acks written so far reach
        dws before the EOF), then SIGTERM, then SIGKILL after `stop_grace`
        seconds."""
        if self._child.proc is not None and not self._child.exited.is_set():
            if self.explicit_ack:
                self._child.close_stdin()
                await self._ended_within(EOF_GRACE)
            if not self._ended.is_set():
                await self._stop(self.stop_grace)
        return await self._wait(KILL_WAIT)

    async def __aenter__(self) -> "AsyncConsumer":
        if self._child.proc is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def events(self) -> AsyncIterator[Event]:
        """Yields each event until the run ended. An NDJSON line over the
        line limit raises ContractError here (the run goes on)."""
        while True:
            if self._limit_reached():
                await self.close()
                return
            item = await self._events.get()
            if item is None:
                self._events.put_nowait(None)
                return
            if isinstance(item, DwsError):
                raise item
            self.handed += 1
            yield item

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    async def drain(self) -> None:
        """Waits until the ack lines written so far left for the child (or
        it ended)."""
        while self._child.unwritten() and not self._ended.is_set():
            self._flushed.clear()
            if not self._child.unwritten():
                break
            await self._flushed.wait()

    async def keep_alive(self, work: Awaitable[Any], every: float) -> int:
        """Awaits `work` (a slow handler) while writing `progress SEQ` for
        every held event each `every` seconds; returns how many rounds."""
        rounds = 0

        async def beat() -> None:
            nonlocal rounds
            while True:
                await asyncio.sleep(every)
                with self._lock:
                    held = sorted(self.held)
                for seq in held:
                    self.progress(seq)
                rounds += 1

        t = asyncio.ensure_future(beat())
        try:
            await work
        finally:
            t.cancel()
        return rounds


class StartingConsumer:
    """What `consume_async` returns: `await` it for the ready consumer, or
    enter it with `async with` (the consumer is closed on leaving)."""

    def __init__(self, consumer: AsyncConsumer, ready_timeout: float) -> None:
        self._consumer = consumer
        self._ready_timeout = ready_timeout
        self._started: "Optional[asyncio.Future[AsyncConsumer]]" = None

    async def _start(self) -> AsyncConsumer:
        await self._consumer.start(self._ready_timeout)
        return self._consumer

    def __await__(self) -> Generator[Any, None, AsyncConsumer]:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        return self._started.__await__()

    async def __aenter__(self) -> AsyncConsumer:
        return await self

    async def __aexit__(self, *exc: Any) -> None:
        await self._consumer.close()


def consume_async(keys: Sequence[str] = (), *, dws: Optional[str] = None,
                  env: Optional[Dict[str, str]] = None, decode_data: bool = False,
                  on_diagnostic: Optional[Diagnostic] = None, ready_timeout: float = 30.0,
                  stop_grace: float = STOP_GRACE, **options: Any) -> StartingConsumer:
    """Starts `dws event consume` and gives the consumer once it is ready;
    the options are `consume()`'s:

        async with consume_async(["demo.*"], ack="explicit") as c:
            async for ev in c:
                await handle(ev.data)
                ev.ack()

    or `c = await consume_async(...)` (then `await c.close()`, or
    `async with c:`).
    """
    opts = ConsumeOptions(keys=keys, **options)
    c = AsyncConsumer(opts.argv(), dws=dws, env=env, decode_data=decode_data,
                      on_diagnostic=on_diagnostic, stop_grace=stop_grace)
    return StartingConsumer(c, ready_timeout)


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
