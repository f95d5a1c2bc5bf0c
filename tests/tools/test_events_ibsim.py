"""``ibal events`` under umad2sim on ibsim: the rdma_core provider's MAD-only CA, its port taken
down and up on ibsim's console; the umad backend's port watch reaches PnP and the monitor."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TextIO

import pytest

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]
NODE = "Host"
WAIT = 60.0


def _lines(stream: TextIO) -> queue.Queue[str | None]:
    q: queue.Queue[str | None] = queue.Queue()

    def run() -> None:
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=run, daemon=True).start()
    return q


def _wait(q: queue.Queue[str | None], pattern: str, seen: list[str]) -> re.Match[str]:
    while True:
        line = q.get(timeout=WAIT)
        assert line is not None, f"the monitor ended before {pattern!r}; saw {seen}"
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m


@pytest.mark.timeout(300)
def test_events_follow_an_ibsim_link_down_and_up(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    env = fabric.env_for(NODE)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env.pop("IBAL_PROVIDERS", None)
    p = subprocess.Popen(
        [sys.executable, "-c", "from ibal.cli import main; main()", "events", "-p", "rdma_core",
         "--class", "port", "--replay"],
        env=env, cwd=fabric.workdir, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        q = _lines(p.stdout)
        seen: list[str] = []
        port = r"ca (0x[0-9a-f]{16}) port (0x[0-9a-f]{16}) 1"
        up = _wait(q, rf"port PORT_ACTIVE +{port} ACTIVE lid (0x[0-9a-f]+)$", seen)
        _wait(q, r"port REG_COMPLETE", seen)
        fabric.unlink(NODE, 1)
        down = _wait(q, rf"port PORT_DOWN +{port} DOWN lid", seen)
        assert down.group(2) == up.group(2)
        fabric.relink(NODE, 1)  # OpenSM brings it back with its LID
        again = _wait(q, rf"port PORT_ACTIVE +{port} ACTIVE lid (0x[0-9a-f]+)$", seen)
        assert (again.group(2), again.group(3)) == (up.group(2), up.group(3)), seen
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=WAIT) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.returncode and p.stderr is not None:
            print(p.stderr.read()[-4000:])
