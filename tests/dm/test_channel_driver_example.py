"""examples/ioc_channel_driver.py: the channel driver attaches to every IOC discovery finds
(a CA handle, PD, CQ and an RC QP in INIT on the local port of the path) and detaches when
the IOC goes; on the mock fabric, the clock stepped."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from discovery_world import World, exported, make_world

from ibal.dm.discovery import Discovery
from ibal.status import InvalidHandle
from ibal.types import QpState

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ioc_channel_driver.py"


@pytest.fixture
def world() -> Iterator[World]:
    yield from make_world()


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ioc_channel_driver", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_driver_attaches_to_each_ioc_and_detaches_when_it_goes(
    world: World, example: ModuleType
) -> None:
    driver = example.ChannelDriver(world.mgr.open_al())
    owner = object()
    slot = world.unit.take_slot(owner, exported(0x5A, [("SRP.T10:disk0", 0x2C90200405A00),
                                                       ("admin", 7)], name="disk array"))
    world.unit.take_slot(object(), exported(0x5B, []))
    disc = Discovery.start(world.mgr, interval=None, timeout=0.5, retries=1)
    world.quiet(disc)
    assert sorted(driver.attached) == [0x5A, 0x5B]  # one attachment per IOC, not per path
    a = driver.attached[0x5A]
    assert a.services == ["SRP.T10:disk0=0x2c90200405a00", "admin=0x7"]
    attr = a.qp.query()
    assert attr.state is QpState.INIT
    dm_port = world.user.query_ca_by_guid(world.iou_guid).ports[0]
    assert a.dlid == dm_port.lid  # the path leads to the IOU's port
    assert driver.journal[0].startswith("attached 0x5a 'disk array' via port 1 of ")

    world.unit.free_slot(slot, owner)
    world.quiet(disc)
    assert sorted(driver.attached) == [0x5B] and driver.journal[-1] == "detached 0x5a"
    world.settle()
    with pytest.raises(InvalidHandle):
        a.qp.query()  # the QP went with the IOC
    driver.close()
    assert driver.attached == {}


def test_the_example_runs_as_written() -> None:
    """``python3 examples/ioc_channel_driver.py``: an IOC made with ``create_ioc`` on one
    mock CA, attached to once, detached when destroyed (real clock, its own process)."""
    root = EXAMPLE.parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=root)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert re.fullmatch(r"attached 0x5a 'disk array' via port 1 of mock\d to LID \d+: "
                        r"SRP\.T10:disk0=0x2c90200405a00", lines[0]), lines[0]  # fmt: skip
    assert lines[1] == "detached 0x5a"
