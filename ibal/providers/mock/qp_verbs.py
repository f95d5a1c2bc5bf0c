"""Queue pairs: create (also the special QP0/QP1), query, modify, destroy.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ibal.ci.interface import (
    Handle,
    QpCreated,
)
from ibal.providers import checks
from ibal.providers.mock.memory import QpMemory
from ibal.providers.mock.objects import (
    MockQp,
    migrate_qp,
)
from ibal.status import (
    InvalidApmState,
    InvalidMaxWrs,
    InvalidPkey,
    InvalidPort,
    InvalidServiceType,
    InvalidSetting,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    ApmState,
    AsyncEvent,
    QpAttr,
    QpCaps,
    QpMod,
    QpType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    ERROR,
    RESET,
    RTS,
    SQD,
    CaState,
    verb,
)

_MAKES = frozenset({QpType.RC, QpType.UC, QpType.UD, QpType.MAD})


def _resized(qp: MockQp, mod: QpMod, max_wrs: int) -> QpCaps:
    """The QP's sizes after ``mod``'s ``sq_depth``/``rq_depth`` (IBAL SQ_DEPTH/RQ_DEPTH).

    A queue never shrinks below the work requests it holds (``InvalidMaxWrs``).
    """
    caps = qp.caps
    for name, queue in (("sq_depth", qp.sq), ("rq_depth", qp.rq)):
        depth = getattr(mod, name)
        if depth is None:
            continue
        if name == "rq_depth" and qp.srq is not None:
            raise InvalidSetting("the QP takes its receives from an SRQ: no rq_depth")
        if not max(1, len(queue)) <= depth <= max_wrs:
            raise InvalidMaxWrs(f"{name} {depth}: {len(queue)} outstanding, CA limit {max_wrs}")
        caps = replace(caps, **{name: depth})
    return caps


class QpVerbs(CaState):
    """Queue pairs: create (also the special QP0/QP1), query, modify, destroy."""

    def _alloc_qpn(self) -> int:
        qpn = checks.next_qpn(self._next_qpn, self.qps)
        self._next_qpn = (qpn + 1) & 0xFFFFFF
        return qpn

    @verb
    def create_qp(
        self,
        h_pd: Handle,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        srq: Handle | None,
        sq_signaled: bool,
        qp_context: Any,
    ) -> QpCreated:
        pd, scq, rcq, s = self._qp_parts(h_pd, qp_type, caps, send_cq, recv_cq, srq, _MAKES)
        self._check_count("qp", self.limits.max_qps)
        qp = MockQp(
            self, pd, qp_type, self._alloc_qpn(), caps, scq, rcq, s, bool(sq_signaled), qp_context
        )
        qp.mem = QpMemory(qp)
        self.qps[qp.num] = qp
        self._pin_qp(qp)
        return QpCreated(qp, self._qp_attr(qp))

    @verb
    def create_spl_qp(
        self,
        h_pd: Handle,
        port_num: int,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        qp_context: Any,
    ) -> QpCreated:
        pd = self._h_pd(h_pd)
        port = self.port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        scq = self._h_cq(send_cq)
        rcq = self._h_cq(recv_cq)
        if qp_type in (QpType.RAW_IPV6, QpType.RAW_ETHER):
            raise Unsupported("raw IPv6 / Ethertype QPs are not modelled")
        if qp_type not in (QpType.QP0, QpType.QP1):
            raise InvalidServiceType(f"create_spl_qp makes QP0 and QP1, not {qp_type!r}")
        index = 0 if qp_type is QpType.QP0 else 1
        if port.special[index] is not None:
            raise ResourceBusy(f"{qp_type.name} of {port.name} already exists")
        checks.check_qp_caps(caps, self.limits, False)
        self._check_count("qp", self.limits.max_qps)
        qp = MockQp(self, pd, qp_type, index, caps, scq, rcq, None, True, qp_context)
        qp.mem = QpMemory(qp)
        qp.port = port
        qp.port_num = port.num
        if qp_type is QpType.QP1:
            qp.qkey = QP1_WELL_KNOWN_QKEY
        port.special[index] = qp
        self._pin_qp(qp)
        return QpCreated(qp, self._qp_attr(qp))

    def _qp_attr(self, qp: MockQp) -> QpAttr:
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=qp.state,
            caps=qp.caps,
            sq_signaled=qp.sq_signaled,
            dest_qp=qp.dest_qp,
            port_num=qp.port_num,
            pkey_index=qp.pkey_index,
            qkey=qp.qkey,
            access=qp.access,
            primary_av=qp.av,
            alternate_av=qp.alt_av,
            path_mtu=qp.path_mtu,
            sq_psn=qp.sq_psn,
            rq_psn=qp.epsn,
            resp_res=qp.resp_res,
            init_depth=qp.init_depth,
            rnr_nak_timeout=qp.rnr_nak_timeout,
            local_ack_timeout=qp.local_ack_timeout,
            retry_cnt=qp.retry_cnt,
            rnr_retry_cnt=qp.rnr_retry_cnt,
            apm_state=qp.apm_state,
            sq_draining=qp.state is SQD and qp.send_idx > 0,
        )

    @verb
    def query_qp(self, h_qp: Handle) -> QpAttr:
        return self._qp_attr(self._h_qp(h_qp))

    @verb
    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        qp: MockQp = self._modify_target(h_qp, mod)
        # ------------------------------------------------ validate everything first
        lim = self.limits
        port = qp.port
        if mod.port_num is not None:
            port = self.port_or_none(mod.port_num)
            if port is None:
                raise InvalidPort(f"{self.name} has no port {mod.port_num}")
        av = mod.primary_av
        if av is not None:
            self._check_av(av)
            port = self.ports[av.port_num - 1]
        if mod.pkey_index is not None:
            table = port.pkeys if port is not None else self.ports[0].pkeys
            if not 0 <= mod.pkey_index < len(table):
                raise InvalidPkey(f"P_Key index {mod.pkey_index} outside the table")
        alt = mod.alternate_av
        if alt is not None:
            self._check_av(alt)
        migrate = _check_apm(qp, mod)
        if mod.path_mtu is not None and (port is None or mod.path_mtu > port.max_mtu):
            raise InvalidSetting(f"path MTU {mod.path_mtu!r} above the port MTU")
        checks.check_qp_values(mod, lim)
        caps = _resized(qp, mod, lim.max_wrs)
        # ---------------------------------------------------------------- apply
        qp.caps = caps
        if port is not None and not qp.special:
            qp.port = port
            qp.port_num = port.num
        if mod.pkey_index is not None:
            qp.pkey_index = mod.pkey_index
        if mod.qkey is not None and qp.qp_type is not QpType.QP1:
            qp.qkey = mod.qkey
        if mod.access is not None:
            qp.access = AccessFlags(mod.access)
            qp.acc = int(mod.access)
        if av is not None:
            qp.av = av
        if mod.path_mtu is not None:
            qp.path_mtu = mod.path_mtu
            qp.mtu_bytes = mod.path_mtu.bytes
        if mod.dest_qp is not None:
            qp.dest_qp = mod.dest_qp
        if mod.rq_psn is not None:
            qp.rq_psn = mod.rq_psn
            qp.epsn = mod.rq_psn
        if mod.sq_psn is not None:
            qp.sq_psn = mod.sq_psn
        if mod.resp_res is not None:
            qp.resp_res = mod.resp_res
        if mod.init_depth is not None:
            qp.init_depth = mod.init_depth
        if mod.rnr_nak_timeout is not None:
            qp.rnr_nak_timeout = mod.rnr_nak_timeout
        if mod.local_ack_timeout is not None:
            qp.local_ack_timeout = mod.local_ack_timeout
        if mod.retry_cnt is not None:
            qp.retry_cnt = qp.retry_left = mod.retry_cnt
        if mod.rnr_retry_cnt is not None:
            qp.rnr_retry_cnt = qp.rnr_left = mod.rnr_retry_cnt
        if alt is not None:
            qp.alt_av = alt
            qp.alt_port = self.ports[alt.port_num - 1]
        if migrate:
            migrate_qp(qp)
        elif mod.apm_state is not None and mod.apm_state is not ApmState.MIGRATED:
            qp.apm_state = ApmState.ARMED  # the mock validates the path at once: REARM -> ARMED
        self._transition(qp, mod)
        return self._qp_attr(qp)

    def _transition(self, qp: MockQp, mod: QpMod) -> None:
        fab = self._engine
        old, new = qp.state, mod.state
        if new is RESET:
            self._reset_qp(qp)
            return
        if new is ERROR:
            fab.qp_error(qp)
            return
        qp.state = new
        if new is SQD and old is not SQD:
            qp.sqd_notify = mod.sqd_event is not False
            if qp.sqd_notify and qp.send_idx == 0:
                qp.sqd_notify = False
                fab.qp_event(qp, AsyncEvent.SQ_DRAINED)
        if new is RTS and old is not RTS:
            fab.sq_progress(qp)
            if fab.runs_inline:
                fab.drive()

    def _reset_qp(self, qp: MockQp) -> None:
        """RESET discards every WQE without a completion and clears the transport state."""
        self._engine.cancel_timer(qp)
        self._engine.ack_wait.discard(qp)
        qp.state = RESET
        qp.sq.clear()
        qp.rq.clear()
        qp.send_idx = 0
        qp.rd_atomic_out = 0
        qp.comm_est = False
        qp.nak_sent = False
        qp.atomic_cache.clear()
        qp.sqd_notify = False
        qp.epsn = qp.sq_psn = qp.rq_psn = 0
        qp.alt_av = qp.alt_port = None
        qp.apm_state = ApmState.MIGRATED

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        fab = self._engine
        self._no_callback("destroy_qp")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("destroy_qp", self)
            qp = self._h_qp(h_qp)
            if qp.mcasts:
                raise ResourceBusy(f"QP 0x{qp.num:x} is still attached to {qp.mcasts} group(s)")
            self._unpin_qp(qp)
            fab.cancel_timer(qp)
            fab.ack_wait.discard(qp)
            qp.sq.clear()
            qp.rq.clear()
            if qp.special:
                assert qp.port is not None
                qp.port.special[qp.num] = None
            else:
                del self.qps[qp.num]
        fab.callback_barrier()


def _check_apm(qp: MockQp, mod: QpMod) -> bool:
    """Validate ``mod.apm_state``: REARM/ARMED need an alternate path (loaded now or
    before), MIGRATED is a forced migration from ARMED (True) or nothing from MIGRATED."""
    want = mod.apm_state
    if want is None:
        return False
    if want is ApmState.MIGRATED:
        if qp.apm_state is ApmState.ARMED:
            return True
        if qp.apm_state is ApmState.MIGRATED:
            return False
        raise InvalidApmState("the alternate path is not armed: it cannot be migrated to")
    if mod.alternate_av is None and qp.alt_av is None:
        raise InvalidApmState("no alternate path is loaded: only MIGRATED is valid")
    return False

