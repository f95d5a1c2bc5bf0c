"""Batched datagram system calls through ctypes: ``recvmmsg`` and ``sendmmsg``.

Python's socket module has neither.  :class:`RecvRing` owns preallocated
buffers, addresses and control areas for up to ``depth`` datagrams and fills
them with one ``recvmmsg``; :class:`SendBatch` gathers up to ``depth``
datagrams (copied into its arena) and sends them with one ``sendmmsg``.
Both keep every buffer they point to alive until the call returns.

The calls that cannot block (``MSG_DONTWAIT``) go through ``ctypes.PyDLL``,
which keeps the GIL: a ctypes call through ``CDLL`` releases it, and a thread
that releases the GIL while another busy-polls gets it back only after the
switch interval (5 ms), so one datagram call could cost 5 ms of latency.
Only a call that may wait (``block=True``, a full socket buffer) releases it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct
from collections.abc import Sequence
from typing import Any, Final

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


# the same functions, called with the GIL held: only for calls that cannot block
_libc_gil = ctypes.PyDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _proto(lib: ctypes.CDLL, name: str, *args: type) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = list(args)
    fn.restype = ctypes.c_int
    return fn


_RECV_ARGS: Final = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p)
_SEND_ARGS: Final = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
_recvmmsg = _proto(_libc, "recvmmsg", *_RECV_ARGS)
_recvmmsg_nb = _proto(_libc_gil, "recvmmsg", *_RECV_ARGS)
_sendmmsg = _proto(_libc, "sendmmsg", *_SEND_ARGS)
_sendmmsg_nb = _proto(_libc_gil, "sendmmsg", *_SEND_ARGS)


def sockaddr(ip: bytes, port: int) -> bytes:
    """A sockaddr_in (4-byte ``ip``) or sockaddr_in6 (16 bytes) as bytes."""
    if len(ip) == 4:
        return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + ip + bytes(8)
    return struct.pack("=H", socket.AF_INET6) + struct.pack(">HI", port, 0) + ip + bytes(4)


class RecvRing:
    """Buffers for ``depth`` datagrams of up to ``size`` bytes and one ``recvmmsg`` over them.

    The ``mmsghdr`` array lives in a ``bytearray``: after a call, the slots the
    kernel wrote are restored from a pristine copy with one slice assignment,
    and lengths and flags are read with ``struct`` (ctypes field access costs
    about a microsecond each from Python).
    """

    def __init__(self, depth: int, size: int) -> None:
        self.depth = depth
        self.size = size
        self.arena = bytearray(depth * size)
        self.view = memoryview(self.arena)
        base = _addr(self.arena)
        self._iov = bytearray(depth * _IOV.size)
        self.names = bytearray(depth * _SOCKADDR_LEN)
        self.controls = bytearray(depth * _CONTROL_LEN)
        self.msgs = bytearray(depth * _MMSG.size)
        iov, names, controls = _addr(self._iov), _addr(self.names), _addr(self.controls)
        for i in range(depth):
            _IOV.pack_into(self._iov, i * _IOV.size, base + i * size, size)
            _MMSG.pack_into(
                self.msgs, i * _MMSG.size, names + i * _SOCKADDR_LEN, _SOCKADDR_LEN,
                iov + i * _IOV.size, 1, controls + i * _CONTROL_LEN, _CONTROL_LEN, 0, 0,
            )  # fmt: skip
        self._pristine = bytes(self.msgs)
        self._base = _addr(self.msgs)
        self._used = 0

    def recv(self, fd: int, *, block: bool = False) -> int:
        """Fill up to ``depth`` slots; the count, 0 when nothing is waiting (or EINTR).

        ``block``: wait for the first datagram (``MSG_WAITFORONE``), else return at once.
        """
        used = self._used * _MMSG.size
        if used:
            self.msgs[:used] = self._pristine[:used]
        if block:
            n = _recvmmsg(fd, self._base, self.depth, MSG_WAITFORONE, None)
        else:
            n = _recvmmsg_nb(fd, self._base, self.depth, MSG_DONTWAIT, None)
        if n < 0:
            self._used = 0
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, f"recvmmsg: {os.strerror(err)}")
        self._used = n
        return int(n)

    def length(self, i: int) -> int:
        """Bytes in slot ``i`` (more than the slot holds if it was truncated)."""
        return int(_U32.unpack_from(self.msgs, i * _MMSG.size + 56)[0])

    def datagram(self, i: int) -> memoryview:
        """The bytes of slot ``i`` (a view into the ring: valid until the next :meth:`recv`)."""
        off = i * self.size
        return self.view[off : off + min(self.length(i), self.size)]

    def truncated(self, i: int) -> bool:
        return bool(_I32.unpack_from(self.msgs, i * _MMSG.size + 48)[0] & MSG_TRUNC)

    def source(self, i: int) -> tuple[bytes, int]:
        """(raw IP address, port) the datagram in slot ``i`` came from."""
        off = i * _SOCKADDR_LEN
        names = self.names
        port = int.from_bytes(names[off + 2 : off + 4], "big")
        if names[off] == socket.AF_INET:  # sa_family, little-endian low byte
            return bytes(names[off + 4 : off + 8]), port
        return bytes(names[off + 8 : off + 24]), port

    def gro_size(self, i: int) -> int:
        """The segment size of a GRO-coalesced slot (``UDP_GRO`` control message), else 0."""
        clen_total = int(_U64.unpack_from(self.msgs, i * _MMSG.size + 40)[0])
        if clen_total < 16:
            return 0
        raw = self.controls
        base = off = i * _CONTROL_LEN
        while off + 16 <= base + clen_total:
            clen, level, ctype = struct.unpack_from("=QiI", raw, off)
            if clen < 16:
                return 0
            if level == SOL_UDP and ctype == UDP_GRO:
                fmt = "=H" if clen < 20 else "=i"
                return int(struct.unpack_from(fmt, raw, off + 16)[0])
            off += (clen + 7) & ~7
        return 0


def _addr(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


_U32: Final = struct.Struct("=I")
_I32: Final = struct.Struct("=i")
_U64: Final = struct.Struct("=Q")


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
        self._slot_name: list[bytes | None] = [None] * depth  # the address each slot holds
        self._slot_gso: list[bool] = [False] * depth  # the slot points at a control message
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
        kernel to cut (``UDP_SEGMENT``; UDP sockets only).  The per-slot fields
        that repeat from one batch to the next (address, no control message,
        iovec base) are rewritten only when they change.
        """
        i = self.count
        if i >= self.depth:
            raise ValueError("send batch full")
        slot = self.slot
        off = i * slot
        arena = self.arena
        total = 0
        for part in parts:
            total += len(part)
        iov = i * _IOV.size
        if total <= slot:
            for part in parts:
                end = off + len(part)
                arena[off:end] = part
                off = end
            _U64.pack_into(self._iov, iov + 8, total)  # the base is this slot's (send resets it)
        else:
            big = ctypes.create_string_buffer(b"".join(bytes(p) for p in parts), total)
            self._big[i] = big
            _IOV.pack_into(self._iov, iov, ctypes.addressof(big), total)
        moff = i * _MMSG.size
        if self._slot_name[i] is not name:
            noff = i * _SOCKADDR_LEN
            self._names[noff : noff + len(name)] = name
            _NAMELEN_CONTROL.pack_into(self._msgs, moff + 8, len(name))
            self._slot_name[i] = name
        if gso_size:
            coff = i * 24
            _CMSG_SEGMENT.pack_into(self._controls, coff, 18, SOL_UDP, UDP_SEGMENT, gso_size)
            _CONTROL.pack_into(self._msgs, moff + 32, self._controls_addr + coff, 24)
            self._slot_gso[i] = True
        elif self._slot_gso[i]:
            _CONTROL.pack_into(self._msgs, moff + 32, 0, 0)
            self._slot_gso[i] = False
        self.count = i + 1
        return total

    def reserve(self, name: bytes, count: int, length: int) -> int:
        """Queue ``count`` datagrams of ``length`` bytes to ``name``; the first slot.

        The caller writes datagram ``k`` into ``arena[(first + k) * slot :]``
        (a train: one loop, no per-datagram call).  ``count`` must fit
        (``depth - self.count``) and ``length`` must be at most ``slot``.
        """
        first = self.count
        if count > self.depth - first or length > self.slot:
            raise ValueError("send batch: no room")
        iovs = self._iov
        msgs = self._msgs
        names = self._names
        slot_name = self._slot_name
        slot_gso = self._slot_gso
        for i in range(first, first + count):
            _U64.pack_into(iovs, i * _IOV.size + 8, length)
            if slot_name[i] is not name:
                noff = i * _SOCKADDR_LEN
                names[noff : noff + len(name)] = name
                _NAMELEN_CONTROL.pack_into(msgs, i * _MMSG.size + 8, len(name))
                slot_name[i] = name
            if slot_gso[i]:
                _CONTROL.pack_into(msgs, i * _MMSG.size + 32, 0, 0)
                slot_gso[i] = False
        self.count = first + count
        return first

    @property
    def iovecs(self) -> bytearray:
        """The ``struct iovec`` array (``depth`` entries): compiled code that fills
        reserved slots sets their lengths here."""
        return self._iov

    def send(self, fd: int) -> tuple[int, int]:
        """Send what is queued; (datagrams sent, system calls).  Clears the batch.

        A datagram the kernel refuses (``sendmmsg`` stops at it) is skipped and
        the rest retried: the count says how many were accepted.
        """
        sent = calls = busy = 0
        start = 0
        n = self.count
        full = False  # the socket buffer was full: wait for room (GIL released)
        while start < n:
            addr = self._msgs_addr + start * _MMSG.size
            if full:
                r = _sendmmsg(fd, addr, n - start, 0)
            else:
                r = _sendmmsg_nb(fd, addr, n - start, MSG_DONTWAIT)
            calls += 1
            if r < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                if err == errno.EAGAIN and not full:
                    full = True
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
        if self._big:
            for i in self._big:  # back to the arena slot
                _IOV.pack_into(self._iov, i * _IOV.size, self._arena_addr + i * self.slot, 0)
            self._big.clear()
        return sent, calls


# struct mmsghdr on LP64: name, namelen, iov, iovlen, control, controllen, flags, msg_len
_MMSG: Final = struct.Struct("=QI4xQQQQi4xI4x")
_IOV: Final = struct.Struct("=QQ")
_NAMELEN_CONTROL: Final = struct.Struct("=I")
_CONTROL: Final = struct.Struct("=QQ")
_CMSG_SEGMENT: Final = struct.Struct("=QiIH6x")
