"""The IP stack as RoCE path resolution reads it: routes, links, neighbours (rtnetlink).

The I/O half of :mod:`ibal.sa.roce`: :class:`NetlinkIpStack` asks the kernel
the three questions Linux's ``ib_addr`` asks before a RoCE path exists (the
route to the destination, the outgoing device, the next hop's MAC) and
provokes neighbour resolution when the MAC is not known yet.  Everything is a
plain ``AF_NETLINK`` request (no ``ip`` command, no privileges); the probe is
an empty UDP datagram to the discard port, which makes the kernel send
ARP/ND for the next hop as ``neigh_event_send`` does for rdma_cm.

Sockets are opened in the constructing thread's network namespace and keep
it, so a stack made inside a namespace answers for that namespace from any
thread.  Netlink messages are host-endian C structs (``linux/rtnetlink.h``,
``linux/neighbour.h``): the layouts below name them.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Final, Protocol

from ibal.wire.rtnetlink import IFINFOMSG as _IFINFOMSG
from ibal.wire.rtnetlink import IFLA_IFNAME as _IFLA_IFNAME
from ibal.wire.rtnetlink import NLMSG_HDR as _NLMSG_HDR
from ibal.wire.rtnetlink import RTATTR as _RTATTR
from ibal.wire.rtnetlink import attrs as _attrs
from ibal.wire.rtnetlink import link_fields

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_RTMSG: Final = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table,
#                                              protocol, scope, type, flags
_NDMSG: Final = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300
_RTM_NEWLINK: Final = 16
_RTM_GETLINK: Final = 18
_RTM_NEWROUTE: Final = 24
_RTM_GETROUTE: Final = 26
_RTM_NEWNEIGH: Final = 28
_RTM_GETNEIGH: Final = 30
_RTA_DST: Final = 1
_RTA_SRC: Final = 2
_RTA_OIF: Final = 4
_RTA_GATEWAY: Final = 5
_RTA_PREFSRC: Final = 7
_RTA_METRICS: Final = 8
_RTAX_MTU: Final = 2
_RTAX_HOPLIMIT: Final = 10
_NDA_DST: Final = 1
_NDA_LLADDR: Final = 2
RTN_UNICAST: Final = 1
RTN_LOCAL: Final = 2
IFF_LOOPBACK: Final = 0x8
IFF_NOARP: Final = 0x80

#: The neighbour states (``NUD_*``) in which the kernel uses the entry's MAC.
NUD_VALID: Final = 0x80 | 0x40 | 0x02 | 0x10 | 0x04 | 0x08  # PERMANENT NOARP REACHABLE PROBE
#                                                              STALE DELAY
NUD_FAILED: Final = 0x20
_DISCARD_PORT: Final = 9


class RouteError(OSError):
    """The kernel has no usable route (``errno``: ENETUNREACH, EHOSTUNREACH, EINVAL...)."""


@dataclass(frozen=True)
class Route:
    """What ``ip route get DST from SRC`` answers."""

    dst: IpAddress
    ifindex: int
    kind: int = RTN_UNICAST  # RTN_*: LOCAL when DST is an address of this host
    src: IpAddress | None = None  # the preferred source
    gateway: IpAddress | None = None
    mtu: int = 0  # the route's (or the cached path) MTU metric; 0: none
    hop_limit: int = 0  # the route's hop limit metric; 0: the default

    @property
    def local(self) -> bool:
        return self.kind == RTN_LOCAL

    @property
    def next_hop(self) -> IpAddress:
        """Whose MAC the frames carry: the gateway, else the destination."""
        return self.gateway if self.gateway is not None else self.dst


@dataclass(frozen=True)
class Link:
    """One interface: what path resolution needs of it."""

    index: int
    name: str
    mac: bytes
    mtu: int
    flags: int = 0  # IFF_*

    @property
    def loopback(self) -> bool:
        return bool(self.flags & IFF_LOOPBACK)

    @property
    def noarp(self) -> bool:
        return bool(self.flags & IFF_NOARP)


@dataclass(frozen=True)
class Neighbour:
    """One neighbour table entry (``ip neigh``)."""

    ip: IpAddress
    ifindex: int
    state: int  # NUD_*
    mac: bytes = b""

    @property
    def valid(self) -> bool:
        """The kernel would use this MAC (``NUD_VALID``), as ib_addr's ``dst_fetch_ha`` asks."""
        return bool(self.state & NUD_VALID) and len(self.mac) == 6


