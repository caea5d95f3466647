"""Typed errors for `dws` runs: one class per exit code, one per exit reason
that needs someone's attention.

Exit codes (docs/consume-contract.md, "Exit codes"): 1 is `BusError`, 2 is
`UsageError`, 3 is `PermissionDenied` (also a `PermissionError`). Exit 0
with reason `bus_shutdown`, `source_lost` or `halted` becomes `BusShutdown`,
`SourceLost` or `Halted` when a result is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ._contract import ExitResult


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


class BusError(DwsError):
    """Exit 1: runtime failure (bus unreachable or refused, protocol, store,
    subscription not found or attached elsewhere). Retrying may help."""


class UsageError(DwsError):
    """Exit 2: usage or validation error. Retrying will not help."""


class PermissionDenied(DwsError, PermissionError):
    """Exit 3: authentication or permission failure. Retrying will not help."""


class ReadyTimeout(DwsError):
    """No ready line within the timeout; the consumer was stopped."""


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
