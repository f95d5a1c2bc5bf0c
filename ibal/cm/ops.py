"""The CM's operations on a connection, with keyword arguments: what the IBAL calls
(``ibal.cm.api``) and the Pythonic shape (``ibal.cm.simple``) both run.

Each operation checks its arguments (statuses of IBAL's ``ib_cm_*``: private
data too long or a bad setting -> ``InvalidSetting``, a QP in the wrong state
-> ``InvalidQpState``, an operation the connection's state does not allow ->
``InvalidState``), builds the message, and feeds the connection's machine;
the agent does the rest (``ibal.cm.service``).  ``deliver(conn, upcall)``
runs on the AL's misc queue for every callback of the connection.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping
from typing import Any

from ibal.al import AccessLayer, Qp
from ibal.cm import _interim_wire as w
from ibal.cm import fsm
from ibal.cm.conn import CmConn
from ibal.cm.listens import CmListen
from ibal.cm.port import CmPort
from ibal.cm.service import CmAgent, agent_of
from ibal.mad import cm as cmw
from ibal.mad.cm import CmAttr, MessageMraed, RejReason
from ibal.status import (
    IbError,
    InvalidParameter,
    InvalidQpState,
    InvalidSetting,
    InvalidState,
    Status,
)
from ibal.types import AccessFlags, LinkLayer, PortAttr, QpState, QpType, is_int
from ibal.wire.fields import Value

__all__ = [
    "Deliver", "accept", "disconnect", "handoff", "listen", "mra", "reject", "reply_disconnect",
    "request", "rtu", "sidr_reply", "sidr_request",
]  # fmt: skip

Deliver = Callable[[CmConn, fsm.Upcall], object]
Path = Mapping[str, Value]
DEFAULT_ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
_CONNECTED = frozenset({QpType.RC, QpType.UC})


def _pdata(attr: CmAttr, pdata: bytes | bytearray | memoryview | None) -> bytes:
    data = b"" if pdata is None else bytes(pdata)
    size = cmw.PRIVATE_DATA_SIZE[attr]
    if len(data) > size:
        raise InvalidSetting(f"{attr.name} private data is at most {size} bytes, not {len(data)}")
    return data


def _u(name: str, v: object, bits: int) -> int:
    if not is_int(v) or not 0 <= int(v) < 1 << bits:
        raise InvalidSetting(f"{name} {v!r} does not fit {bits} bits")
    return int(v)


def _path_fields(path: object) -> dict[str, Value]:
    fields = getattr(path, "fields", path)  # an ibal.sa Record or its fields
    if not isinstance(fields, Mapping) or "dgid" not in fields:
        raise InvalidParameter("a path is a PathRecord (ibal.sa.path_records) or its fields")
    return dict(fields)


def _local_port(qp: Qp, path: Mapping[str, Value]) -> PortAttr:
    """The port of ``qp``'s CA the path starts at (its SGID); ``InvalidSetting`` if none."""
    sgid = path.get("sgid")
    ports = qp.pd.ca.query().ports
    for p in ports:
        if any(e.gid.packed == sgid for e in p.gid_table):
            return p
    raise InvalidSetting("the primary path does not start at a port of the QP's CA")


def _pkey_index(port: PortAttr, pkey: int) -> int:
    for i, k in enumerate(port.pkeys):
        if k & 0x7FFF == pkey & 0x7FFF:
            return i
    raise InvalidSetting(f"P_Key 0x{pkey:04x} is not in port {port.port_num}'s table")


def _to_init(qp: Qp, port: PortAttr, pkey: int, access: AccessFlags) -> None:
    if qp.state is QpState.RESET:
        qp.modify(w.init_mod(port.port_num, _pkey_index(port, pkey), access))
    elif qp.state is not QpState.INIT:
        raise InvalidQpState(f"the CM connects a QP in RESET or INIT, not {qp.state.name}")


def _psn() -> int:
    return random.getrandbits(24)


