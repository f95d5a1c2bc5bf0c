"""The CM's operations on a connection, over A's records (``ibal.cm.records``): what the
IBAL calls (``ibal.cm.api``) and the Pythonic shape (``ibal.cm.simple``) both run.

Each operation validates its request record (``InvalidParameter`` /
``InvalidSetting`` as the record says), checks the handle and the QP
(``InvalidQpState``, ``InvalidState`` for an operation the connection's state
does not allow), builds the message with ``ibal.cm.wire``, moves the QP
where the machine expects it moved before the message leaves, and feeds the
connection's machine; the agent does the rest (``ibal.cm.service``).
``deliver(conn, upcall)`` runs on the AL's misc queue for every callback of
the connection (an ``fsm.Deliver``; the API layers turn it into records).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ibal import osrandom
from ibal.al import AccessLayer, Qp
from ibal.cm import fsm, wire
from ibal.cm.conn import CmConn
from ibal.cm.listens import ListenHandle
from ibal.cm.port import CmPort
from ibal.cm.records import (
    CmApr,
    CmDrep,
    CmDreq,
    CmLap,
    CmListen,
    CmMra,
    CmRej,
    CmRep,
    CmReq,
    CmRtu,
    check_path,
)
from ibal.cm.service import CmAgent, agent_of
from ibal.status import (
    IbError,
    InvalidParameter,
    InvalidPort,
    InvalidQpState,
    InvalidSetting,
    InvalidState,
    Status,
    Unsupported,
)
from ibal.types import (
    AccessFlags,
    ApmState,
    CaAttr,
    LinkLayer,
    PortAttr,
    QpMod,
    QpState,
    QpType,
)
from ibal.wire.fields import Value
from ibal.wire.mad.cm import AprStatus, CmAttr, MessageMraed, SidrStatus

__all__ = [
    "DeliverFn", "accept", "apr", "disconnect", "force_apm", "handoff", "lap", "listen", "mra",
    "reject", "reply_disconnect", "request", "rtu", "sidr_reply", "sidr_request",
]  # fmt: skip

DeliverFn = Callable[[CmConn, fsm.Deliver], object]
DEFAULT_ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
_CONNECTED = frozenset({QpType.RC, QpType.UC})
S = fsm.CmState


def _qp(qp: object, types: frozenset[QpType] = _CONNECTED) -> Qp:
    if not isinstance(qp, Qp):
        raise InvalidParameter("the CM connects an ibal Qp")
    qp.pd  # noqa: B018  (a destroyed QP raises InvalidQpHandle here)
    if qp.qp_type not in types:
        raise InvalidSetting(f"the CM does not connect {qp.qp_type.name} QPs here")
    return qp


def _local_port(qp: Qp, path: dict[str, Any], ca_attr: CaAttr | None = None) -> PortAttr:
    """The port of ``qp``'s CA the path starts at (its SGID); ``InvalidSetting`` if none.
    ``ca_attr``: the CA's attributes if the caller queried them already."""
    port = (ca_attr or qp.pd.ca.query()).port_of_gid(bytes(path["sgid"]))
    if port is None:
        raise InvalidSetting("the path does not start at a port of the QP's CA")
    return port


def port_pkey_index(port: PortAttr, pkey: int) -> int:
    """The index of ``pkey`` in ``port``'s table; ``InvalidSetting`` when it is not there."""
    index = port.pkey_index(pkey)
    if index is None:
        raise InvalidSetting(f"P_Key 0x{pkey:04x} is not in port {port.port_num}'s table")
    return index


def _check_reset_or_init(qp: Qp) -> None:
    if qp.state not in (QpState.RESET, QpState.INIT):
        raise InvalidQpState(f"the CM connects a QP in RESET or INIT, not {qp.state.name}")


def _psn() -> int:
    return osrandom.randbits(24)


def _fields(conn: CmConn, attr: CmAttr) -> dict[str, Value]:
    cep = conn.cep
    return {} if cep is None else cep.fields.get(attr, {})


def _move(conn: CmConn, *targets: QpState) -> None:
    """Modify the connection's QP to each target (the modifies ``conn.mods_for`` gives)."""
    qp, mods_for = conn.qp, conn.mods_for
    if qp is None or mods_for is None:
        raise InvalidState("the connection has no QP")
    try:
        for target in targets:
            for mod in mods_for(conn, target):
                qp.modify_validated(mod)
    except IbError as exc:
        raise InvalidSetting(f"the QP refused the connection's attributes: {exc}") from exc


