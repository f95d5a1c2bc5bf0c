"""Network interfaces and their addresses, read and watched through rtnetlink.

:func:`interfaces` dumps the links and addresses of the calling thread's
network namespace (``RTM_GETLINK`` and ``RTM_GETADDR`` on an ``AF_NETLINK``
socket, no ``ip`` command); :class:`LinkWatcher` subscribes to the link and
address groups and reports each change as a :class:`NetEvent` to callbacks,
from its own thread.  The helpers at the end turn an interface into what a
RoCE port shows: the GUID (EUI-64 of the MAC), the default GID, the GID table
in Linux rxe's order and the active MTU.

Netlink messages are host-endian C structs (``linux/netlink.h``,
``linux/rtnetlink.h``, ``linux/if_addr.h``): the layouts below name them.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import ipaddress
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from ibal.types import Gid, GidEntry, GidType, Mtu
from ibal.wire.rtnetlink import IFINFOMSG as _IFINFOMSG
from ibal.wire.rtnetlink import NLMSG_HDR as _NLMSG_HDR
from ibal.wire.rtnetlink import attrs as _attrs
from ibal.wire.rtnetlink import link_fields
from ibal.wire.rtnetlink import messages as _messages

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/if_addr.h
_IFADDRMSG: Final = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300
RTM_NEWLINK: Final = 16
RTM_DELLINK: Final = 17
_RTM_GETLINK: Final = 18
RTM_NEWADDR: Final = 20
RTM_DELADDR: Final = 21
_RTM_GETADDR: Final = 22
_IFA_ADDRESS: Final = 1
_IFA_LOCAL: Final = 2
_IFA_FLAGS: Final = 8
_RTMGRP_LINK: Final = 0x1
_RTMGRP_IPV4_IFADDR: Final = 0x10
_RTMGRP_IPV6_IFADDR: Final = 0x100
IFF_UP: Final = 0x1
IFF_LOOPBACK: Final = 0x8
IFF_RUNNING: Final = 0x40
_IFA_F_TENTATIVE: Final = 0x40
_IFA_F_DADFAILED: Final = 0x08

#: ``RXE_MAX_HDR_LENGTH``: what rxe subtracts from the netdev MTU before choosing an IB MTU.
RXE_MAX_HDR_LENGTH: Final = 80


@dataclass(frozen=True)
class Address:
    """One address of an interface."""

    ip: IpAddress
    prefixlen: int
    flags: int = 0  # IFA_F_*

    @property
    def usable(self) -> bool:
        """Not a tentative (DAD pending) or failed IPv6 address."""
        return not self.flags & (_IFA_F_TENTATIVE | _IFA_F_DADFAILED)


@dataclass(frozen=True)
class Interface:
    """A network interface as rtnetlink reports it."""

    index: int
    name: str
    mac: bytes
    mtu: int
    flags: int  # IFF_*
    addresses: tuple[Address, ...] = ()

    @property
    def running(self) -> bool:
        """Administratively up with carrier: what makes an rxe port ACTIVE."""
        return self.flags & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING

    @property
    def loopback(self) -> bool:
        return bool(self.flags & IFF_LOOPBACK)


class EventKind(enum.Enum):
    LINK = "link"  # flags, MTU or MAC may have changed (RTM_NEWLINK)
    LINK_GONE = "link_gone"  # RTM_DELLINK
    ADDR_ADDED = "addr_added"
    ADDR_REMOVED = "addr_removed"


@dataclass(frozen=True)
class NetEvent:
    """One change :class:`LinkWatcher` saw; ``interface`` is the new state for LINK."""

    kind: EventKind
    index: int
    interface: Interface | None = None
    address: Address | None = None


# ----------------------------------------------------------------- parsing


def _parse_link(buf: bytes, off: int, end: int) -> Interface | None:
    fields = link_fields(buf, off, end)
    return None if fields is None else Interface(*fields)


def _parse_addr(buf: bytes, off: int, end: int) -> tuple[int, Address] | None:
    if end - off < _IFADDRMSG.size:
        return None
    family, prefixlen, flags, _scope, index = _IFADDRMSG.unpack_from(buf, off)
    local = address = None
    for atype, val in _attrs(buf, off + _IFADDRMSG.size, end):
        if atype == _IFA_LOCAL:
            local = val
        elif atype == _IFA_ADDRESS:
            address = val
        elif atype == _IFA_FLAGS and len(val) >= 4:
            flags = struct.unpack_from("=I", val)[0]
    # IPv4 point-to-point links carry the peer in IFA_ADDRESS: ours is IFA_LOCAL
    raw = local if local is not None else address
    if raw is None or (family, len(raw)) not in ((socket.AF_INET, 4), (socket.AF_INET6, 16)):
        return None
    return index, Address(ipaddress.ip_address(raw), prefixlen, flags)


def _netlink_socket(groups: int = 0) -> socket.socket:
    s = socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
    )
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind((0, groups))
    return s


def _dump(s: socket.socket, rtm: int, seq: int) -> Iterator[tuple[int, bytes, int, int]]:
    family_only = struct.pack("=Bxxx", socket.AF_UNSPEC)
    body = family_only if rtm == _RTM_GETADDR else bytes(_IFINFOMSG.size)
    hdr = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), rtm, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
    s.send(hdr + body)
    while True:
        data = s.recv(1 << 16)
        for mtype, buf, off, end in _messages(data):
            if mtype == _NLMSG_DONE:
                return
            if mtype == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", buf, off)[0]
                if code:
                    raise OSError(code, f"rtnetlink dump: {os.strerror(code)}")
                return
            yield mtype, buf, off, end


def interfaces() -> dict[int, Interface]:
    """Every interface of the calling thread's network namespace, by index, with addresses."""
    with _netlink_socket() as s:
        links: dict[int, Interface] = {}
        for mtype, buf, off, end in _dump(s, _RTM_GETLINK, 1):
            if mtype == RTM_NEWLINK and (link := _parse_link(buf, off, end)) is not None:
                links[link.index] = link
        addrs: dict[int, list[Address]] = {}
        for mtype, buf, off, end in _dump(s, _RTM_GETADDR, 2):
            if mtype == RTM_NEWADDR and (a := _parse_addr(buf, off, end)) is not None:
                addrs.setdefault(a[0], []).append(a[1])
    return {
        i: Interface(x.index, x.name, x.mac, x.mtu, x.flags, tuple(addrs.get(i, ())))
        for i, x in links.items()
    }