def _active(comm_id: int, now: float) -> fsm.Cep:
    return fsm.Cep(comm_id, active=True, now=now)


# ---------------------------------------------------------------- active side


def request(
    al: AccessLayer, qp: Qp, path: object, service_id: int, *, deliver: Deliver,
    pdata: bytes = b"", alt_path: object | None = None, resp_res: int = 1,
    init_depth: int = 1, remote_resp_timeout: int = 20, local_resp_timeout: int = 20,
    retry_cnt: int = 7, rnr_retry_cnt: int = 7, rnr_nak_timeout: int = 12,
    max_cm_retries: int = 15, flow_ctrl: bool = True, peer_to_peer: bool = False,
    access: AccessFlags = DEFAULT_ACCESS, context: Any = None,
) -> CmConn:
    """Send a REQ for ``qp`` (RC/UC, RESET or INIT: moved to INIT) over ``path`` to
    ``service_id``; the connection's callbacks go to ``deliver``."""
    if not isinstance(qp, Qp):
        raise InvalidParameter("the CM connects an ibal Qp")
    if qp.qp_type not in _CONNECTED:
        raise InvalidSetting(f"the CM connects RC and UC QPs, not {qp.qp_type.name}")
    if not callable(deliver):
        raise InvalidParameter("deliver must be callable")
    data = _pdata(CmAttr.REQ, pdata)
    pf = _path_fields(path)
    alt = _path_fields(alt_path) if alt_path is not None else None
    _u("service_id", service_id, 64)
    for name, v, bits in (("resp_res", resp_res, 8), ("init_depth", init_depth, 8),
                          ("remote_resp_timeout", remote_resp_timeout, 5),
                          ("local_resp_timeout", local_resp_timeout, 5),
                          ("retry_cnt", retry_cnt, 3), ("rnr_retry_cnt", rnr_retry_cnt, 3),
                          ("rnr_nak_timeout", rnr_nak_timeout, 5),
                          ("max_cm_retries", max_cm_retries, 4)):  # fmt: skip
        _u(name, v, bits)
    if qp.state not in (QpState.RESET, QpState.INIT):
        raise InvalidState(f"the QP is {qp.state.name}: connected already, or in use")
    port = _local_port(qp, pf)
    if alt is not None and _i(alt.get("mtu")) != _i(pf.get("mtu")):
        raise InvalidSetting("the primary and alternate paths have different MTUs")
    life = _i(pf.get("packet_life_time"), 16)
    if life > 31:
        raise InvalidSetting(f"packet lifetime {life} is out of range")
    agent = agent_of(al.manager)
    cmport = agent.port(qp.pd.ca.guid, port.port_num)
    roce = port.link_layer is not LinkLayer.INFINIBAND
    ca_attr = qp.pd.ca.query()
    conn = CmConn(al, agent, active=True, context=context)
    try:
        conn.bind_qp(qp)
        pkey = _i(pf.get("p_key"), 0xFFFF) or 0xFFFF
        _to_init(qp, port, pkey, access)
        cep = agent.new_cep(cmport, _active, agent.path_addr(cmport, pf))
        conn.attach(cep)
        psn = _psn()
        msg = w.build_req(
            local_comm_id=cep.local_comm_id, service_id=service_id,
            local_ca_guid=ca_attr.ca_guid, local_qpn=qp.num, starting_psn=psn, path=pf,
            alt_path=alt, roce=roce, ca_ack_delay=ca_attr.local_ack_delay,
            resp_res=resp_res, init_depth=init_depth,
            remote_resp_timeout=remote_resp_timeout, local_resp_timeout=local_resp_timeout,
            retry_cnt=retry_cnt, rnr_retry_cnt=rnr_retry_cnt, max_cm_retries=max_cm_retries,
            flow_ctrl=flow_ctrl, srq=qp.srq is not None, pdata=data,
            transport=cmw.TransportType.RC if qp.qp_type is QpType.RC else cmw.TransportType.UC,
        )  # fmt: skip
        conn.info.update(path=pf, port=port, roce=roce, rnr_nak_timeout=rnr_nak_timeout,
                         req=dict(cmw.REQ.decode(msg)), service_id=service_id,
                         max_cm_retries=max_cm_retries, remote_resp_timeout=remote_resp_timeout,
                         life=life)  # fmt: skip
        conn.deliver = deliver
        conn.mods_for = _active_mods
        timeout = fsm.retransmit_ms(life, remote_resp_timeout)
        conn.handle(fsm.SendReq(msg, timeout, max_cm_retries, peer_to_peer=peer_to_peer))
    except BaseException:
        with contextlib.suppress(IbError):
            conn.destroy()
        raise
    return conn


