"""The CM's path and its threads: a received MAD runs the machine, moves the QP and
sends the answer on the thread that took it off QP1, never by way of the misc queue,
while the user's callbacks still run on the misc queue."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cm_world import WAIT, CmWorld, cm_world, path

from ibal.cm import Connection, connect, listen
from ibal.cm.port import CmPort
from ibal.cm.router import CmRouter
from ibal.types import QpState
from ibal.wire.mad.cm import CmAttr

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = 0x78


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, CmAttr], str]:
    """(``"sent"``/``"received"``, message) -> the name of the thread it happened on."""
    names: dict[tuple[str, CmAttr], str] = {}
    send, on_mad = CmPort.send, CmRouter.on_mad

    def spy_send(self: CmPort, attr: CmAttr, *a: Any, **kw: Any) -> bool:
        names[("sent", CmAttr(attr))] = threading.current_thread().name
        return send(self, attr, *a, **kw)

    def spy_on_mad(self: CmRouter, port: CmPort, mad: bytes, addr: Any) -> None:
        names[("received", CmAttr(int.from_bytes(mad[16:18], "big")))] = \
            threading.current_thread().name  # fmt: skip
        on_mad(self, port, mad, addr)

    monkeypatch.setattr(CmPort, "send", spy_send)
    monkeypatch.setattr(CmRouter, "on_mad", spy_on_mad)
    return names


@pytest.fixture
def world(seen: dict[tuple[str, CmAttr], str]) -> Iterator[CmWorld]:
    yield from cm_world(seed=5)


def test_answers_leave_on_the_thread_their_message_came_on(
    world: CmWorld, seen: dict[tuple[str, CmAttr], str]
) -> None:
    lst = listen(world.a.al, SVC)
    up: list[str] = []
    client = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC,
                     callback=lambda c: up.append(threading.current_thread().name))  # fmt: skip
    server: Connection = lst.get(WAIT).accept(world.a.qp(), callback=lambda c: None)
    client.wait(WAIT)
    server.wait(WAIT)
    client.disconnect(timeout=WAIT)
    server.wait_closed(WAIT)
    lst.close()
    assert client.qp is not None and client.qp.state is QpState.ERROR
    # the RTU answers the REP, the DREP the DREQ: both from the receiving thread
    assert seen[("sent", CmAttr.RTU)] == seen[("received", CmAttr.REP)]
    assert seen[("sent", CmAttr.DREP)] == seen[("received", CmAttr.DREQ)]
    assert not seen[("received", CmAttr.REP)].endswith("-misc")
    assert up and up[0].endswith("-misc")  # the user's callback: the misc queue, as before