class IpStack(Protocol):
    """What :mod:`ibal.sa.roce` asks of the IP stack; tests feed tables instead.

    Called on the access layer's callback thread: each call must be quick
    (one netlink round trip) and never wait for the network.
    """

    def route(self, dst: IpAddress, src: IpAddress | None, oif: int = 0) -> Route:
        """The route from ``src`` to ``dst`` (out of interface ``oif`` when not 0);
        raises :class:`RouteError`."""
        ...

    def link(self, key: int | str) -> Link:
        """The interface with index or name ``key``; raises ``KeyError`` when there is none."""
        ...

    def neighbour(self, ip: IpAddress, ifindex: int) -> Neighbour | None:
        """The entry for ``ip`` on ``ifindex``, ``None`` when there is none."""
        ...

    def probe(self, ip: IpAddress, src: IpAddress | None, ifindex: int) -> None:
        """Make the kernel resolve ``ip``'s MAC (ARP/ND); returns at once."""
        ...

    def default_hop_limit(self, version: int, ifname: str) -> int:
        """The TTL/hop limit the kernel puts on a route without a hop limit metric."""
        ...


# ----------------------------------------------------------------- parsing


def _attr(atype: int, value: bytes) -> bytes:
    body = _RTATTR.pack(4 + len(value), atype) + value
    return body + bytes(-len(body) % 4)


def _ip(raw: bytes) -> IpAddress | None:
    return ipaddress.ip_address(raw) if len(raw) in (4, 16) else None


def parse_route(buf: bytes, off: int, end: int) -> Route | None:
    """A ``RTM_NEWROUTE`` body (from ``off`` to ``end``) as a :class:`Route`."""
    if end - off < _RTMSG.size:
        return None
    rtm_type = _RTMSG.unpack_from(buf, off)[7]
    dst = src = gw = None
    oif = mtu = hops = 0
    for atype, val in _attrs(buf, off + _RTMSG.size, end):
        if atype == _RTA_DST:
            dst = _ip(val)
        elif atype == _RTA_PREFSRC:
            src = _ip(val)
        elif atype == _RTA_GATEWAY:
            gw = _ip(val)
        elif atype == _RTA_OIF and len(val) >= 4:
            oif = struct.unpack_from("=i", val)[0]
        elif atype == _RTA_METRICS:
            for mtype, mval in _attrs(val, 0, len(val)):
                if mtype == _RTAX_MTU and len(mval) >= 4:
                    mtu = struct.unpack_from("=I", mval)[0]
                elif mtype == _RTAX_HOPLIMIT and len(mval) >= 4:
                    hops = struct.unpack_from("=I", mval)[0]
    if dst is None:
        return None
    return Route(dst, oif, rtm_type, src, gw, mtu, hops)


def parse_link(buf: bytes, off: int, end: int) -> Link | None:
    """A ``RTM_NEWLINK`` body as a :class:`Link`."""
    fields = link_fields(buf, off, end)
    return None if fields is None else Link(*fields)


def parse_neighbour(buf: bytes, off: int, end: int) -> Neighbour | None:
    """A ``RTM_NEWNEIGH`` body as a :class:`Neighbour`."""
    if end - off < _NDMSG.size:
        return None
    _fam, ifindex, state, _flags, _type = _NDMSG.unpack_from(buf, off)
    ip, mac = None, b""
    for atype, val in _attrs(buf, off + _NDMSG.size, end):
        if atype == _NDA_DST:
            ip = _ip(val)
        elif atype == _NDA_LLADDR:
            mac = val
    return None if ip is None else Neighbour(ip, ifindex, state, mac)


# ----------------------------------------------------------------- the stack