def _active_mods(conn: CmConn, target: QpState) -> list[Any]:
    cep = conn.cep
    assert cep is not None
    rep = cep.fields.get(CmAttr.REP, {})
    return w.active_mods(target, conn.info["port"], conn.info["path"], conn.info["req"], rep,
                         conn.info["roce"], conn.info["rnr_nak_timeout"])  # fmt: skip


def rtu(conn: CmConn, pdata: bytes = b"") -> None:
    """Complete an active connection after its REP: the QP goes to RTR and RTS, RTU is sent."""
    data = _pdata(CmAttr.RTU, pdata)
    cep = _cep(conn)
    if not conn.active or conn.state not in (fsm.CmState.REP_RCVD, fsm.CmState.MRA_REP_SENT):
        raise InvalidState(f"the connection is {conn.state.name}: no REP to complete")
    # The machine expects the QP ready before the RTU goes (the peer may send at once).
    _move(conn, QpState.RTR, QpState.RTS)
    conn.handle(fsm.SendRtu(w.build_ids(CmAttr.RTU, cep.local_comm_id, _remote(cep), data)))


def _move(conn: CmConn, *targets: QpState) -> None:
    qp, mods_for = conn.qp, conn.mods_for
    if qp is None or mods_for is None:
        raise InvalidState("the connection has no QP")
    try:
        for target in targets:
            for mod in mods_for(conn, target):
                qp.modify(mod)
    except IbError as exc:
        raise InvalidSetting(f"the QP refused the connection's attributes: {exc}") from exc


# ---------------------------------------------------------------- passive side


def listen(al: AccessLayer, service_id: int, *, on_request: Callable[[CmListen, CmConn,
           dict[str, Value]], None], ca_guid: int = 0, port_guid: int = 0, lid: int = 0,
           pkey: int = 0, compare_offset: int = 0, compare_buf: bytes = b"", ud: bool = False,
           context: Any = None) -> CmListen:  # fmt: skip
    """Listen for REQs (``ud``: SIDR_REQs) to ``service_id``; ``on_request(listen, conn,
    fields)`` runs under the agent's lock for each new one (set ``conn.deliver`` there)."""
    if not isinstance(al, AccessLayer):
        raise InvalidParameter("cm listen takes an AccessLayer")
    _u("service_id", service_id, 64)
    cbuf = bytes(compare_buf)
    limit = cmw.PRIVATE_DATA_SIZE[CmAttr.SIDR_REQ if ud else CmAttr.REQ]
    if compare_offset < 0 or compare_offset + len(cbuf) > limit:
        raise InvalidSetting(f"the compare window must lie in the {limit}-byte private data")
    agent = agent_of(al.manager)
    return CmListen(al, agent, svc_id=service_id, ca_guid=ca_guid, port_guid=port_guid,
                    lid=lid, pkey=pkey, compare_offset=compare_offset, compare_buf=cbuf, ud=ud,
                    context=context, on_incoming=on_request)  # fmt: skip


