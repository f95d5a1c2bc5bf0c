"""rtnetlink message walking and the link body, which the rxe provider and ``ibal.sa.roce`` share.

Each keeps its own requests and record types; this is only the codec they share
(``linux/netlink.h``, ``linux/rtnetlink.h``, ``linux/if_link.h``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

NLMSG_HDR: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid
IFINFOMSG: Final = struct.Struct("=BxHiII")  # family, type, index, flags, change
RTATTR: Final = struct.Struct("=HH")  # len, type
IFLA_ADDRESS: Final = 1
IFLA_IFNAME: Final = 3
IFLA_MTU: Final = 4


def attrs(buf: bytes, off: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(type, value) of each rtattr in ``buf[off:end]``; stops at a malformed one."""
    while off + 4 <= end:
        alen, atype = RTATTR.unpack_from(buf, off)
        if alen < 4 or off + alen > end:
            return
        yield atype & 0x3FFF, buf[off + 4 : off + alen]
        off += (alen + 3) & ~3


def messages(buf: bytes) -> Iterator[tuple[int, bytes, int, int]]:
    """(type, whole message, body offset, end) for each netlink message in ``buf``."""
    off = 0
    while off + NLMSG_HDR.size <= len(buf):
        mlen, mtype, _flags, _seq, _pid = NLMSG_HDR.unpack_from(buf, off)
        if mlen < NLMSG_HDR.size or off + mlen > len(buf):
            return
        yield mtype, buf, off + NLMSG_HDR.size, off + mlen
        off += (mlen + 3) & ~3


def link_fields(buf: bytes, off: int, end: int) -> tuple[int, str, bytes, int, int] | None:
    """A ``RTM_NEWLINK`` body as (index, name, MAC, MTU, flags); ``None`` when cut short."""
    if end - off < IFINFOMSG.size:
        return None
    _fam, _type, index, flags, _change = IFINFOMSG.unpack_from(buf, off)
    name, mac, mtu = "", b"", 0
    for atype, val in attrs(buf, off + IFINFOMSG.size, end):
        if atype == IFLA_IFNAME:
            name = val.rstrip(b"\0").decode(errors="replace")
        elif atype == IFLA_ADDRESS:
            mac = val
        elif atype == IFLA_MTU and len(val) >= 4:
            mtu = struct.unpack_from("=I", val)[0]
    return index, name, mac, mtu, flags
