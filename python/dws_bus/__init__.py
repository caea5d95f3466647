"""dws_bus: run `dws event consume` and the other `dws event` verbs from
Python, following the consume contract (docs/consume-contract.md).

    from dws_bus import Dws, consume

    Dws().subscribe("demo.*", id="worker")
    with consume(subscribe_id="worker", ack="explicit") as c:
        for ev in c:
            print(ev.seq, ev.event_type, ev.json())
            ev.ack()
    print(c.result.reason)  # limit, timeout, signal, bus_shutdown, ...

Standard library only; asyncio variants in `consume_async`,
`consume_forever_async` and `AsyncDws`. Modules: `errors` (the typed
errors and ExitResult; it imports no other module of the package),
`_contract` (the contract's lines, pure), `_child` (the child process and
its pipes), `consumer`, `aio`, `cli`.
"""

from ._contract import ConsumeOptions, Duration, Event, Ready, parse_event, parse_exit, parse_ready
from .aio import AsyncConsumer, StartingConsumer, consume_async, consume_forever_async
from .cli import AsyncDws, Dws
from .consumer import STOP_GRACE, Consumer, KeepAlive, consume, consume_forever, find_dws
from .errors import (BusError, BusShutdown, ConsumerEnded, ContractError, DwsError, ExitResult,
                     ExitTimeout, Halted, PermissionDenied, ReadyTimeout, SourceLost, UsageError,
                     classify)

__version__ = "0.1.0"

__all__ = [
    "AsyncConsumer", "AsyncDws", "BusError", "BusShutdown", "ConsumeOptions", "Consumer",
    "ConsumerEnded", "ContractError", "Duration", "Dws", "DwsError", "Event", "ExitResult",
    "ExitTimeout", "Halted", "KeepAlive", "PermissionDenied", "Ready", "ReadyTimeout",
    "STOP_GRACE", "SourceLost", "StartingConsumer", "UsageError", "classify", "consume",
    "consume_async", "consume_forever", "consume_forever_async", "find_dws", "parse_event",
    "parse_exit", "parse_ready",
]
