"""The verbs (`Dws`) against a real bus: replies and typed errors."""

import pytest

from dws_bus import BusError, Dws, UsageError


def test_publish_is_idempotent_with_an_id(dws: Dws) -> None:
    first = dws.publish("demo.hello", {"n": 1}, id="e1")
    again = dws.publish("demo.hello", {"n": 1}, id="e1")
    assert (first["duplicate"], again["duplicate"], again["seq"]) == (False, True, first["seq"])
    assert first["event_id"] == "e1"


def test_subscribe_status_unsubscribe_and_stop(dws: Dws) -> None:
    s = dws.subscribe(["a.*", "b"], id="s1", ttl=60, max_deliver=3, backoff=["1s", "10s"])
    assert (s["id"], s["created"], s["patterns"]) == ("s1", True, ["a.*", "b"])
    assert dws.subscribe(["a.*", "b"], id="s1", ttl=60, max_deliver=3, backoff=["1s", "10s"])["created"] is False
    st = dws.status()
    assert st["running"] is True and [x["id"] for x in st["subscriptions"]] == ["s1"]
    assert dws.disable("s1")["state"] == "disabled"
    assert dws.enable("s1")["state"] == "active"
    assert dws.seek("s1", "earliest")["seek"]["from_seq"] >= 0
    with pytest.raises(BusError) as e:
        dws.unsubscribe("s1", "nope")
    assert e.value.reply == {"removed": ["s1"], "not_found": ["nope"]}
    assert dws.stop()["bus_stopping"] is True
    assert dws.status()["running"] is False


def test_verbs_raise_typed_errors(dws: Dws) -> None:
    dws.subscribe("a.*", id="s1")
    with pytest.raises(BusError) as e:
        dws.skip("s1")
    assert e.value.code == 1 and "not halted" in (e.value.error or "")
    with pytest.raises(BusError):
        dws.restart("nosuch")
    with pytest.raises(UsageError) as u:
        dws.subscribe("bad key!")
    assert u.value.code == 2
    with pytest.raises(UsageError):
        dws.subscription("no-such-verb", "s1")


def test_backoff_is_a_string_a_duration_or_a_list(dws: Dws) -> None:
    assert dws.subscribe("a.*", id="s1", backoff="1s")["created"] is True
    assert dws.subscription("info", "s1")["backoff_ms"] == [1000]
    dws.subscribe("a.*", id="s2", backoff="1s,1m")
    dws.subscribe("a.*", id="s3", backoff=2)
    dws.subscribe("a.*", id="s4", backoff=["1s", 60])
    assert [dws.subscription("info", s)["backoff_ms"] for s in ("s2", "s3", "s4")] == [
        [1000, 60000], [2000], [1000, 60000]]
