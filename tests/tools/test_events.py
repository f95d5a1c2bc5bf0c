"""``ibal events``: the monitor in-process on the mock (live lines, classes, replay), and the
command as a process on the default provider (replay, then SIGTERM / SIGINT end it cleanly)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibal.al import AlManager, PnpClass
from ibal.providers.mock import MockFabric
from ibal.tools.events import EventMonitor, EventsError, parse_classes
from ibal.types import Gid, IocInfo, IocProfile, IouInfo, LinkState, SvcEntry

WAIT = 30.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fab = MockFabric(seed=3)
    fab.add_ca(ports=1)
    fab.add_ca(ports=1)
    yield fab
    fab.close()


@pytest.fixture
def mgr(fabric: MockFabric) -> Iterator[AlManager]:
    m = AlManager()
    m.start_provider("mock", {"fabric": fabric})
    yield m
    m.close(timeout=WAIT)


def _sync(mgr: AlManager) -> None:
    for _ in range(2):
        assert mgr.queues.flush(WAIT)


def test_parse_classes() -> None:
    assert parse_classes("port, CA") == [PnpClass.CA, PnpClass.PORT]
    assert parse_classes("ca,port,iou,ioc") == [PnpClass.CA, PnpClass.PORT, PnpClass.IOU,
                                                PnpClass.IOC]
    for bad in ("", "ca,disk", ","):
        with pytest.raises(EventsError):
            parse_classes(bad)


def test_live_lines_without_replay(mgr: AlManager, fabric: MockFabric) -> None:
    al = mgr.open_al()
    lines: list[str] = []
    mon = EventMonitor(al, parse_classes("ca,port"), lines.append, stamp=lambda: "T")
    mon.start()
    assert lines == []  # no replay: the current state is left out
    port = fabric.port(fabric.cas[1], 1)
    ca_guid = mgr.ca_guids[1]
    lid = f"0x{port.lid:x}"
    fabric.set_port_state(port, LinkState.DOWN)
    _sync(mgr)
    fabric.set_port_state(port, LinkState.ACTIVE)
    _sync(mgr)
    fabric.set_lid(port, 0x42)
    _sync(mgr)
    hot = fabric.hotplug_add("hot", ports=1)
    _sync(mgr)
    hot_guid = mgr.ca_guids[2]
    hot_port = fabric.port(hot, 1)
    fabric.hotplug_remove(hot)
    _sync(mgr)
    mon.stop()
    fabric.set_port_state(port, LinkState.DOWN)  # after stop: nothing more
    _sync(mgr)
    c, p, h, hp = (f"0x{g:016x}" for g in (ca_guid, port.guid, hot_guid, hot_port.guid))
    assert lines == [
        f"[T] port PORT_DOWN             ca {c} port {p} 1 DOWN lid {lid}",
        f"[T] port PORT_ACTIVE           ca {c} port {p} 1 ACTIVE lid {lid}",
        f"[T] port LID_CHANGE            ca {c} port {p} 1 ACTIVE lid 0x42",
        f"[T] ca   CA_ADD                ca {h} ports 1",
        f"[T] port PORT_ADD              ca {h} port {hp} 1 {lines[4].split()[-3]} lid "
        f"{lines[4].split()[-1]}",
        lines[5],  # the new port's state, whatever the mock's SM made of it
        f"[T] port PORT_REMOVE           ca {h} port {hp} 1 {lines[6].split()[-3]} lid "
        f"{lines[6].split()[-1]}",
        f"[T] ca   CA_REMOVE             ca {h}",
    ]
    assert re.fullmatch(rf"\[T\] port PORT_(ACTIVE|DOWN|INIT|ARMED) +ca {h} port {hp} 1 .*",
                        lines[5])
    assert mon.count == len(lines)
    al.close()


def test_replay_and_io_classes(mgr: AlManager) -> None:
    al = mgr.open_al()
    lines: list[str] = []
    iou = IouInfo(guid=0x500, ca_guid=mgr.ca_guids[0], slot=2, desc="shelf")
    mgr.io_devices.add_iou(iou)
    mon = EventMonitor(al, parse_classes("iou,ioc"), lines.append, replay=True,
                       stamp=lambda: "T")
    mon.start()
    ioc = IocInfo(profile=IocProfile(ioc_guid=0x501, id_string="disk"), iou_guid=0x500,
                  svc_entries=(SvcEntry("srp", 1),))
    mgr.io_devices.add_ioc(ioc)
    path = bytearray(64)
    path[8:24] = Gid("fe80::500").packed
    mgr.io_devices.add_ioc_path(0x501, mgr.ca_guids[0], 0x77, bytes(path))
    _sync(mgr)
    mon.stop()
    ca = f"0x{mgr.ca_guids[0]:016x}"
    assert lines == [
        f"[T] iou  IOU_ADD               iou 0x{0x500:016x} ca {ca} slot 2 'shelf'",
        "[T] iou  REG_COMPLETE          (current state reported)",
        "[T] ioc  REG_COMPLETE          (current state reported)",
        f"[T] ioc  IOC_ADD               ioc 0x{0x501:016x} ca {ca} 'disk' services 1",
        f"[T] ioc  IOC_PATH_ADD          ioc 0x{0x501:016x} ca {ca} port 0x{0x77:016x} "
        "dgid fe80::500",
    ]
    al.close()


def _reader(stream: object) -> queue.Queue[str | None]:
    q: queue.Queue[str | None] = queue.Queue()

    def run() -> None:
        for line in stream:  # type: ignore[attr-defined]
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=run, daemon=True).start()
    return q


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_replays_on_the_default_provider_and_ends_on_a_signal(
        sig: signal.Signals) -> None:
    if os.geteuid() != 0:
        why = "the default provider here is rxe: needs root (raw sockets)"
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{why} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
           "IBAL_RXE_DEVICES": "rxe0=127.0.12.5"}
    env.pop("IBAL_PROVIDERS", None)  # the default set: every non-simulated provider
    p = subprocess.Popen(
        [sys.executable, "-c", "from ibal.cli import main; main()", "events", "--replay",
         "--class", "ca,port"],
        env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        q = _reader(p.stdout)
        lines: list[str] = []
        while not (lines and lines[-1].endswith("(current state reported)")
                   and lines[-1].split()[1] == "port"):
            line = q.get(timeout=WAIT)
            assert line is not None, (lines, p.stderr.read() if p.stderr else "")
            lines.append(line)
        stamp = r"\[\d\d:\d\d:\d\d\.\d{6}\]"
        ca = re.fullmatch(rf"{stamp} ca   CA_ADD +ca (0x[0-9a-f]{{16}}) ports 1", lines[0])
        assert ca, lines
        g = ca.group(1)
        assert re.fullmatch(rf"{stamp} ca   REG_COMPLETE +\(current state reported\)", lines[1])
        assert re.fullmatch(rf"{stamp} port PORT_ADD +ca {g} port 0x[0-9a-f]{{16}} 1 ACTIVE "
                            r"lid 0x0", lines[2]), lines
        assert re.fullmatch(rf"{stamp} port PORT_ACTIVE +ca {g} port .* 1 ACTIVE lid 0x0",
                            lines[3]), lines
        assert len(lines) == 5
        p.send_signal(sig)
        assert p.wait(timeout=WAIT) == 0
        assert q.get(timeout=WAIT) is None  # nothing more, stdout closed
        err = p.stderr.read() if p.stderr else ""
        assert "Traceback" not in err and "monitor: PnP events of ca,port" in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_monitor_starts_ioc_discovery_for_the_io_classes(mgr: AlManager) -> None:
    """``ibal events --class ioc``: the monitor starts the discovery client, so an IOC that
    an agent exports on one CA is printed as found from the other ports."""
    from ibal.dm.agent import DmService
    from ibal.dm.ioc import create_ioc
    from ibal.tools.events import monitor

    al = mgr.open_al()
    DmService.start(mgr)
    ioc = create_ioc(al.open_ca(mgr.ca_guids[1]), IocProfile(ioc_guid=0x600, id_string="tape"))
    ioc.register()
    seen = threading.Event()
    lines: list[str] = []
    stop = threading.Event()

    def out(line: str) -> None:
        lines.append(line)
        if "IOC_PATH_ADD" in line:
            seen.set()
            stop.set()

    t = threading.Thread(target=monitor, args=(al, [PnpClass.IOC], False, out, stop))
    t.start()
    try:
        assert seen.wait(WAIT), lines
    finally:
        stop.set()
        t.join(WAIT)
    assert any(re.search(r"IOC_ADD +ioc 0x0000000000000600 .* 'tape' services 0", x)
               for x in lines), lines  # fmt: skip
    al.close()