def accept(conn: CmConn, qp: Qp, *, pdata: bytes = b"", resp_res: int | None = None,
           init_depth: int | None = None, rnr_retry_cnt: int = 7, rnr_nak_timeout: int = 12,
           failover_accepted: int = 0, flow_ctrl: bool = True,
           access: AccessFlags = DEFAULT_ACCESS) -> None:  # fmt: skip
    """Answer a received REQ with a REP for ``qp`` (RESET/INIT: moved to INIT, then RTR)."""
    data = _pdata(CmAttr.REP, pdata)
    cep = _cep(conn)
    if conn.active or cep.sidr:
        raise InvalidState("a REP answers a received REQ")
    if not isinstance(qp, Qp):
        raise InvalidParameter("the CM connects an ibal Qp")
    if qp.qp_type not in _CONNECTED:
        raise InvalidSetting(f"the CM connects RC and UC QPs, not {qp.qp_type.name}")
    req = cep.fields.get(CmAttr.REQ, {})
    if conn.state not in (fsm.CmState.REQ_RCVD, fsm.CmState.MRA_REQ_SENT):
        raise InvalidState(f"the connection is {conn.state.name}: no REQ to answer")
    if qp.pd.ca.guid != cep.port.ca_guid:
        raise InvalidSetting("the QP is not on the CA the REQ came through")
    peer_rr, peer_id = _i(req.get("responder_resources")), _i(req.get("initiator_depth"))
    rr = peer_id if resp_res is None else _u("resp_res", resp_res, 8)
    idepth = peer_rr if init_depth is None else _u("init_depth", init_depth, 8)
    if idepth > peer_rr:
        raise InvalidSetting(f"init_depth {idepth} exceeds the REQ's responder resources "
                             f"{peer_rr}")  # fmt: skip
    for name, v, bits in (("rnr_retry_cnt", rnr_retry_cnt, 3),
                          ("rnr_nak_timeout", rnr_nak_timeout, 5),
                          ("failover_accepted", failover_accepted, 2)):  # fmt: skip
        _u(name, v, bits)
    port = cep.port.ca.query_port(cep.port.port_num)
    ca_attr = qp.pd.ca.query()
    conn.bind_qp(qp)
    _to_init(qp, port, _i(req.get("pkey"), 0xFFFF), access)
    msg = w.build_rep(
        local_comm_id=cep.local_comm_id, remote_comm_id=_remote(cep), local_qpn=qp.num,
        starting_psn=_psn(), resp_res=rr, init_depth=idepth,
        target_ack_delay=ca_attr.local_ack_delay, failover_accepted=failover_accepted,
        flow_ctrl=flow_ctrl, rnr_retry_cnt=rnr_retry_cnt, srq=qp.srq is not None,
        local_ca_guid=ca_attr.ca_guid, pdata=data,
    )  # fmt: skip
    roce = port.link_layer is not LinkLayer.INFINIBAND
    conn.info.update(port=port, roce=roce, rnr_nak_timeout=rnr_nak_timeout,
                     rep=dict(cmw.REP.decode(msg)),
                     max_cm_retries=_i(req.get("max_cm_retries"), 15),
                     remote_resp_timeout=_i(req.get("local_cm_response_timeout"), 20),
                     life=max(_i(req.get("primary_local_ack_timeout"), 17) - 1, 0))  # fmt: skip
    conn.mods_for = _passive_mods
    _move(conn, QpState.RTR)  # before the REP: the RTU and data may follow at once
    timeout = fsm.retransmit_ms(conn.info["life"], conn.info["remote_resp_timeout"])
    conn.handle(fsm.SendRep(msg, timeout, conn.info["max_cm_retries"]))


