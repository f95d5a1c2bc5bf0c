"""A hand-driven RDMA CM exchange over ibal's rxe, for the lab interop tests.

Test scaffolding, not the CM: :class:`RawCm` sends and takes CM MADs on the
rxe port's QP1 through a bare MAD service, and :func:`raw_connect` /
:func:`raw_accept` play one side of an RC connection (REQ with the CMA
header, REP, RTU; DREQ/DREP at the end) with the QP moved by
``ibal.al.connect``.  It pins down what a Linux ``rdma_cm`` peer accepts and
sends, message by message, independently of ``ibal.cm``'s machines; the
interop tests of ``ibal.cm.rdma`` run the same peers through the real CM.
"""

from __future__ import annotations

import queue
import random
from dataclasses import dataclass
from typing import Any

from ibal.al import Pd, Qp
from ibal.al.connect import ConnectOptions, Endpoint, transitions
from ibal.cm import cma
from ibal.cm.rdma import RdmaRoute
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.types import AccessFlags, Gid, Grh, MadAddr, Mtu, QpState, QpType
from ibal.wire.mad.cm import CM_CLASS, CmAttr, CmMessage, TransportType, cm_mad, parse_cm
from ibal.wire.mad.consts import Method

WAIT = 30.0
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE
# What rdma_cm puts in every REQ (cma.c CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES)
# and rping's rdma_conn_param (responder resources/initiator depth 1, retries 7).
CMA_CM_RESPONSE_TIMEOUT = 20
CMA_MAX_CM_RETRIES = 15
RXE_ACK_DELAY = 15  # RXE_LOCAL_CA_ACK_DELAY, the REP's target ACK delay


def cm_ack_timeout(ca_ack_delay: int, packet_life: int) -> int:
    """The REQ's local ACK timeout (``cm.c cm_ack_timeout``)."""
    t = packet_life + 1
    if t >= ca_ack_delay:
        t += ca_ack_delay >= t - 1
    else:
        t = ca_ack_delay + (t >= ca_ack_delay - 1)
    return min(31, t)


class RawCm:
    """CM MADs by hand on one port's QP1: send any, keep what arrives."""

    def __init__(self, pd: Pd, port_guid: int) -> None:
        alias = pd.get_spl_qp(port_guid, QpType.QP1_ALIAS)
        self.got: queue.Queue[tuple[CmMessage, MadAddr]] = queue.Queue()
        self.service: MadService = reg_mad_svc(alias, MadSvc(
            CM_CLASS, 2, self._recv, put_mad, methods=frozenset({Method.SEND}),
            support_unsol=True))  # fmt: skip

    def _recv(self, e: MadElement) -> None:
        mad, addr = bytes(e.mad), e.addr
        put_mad(e)
        if addr is not None:
            self.got.put((parse_cm(mad), addr))

    def send(self, attr: CmAttr, tid: int, addr: MadAddr, **fields: Any) -> None:
        e = self.service.pool_key.get_mad()
        e.mad[:] = cm_mad(attr, tid, fields)
        e.addr = addr
        self.service.send(e)

    def next(self, *attrs: CmAttr, timeout: float = WAIT) -> tuple[CmMessage, MadAddr]:
        """The next message of one of ``attrs`` (others, e.g. MRA, are skipped)."""
        while True:
            msg, addr = self.got.get(timeout=timeout)
            if msg.attr in attrs:
                return msg, addr


@dataclass
class RawConn:
    """One established connection: the comm IDs, the TID, the peer's QPN and address."""

    cm: RawCm
    local_comm_id: int
    remote_comm_id: int
    tid: int
    remote_qpn: int
    addr: MadAddr
    req: dict[str, Any]
    rep: dict[str, Any]

    def disconnect(self) -> CmMessage:
        """Send DREQ; the DREP that answers it."""
        self.cm.send(CmAttr.DREQ, self.tid + 1, self.addr, local_comm_id=self.local_comm_id,
                     remote_comm_id=self.remote_comm_id, remote_qpn=self.remote_qpn)  # fmt: skip
        return self.cm.next(CmAttr.DREP)[0]

    def dreq_arrived(self) -> bool:
        """Whether the peer disconnected (a DREQ is waiting; it is answered with DREP)."""
        try:
            msg, addr = self.cm.got.get_nowait()
        except queue.Empty:
            return False
        if msg.attr is not CmAttr.DREQ:
            return False
        self.cm.send(CmAttr.DREP, msg.tid, addr, local_comm_id=self.local_comm_id,
                     remote_comm_id=self.remote_comm_id)  # fmt: skip
        return True


def _connect(qp: Qp, port_num: int, remote: Endpoint, psn: int, opts: ConnectOptions) -> None:
    """INIT (unless there already: the receive is posted) -> RTR -> RTS towards ``remote``."""
    attr = qp.pd.ca.query()
    for mod in transitions(qp.qp_type, attr.port(port_num), remote, psn=psn, options=opts,
                           ca_attr=attr):  # fmt: skip
        if mod.state is QpState.INIT and qp.state is QpState.INIT:
            continue
        qp.modify(mod)


def _av_addr(route: RdmaRoute) -> MadAddr:
    return MadAddr(remote_qp=1, grh=Grh(dgid=route.dgid, sgid_index=route.sgid_index,
                                        hop_limit=int(route.path["hop_limit"])))  # fmt: skip


