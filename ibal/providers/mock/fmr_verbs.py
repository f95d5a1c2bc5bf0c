"""Fast memory regions of a mock CA (``alloc_fmr`` ... ``dealloc_fmr``).

A mapping is a physical :class:`~ibal.providers.mock.objects.MockMr` in the key
table, under the FMR's key index with the next key byte each map (as the FMR
drivers turned the key over), so a stale R_Key misses.  Called by the access
layer on any thread under the fabric lock; never blocks; raises the
:mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ibal.ci.fmr import check_fmr_create, check_fmr_map
from ibal.ci.interface import Handle
from ibal.providers.mock.ca_state import PAGE_SIZES, verb
from ibal.providers.mock.memory_verbs import MemoryVerbs
from ibal.providers.mock.objects import MockFmr, MockMr
from ibal.types import FmrCreate, MrKeys

FMR_MAX_PAGES: Final = 4096
"""The most pages one mock FMR maps (16 MiB of 4 KiB pages)."""


class FmrVerbs(MemoryVerbs):
    """``alloc_fmr`` and ``map_phys_fmr`` (over the region helpers of :class:`MemoryVerbs`);
    unmap and dealloc are :class:`~ibal.providers.softca.SoftCa`'s."""

    @verb
    def alloc_fmr(self, h_pd: Handle, create: FmrCreate) -> MockFmr:
        pd = self._h_pd(h_pd)
        create = check_fmr_create(create, FMR_MAX_PAGES, PAGE_SIZES)
        self._check_count("mr", self.limits.max_mrs)  # an FMR holds a region entry
        fmr = MockFmr(self, pd, create, self._new_key())
        self._adopt("mr", pd)
        return fmr

    def _drop_mapping(self, fmr: MockFmr) -> None:
        mr = fmr.mr
        if mr is not None:
            del self.keys[mr.lkey]
            mr.alive = False
            mr.pages = ()
            fmr.mr = None

    @verb
    def map_phys_fmr(self, h_fmr: Handle, pages: Sequence[memoryview], vaddr: int) -> MrKeys:
        fmr = self._h_fmr(h_fmr)
        check_fmr_map(fmr.create, fmr.maps, pages, vaddr)
        ps = fmr.create.page_size
        views = tuple(self._page(p, ps, fmr.acc) for p in pages)
        length = len(views) * ps
        mr = MockMr(self, fmr.pd)
        mr.vaddr = vaddr or self._alloc_iova(length, ps)
        mr.length = length
        mr.pages = views
        mr.page_size = ps
        mr.phys = True
        self._drop_mapping(fmr)
        fmr.key = self._rekey(fmr.key)
        self._install_keys(mr, fmr.acc, fmr.key)
        fmr.mr = mr
        fmr.maps += 1
        return self._keys_of(mr, fmr)
