"""The AL starts the DM agent and IOC discovery on a first IOU/IOC registration
(``ibal.al.subsystems``): a plain ``reg_pnp(IOC)`` sees the fabric's IOCs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from discovery_world import WAIT, Events, exported

from ibal.al import AccessLayer, AlManager, PnpClass, PnpOrder, PnpRec
from ibal.al.subsystems import Subsystem, parse_enabled
from ibal.clock import ManualClock
from ibal.dm.agent import DmService
from ibal.dm.discovery import Discovery
from ibal.dm.iou import io_unit
from ibal.providers.mock import MockFabric, MockProvider


@dataclass
class Setup:
    mgr: AlManager
    clock: ManualClock
    user: AccessLayer
    iou_guid: int


def _setup(subsystems: bool) -> Iterator[Setup]:
    clock = ManualClock()
    fabric = MockFabric(seed=5)
    for i in range(2):
        fabric.add_ca(description=f"host{i}")
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock, subsystems=subsystems)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        user = mgr.open_al()
        guids = user.get_ca_guids()
        # CA 1 exports one IOC; nothing is started yet
        io_unit(mgr, guids[1]).take_slot(object(), exported(0xC1, [("svc", 0x42)]))
        yield Setup(mgr, clock, user, guids[1])
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


@pytest.fixture
def on() -> Iterator[Setup]:
    yield from _setup(True)


@pytest.fixture
def off() -> Iterator[Setup]:
    yield from _setup(False)


def _step(s: Setup, seconds: float) -> None:
    settle = lambda: s.mgr.queues.flush(timeout=WAIT)  # noqa: E731
    for _ in range(int(seconds / 0.05)):
        settle()
        s.clock.advance(0.05, settle=settle)
    settle()


def test_a_plain_ioc_registration_gets_the_fabric_iocs(on: Setup) -> None:
    assert DmService.of(on.mgr) is None and Discovery.of(on.mgr) is None
    iocs = Events()
    on.user.reg_pnp(PnpClass.IOC, iocs)  # no explicit start
    assert set(on.mgr.subsystems.started) == {"dm_agent", "ioc_discovery"}
    assert on.mgr.subsystems.failed == {}
    assert on.mgr.subsystems.started["ioc_discovery"] is Discovery.of(on.mgr)
    _step(on, 5.0)  # answers need no time; time-outs of silent ports do
    log = iocs.take()
    assert log[0] == ("REG_COMPLETE", 0, 0)
    assert ("IOC_ADD", 0xC1, 0) in [(e, g, 0) for e, g, _ in log]
    # a second registration starts nothing again
    before = dict(on.mgr.subsystems.started)
    on.user.reg_pnp(PnpClass.IOU, Events())
    assert on.mgr.subsystems.started == before


def test_with_subsystems_off_only_reg_complete_arrives(off: Setup) -> None:
    iocs = Events()
    off.user.reg_pnp(PnpClass.IOC, iocs)
    _step(off, 5.0)
    assert iocs.take() == [("REG_COMPLETE", 0, 0)]
    assert off.mgr.subsystems.started == {} and Discovery.of(off.mgr) is None


def test_an_added_subsystem_starts_once_before_the_users_replay(off: Setup) -> None:
    seen: list[str] = []
    calls: list[AlManager] = []

    def start(mgr: AlManager) -> object:
        calls.append(mgr)
        seen.append("start")
        # re-entry: a subsystem registering for its own class is not started again
        mgr.open_al().reg_pnp(PnpClass.IOU, lambda rec: seen.append("sub " + rec.event.name),
                              order=PnpOrder.DM)  # fmt: skip
        return "token"

    def boom(mgr: AlManager) -> object:
        raise RuntimeError("no")

    subs = off.mgr.subsystems
    subs.enabled = frozenset({"fake", "broken"})  # just these (the built-ins stay off)
    subs.add("fake", Subsystem(PnpOrder.DM, frozenset({PnpClass.IOU}), start))
    subs.add("broken", Subsystem(PnpOrder.DM, frozenset({PnpClass.IOU}), boom))

    def user(rec: PnpRec) -> None:
        seen.append("user " + rec.event.name)

    off.user.reg_pnp(PnpClass.IOU | PnpClass.FLAG_REG_SYNC, user)
    off.user.reg_pnp(PnpClass.IOU | PnpClass.FLAG_REG_SYNC, user)
    off.user.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, lambda rec: None)
    assert calls == [off.mgr] and subs.started == {"fake": "token"}
    assert seen.index("start") < seen.index("user REG_COMPLETE")
    assert "broken" in subs.failed and "RuntimeError" in subs.failed["broken"]


def test_enabled_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IBAL_SUBSYSTEMS", raising=False)
    assert parse_enabled(None) is None
    monkeypatch.setenv("IBAL_SUBSYSTEMS", "off")
    assert parse_enabled(None) == frozenset()
    monkeypatch.setenv("IBAL_SUBSYSTEMS", "dm_agent, ioc_discovery")
    assert parse_enabled(None) == {"dm_agent", "ioc_discovery"}
    assert parse_enabled("all") is None and parse_enabled(False) == frozenset()
    assert parse_enabled(["x"]) == {"x"}


def test_ibal_al_does_not_import_ibal_dm() -> None:
    code = ("import sys, ibal.al, ibal.al.subsystems, ibal.subsystems\n"
            "print(sorted(m for m in sys.modules if m.startswith('ibal.dm')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_subsystems_are_found_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              ) -> None:  # fmt: skip
    (tmp_path / "h7_fake_subsystem.py").write_text(
        "from ibal.al import PnpClass, PnpOrder\n"
        "from ibal.al.subsystems import Subsystem\n"
        "started = []\n"
        "spec = Subsystem(PnpOrder.DM, frozenset({PnpClass.IOU}), started.append)\n"
    )
    dist = tmp_path / "h7_fake-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text(
        "[ibal.subsystems]\nextra = h7_fake_subsystem:spec\nbad = h7_fake_subsystem:missing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with AlManager(subsystems="extra,bad") as mgr:
        mgr.open_al().reg_pnp(PnpClass.IOU | PnpClass.FLAG_REG_SYNC, lambda rec: None)
        import h7_fake_subsystem  # type: ignore[import-not-found]

        assert h7_fake_subsystem.started == [mgr]
        assert set(mgr.subsystems.started) == {"extra"}
        assert "h7_fake_subsystem:missing" in mgr.subsystems.failed["bad"]
