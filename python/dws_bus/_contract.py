"""The `dws event consume` contract as pure functions and value types: the
stderr lines it prints, the NDJSON event, the exit result and what to do
about it, and the command line built from options. No I/O here; the sync
and asyncio consumers share it. The contract is docs/consume-contract.md.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import BusShutdown, DwsError, Halted, SourceLost, error_for_code

READY_RE = re.compile(
    r"^\[event\] ready event_key=(?P<event_key>\S*) bus_pid=(?P<bus_pid>\d+)"
    r" subscribe_id=(?P<subscribe_id>\S+)$"
)
EXITED_RE = re.compile(
    r"^\[event\] exited \u2014 received (?P<count>\d+) event\(s\) in"
    r" (?P<secs>[0-9.]+)s \(reason: (?P<reason>[a-z_]+)\)$"
)
HALTED_RE = re.compile(r"^\[event\] subscription (?P<id>\S+) halted at seq (?P<seq>\d+):")
LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye"
ERROR_PREFIX = "Error: "

Duration = Union[str, int, float, datetime.timedelta]
"""A CLI duration (`"30s"`, `"2m"`), or seconds, or a timedelta."""


def duration_arg(d: Duration) -> str:
    """A duration as `dws` reads it; numbers are seconds (sent as ms)."""
    if isinstance(d, str):
        return d
    secs = d.total_seconds() if isinstance(d, datetime.timedelta) else float(d)
    if secs < 0:
        raise ValueError("a duration cannot be negative: %r" % (d,))
    return "%dms" % round(secs * 1000)


@dataclass(frozen=True)
class Ready:
    """The `[event] ready` line: the consumer is subscribed."""

    event_key: str
    bus_pid: int
    subscribe_id: str

    def as_dict(self) -> Dict[str, Any]:
        return {"event_key": self.event_key, "bus_pid": self.bus_pid,
                "subscribe_id": self.subscribe_id}


def parse_ready(line: str) -> Optional[Ready]:
    m = READY_RE.match(line)
    if m is None:
        return None
    return Ready(m["event_key"], int(m["bus_pid"]), m["subscribe_id"])


def is_protocol_line(line: str) -> bool:
    """Ready, exited and lost-without-goodbye lines: what the library
    consumes itself rather than passing on as a diagnostic."""
    return bool(READY_RE.match(line) or EXITED_RE.match(line)) or line == LOST_WITHOUT_GOODBYE


@dataclass
class Event:
    """One NDJSON event line. `data` is the payload string, or with
    `decode_data` its JSON value (the string when it is not JSON). Fields
    this version does not know are kept in `extra`; `raw` is the line's
    object as read. `ack()` and friends answer through the consumer that
    delivered it (with `ack="explicit"`)."""

    seq: int
    event_type: str
    data: Any = ""
    event_id: str = ""
    subscribe_id: str = ""
    source_id: str = ""
    headers: Dict[str, str] = field(default_factory=dict)
    received_at_unix_ms: int = 0
    redelivered: bool = False
    delivery: int = 1
    event_born_time: Optional[int] = None
    event_corp_id: Optional[str] = None
    event_unified_app_id: Optional[str] = None
    rule_type: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _settle: Optional[Callable[[str], None]] = field(default=None, repr=False, compare=False)

    @property
    def type(self) -> str:
        """The event's type (`event_type`)."""
        return self.event_type

    def json(self) -> Any:
        """`data` decoded as JSON (raises ValueError when it is not)."""
        return json.loads(self.data) if isinstance(self.data, str) else self.data

    def ack(self) -> None:
        self._answer("ack %d" % self.seq)

    def nack(self, delay: Optional[Duration] = None) -> None:
        self._answer("nack %d" % self.seq + ("" if delay is None else " " + duration_arg(delay)))

    def progress(self) -> None:
        self._answer("progress %d" % self.seq)

    def term(self, reason: str = "") -> None:
        self._answer(term_line(self.seq, reason))

    def _answer(self, line: str) -> None:
        if self._settle is None:
            raise DwsError("this event was not delivered by a consumer")
        self._settle(line)


