"""Each test gets its own bus: fresh DWS_CONFIG_DIR and XDG_RUNTIME_DIR
(as the Rust harness does), `dws` from env DWS_BIN or PATH, and the bus
stopped at the end."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

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
