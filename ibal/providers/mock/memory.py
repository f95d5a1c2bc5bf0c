"""The mock's key tables as the transport core reaches memory: one QP's ``MemoryAccess``.

:class:`QpMemory` translates (key, address, length) through its CA's key
table with the checks of IBA 10.6 (the key, the protection domain, the
access rights, the bounds; a type 2B window only on the QP it was bound
through) and hands a range of the region: a ``memoryview`` of a virtual
region's consumer buffer, or a :class:`~ibal.transport.scatter.Scatter` of
page views for a physical region (``register_pmr``, ``modify_pmr``, an FMR
map), whose pages are contiguous only at the I/O VA.  The mock's own
gather/scatter uses it, as the packet core will.

Called by the engine under the fabric lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock import invalidate
from ibal.providers.mock.objects import MockMr, MockMw
from ibal.transport.scatter import Range, Scatter
from ibal.types import AccessFlags

if TYPE_CHECKING:
    from ibal.providers.mock.objects import MockQp

_LOCAL_WRITE = int(AccessFlags.LOCAL_WRITE)
_EMPTY = memoryview(bytearray())


def region_range(mr: MockMr, off: int, length: int) -> Range:
    """``length`` bytes at region offset ``off`` (inside the region: the caller checked)."""
    mv = mr.mv
    if mv is not None:
        return mv[off : off + length]
    ps = mr.page_size
    pages = mr.pages
    pos = mr.base + off
    parts: list[memoryview] = []
    while length > 0:
        page, in_page = divmod(pos, ps)
        take = min(length, ps - in_page)
        parts.append(pages[page][in_page : in_page + take])
        pos += take
        length -= take
    if len(parts) == 1:
        return parts[0]
    return Scatter(parts)


class QpMemory:
    """The :class:`~ibal.transport.qp.MemoryAccess` of one mock QP (its PD's keys)."""

    __slots__ = ("qp",)

    def __init__(self, qp: MockQp) -> None:
        self.qp = qp

    def local(self, lkey: int, addr: int, length: int, write: bool) -> Range | None:
        return self._local(self.qp.pd, lkey, addr, length, write)

    def recv(self, lkey: int, addr: int, length: int) -> Range | None:
        qp = self.qp
        srq = qp.srq
        return self._local(qp.pd if srq is None else srq.pd, lkey, addr, length, True)

    def _local(self, pd: object, lkey: int, addr: int, length: int,
               write: bool) -> Range | None:
        if not length:
            return _EMPTY
        obj = self.qp.ca.keys.get(lkey)
        if obj is None or obj.__class__ is not MockMr:
            return None
        mr: MockMr = obj
        if mr.lkey != lkey or mr.pd is not pd:
            return None
        off = addr - mr.vaddr
        if off < 0 or off + length > mr.length:
            return None
        if write and not mr.acc & _LOCAL_WRITE:
            return None
        return region_range(mr, off, length)

    def remote(self, rkey: int, va: int, length: int, access: int) -> Range | None:
        if not length:
            return _EMPTY
        qp = self.qp
        obj = qp.ca.keys.get(rkey)
        if obj is None or obj.rkey != rkey or obj.pd is not qp.pd or obj.acc & access != access:
            return None
        if obj.__class__ is MockMr:
            mr: MockMr = obj
            off = va - mr.vaddr
            if off < 0 or off + length > mr.length:
                return None
            return region_range(mr, off, length)
        mw: MockMw = obj  # type: ignore[assignment]
        bound = mw.mr
        if bound is None:
            return None
        if mw.qp is not None and mw.qp is not qp:
            return None  # type 2B: only through the QP it was bound on
        if va < mw.addr or va + length > mw.addr + mw.length:
            return None
        return region_range(bound, va - bound.vaddr, length)

    def invalidate(self, rkey: int) -> bool:
        qp = self.qp
        return invalidate.remote_invalidate(qp.ca, qp, rkey)
