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
`consume_forever_async` and `AsyncDws`.
"""

from ._contract import (ConsumeOptions, Duration, Event, ExitResult, Ready, classify,
                        parse_event, parse_exit, parse_ready)
from .aio import AsyncConsumer, consume_async, consume_forever_async
from .cli import AsyncDws, Dws
from .consumer import Consumer, KeepAlive, consume, consume_forever, find_dws
from .errors import (BusError, BusShutdown, ConsumerEnded, DwsError, Halted, PermissionDenied,
                     ReadyTimeout, SourceLost, UsageError)

__version__ = "0.1.0"

__all__ = [
    "AsyncConsumer", "AsyncDws", "BusError", "BusShutdown", "ConsumeOptions", "Consumer",
    "ConsumerEnded", "Duration", "Dws", "DwsError", "Event", "ExitResult", "Halted",
    "KeepAlive", "PermissionDenied", "Ready", "ReadyTimeout", "SourceLost", "UsageError",
    "classify", "consume", "consume_async", "consume_forever", "consume_forever_async",
    "find_dws", "parse_event", "parse_exit", "parse_ready",
]
