"""IBAL's CM calls (``ib_cm_*``, ``ib_force_apm``) over the records of ``ibal.cm.records``.

Every call takes the request record IBAL's takes (``cm_req(CmReq)``,
``cm_rep(h_cm_req, CmRep)`` ...), validates it (``InvalidParameter`` /
``InvalidSetting``), and returns once the message is on its way; the peer's
answer comes to the callback the request named (``rep_cb``, ``rtu_cb``,
``dreq_cb`` ...) with the record IBAL's callback gets (``CmRepRec`` ...), on
the misc queue of the handle's AL. The handle (``CmConn``) is the same object
for every step: ``h_cm_req``, ``h_cm_rep``, ``h_cm_dreq`` and ``h_cm_lap`` of
one connection are one handle, filled into each record (``cm_req``,
``cm_rep``, ``cm_dreq``, ``cm_lap``).  ``flags=AlFlags.SYNC`` makes
``cm_req``/``cm_rep``/``cm_dreq``/``cm_lap`` return only after the callback
that answers them ran (``InvalidState`` on an AL callback thread).

Which callback a connection's upcalls reach: the REQ's ``rep_cb``, ``mra_cb``,
``rej_cb`` (and ``req_cb`` peer to peer); after ``cm_rep`` the REP's
``rej_cb``, ``mra_cb``, ``rtu_cb``, ``lap_cb``, ``dreq_cb``; after ``cm_rtu``
the RTU's ``apr_cb``, ``dreq_cb``; ``cm_dreq``'s ``drep_cb``; ``cm_lap``'s
``apr_cb``.  A stale connection reaches ``rej_cb`` with ``STALE_CONN``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ibal.al import AccessLayer, Qp, call_user, in_callback
from ibal.cm import fsm, ops, wire
from ibal.cm.conn import CmConn, connection_of
from ibal.cm.listens import ListenHandle
from ibal.cm.records import (
    AlFlags,
    CmApr,
    CmAprRec,
    CmDrep,
    CmDrepRec,
    CmDreq,
    CmLap,
    CmListen,
    CmMra,
    CmRej,
    CmRejRec,
    CmRep,
    CmRepRec,
    CmReq,
    CmRtu,
    CmRtuRec,
    ListenErrRec,
)
from ibal.status import InvalidParameter, InvalidState, Status
from ibal.types import QpType
from ibal.wire.fields import Value
from ibal.wire.mad.cm import AprStatus, CmAttr, RejReason

__all__ = [
    "cm_apr", "cm_cancel", "cm_drep", "cm_dreq", "cm_handoff", "cm_lap", "cm_listen", "cm_mra",
    "cm_rej", "cm_rep", "cm_req", "cm_rtu", "force_apm",
]  # fmt: skip

K = fsm.UpcallKind
ListenErrCb = Callable[..., object]


def _cbs(conn: CmConn) -> dict[str, Callable[..., object] | None]:
    cbs: dict[str, Callable[..., object] | None] = conn.info.setdefault("cbs", {})
    return cbs


def _set_cbs(conn: CmConn, **cbs: Callable[..., object] | None) -> None:
    table = _cbs(conn)
    for name, cb in cbs.items():
        if cb is not None:
            table[name] = cb


def _sync_wait(conn: CmConn, flags: AlFlags, start: Callable[[], None]) -> None:
    """Run ``start``; with ``SYNC``, return only once the answering callback ran."""
    if not flags & AlFlags.SYNC:
        start()
        return
    if in_callback():
        raise InvalidState("IB_FLAGS_SYNC blocks: call it off the AL's callback threads")
    done = threading.Event()
    conn.sync_done = done
    try:
        start()
    except BaseException:
        conn.sync_done = None
        raise
    done.wait()


def _qp_context(conn: CmConn) -> Any:
    return getattr(conn.qp, "context", None)


def _deliver(conn: CmConn, up: fsm.Deliver) -> None:
    """Misc queue: an upcall as IBAL's record, to the callback the requests named."""
    f = up.fields
    cbs = _cbs(conn)
    qp, qctx = conn.qp, _qp_context(conn)
    kind = up.kind
    timeout = up.status is not Status.SUCCESS
    rec: Any
    name: str = kind.value
    if kind is K.REQ:
        assert f is not None
        listen = conn.info.get("listen")
        ctx = conn.context if listen is not None else qctx
        rec = replace(wire.req_rec(f), context=ctx, cm_req=conn, listen=listen)
    elif kind is K.SIDR_REQ:
        assert f is not None
        listen = conn.info.get("listen")
        record = getattr(listen, "record", None)
        rec = replace(wire.sidr_req_rec(f), context=conn.context, cm_req=conn, listen=listen,
                      sidr_context=getattr(record, "sidr_context", None))  # fmt: skip
        name = "req"
    elif kind in (K.REP, K.SIDR_REP):
        sidr = kind is K.SIDR_REP
        if f is None or timeout:
            rec = CmRepRec(cm_status=up.status, qp_type=QpType.UD if sidr else QpType.RC)
        else:
            rec = wire.sidr_rep_rec(f) if sidr else wire.rep_rec(f)
        req = conn.info.get("req")
        rec = replace(rec, cm_rep=conn, qp=qp, qp_context=qctx, al=conn.al,
                      qp_type=QpType.UD if sidr else getattr(qp, "qp_type", QpType.RC),
                      sidr_context=getattr(req, "sidr_context", None))  # fmt: skip
        name = "rep"
    elif kind is K.RTU:
        rec = CmRtuRec(cm_status=up.status) if f is None else wire.rtu_rec(f)
        rec = replace(rec, qp=qp, qp_context=qctx)
    elif kind is K.REJ:
        rec = CmRejRec(rej_status=RejReason.TIMEOUT) if f is None else wire.rej_rec(f)
        rec = replace(rec, qp=qp, qp_context=qctx)
    elif kind is K.STALE:
        rec, name = CmRejRec(rej_status=RejReason.STALE_CONN, qp=qp, qp_context=qctx), "rej"
    elif kind is K.MRA:
        assert f is not None
        rec = replace(wire.mra_rec(f), qp=qp, qp_context=qctx)
    elif kind is K.DREQ:
        assert f is not None
        rec = replace(wire.dreq_rec(f), cm_dreq=conn, qp_context=qctx)
    elif kind is K.DREP:
        rec = CmDrepRec(cm_status=up.status) if f is None else wire.drep_rec(f)
        rec = replace(rec, qp=qp, qp_context=qctx)
    elif kind is K.LAP:
        assert f is not None
        req = conn.info.get("req_fields") or (conn.cep.fields.get(CmAttr.REQ, {})
                                              if conn.cep else {})  # fmt: skip
        rec = replace(wire.lap_rec(f, pkey=int(req.get("pkey", 0xFFFF)),
                                   mtu=int(req.get("path_mtu", 3))),
                      cm_lap=conn, qp_context=qctx)  # fmt: skip
    else:  # APR (every other kind is above)
        if f is None:
            rec = CmAprRec(cm_status=up.status)
        else:
            rec = wire.apr_rec(f)
            if rec.apr_status == AprStatus.SUCCESS:
                rec = replace(rec, cm_status=ops.load_lap_path(conn))
        rec = replace(rec, qp=qp, qp_context=qctx)
    cb = cbs.get(name)
    if cb is not None:
        call_user(cb, rec)


