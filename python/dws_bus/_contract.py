"""The `dws event consume` contract as pure functions and value types: the
stderr lines it prints, the NDJSON event, the exit result and what to do
about it, and the command line built from options. No I/O here; the sync
and asyncio consumers share it. The contract is docs/consume-contract.md.

A line that claims to be a ready or exited line (by its prefix) but does
not parse, or whose numbers are out of range, raises `ContractError`
rather than passing as a diagnostic or leaking a `ValueError`.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import ContractError, DwsError, ExitResult

# Digits are bounded so that a number can never be too long to convert: a
# pid fits 10 digits, a count 20 (u64), a seq 19 (at most 2^63-1).
READY_PREFIX = "[event] ready "
EXITED_PREFIX = "[event] exited "
READY_RE = re.compile(
    r"^\[event\] ready event_key=(?P<event_key>\S*) bus_pid=(?P<bus_pid>\d{1,10})"
    r" subscribe_id=(?P<subscribe_id>\S+)$"
)
EXITED_RE = re.compile(
    r"^\[event\] exited \u2014 received (?P<count>\d{1,20}) event\(s\) in"
    r" (?P<secs>\d{1,20}(?:\.\d{1,9})?)s \(reason: (?P<reason>[a-z_]{1,64})\)$"
)
HALTED_RE = re.compile(r"^\[event\] subscription (?P<id>\S+) halted at seq (?P<seq>\d+):")
LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye"
ERROR_PREFIX = "Error: "
MAX_SEQ_DIGITS = 19

Duration = Union[str, int, float, datetime.timedelta]
"""A CLI duration (`"30s"`, `"2m"`), or seconds, or a timedelta."""

Backoff = Union[Duration, Sequence[Duration]]
"""`--backoff`: one duration, a string as `dws` reads it (`"1s,10s"`), or a
list of durations."""


def duration_arg(d: Duration) -> str:
    """A duration as `dws` reads it; numbers are seconds (sent as ms)."""
    if isinstance(d, str):
        return d
    secs = d.total_seconds() if isinstance(d, datetime.timedelta) else float(d)
    if secs < 0:
        raise ValueError("a duration cannot be negative: %r" % (d,))
    return "%dms" % round(secs * 1000)


def backoff_arg(b: Optional[Backoff]) -> Optional[str]:
    """`--backoff`'s value: a string as it is, one duration, or a list of
    them joined by `,` (None or an empty list: no flag)."""
    if b is None:
        return None
    if isinstance(b, (str, int, float, datetime.timedelta)):
        return duration_arg(b)
    return ",".join(duration_arg(d) for d in b) or None


@dataclass(frozen=True)
class Ready:
    """The `[event] ready` line: the consumer is subscribed."""

    event_key: str
    bus_pid: int
    subscribe_id: str

    def as_dict(self) -> Dict[str, Any]:
        return {"event_key": self.event_key, "bus_pid": self.bus_pid,
                "subscribe_id": self.subscribe_id}


def _shown(line: str) -> str:
    return repr(line[:120]) + ("...(%d chars)" % len(line) if len(line) > 120 else "")


def parse_ready(line: str) -> Optional[Ready]:
    """The ready line's fields; None for any other line. A line that
    starts as a ready line but does not parse raises ContractError."""
    if not line.startswith(READY_PREFIX):
        return None
    m = READY_RE.match(line)
    if m is None:
        raise ContractError("malformed ready line: %s" % _shown(line))
    return Ready(m["event_key"], int(m["bus_pid"]), m["subscribe_id"])


def is_protocol_line(line: str) -> bool:
    """Ready, exited and lost-without-goodbye lines: what the library
    consumes itself rather than passing on as a diagnostic."""
    return line.startswith((READY_PREFIX, EXITED_PREFIX)) or line == LOST_WITHOUT_GOODBYE


def stderr_text(raw: bytes, cut: int) -> str:
    """A stderr line as text; `cut` bytes of an over-long line were
    discarded, which its text then says."""
    line = raw.decode("utf-8", "replace").rstrip("\r")
    return line + (" ...(%d more bytes discarded)" % cut if cut else "")


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


def parse_exit(code: int, stderr: Sequence[str]) -> ExitResult:
    """The result of a run from its exit code and stderr lines. A
    malformed exited or halted line raises ContractError (its `result`
    then has what could be read, without the exited line's fields)."""
    exited = None
    halted_seq = None
    bad = None
    for line in stderr:
        if line.startswith(EXITED_PREFIX):
            m = EXITED_RE.match(line)
            if m is None:
                bad = bad or "malformed exited line: %s" % _shown(line)
            else:
                exited = m
        h = HALTED_RE.match(line)
        if h:
            if len(h["seq"]) > MAX_SEQ_DIGITS:
                bad = bad or "malformed halted line: %s" % _shown(line)
            else:
                halted_seq = int(h["seq"])
    errors = [ln[len(ERROR_PREFIX):] for ln in stderr if ln.startswith(ERROR_PREFIX)]
    result = ExitResult(
        code=code,
        reason=exited["reason"] if exited and not bad else None,
        count=int(exited["count"]) if exited and not bad else None,
        seconds=float(exited["secs"]) if exited and not bad else None,
        error=errors[0] if errors else None,
        lost_without_goodbye=LOST_WITHOUT_GOODBYE in stderr,
        halted_seq=halted_seq,
        stderr=tuple(stderr),
    )
    if bad is not None:
        raise ContractError(bad, result)
    return result


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
    backoff: Optional[Backoff] = None
    max_in_flight: Optional[int] = None
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
            ("--backoff", backoff_arg(self.backoff)),
            ("--max-in-flight", self.max_in_flight), ("--profile", self.profile),
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


def take_max_events(args: Sequence[str]) -> Tuple[Optional[int], List[str]]:
    """`--max-events N` taken out of a command line: (N, the rest). With
    explicit acks the library counts the events itself, so that the last
    ones' acks reach `dws` before it stops (a `dws` that stops at its own
    `--max-events` may exit before reading them). A value `dws` would
    refuse (not a whole number above 0) is left in, for `dws` to say so."""
    rest: List[str] = []
    limit: Optional[int] = None
    i = 0
    while i < len(args):
        a = args[i]
        value = None
        if a == "--max-events" and i + 1 < len(args):
            value, skip = args[i + 1], 2
        elif a.startswith("--max-events="):
            value, skip = a.split("=", 1)[1], 1
        if value is not None and value.isdigit() and value.isascii() and int(value) > 0:
            limit = int(value)
            i += skip
            continue
        rest.append(a)
        i += 1
    return limit, rest
