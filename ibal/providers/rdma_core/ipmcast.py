"""IP-level multicast membership for RoCE groups.

On RoCE a multicast GID is an IP multicast address (IPv6, or IPv4-mapped for
RoCE v2 over IPv4).  ``ibv_attach_mcast`` only programs the device (rxe adds a
MAC filter); the IP stack still drops the group's datagrams unless the netdev
is a member of the group.  rdma_cm makes that membership itself (the kernel's
``cma_iboe_join_multicast`` sends the IGMP/MLD join); a verbs-only program has
to, so the provider joins through a UDP socket bound to the GID's netdev for
as long as some QP of the CA is attached.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

_V4_MAPPED = bytes(10) + b"\xff\xff"


def _is_v4(gid: bytes) -> bool:
    return gid[:12] == _V4_MAPPED


class IpMemberships:
    """Reference-counted group memberships, one socket per (netdev, group)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[int, bytes], tuple[socket.socket, int]] = {}

    def join(self, ifindex: int, gid: bytes) -> str | None:
        """Join ``gid`` on ``ifindex``; the reason when the stack refused, else None."""
        key = (ifindex, gid)
        with self._lock:
            held = self._groups.get(key)
            if held is not None:
                self._groups[key] = (held[0], held[1] + 1)
                return None
            try:
                if _is_v4(gid):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    mreqn = struct.pack("4s4si", gid[12:], bytes(4), ifindex)
                    try:
                        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn)
                    except OSError:
                        sock.close()
                        raise
                else:
                    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                    mreq = struct.pack("16sI", gid, ifindex)
                    try:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
                    except OSError:
                        sock.close()
                        raise
            except OSError as exc:
                return f"IP join of the group on ifindex {ifindex} failed: {exc}"
            self._groups[key] = (sock, 1)
            return None

    def leave(self, ifindex: int, gid: bytes) -> None:
        key = (ifindex, gid)
        with self._lock:
            held = self._groups.get(key)
            if held is None:
                return
            if held[1] > 1:
                self._groups[key] = (held[0], held[1] - 1)
                return
            del self._groups[key]
            with contextlib.suppress(OSError):
                held[0].close()

    def close(self) -> None:
        with self._lock:
            for sock, _ in self._groups.values():
                with contextlib.suppress(OSError):
                    sock.close()
            self._groups.clear()
