"""PnP sources: the mock's port state, LID, SM, P_Key and ClientReregister on demand; CAs
hot-added and withdrawn by a provider while registrations watch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ibal.al import AlManager, PnpClass, PnpEvent, PnpOrder, PnpRec
from ibal.status import InvalidParameter
from ibal.types import LinkState

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

from ibal.providers.mock import MockFabric

WAIT = 10.0
E = PnpEvent
SYNC = PnpClass.FLAG_REG_SYNC


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fab = MockFabric(seed=12)
    fab.add_ca(ports=1)  # mock0: the SM's port
    fab.add_ca(ports=2)  # mock1: the ports the tests change
    yield fab
    fab.close()


@pytest.fixture
def mgr(fabric: MockFabric) -> Iterator[AlManager]:
    m = AlManager()
    m.start_provider("mock", {"fabric": fabric})
    yield m
    m.close(timeout=WAIT)


def _sync(mgr: AlManager) -> None:
    for _ in range(2):  # port events become PnP events on the misc queue
        assert mgr.queues.flush(WAIT)


def test_mock_port_changes_on_demand(mgr: AlManager, fabric: MockFabric) -> None:
    al = mgr.open_al()
    port = fabric.port(fabric.cas[1], 2)
    seen: list[tuple[PnpEvent, LinkState, int, int, tuple[int, ...]]] = []

    def cb(rec: PnpRec) -> None:
        if rec.guid == port.guid and rec.port_attr is not None:
            a = rec.port_attr
            seen.append((rec.event, a.link_state, a.lid, a.sm_lid, a.pkeys))

    al.reg_pnp(PnpClass.PORT | SYNC, cb)
    lid, sm = port.lid, fabric.sm_lid
    assert seen[-1][:2] == (E.PORT_ACTIVE, LinkState.ACTIVE)
    seen.clear()
    steps = [
        (lambda: fabric.set_port_state(port, LinkState.DOWN), E.PORT_DOWN),
        (lambda: fabric.set_port_state(port, LinkState.INIT), E.PORT_INIT),
        (lambda: fabric.set_port_state(port, LinkState.ARMED), E.PORT_ARMED),
        (lambda: fabric.set_port_state(port, LinkState.ACTIVE), E.PORT_ACTIVE),
        (lambda: fabric.set_lid(port, 0x77), E.LID_CHANGE),
        (lambda: fabric.set_pkeys(port, [0xFFFF, 0x8001]), E.PKEY_CHANGE),
        (lambda: fabric.client_reregister(port), E.CLIENT_REREGISTER),
    ]
    for change, _ in steps:
        change()
        _sync(mgr)  # one by one: queued changes of one port coalesce
    assert [s[0] for s in seen] == [e for _, e in steps]
    assert [s[1] for s in seen[:4]] == [LinkState.DOWN, LinkState.INIT, LinkState.ARMED,
                                        LinkState.ACTIVE]
    assert seen[3][2] == lid and seen[4][2] == 0x77
    assert seen[5][4] == (0xFFFF, 0x8001)
    seen.clear()
    fabric.set_sm_lid(0x77)  # this port becomes the SM's
    _sync(mgr)
    assert seen == [(E.SM_CHANGE, LinkState.ACTIVE, 0x77, 0x77, (0xFFFF, 0x8001))]
    assert sm != 0x77
    with pytest.raises(InvalidParameter):
        fabric.set_port_state(port, "up")  # type: ignore[arg-type]
    al.close()


def test_hot_add_and_remove_reach_subsystems_first_and_last(mgr: AlManager,
                                                            fabric: MockFabric) -> None:
    al = mgr.open_al()
    order: list[tuple[str, PnpEvent]] = []

    def cb(tag: str) -> object:
        return lambda rec: order.append((tag, rec.event))

    al.reg_pnp(PnpClass.CA | SYNC, cb("user"))
    al.reg_pnp(PnpClass.CA | SYNC, cb("cm"), order=PnpOrder.CM)
    al.reg_pnp(PnpClass.CA | SYNC, cb("sa"), order=PnpOrder.SA)
    order.clear()
    hot = fabric.hotplug_add("hot", ports=1)
    _sync(mgr)
    fabric.hotplug_remove(hot)
    _sync(mgr)
    assert order == [("sa", E.CA_ADD), ("cm", E.CA_ADD), ("user", E.CA_ADD),
                     ("user", E.CA_REMOVE), ("cm", E.CA_REMOVE), ("sa", E.CA_REMOVE)]
    al.close()
