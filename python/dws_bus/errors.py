"""Typed errors for `dws` runs, and `ExitResult`, how a run ended, which
they carry: one class per exit code, one per exit reason that needs
someone's attention, and `ContractError` for a `dws` that broke the
consume contract. This module imports nothing else of the package (the
contract's parsers in `_contract.py` build on it, not the other way).

Exit codes (docs/consume-contract.md, "Exit codes"): 1 is `BusError`, 2 is
`UsageError`, 3 is `PermissionDenied` (also a `PermissionError`). Exit 0
with reason `bus_shutdown`, `source_lost` or `halted` becomes `BusShutdown`,
`SourceLost` or `Halted` when a result is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


class DwsError(Exception):
    """Any failure of a `dws` run. `result` is the run's `ExitResult` (when
    it exited), `error` the text of its `Error:` line (or None)."""

    def __init__(self, message: str, result: Optional["ExitResult"] = None) -> None:
        super().__init__(message)
        self.result = result
        self.error: Optional[str] = result.error if result is not None else None
        # A verb's JSON reply printed despite the failure (e.g. unsubscribe's
        # removed / not_found), else None.
        self.reply: Optional[Dict[str, Any]] = None

    @property
    def code(self) -> Optional[int]:
        """The exit code, or None when it did not exit (or was killed)."""
        return self.result.code if self.result is not None else None

    def with_result(self, result: Optional["ExitResult"]) -> "DwsError":
        """This error, now carrying the run's result (once it exited)."""
        self.result = result
        self.error = result.error if result is not None else None
        return self


class BusError(DwsError):
    """Exit 1: runtime failure (bus unreachable or refused, protocol, store,
    subscription not found or attached elsewhere). Retrying may help."""


class UsageError(DwsError):
    """Exit 2: usage or validation error. Retrying will not help."""


class PermissionDenied(DwsError, PermissionError):
    """Exit 3: authentication or permission failure. Retrying will not help."""


class ReadyTimeout(DwsError):
    """No ready line within the timeout; the consumer was stopped."""


class ExitTimeout(DwsError):
    """`wait(timeout)` returned before the run ended; it goes on."""


class ContractError(DwsError):
    """The `dws` broke the consume contract: a ready or exited line that
    does not parse (a field out of range, an over-long line), or an NDJSON
    line over the line limit. Not a `dws` this library can drive."""


class ConsumerEnded(DwsError):
    """Exit 0 with a reason that ended the run from the bus's side."""


class BusShutdown(ConsumerEnded):
    """Reason `bus_shutdown`: the bus stopped or this consumer was
    unsubscribed or stopped. Running again is right (a durable
    subscription resumes)."""


class SourceLost(ConsumerEnded):
    """Reason `source_lost`: the upstream is gone for good. Do not loop."""


class Halted(ConsumerEnded):
    """Reason `halted`: the subscription stopped at a poison event; an
    operator runs `subscription restart|skip`."""


def error_for_code(code: int, message: str, result: Optional["ExitResult"] = None) -> DwsError:
    """The exception for a non-zero exit code."""
    if code == 2:
        return UsageError(message, result)
    if code == 3:
        return PermissionDenied(message, result)
    if code == 1:
        return BusError(message, result)
    return DwsError(message, result)


# (exit code, reason) -> (action, why). Exit 0 always has a reason.
ACTIONS: Dict[str, Tuple[str, str]] = {
    "limit": ("done", "--max-events reached"),
    "timeout": ("done", "--duration elapsed"),
    "signal": ("stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"),
    "bus_shutdown": (
        "restart",
        "the bus stopped (dws event stop, SIGTERM) or this consumer was"
        " unsubscribed: run again (a durable --subscribe-id resumes)",
    ),
    "stopped": (
        "done",
        "an operator stopped this consumer (dws event stop --subscribe-id):"
        " do not restart it",
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