def raw_connect(cm: RawCm, qp: Qp, ca_guid: int, route: RdmaRoute, port: int,
                rng: random.Random) -> RawConn:  # fmt: skip
    """Active side: REQ (as rdma_connect builds it), REP, QP to RTS, RTU."""
    comm_id, psn = rng.getrandbits(32), rng.getrandbits(24)
    hdr = cma.CmaHeader(route.src, route.dst, cma.ephemeral_port(rng))
    p = route.path
    req: dict[str, Any] = dict(
        local_comm_id=comm_id, service_id=cma.service_id(cma.PortSpace.TCP, port),
        local_ca_guid=ca_guid, local_qpn=qp.num, responder_resources=1, initiator_depth=1,
        remote_cm_response_timeout=CMA_CM_RESPONSE_TIMEOUT, transport_type=TransportType.RC,
        starting_psn=psn, local_cm_response_timeout=CMA_CM_RESPONSE_TIMEOUT, retry_count=7,
        pkey=0xFFFF, path_mtu=int(p["mtu"]), rnr_retry_count=7,
        max_cm_retries=CMA_MAX_CM_RETRIES, primary_local_lid=0xFFFF, primary_remote_lid=0xFFFF,
        primary_local_gid=route.sgid.packed, primary_remote_gid=route.dgid.packed,
        primary_packet_rate=int(p["rate"]), primary_traffic_class=0,
        primary_hop_limit=int(p["hop_limit"]), primary_sl=0,
        primary_subnet_local=int(p["hop_limit"]) <= 1,
        primary_local_ack_timeout=cm_ack_timeout(RXE_ACK_DELAY, int(p["packet_life_time"])),
        private_data=cma.join_private_data(hdr),
    )  # fmt: skip
    addr = _av_addr(route)
    tid = rng.getrandbits(32)
    for _ in range(int(WAIT)):  # resent each second, as a CM does (ib_cm may still be loading)
        cm.send(CmAttr.REQ, tid, addr, **req)
        try:
            msg, _ = cm.next(CmAttr.REP, CmAttr.REJ, timeout=1.0)
            break
        except queue.Empty:
            continue
    else:
        raise TimeoutError("no REP or REJ for the REQ")
    if msg.attr is CmAttr.REJ:
        raise ConnectionRefusedError(f"REJ {msg.fields['reason']!r}")
    rep = msg.fields
    assert rep["remote_comm_id"] == comm_id
    # Linux's CM (cm.c): a message's starting PSN is what its SENDER will receive
    # first; the other side sends from it (the active side's sq_psn is the REP's).
    remote_ep = Endpoint(qpn=int(rep["local_qpn"]), psn=psn, gid=route.dgid,  # type: ignore[arg-type]
                         mtu=Mtu(int(p["mtu"])))  # fmt: skip
    _connect(qp, route.port_num, remote_ep, int(rep["starting_psn"]), ConnectOptions(  # type: ignore[arg-type]
        access=ACCESS, resp_res=1, init_depth=1, sgid_index=route.sgid_index,
        local_ack_timeout=int(req["primary_local_ack_timeout"])))  # fmt: skip
    cm.send(CmAttr.RTU, msg.tid, addr, local_comm_id=comm_id,
            remote_comm_id=rep["local_comm_id"])  # fmt: skip
    return RawConn(cm, comm_id, int(rep["local_comm_id"]), msg.tid,  # type: ignore[arg-type]
                   int(rep["local_qpn"]), addr, req, rep)  # type: ignore[arg-type]


def raw_accept(cm: RawCm, qp: Qp, ca_guid: int, port_num: int, sgid_index: int, port: int,
               rng: random.Random) -> tuple[RawConn, cma.CmaHeader]:  # fmt: skip
    """Passive side: the REQ for ``port``, QP to RTS, REP, RTU."""
    msg, addr = cm.next(CmAttr.REQ)
    req = msg.fields
    assert req["service_id"] == cma.service_id(cma.PortSpace.TCP, port), req["service_id"]
    hdr, _ = cma.split_private_data(req["private_data"])  # type: ignore[arg-type]
    comm_id, psn = rng.getrandbits(32), rng.getrandbits(24)
    remote_ep = Endpoint(qpn=int(req["local_qpn"]), psn=psn,  # type: ignore[arg-type]
                         gid=Gid(bytes(req["primary_local_gid"])),  # type: ignore[arg-type]
                         mtu=Mtu(int(req["path_mtu"])))  # type: ignore[arg-type]
    _connect(qp, port_num, remote_ep, int(req["starting_psn"]), ConnectOptions(  # type: ignore[arg-type]
        access=ACCESS, resp_res=1, init_depth=1, sgid_index=sgid_index,
        local_ack_timeout=int(req["primary_local_ack_timeout"])))  # type: ignore[arg-type]
    rep: dict[str, Any] = dict(
        local_comm_id=comm_id, remote_comm_id=req["local_comm_id"], local_qpn=qp.num,
        starting_psn=psn, responder_resources=1, initiator_depth=1,
        target_ack_delay=RXE_ACK_DELAY, rnr_retry_count=7, local_ca_guid=ca_guid,
    )  # fmt: skip
    cm.send(CmAttr.REP, msg.tid, addr, **rep)
    cm.next(CmAttr.RTU)
    conn = RawConn(cm, comm_id, int(req["local_comm_id"]), msg.tid,  # type: ignore[arg-type]
                   int(req["local_qpn"]), addr, dict(req), rep)  # type: ignore[arg-type]
    return conn, hdr
