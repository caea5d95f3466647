"""Consumers against fake `dws` programs that break the contract (issue
36): each run must end within a bound, with a result or the library's
typed error, never hang or leak a bare exception. Sync and asyncio.

The bounds below are generous limits for a hang, not measurements: a
fixed run of these takes a few seconds (`ready_timeout` and, for a dws
that ignores SIGTERM, `stop_grace` are 1 s)."""

import asyncio
import signal
import threading
from typing import Any, Callable, Dict, List

import pytest

from conftest import EVENT, EXITED, READY
from dws_bus import AsyncDws, BusError, ContractError, Dws, ReadyTimeout, consume, consume_async

BOUND = 60.0  # seconds: longer than any fixed run, even on a loaded machine


def bounded(fn: Callable[[], Any]) -> Any:
    """fn(), or a test failure when it did not return within BOUND."""
    out: Dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND)
    if t.is_alive():
        pytest.fail("still waiting after %ss" % BOUND)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def arun(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, BOUND))


# Row 13: a dws that will not stop, or closes its stdio and keeps running.
NO_READY = {
    "ignores_sigterm": "trap '' TERM\nexec $SLEEP 120",
    "closes_stdio": "exec $SLEEP 120 <&- >&- 2>&-",
    "closes_stdio_and_ignores_sigterm": "trap '' TERM\nexec $SLEEP 120 <&- >&- 2>&-",
}
AFTER_READY = {  # (the trap first: a SIGTERM right after the ready line must find it)
    "ignores_sigterm": "trap '' TERM\necho '%s' >&2\nexec $SLEEP 120" % READY,
    "closes_stdio_and_ignores_sigterm":
        "trap '' TERM\necho '%s' >&2\nexec $SLEEP 120 <&- >&- 2>&-" % READY,
}


def killed_as_expected(case: str, code: Any) -> None:
    assert code == (-signal.SIGKILL if "ignores" in case else -signal.SIGTERM), code


def grace(case: str) -> float:
    """1 s for a dws that ignores SIGTERM; a bound for one that does not
    (it ends by SIGTERM, however loaded the machine)."""
    return 1 if "ignores" in case else BOUND / 2


@pytest.mark.parametrize("case", sorted(NO_READY))
def test_a_stuck_dws_without_a_ready_line_is_stopped_then_killed(fake_dws, case: str) -> None:
    dws = fake_dws(NO_READY[case])
    with pytest.raises(ReadyTimeout) as e:
        bounded(lambda: consume(["k"], dws=dws, ready_timeout=1, stop_grace=grace(case)))
    killed_as_expected(case, e.value.code)


@pytest.mark.parametrize("case", sorted(NO_READY))
def test_async_a_stuck_dws_without_a_ready_line_is_stopped_then_killed(fake_dws, case: str) -> None:
    dws = fake_dws(NO_READY[case])

    async def main() -> None:
        with pytest.raises(ReadyTimeout) as e:
            await consume_async(["k"], dws=dws, ready_timeout=1, stop_grace=grace(case))
        killed_as_expected(case, e.value.code)

    arun(main())


@pytest.mark.parametrize("case", sorted(AFTER_READY))
def test_close_kills_a_ready_dws_that_ignores_sigterm(fake_dws, case: str) -> None:
    dws = fake_dws(AFTER_READY[case])
    c = consume(["k"], dws=dws, stop_grace=1)
    r = bounded(c.close)
    assert r.reason is None and r.code == -signal.SIGKILL and not r.ok


@pytest.mark.parametrize("case", sorted(AFTER_READY))
def test_async_close_kills_a_ready_dws_that_ignores_sigterm(fake_dws, case: str) -> None:
    dws = fake_dws(AFTER_READY[case])

    async def main() -> None:
        async with consume_async(["k"], dws=dws, stop_grace=1) as c:
            pass
        assert c.result is not None and c.result.code == -signal.SIGKILL

    arun(main())


# Row 14: tens of megabytes on stderr without a newline.
FLOOD = "\n".join([
    "echo '%s' >&2" % READY,
    "head -c 70000000 /dev/zero | tr '\\0' x >&2",
    "echo >&2",
    "echo '%s'" % (EVENT % (1, "after")),
    "echo '%s' >&2" % (EXITED % (1, "0.500", "limit")),
])


