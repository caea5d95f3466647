"""The pure parts of the contract, without a bus."""

import datetime

import pytest

from dws_bus import (BusError, BusShutdown, ConsumeOptions, ContractError, DwsError, Halted,
                     PermissionDenied, SourceLost, UsageError, classify, parse_event, parse_exit,
                     parse_ready)
from dws_bus._contract import duration_arg, take_max_events

EXITED = "[event] exited \u2014 received 3 event(s) in 2.004s (reason: %s)"


def test_ready_line_is_parsed() -> None:
    r = parse_ready("[event] ready event_key=a.*,b bus_pid=42 subscribe_id=sub-42-1")
    assert r is not None and (r.event_key, r.bus_pid, r.subscribe_id) == ("a.*,b", 42, "sub-42-1")
    assert parse_ready("[event] ready") is None


def test_exit_lines_make_the_result() -> None:
    r = parse_exit(0, ["[event] gap \u2014 lost 1 event(s) before seq 5 (retention)", EXITED % "limit"])
    assert (r.code, r.reason, r.count, r.seconds, r.action, r.ok) == (0, "limit", 3, 2.004, "done", True)
    assert r.check() is r
    r = parse_exit(2, ["Error: invalid event key"])
    assert (r.reason, r.error, r.action) == (None, "invalid event key", "fix-usage")


@pytest.mark.parametrize("code,lines,cls", [
    (2, ["Error: bad"], UsageError),
    (1, ["Error: not found"], BusError),
    (3, ["Error: secret readable"], PermissionDenied),
    (0, [EXITED % "bus_shutdown"], BusShutdown),
    (0, [EXITED % "source_lost"], SourceLost),
    (0, ["[event] subscription s halted at seq 7: delivered 2 times without ack", EXITED % "halted"], Halted),
    (-9, [], DwsError),
])
def test_check_raises_the_typed_error(code, lines, cls) -> None:
    with pytest.raises(cls) as e:
        parse_exit(code, lines).check()
    assert e.value.result is not None and e.value.code == code
    if code == 3:
        assert isinstance(e.value, PermissionError)
    if cls is Halted:
        assert e.value.result.halted_seq == 7


def test_actions_match_the_readme_table() -> None:
    assert classify(0, "bus_shutdown", True)[0] == "restart"
    assert classify(0, "signal", False)[0] == "stopped"
    assert classify(0, "taken_over", False)[0] == "done"
    assert classify(0, "stopped", False)[0] == "done"
    assert classify(0, "halted", False)[0] == "inspect-poison"
    assert classify(0, "newer", False)[0] == "inspect"
    assert classify(1, None, False)[0] == "retry"


def test_event_lines_keep_known_and_unknown_fields() -> None:
    line = ('{"type":"event","seq":2,"event_id":"e","event_type":"a.b","subscribe_id":"s",'
            '"source_id":"local","data":"{\\"n\\":2}","headers":{"h":"v"},'
            '"received_at_unix_ms":5,"redelivered":true,"delivery":2,"later":1}')
    ev = parse_event(line)
    assert ev is not None
    assert (ev.seq, ev.type, ev.data, ev.json(), ev.headers, ev.delivery, ev.redelivered) == (
        2, "a.b", '{"n":2}', {"n": 2}, {"h": "v"}, 2, True)
    assert ev.extra == {"later": 1}
    decoded = parse_event(line, decode_data=True)
    assert decoded is not None and decoded.data == {"n": 2}
    text = parse_event('{"seq":1,"event_type":"t","data":"text"}', True)
    assert text is not None and text.data == "text"
    # A dws that sends data as an object (e.g. a later `--data json`) works too.
    obj = parse_event('{"seq":1,"event_type":"t","data":{"a":1}}')
    assert obj is not None and obj.data == {"a": 1} and obj.json() == {"a": 1}
    assert parse_event("not json") is None and parse_event("[1]") is None
    with pytest.raises(DwsError):
        ev.ack()  # not from a consumer


def test_options_build_the_command_line() -> None:
    o = ConsumeOptions(keys=["a.*", "b"], subscribe_id=None, from_="earliest", max_events=3,
                       ack="explicit", ack_wait=1.5, backoff=["1s", datetime.timedelta(minutes=1)],
                       takeover=True, extra_args=["--filter-json", "{}"])
    assert o.argv() == ["a.*", "b", "--from", "earliest", "--max-events", "3", "--ack", "explicit",
                        "--ack-wait", "1500ms", "--backoff", "1s,60000ms", "--takeover",
                        "--filter-json", "{}"]
    assert o.explicit_ack
    assert ConsumeOptions(keys="k").argv() == ["k"]
    with pytest.raises(ValueError):
        duration_arg(-1)


def test_malformed_contract_lines_are_contract_errors() -> None:
    for line in ["[event] ready event_key=k bus_pid=%s subscribe_id=s" % ("7" * 5000),
                 "[event] ready event_key=k bus_pid=x subscribe_id=s",
                 "[event] ready event_key=k bus_pid=1 subscribe_id=s " + "x" * 10]:
        with pytest.raises(ContractError):
            parse_ready(line)
    for line in [EXITED.replace("2.004", "1.2.3") % "limit",
                 EXITED.replace("3", "9" * 5000) % "limit",
                 EXITED % "limit" + " ...(5 more bytes discarded)",
                 "[event] subscription s halted at seq %s: x" % ("9" * 5000)]:
        with pytest.raises(ContractError) as e:
            parse_exit(0, ["Error: first", line])
        assert e.value.result is not None and e.value.result.error == "first"


def test_backoff_and_max_events_on_the_command_line() -> None:
    assert ConsumeOptions(keys="k", backoff="1s").argv() == ["k", "--backoff", "1s"]
    assert ConsumeOptions(keys="k", backoff=1.5).argv() == ["k", "--backoff", "1500ms"]
    assert ConsumeOptions(keys="k", backoff=[]).argv() == ["k"]
    assert take_max_events(["k", "--max-events", "3", "--ack=explicit"]) == (3, ["k", "--ack=explicit"])
    assert take_max_events(["k", "--max-events=2"]) == (2, ["k"])
    # What dws would refuse stays for dws to say so.
    assert take_max_events(["k", "--max-events", "0"]) == (None, ["k", "--max-events", "0"])


def test_the_package_has_no_import_circle() -> None:
    # Every import between the package's modules, also those only for type
    # checkers, must form no cycle (issue 32).
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parent.parent / "dws_bus"
    graph = {}
    for f in pkg.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.add(node.module or "__init__")
        graph[f.stem] = deps - {"__init__"}

    def visit(mod, path):
        assert mod not in path, "import circle: " + " -> ".join(path + [mod])
        for dep in graph.get(mod, ()):
            visit(dep, path + [mod])

    for mod in graph:
        visit(mod, [])
