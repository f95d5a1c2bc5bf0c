"""Queue pairs and shared receive queues: types, states, creation, modify and query attributes."""

from __future__ import annotations

import enum
from operator import attrgetter
from typing import Any

from ibal.records import record
from ibal.types.address import AvAttr
from ibal.types.ca import Mtu
from ibal.types.memory import AccessFlags


class QpType(enum.IntEnum):
    """`ib_qp_type_t` (upstream ordinals)."""

    RC = 0
    UC = 1
    RD = 2
    UD = 3
    QP0 = 4
    QP1 = 5
    RAW_IPV6 = 6
    RAW_ETHER = 7
    MAD = 8
    QP0_ALIAS = 9
    QP1_ALIAS = 10

    @property
    def is_special(self) -> bool:
        return self in _SPECIAL_QP_TYPES

    @property
    def is_datagram(self) -> bool:
        return self in _DATAGRAM_QP_TYPES

    @property
    def is_connected(self) -> bool:
        return self in (QpType.RC, QpType.UC, QpType.RD)


_SPECIAL_QP_TYPES = frozenset(
    {QpType.QP0, QpType.QP1, QpType.RAW_IPV6, QpType.RAW_ETHER, QpType.QP0_ALIAS, QpType.QP1_ALIAS}
)
_DATAGRAM_QP_TYPES = frozenset(
    {QpType.UD, QpType.QP0, QpType.QP1, QpType.MAD, QpType.QP0_ALIAS, QpType.QP1_ALIAS}
)


class QpState(enum.IntEnum):
    """`ib_qp_state_t` (upstream bit values); SQERR is the IBA "SQE" state."""

    RESET = 0x1
    INIT = 0x2
    RTR = 0x4
    RTS = 0x8
    SQD = 0x10
    SQERR = 0x80
    ERROR = 0x100


class PdType(enum.IntEnum):
    """`ib_pd_type_t`: a hint to the provider."""

    NORMAL = 0
    ALIAS = 1
    SQP = 2
    UD = 3


class ApmState(enum.IntEnum):
    """`ib_apm_state_t`."""

    MIGRATED = 1
    REARM = 2
    ARMED = 3


class SrqAttrMask(enum.IntFlag):
    """`ib_srq_attr_mask_t`."""

    MAX_WR = 0x1
    LIMIT = 0x2


@record(frozen=True)
class QpCaps:
    """Queue depths and SGE counts asked for at create and granted by the provider."""

    sq_depth: int = 16
    rq_depth: int = 16
    sq_sge: int = 1
    rq_sge: int = 1
    max_inline: int = 0


@record(frozen=True)
class QpMod:
    """`ib_qp_mod_t` flattened: the target state and the attributes to set.

    ``None`` means "not given".  Which attributes a transition requires and
    allows is the table in :mod:`ibal.qp_fsm`.
    """

    state: QpState
    current_state: QpState | None = None
    port_num: int | None = None
    pkey_index: int | None = None
    qkey: int | None = None
    access: AccessFlags | None = None
    primary_av: AvAttr | None = None
    alternate_av: AvAttr | None = None
    path_mtu: Mtu | None = None
    dest_qp: int | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    resp_res: int | None = None
    init_depth: int | None = None
    rnr_nak_timeout: int | None = None
    local_ack_timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry_cnt: int | None = None
    apm_state: ApmState | None = None
    sqd_event: bool | None = None
    sq_depth: int | None = None
    rq_depth: int | None = None

    def given(self) -> frozenset[str]:
        """Names of the attributes set (besides ``state``)."""
        return frozenset(
            [n for n, v in zip(QPMOD_ATTRS, _qpmod_values(self), strict=True) if v is not None]
        )


QPMOD_ATTRS: tuple[str, ...] = tuple(
    n for n in QpMod.__dataclass_fields__ if n != "state"
)
_qpmod_values = attrgetter(*QPMOD_ATTRS)  # one C call for the 22 values: a modify checks twice


@record(frozen=True)
class QpAttr:
    """`ib_qp_attr_t`: what ``query_qp`` reports.

    The access layer fills ``pd``, ``send_cq``, ``recv_cq`` and ``srq`` with
    its own objects; providers leave them ``None``.
    """

    qp_type: QpType
    qp_num: int
    state: QpState = QpState.RESET
    caps: QpCaps = QpCaps()
    sq_signaled: bool = True
    dest_qp: int = 0
    port_num: int = 0
    pkey_index: int = 0
    qkey: int = 0
    access: AccessFlags = AccessFlags.NONE
    primary_av: AvAttr | None = None
    alternate_av: AvAttr | None = None
    path_mtu: Mtu | None = None
    sq_psn: int = 0
    rq_psn: int = 0
    resp_res: int = 0
    init_depth: int = 0
    rnr_nak_timeout: int = 0
    local_ack_timeout: int = 0
    retry_cnt: int = 0
    rnr_retry_cnt: int = 0
    apm_state: ApmState = ApmState.MIGRATED
    sq_draining: bool = False
    pd: Any = None
    send_cq: Any = None
    recv_cq: Any = None
    srq: Any = None


@record(frozen=True)
class SrqAttr:
    """`ib_srq_attr_t`."""

    max_wr: int = 16
    max_sge: int = 1
    srq_limit: int = 0


@record(frozen=True)
class DgrmInfo:
    """`ib_dgrm_info_t`: what ``init_dgrm_svc`` binds a datagram QP to."""

    port_guid: int
    qkey: int = 0
    pkey_index: int = 0
