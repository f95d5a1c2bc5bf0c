"""Fast memory regions of an rxe CA (``alloc_fmr`` ... ``dealloc_fmr``).

A mapping is an ordinary :class:`~ibal.providers.rxe.memory.Mr` in the key
table, at the I/O address the consumer asks for (rxe translates by offset, so
any page-aligned address works) and under a fresh key each time, so the
previous mapping's keys miss at once.  rxe's regions are one contiguous view
of memory (the transport core reads and writes whole ranges), so the pages of
one mapping must lie back to back in memory; scattered pages are
``Unsupported`` (a CA with page tables, like the mock, maps them).

Called by the access layer on any thread; each verb takes the CA lock, never
blocks, and raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Final

from ibal.ci.fmr import FMR_PAGE_SIZES, check_fmr_create, check_fmr_map
from ibal.providers import checks
from ibal.providers.rxe.memory import Fmr, Mr
from ibal.providers.rxe.verbs import CaState, serialized
from ibal.status import InvalidFmrHandle, InvalidParameter, Unsupported
from ibal.types import FmrCreate, MrKeys

FMR_MAX_PAGES: Final = 4096
"""The most pages one rxe FMR maps."""


def _span(pages: Sequence[Any], ps: int, acc: int) -> memoryview:
    """The pages (each at least ``ps`` bytes) as one view, if they lie back to back."""
    views = [checks.byte_view(p, acc) for p in pages]
    if any(v.nbytes < ps for v in views):
        raise InvalidParameter(f"a page buffer is shorter than {ps} bytes")
    if any(v.readonly for v in views):
        raise InvalidParameter("rxe maps writable page buffers only")
    addrs = [ctypes.addressof(ctypes.c_char.from_buffer(v)) for v in views]
    first = addrs[0]
    if any(a != first + i * ps for i, a in enumerate(addrs)):
        raise Unsupported("rxe maps only pages that lie back to back in memory")
    return memoryview((ctypes.c_char * (len(views) * ps)).from_address(first)).cast("B")


class FmrVerbs(CaState):
    """``alloc_fmr`` and ``map_phys_fmr``; unmap and dealloc are
    :class:`~ibal.providers.softca.SoftCa`'s."""

    def _h_fmr(self, h: Any) -> Fmr:
        return self._own(h, Fmr, InvalidFmrHandle, "an FMR")

    @serialized
    def alloc_fmr(self, h_pd: Any, create: FmrCreate) -> Fmr:
        pd = self._h_pd(h_pd)
        create = check_fmr_create(create, FMR_MAX_PAGES, FMR_PAGE_SIZES)
        self._check_count("mr", self.attr.max_mrs)  # an FMR holds a region entry
        fmr = Fmr(self, pd, create)
        self._adopt("mr", pd)
        return fmr

    def _drop_mapping(self, fmr: Fmr) -> None:
        mr = fmr.mr
        if mr is not None:
            mr.alive = False
            self.keys.remove(mr.lkey)
            fmr.mr = None
            fmr.pages = ()

    @serialized
    def map_phys_fmr(self, h_fmr: Any, pages: Sequence[memoryview], vaddr: int) -> MrKeys:
        fmr = self._h_fmr(h_fmr)
        create = fmr.create
        check_fmr_map(create, fmr.maps, pages, vaddr)
        acc = int(create.access)
        view = _span(pages, create.page_size, acc)
        first = ctypes.addressof(ctypes.c_char.from_buffer(view))
        mr = Mr(self, fmr.pd, view, vaddr or first, acc)
        key = self.keys.new_key()  # a live index never repeats: stale keys miss
        self._drop_mapping(fmr)
        mr.lkey = key
        mr.rkey = key if acc & checks.REMOTE else 0
        self.keys.install(mr, key)
        fmr.mr = mr
        fmr.pages = tuple(pages)  # the memory the view points into stays alive
        fmr.maps += 1
        return self._keys_of(mr, fmr)