def _mods(conn: CmConn, target: QpState) -> list[QpMod]:
    """Under the agent's lock or from an API call: the QpMods that reach ``target``."""
    info = conn.info
    qp = conn.qp
    if target is QpState.INIT:  # what ibal.al.connect.transitions gives for INIT
        if qp is None or qp.state is not QpState.RESET:
            return []
        return [QpMod(QpState.INIT, port_num=info["port"].port_num,
                      pkey_index=info["pkey_index"], access=info["access"])]  # fmt: skip
    cached = info.get("connect_mods")  # RTR and RTS come from one computation
    if cached is not None:
        return [cached.for_state(target)]
    if conn.active:
        req = info["req_fields"]
        rep = _fields(conn, CmAttr.REP)
        mods = wire.active_mods(req, rep, port=info["port"], pkey_index=info["pkey_index"],
                                access=info["access"], rnr_nak_timeout=info["rnr_nak_timeout"],
                                packet_life=info["life"])  # fmt: skip
    else:
        req = _fields(conn, CmAttr.REQ)
        mods = wire.passive_mods(req, info["rep_fields"], port=info["port"],
                                 pkey_index=info["pkey_index"], access=info["access"],
                                 rnr_nak_timeout=info["rnr_nak_timeout"])  # fmt: skip
    info["connect_mods"] = mods
    return [mods.for_state(target)]


# ---------------------------------------------------------------- active side


def request(al: AccessLayer, req: CmReq, *, deliver: DeliverFn, context: Any = None,
            answer: DeliverFn | None = None) -> CmConn:  # fmt: skip
    """Send a REQ for ``req.qp`` (RC/UC, RESET or INIT: moved to INIT) over
    ``req.primary_path`` to ``req.svc_id``; the connection's callbacks go to ``deliver``
    (``answer``: :attr:`CmConn.answer`, set before the REQ leaves)."""
    if not isinstance(req, CmReq):
        raise InvalidParameter("a CmReq is required")
    if not isinstance(al, AccessLayer):
        raise InvalidParameter("an AccessLayer is required")
    req.validate()
    if req.qp_type is QpType.UD:
        raise InvalidParameter("a UD request is SIDR: use sidr_request")
    qp = _qp(req.qp)
    if qp.qp_type is not req.qp_type:
        raise InvalidSetting(f"qp_type {req.qp_type.name} is not the QP's {qp.qp_type.name}")
    if qp.state not in (QpState.RESET, QpState.INIT):
        raise InvalidState(f"the QP is {qp.state.name}: connected already, or in use")
    pf = check_path("primary_path", req.primary_path)
    # One query for the whole request: a provider builds every port's GID table for it.
    ca_attr = qp.pd.ca.query()
    port = _local_port(qp, pf, ca_attr)
    alt = None
    if req.alt_path is not None:
        alt = check_path("alt_path", req.alt_path)
        if _local_port(qp, alt, ca_attr).port_num != port.port_num:
            raise InvalidSetting("the primary and alternate paths are on different ports")
    pkey_index = port_pkey_index(port, int(pf["p_key"]))
    agent = agent_of(al.manager)
    cmport = agent.port(qp.pd.ca.guid, port.port_num)
    conn = CmConn(al, agent, active=True, context=context)
    try:
        conn.bind_qp(qp)
        cep = agent.new_cep(cmport, _active, agent.path_addr(cmport, pf, port))
        conn.attach(cep)
        msg, req_fields = wire.req_message(
            req, local_comm_id=cep.local_comm_id, local_ca_guid=ca_attr.ca_guid,
            local_qpn=qp.num, starting_psn=_psn(), ca_ack_delay=ca_attr.local_ack_delay,
            srq=qp.srq is not None, checked=True, paths=(pf, alt))  # fmt: skip
        life = int(pf["packet_life_time"])
        conn.info.update(port=port, pkey_index=pkey_index, access=DEFAULT_ACCESS, life=life,
                         rnr_nak_timeout=req.rnr_nak_timeout, req=req, req_fields=req_fields,
                         max_cm_retries=req.max_cm_retries,
                         remote_resp_timeout=req.remote_resp_timeout)  # fmt: skip
        conn.deliver = deliver
        conn.answer = answer
        conn.mods_for = _mods
        _move(conn, QpState.INIT)
        timeout = wire.retransmit_timeout_ms(life, req.remote_resp_timeout)
        conn.handle(fsm.SendReq(msg, timeout, req.max_cm_retries,
                                peer_to_peer=req.req_cb is not None))  # fmt: skip
        if req.req_cb is not None:
            agent.add_peer(cep, req.svc_id)
    except BaseException:
        with contextlib.suppress(IbError):
            conn.destroy()
        raise
    return conn


