"""Enums and records shared by the access layer and the provider contract.

Values follow IBAL's ``ib_types.h`` (upstream WinOFED) where the seed documents
leave them out, and the IBA spec where IBAL and the spec disagree; see
``docs/decisions.md``.  Out-parameters of the C API become fields of these
records or return values.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import field
from ipaddress import IPv6Address
from operator import attrgetter
from typing import Any, TypeGuard

from ibal.memo import derived
from ibal.records import record
from ibal.status import InvalidParameter

Gid = IPv6Address
"""A GID is 16 bytes in IPv6 format; ``Gid(bytes16)`` or ``Gid("fe80::1")``."""

VERBS_VERSION = 2
"""The contract version this access layer speaks (2: MAD agents, see docs/writing-a-provider.md)."""

MIN_VERBS_VERSION = 1
"""The oldest contract version the AL still accepts (1: no MAD-agent verbs)."""

MAD_SIZE = 256
DEFAULT_PKEY = 0xFFFF
QP1_WELL_KNOWN_QKEY = 0x80010000
MULTICAST_LID_BASE = 0xC000
PERMISSIVE_LID = 0xFFFF
IB_ANY_INDEX = -1


# --------------------------------------------------------------------------- enums


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


class AccessFlags(enum.IntFlag):
    """`ib_access_t`."""

    NONE = 0
    RDMA_READ = 0x1
    RDMA_WRITE = 0x2
    ATOMIC = 0x4
    LOCAL_WRITE = 0x8
    MW_BIND = 0x10

    @property
    def is_remote(self) -> bool:
        return bool(self & (AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC))


ALL_ACCESS = (
    AccessFlags.RDMA_READ
    | AccessFlags.RDMA_WRITE
    | AccessFlags.ATOMIC
    | AccessFlags.LOCAL_WRITE
    | AccessFlags.MW_BIND
)


class AlFlags(enum.IntFlag):
    """`ib_al_flags_t` of the request structs (queries, service registration, multicast,
    subscriptions, CM): ``SYNC`` (``IB_FLAGS_SYNC``) makes the call block until the
    operation completes; its callback still runs, before the call returns."""

    NONE = 0
    SYNC = 0x1


class SendOpt(enum.IntFlag):
    """`ib_send_opt_t`."""

    NONE = 0
    IMMEDIATE = 0x1
    FENCE = 0x2
    SIGNALED = 0x4
    SOLICITED = 0x8
    INLINE = 0x10
    LOCAL = 0x20


class RecvOpt(enum.IntFlag):
    """`ib_recv_opt_t`; INVALIDATE (verbs' ``IBV_WC_WITH_INV``): ``Wc.invalidated_rkey`` is set."""

    NONE = 0
    IMMEDIATE = 0x1
    FORWARD = 0x2
    GRH_VALID = 0x4
    INVALIDATE = 0x8


class WrType(enum.IntEnum):
    """`ib_wr_type_t`: immediate data is the IMMEDIATE send option, as in IBAL.

    The last three are verbs' (``IBV_WR_*``, same numbers): IBAL has no send
    with invalidate and binds windows only through ``ib_bind_mw``.
    ``SEND_WITH_INV`` and ``LOCAL_INV`` name the key in ``SendWr.invalidate_rkey``;
    ``BIND_MW`` binds a type 2 window (``SendWr.mw``, ``SendWr.bind``) under the
    new R_Key ``SendWr.rkey``.  Providers list them in ``Capabilities.opcodes``.
    """

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMPARE_SWAP = 3
    FETCH_ADD = 4
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9

    @property
    def is_atomic(self) -> bool:
        return self in (WrType.COMPARE_SWAP, WrType.FETCH_ADD)

    @property
    def is_local(self) -> bool:
        """Executed by the local CA alone: nothing goes on the wire."""
        return self is WrType.LOCAL_INV or self is WrType.BIND_MW


BASE_WR_TYPES = frozenset(
    {WrType.SEND, WrType.RDMA_WRITE, WrType.RDMA_READ, WrType.COMPARE_SWAP, WrType.FETCH_ADD}
)
"""The opcodes of contract version 1 (what a CA that says nothing else supports)."""

INVALIDATE_WR_TYPES = frozenset({WrType.SEND_WITH_INV, WrType.LOCAL_INV, WrType.BIND_MW})
"""Send with invalidate, local invalidate, type 2 bind: each provider opts in."""


class WcType(enum.IntEnum):
    """`ib_wc_type_t`."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMPARE_SWAP = 3
    FETCH_ADD = 4
    MW_BIND = 5
    LOCAL_INV = 6
    RECV = 0x80
    RECV_RDMA_WRITE = 0x81


WC_TYPE_FOR_WR: dict[WrType, WcType] = {
    WrType.SEND: WcType.SEND,
    WrType.RDMA_WRITE: WcType.RDMA_WRITE,
    WrType.RDMA_READ: WcType.RDMA_READ,
    WrType.COMPARE_SWAP: WcType.COMPARE_SWAP,
    WrType.FETCH_ADD: WcType.FETCH_ADD,
    WrType.LOCAL_INV: WcType.LOCAL_INV,
    WrType.BIND_MW: WcType.MW_BIND,
    WrType.SEND_WITH_INV: WcType.SEND,
}


class WcStatus(enum.IntEnum):
    """`ib_wc_status_t`."""

    SUCCESS = 0
    LOCAL_LEN_ERR = 1
    LOCAL_OP_ERR = 2
    LOCAL_PROTECTION_ERR = 3
    WR_FLUSHED_ERR = 4
    MEM_WINDOW_BIND_ERR = 5
    REM_ACCESS_ERR = 6
    REM_OP_ERR = 7
    RNR_RETRY_ERR = 8
    TIMEOUT_RETRY_ERR = 9
    REM_INVALID_REQ_ERR = 10
    BAD_RESP_ERR = 11
    LOCAL_ACCESS_ERR = 12
    GENERAL_ERR = 13
    UNMATCHED_RESPONSE = 14
    CANCELED = 15


class AsyncEvent(enum.IntEnum):
    """`ib_async_event_t` (upstream, from 1); unknown provider codes map to UNKNOWN."""

    SQ_ERROR = 1
    SQ_DRAINED = 2
    RQ_ERROR = 3
    CQ_ERROR = 4
    QP_FATAL = 5
    QP_COMM = 6
    QP_APM = 7
    LOCAL_FATAL = 8
    PKEY_TRAP = 9
    QKEY_TRAP = 10
    MKEY_TRAP = 11
    PORT_TRAP = 12
    SYSIMG_GUID_TRAP = 13
    BUF_OVERRUN = 14
    LINK_INTEGRITY = 15
    FLOW_CTRL_ERROR = 16
    BKEY_TRAP = 17
    QP_APM_ERROR = 18
    WQ_REQ_ERROR = 19
    WQ_ACCESS_ERROR = 20
    PORT_ACTIVE = 21
    PORT_DOWN = 22
    CLIENT_REREGISTER = 23
    SRQ_LIMIT_REACHED = 24
    SRQ_CATAS_ERROR = 25
    SRQ_QP_LAST_WQE_REACHED = 26
    LID_CHANGE = 27
    PKEY_CHANGE = 28
    SM_CHANGE = 29
    GID_CHANGE = 30
    CQ_OVERFLOW = 31
    UNKNOWN = 32

    @classmethod
    def _missing_(cls, value: object) -> AsyncEvent:
        return cls.UNKNOWN

    @property
    def source(self) -> EventSource:
        """Which kind of object the event concerns (decides whose callback gets it)."""
        return _EVENT_SOURCE.get(self, EventSource.CA)


class EventSource(enum.Enum):
    CA = "ca"
    QP = "qp"
    CQ = "cq"
    SRQ = "srq"


_EVENT_SOURCE = {
    **{
        e: EventSource.QP
        for e in (
            AsyncEvent.SQ_ERROR,
            AsyncEvent.SQ_DRAINED,
            AsyncEvent.RQ_ERROR,
            AsyncEvent.QP_FATAL,
            AsyncEvent.QP_COMM,
            AsyncEvent.QP_APM,
            AsyncEvent.QP_APM_ERROR,
            AsyncEvent.WQ_REQ_ERROR,
            AsyncEvent.WQ_ACCESS_ERROR,
            AsyncEvent.SRQ_QP_LAST_WQE_REACHED,
        )
    },
    AsyncEvent.CQ_ERROR: EventSource.CQ,
    AsyncEvent.CQ_OVERFLOW: EventSource.CQ,
    AsyncEvent.SRQ_LIMIT_REACHED: EventSource.SRQ,
    AsyncEvent.SRQ_CATAS_ERROR: EventSource.SRQ,
}


class PdType(enum.IntEnum):
    """`ib_pd_type_t`: a hint to the provider."""

    NORMAL = 0
    ALIAS = 1
    SQP = 2
    UD = 3


class LinkState(enum.IntEnum):
    """Port logical state (PortInfo.PortState)."""

    NO_CHANGE = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACT_DEFER = 5


class Mtu(enum.IntEnum):
    """IBA MTU encoding."""

    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @property
    def bytes(self) -> int:
        return 128 << self.value


class ApmState(enum.IntEnum):
    """`ib_apm_state_t`."""

    MIGRATED = 1
    REARM = 2
    ARMED = 3


class AtomicCap(enum.IntEnum):
    """How far atomics are atomic (IBA: none, this HCA only, global)."""

    NONE = 0
    LOCAL = 1
    GLOBAL = 2


class MrModMask(enum.IntFlag):
    """`ib_mr_mod_t`: what re-registration changes."""

    ADDR = 0x1
    PD = 0x2
    ACCESS = 0x4


class SrqAttrMask(enum.IntFlag):
    """`ib_srq_attr_mask_t`."""

    MAX_WR = 0x1
    LIMIT = 0x2


class PortCap(enum.IntFlag):
    """PortInfo.CapabilityMask bits (IBA 14.2.5.6)."""

    NONE = 0
    IS_SM = 1 << 1
    IS_NOTICE_SUPPORTED = 1 << 2
    IS_TRAP_SUPPORTED = 1 << 3
    IS_APM_SUPPORTED = 1 << 5
    IS_SLMAP_SUPPORTED = 1 << 6
    IS_MKEY_NVRAM = 1 << 7
    IS_PKEY_NVRAM = 1 << 8
    IS_LEDINFO_SUPPORTED = 1 << 9
    IS_SM_DISABLED = 1 << 10
    IS_SYSGUID_SUPPORTED = 1 << 11
    IS_CM_SUPPORTED = 1 << 16
    IS_SNMP_SUPPORTED = 1 << 17
    IS_REINIT_SUPPORTED = 1 << 18
    IS_DEV_MGMT_SUPPORTED = 1 << 19
    IS_VEND_SUPPORTED = 1 << 20
    IS_DR_NOTICE_SUPPORTED = 1 << 21
    IS_CAPM_NOTICE_SUPPORTED = 1 << 22
    IS_BOOT_MGMT_SUPPORTED = 1 << 23
    IS_CLIENT_REREGISTER_SUPPORTED = 1 << 25


class CaMod(enum.IntFlag):
    """`ib_ca_mod_t`: which port attributes ``modify_ca`` changes.

    The ``IS_*`` bits select PortInfo capability bits, which take the value they
    have in ``PortAttrMod.cap``; the counter bits reset violation counters.
    """

    NONE = 0
    IS_CM_SUPPORTED = 1 << 0
    IS_SNMP_SUPPORTED = 1 << 1
    IS_DEV_MGMT_SUPPORTED = 1 << 2
    IS_VEND_SUPPORTED = 1 << 3
    IS_SM = 1 << 4
    IS_SM_DISABLED = 1 << 5
    QKEY_CTR = 1 << 6
    PKEY_CTR = 1 << 7
    IS_NOTICE_SUPPORTED = 1 << 8
    IS_TRAP_SUPPORTED = 1 << 9
    IS_APM_SUPPORTED = 1 << 10
    IS_SLMAP_SUPPORTED = 1 << 11
    IS_PKEY_NVRAM = 1 << 12
    IS_MKEY_NVRAM = 1 << 13
    IS_SYSGUID_SUPPORTED = 1 << 14
    IS_DR_NOTICE_SUPPORTED = 1 << 15
    IS_BOOT_MGMT_SUPPORTED = 1 << 16
    IS_CAPM_NOTICE_SUPPORTED = 1 << 17
    IS_REINIT_SUPPORTED = 1 << 18
    IS_LEDINFO_SUPPORTED = 1 << 19
    SHUTDOWN_PORT = 1 << 20
    INIT_TYPE_VALUE = 1 << 21
    SYSTEM_IMAGE_GUID = 1 << 22
    IS_CLIENT_REREGISTER_SUPPORTED = 1 << 23


CA_MOD_VALID = CaMod(sum(int(m) for m in CaMod))
"""Every defined bit; anything outside is an unknown command (INVALID_PARAMETER)."""

CA_MOD_TO_PORT_CAP: dict[CaMod, PortCap] = {
    CaMod[name]: PortCap[name] for name in CaMod.__members__ if name in PortCap.__members__
}


class NodeType(enum.IntEnum):
    CA = 1
    SWITCH = 2
    ROUTER = 3


class LinkLayer(enum.Enum):
    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"


class GidType(enum.Enum):
    """What a GID table entry addresses: an IB port, or RoCE v1/v2 on a netdev."""

    IB = "IB"
    ROCE_V1 = "RoCE v1"
    ROCE_V2 = "RoCE v2"


class NetworkHeader(enum.Enum):
    """What the 40-byte GRH area of a datagram receive holds.

    ``IB_GRH``: an IBA GRH (InfiniBand and RoCE v1); ``IPV6``: a RoCE v2 IPv6
    header (same 40-byte shape); ``IPV4``: a RoCE v2 IPv4 header in the last
    20 bytes, after 20 bytes of zeros.
    """

    IB_GRH = "IB GRH"
    IPV4 = "IPv4"
    IPV6 = "IPv6"

    @property
    def offset(self) -> int:
        """Where the header starts in the GRH area."""
        return 20 if self is NetworkHeader.IPV4 else 0


@record(frozen=True)
class GidEntry:
    """One GID table entry: the GID, its type and (RoCE) the network device it lives on."""

    index: int
    gid: Gid
    gid_type: GidType = GidType.IB
    netdev: str = ""

    @property
    def is_ipv4(self) -> bool:
        """An IPv4-mapped GID (``::ffff:a.b.c.d``): RoCE v2 over IPv4."""
        return self.gid.ipv4_mapped is not None

    @property
    def network_header(self) -> NetworkHeader:
        """The header packets sent from this GID carry."""
        if self.gid_type is not GidType.ROCE_V2:
            return NetworkHeader.IB_GRH
        return NetworkHeader.IPV4 if self.is_ipv4 else NetworkHeader.IPV6


ZERO_GID = Gid(0)


# ------------------------------------------------------------------- CA attributes


@record(frozen=True)
class PortAttr:
    """`ib_port_attr_t`: one port as ``query_ca`` reports it."""

    port_num: int
    port_guid: int
    lid: int = 0
    lmc: int = 0
    sm_lid: int = 0
    sm_sl: int = 0
    link_state: LinkState = LinkState.DOWN
    active_mtu: Mtu = Mtu.MTU_1024
    max_mtu: Mtu = Mtu.MTU_4096
    cap: PortCap = PortCap.NONE
    pkeys: tuple[int, ...] = (DEFAULT_PKEY,)
    gids: tuple[Gid, ...] = ()
    qkey_violations: int = 0
    pkey_violations: int = 0
    subnet_timeout: int = 18
    init_type_reply: int = 0
    max_vls: int = 1
    link_layer: LinkLayer = LinkLayer.INFINIBAND
    active_speed: str = "2.5 Gbps"
    active_width: str = "4X"
    gid_table: tuple[GidEntry, ...] = ()
    """The valid GID entries with type and netdev; holes (zero GIDs) are left out.

    A provider fills ``gids`` (by index, zero GIDs for holes) or ``gid_table``
    or both; the other is derived.  Derived entries are IB GIDs on InfiniBand
    ports and RoCE v1 on Ethernet ports (providers of RoCE ports should say).
    """

    def __post_init__(self) -> None:
        if self.gid_table and not self.gids:
            size = max(e.index for e in self.gid_table) + 1
            by_index = {e.index: e.gid for e in self.gid_table}
            gids = tuple(by_index.get(i, ZERO_GID) for i in range(size))
            object.__setattr__(self, "gids", gids)
        elif self.gids and not self.gid_table:
            kind = GidType.IB if self.link_layer is LinkLayer.INFINIBAND else GidType.ROCE_V1
            table = tuple(
                GidEntry(i, g, kind) for i, g in enumerate(self.gids) if g != ZERO_GID
            )
            object.__setattr__(self, "gid_table", table)

    def gid_entry(self, index: int) -> GidEntry | None:
        """The entry at GID ``index``, ``None`` for a hole or an index past the table."""
        for e in self.gid_table:
            if e.index == index:
                return e
        return None

    def gid_index(self, gid: bytes) -> int | None:
        """The index of the first entry holding ``gid`` (16 bytes), ``None`` if none does."""
        return derived(self, "gid_index", self._gid_indexes).get(bytes(gid))

    def _gid_indexes(self) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for e in self.gid_table:
            out.setdefault(e.gid.packed, e.index)
        return out

    def pkey_index(self, pkey: int) -> int | None:
        """The index of the first P_Key with ``pkey``'s 15 key bits (membership aside)."""
        return derived(self, "pkey_index", self._pkey_indexes).get(pkey & 0x7FFF)

    def _pkey_indexes(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for i, k in enumerate(self.pkeys):
            out.setdefault(k & 0x7FFF, i)
        return out


@record(frozen=True)
class CaAttr:
    """`ib_ca_attr_t`: identity and limits of a CA."""

    ca_guid: int
    vendor_id: int = 0
    device_id: int = 0
    revision: int = 0
    fw_version: str = ""
    system_image_guid: int = 0
    node_type: NodeType = NodeType.CA
    max_pds: int = 0
    max_qps: int = 0
    max_wrs: int = 0
    max_sges: int = 0
    max_cqs: int = 0
    max_cqes: int = 0
    max_srqs: int = 0
    max_srq_wrs: int = 0
    max_srq_sges: int = 0
    max_avs: int = 0
    max_mrs: int = 0
    max_mws: int = 0
    max_mr_size: int = 0
    max_inline: int = 0
    max_qp_init_depth: int = 0
    max_qp_resp_res: int = 0
    max_mcast_grps: int = 0
    max_qps_per_mcast_grp: int = 0
    page_size_cap: int = 4096
    atomicity: AtomicCap = AtomicCap.NONE
    local_ack_delay: int = 0
    has_local_sma: bool = False
    ports: tuple[PortAttr, ...] = ()

    @property
    def num_ports(self) -> int:
        return len(self.ports)

    def port(self, port_num: int) -> PortAttr:
        """The port numbered ``port_num`` (ports count from 1)."""
        for p in self.ports:
            if p.port_num == port_num:
                return p
        raise KeyError(port_num)

    def port_of_gid(self, gid: bytes) -> PortAttr | None:
        """The first port whose GID table holds ``gid`` (16 bytes), ``None`` if none."""
        for p in self.ports:
            if p.gid_index(gid) is not None:
                return p
        return None


@record(frozen=True)
class PortAttrMod:
    """`ib_port_attr_mod_t`: new values for the bits ``CaMod`` selects."""

    cap: PortCap = PortCap.NONE
    init_type: int = 0
    system_image_guid: int = 0


# ---------------------------------------------------------------- address vectors


@record(frozen=True)
class Grh:
    """Global route: required for RoCE and off-subnet destinations."""

    dgid: Gid
    sgid_index: int = 0
    flow_label: int = 0
    hop_limit: int = 64
    traffic_class: int = 0


@record(frozen=True)
class AvAttr:
    """`ib_av_attr_t`: where a datagram goes (or a connected QP's path)."""

    port_num: int
    dlid: int = 0
    sl: int = 0
    grh: Grh | None = None
    static_rate: int = 0
    path_bits: int = 0


# ------------------------------------------------------------------------- QPs


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


# ---------------------------------------------------------------- work requests


@record
class Sge:
    """`ib_local_ds_t`: one scatter/gather element in registered memory."""

    addr: int
    length: int
    lkey: int


@record
class UdDest:
    """The datagram part of a send work request.

    ``av`` is an access-layer AV object for consumers; the AL hands providers
    their own AV handle in its place.
    """

    av: Any
    remote_qp: int
    remote_qkey: int = 0
    pkey_index: int = 0


@record
class SendWr:
    """`ib_send_wr_t`; a list of these is what ``post_send`` takes."""

    wr_id: int = 0
    opcode: WrType = WrType.SEND
    sg_list: Sequence[Sge] = ()
    send_opt: SendOpt = SendOpt.SIGNALED
    imm: int = 0
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    ud: UdDest | None = None
    invalidate_rkey: int = 0
    """``SEND_WITH_INV``: the R_Key the receiver invalidates; ``LOCAL_INV``: the local one."""
    mw: Any = None
    """``BIND_MW``: the type 2 window (an AL ``Mw``; the provider's handle below the AL)."""
    bind: BindWr | None = None
    """``BIND_MW``: region, range and access (``mr``, ``addr``, ``length``, ``access``)."""


@record
class RecvWr:
    """`ib_recv_wr_t`."""

    wr_id: int = 0
    sg_list: Sequence[Sge] = ()


@record(frozen=True)
class Wc:
    """`ib_wc_t`: one work completion."""

    wr_id: int
    wc_type: WcType
    status: WcStatus = WcStatus.SUCCESS
    length: int = 0
    imm: int | None = None
    recv_opt: RecvOpt = RecvOpt.NONE
    qp_num: int = 0
    src_qp: int = 0
    slid: int = 0
    sl: int = 0
    pkey_index: int = 0
    path_bits: int = 0
    vendor_err: int = 0
    grh: bytes | None = None
    network_header: NetworkHeader | None = None
    """Datagram receives with ``RecvOpt.GRH_VALID``: what the 40-byte GRH area holds."""
    invalidated_rkey: int | None = None
    """Receives with ``RecvOpt.INVALIDATE``: the R_Key the sender's SEND_WITH_INV invalidated."""


@record
class BindWr:
    """`ib_bind_wr_t`: bind a memory window to ``[addr, addr+length)`` of ``mr``.

    ``mr`` is an access-layer MR for consumers and the provider's MR handle
    below the AL.  ``length == 0`` unbinds.
    """

    mr: Any
    addr: int
    length: int
    access: AccessFlags
    current_rkey: int
    wr_id: int = 0
    send_opt: SendOpt = SendOpt.SIGNALED


# ------------------------------------------------------------------------- memory


@record(frozen=True)
class MrAttr:
    """`ib_mr_attr_t`; ``pd`` is filled by the access layer."""

    local_lb: int
    local_ub: int
    remote_lb: int
    remote_ub: int
    access: AccessFlags
    lkey: int
    rkey: int
    pd: Any = None


@record(frozen=True)
class MrKeys:
    """What a registration returns: keys and the I/O virtual address assigned."""

    handle: Any
    lkey: int
    rkey: int
    vaddr: int
    length: int


@record(frozen=True)
class PhysCreate:
    """`ib_phys_create_t`: pages that are to look contiguous to the HCA.

    Each page is a writable buffer standing for a physical range; ``length``
    bytes starting ``buf_offset`` into the first page are registered.
    """

    pages: Sequence[memoryview]
    page_size: int
    length: int
    access: AccessFlags
    buf_offset: int = 0


@record(frozen=True)
class FmrCreate:
    """`mlnx_fmr_create_t`: a fast memory region's limits, fixed when it is created.

    ``max_pages`` pages of ``page_size`` bytes (a power of two; the C field is a
    shift) may be mapped at a time; ``max_maps`` maps may follow one another before
    an unmap is needed; ``access`` applies to every mapping.
    """

    max_pages: int
    max_maps: int
    page_size: int
    access: AccessFlags


# -------------------------------------------------------------------- events


@record(frozen=True)
class EventRecord:
    """`ib_event_rec_t`: what a provider reports through the async-event upcall.

    ``context`` is the context given at creation of the object concerned
    (``qp_context``, ``cq_context``, ``srq_context``) or the ``ca_context``.
    """

    code: AsyncEvent
    context: Any
    vendor_specific: int = 0
    port_num: int = 0


@record(frozen=True)
class AsyncEventRec:
    """`ib_async_event_rec_t`: what the AL hands consumers' event callbacks."""

    code: AsyncEvent
    context: Any
    handle: Any
    vendor_specific: int = 0
    port_num: int = 0


@record
class CiOp:
    """`ib_ci_op_t`: a vendor command and its data, with the vendor's status."""

    command: int
    data: bytes = b""
    status: int = 0
    out: bytes = b""
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- MADs

MAD_HEADER_SIZE = 24
"""The common MAD header: base/class version, class, method, status, TID, attribute."""


def mad_is_response(mad: bytes | bytearray | memoryview) -> bool:
    """Whether a MAD answers a request (R bit in the method, or TrapRepress)."""
    method = mad[3]
    return bool(method & 0x80) or method == 0x07


MAD_STATUS_BAD_VERSION = 0x0004
"""MAD status: the class (or its class version) is not supported here."""
MAD_STATUS_UNSUPPORTED_METHOD = 0x0008
"""MAD status: the class is supported, the method is not."""
MAD_STATUS_UNSUPPORTED_METHOD_ATTR = 0x000C
"""MAD status: the method is supported, not with this attribute."""


def mad_error_reply(mad: bytes | bytearray | memoryview, status: int) -> bytes | None:
    """The GetResp a management agent owes an unserved Get/Set request, else ``None``.

    Only Get and Set requests are answered (responses, traps, Sends and the
    other methods are not); the reply keeps the request's TID and attribute and
    carries ``status``.  Directed-route SMPs (class 0x81) get none here: their
    reply needs the path reversed, which is the SMA's job.
    """
    if len(mad) < MAD_HEADER_SIZE or mad[3] not in (0x01, 0x02) or mad[1] == 0x81:
        return None
    reply = bytearray(mad)
    reply[3] = 0x81
    reply[4:6] = status.to_bytes(2, "big")
    return bytes(reply)


@record(frozen=True)
class MadAddr:
    """Where a MAD goes (send) or came from (receive): ``ib_mad_addr`` as a record.

    On a receive, ``dlid`` is the sender's LID, ``remote_qp`` its QP and
    ``grh.dgid`` its GID, so the record addresses the reply as it stands.
    """

    remote_qp: int = 1
    remote_qkey: int = QP1_WELL_KNOWN_QKEY
    dlid: int = 0
    sl: int = 0
    path_bits: int = 0
    pkey_index: int = 0
    grh: Grh | None = None


@record(frozen=True)
class MadSend:
    """One MAD to send through a MAD agent.

    ``mad`` is exactly :data:`MAD_SIZE` bytes.  For a request (no R bit) the
    transport owns the high 32 bits of the TID: it writes the agent's id
    there, so the response comes back to this agent.  A request with
    ``timeout_ms > 0`` waits for its response (matched by the TID's low 32
    bits), re-sent up to ``retries`` times; only then is a response delivered
    (as the kernel's MAD layer does).  ``context`` comes back in the
    :class:`MadSendDone`.
    """

    mad: bytes
    addr: MadAddr
    timeout_ms: int = 0
    retries: int = 0
    context: Any = None


@record(frozen=True)
class MadSendDone:
    """How a send ended, once per send.

    ``SUCCESS``: on the wire (``timeout_ms == 0``) or answered (reported
    before the response's ``recv_cb``, as IBAL orders them);
    ``TIMEOUT_RETRY_ERR``: no response after the retries; ``CANCELED``: the
    agent went away first; other statuses: the send failed locally.
    """

    context: Any
    status: WcStatus = WcStatus.SUCCESS


@record(frozen=True)
class MadRecv:
    """A MAD that reached an agent: the bytes, who sent it, on which port and QP."""

    mad: bytes
    addr: MadAddr
    port_num: int
    qp_num: int


MadRecvCallback = Callable[[MadRecv], object]
MadSendCallback = Callable[[MadSendDone], object]


@record(frozen=True)
class MadAgentSpec:
    """What ``register_mad_agent`` takes: one MAD client of a port's QP0 or QP1.

    Requests (no R bit) of ``mgmt_class``/``class_version`` whose method is
    in ``methods`` reach ``recv_cb``; so do responses to the requests this
    agent sent (matched by the TID's high 32 bits).  ``methods`` may be empty
    (an agent that only sends requests).  ``rmpp_version`` 0 means the caller
    does RMPP itself (segments pass through unchanged).  ``oui``: for a vendor
    range 2 class (0x30..0x4F) only the requests whose class header carries
    this OUI (bytes 37..39) reach the agent, 0 meaning OpenIB's
    (:data:`OPENIB_OUI`, what libibumad's ``umad_register`` uses); it must be 0
    for every other class.
    ``recv_batch_cb`` (optional): the provider may hand several received MADs
    of the agent over in one call, in arrival order, instead of one
    ``recv_cb`` each.
    """

    port_num: int
    qp_num: int
    mgmt_class: int
    class_version: int
    recv_cb: MadRecvCallback
    send_cb: MadSendCallback | None = None
    methods: frozenset[int] = frozenset()
    rmpp_version: int = 0
    oui: int = 0
    recv_batch_cb: Callable[[Sequence[MadRecv]], object] | None = None
    send_cb_any_thread: bool = False
    """``send_cb`` only queues the report: a transport may call it on any thread, even
    inside ``send`` (the AL's queued agents); otherwise only on the transport's own."""

    @property
    def vendor_oui(self) -> int:
        """The OUI requests must carry to reach the agent (0: the class has none)."""
        if not VENDOR_RANGE2_FIRST <= self.mgmt_class <= VENDOR_RANGE2_LAST:
            return 0
        return self.oui or OPENIB_OUI


VENDOR_RANGE2_FIRST, VENDOR_RANGE2_LAST = 0x30, 0x4F
"""Vendor management classes whose MADs carry an OUI (IBA 13.4.4)."""
OPENIB_OUI = 0x001405
"""OpenIB's OUI: libibumad registers vendor range 2 classes under it by default."""
VENDOR_OUI = slice(37, 40)
"""Where a vendor range 2 MAD carries its OUI (after the RMPP header and a reserved byte)."""


def mad_vendor_oui(mad: bytes | bytearray) -> int:
    """The OUI a MAD is routed by: bytes 37..39 for vendor range 2 classes, else 0."""
    if not VENDOR_RANGE2_FIRST <= mad[1] <= VENDOR_RANGE2_LAST:
        return 0
    return int.from_bytes(mad[VENDOR_OUI], "big")


def is_int(value: object) -> TypeGuard[int]:
    """An int or an int subclass (``IntEnum``, ``IntFlag``), but not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------- I/O units and controllers
SVC_NAME_SIZE = 40
"""Bytes of an ``ib_svc_entry_t`` name (IBA 16.3.3.5 ServiceEntries: 40-byte names)."""
IOC_ID_STRING_SIZE = 64
"""Bytes of an IOC profile's ``id_string``."""
NODE_DESC_SIZE = 64
"""Bytes of a node description (``IB_NODE_DESCRIPTION_SIZE``)."""
MAX_SVC_ENTRIES = 0xFF


def _check_uint(owner: str, name: str, value: object, bits: int) -> None:
    if not is_int(value) or not 0 <= value < 1 << bits:
        raise InvalidParameter(f"{owner}.{name} must be an unsigned {bits}-bit int, not {value!r}")


def _check_text(owner: str, name: str, value: object, size: int) -> None:
    if not isinstance(value, str) or len(value.encode()) > size:
        raise InvalidParameter(f"{owner}.{name} must be a str of at most {size} bytes (UTF-8)")


@record(frozen=True)
class SvcEntry:
    """``ib_svc_entry_t``: one service of an I/O controller (name of at most 40 bytes, 64-bit ID).

    ``InvalidParameter`` for a longer name or an ID that is not 64 bits.
    """

    name: str
    id: int

    def __post_init__(self) -> None:
        _check_text("SvcEntry", "name", self.name, SVC_NAME_SIZE)
        _check_uint("SvcEntry", "id", self.id, 64)


_PROFILE_BITS = {
    "ioc_guid": 64, "vend_id": 24, "dev_id": 32, "dev_version": 16, "subsys_vend_id": 24,
    "subsys_id": 32, "io_class": 16, "io_subclass": 16, "protocol": 16, "protocol_ver": 16,
    "send_msg_depth": 16, "rdma_read_depth": 8, "send_msg_size": 32, "rdma_size": 32,
    "ctrl_ops_cap": 8, "num_svc_entries": 8,
}  # fmt: skip


@record(frozen=True, kw_only=True)
class IocProfile:
    """``ib_ioc_profile_t``: an I/O controller's IOControllerProfile (IBA 16.3.3.4).

    Field widths are the wire's (``vend_id`` 24 bits, ...); ``InvalidParameter``
    for a value that does not fit or an ``id_string`` over 64 bytes.
    ``num_svc_entries`` is the number of service entries the controller
    exports (the DM agent fills it from the IOC's entries).
    """

    ioc_guid: int
    vend_id: int = 0
    dev_id: int = 0
    dev_version: int = 0
    subsys_vend_id: int = 0
    subsys_id: int = 0
    io_class: int = 0
    io_subclass: int = 0
    protocol: int = 0
    protocol_ver: int = 0
    send_msg_depth: int = 0
    rdma_read_depth: int = 0
    send_msg_size: int = 0
    rdma_size: int = 0
    ctrl_ops_cap: int = 0
    num_svc_entries: int = 0
    id_string: str = ""

    def __post_init__(self) -> None:
        for name, bits in _PROFILE_BITS.items():
            _check_uint("IocProfile", name, getattr(self, name), bits)
        _check_text("IocProfile", "id_string", self.id_string, IOC_ID_STRING_SIZE)


@record(frozen=True, kw_only=True)
class IouInfo:
    """An I/O unit as ``ib_pnp_iou_rec_t`` reports it.

    ``guid`` is the IOU's (its node's) GUID, ``ca_guid`` the local CA it is
    reached through; ``desc`` is the node description (at most 64 bytes).
    """

    guid: int
    ca_guid: int = 0
    chassis_guid: int = 0
    slot: int = 0
    vend_id: int = 0
    dev_id: int = 0
    revision: int = 0
    desc: str = ""

    def __post_init__(self) -> None:
        for name, bits in (("guid", 64), ("ca_guid", 64), ("chassis_guid", 64), ("slot", 8),
                           ("vend_id", 32), ("dev_id", 16), ("revision", 32)):
            _check_uint("IouInfo", name, getattr(self, name), bits)
        _check_text("IouInfo", "desc", self.desc, NODE_DESC_SIZE)


@record(frozen=True, kw_only=True)
class IocInfo:
    """``ib_ioc_info_t`` with the service entries: an IOC, the I/O unit it sits in, its services.

    ``slot`` is the IOC's controller slot in the IOU (1-based, IBA 16.3.3.3);
    ``chassis_slot`` the IOU's slot in its chassis.
    """

    profile: IocProfile
    iou_guid: int = 0
    chassis_guid: int = 0
    chassis_slot: int = 0
    slot: int = 0
    svc_entries: tuple[SvcEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.profile, IocProfile):
            raise InvalidParameter("IocInfo.profile must be an IocProfile")
        for name, bits in (("iou_guid", 64), ("chassis_guid", 64), ("chassis_slot", 8),
                           ("slot", 16)):
            _check_uint("IocInfo", name, getattr(self, name), bits)
        if not isinstance(self.svc_entries, tuple) or not all(
                isinstance(e, SvcEntry) for e in self.svc_entries):
            raise InvalidParameter("IocInfo.svc_entries must be a tuple of SvcEntry")
        if len(self.svc_entries) > MAX_SVC_ENTRIES:
            raise InvalidParameter(f"an IOC has at most {MAX_SVC_ENTRIES} service entries")

    @property
    def ioc_guid(self) -> int:
        return self.profile.ioc_guid