# ---------------------------------------------------------------- listen


def cm_listen(al: AccessLayer, listen: CmListen, listen_err_cb: ListenErrCb,
              context: Any = None) -> ListenHandle:  # fmt: skip
    """``ib_cm_listen``: REQs (``qp_type`` UD: SIDR_REQs) for ``listen.svc_id`` reach
    ``listen.req_cb(CmReqRec)`` (``context`` as the record's ``context``; it may run before
    this returns).  ``InvalidSetting`` for a duplicate listen."""
    if not callable(listen_err_cb):
        raise InvalidParameter("listen_err_cb is required")

    def incoming(handle: ListenHandle, conn: CmConn, fields: dict[str, Value]) -> None:
        conn.deliver = _deliver
        _set_cbs(conn, req=listen.req_cb)

    def error(handle: ListenHandle, reason: Status) -> None:
        call_user(listen_err_cb, ListenErrRec(listen_context=handle.context, reason=reason,
                                              listen=handle))  # fmt: skip

    h = ops.listen(al, listen, on_request=incoming, context=context)
    h.on_error = error
    return h


def cm_cancel(listen: ListenHandle, destroy_cb: Callable[[Any], object] | None = None) -> None:
    """``ib_cm_cancel``: ``destroy_cb(listen_context)`` once no REQ callback runs."""
    if not isinstance(listen, ListenHandle):
        raise InvalidParameter("a listen handle is required")
    listen.cancel(destroy_cb)


# ---------------------------------------------------------------- connect