def _active(comm_id: int, now: float) -> fsm.Cep:
    return fsm.Cep(comm_id, active=True, now=now)


def rtu(conn: CmConn, rtu: CmRtu | None = None) -> None:
    """Complete an active connection after its REP: QP to RTR and RTS, then the RTU."""
    rtu = CmRtu() if rtu is None else rtu
    if not isinstance(rtu, CmRtu):
        raise InvalidParameter("a CmRtu is required")
    rtu.validate()
    cep = _cep(conn)
    if not conn.active or conn.state not in (S.REP_RCVD, S.MRA_REP_SENT):
        raise InvalidState(f"the connection is {conn.state.name}: no REP to complete")
    if rtu.access_ctrl is not None:
        conn.info["access"] = rtu.access_ctrl
    msg = wire.build_rtu(rtu, local_comm_id=cep.local_comm_id, remote_comm_id=_remote(cep),
                         checked=True)  # fmt: skip
    _move(conn, QpState.RTR, QpState.RTS)  # ready before the RTU: the peer may send at once
    conn.handle(fsm.SendRtu(msg))


# ---------------------------------------------------------------- passive side


def listen(al: AccessLayer, listen: CmListen, *, on_request: Callable[..., None],
           context: Any = None) -> ListenHandle:  # fmt: skip
    """Listen as ``listen`` says; ``on_request(handle, conn, fields)`` runs under the agent's
    lock for each new REQ (or SIDR_REQ, ``qp_type`` UD): set ``conn.deliver`` there."""
    if not isinstance(al, AccessLayer):
        raise InvalidParameter("cm listen takes an AccessLayer")
    if not isinstance(listen, CmListen):
        raise InvalidParameter("a CmListen is required")
    listen.validate()
    agent = agent_of(al.manager)
    return ListenHandle(al, agent, svc_id=listen.svc_id, ca_guid=listen.ca_guid,
                        port_guid=listen.port_guid, lid=listen.lid, pkey=listen.pkey,
                        compare_offset=listen.compare_offset,
                        compare_buf=bytes(listen.compare_buffer),
                        ud=listen.qp_type is QpType.UD, context=context,
                        on_incoming=on_request, record=listen,
                        backlog=listen.backlog)  # fmt: skip


def accept(conn: CmConn, rep: CmRep) -> None:
    """Answer a received REQ with a REP for ``rep.qp`` (RESET/INIT: to INIT and RTR first)."""
    if not isinstance(rep, CmRep):
        raise InvalidParameter("a CmRep is required")
    cep = _cep(conn)
    if cep.sidr:
        sidr_reply(conn, rep)
        return
    req = _fields(conn, CmAttr.REQ)
    rep.validate(wire.req_rec(req))
    if conn.active or conn.state not in (S.REQ_RCVD, S.MRA_REQ_SENT):
        raise InvalidState(f"the connection is {conn.state.name}: no REQ to answer")
    qp = _qp(rep.qp)
    if qp.qp_type is not wire.qp_type_of(req):
        raise InvalidSetting(f"the REQ asks for {wire.qp_type_of(req).name}, the QP is "
                             f"{qp.qp_type.name}")  # fmt: skip
    _check_reset_or_init(qp)
    if qp.pd.ca.guid != cep.port.ca_guid:
        raise InvalidSetting("the QP is not on the CA the REQ came through")
    ca_attr = qp.pd.ca.query()  # the QP's CA is the port's (checked above): one query
    port = next((p for p in ca_attr.ports if p.port_num == cep.port.port_num), None)
    if port is None:
        raise InvalidPort(f"port {cep.port.port_num} the REQ came through is gone")
    msg, rep_fields = wire.rep_message(
        rep, req=req, local_comm_id=cep.local_comm_id, local_ca_guid=ca_attr.ca_guid,
        local_qpn=qp.num, starting_psn=_psn(), ca_ack_delay=ca_attr.local_ack_delay,
        srq=qp.srq is not None, checked=True)  # fmt: skip (validated above)
    conn.bind_qp(qp)
    ack = int(req["primary_local_ack_timeout"])
    conn.info.update(port=port, pkey_index=port_pkey_index(port, int(req["pkey"])),
                     access=rep.access_ctrl or DEFAULT_ACCESS, rep=rep,
                     rep_fields=rep_fields, life=max(ack - 1, 0),
                     rnr_nak_timeout=rep.rnr_nak_timeout,
                     max_cm_retries=int(req["max_cm_retries"]),
                     remote_resp_timeout=int(req["local_cm_response_timeout"]))  # fmt: skip
    conn.mods_for = _mods
    _move(conn, QpState.INIT)
    for wr in rep.recv_wrs:  # posted before the REP leaves (IBAL's p_recv_wr)
        qp.post_recv(wr)
    _move(conn, QpState.RTR)  # before the REP: the RTU and data may follow at once
    timeout = wire.retransmit_timeout_ms(conn.info["life"], conn.info["remote_resp_timeout"])
    conn.handle(fsm.SendRep(msg, timeout, conn.info["max_cm_retries"]))


