"""QP and SRQ verbs of an rxe CA: create, modify, query, destroy, post.

``modify_qp`` re-checks the transition against :mod:`ibal.qp_fsm` (the access
layer did already), validates every attribute against the device's limits
before changing anything, then writes the core's :class:`QpConfig`.
``post_send`` snapshots each WR (the consumer may reuse it at once), hands it
to the core and pumps the QP; in SQE/ERROR the core flushes it.

Called by the access layer on any thread; each verb takes the CA lock and
raises the :mod:`ibal.status` exceptions (post verbs a ``PostError``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ibal.ci import QpCreated
from ibal.providers import checks
from ibal.providers.rxe import wire
from ibal.providers.rxe.memory import Mr, Mw, QpMemory
from ibal.providers.rxe.qps import (
    Av,
    Qp,
    RecvQueue,
    Srq,
    SrqSource,
    gid_to_ip,
)
from ibal.providers.rxe.verbs import PORT, CaState, serialized
from ibal.status import (
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidServiceType,
    InvalidSetting,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.transport.core import QpCore
from ibal.transport.policy import RXE_POLICY
from ibal.transport.qp import QpConfig
from ibal.types import (
    DEFAULT_PKEY,
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    AvAttr,
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    UdDest,
    WcStatus,
    WrType,
)

_RESET = QpState.RESET
_ERROR = QpState.ERROR
_SEND_OK = frozenset({QpState.RTS, QpState.SQD, QpState.SQERR, QpState.ERROR})
_QUIET_TARGETS = frozenset({QpState.INIT, QpState.RTR})  # nothing to send, flush or time
_OPCODES: dict[QpType, frozenset[WrType]] = {
    QpType.RC: frozenset(WrType),
    QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE, WrType.LOCAL_INV, WrType.BIND_MW}),
    QpType.UD: frozenset({WrType.SEND}),
    QpType.QP1: frozenset({WrType.SEND}),
}
_INLINE = int(SendOpt.INLINE)
_IMMEDIATE = int(SendOpt.IMMEDIATE)
_OK = WcStatus.SUCCESS
_BAD_SGE = (Sge(0, 1, 0),)  # key 0 is never valid: the core fails the WR in order
_MAKES = frozenset({QpType.RC, QpType.UC, QpType.UD})


class QpVerbs(CaState):
    """``create_qp`` ... ``post_srq_recv``."""

    _next_qpn: int

    # ---------------------------------------------------------------- create
    def _alloc_qpn(self) -> int:
        qpn = checks.next_qpn(self._next_qpn, self.engine.qps)
        self._next_qpn = (qpn + 1) & 0xFFFFFF
        return qpn

    def _new_qp(self, pd: Any, qp_type: QpType, qpn: int, caps: QpCaps, scq: Any, rcq: Any,
                srq: Srq | None, sq_signaled: bool, context: Any) -> Qp:
        self._check_count("qp", self.attr.max_qps)
        cfg = QpConfig(qpn, qp_type)
        cfg.src_port = wire.qp_udp_sport(qpn)
        if qp_type is QpType.QP1:
            cfg.qkey = QP1_WELL_KNOWN_QKEY
        if qp_type in (QpType.UD, QpType.QP1):
            cfg.mtu = self.device.port_attr().active_mtu.bytes  # datagrams: the port's MTU
        rq = RecvQueue()
        source = SrqSource(srq) if srq is not None else rq
        mem = QpMemory(self.keys, pd)
        core = QpCore(cfg, mem, source, self.device.counters, RXE_POLICY)
        qp = Qp(self, pd, qp_type, qpn, caps, scq, rcq, srq, bool(sq_signaled), context,
                core, cfg, rq)
        mem.owner = qp
        self.engine.add(qp)
        self._pin_qp(qp)
        return qp

    @serialized
    def create_qp(self, h_pd: Any, qp_type: QpType, caps: QpCaps, send_cq: Any, recv_cq: Any,
                  srq: Any | None, sq_signaled: bool, qp_context: Any) -> QpCreated:
        pd, scq, rcq, s = self._qp_parts(h_pd, qp_type, caps, send_cq, recv_cq, srq, _MAKES)
        qp = self._new_qp(pd, qp_type, self._alloc_qpn(), caps, scq, rcq, s, sq_signaled,
                          qp_context)
        return QpCreated(qp, qp.attr())

    @serialized
    def create_spl_qp(self, h_pd: Any, port_num: int, qp_type: QpType, caps: QpCaps,
                      send_cq: Any, recv_cq: Any, qp_context: Any) -> QpCreated:
        pd = self._h_pd(h_pd)
        if port_num != PORT:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        scq = self._h_cq(send_cq)
        rcq = self._h_cq(recv_cq)
        if qp_type is not QpType.QP1:
            if qp_type in (QpType.QP0, QpType.RAW_IPV6, QpType.RAW_ETHER):
                raise Unsupported(f"{qp_type.name}: {self.capabilities.reason('special_qps')}")
            raise InvalidServiceType(f"create_spl_qp makes QP1, not {qp_type!r}")
        if 1 in self.engine.qps:
            raise ResourceBusy(f"QP1 of {self.name} already exists")
        checks.check_qp_caps(caps, self.attr, False)
        qp = self._new_qp(pd, qp_type, 1, caps, scq, rcq, None, True, qp_context)
        return QpCreated(qp, qp.attr())

    @serialized
    def query_qp(self, h_qp: Any) -> QpAttr:
        return self._h_qp(h_qp).attr()

    @serialized
    def destroy_qp(self, h_qp: Any, timewait_us: int = 0) -> None:
        qp = self._h_qp(h_qp)
        if qp.mcasts:
            raise ResourceBusy(f"QP 0x{qp.num:x} is still attached to {qp.mcasts} group(s)")
        self._unpin_qp(qp)
        self.engine.remove(qp)
        qp.core.req.sq.clear()
        qp.rq.wqes.clear()

    # ---------------------------------------------------------------- modify
    def _path(self, av: AvAttr) -> tuple[bytes, bytes]:
        """(destination, source) IP of a RoCE path."""
        if not isinstance(av, AvAttr):
            raise InvalidParameter("address vector attributes missing")
        if av.port_num != PORT:
            raise InvalidPort(f"{self.name} has no port {av.port_num}")
        if av.grh is None:
            raise InvalidParameter("a RoCE address vector needs a GRH (the destination GID)")
        gids = self.attr.ports[0].gid_table
        if not 0 <= av.grh.sgid_index < max(len(gids), 1):
            raise InvalidParameter(f"SGID index {av.grh.sgid_index} outside the GID table")
        dst = gid_to_ip(av.grh.dgid)
        src = b""
        for ip in self.device.io.addresses:
            if len(ip.packed) == len(dst):
                src = ip.packed
                break
        return dst, src

    @serialized
    def modify_qp(self, h_qp: Any, mod: QpMod) -> QpAttr:
        qp: Qp = self._modify_target(h_qp, mod)
        if mod.port_num is not None and mod.port_num != PORT:
            raise InvalidPort(f"{self.name} has no port {mod.port_num}")
        path = self._path(mod.primary_av) if mod.primary_av is not None else None
        if mod.pkey_index is not None and mod.pkey_index != 0:
            raise InvalidPkey(f"P_Key index {mod.pkey_index} outside the table (1 entry)")
        if mod.alternate_av is not None or mod.apm_state is not None:
            raise Unsupported(f"apm: {self.capabilities.reason('apm')}")
        port_mtu = self.device.port_attr().active_mtu
        if mod.path_mtu is not None and mod.path_mtu > port_mtu:
            raise InvalidSetting(f"path MTU {mod.path_mtu!r} above the port's {port_mtu!r}")
        checks.check_qp_values(mod, self.attr)
        if mod.sq_depth is not None or mod.rq_depth is not None:
            raise Unsupported(f"resize_qp: {self.capabilities.reason('resize_qp')}")
        self._apply(qp, mod, path)
        if mod.state not in _QUIET_TARGETS:
            self.engine.pump(qp)  # sends held in SQD, flushes in ERR, timers to drop
        return qp.attr()

    def _apply(self, qp: Qp, mod: QpMod, path: tuple[bytes, bytes] | None) -> None:
        cfg = qp.cfg
        core = qp.core
        if mod.state is _RESET:
            core.set_state(_RESET)
            qp.reset_attrs()
            cfg.dest_qpn = 0
            cfg.dst_ip = cfg.src_ip = b""
            cfg.access = 0
            cfg.rq_psn = cfg.sq_psn = 0
            core.set_psns(0, 0)
            cfg.src_port = wire.qp_udp_sport(cfg.qpn)
            if qp.qp_type in (QpType.UD, QpType.QP1):
                cfg.mtu = self.device.port_attr().active_mtu.bytes
            return
        if mod.port_num is not None:
            qp.port_num = mod.port_num
        if mod.pkey_index is not None:
            cfg.pkey_index = mod.pkey_index
            cfg.pkey = DEFAULT_PKEY
        if mod.qkey is not None and qp.qp_type is not QpType.QP1:
            cfg.qkey = mod.qkey
        if mod.access is not None:
            qp.access = AccessFlags(mod.access)
            cfg.access = int(mod.access)
        if path is not None:
            qp.av = mod.primary_av
            cfg.dst_ip, cfg.src_ip = path
        if mod.path_mtu is not None:
            qp.path_mtu = mod.path_mtu
            cfg.mtu = mod.path_mtu.bytes
        if mod.dest_qp is not None:
            qp.dest_qp = cfg.dest_qpn = mod.dest_qp
        if path is not None and qp.qp_type in (QpType.RC, QpType.UC):
            assert mod.primary_av is not None and mod.primary_av.grh is not None
            cfg.src_port = wire.connected_udp_sport(
                mod.primary_av.grh.flow_label, cfg.qpn, cfg.dest_qpn
            )
        if mod.rq_psn is not None:
            core.set_psns(rq_psn=mod.rq_psn)
        if mod.sq_psn is not None:
            qp.sq_psn = mod.sq_psn
            core.set_psns(sq_psn=mod.sq_psn)
        if mod.resp_res is not None:
            qp.resp_res = cfg.resp_res = mod.resp_res
        if mod.init_depth is not None:
            qp.init_depth = cfg.init_depth = mod.init_depth
        if mod.rnr_nak_timeout is not None:
            qp.rnr_nak_timeout = cfg.min_rnr_timer = mod.rnr_nak_timeout
        if mod.local_ack_timeout is not None:
            qp.local_ack_timeout = cfg.local_ack_timeout = mod.local_ack_timeout
        if mod.retry_cnt is not None:
            qp.retry_cnt = cfg.retry_cnt = mod.retry_cnt
        if mod.rnr_retry_cnt is not None:
            qp.rnr_retry_cnt = cfg.rnr_retry = mod.rnr_retry_cnt
        core.set_state(mod.state)

    # ------------------------------------------------------------------ SRQ
    @serialized
    def destroy_srq(self, h_srq: Any) -> None:
        self._release_srq(self._h_srq(h_srq))

    @serialized
    def post_srq_recv(self, h_srq: Any, wrs: Sequence[RecvWr]) -> None:
        srq = h_srq
        if type(srq) is not Srq or srq.ca is not self or not srq.alive:
            raise post_error(Status.INVALID_SRQ_HANDLE, 0, f"not an SRQ of {self.name}")
        for i, wr in enumerate(wrs):
            sg = wr.sg_list
            if len(sg) > srq.max_sge:
                raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {srq.max_sge}")
            if len(srq.wqes) >= srq.max_wr:
                raise post_error(Status.INSUFFICIENT_RESOURCES, i, "SRQ full")
            srq.wqes.append((wr.wr_id, tuple(Sge(s.addr, s.length, s.lkey) for s in sg)))

    # ----------------------------------------------------------------- post
    def _post_qp(self, h_qp: Any) -> Qp:
        try:
            return self._h_qp(h_qp)
        except InvalidQpHandle as e:
            raise post_error(Status.INVALID_QP_HANDLE, 0, e.detail) from None

    @serialized
    def post_send(self, h_qp: Any, wrs: Sequence[SendWr]) -> None:
        qp = self._post_qp(h_qp)
        state = qp.state
        if state not in _SEND_OK:
            raise post_error(Status.INVALID_QP_STATE, 0, f"post_send in {state.name}")
        core = qp.core
        try:
            for i, wr in enumerate(wrs):
                if len(core.req.sq) >= qp.caps.sq_depth:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, i, "send queue full")
                op = wr.opcode
                if op is WrType.LOCAL_INV or op is WrType.BIND_MW:
                    snap, local = self._local_wqe(qp, wr, i)
                    core.post_send(snap, None, None, local)
                    continue
                snap, inline = self._send_wqe(qp, wr, i)
                inv = None
                if op is WrType.SEND_WITH_INV:
                    inv = wr.invalidate_rkey & 0xFFFFFFFF
                core.post_send(snap, inline, inv)
        finally:
            self.engine.pump(qp)

    def _send_wqe(self, qp: Qp, wr: SendWr, i: int) -> tuple[SendWr, bytes | None]:
        """A checked copy of ``wr`` (and its inline bytes), or a ``PostError`` at ``i``."""
        op = wr.opcode
        if op not in _OPCODES[qp.qp_type]:
            if op in _OPCODES[QpType.RC]:
                raise post_error(Status.INVALID_WR_TYPE, i, f"{op!r} on a {qp.qp_type.name} QP")
            raise post_error(Status.INVALID_WR_TYPE, i, f"unknown work request type {op!r}")
        sg = tuple(Sge(s.addr, s.length, s.lkey) for s in wr.sg_list)
        opt = int(wr.send_opt)
        if qp.sq_signaled:
            opt |= int(SendOpt.SIGNALED)
        inline: bytes | None = None
        if opt & _INLINE and op in (WrType.SEND, WrType.RDMA_WRITE):
            total = sum(s.length for s in sg)
            if total > qp.caps.max_inline:
                raise post_error(
                    Status.INVALID_PARAMETER, i, f"{total} inline bytes > {qp.caps.max_inline}"
                )
            parts = [qp.core.mem.local(s.lkey, s.addr, s.length, False) for s in sg]
            if all(p is not None for p in parts):
                inline = b"".join(bytes(p) for p in parts if p is not None)
        elif len(sg) > qp.caps.sq_sge:
            raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {qp.caps.sq_sge}")
        ud = wr.ud
        if qp.qp_type in (QpType.UD, QpType.QP1):
            ud, av = checks.check_ud_wr(wr, i, self, self.name, Av)
            if av.pd is not qp.pd:
                sg, inline = _BAD_SGE, None  # IBA: the AV's PD must be the QP's
            ud = UdDest(av=av, remote_qp=ud.remote_qp, remote_qkey=ud.remote_qkey & 0xFFFFFFFF,
                        pkey_index=ud.pkey_index)
        if op is WrType.SEND_WITH_INV:
            if opt & _IMMEDIATE:
                raise post_error(Status.INVALID_PARAMETER, i, "a send carries immediate data "
                                 "or an R_Key to invalidate, not both")
            op = WrType.SEND  # the core sends it with the IETH it is given
        flags = wr.send_opt if opt == wr.send_opt else SendOpt(opt)  # IntFlag(): ~1 us
        snap = SendWr(wr_id=wr.wr_id, opcode=op, sg_list=sg, send_opt=flags, imm=wr.imm,
                      remote_addr=wr.remote_addr, rkey=wr.rkey, compare_add=wr.compare_add,
                      swap=wr.swap, ud=ud)
        return snap, inline

    def _local_wqe(self, qp: Qp, wr: SendWr, i: int) -> tuple[SendWr, Callable[[], WcStatus]]:
        """LOCAL_INV or a type 2 BIND_MW: its shape checked now, its effect run in queue order."""
        if wr.opcode not in _OPCODES[qp.qp_type]:  # UD has SEND only (kernel rxe's opcode mask)
            raise post_error(Status.INVALID_WR_TYPE, i, f"{wr.opcode!r} on a {qp.qp_type.name} QP")
        opt = int(wr.send_opt) | (int(SendOpt.SIGNALED) if qp.sq_signaled else 0)
        snap = SendWr(wr_id=wr.wr_id, opcode=wr.opcode, send_opt=SendOpt(opt))
        mem = qp.core.mem
        assert isinstance(mem, QpMemory)
        if wr.opcode is WrType.LOCAL_INV:
            key = wr.invalidate_rkey & 0xFFFFFFFF
            # kernel rxe completes a refused LOCAL_INV with IB_WC_LOC_QP_OP_ERR
            return snap, lambda: _OK if mem.local_invalidate(key) else WcStatus.LOCAL_OP_ERR
        mw, mr, acc = checks.check_bind_wr(wr, i, self, self.name, Mw, Mr)
        assert wr.bind is not None
        args = (mw, mr, wr.bind.addr, wr.bind.length, acc, wr.rkey & 0xFFFFFFFF)
        return snap, lambda: _OK if mem.bind_type2(*args) else WcStatus.MEM_WINDOW_BIND_ERR

    @serialized
    def post_recv(self, h_qp: Any, wrs: Sequence[RecvWr]) -> None:
        qp = self._post_qp(h_qp)
        if qp.srq is not None:
            raise post_error(Status.INVALID_PARAMETER, 0, "the QP takes receives from its SRQ")
        if qp.state is _RESET:
            raise post_error(Status.INVALID_QP_STATE, 0, "post_recv in RESET")
        rq = qp.rq.wqes
        depth = qp.caps.rq_depth
        max_sge = qp.caps.rq_sge
        try:
            for i, wr in enumerate(wrs):
                sg = wr.sg_list
                if len(sg) > max_sge:
                    raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {max_sge}")
                if len(rq) >= depth:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, i, "receive queue full")
                rq.append((wr.wr_id, tuple(Sge(s.addr, s.length, s.lkey) for s in sg)))
        finally:
            if qp.state is _ERROR:
                qp.core.recv_posted()
                self.engine.deliver(qp)
