"""CA and port attributes: what ``query_ca`` reports and ``modify_ca`` changes, vendor calls."""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any

from ibal.memo import derived
from ibal.records import record
from ibal.types.address import ZERO_GID, Gid, GidEntry, GidType
from ibal.types.base import DEFAULT_PKEY


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


class AtomicCap(enum.IntEnum):
    """How far atomics are atomic (IBA: none, this HCA only, global)."""

    NONE = 0
    LOCAL = 1
    GLOBAL = 2


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


@record
class CiOp:
    """`ib_ci_op_t`: a vendor command and its data, with the vendor's status."""

    command: int
    data: bytes = b""
    status: int = 0
    out: bytes = b""
    extra: dict[str, Any] = field(default_factory=dict)