def cm_req(req: CmReq) -> CmConn:
    """``ib_cm_req``: a REQ (RC/UC) or a SIDR_REQ (``qp_type`` UD, ``req.al``).  Returns
    the connection's handle (also ``cm_rep`` of the REP record)."""
    if not isinstance(req, CmReq):
        raise InvalidParameter("a CmReq is required")
    req.validate()
    holder: list[CmConn] = []

    def start() -> None:
        if req.qp_type is QpType.UD:
            if not isinstance(req.al, AccessLayer):
                raise InvalidParameter("a SIDR request names its AL (req.al)")
            conn = ops.sidr_request(req.al, req, deliver=_deliver)
        else:
            qp = req.qp
            if not isinstance(qp, Qp):
                raise InvalidParameter("req.qp is not an ibal Qp")
            conn = ops.request(qp.al, req, deliver=_deliver, context=qp.context)
        _set_cbs(conn, rep=req.rep_cb, sidr_rep=req.rep_cb, mra=req.mra_cb, rej=req.rej_cb,
                 req=req.req_cb)  # fmt: skip
        holder.append(conn)

    if req.flags & AlFlags.SYNC:
        if in_callback():
            raise InvalidState("IB_FLAGS_SYNC blocks: call it off the AL's callback threads")
        start()
        conn = holder[0]
        done = threading.Event()
        conn.sync_done = done
        if conn.info.get("answered"):  # the answer came before the event was there
            done.set()
        done.wait()
        return conn
    start()
    return holder[0]


def cm_rep(h_cm_req: CmConn, rep: CmRep) -> None:
    """``ib_cm_rep``: accept a REQ (RC/UC: the QP goes to RTR; UD: a SIDR_REP)."""
    if not isinstance(rep, CmRep):
        raise InvalidParameter("a CmRep is required")
    _set_cbs(h_cm_req, rej=rep.rej_cb, mra=rep.mra_cb, rtu=rep.rtu_cb, lap=rep.lap_cb,
             dreq=rep.dreq_cb)  # fmt: skip
    if rep.qp_type is QpType.UD:
        ops.sidr_reply(h_cm_req, rep)
        return
    _sync_wait(h_cm_req, rep.flags, lambda: ops.accept(h_cm_req, rep))


def cm_rtu(h_cm_rep: CmConn, rtu: CmRtu) -> None:
    """``ib_cm_rtu``: the active QP to RTR and RTS, then the RTU."""
    if not isinstance(rtu, CmRtu):
        raise InvalidParameter("a CmRtu is required")
    _set_cbs(h_cm_rep, apr=rtu.apr_cb, dreq=rtu.dreq_cb)
    ops.rtu(h_cm_rep, rtu)


def cm_rej(h_cm: CmConn, rej: CmRej) -> None:
    """``ib_cm_rej``: reject a received REQ or REP."""
    ops.reject(h_cm, rej)


def cm_mra(h_cm: CmConn, mra: CmMra) -> None:
    """``ib_cm_mra``: ask the peer to wait ``mra.svc_timeout`` for a REQ, REP or LAP."""
    ops.mra(h_cm, mra)


def cm_handoff(h_cm_req: CmConn, svc_id: int) -> CmConn:
    """``ib_cm_handoff``: the REQ goes to the listen on ``svc_id`` (its ``req_cb`` runs
    with a new handle, returned here)."""
    return ops.handoff(h_cm_req, svc_id)


# ---------------------------------------------------------------- disconnect


def _conn_of(qp: object) -> CmConn:
    if not isinstance(qp, Qp):
        raise InvalidParameter("h_qp is not an ibal Qp")
    conn = connection_of(qp)
    if conn is None:
        raise InvalidState("the QP has no CM connection")
    return conn


def cm_dreq(dreq: CmDreq) -> None:
    """``ib_cm_dreq``: disconnect ``dreq.qp``'s connection (its QP goes to ERROR); the DREP
    or a time-out reaches ``dreq.drep_cb``."""
    if not isinstance(dreq, CmDreq):
        raise InvalidParameter("a CmDreq is required")
    dreq.validate()
    conn = _conn_of(dreq.qp)
    _set_cbs(conn, drep=dreq.drep_cb)
    _sync_wait(conn, dreq.flags, lambda: ops.disconnect(conn, dreq))


def cm_drep(h_cm_dreq: CmConn, drep: CmDrep) -> None:
    """``ib_cm_drep``: answer a DREQ."""
    ops.reply_disconnect(h_cm_dreq, drep)


# ---------------------------------------------------------------- alternate path


def cm_lap(lap: CmLap) -> None:
    """``ib_cm_lap``: propose ``lap.alt_path`` (active side); the APR or a time-out reaches
    ``lap.apr_cb`` (``cm_status`` SUCCESS once the path is loaded and armed)."""
    if not isinstance(lap, CmLap):
        raise InvalidParameter("a CmLap is required")
    lap.validate()
    conn = _conn_of(lap.qp)
    _set_cbs(conn, apr=lap.apr_cb)
    _sync_wait(conn, lap.flags, lambda: ops.lap(conn, lap))


def cm_apr(h_cm_lap: CmConn, apr: CmApr) -> None:
    """``ib_cm_apr``: answer a LAP (inside the LAP callback, as IBAL asks)."""
    ops.apr(h_cm_lap, apr)


def force_apm(qp: Qp) -> None:
    """``ib_force_apm``: migrate to the loaded and armed alternate path."""
    ops.force_apm(qp)