def bounded_stderr(stderr: List[str]) -> None:
    assert max(len(line) for line in stderr) < 1 << 20
    assert any(line.startswith("xxx") and "more bytes discarded" in line for line in stderr)


def test_an_over_long_stderr_line_is_drained_and_cut(fake_dws) -> None:
    dws = fake_dws(FLOOD)
    with consume(["k"], dws=dws) as c:
        events = bounded(lambda: list(c))
    r = c.wait()
    assert [e.data for e in events] == ["after"] and (r.reason, r.count) == ("limit", 1)
    bounded_stderr(list(r.stderr))


def test_async_an_over_long_stderr_line_is_drained_and_cut(fake_dws) -> None:
    dws = fake_dws(FLOOD)

    async def main() -> None:
        async with consume_async(["k"], dws=dws) as c:
            events = [ev async for ev in c]
        r = c.result
        assert r is not None
        assert [e.data for e in events] == ["after"] and (r.reason, r.count) == ("limit", 1)
        bounded_stderr(list(r.stderr))

    arun(main())


def test_an_over_long_ndjson_line_is_a_contract_error(fake_dws, monkeypatch) -> None:
    from dws_bus import _child, consumer
    monkeypatch.setattr(_child, "STDOUT_LINE_LIMIT", 1 << 16)
    monkeypatch.setattr(consumer, "STDOUT_LINE_LIMIT", 1 << 16)
    dws = fake_dws("\n".join([
        "echo '%s' >&2" % READY,
        "head -c 1000000 /dev/zero | tr '\\0' x",
        "echo",
        "echo '%s'" % (EVENT % (2, "next")),
        "echo '%s' >&2" % (EXITED % (2, "0.500", "limit")),
    ]))
    with consume(["k"], dws=dws) as c:
        with pytest.raises(ContractError, match="1000000 bytes is over the limit"):
            bounded(lambda: list(c))
        assert [e.data for e in c] == ["next"]  # the run goes on
    assert c.wait().reason == "limit"


# Row 15: malformed contract lines.
def exits_with(line: str) -> str:
    return "echo '%s' >&2\necho '%s' >&2\nexit 0" % (READY, line)


MALFORMED_END = {
    "seconds_1.2.3": exits_with(EXITED % (0, "1.2.3", "limit")),
    "count_of_5000_digits": exits_with(EXITED % ("9" * 5000, "0.500", "limit")),
    "halted_seq_of_5000_digits": exits_with(
        "[event] subscription s halted at seq %s: delivered 2 times without ack" % ("9" * 5000)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_END))
def test_a_malformed_end_of_run_is_a_contract_error(fake_dws, case: str) -> None:
    dws = fake_dws(MALFORMED_END[case])
    c = consume(["k"], dws=dws)
    assert bounded(lambda: list(c)) == []
    with pytest.raises(ContractError) as e:
        c.wait()
    assert e.value.result is not None and e.value.code == 0
    with pytest.raises(ContractError):
        c.close()  # and again, the same


@pytest.mark.parametrize("case", sorted(MALFORMED_END))
def test_async_a_malformed_end_of_run_is_a_contract_error(fake_dws, case: str) -> None:
    dws = fake_dws(MALFORMED_END[case])

    async def main() -> None:
        with pytest.raises(ContractError) as e:
            async with consume_async(["k"], dws=dws) as c:
                assert [ev async for ev in c] == []
        assert e.value.code == 0

    arun(main())


BAD_READY = ("echo '[event] ready event_key=k bus_pid=%s subscribe_id=s' >&2\nexec $SLEEP 120"
             % ("7" * 5000))


def test_a_malformed_ready_line_is_a_contract_error_at_once(fake_dws) -> None:
    # Far more than the run takes: the error must not wait for the timeout.
    dws = fake_dws(BAD_READY)
    with pytest.raises(ContractError, match="malformed ready line") as e:
        bounded(lambda: consume(["k"], dws=dws, ready_timeout=BOUND, stop_grace=BOUND / 2))
    assert e.value.code == -signal.SIGTERM  # then stopped


