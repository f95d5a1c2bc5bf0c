"""Two AL instances on the mock fabric, connected through the CM, on a stepped clock.

:func:`cm_world` builds a fabric of two CAs (A and B, one port each, LIDs from
the mock's SM) on a :class:`~ibal.clock.ManualClock`, one manager and one AL
instance per side; :class:`Node` is what a side uses (CA, PD, CQ, a
registered buffer, QPs).  :class:`RawCm` is a bare MAD service of the CM
class on a port, for tests that speak CM MADs by hand (forged, malformed,
a peer that never answers).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ibal.sa
from ibal.al import AccessLayer, AlManager, Ca, Cq, Mr, Pd, Qp, QpCreate
from ibal.clock import ManualClock
from ibal.cm import api
from ibal.cm.conn import CmConn
from ibal.cm.records import CmListen, CmRep, CmReq, CmRtu
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.providers.mock import MockFabric, MockProvider
from ibal.providers.mock.packets import Packet
from ibal.sa.query import Record
from ibal.status import Status
from ibal.types import AccessFlags, MadAddr, PortAttr, QpState, QpType
from ibal.wire.mad import cm
from ibal.wire.mad import header as mad_header
from ibal.wire.mad.cm import CM_CLASS, CmAttr, CmMessage, parse_cm
from ibal.wire.mad.consts import Method

WAIT = 10.0
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


@dataclass
class Node:
    al: AccessLayer
    ca: Ca
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr
    port: PortAttr

    def qp(self, qp_type: QpType = QpType.RC) -> Qp:
        return self.pd.create_qp(QpCreate(qp_type, self.cq, self.cq))


def node(al: AccessLayer, ca_guid: int) -> Node:
    ca = al.open_ca(ca_guid)
    pd = ca.alloc_pd()
    buf = bytearray(4096)
    return Node(al, ca, pd, ca.create_cq(64), buf, pd.reg_mem(buf, ACCESS), ca.query().ports[0])


@dataclass
class CmWorld:
    fabric: MockFabric
    mgr: AlManager
    clock: ManualClock
    a: Node
    b: Node
    extra_als: list[AccessLayer] = field(default_factory=list)

    def step(self, seconds: float) -> None:
        self.clock.advance(seconds, settle=self.settle)

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)

    def open_al(self) -> AccessLayer:
        al = self.mgr.open_al()
        self.extra_als.append(al)
        return al


def cm_world(seed: int = 0, ports: int = 1) -> Iterator[CmWorld]:
    clock = ManualClock()
    fabric = MockFabric(seed=seed)
    fabric.add_ca(ports=ports)
    fabric.add_ca(ports=ports)
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock)
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al_a, al_b = mgr.open_al(), mgr.open_al()
        ga, gb = al_a.get_ca_guids()[:2]
        yield CmWorld(fabric, mgr, clock, node(al_a, ga), node(al_b, gb))
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def req(service_id: int = 0x1234, comm_id: int = 0xC0FFEE, *, local_gid: bytes = bytes(16),
        remote_gid: bytes = bytes(16)) -> bytes:
    """A REQ data area as a peer would send it, for :class:`RawCm`."""
    return cm.REQ.encode({
        "local_comm_id": comm_id, "vendor_id": 0, "service_id": service_id,
        "local_ca_guid": 0x55, "local_qkey": 0, "local_qpn": 0x99, "responder_resources": 1,
        "local_eecn": 0, "initiator_depth": 1, "remote_eecn": 0, "remote_cm_response_timeout": 20,
        "transport_type": cm.TransportType.RC, "end_to_end_flow_control": False,
        "starting_psn": 7, "local_cm_response_timeout": 20, "retry_count": 7, "pkey": 0xFFFF,
        "path_mtu": 3, "rdc_exists": False, "rnr_retry_count": 7, "max_cm_retries": 15,
        "srq": False, "extended_transport_type": 0,
        "primary_local_lid": 2, "primary_remote_lid": 1, "primary_local_gid": local_gid,
        "primary_remote_gid": remote_gid, "primary_flow_label": 0, "primary_packet_rate": 2,
        "primary_traffic_class": 0, "primary_hop_limit": 0, "primary_sl": 0,
        "primary_subnet_local": True, "primary_local_ack_timeout": 17,
        "alternate_local_lid": 0, "alternate_remote_lid": 0, "alternate_local_gid": bytes(16),
        "alternate_remote_gid": bytes(16), "alternate_flow_label": 0,
        "alternate_packet_rate": 0, "alternate_traffic_class": 0, "alternate_hop_limit": 0,
        "alternate_sl": 0, "alternate_subnet_local": False, "alternate_local_ack_timeout": 0,
        "sap_supported": False, "private_data": b"hello".ljust(92, b"\0"),
    })  # fmt: skip


class RawCm:
    """A hand-driven CM on one port: sends any CM MAD, keeps what arrives."""

    def __init__(self, n: Node) -> None:
        alias = n.pd.get_spl_qp(n.port.port_guid, QpType.QP1_ALIAS)
        self.got: queue.Queue[tuple[CmMessage, MadAddr]] = queue.Queue()
        self.service: MadService = reg_mad_svc(alias, MadSvc(
            CM_CLASS, 2, self._recv, put_mad, methods=frozenset({Method.SEND}),
            support_unsol=True))  # fmt: skip

    def _recv(self, e: MadElement) -> None:
        mad, addr = bytes(e.mad), e.addr
        put_mad(e)
        assert addr is not None
        self.got.put((parse_cm(mad), addr))

    def send_mad(self, mad: bytes, dlid: int) -> None:
        e = self.service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = MadAddr(remote_qp=1, dlid=dlid)
        self.service.send(e)

    def send(self, attr: CmAttr, data: bytes, dlid: int, tid: int = 0x1234) -> None:
        self.send_mad(bytes(mad_header.build(CM_CLASS, Method.SEND, attr, tid=tid, data=data)),
                      dlid)

    def next(self, world: CmWorld) -> tuple[CmMessage, MadAddr]:
        world.settle()
        return self.got.get(timeout=WAIT)


# ---------------------------------------------------------------- shared by the tests

API_SVC = 0x1B1B


def path(src: Node, dst: Node) -> Record:
    """The SA's PathRecord from ``src`` to ``dst`` (the mock SA answers it)."""
    [pr] = ibal.sa.path_records(src.al, src.port.lid, dst.port.lid, port_guid=src.port.port_guid)
    return pr


