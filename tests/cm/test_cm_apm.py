"""Alternate paths through the CM on the mock fabric (two CAs of two ports each): LAP ->
APR loads the path on both QPs, ``force_apm`` migrates, data flows on the new path and
the peer's QP follows (``QP_APM``); a LAP the peer refuses loads nothing."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest
from cm_world import WAIT, Calls, CmWorld, cm_world, connect_ibal

import ibal.sa
from ibal.al import Ca
from ibal.cm import api
from ibal.cm.records import CmApr, CmLap
from ibal.providers.mock.packets import PacketOp
from ibal.status import InvalidParameter, InvalidQpHandle, InvalidQpState, Status
from ibal.types import ApmState, AsyncEvent, QpState, QpType, RecvWr, SendWr, WcStatus, WrType
from ibal.wire.mad.cm import AprStatus

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world(ports=2)


def port2_path(src: Ca, dst: Ca) -> dict[str, Any]:
    me, peer = src.query().ports[1], dst.query().ports[1]
    [pr] = ibal.sa.path_records(src.al, me.lid, peer.lid, port_guid=me.port_guid)
    return dict(pr.fields)


def lap(world: CmWorld, status: AprStatus) -> tuple[Any, Any, Any]:
    """Connect (port 1), propose the port-2 path; the passive side answers ``status``."""
    calls = Calls()
    ha, _hb, qa, qb = connect_ibal(world, calls)

    def on_lap(rec: Any) -> None:  # cm_apr inside the LAP callback, as IBAL asks
        assert rec.cm_lap is ha and rec.alt_path is not None
        api.cm_apr(rec.cm_lap, CmApr(qp=qa, apr_status=status, info=b"why"[: 3 * bool(status)]))

    ha.info["cbs"]["lap"] = on_lap
    aprs: queue.Queue[Any] = queue.Queue()
    api.cm_lap(CmLap(qp=qb, alt_path=port2_path(world.b.ca, world.a.ca), apr_cb=aprs.put))
    return aprs.get(timeout=WAIT), qa, qb


def test_lap_apr_force_apm_and_data_on_the_new_path(world: CmWorld) -> None:
    rec, qa, qb = lap(world, AprStatus.SUCCESS)
    assert (rec.cm_status, rec.apr_status, rec.qp) == (Status.SUCCESS, AprStatus.SUCCESS, qb)
    a2, b2 = (n.ca.query().ports[1] for n in (world.a, world.b))
    for qp, peer2 in ((qa, b2), (qb, a2)):  # the alternate path loaded and armed on both QPs
        attr = qp.query()
        assert attr.apm_state is ApmState.ARMED and attr.alternate_av is not None
        assert (attr.alternate_av.port_num, attr.alternate_av.dlid) == (2, peer2.lid)
        assert attr.primary_av is not None and attr.primary_av.port_num == 1
    events: list[AsyncEvent] = []
    qa.add_event_listener(lambda r: events.append(r.code))
    seen: list[tuple[PacketOp, int, int]] = []
    world.fabric.capture = lambda p: seen.append((p.op, p.slid, p.dlid))  # the mock's tap

    api.force_apm(qb)  # the active side migrates; the passive one follows the first packet
    attr = qb.query()
    assert attr.apm_state is ApmState.MIGRATED and attr.alternate_av is None
    assert attr.primary_av is not None and (attr.primary_av.port_num,
                                            attr.primary_av.dlid) == (2, a2.lid)  # fmt: skip
    a, b = world.a, world.b
    b.buf[0:5] = b"moved"
    qb.post_send(SendWr(7, WrType.RDMA_WRITE, [b.mr.sge(0, 5)], remote_addr=a.mr.vaddr + 64,
                        rkey=a.mr.rkey))  # fmt: skip
    assert [(w.wr_id, w.status) for w in b.cq.wait(WAIT)] == [(7, WcStatus.SUCCESS)]
    assert bytes(a.buf[64:69]) == b"moved"
    assert (PacketOp.RDMA_WRITE, b2.lid, a2.lid) in seen  # on the port-2 path
    assert (PacketOp.ACK, a2.lid, b2.lid) in seen  # and the ACK came back on it
    world.settle()
    assert events == [AsyncEvent.QP_APM]  # the passive QP migrated on the peer's packet
    attr = qa.query()
    assert attr.apm_state is ApmState.MIGRATED and attr.primary_av is not None
    assert (attr.primary_av.port_num, attr.primary_av.dlid) == (2, b2.lid)
    qb.post_recv(RecvWr(1, [b.mr.sge(100, 16)]))  # and the other way round on the new path
    a.buf[200:204] = b"back"
    qa.post_send(SendWr(8, WrType.SEND, [a.mr.sge(200, 4)]))
    assert [(w.wr_id, w.status) for w in a.cq.wait(WAIT)] == [(8, WcStatus.SUCCESS)]
    assert [(w.wr_id, w.status, w.length) for w in b.cq.wait(WAIT)] == [(1, WcStatus.SUCCESS, 4)]
    assert bytes(b.buf[100:104]) == b"back" and (PacketOp.SEND, a2.lid, b2.lid) in seen
    with pytest.raises(InvalidQpState):  # nothing armed any more until a new LAP
        api.force_apm(qb)


def test_a_lap_the_peer_refuses_loads_nothing(world: CmWorld) -> None:
    rec, qa, qb = lap(world, AprStatus.REJECT)
    assert (rec.cm_status, rec.apr_status, rec.info[:3]) == (
        Status.SUCCESS, AprStatus.REJECT, b"why")
    for qp in (qa, qb):
        attr = qp.query()
        assert attr.alternate_av is None and attr.apm_state is ApmState.MIGRATED
        assert qp.state is QpState.RTS
    with pytest.raises(InvalidQpState):
        api.force_apm(qb)



def test_force_apm_statuses(world: CmWorld) -> None:
    """access-layer.md (d): INVALID_PARAMETER (not an RC/UC QP), INVALID_QP_HANDLE,
    INVALID_QP_STATE (nothing armed: a QP in RESET, or connected with no alternate)."""
    with pytest.raises(InvalidParameter):
        api.force_apm("qp")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter):
        api.force_apm(world.a.qp(QpType.UD))
    qp = world.a.qp()
    with pytest.raises(InvalidQpState):
        api.force_apm(qp)
    qp.destroy(wait=True)
    with pytest.raises(InvalidQpHandle):
        api.force_apm(qp)