_KNOWN = {"seq", "event_type", "data", "event_id", "subscribe_id", "source_id", "headers",
          "received_at_unix_ms", "redelivered", "delivery", "event_born_time", "event_corp_id",
          "event_unified_app_id", "rule_type"}


def parse_event(line: str, decode_data: bool = False) -> Optional[Event]:
    """An NDJSON line as an Event, or None when it is not an event object."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("seq"), int):
        return None
    kw: Dict[str, Any] = {k: v for k, v in obj.items() if k in _KNOWN}
    kw.setdefault("event_type", "")
    if decode_data:
        kw["data"] = decode_payload(kw.get("data", ""))
    extra = {k: v for k, v in obj.items() if k not in _KNOWN and k != "type"}
    return Event(extra=extra, raw=obj, **kw)


def decode_payload(data: Any) -> Any:
    """A payload's JSON value when it is JSON text, else the payload as is."""
    if not isinstance(data, str):
        return data
    try:
        return json.loads(data)
    except ValueError:
        return data


def term_line(seq: int, reason: str) -> str:
    words = " ".join(reason.split())
    return "term %d" % seq + (" " + words if words else "")


# (exit code, reason) -> (action, why). Exit 0 always has a reason.
ACTIONS: Dict[str, Tuple[str, str]] = {
    "limit": ("done", "--max-events reached"),
    "timeout": ("done", "--duration elapsed"),
    "signal": ("stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"),
    "bus_shutdown": (
        "restart",
        "the bus stopped (dws event stop, SIGTERM) or this consumer was"
        " unsubscribed or stopped: run again (a durable --subscribe-id resumes)",
    ),
    "taken_over": (
        "done",
        "another consumer took the subscription over (--takeover): running again"
        " would take it back",
    ),
    "source_lost": (
        "alert",
        "the upstream is gone for good (credentials, configuration): do not loop;"
        " tell an operator",
    ),
    "halted": (
        "inspect-poison",
        "the subscription halted at a poison event (delivered --max-deliver times"
        " without an ack): an operator looks at it (dws event status) and runs"
        " dws event subscription restart|skip ID; running again would stop again",
    ),
}
BY_CODE: Dict[int, Tuple[str, str]] = {
    1: ("retry", "runtime failure (bus unreachable, refused, protocol, store): retry with backoff"),
    2: ("fix-usage", "usage or validation error: retrying will not help"),
    3: ("fix-permissions", "authentication or permission failure: retrying will not help"),
}


def classify(code: Optional[int], reason: Optional[str], lost_without_goodbye: bool) -> Tuple[str, str]:
    """What an orchestrator does after one run, as (action, why)."""
    if code == 0 and reason == "bus_shutdown" and lost_without_goodbye:
        return (
            "restart",
            "the bus vanished without goodbye (crash, kill -9): run again; events"
            " sent but not acked come again marked redelivered",
        )
    if code == 0 and reason in ACTIONS:
        return ACTIONS[reason]
    if code is not None and code in BY_CODE:
        return BY_CODE[code]
    if code == 0:
        return ("inspect", "unknown exit reason %r (newer dws?)" % reason)
    return ("inspect", "killed by a signal or unexpected exit status %r" % code)


@dataclass(frozen=True)
class ExitResult:
    """How one run ended. `code` is the exit code (negative: killed by that
    signal); `reason`, `count` and `seconds` come from the exited line (None
    without one); `error` is the `Error:` line's text."""

    code: int
    reason: Optional[str]
    count: Optional[int]
    seconds: Optional[float]
    error: Optional[str]
    lost_without_goodbye: bool
    halted_seq: Optional[int] = None
    stderr: Tuple[str, ...] = ()

    @property
    def action(self) -> str:
        """done, stopped, restart, retry, alert, inspect-poison, fix-usage,
        fix-permissions or inspect."""
        return classify(self.code, self.reason, self.lost_without_goodbye)[0]

    @property
    def why(self) -> str:
        return classify(self.code, self.reason, self.lost_without_goodbye)[1]

    @property
    def ok(self) -> bool:
        """Ended as asked: limit, timeout or a stop (signal, stdin EOF)."""
        return self.action in ("done", "stopped")

    def check(self) -> "ExitResult":
        """Returns self when `ok`, else raises the matching DwsError."""
        if self.ok:
            return self
        if self.code != 0:
            return _raise(error_for_code(self.code, self.error or self.why, self))
        kind = {"bus_shutdown": BusShutdown, "source_lost": SourceLost, "halted": Halted}
        cls = kind.get(self.reason or "", DwsError)
        raise cls("consumer ended (reason: %s): %s" % (self.reason, self.why), self)


