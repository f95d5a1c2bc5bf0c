"""``ib_reg_shmid``: registering memory named by a shared-memory identifier.

IBAL's ``ib_shmid_t`` is 64 opaque bytes naming a region several processes
register.  Here it names a POSIX shared-memory segment (what
:mod:`multiprocessing.shared_memory` creates): every process, and every AL
instance in one process, that registers the same name maps the segment itself
and registers its own mapping, so a write that lands through any of the
registrations is seen through all of them.  The region is the whole segment;
a registration that asks for another length is refused (``InvalidSetting``,
as the reference says for a length that does not match the region).

The channel interface has no shared-memory verb (``ib_ci.h`` has none): the
access layer maps the segment and uses the mandatory ``register_mr``.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open, no stub
import contextlib
import mmap
import os
from typing import Final

from ibal.status import InvalidParameter, InvalidSetting

SHMID_SIZE: Final = 64
"""Bytes in an ``ib_shmid_t``: a name may take at most this many (UTF-8)."""


def shmid_name(shmid: object) -> str:
    """The segment name ``shmid`` stands for: a ``str``, or ``bytes`` padded with NULs
    (the C ``uint8_t[64]``)."""
    if isinstance(shmid, (bytes, bytearray)):
        raw = bytes(shmid).rstrip(b"\0")
        try:
            shmid = raw.decode()
        except UnicodeDecodeError:
            raise InvalidParameter("a shmid in bytes must be UTF-8") from None
    if not isinstance(shmid, str):
        raise InvalidParameter(f"a shmid is a str or bytes, not {type(shmid).__name__}")
    name = shmid.lstrip("/")
    if not name or "/" in name or "\0" in name:
        raise InvalidParameter(f"{shmid!r} is not a shared-memory name")
    if len(shmid.encode()) > SHMID_SIZE:
        raise InvalidParameter(f"a shmid has at most {SHMID_SIZE} bytes")
    return name


class Segment:
    """One mapping of a shared-memory segment (``buf`` is the whole segment)."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name = name
        self._mmap = mm
        self.buf = memoryview(mm)

    @property
    def size(self) -> int:
        return self.buf.nbytes

    def close(self) -> None:
        """Unmap (never unlink: the creator owns the segment); a view still held
        elsewhere keeps the mapping until it goes."""
        self.buf.release()
        with contextlib.suppress(BufferError):
            self._mmap.close()


def open_segment(shmid: object, length: int | None) -> Segment:
    """Map the segment ``shmid`` names; ``length`` (if given) must be its size.

    Opened with ``shm_open`` directly: :class:`multiprocessing.shared_memory.SharedMemory`
    would register the segment with this process's resource tracker, which
    unlinks it when the process ends although another process created it.
    """
    name = shmid_name(shmid)
    if length is not None and (type(length) is not int or length <= 0):
        raise InvalidParameter("length must be a positive int")
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise InvalidParameter(f"no shared memory segment named {name!r}") from None
    except OSError as exc:
        raise InvalidParameter(f"cannot open shared memory {name!r}: {exc}") from None
    try:
        size = os.fstat(fd).st_size
        if length is not None and length != size:
            raise InvalidSetting(f"the segment {name!r} holds {size} bytes, not {length}")
        if not size:
            raise InvalidSetting(f"the segment {name!r} is empty")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return Segment(name, mm)
