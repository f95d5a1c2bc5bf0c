"""The classic synchronous PnP callback, and CLIENT_REREGISTER, on the mock fabric."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ibal.al import (
    AccessLayer,
    AlManager,
    Ca,
    Dependent,
    McastAttachment,
    PnpClass,
    PnpEvent,
    PnpRec,
    QpCreate,
)
from ibal.status import InvalidHandle, InvalidMcastHandle
from ibal.types import (
    MAD_SIZE,
    AsyncEvent,
    AvAttr,
    DgrmInfo,
    EventRecord,
    Gid,
    Grh,
    LinkState,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    WcStatus,
)

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

from ibal.providers.mock import MockFabric
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, Side, make_side, wait_wc

WAIT = 10.0
MGID = Gid("ff12:401b:ffff::5a")
MLID = 0xC05A


@dataclass(frozen=True)
class PortPath:
    """What the stand-in query answers: the port's LID and the path to its SM."""

    slid: int
    sm_lid: int


class SmaQuery(Dependent):
    """A stand-in for an SA path query until the SA client exists.

    It hangs on a port, asks the port's SMA (a PortInfo Get through ``local_mad``)
    from the misc queue and answers through ``post_callback``, as the SA client
    will answer from its MAD completion: the answer reaches a waiter on another
    queue, and a destroy cancels it.
    """

    def __init__(self, ca: Ca, port_num: int) -> None:
        self._ca = ca
        self.answer: PortPath | None = None
        self.done = threading.Event()
        super().__init__((ca, port_num))
        self.post_callback(self._ask)

    def _ask(self) -> None:
        mad = bytearray(MAD_SIZE)
        mad[0:4] = bytes([1, 0x01, 1, 0x01])  # SubnGet, LID-routed SMP
        struct.pack_into(">Q", mad, 8, 0x5A)  # TID
        struct.pack_into(">H2xI", mad, 16, 0x0015, self.port_num)  # PortInfo
        with self.use():
            resp = self._ca.local_mad(self.port_num, bytes(mad))
        lid, sm_lid = struct.unpack_from(">HH", resp, 64 + 16)
        self.post_callback(self._answered, PortPath(lid, sm_lid))

    def _answered(self, path: PortPath) -> None:
        self.answer = path
        self.done.set()

    def on_destroying(self) -> None:
        self.done.set()  # a waiter wakes and finds no answer

    def wait(self, timeout: float) -> PortPath:
        if not self.done.wait(timeout) or self.answer is None:
            raise InvalidHandle("the query was cancelled")
        return self.answer


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fab = MockFabric(seed=6)
    fab.add_ca(ports=1)  # mock0: the SM's port, stays up
    fab.add_ca(ports=1)  # mock1: the port the test bounces
    yield fab
    fab.close()


@pytest.fixture
def mgr(fabric: MockFabric) -> Iterator[AlManager]:
    m = AlManager()
    m.start_provider("mock", {"fabric": fabric})
    yield m
    m.close(timeout=WAIT)


def _ud(ca: Ca) -> Side:
    port = next(p for p in ca.query().ports)
    side = make_side(ca, port, QpType.UD)
    side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
    return side


def test_port_active_callback_queries_then_joins_synchronously(
    mgr: AlManager, fabric: MockFabric
) -> None:
    al: AccessLayer = mgr.open_al()
    sender_ca, ca = (al.open_ca(g) for g in al.get_ca_guids())
    sender, receiver = _ud(sender_ca), _ud(ca)
    mock_port = fabric.port(fabric.cas[1], 1)
    fabric.set_link(mock_port, up=False)
    assert mgr.queues.flush(WAIT)  # the AL has seen the PORT_DOWN
    result: dict[str, Any] = {}
    returned = threading.Event()

    def pnp_cb(rec: PnpRec) -> None:
        if rec.event is not PnpEvent.PORT_ACTIVE or rec.ca_guid != ca.guid:
            return
        assert rec.port_attr is not None
        query = SmaQuery(ca, rec.port_attr.port_num)
        result["path"] = query.wait(WAIT)  # answered on the misc queue
        query.destroy()
        result["port_lid"] = rec.port_attr.lid
        result["mcast"] = receiver.qp.attach_mcast(MGID, MLID)
        result["thread"] = threading.current_thread().name
        returned.set()

    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, pnp_cb)
    assert not returned.is_set()  # the replay said PORT_DOWN
    fabric.set_link(mock_port, up=True)
    assert returned.wait(WAIT)
    assert result["thread"] == mgr.queues.pnp.name
    assert result["path"] == PortPath(slid=mock_port.lid, sm_lid=fabric.sm_lid)
    assert result["port_lid"] == mock_port.lid and fabric.sm_lid != mock_port.lid
    attachment = result["mcast"]
    assert isinstance(attachment, McastAttachment)

    # The attachment is in place: a datagram to the group lands in the receiver's buffer.
    receiver.recv(9, 0, GRH_BYTES + 64)
    av = sender.pd.create_av(AvAttr(port_num=1, dlid=MLID, grh=Grh(dgid=MGID, sgid_index=0)))
    sender.put(0, b"joined in the callback")
    sender.qp.post_send(SendWr(wr_id=1, sg_list=[sender.sge(0, 22)],
                               ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY)))
    assert wait_wc(sender.cq).status is WcStatus.SUCCESS
    wc = wait_wc(receiver.cq)
    assert (wc.wr_id, wc.status, wc.src_qp) == (9, WcStatus.SUCCESS, sender.qp.num)
    assert receiver.get(GRH_BYTES, 22) == b"joined in the callback"
    attachment.detach()
    with pytest.raises(InvalidMcastHandle):
        attachment.detach()


