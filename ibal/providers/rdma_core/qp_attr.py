"""QP attributes of an rdma_core CA: ibal ``QpMod``/``QpAttr`` <-> pyverbs ``QPAttr``.

A mixin of :class:`.qp_verbs.QpVerbs`: builds the ``ibv_modify_qp`` attribute
and mask from a :class:`~ibal.types.QpMod` (range-checking what the kernel
would take silently) and reads ``ibv_query_qp`` back into a ``QpAttr``.
Raises :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from ipaddress import IPv6Address
from typing import Any

from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.handles import Qp
from ibal.providers.rdma_core.state import CaState
from ibal.status import InvalidParameter, InvalidPkey
from ibal.types import AvAttr, Grh, QpAttr, QpMod, QpState, QpType

_PSN_MASK = 0xFFFFFF


class QpAttrs(CaState):
    """``QpMod`` -> ``(QPAttr, mask)`` and ``ibv_query_qp`` -> ``QpAttr``."""

    def _qp_attr_basic(self, qp: Qp) -> QpAttr:
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=qp.state,
            caps=qp.caps,
            sq_signaled=qp.sq_signaled,
        )

    def _modify_attr(self, qp: Qp, mod: QpMod) -> tuple[Any, int]:
        a = self.pv.qp.QPAttr()
        mask = C.IBV_QP_STATE
        a.qp_state = C.QPS_TO_IBV[mod.state]
        if mod.current_state is not None:
            a.cur_qp_state = C.QPS_TO_IBV[mod.current_state]
            mask |= C.IBV_QP_CUR_STATE
        port_num = qp.port_num
        if mod.port_num is not None:
            self._port(mod.port_num)
            port_num = mod.port_num
            a.port_num = mod.port_num
            mask |= C.IBV_QP_PORT
        if mod.pkey_index is not None:
            if port_num:
                npk = len(self._port(port_num).pkeys)
                if not 0 <= mod.pkey_index < npk:
                    raise InvalidPkey(f"P_Key index {mod.pkey_index} outside the table of {npk}")
            a.pkey_index = mod.pkey_index
            mask |= C.IBV_QP_PKEY_INDEX
        if mod.qkey is not None:
            a.qkey = mod.qkey
            mask |= C.IBV_QP_QKEY
        if mod.access is not None:
            try:
                a.qp_access_flags = C.access_to_ibv(mod.access)
            except ValueError as exc:
                raise InvalidParameter(str(exc)) from exc
            mask |= C.IBV_QP_ACCESS_FLAGS
        if mod.primary_av is not None:
            ah, _ = self._route(mod.primary_av)
            a.ah_attr = ah
            mask |= C.IBV_QP_AV
        if mod.alternate_av is not None:
            ah, _ = self._route(mod.alternate_av)
            a.alt_ah_attr = ah
            a.alt_port_num = mod.alternate_av.port_num
            a.alt_pkey_index = mod.pkey_index if mod.pkey_index is not None else qp.pkey_index
            a.alt_timeout = (
                mod.local_ack_timeout if mod.local_ack_timeout is not None else qp.timeout
            )
            mask |= C.IBV_QP_ALT_PATH
        if mod.path_mtu is not None:
            a.path_mtu = int(mod.path_mtu)
            mask |= C.IBV_QP_PATH_MTU
        if mod.dest_qp is not None:
            _check_range("dest_qp", mod.dest_qp, 0xFFFFFF)
            a.dest_qp_num = mod.dest_qp
            mask |= C.IBV_QP_DEST_QPN
        if mod.rq_psn is not None:
            _check_range("rq_psn", mod.rq_psn, _PSN_MASK)
            a.rq_psn = mod.rq_psn
            mask |= C.IBV_QP_RQ_PSN
        if mod.sq_psn is not None:
            _check_range("sq_psn", mod.sq_psn, _PSN_MASK)
            a.sq_psn = mod.sq_psn
            mask |= C.IBV_QP_SQ_PSN
        if mod.resp_res is not None:
            _check_range("resp_res", mod.resp_res, int(self.dev.max_qp_rd_atom))
            a.max_dest_rd_atomic = mod.resp_res
            mask |= C.IBV_QP_MAX_DEST_RD_ATOMIC
        if mod.init_depth is not None:
            _check_range("init_depth", mod.init_depth, int(self.dev.max_qp_init_rd_atom))
            a.max_rd_atomic = mod.init_depth
            mask |= C.IBV_QP_MAX_QP_RD_ATOMIC
        if mod.rnr_nak_timeout is not None:
            _check_range("rnr_nak_timeout", mod.rnr_nak_timeout, 31)
            a.min_rnr_timer = mod.rnr_nak_timeout
            mask |= C.IBV_QP_MIN_RNR_TIMER
        if mod.local_ack_timeout is not None:
            _check_range("local_ack_timeout", mod.local_ack_timeout, 31)
            a.timeout = mod.local_ack_timeout
            mask |= C.IBV_QP_TIMEOUT
        if mod.retry_cnt is not None:
            _check_range("retry_cnt", mod.retry_cnt, 7)
            a.retry_cnt = mod.retry_cnt
            mask |= C.IBV_QP_RETRY_CNT
        if mod.rnr_retry_cnt is not None:
            _check_range("rnr_retry_cnt", mod.rnr_retry_cnt, 7)
            a.rnr_retry = mod.rnr_retry_cnt
            mask |= C.IBV_QP_RNR_RETRY
        if mod.apm_state is not None:
            a.path_mig_state = C.APM_TO_IBV[mod.apm_state]
            mask |= C.IBV_QP_PATH_MIG_STATE
        if mod.sqd_event is not None:
            a.en_sqd_async_notify = 1 if mod.sqd_event else 0
            mask |= C.IBV_QP_EN_SQD_ASYNC_NOTIFY
        if mod.sq_depth is not None or mod.rq_depth is not None:
            cap = self.pv.qp.QPCap(
                max_send_wr=mod.sq_depth if mod.sq_depth is not None else qp.caps.sq_depth,
                max_recv_wr=mod.rq_depth if mod.rq_depth is not None else qp.caps.rq_depth,
                max_send_sge=qp.caps.sq_sge,
                max_recv_sge=qp.caps.rq_sge,
                max_inline_data=qp.caps.max_inline,
            )
            a.cap = cap
            mask |= C.IBV_QP_CAP
        return a, mask

    def _query(self, qp: Qp) -> QpAttr:
        try:
            a, ia = qp.pv.query(C.IBV_QP_ALL_ATTRS)
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_query_qp") from exc
        state = C.QPS_FROM_IBV.get(int(a.qp_state), qp.state)
        qp.state = state
        caps = qp.caps
        connected = qp.qp_type is not QpType.UD
        primary = qp.primary_av
        if primary is None and connected and state not in (QpState.RESET, QpState.INIT):
            primary = self._av_from_ibv(a.ah_attr)
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=state,
            caps=caps,
            sq_signaled=bool(ia.sq_sig_all),
            dest_qp=int(a.dest_qp_num) if connected else 0,
            port_num=int(a.port_num),
            pkey_index=int(a.pkey_index),
            qkey=int(a.qkey) if not connected else 0,
            access=C.access_from_ibv(int(a.qp_access_flags)),
            primary_av=primary,
            alternate_av=qp.alternate_av,
            path_mtu=C.mtu_from_ibv(int(a.path_mtu)) if connected else None,
            sq_psn=int(a.sq_psn),
            rq_psn=int(a.rq_psn) if connected else 0,
            resp_res=int(a.max_dest_rd_atomic),
            init_depth=int(a.max_rd_atomic),
            rnr_nak_timeout=int(a.min_rnr_timer),
            local_ack_timeout=int(a.timeout),
            retry_cnt=int(a.retry_cnt),
            rnr_retry_cnt=int(a.rnr_retry),
            apm_state=C.APM_FROM_IBV.get(int(a.path_mig_state), C.APM_FROM_IBV[0]),
            sq_draining=bool(a.sq_draining),
        )

    def _av_from_ibv(self, ah: Any) -> AvAttr:
        grh = None
        if int(ah.is_global):
            grh = Grh(
                dgid=IPv6Address(ah.dgid),
                sgid_index=int(ah.sgid_index),
                flow_label=int(ah.flow_label),
                hop_limit=int(ah.hop_limit),
                traffic_class=int(ah.traffic_class),
            )
        return AvAttr(
            port_num=int(ah.port_num),
            dlid=int(ah.dlid),
            sl=int(ah.sl),
            grh=grh,
            static_rate=int(ah.static_rate),
            path_bits=int(ah.src_path_bits),
        )


def _check_range(name: str, value: int, top: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= top:
        raise InvalidParameter(f"{name} {value} outside 0..{top}")