def handoff(conn: CmConn, service_id: int) -> CmConn:
    """``ib_cm_handoff``: present a received, unanswered REQ to the listen on ``service_id``
    (its REQ callback runs with a new handle; this one is destroyed)."""
    cep = _cep(conn)
    if type(service_id) is not int or not 0 <= service_id < 1 << 64:
        raise InvalidParameter(f"service ID {service_id!r} is not a 64-bit int")
    if conn.active or cep.sidr or conn.state not in (S.REQ_RCVD, S.MRA_REQ_SENT):
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
        new.cm_upcall(cep, fsm.Deliver(fsm.UpcallKind.REQ, CmAttr.REQ, fields, Status.SUCCESS))
    assert isinstance(new, CmConn)
    return new


# ---------------------------------------------------------------- either side


def reject(conn: CmConn, rej: CmRej | None = None) -> None:
    """REJ a received REQ or REP (``InvalidState`` otherwise)."""
    rej = CmRej() if rej is None else rej
    if not isinstance(rej, CmRej):
        raise InvalidParameter("a CmRej is required")
    cep = _cep(conn)
    if cep.sidr:
        sidr_reply(conn, CmRep(qp_type=QpType.UD, status=SidrStatus.REJECT, pdata=rej.pdata))
        return
    rejected = MessageMraed.REP if conn.active else MessageMraed.REQ
    msg = wire.build_rej(rej, local_comm_id=cep.local_comm_id, remote_comm_id=_remote(cep),
                         rejected=rejected)  # fmt: skip
    conn.handle(fsm.SendRej(msg))


def mra(conn: CmConn, mra: CmMra) -> None:
    """MRA the REQ, REP or LAP being processed."""
    if not isinstance(mra, CmMra):
        raise InvalidParameter("a CmMra is required")
    cep = _cep(conn)
    lap_rcvd = getattr(cep.machine, "lap_state", None) is fsm.LapState.LAP_RCVD
    mraed = MessageMraed.LAP if lap_rcvd else (
        MessageMraed.REP if conn.active else MessageMraed.REQ)  # fmt: skip
    conn.handle(fsm.SendMra(wire.build_mra(mra, local_comm_id=cep.local_comm_id,
                                           remote_comm_id=_remote(cep), mraed=mraed)))  # fmt: skip


def disconnect(conn: CmConn, dreq: CmDreq | None = None) -> None:
    """Send DREQ (the QP goes to ERROR; the DREP or a time-out comes as the ``drep``
    upcall).  ``InvalidState`` when the connection is not established."""
    dreq = CmDreq(qp=conn.qp, qp_type=getattr(conn.qp, "qp_type", QpType.RC)) \
        if dreq is None else dreq  # fmt: skip
    if not isinstance(dreq, CmDreq):
        raise InvalidParameter("a CmDreq is required")
    cep = _cep(conn)
    if conn.state is not S.ESTABLISHED:
        raise InvalidState(f"the connection is {conn.state.name}, not established")
    peer = cep.fields.get(CmAttr.REP if conn.active else CmAttr.REQ, {})
    msg = wire.build_dreq(dreq, local_comm_id=cep.local_comm_id, remote_comm_id=_remote(cep),
                          remote_qpn=int(peer.get("local_qpn", 0)))  # fmt: skip
    timeout = wire.retransmit_timeout_ms(conn.info.get("life", 16),
                                         conn.info.get("remote_resp_timeout", 20))  # fmt: skip
    conn.handle(fsm.SendDreq(msg, timeout, conn.info.get("max_cm_retries", 15)))