def test_async_a_malformed_ready_line_is_a_contract_error_at_once(fake_dws) -> None:
    dws = fake_dws(BAD_READY)

    async def main() -> None:
        with pytest.raises(ContractError, match="malformed ready line"):
            await consume_async(["k"], dws=dws, ready_timeout=BOUND, stop_grace=BOUND / 2)

    arun(main())


# Row 16: the run ends when dws exits, though a grandchild holds its pipes.
GRANDCHILD = "\n".join([
    "echo '%s' >&2" % READY,
    "echo '%s'" % (EVENT % (1, "one")),
    "$SLEEP 120 &",
    "pid $!",
    "echo '%s'" % (EVENT % (2, "two")),
    "echo '%s' >&2" % (EXITED % (2, "0.100", "limit")),
    "exit 0",
])


def test_the_run_ends_at_the_exit_though_a_grandchild_holds_the_pipes(fake_dws) -> None:
    dws = fake_dws(GRANDCHILD)
    with consume(["k"], dws=dws) as c:
        events = bounded(lambda: list(c))
    assert [e.data for e in events] == ["one", "two"]
    r = c.wait()
    assert (r.code, r.reason, r.count) == (0, "limit", 2)


def test_async_the_run_ends_at_the_exit_though_a_grandchild_holds_the_pipes(fake_dws) -> None:
    dws = fake_dws(GRANDCHILD)

    async def main() -> None:
        async with consume_async(["k"], dws=dws) as c:
            events = [ev async for ev in c]
        assert [e.data for e in events] == ["one", "two"]
        r = await c.wait()
        assert (r.code, r.reason, r.count) == (0, "limit", 2)

    arun(main())


# The verbs: the same end (the exit) and the same escalation.
def test_a_verb_ends_at_its_exit_though_a_grandchild_holds_its_pipes(fake_dws) -> None:
    dws = fake_dws("echo '{\"running\":true}'\n$SLEEP 120 &\npid $!\nexit 0")
    assert bounded(lambda: Dws(dws, timeout=BOUND / 2).status()) == {"running": True}

    async def main() -> None:
        assert await AsyncDws(dws, timeout=BOUND / 2).status() == {"running": True}

    arun(main())


def test_a_verb_that_does_not_answer_is_stopped_then_killed(fake_dws) -> None:
    dws = fake_dws("trap '' TERM\nexec $SLEEP 120")
    with pytest.raises(BusError, match="did not answer within 1s"):
        bounded(lambda: Dws(dws, timeout=1, stop_grace=1).status())

    async def main() -> None:
        with pytest.raises(BusError, match="did not answer within 1s"):
            await AsyncDws(dws, timeout=1, stop_grace=1).status()

    arun(main())


# Issue 49, row 6: the first stderr line is over the line limit (64 KiB),
# then dws stays silent. Either way the run ends within ready_timeout (plus
# the stop), with the library's typed error: ReadyTimeout when the line is
# not a ready line, ContractError when it is one, cut.
SILENT_AFTER_LONG_LINE = {
    "not_ready": "head -c 100000 /dev/zero | tr '\\0' x >&2\necho >&2\nexec $SLEEP 120",
    "ready_cut": "printf '[event] ready ' >&2\nhead -c 100000 /dev/zero | tr '\\0' x >&2\n"
                 "echo >&2\nexec $SLEEP 120",
}
LONG_LINE_ERROR = {"not_ready": ReadyTimeout, "ready_cut": ContractError}


@pytest.mark.parametrize("case", sorted(SILENT_AFTER_LONG_LINE))
def test_an_over_long_first_stderr_line_then_silence_ends_the_start(fake_dws, case: str) -> None:
    dws = fake_dws(SILENT_AFTER_LONG_LINE[case])
    with pytest.raises(LONG_LINE_ERROR[case]):
        bounded(lambda: consume(["k"], dws=dws, ready_timeout=2))


@pytest.mark.parametrize("case", sorted(SILENT_AFTER_LONG_LINE))
def test_async_an_over_long_first_stderr_line_then_silence_ends_the_start(fake_dws,
                                                                        case: str) -> None:
    dws = fake_dws(SILENT_AFTER_LONG_LINE[case])

    async def main() -> None:
        with pytest.raises(LONG_LINE_ERROR[case]):
            await consume_async(["k"], dws=dws, ready_timeout=2)

    arun(main())
