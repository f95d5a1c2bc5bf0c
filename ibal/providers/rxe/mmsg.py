"""Batched datagram system calls through ctypes: ``recvmmsg`` and ``sendmmsg``.

Python's socket module has neither.  :class:`RecvRing` owns preallocated
buffers, addresses and control areas for up to ``depth`` datagrams and fills
them with one ``recvmmsg``; :class:`SendBatch` gathers up to ``depth``
datagrams (each a few buffers, no copy) and sends them with one ``sendmmsg``.
Both keep every buffer they point to alive until the call returns.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct
from collections.abc import Sequence
from typing import Final

from ibal.wire.fields import Buffer

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)

SOL_UDP: Final = 17
UDP_NO_CHECK6_RX: Final = 102
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104
SO_ATTACH_FILTER: Final = 26
MSG_TRUNC: Final = 0x20
MSG_CTRUNC: Final = 0x08
MSG_DONTWAIT: Final = 0x40
MSG_WAITFORONE: Final = 0x10000
_SOCKADDR_LEN: Final = 28  # sockaddr_in6, the larger of the two
_CONTROL_LEN: Final = 64
_BUSY_RETRIES: Final = 1000


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(IoVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int


def _address(buf: ctypes.Array[ctypes.c_char], n: int) -> tuple[bytes, int]:
    """(raw IP address, port) from a sockaddr_in or sockaddr_in6."""
    raw = buf.raw
    family = struct.unpack_from("=H", raw)[0]
    port = struct.unpack_from(">H", raw, 2)[0]
    if family == socket.AF_INET:
        return raw[4:8], port
    if family == socket.AF_INET6 and n >= 24:
        return raw[8:24], port
    return b"", port


def sockaddr(ip: bytes, port: int) -> bytes:
    """A sockaddr_in (4-byte ``ip``) or sockaddr_in6 (16 bytes) as bytes."""
    if len(ip) == 4:
        return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + ip + bytes(8)
    return struct.pack("=H", socket.AF_INET6) + struct.pack(">HI", port, 0) + ip + bytes(4)


class RecvRing:
    """Buffers for ``depth`` datagrams of up to ``size`` bytes and one ``recvmmsg`` over them."""

    def __init__(self, depth: int, size: int) -> None:
        self.depth = depth
        self.size = size
        self.arena = bytearray(depth * size)
        self.view = memoryview(self.arena)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.arena))
        self._iov = (IoVec * depth)()
        self._names = [ctypes.create_string_buffer(_SOCKADDR_LEN) for _ in range(depth)]
        self._controls = [ctypes.create_string_buffer(_CONTROL_LEN) for _ in range(depth)]
        self._msgs = (MMsgHdr * depth)()
        self._base = ctypes.addressof(self._msgs)
        for i in range(depth):
            self._iov[i].base = base + i * size
            self._iov[i].len = size
            h = self._msgs[i].hdr
            h.name = ctypes.addressof(self._names[i])
            h.iov = ctypes.pointer(self._iov[i])
            h.iovlen = 1
            h.control = ctypes.addressof(self._controls[i])

    def recv(self, fd: int, *, block: bool = False) -> int:
        """Fill up to ``depth`` slots; the count, 0 when nothing is waiting (or EINTR).

        ``block``: wait for the first datagram (``MSG_WAITFORONE``), else return at once.
        """
        for i in range(self.depth):
            h = self._msgs[i].hdr
            h.namelen = _SOCKADDR_LEN
            h.controllen = _CONTROL_LEN
            h.flags = 0
        flags = MSG_WAITFORONE if block else MSG_DONTWAIT
        n = _recvmmsg(fd, self._base, self.depth, flags, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, f"recvmmsg: {os.strerror(err)}")
        return int(n)

    def datagram(self, i: int) -> memoryview:
        """The bytes of slot ``i`` (a view into the ring: valid until the next :meth:`recv`)."""
        off = i * self.size
        return self.view[off : off + self._msgs[i].len]

    def truncated(self, i: int) -> bool:
        return bool(self._msgs[i].hdr.flags & MSG_TRUNC)

    def source(self, i: int) -> tuple[bytes, int]:
        """(raw IP address, port) the datagram in slot ``i`` came from."""
        return _address(self._names[i], self._msgs[i].hdr.namelen)

    def gro_size(self, i: int) -> int:
        """The segment size of a GRO-coalesced slot (``UDP_GRO`` control message), else 0."""
        h = self._msgs[i].hdr
        if h.controllen < 16:
            return 0
        raw = self._controls[i].raw
        off = 0
        while off + 16 <= h.controllen:
            clen, level, ctype = struct.unpack_from("=QiI", raw, off)
            if clen < 16:
                return 0
            if level == SOL_UDP and ctype == UDP_GRO:
                return int(struct.unpack_from("=H" if clen < 20 else "=i", raw, off + 16)[0])
            off += (clen + 7) & ~7
        return 0


class SendBatch:
    """Up to ``depth`` datagrams of up to ``slot`` bytes each, sent with one ``sendmmsg``.

    :meth:`add` copies a datagram's parts into the batch's own arena (one
    ``memcpy`` per part, cheaper from Python than pinning each caller buffer
    through ctypes) and updates the prebuilt ``mmsghdr``/``iovec`` arrays with
    ``struct.pack_into``; a datagram larger than ``slot`` goes in its own
    buffer (GSO trains).
    """

    def __init__(self, depth: int = 64, slot: int = 4608) -> None:
        self.depth = depth
        self.slot = slot
        self.count = 0
        self.arena = bytearray(depth * slot)
        self._arena_addr = ctypes.addressof(ctypes.c_char.from_buffer(self.arena))
        self._iov = bytearray(depth * _IOV.size)
        self._iov_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._iov))
        self._names = bytearray(depth * _SOCKADDR_LEN)
        self._names_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._names))
        self._controls = bytearray(depth * 24)
        self._controls_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._controls))
        self._msgs = bytearray(depth * _MMSG.size)
        self._msgs_addr = ctypes.addressof(ctypes.c_char.from_buffer(self._msgs))
        self._big: dict[int, object] = {}  # slot -> an oversized datagram's own buffer
        for i in range(depth):
            _IOV.pack_into(self._iov, i * _IOV.size, self._arena_addr + i * slot, 0)
            _MMSG.pack_into(
                self._msgs, i * _MMSG.size, self._names_addr + i * _SOCKADDR_LEN, 0,
                self._iov_addr + i * _IOV.size, 1, 0, 0, 0, 0,
            )  # fmt: skip

    @property
    def full(self) -> bool:
        return self.count >= self.depth

    def add(self, name: bytes, parts: Sequence[Buffer], gso_size: int = 0) -> int:
        """Queue one datagram to ``name`` (a :func:`sockaddr`); its length.

        ``gso_size``: the datagram is a train of datagrams of that size for the
        kernel to cut (``UDP_SEGMENT``; UDP sockets only).
        """
        i = self.count
        if i >= self.depth:
            raise ValueError("send batch full")
        slot = self.slot
        off = base = i * slot
        arena = self.arena
        total = 0
        for part in parts:
            total += len(part)
        if total <= slot:
            for part in parts:
                end = off + len(part)
                arena[off:end] = part
                off = end
            addr = self._arena_addr + base
            self._big.pop(i, None)
        else:
            big = ctypes.create_string_buffer(b"".join(bytes(p) for p in parts), total)
            self._big[i] = big
            addr = ctypes.addressof(big)
        _IOV.pack_into(self._iov, i * _IOV.size, addr, total)
        noff = i * _SOCKADDR_LEN
        self._names[noff : noff + len(name)] = name
        moff = i * _MMSG.size
        if gso_size:
            coff = i * 24
            _CMSG_SEGMENT.pack_into(self._controls, coff, 18, SOL_UDP, UDP_SEGMENT, gso_size)
            _NAMELEN_CONTROL.pack_into(self._msgs, moff + 8, len(name))
            _CONTROL.pack_into(self._msgs, moff + 32, self._controls_addr + coff, 24)
        else:
            _NAMELEN_CONTROL.pack_into(self._msgs, moff + 8, len(name))
            _CONTROL.pack_into(self._msgs, moff + 32, 0, 0)
        self.count = i + 1
        return total

    def send(self, fd: int) -> tuple[int, int]:
        """Send what is queued; (datagrams sent, system calls).  Clears the batch.

        A datagram the kernel refuses (``sendmmsg`` stops at it) is skipped and
        the rest retried: the count says how many were accepted.
        """
        sent = calls = busy = 0
        start = 0
        n = self.count
        while start < n:
            r = _sendmmsg(fd, self._msgs_addr + start * _MMSG.size, n - start, 0)
            calls += 1
            if r < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                if err in (errno.EAGAIN, errno.ENOBUFS) and busy < _BUSY_RETRIES:
                    # device queue full: let the kernel drain it, then retry the rest
                    busy += 1
                    os.sched_yield()
                    continue
                start += 1  # that datagram is refused (EMSGSIZE, unreachable, ...)
                busy = 0
                continue
            sent += r
            start += r
            busy = 0
        self.count = 0
        self._big.clear()
        return sent, calls


# struct mmsghdr on LP64: name, namelen, iov, iovlen, control, controllen, flags, msg_len
_MMSG: Final = struct.Struct("=QI4xQQQQi4xI4x")
_IOV: Final = struct.Struct("=QQ")
_NAMELEN_CONTROL: Final = struct.Struct("=I")
_CONTROL: Final = struct.Struct("=QQ")
_CMSG_SEGMENT: Final = struct.Struct("=QiIH6x")
