"""Each test gets its own bus: fresh DWS_CONFIG_DIR and XDG_RUNTIME_DIR
(as the Rust harness does), `dws` from env DWS_BIN or PATH, and the bus
stopped at the end. `fake_dws` writes small shell programs that stand in
for a `dws` that breaks the contract, and kills what they left running."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

# Run from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dws_bus import Dws  # noqa: E402


def dws_bin() -> str:
    found = os.environ.get("DWS_BIN") or shutil.which("dws")
    if not found:
        pytest.fail("set DWS_BIN to a built dws (e.g. target/debug/dws) or put dws on PATH")
    return found


@pytest.fixture(autouse=True)
def bus_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private bus for one test; yields its config dir."""
    # Short paths: the socket lives under XDG_RUNTIME_DIR (sun_path limit).
    root = Path(tempfile.mkdtemp(prefix="dwspy"))
    cfg, run = root / "cfg", root / "run"
    cfg.mkdir()
    run.mkdir(mode=0o700)
    os.chmod(run, 0o700)
    monkeypatch.setenv("DWS_BIN", dws_bin())
    monkeypatch.setenv("DWS_CONFIG_DIR", str(cfg))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.delenv("DWS_PROFILE", raising=False)
    try:
        yield cfg
    finally:
        stop = subprocess.run([os.environ["DWS_BIN"], "event", "stop", "--format", "json"],
                              capture_output=True, text=True, timeout=30)
        try:
            wait_gone(json.loads(stop.stdout).get("bus_pid"))
        except ValueError:
            pass
        # A bus the test stopped itself may still be exiting (and writing):
        # each busd keeps its pid in its bus.lock.
        for lock in cfg.glob("events/*/bus.lock"):
            try:
                wait_gone(int(lock.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        remove(root)


def remove(root: Path) -> None:
    """Removes a test's directory, trying again for a while if something
    still wrote into it."""
    for _ in range(200):
        try:
            shutil.rmtree(root)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)


def wait_gone(pid: Optional[int]) -> None:
    """Waits (bounded) until process `pid` has exited."""
    for _ in range(200):
        if not pid:
            return
        try:
            os.kill(pid, 0)
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return  # exited; its new parent reaps it
        except OSError:
            return
        time.sleep(0.05)


@pytest.fixture
def dws() -> Dws:
    return Dws()


READY = "[event] ready event_key=k bus_pid=1 subscribe_id=s"
EXITED = "[event] exited \u2014 received %s event(s) in %ss (reason: %s)"
EVENT = '{"type":"event","seq":%d,"event_type":"k","data":"%s"}'


@pytest.fixture
def fake_dws() -> Iterator[Callable[[str], str]]:
    """`make(body)`: the path of a `/bin/sh` program running `body`, which
    records the pids it leaves running with `pid $$` (`pid $!` for a
    background job) and sleeps with `$SLEEP SECS` (a `sleep` under the
    fake's directory, so that its command line names it). At the end each
    recorded process still running one of these is killed."""
    root = Path(tempfile.mkdtemp(prefix="dwsfake"))
    pids = root / "pids"
    sleep = root / "sleep"
    sleep.symlink_to(shutil.which("sleep") or "/bin/sleep")
    made: List[str] = []

    def make(body: str) -> str:
        path = root / ("dws%d" % len(made))
        made.append(str(path))
        path.write_text("#!/bin/sh\nSLEEP='%s'\npid() { echo \"$1\" >> '%s'; }\npid $$\n%s\n"
                        % (sleep, pids, body), encoding="utf-8")
        path.chmod(0o755)
        return str(path)

    try:
        yield make
    finally:
        for word in (pids.read_text().split() if pids.exists() else []):
            try:
                with open("/proc/%s/cmdline" % word, "rb") as f:
                    ours = str(root).encode() in f.read()
                if ours:
                    os.kill(int(word), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(root, ignore_errors=True)
