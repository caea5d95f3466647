"""The other `dws event` verbs, each run once with `--format json` and its
JSON reply returned as a dict: publish, subscribe, unsubscribe, status,
stop and `subscription <verb>`. `Dws` runs them synchronously, `AsyncDws`
with asyncio; both raise UsageError / BusError / PermissionDenied on exit
2 / 1 / 3, with the `Error:` line as the message.

A verb runs as a `_child.Child`, like a consumer: its end is its exit
(not the close of its pipes), and one that did not answer within
`timeout` seconds gets SIGTERM, then SIGKILL `stop_grace` seconds later,
and raises BusError.
"""

from __future__ import annotations

import asyncio
import json
from typing import (Any, Awaitable, Callable, Dict, Generic, List, Optional, Sequence, Tuple,
                    TypeVar, Union)

from ._child import Child, Line
from ._contract import Backoff, Duration, backoff_arg, duration_arg, parse_exit
from .consumer import KILL_WAIT, STOP_GRACE, find_dws
from .errors import BusError, DwsError, ExitResult, error_for_code

R = TypeVar("R")
Doc = Dict[str, Any]


def reply(code: int, stdout: str, stderr: str) -> Doc:
    """A verb's JSON reply, or the typed error of its exit."""
    lines = stderr.splitlines()
    if code != 0:
        result = parse_exit(code, lines)
        err = error_for_code(code, result.error or stderr.strip() or "exit %d" % code, result)
        try:  # some verbs also print what they did (unsubscribe: removed / not_found)
            partial = json.loads(stdout) if stdout.strip() else None
        except ValueError:
            partial = None
        err.reply = partial if isinstance(partial, dict) else None
        raise err
    try:
        doc = json.loads(stdout)
    except ValueError as e:
        raise DwsError("not a JSON reply: %r" % stdout[:200],
                       ExitResult(code, None, None, None, None, False, None, tuple(lines))) from e
    return doc if isinstance(doc, dict) else {"value": doc}


def _reply_of(child: Child, out: List[List[Line]]) -> Doc:
    """The reply of a verb's ended child (its lines joined again)."""
    code = child.returncode
    assert code is not None
    text = ["\n".join(raw.decode("utf-8", "replace") for raw, _ in lines) for lines in out]
    return reply(code, text[0], text[1])


def _flags(pairs: Sequence[Tuple[str, Any]]) -> List[str]:
    out: List[str] = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