def reply_disconnect(conn: CmConn, drep: CmDrep | None = None) -> None:
    """DREP a received DREQ."""
    drep = CmDrep() if drep is None else drep
    if not isinstance(drep, CmDrep):
        raise InvalidParameter("a CmDrep is required")
    cep = _cep(conn)
    conn.handle(fsm.SendDrep(wire.build_drep(drep, local_comm_id=cep.local_comm_id,
                                             remote_comm_id=_remote(cep))))  # fmt: skip


# ---------------------------------------------------------------- alternate paths


def lap(conn: CmConn, lap: CmLap) -> None:
    """Propose ``lap.alt_path`` (active side only: ``Unsupported`` on the passive side);
    an accepting APR loads it into the QP, armed."""
    if not isinstance(lap, CmLap):
        raise InvalidParameter("a CmLap is required")
    lap.validate()
    cep = _cep(conn)
    if not conn.active:
        raise Unsupported("only the active side of a connection sends LAP")
    if conn.state is not S.ESTABLISHED:
        raise InvalidState(f"the connection is {conn.state.name}, not established")
    qp = _qp(lap.qp)
    if qp is not conn.qp:
        raise InvalidParameter("lap.qp is not the connection's QP")
    path = check_path("alt_path", lap.alt_path)
    _local_port(qp, path)
    ca_attr = qp.pd.ca.query()
    peer = cep.fields.get(CmAttr.REP, {})
    msg = wire.build_lap(lap, local_comm_id=cep.local_comm_id, remote_comm_id=_remote(cep),
                         remote_qpn=int(peer.get("local_qpn", 0)),
                         ca_ack_delay=ca_attr.local_ack_delay)  # fmt: skip
    conn.info["lap_path"] = path
    timeout = wire.retransmit_timeout_ms(conn.info.get("life", 16), lap.remote_resp_timeout)
    conn.handle(fsm.SendLap(msg, timeout, conn.info.get("max_cm_retries", 15)))


def load_lap_path(conn: CmConn) -> Status:
    """Active side, on an accepting APR: load the proposed path (``SUCCESS`` or why not)."""
    path, qp = conn.info.pop("lap_path", None), conn.qp
    if path is None or qp is None:
        return Status.INVALID_STATE
    try:
        qp.modify(wire.alt_path_mod(path, _local_port(qp, path)))  # maybe another port
    except IbError as exc:
        return exc.status
    return Status.SUCCESS


def apr(conn: CmConn, apr: CmApr) -> None:
    """Answer a received LAP; an accepting APR loads the path into the QP first."""
    if not isinstance(apr, CmApr):
        raise InvalidParameter("a CmApr is required")
    apr.validate()
    cep = _cep(conn)
    if getattr(cep.machine, "lap_state", None) not in (fsm.LapState.LAP_RCVD,
                                                       fsm.LapState.MRA_LAP_SENT):  # fmt: skip
        raise InvalidState("no LAP to answer")
    if apr.apr_status == AprStatus.SUCCESS:
        qp = conn.qp
        lapf = cep.fields.get(CmAttr.LAP, {})
        req = conn.info.get("req_fields") or cep.fields.get(CmAttr.REQ, {})
        path = wire.path_from_lap(lapf, pkey=int(req.get("pkey", 0xFFFF)),
                                  mtu=int(req.get("path_mtu", 3)))  # fmt: skip
        if qp is None:
            raise InvalidState("the connection has no QP")
        try:
            qp.modify(wire.alt_path_mod(path, _local_port(qp, path)))
        except IbError as exc:
            raise InvalidSetting(f"the QP refused the alternate path: {exc}") from exc
    conn.handle(fsm.SendApr(wire.build_apr(apr, local_comm_id=cep.local_comm_id,
                                           remote_comm_id=_remote(cep))))  # fmt: skip


