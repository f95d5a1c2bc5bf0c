"""Addresses: GIDs and their table entries, global routes, address vectors."""

from __future__ import annotations

import enum
from ipaddress import IPv6Address

from ibal.records import record

Gid = IPv6Address
"""A GID is 16 bytes in IPv6 format; ``Gid(bytes16)`` or ``Gid("fe80::1")``."""


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