def handoff(conn: CmConn, service_id: int) -> CmConn:
    """``ib_cm_handoff``: present a received, unanswered REQ to the listen on ``service_id``
    (its REQ callback runs with a new handle; this one is destroyed)."""
    cep = _cep(conn)
    if not is_int(service_id) or not 0 <= service_id < 1 << 64:
        raise InvalidParameter(f"service ID {service_id!r} is not a 64-bit int")
    if conn.active or cep.sidr or conn.state not in (fsm.CmState.REQ_RCVD,
                                                    fsm.CmState.MRA_REQ_SENT):  # fmt: skip
        raise InvalidState(f"the connection is {conn.state.name}: no unanswered REQ")
    agent = conn.agent
    target = agent.find_listen(service_id)
    if target is None:
        raise InvalidParameter(f"nobody listens on service ID 0x{service_id:016x}")
    fields = dict(cep.fields.get(CmAttr.REQ, {}))
    with agent.lock:
        new = target.cm_incoming(cep, fields)
        if new is None:
            raise InvalidParameter(f"the listen on 0x{service_id:016x} is closing")
        conn.cep = None  # the endpoint is the new handle's now
        with contextlib.suppress(IbError):
            conn.destroy()
        new.cm_upcall(cep, fsm.Upcall(fsm.UpcallKind.REQ, CmAttr.REQ, fields,
                                      Status.SUCCESS))  # fmt: skip
    assert isinstance(new, CmConn)
    return new


def _passive_mods(conn: CmConn, target: QpState) -> list[Any]:
    cep = conn.cep
    assert cep is not None
    req = cep.fields.get(CmAttr.REQ, {})
    return w.passive_mods(target, conn.info["port"], req, conn.info["rep"], conn.info["roce"],
                          conn.info["rnr_nak_timeout"])  # fmt: skip


# ---------------------------------------------------------------- either side


def reject(conn: CmConn, reason: int = RejReason.CONSUMER_DEFINED, *, ari: bytes = b"",
           pdata: bytes = b"") -> None:  # fmt: skip
    """REJ a received REQ or REP (``InvalidState`` otherwise)."""
    data = _pdata(CmAttr.REJ, pdata)
    if len(ari) > 72:
        raise InvalidSetting(f"ARI is at most 72 bytes, not {len(ari)}")
    _u("reason", reason, 16)
    cep = _cep(conn)
    rejected = MessageMraed.REP if conn.active else MessageMraed.REQ
    msg = w.build_rej(cep.local_comm_id, _remote(cep), rejected, reason, bytes(ari), data)
    conn.handle(fsm.SendRej(msg))


def mra(conn: CmConn, service_timeout: int, pdata: bytes = b"") -> None:
    """MRA the REQ, REP or LAP being processed (``service_timeout``: 4.096 us * 2^n)."""
    data = _pdata(CmAttr.MRA, pdata)
    _u("service_timeout", service_timeout, 5)
    cep = _cep(conn)
    lap_rcvd = getattr(cep.machine, "lap_state", None) is fsm.LapState.LAP_RCVD
    mraed = MessageMraed.LAP if lap_rcvd else (
        MessageMraed.REP if conn.active else MessageMraed.REQ)  # fmt: skip
    conn.handle(fsm.SendMra(w.build_mra(cep.local_comm_id, _remote(cep), mraed,
                                        service_timeout, data)))  # fmt: skip


def disconnect(conn: CmConn, pdata: bytes = b"") -> None:
    """Send DREQ (the QP goes to ERROR; the DREP or a time-out comes as the ``drep`` upcall)."""
    data = _pdata(CmAttr.DREQ, pdata)
    cep = _cep(conn)
    peer = cep.fields.get(CmAttr.REP if conn.active else CmAttr.REQ, {})
    peer_qpn = _i(peer.get("local_qpn"))
    msg = w.build_ids(CmAttr.DREQ, cep.local_comm_id, _remote(cep), data, remote_qpn=peer_qpn)
    timeout = fsm.retransmit_ms(conn.info.get("life", 16), conn.info.get("remote_resp_timeout", 20))
    conn.handle(fsm.SendDreq(msg, timeout, conn.info.get("max_cm_retries", 15)))


def reply_disconnect(conn: CmConn, pdata: bytes = b"") -> None:
    """DREP a received DREQ."""
    data = _pdata(CmAttr.DREP, pdata)
    cep = _cep(conn)
    conn.handle(fsm.SendDrep(w.build_ids(CmAttr.DREP, cep.local_comm_id, _remote(cep), data)))


