"""What Linux's RDMA CM (``rdma_cm``/librdmacm) adds to the IB CM: IP port spaces and a header.

An ``rdma_cm`` endpoint is named by an IP address and a port in a port space
(TCP for RC, UDP for UD, IB, IPoIB).  On the wire it is still the IB CM: the
service ID is ``(port space << 16) + port`` (``RDMA_IB_IP_PS_*``), and the first
36 bytes of a REQ's or SIDR_REQ's private data carry the "CMA header"
(``struct cma_hdr``, ``drivers/infiniband/core/cma.c``): version 0, the IP
version in the top nibble of byte 1, the active side's **source** port, then
the source and destination addresses as 16-byte fields (an IPv4 address in the
last 4 bytes after 12 zero bytes; not IPv4-mapped).  A passive ``rdma_cm``
refuses a REQ whose header has another version or IP version, and takes the
listener's port from the service ID.  The user's private data follows the
header, so a REQ leaves it 92 - 36 = 56 bytes and a SIDR_REQ 216 - 36 = 180.

Pure: tables, numbers and conversions; :mod:`ibal.cm.rdma` sends them.
"""

from __future__ import annotations

import enum
import ipaddress
import random
from dataclasses import dataclass
from typing import Final

from ibal.status import InvalidParameter
from ibal.types import Gid
from ibal.wire.fields import F, FieldError, Kind, R, Table
from ibal.wire.mad.consts import CmAttr

__all__ = [
    "CMA_HDR_IP4", "CMA_HDR_IP6", "CMA_HDR_SIZE", "CMA_VERSION", "RDMA_UDP_QKEY",
    "SERVICE_ID_MASK", "USER_PDATA_MAX", "CmaHeader", "IpAddress", "PortSpace",
    "ephemeral_port", "gid_of", "ip_address", "ip_of", "join_private_data", "port_of",
    "port_space_of", "service_id", "split_private_data",
]  # fmt: skip

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PortSpace(enum.IntEnum):
    """``enum rdma_ucm_port_space`` (``rdma/rdma_user_cm.h``)."""

    IPOIB = 0x0002
    TCP = 0x0106
    UDP = 0x0111
    IB = 0x013F


#: The bits of a service ID that name the port space; the low 16 are the port.
SERVICE_ID_MASK: Final = 0xFFFF_FFFF_FFFF_0000
#: ``RDMA_UDP_QKEY``: the Q_Key of rdma_cm's UD QPs and multicast groups.
RDMA_UDP_QKEY: Final = 0x01234567
#: ``CMA_VERSION``: the only header version a Linux passive side accepts.
CMA_VERSION: Final = 0x00
CMA_HDR_SIZE: Final = 36


def service_id(ps: PortSpace | int, port: int) -> int:
    """The IB service ID of ``port`` in port space ``ps`` (``rdma_get_service_id``)."""
    ps = PortSpace(ps)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} is not a 16-bit port number")
    return (int(ps) << 16) + port


def port_space_of(sid: int) -> PortSpace | None:
    """The port space of an IP service ID, ``None`` for any other service ID."""
    if sid >> 32:
        return None
    try:
        return PortSpace(sid >> 16)
    except ValueError:
        return None


def port_of(sid: int) -> int:
    """The port of an IP service ID (``cma_port_from_service_id``)."""
    return sid & 0xFFFF


# One table per IP version: the union of ``struct cma_hdr`` as two layouts, so the
# dump prints the addresses the way the header means them.
CMA_HDR_IP4 = Table("RDMA CM header (IPv4)", [
    F("cma_version", 8, hex=True),
    F("ip_version", 4),
    R(4),
    F("src_port", 16),
    R(96, name="src_pad"),
    F("src_addr", 32, kind=Kind.IPV4),
    R(96, name="dst_pad"),
    F("dst_addr", 32, kind=Kind.IPV4),
], size=CMA_HDR_SIZE)  # fmt: skip

CMA_HDR_IP6 = Table("RDMA CM header (IPv6)", [
    F("cma_version", 8, hex=True),
    F("ip_version", 4),
    R(4),
    F("src_port", 16),
    F("src_addr", 128, kind=Kind.IPV6),
    F("dst_addr", 128, kind=Kind.IPV6),
], size=CMA_HDR_SIZE)  # fmt: skip

_TABLES: Final = {4: CMA_HDR_IP4, 6: CMA_HDR_IP6}

