"""The asyncio consumer and verbs against a real bus."""

import asyncio
from typing import List, Tuple

import pytest

from dws_bus import AsyncDws, BusShutdown, Ready, UsageError, consume_async, consume_forever_async


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_async_streams_until_the_limit() -> None:
    async def main() -> None:
        dws = AsyncDws()
        c = await consume_async(["ex.*"], max_events=2)
        async with c:
            await dws.publish("ex.a", {"n": 1})
            await dws.publish("ex.b", "two")
            events = [ev async for ev in c]
        assert [e.json() if e.event_type == "ex.a" else e.data for e in events] == [{"n": 1}, "two"]
        assert (c.result.reason, c.result.count) == ("limit", 2)  # type: ignore[union-attr]

    run(main())


def test_async_explicit_acks_and_keep_alive() -> None:
    async def main() -> None:
        dws = AsyncDws()
        await dws.subscribe("ack.*", id="s1")
        async with await consume_async(subscribe_id="s1", ack="explicit", ack_wait="1s") as c:
            await dws.publish("ack.a", "slow")
            await dws.publish("ack.a", "fast")
            async for ev in c:
                if ev.data == "slow":
                    assert await c.keep_alive(asyncio.sleep(2.2), 0.2) >= 1
                ev.ack()
                if ev.data == "fast":
                    break
        assert c.result is not None and c.result.reason == "signal"
        s1 = [s for s in (await dws.status())["subscriptions"] if s["id"] == "s1"][0]
        assert (s1["acked"], s1["pending"], s1["redelivered"]) == (2, 0, 0), s1

    run(main())


def test_async_usage_error_and_bus_shutdown() -> None:
    async def main() -> None:
        with pytest.raises(UsageError):
            await consume_async(["bad key!"])
        c = await consume_async(["ex.*"])
        await AsyncDws().stop()
        assert [ev async for ev in c] == []
        with pytest.raises(BusShutdown):
            (await c.wait()).check()

    run(main())


def test_async_forever_attaches_again_after_dws_event_stop() -> None:
    async def main() -> None:
        dws = AsyncDws()
        await dws.subscribe("re.*", id="s1")
        readies: List[Ready] = []
        got: List[Tuple[str, bool]] = []
        async for ev in consume_forever_async(subscribe_id="s1", restarts=1,
                                              on_ready=readies.append):
            got.append((ev.data, ev.redelivered))
            if len(got) == 1:
                await dws.stop()  # a clean stop: the next run starts a new bus
                await dws.publish("re.a", "second")
            elif ev.data == "second":
                break
        # At least once: "first" may come again (its ack raced the stop).
        assert got[0] == ("first", False) and got[-1] == ("second", False), got
        assert all(g == ("first", True) for g in got[1:-1]), got
        assert len(readies) == 2 and readies[0].bus_pid != readies[1].bus_pid

    async def publish_first() -> None:
        await AsyncDws().subscribe("re.*", id="s1")
        await AsyncDws().publish("re.a", "first")

    run(publish_first())
    run(main())


def test_async_with_consume_async_as_documented() -> None:
    # The docs' form: consume_async(...) is an async context manager too.
    async def main() -> None:
        dws = AsyncDws()
        async with consume_async(["ex.*"], max_events=1) as c:
            await dws.publish("ex.a", "one")
            assert [ev.data async for ev in c] == ["one"]
        assert c.result is not None and c.result.reason == "limit"
        plain = await consume_async(["ex.*"])  # and awaited, as before
        assert (await plain.close()).reason == "signal"

    run(main())


def test_async_max_events_with_explicit_acks_keeps_the_handlers_acks() -> None:
    async def main() -> None:
        dws = AsyncDws()
        await dws.subscribe("me.*", id="s5")
        for n in range(2):
            await dws.publish("me.a", str(n))
        async with consume_async(subscribe_id="s5", ack="explicit", max_events=2) as c:
            async for ev in c:
                await asyncio.sleep(0.1)  # a handler that takes its time
                ev.ack()
        assert c.result is not None and (c.result.reason, c.result.count) == ("limit", 2)
        info = await dws.subscription("info", "s5")
        assert (info["pending"], info["acked"]) == (0, 2), info

    run(main())