def force_apm(qp: Qp) -> None:
    """``ib_force_apm``: migrate ``qp`` to its alternate path.  Not a QP, or not RC/UC:
    ``InvalidParameter``; destroyed: ``InvalidQpHandle``; its CA has no APM:
    ``Unsupported``; no path loaded and armed: ``InvalidQpState``."""
    if isinstance(qp, Qp) and qp.alive and qp.qp_type not in _CONNECTED:
        raise InvalidParameter(f"{qp.qp_type.name} QPs have no alternate path")
    qp = _qp(qp)
    if not qp.pd.ca.capabilities.apm:
        raise Unsupported(f"APM: {qp.pd.ca.capabilities.reason('apm')}")
    attr = qp.query()
    if attr.apm_state is not ApmState.ARMED:
        raise InvalidQpState("the QP has no armed alternate path")
    qp.modify(QpMod(QpState.RTS, apm_state=ApmState.MIGRATED))


# ---------------------------------------------------------------- SIDR


def sidr_request(al: AccessLayer, req: CmReq, *, deliver: DeliverFn,
                 context: Any = None) -> CmConn:  # fmt: skip
    """Send a SIDR_REQ (``req.qp_type`` UD) for ``req.svc_id`` over ``req.primary_path``;
    the SIDR_REP (or a time-out) comes as the ``sidr_rep`` upcall."""
    from ibal.cm import sidr_fsm

    if not isinstance(req, CmReq):
        raise InvalidParameter("a CmReq is required")
    req = req if req.qp_type is QpType.UD else replace(req, qp_type=QpType.UD)
    req.validate()
    if req.primary_path is None:
        raise InvalidParameter("a SIDR request needs primary_path (where to ask)")
    pf = check_path("primary_path", req.primary_path)
    agent = agent_of(al.manager)
    cmport = _port_of_path(al, agent, pf)
    conn = CmConn(al, agent, active=True, context=context)
    try:
        cep = agent.new_cep(cmport, lambda cid, now: sidr_fsm.SidrCep(cid, active=True, now=now),
                            agent.path_addr(cmport, pf), sidr=True)  # fmt: skip
        conn.attach(cep)
        conn.deliver = deliver
        conn.info["req"] = req
        msg = wire.build_sidr_req(req, request_id=cep.local_comm_id)
        life = int(pf["packet_life_time"])
        timeout = wire.sidr_timeout_ms(req.timeout_ms, life) if req.timeout_ms else \
            wire.retransmit_timeout_ms(life, 20)  # fmt: skip
        conn.handle(sidr_fsm.SendSidrReq(msg, timeout, req.max_cm_retries))
    except BaseException:
        with contextlib.suppress(IbError):
            conn.destroy()
        raise
    return conn


def sidr_reply(conn: CmConn, rep: CmRep) -> None:
    """Answer a received SIDR_REQ: ``status`` SUCCESS names the UD ``qp`` (its Q_Key is sent)."""
    from ibal.cm import sidr_fsm

    if not isinstance(rep, CmRep):
        raise InvalidParameter("a CmRep is required")
    rep = rep if rep.qp_type is QpType.UD else replace(rep, qp_type=QpType.UD)
    rep.validate()
    cep = _cep(conn)
    if not cep.sidr or conn.active:
        raise InvalidState("a SIDR reply answers a received SIDR_REQ")
    qpn = qkey = 0
    if rep.status == SidrStatus.SUCCESS:
        qp = _qp(rep.qp, frozenset({QpType.UD}))
        qpn, qkey = qp.num, qp.query().qkey
    req = cep.fields.get(CmAttr.SIDR_REQ, {})
    msg = wire.build_sidr_rep(rep, request_id=int(req.get("request_id", 0)),
                              service_id=int(req.get("service_id", 0)), qpn=qpn,
                              qkey=qkey)  # fmt: skip
    conn.handle(sidr_fsm.SendSidrRep(msg))


def _port_of_path(al: AccessLayer, agent: CmAgent, pf: dict[str, Any]) -> CmPort:
    sgid = bytes(pf["sgid"])
    for ca_guid in al.get_ca_guids():
        p = al.query_ca_by_guid(ca_guid).port_of_gid(sgid)
        if p is not None:
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


_ = LinkLayer  # the link layer decides nothing here: wire's path rules cover RoCE