def interface(name: str) -> Interface:
    """The interface called ``name``; ``KeyError`` when there is none."""
    for x in interfaces().values():
        if x.name == name:
            return x
    raise KeyError(name)


def interface_of(ip: IpAddress) -> Interface:
    """The interface holding address ``ip``; a 127/8 or ::1 address not assigned
    anywhere belongs to the loopback interface (Linux answers the whole range there).
    ``KeyError`` when no interface has it."""
    found = interfaces().values()
    for x in found:
        if any(a.ip == ip for a in x.addresses):
            return x
    if ip.is_loopback:
        for x in found:
            if x.loopback:
                return x
    raise KeyError(str(ip))


# ----------------------------------------------------------------- watcher


class LinkWatcher:
    """Reports link and address changes of one network namespace from a thread.

    Subscribes to ``RTMGRP_LINK`` and the IPv4/IPv6 address groups on a netlink
    socket opened in the constructing thread's namespace; each message becomes
    a :class:`NetEvent` passed to every callback, on the watcher's thread
    (callbacks must not block for long; they must not raise, and an exception
    is swallowed so the thread survives).  When the kernel reports that events
    were lost (``ENOBUFS``), callbacks get one ``LINK`` event per interface
    from a fresh dump, so state can always be re-derived.
    """

    def __init__(self) -> None:
        self._sock = _netlink_socket(_RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR)
        self._callbacks: list[Callable[[NetEvent], None]] = []
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="rxe-netlink", daemon=True)
        self._thread.start()

    def subscribe(self, callback: Callable[[NetEvent], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def unsubscribe(self, callback: Callable[[NetEvent], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def close(self) -> None:
        """Stop the thread and close the socket (idempotent)."""
        if self._stop_w < 0:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(5)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        self._stop_w = -1
        self._sock.close()

    def _emit(self, ev: NetEvent) -> None:
        with self._lock:
            cbs = list(self._callbacks)
        for cb in cbs:
            # a subscriber's bug must not stop the watcher
            with contextlib.suppress(Exception):
                cb(ev)

    def _resync(self) -> None:
        # a thread starts in its creator's namespace, so this dumps the watched one
        for x in interfaces().values():
            self._emit(NetEvent(EventKind.LINK, x.index, x))

    def _run(self) -> None:
        fd = self._sock.fileno()
        while True:
            r, _, _ = select.select([fd, self._stop_r], [], [])
            if self._stop_r in r:
                return
            try:
                data = self._sock.recv(1 << 16)
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self._resync()
                continue
            for mtype, buf, off, end in _messages(data):
                self._dispatch(mtype, buf, off, end)

    def _dispatch(self, mtype: int, buf: bytes, off: int, end: int) -> None:
        if mtype in (RTM_NEWLINK, RTM_DELLINK):
            link = _parse_link(buf, off, end)
            if link is not None:
                kind = EventKind.LINK if mtype == RTM_NEWLINK else EventKind.LINK_GONE
                self._emit(NetEvent(kind, link.index, link))
        elif mtype in (RTM_NEWADDR, RTM_DELADDR):
            a = _parse_addr(buf, off, end)
            if a is not None:
                kind = EventKind.ADDR_ADDED if mtype == RTM_NEWADDR else EventKind.ADDR_REMOVED
                self._emit(NetEvent(kind, a[0], address=a[1]))


# ----------------------------------------------------------------- RoCE views


def eui64(mac: bytes) -> bytes:
    """The modified EUI-64 of a 6-byte MAC (U/L bit flipped, ff:fe in the middle).

    Kernel rxe's node and port GUID and the interface identifier of its default
    GID; lo's all-zero MAC gives 02:00:00:ff:fe:00:00:00 (seen on kernel rxe).
    """
    m = (mac + bytes(6))[:6]
    return bytes((m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]))


def guid(mac: bytes) -> int:
    """Node and port GUID of an rxe device on an interface with this MAC."""
    return int.from_bytes(eui64(mac), "big")


def default_gid(mac: bytes) -> Gid:
    """GID index 0: the link-local ``fe80::/64`` address with the MAC's EUI-64."""
    return Gid(b"\xfe\x80" + bytes(6) + eui64(mac))


def ip_gid(ip: IpAddress) -> Gid:
    """The GID of an address: IPv4 mapped (``::ffff:a.b.c.d``) or the IPv6 address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return Gid(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return Gid(ip.packed)


def gid_ip(gid: Gid) -> IpAddress:
    """The address a RoCE v2 GID stands for (the inverse of :func:`ip_gid`)."""
    return gid.ipv4_mapped or gid


def gid_table(
    iface: Interface, only: IpAddress | None = None
) -> tuple[GidEntry, ...]:  # fmt: skip
    """The RoCE v2 GID table of a device on ``iface`` in Linux's order.

    Index 0 the default GID from the MAC, then the IPv4 addresses (mapped) in
    the interface's order, then the IPv6 ones; an address equal to an entry
    already present (the link-local one usually equals the default GID) is not
    repeated, tentative IPv6 addresses are left out.  With ``only`` (a device
    bound to one address) the table is the default GID and that address.
    """
    gids = [default_gid(iface.mac)]
    addrs = [a.ip for a in iface.addresses if a.usable]
    if only is not None:
        addrs = [only]
    for ip in sorted(addrs, key=lambda ip: ip.version):  # stable: IPv4 first
        g = ip_gid(ip)
        if g not in gids:
            gids.append(g)
    return tuple(GidEntry(i, g, GidType.ROCE_V2, iface.name) for i, g in enumerate(gids))


def active_mtu(netdev_mtu: int) -> Mtu:
    """The largest IB MTU that fits the netdev MTU less rxe's header allowance (256..4096).

    Kernel rxe: a 1500-byte netdev gives 1024, lo's 65536 gives 4096.  A netdev
    too small for 256 still reports 256 (rxe's floor).
    """
    room = netdev_mtu - RXE_MAX_HDR_LENGTH
    for m in reversed(Mtu):
        if m.bytes <= room:
            return m
    return Mtu.MTU_256