#: Private data left to the user after the header, per message that carries one.
USER_PDATA_MAX: Final = {CmAttr.REQ: 92 - CMA_HDR_SIZE, CmAttr.SIDR_REQ: 216 - CMA_HDR_SIZE}


@dataclass(frozen=True, slots=True)
class CmaHeader:
    """The header's meaning: who connects (``src``:``src_port``) to which address."""

    src: IpAddress
    dst: IpAddress
    src_port: int

    def __post_init__(self) -> None:
        if self.src.version != self.dst.version:
            raise ValueError(f"{self.src} and {self.dst} are of different IP versions")
        if not 0 <= self.src_port <= 0xFFFF:
            raise ValueError(f"source port {self.src_port} is not a 16-bit port number")

    @property
    def version(self) -> int:
        return self.src.version

    def encode(self) -> bytes:
        """The 36 header bytes (``cma_format_hdr``)."""
        return _TABLES[self.version].encode(
            cma_version=CMA_VERSION, ip_version=self.version, src_port=self.src_port,
            src_addr=self.src.packed, dst_addr=self.dst.packed,
        )  # fmt: skip

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> CmaHeader:
        """From the start of a REQ's private data; ``FieldError`` when Linux would refuse it.

        Like ``cma_save_ip_info``: the version must be 0 and the IP version 4 or 6;
        the reserved nibble and an IPv4 field's 12 leading bytes are not looked at.
        """
        if len(data) < CMA_HDR_SIZE:
            raise FieldError(
                "short", f"RDMA CM header: need {CMA_HDR_SIZE} bytes, have {len(data)}"
            )
        if data[0] != CMA_VERSION:
            raise FieldError("range", f"RDMA CM header version {data[0]:#04x}, not 0",
                             "cma_version")  # fmt: skip
        table = _TABLES.get(data[1] >> 4)
        if table is None:
            raise FieldError("range", f"RDMA CM header IP version {data[1] >> 4} is not 4 or 6",
                             "ip_version")  # fmt: skip
        v = table.decode(data)
        src, dst = (ipaddress.ip_address(bytes(v[n])) for n in ("src_addr", "dst_addr"))
        port = v["src_port"]
        assert isinstance(port, int)
        return cls(src, dst, port)

    def dump(self) -> str:
        """Field by field, as :meth:`ibal.wire.fields.Table.dump` prints."""
        return _TABLES[self.version].dump(self.encode())


def join_private_data(hdr: CmaHeader, user: bytes = b"", attr: CmAttr = CmAttr.REQ) -> bytes:
    """The private data of a REQ/SIDR_REQ from ``rdma_connect``: header, then the user's."""
    room = USER_PDATA_MAX[attr]
    if len(user) > room:
        raise ValueError(
            f"RDMA CM {attr.name} private data is at most {room} bytes after the header, "
            f"got {len(user)}"
        )
    return hdr.encode() + bytes(user)


def split_private_data(pdata: bytes | bytearray | memoryview) -> tuple[CmaHeader, bytes]:
    """A received REQ/SIDR_REQ's private data: the header and what follows it."""
    return CmaHeader.decode(pdata), bytes(pdata[CMA_HDR_SIZE:])


def ip_address(v: IpAddress | str) -> IpAddress:
    """An IP address from its text (or as given); ``InvalidParameter`` for anything else."""
    try:
        return ipaddress.ip_address(v) if isinstance(v, str) else v
    except ValueError:
        raise InvalidParameter(f"{v!r} is not an IP address") from None


def gid_of(ip: IpAddress | str) -> Gid:
    """The RoCE v2 GID of an address: IPv4-mapped for IPv4 (GIDs are; headers are not)."""
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if addr.version == 4:
        return Gid(f"::ffff:{addr}")
    return Gid(addr.packed)


def ip_of(gid: Gid) -> IpAddress:
    """The address of a RoCE v2 GID (the inverse of :func:`gid_of`)."""
    return gid.ipv4_mapped or gid


#: Linux's default ``net.ipv4.ip_local_port_range``, where rdma_cm picks a bound port.
EPHEMERAL_PORTS: Final = range(32768, 61000)


def ephemeral_port(rng: random.Random | None = None) -> int:
    """A source port for an active side that did not bind one (``cma_alloc_any_port``)."""
    return (rng or random).choice(EPHEMERAL_PORTS)