class NetlinkIpStack:
    """:class:`IpStack` over rtnetlink, in the constructing thread's network namespace.

    Thread-safe (one request at a time on the socket).  :meth:`close` releases
    the sockets.
    """

    def __init__(self) -> None:
        self._nl = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        )
        self._nl.bind((0, 0))
        self._udp = {
            4: socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
            6: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC),
        }
        for s in self._udp.values():
            s.setblocking(False)
        self._lock = threading.Lock()
        self._seq = 0
        # /proc/sys/net is the opener's namespace: read the defaults now, in ours
        self._ttl4 = _read_int("/proc/sys/net/ipv4/ip_default_ttl", 64)
        conf = "/proc/sys/net/ipv6/conf"
        names = os.listdir(conf) if os.path.isdir(conf) else []
        self._hop6 = {n: _read_int(f"{conf}/{n}/hop_limit", 64) for n in names}

    def close(self) -> None:
        self._nl.close()
        for s in self._udp.values():
            s.close()

    def __enter__(self) -> NetlinkIpStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, mtype: int, flags: int, body: bytes) -> list[tuple[int, bytes, int, int]]:
        """Send one request; every answer message ``(type, buf, body offset, end)``."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            hdr = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), mtype, flags, seq, 0)
            self._nl.send(hdr + body)
            out: list[tuple[int, bytes, int, int]] = []
            while True:
                data = self._nl.recv(1 << 16)
                off = 0
                while off + _NLMSG_HDR.size <= len(data):
                    mlen, t, _f, mseq, _pid = _NLMSG_HDR.unpack_from(data, off)
                    if mlen < _NLMSG_HDR.size or off + mlen > len(data):
                        break
                    body_off, end = off + _NLMSG_HDR.size, off + mlen
                    off += (mlen + 3) & ~3
                    if mseq != seq:
                        continue  # a late answer to an earlier request
                    if t == _NLMSG_DONE:
                        return out
                    if t == _NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, body_off)[0]
                        if code:
                            raise RouteError(code, os.strerror(code))
                        return out
                    out.append((t, data, body_off, end))
                if not flags & _NLM_F_DUMP and out:
                    return out

    def route(self, dst: IpAddress, src: IpAddress | None, oif: int = 0) -> Route:
        fam = socket.AF_INET if dst.version == 4 else socket.AF_INET6
        bits = 32 if dst.version == 4 else 128
        attrs = _attr(_RTA_DST, dst.packed)
        if src is not None:
            if src.version != dst.version:
                raise RouteError(errno.EINVAL, "source and destination of different families")
            attrs += _attr(_RTA_SRC, src.packed)
        if oif:
            attrs += _attr(_RTA_OIF, struct.pack("=i", oif))
        body = _RTMSG.pack(fam, bits, bits if src is not None else 0, 0, 0, 0, 0, 0, 0) + attrs
        for t, buf, off, end in self._request(_RTM_GETROUTE, _NLM_F_REQUEST, body):
            if t == _RTM_NEWROUTE and (r := parse_route(buf, off, end)) is not None:
                return r
        raise RouteError(errno.ENETUNREACH, f"no route to {dst}")

    def link(self, key: int | str) -> Link:
        if isinstance(key, str):
            name = key.encode() + b"\0"
            body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(_IFLA_IFNAME, name)
        else:
            body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, key, 0, 0)
        try:
            answers = self._request(_RTM_GETLINK, _NLM_F_REQUEST, body)
        except RouteError as e:
            raise KeyError(key) from e
        for t, buf, off, end in answers:
            if t == _RTM_NEWLINK and (x := parse_link(buf, off, end)) is not None:
                return x
        raise KeyError(key)

    def neighbour(self, ip: IpAddress, ifindex: int) -> Neighbour | None:
        fam = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        body = _NDMSG.pack(fam, ifindex, 0, 0, 0)
        for t, buf, off, end in self._request(_RTM_GETNEIGH, _NLM_F_REQUEST | _NLM_F_DUMP, body):
            n = parse_neighbour(buf, off, end) if t == _RTM_NEWNEIGH else None
            if n is not None and n.ip == ip and n.ifindex == ifindex:
                return n
        return None

    def probe(self, ip: IpAddress, src: IpAddress | None, ifindex: int) -> None:
        s = self._udp[ip.version]
        addr: tuple[str, int] | tuple[str, int, int, int]
        if ip.version == 6:
            scope = ifindex if ip.is_link_local else 0
            addr = (str(ip), _DISCARD_PORT, 0, scope)
        else:
            addr = (str(ip), _DISCARD_PORT)
        # the datagram waits in the neighbour's queue, losing it is fine; EAGAIN or
        # EHOSTUNREACH (an earlier probe failed) are retried by the next probe
        with contextlib.suppress(OSError):
            s.sendto(b"", addr)

    def default_hop_limit(self, version: int, ifname: str) -> int:
        if version == 4:
            return self._ttl4
        # an interface made after the stack: the namespace-wide default
        return self._hop6.get(ifname, self._hop6.get("default", 64))


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


class LazyIpStack:
    """A :class:`NetlinkIpStack` made by the first call, in that thread's namespace.

    The SA port's resolver uses one: its first question is asked on the AL's
    callback thread, which runs in the network namespace the AL's manager was
    made in (where the providers found their devices), whatever thread made
    the request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stack: NetlinkIpStack | None = None
        self._closed = False

    def _get(self) -> NetlinkIpStack:
        with self._lock:
            if self._closed:
                raise RouteError(errno.EBADF, "the IP stack is closed")
            if self._stack is None:
                self._stack = NetlinkIpStack()
            return self._stack

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._stack is not None:
                self._stack.close()

    def route(self, dst: IpAddress, src: IpAddress | None, oif: int = 0) -> Route:
        return self._get().route(dst, src, oif)

    def link(self, key: int | str) -> Link:
        return self._get().link(key)

    def neighbour(self, ip: IpAddress, ifindex: int) -> Neighbour | None:
        return self._get().neighbour(ip, ifindex)

    def probe(self, ip: IpAddress, src: IpAddress | None, ifindex: int) -> None:
        self._get().probe(ip, src, ifindex)

    def default_hop_limit(self, version: int, ifname: str) -> int:
        return self._get().default_hop_limit(version, ifname)