def is_cm(p: Packet) -> bool:
    """A CM MAD on the mock fabric's wire (QP1, class 0x07)."""
    return p.dst_qpn == 1 and bytes(p.payload[1:2]) == b"\x07"


class Calls:
    """Callbacks that queue (name, record), and a get() that checks which came next."""
    def __init__(self) -> None:
        self.q: queue.Queue[tuple[str, Any]] = queue.Queue()

    def cb(self, name: str) -> Any:
        return lambda rec: self.q.put((name, rec))

    def get(self, name: str) -> Any:
        got, rec = self.q.get(timeout=WAIT)
        assert got == name, (got, rec)
        return rec


def connect_ibal(
    world: CmWorld, calls: Calls, svc: int = API_SVC
) -> tuple[CmConn, CmConn, Any, Any]:
    """Listen on A, REQ from B, REP, RTU through IBAL's calls; both QPs end in RTS."""
    qa, qb = world.a.qp(), world.b.qp()
    h_listen = api.cm_listen(world.a.al, CmListen(svc_id=svc, req_cb=calls.cb("req")),
                             lambda rec: None, context="listen ctx")  # fmt: skip
    h = api.cm_req(CmReq(svc_id=svc, qp=qb, primary_path=dict(path(world.b, world.a).fields),
                         rep_cb=calls.cb("rep"), rej_cb=calls.cb("rej"), resp_res=1,
                         init_depth=1, pdata=b"req"))  # fmt: skip
    req_rec = calls.get("req")
    assert req_rec.context == "listen ctx" and req_rec.listen is h_listen
    assert req_rec.pdata[:3] == b"req" and req_rec.remote_qpn == qb.num
    api.cm_rep(req_rec.cm_req, CmRep(qp=qa, init_depth=1, pdata=b"rep", rtu_cb=calls.cb("rtu"),
                                     dreq_cb=calls.cb("dreq")))  # fmt: skip
    rep_rec = calls.get("rep")
    assert rep_rec.cm_status is Status.SUCCESS and rep_rec.cm_rep is h and rep_rec.qp is qb
    assert rep_rec.pdata[:3] == b"rep" and qa.state is QpState.RTR
    api.cm_rtu(h, CmRtu(pdata=b"rtu", dreq_cb=calls.cb("dreq")))
    rtu_rec = calls.get("rtu")
    assert rtu_rec.pdata[:3] == b"rtu" and rtu_rec.qp is qa
    assert qa.state is QpState.RTS and qb.state is QpState.RTS
    return req_rec.cm_req, h, qa, qb