def _raise(e: DwsError) -> "ExitResult":
    raise e


def parse_exit(code: int, stderr: Sequence[str]) -> ExitResult:
    """The result of a run from its exit code and stderr lines."""
    exited = None
    halted_seq = None
    for line in stderr:
        m = EXITED_RE.match(line)
        if m:
            exited = m
        h = HALTED_RE.match(line)
        if h:
            halted_seq = int(h["seq"])
    errors = [ln[len(ERROR_PREFIX):] for ln in stderr if ln.startswith(ERROR_PREFIX)]
    return ExitResult(
        code=code,
        reason=exited["reason"] if exited else None,
        count=int(exited["count"]) if exited else None,
        seconds=float(exited["secs"]) if exited else None,
        error=errors[0] if errors else None,
        lost_without_goodbye=LOST_WITHOUT_GOODBYE in stderr,
        halted_seq=halted_seq,
        stderr=tuple(stderr),
    )


@dataclass
class ConsumeOptions:
    """The flags of `dws event consume`, by name (None: not given).
    `ack="explicit"` makes the program answer each event; `extra_args` are
    passed as they are (flags newer than this library)."""

    keys: Sequence[str] = ()
    subscribe_id: Optional[str] = None
    ephemeral: bool = False
    filter: Optional[str] = None
    from_: Optional[Union[str, int]] = None
    ttl: Optional[Duration] = None
    max_events: Optional[int] = None
    duration: Optional[Duration] = None
    takeover: bool = False
    ack: Optional[str] = None
    ack_wait: Optional[Duration] = None
    max_deliver: Optional[int] = None
    on_poison: Optional[str] = None
    backoff: Optional[Sequence[Duration]] = None
    profile: Optional[str] = None
    extra_args: Sequence[str] = ()

    def argv(self) -> List[str]:
        """The arguments after `dws event consume`."""
        if isinstance(self.keys, str):
            keys: List[str] = [self.keys]
        else:
            keys = list(self.keys)
        out = keys
        flags: List[Tuple[str, Any]] = [
            ("--subscribe-id", self.subscribe_id), ("--filter", self.filter),
            ("--from", self.from_), ("--ttl", _dur(self.ttl)),
            ("--max-events", self.max_events), ("--duration", _dur(self.duration)),
            ("--ack", self.ack), ("--ack-wait", _dur(self.ack_wait)),
            ("--max-deliver", self.max_deliver), ("--on-poison", self.on_poison),
            ("--backoff", ",".join(duration_arg(d) for d in self.backoff) if self.backoff else None),
            ("--profile", self.profile),
        ]
        for flag, value in flags:
            if value is not None:
                out += [flag, str(value)]
        if self.ephemeral:
            out.append("--ephemeral")
        if self.takeover:
            out.append("--takeover")
        return out + list(self.extra_args)

    @property
    def explicit_ack(self) -> bool:
        return ack_mode(self.argv()) == "explicit"


def _dur(d: Optional[Duration]) -> Optional[str]:
    return None if d is None else duration_arg(d)


def ack_mode(args: Sequence[str]) -> str:
    """The `--ack` mode a consume command line asks for."""
    for i, a in enumerate(args):
        if a.startswith("--ack="):
            return a.split("=", 1)[1]
        if a == "--ack" and i + 1 < len(args):
            return args[i + 1]
    return "write"


def is_bounded(args: Sequence[str]) -> bool:
    """True when the command line bounds the run (--max-events or
    --duration): stdin EOF then ends only the acks, not the run."""
    return any(a in ("--max-events", "--duration") or a.startswith(("--max-events=", "--duration="))
               for a in args)