class _Verbs(Generic[R]):
    """The verbs, built once; `_call` runs them (sync or async)."""

    def __init__(self, dws: Optional[str] = None, *, profile: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, timeout: float = 60.0,
                 stop_grace: float = STOP_GRACE) -> None:
        self.dws = find_dws(dws)
        self.profile = profile
        self.env = env
        self.timeout = timeout
        self.stop_grace = stop_grace

    def _argv(self, args: Sequence[str]) -> List[str]:
        prof = ["--profile", self.profile] if self.profile else []
        return [self.dws, "event"] + list(args) + prof

    def _call(self, args: Sequence[str], stdin: Optional[str] = None) -> R:
        raise NotImplementedError

    def _child(self, argv: List[str], on_end: Callable[[], None]) -> Tuple[Child, List[List[Line]]]:
        """A verb's child; the lines of stdout and stderr go to the lists."""
        out: List[List[Line]] = [[], []]
        return Child(argv, self.env, on_stdout=out[0].extend, on_stderr=out[1].extend,
                     on_end=on_end), out

    def _started(self, child: Child, stdin: Optional[str]) -> None:
        try:
            child.start()
        except OSError as e:
            raise BusError("cannot run %s: %s" % (self.dws, e)) from e
        child.write((stdin or "").encode())
        child.close_stdin()

    def _late(self, argv: List[str]) -> BusError:
        return BusError("%s did not answer within %ss" % (" ".join(argv[1:4]), self.timeout))

    def publish(self, event_type: str, data: Any = "", *, id: Optional[str] = None) -> R:
        """Publishes one event; `data` is sent as is when a string, else as
        JSON. Returns {"seq", "event_id", "duplicate"}."""
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        return self._call(["publish", event_type, "-", "--format", "json"] + _flags([("--id", id)]),
                          text)

    def subscribe(self, keys: Union[str, Sequence[str]], *, id: Optional[str] = None,
                  filter: Optional[str] = None, from_: Optional[Union[str, int]] = None,
                  ttl: Optional[Duration] = None, max_deliver: Optional[int] = None,
                  on_poison: Optional[str] = None, backoff: Optional[Backoff] = None,
                  delivery: Optional[str] = None, where: Optional[str] = None,
                  extra_args: Sequence[str] = ()) -> R:
        """Creates a durable subscription (a no-op when it exists with the
        same spec). Returns its id and spec. `backoff`: one duration, a
        string as dws reads it ("1s,10s") or a list of durations.
        `delivery="shared"`: a work queue, several consumers at once, each
        event to one of them. `where`: a jq expression on the event."""
        ks = [keys] if isinstance(keys, str) else list(keys)
        return self._call(["subscribe"] + ks + _flags([
            ("--id", id), ("--filter", filter), ("--from", from_),
            ("--ttl", None if ttl is None else duration_arg(ttl)),
            ("--max-deliver", max_deliver), ("--on-poison", on_poison),
            ("--backoff", backoff_arg(backoff)), ("--delivery", delivery),
            ("--where", where),
        ]) + list(extra_args) + ["--format", "json"])

    def unsubscribe(self, *ids: str) -> R:
        """Removes subscriptions: {"removed": [...], "not_found": [...]}."""
        return self._call(["unsubscribe"] + list(ids) + ["--format", "json"])

    def status(self) -> R:
        """The status document (`"running": false` when no bus runs)."""
        return self._call(["status", "--format", "json"])

    def stop(self, *subscribe_ids: str, dry_run: bool = False) -> R:
        """Stops the bus, or only the consumers of these subscriptions."""
        ids: List[str] = []
        for s in subscribe_ids:
            ids += ["--subscribe-id", s]
        return self._call(["stop"] + ids + _flags([("--dry-run", dry_run)]) + ["--format", "json"])

    def subscription(self, verb: str, *args: str) -> R:
        """`dws event subscription VERB ARGS... --format json` (any verb,
        also ones newer than this library)."""
        return self._call(["subscription", verb] + list(args) + ["--format", "json"])

    def restart(self, id: str, *, dry_run: bool = False) -> R:
        """A halted subscription tries the event it stopped at again."""
        return self.subscription("restart", id, *_flags([("--dry-run", dry_run)]))

    def skip(self, id: str, *, dry_run: bool = False) -> R:
        """A halted subscription parks the event it stopped at and goes on."""
        return self.subscription("skip", id, *_flags([("--dry-run", dry_run)]))

    def disable(self, id: str) -> R:
        return self.subscription("disable", id)

    def enable(self, id: str) -> R:
        return self.subscription("enable", id)

    def seek(self, id: str, to: Union[str, int], *, dry_run: bool = False) -> R:
        """Moves the cursor: earliest, latest, a seq or an RFC 3339 time."""
        return self.subscription("seek", id, "--to", str(to), *_flags([("--dry-run", dry_run)]))

    def parked(self, id: str) -> R:
        return self.subscription("parked", id)

    def replay_parked(self, id: str, *seqs: int) -> R:
        return self.subscription("replay-parked", id, *[str(s) for s in seqs])


class Dws(_Verbs[Doc]):
    """The verbs, run synchronously: `Dws().publish("demo.hello", {"n": 1})`."""

    def _call(self, args: Sequence[str], stdin: Optional[str] = None) -> Doc:
        argv = self._argv(args)
        child, out = self._child(argv, lambda: None)
        self._started(child, stdin)
        if not child.ended.wait(self.timeout):
            child.stop(self.stop_grace, KILL_WAIT)
            raise self._late(argv)
        return _reply_of(child, out)


class AsyncDws(_Verbs[Awaitable[Doc]]):
    """The verbs for asyncio: `await AsyncDws().status()`."""

    def _call(self, args: Sequence[str], stdin: Optional[str] = None) -> Awaitable[Doc]:
        return self._run(self._argv(args), stdin)

    async def _run(self, argv: List[str], stdin: Optional[str]) -> Doc:
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()

        def on_end() -> None:
            try:
                loop.call_soon_threadsafe(ended.set)
            except RuntimeError:
                pass  # the loop is closed

        child, out = self._child(argv, on_end)
        self._started(child, stdin)
        try:
            await asyncio.wait_for(ended.wait(), self.timeout)
        except asyncio.TimeoutError:
            # Off the loop: stop() waits (bounded) for the exit.
            await loop.run_in_executor(None, child.stop, self.stop_grace, KILL_WAIT)
            raise self._late(argv) from None
        return _reply_of(child, out)