def test_a_port_query_dies_with_its_ca(mgr: AlManager, fabric: MockFabric) -> None:
    al = mgr.open_al()
    ca = al.open_ca(al.get_ca_guids()[1])
    gate, release = threading.Event(), threading.Event()
    mgr.queues.misc.post(lambda: (gate.set(), release.wait(WAIT)))  # hold the answer back
    assert gate.wait(WAIT)
    query = SmaQuery(ca, 1)
    ca.close(wait=True)
    release.set()
    with pytest.raises(InvalidHandle):
        query.wait(WAIT)
    assert not query.alive
    assert mgr.queues.flush(WAIT)
    assert query.answer is None  # the queued _ask was dropped


def test_client_reregister_reaches_port_registrations(
    mgr: AlManager, fabric: MockFabric
) -> None:
    al = mgr.open_al()
    seen: list[tuple[PnpEvent, int, LinkState | None]] = []
    ca_class: list[PnpEvent] = []

    def pnp_cb(rec: PnpRec) -> None:
        state = rec.port_attr.link_state if rec.port_attr else None
        seen.append((rec.event, rec.guid, state))

    al.reg_pnp(PnpClass.PORT | PnpClass.FLAG_REG_SYNC, pnp_cb)
    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, lambda rec: ca_class.append(rec.event))
    seen.clear()
    ca_class.clear()
    mock_ca = fabric.cas[1]
    mock_ca.inject_async_event(EventRecord(AsyncEvent.CLIENT_REREGISTER, None, 0, 1))
    assert mgr.queues.flush(WAIT)
    port = fabric.port(mock_ca, 1)
    assert seen == [(PnpEvent.CLIENT_REREGISTER, port.guid, LinkState.ACTIVE)]
    assert ca_class == []
    assert PnpEvent.CLIENT_REREGISTER == PnpClass.PORT | 0x01000000



def test_event_callback_waits_for_a_completion_on_the_mock(
    mgr: AlManager, fabric: MockFabric
) -> None:
    """Inside a QP's async-event callback: send a datagram and wait for the completion callback
    of the receiving CQ, then poll what landed."""
    al = mgr.open_al()
    a_ca, b_ca = (al.open_ca(g) for g in al.get_ca_guids())
    arrived = threading.Event()
    sender = _ud(a_ca)
    receiver = _ud(b_ca)
    got: dict[str, Any] = {}

    def comp_cb(cq: Any, ctx: Any) -> None:
        arrived.set()

    cb_cq = b_ca.create_cq(16, comp_cb=comp_cb)
    rqp = receiver.pd.create_qp(QpCreate(QpType.UD, cb_cq, cb_cq))
    port = b_ca.query().ports[0]
    rqp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
    rqp.post_recv(RecvWr(wr_id=3, sg_list=[receiver.sge(0, GRH_BYTES + 64)]))
    av = sender.pd.create_av(AvAttr(port_num=1, dlid=port.lid))

    def event_cb(rec: Any) -> None:
        cb_cq.rearm()
        sender.put(0, b"sent from an event callback")
        sender.qp.post_send(SendWr(wr_id=1, sg_list=[sender.sge(0, 27)],
                                   ud=UdDest(av=av, remote_qp=rqp.num, remote_qkey=UD_QKEY)))
        got["waited"] = arrived.wait(WAIT)  # the completion queue runs while we wait
        got["wcs"] = cb_cq.poll()
        got["thread"] = threading.current_thread().name

    watched = sender.pd.create_qp(QpCreate(QpType.UD, sender.cq, sender.cq), event_cb=event_cb)
    fabric.cas[0].inject_async_event(EventRecord(AsyncEvent.QP_COMM, watched, 0, 0))
    assert mgr.queues.flush(WAIT)
    assert got["waited"] is True and got["thread"] == mgr.queues.misc.name
    assert [(w.wr_id, w.status) for w in got["wcs"]] == [(3, WcStatus.SUCCESS)]
    assert receiver.get(GRH_BYTES, 27) == b"sent from an event callback"


def test_hot_removed_ca_tears_its_dependents_down(mgr: AlManager, fabric: MockFabric) -> None:
    al = mgr.open_al()
    ca = al.open_ca(al.get_ca_guids()[1])
    side = _ud(ca)
    order: list[str] = []

    class Conn(Dependent):
        def on_destroying(self) -> None:
            order.append(f"{self.context} cancelled")

    Conn(side.qp, context="qp-conn", destroy_cb=lambda c: order.append(f"{c} destroy-cb"))
    Conn((ca, 1), context="port-svc", destroy_cb=lambda c: order.append(f"{c} destroy-cb"))

    def pnp_cb(rec: PnpRec) -> None:
        if rec.event is PnpEvent.CA_REMOVE:
            order.append("CA_REMOVE")

    al.reg_pnp(PnpClass.CA | PnpClass.FLAG_REG_SYNC, pnp_cb)
    fabric.hotplug_remove(fabric.cas[1])
    assert mgr.queues.flush(WAIT)
    assert order[0] == "CA_REMOVE"
    assert set(order[1:]) == {"qp-conn cancelled", "port-svc cancelled", "qp-conn destroy-cb",
                              "port-svc destroy-cb"}
    assert order.index("qp-conn cancelled") < order.index("qp-conn destroy-cb")