# ---------------------------------------------------------------- SIDR


def sidr_request(al: AccessLayer, path: object, service_id: int, *, deliver: Deliver,
                 pdata: bytes = b"", timeout_ms: int = 1000, retries: int = 3,
                 port_guid: int | None = None, context: Any = None) -> CmConn:  # fmt: skip
    """Send a SIDR_REQ for ``service_id`` over ``path``; the SIDR_REP (or a time-out) comes
    as the ``rep`` upcall."""
    from ibal.cm import sidr_fsm

    data = _pdata(CmAttr.SIDR_REQ, pdata)
    pf = _path_fields(path)
    _u("service_id", service_id, 64)
    if not is_int(timeout_ms) or timeout_ms <= 0:
        raise InvalidSetting("timeout_ms must be a positive int")
    _u("retries", retries, 8)
    agent = agent_of(al.manager)
    cmport = _port_of_path(al, agent, pf, port_guid)
    conn = CmConn(al, agent, active=True, context=context)
    try:
        cep = agent.new_cep(cmport, lambda cid, now: sidr_fsm.SidrCep(cid, active=True, now=now),
                            agent.path_addr(cmport, pf), sidr=True)  # fmt: skip
        conn.attach(cep)
        conn.deliver = deliver
        pkey = _i(pf.get("p_key"), 0xFFFF) or 0xFFFF
        msg = w.build_sidr_req(cep.local_comm_id, pkey, service_id, data)
        conn.handle(sidr_fsm.SendSidrReq(msg, timeout_ms, retries))
    except BaseException:
        with contextlib.suppress(IbError):
            conn.destroy()
        raise
    return conn


def sidr_reply(conn: CmConn, status: int, *, qp: Qp | None = None, qkey: int = 0,
               info: bytes = b"", pdata: bytes = b"") -> None:  # fmt: skip
    """Answer a received SIDR_REQ: ``status`` SUCCESS needs the UD ``qp`` (and its Q_Key)."""
    from ibal.cm import sidr_fsm

    data = _pdata(CmAttr.SIDR_REP, pdata)
    if len(info) > 72:
        raise InvalidSetting(f"class info is at most 72 bytes, not {len(info)}")
    cep = _cep(conn)
    if not cep.sidr or conn.active:
        raise InvalidState("a SIDR_REP answers a received SIDR_REQ")
    qpn = 0
    if status == cmw.SidrStatus.SUCCESS:
        if not isinstance(qp, Qp) or qp.qp_type is not QpType.UD:
            raise InvalidParameter("a successful SIDR_REP names a UD QP")
        qpn = qp.num
    req = cep.fields.get(CmAttr.SIDR_REQ, {})
    msg = w.build_sidr_rep(_i(req.get("request_id")), status,
                           qpn, _i(req.get("service_id")), _u("qkey", qkey, 32), bytes(info),
                           data)  # fmt: skip
    conn.handle(sidr_fsm.SendSidrRep(msg))


def _port_of_path(al: AccessLayer, agent: CmAgent, pf: Mapping[str, Value],
                  port_guid: int | None) -> CmPort:  # fmt: skip
    if port_guid is not None:
        return agent.port_by_guid(port_guid)
    sgid = pf.get("sgid")
    for ca_guid in al.get_ca_guids():
        for p in al.query_ca_by_guid(ca_guid).ports:
            if any(e.gid.packed == sgid for e in p.gid_table):
                return agent.port(ca_guid, p.port_num)
    raise InvalidSetting("the path does not start at a local port")


# ---------------------------------------------------------------- helpers


def _cep(conn: CmConn) -> Any:
    if not isinstance(conn, CmConn):
        raise InvalidParameter("a CM connection handle is required")
    conn.check()
    cep = conn.cep
    if cep is None:
        raise InvalidState("the connection has no endpoint")
    return cep


def _remote(cep: Any) -> int:
    rc = cep.remote_comm_id
    return 0 if rc is None else int(rc)


def _i(v: object, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default
