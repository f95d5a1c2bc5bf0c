"""Fast memory regions (the Mellanox FMR extension: ``mlnx_create_fmr`` ... ``mlnx_destroy_fmr``).

An FMR is allocated once with fixed limits (:class:`~ibal.types.FmrCreate`)
and then mapped over page lists again and again: every map gives new keys,
so a peer holding an older R_Key is refused.  After ``max_maps`` maps an unmap
is needed (``InsufficientResources`` until then).

A CA with the FMR verbs (``Capabilities.fmr``) does the work.  For any other
CA the access layer emulates them over the mandatory verbs: a map registers
the pages (``register_pmr`` when the CA has physical registration, else
``register_mr`` over pages that lie back to back in memory, at their own
address) and then deregisters the previous mapping; the limits are kept here
with the same rules (:mod:`ibal.ci.fmr`).  That is what the kernel's users
moved to when Linux dropped FMRs (5.8), and what rdma-core CAs get.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ibal.al.mr import pin_buffer
from ibal.al.obj import CaObject
from ibal.ci.fmr import check_fmr_map
from ibal.status import InvalidFmrHandle, InvalidParameter, ResourceBusy, Unsupported
from ibal.types import FmrCreate, MrKeys, PhysCreate, Sge

if TYPE_CHECKING:
    from ibal.al.pd import Pd
    from ibal.ci.interface import ChannelInterface


class EmulatedFmr:
    """The state of an FMR the access layer emulates: limits, map count, the region
    registered for the current mapping.  Its methods take the CA's verbs as
    arguments; the :class:`Fmr` makes one map or unmap at a time."""

    __slots__ = ("create", "mapping", "maps")

    def __init__(self, create: FmrCreate) -> None:
        self.create = create
        self.maps = 0
        self.mapping: MrKeys | None = None

    def map(self, ci: ChannelInterface, h_pd: Any, pages: Sequence[memoryview],
            addrs: Sequence[int], vaddr: int) -> MrKeys:
        create = self.create
        ps = create.page_size
        check_fmr_map(create, self.maps, pages, vaddr)
        if ci.capabilities.phys_mr:
            keys = ci.register_pmr(
                h_pd, PhysCreate(pages, ps, len(pages) * ps, create.access), vaddr
            )
        else:
            keys = ci.register_mr(h_pd, _span(pages, addrs, ps, ci), addrs[0], create.access)
        # the new region exists before the old one goes: a failed map changes nothing
        old, self.mapping = self.mapping, keys
        self.maps += 1
        if old is not None:
            ci.deregister_mr(old.handle)
        return keys

    def unmap(self, ci: ChannelInterface) -> None:
        old, self.mapping = self.mapping, None
        self.maps = 0
        if old is not None:
            ci.deregister_mr(old.handle)


def _span(pages: Sequence[memoryview], addrs: Sequence[int], ps: int,
          ci: ChannelInterface) -> memoryview:
    """The pages as one buffer, when they lie back to back in memory."""
    first = addrs[0]
    if any(a != first + i * ps for i, a in enumerate(addrs)):
        raise Unsupported(
            "these pages are not contiguous in memory, and the CA has neither FMR verbs nor "
            f"physical registration ({ci.capabilities.reason('phys_mr')})"
        )
    return memoryview((ctypes.c_char * (len(pages) * ps)).from_address(first)).cast("B")


class Fmr(CaObject):
    """A fast memory region (``mlnx_create_fmr``); ``map`` / ``unmap`` / ``destroy``.

    While mapped, ``vaddr``, ``length``, ``lkey`` and ``rkey`` describe the current
    mapping (0 otherwise).
    """

    _invalid = InvalidFmrHandle
    _rank = 40
    _kind = "FMR"
    _sync_destroy = True

    def __init__(self, pd: Pd, create: FmrCreate, native: bool) -> None:
        super().__init__(pd)
        self._pd = pd
        self._create = create
        self._native = native
        self._pinned: list[Any] = []  # the mapped pages' exports (they cannot be resized)
        self._maplock = threading.Lock()  # one map or unmap at a time, keys kept in step
        self._mapped = False
        self.lkey = 0
        self.rkey = 0
        self.vaddr = 0
        self.length = 0

    @property
    def pd(self) -> Pd:
        return self._pd

    @property
    def create(self) -> FmrCreate:
        return self._create

    @property
    def native(self) -> bool:
        """True when the CA runs the FMR verbs; False when the access layer emulates them."""
        return self._native

    @property
    def mapped(self) -> bool:
        return self._mapped

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """An SGE for ``[offset, offset+length)`` of the current mapping."""
        if length is None:
            length = self.length - offset
        if not self._mapped or offset < 0 or length < 0 or offset + length > self.length:
            raise InvalidParameter(f"[{offset}, {offset + length}) is outside the mapping")
        return Sge(self.vaddr + offset, length, self.lkey)

    # ------------------------------------------------------------------ verbs
    def map(self, pages: Sequence[object], vaddr: int = 0) -> tuple[int, int]:
        """``mlnx_map_phys_fmr``: map ``pages`` (writable buffers of at least
        ``page_size`` bytes, standing for physical pages) as one region at ``vaddr``
        (0: the CA chooses; ``self.vaddr`` is what was assigned).

        Returns the new ``(lkey, rkey)``; the previous mapping's keys stop working.
        """
        self._check()
        if not isinstance(pages, Sequence) or isinstance(pages, (bytes, bytearray, memoryview)):
            raise InvalidParameter("the page list must be a sequence of page buffers")
        pinned = [pin_buffer(p) for p in pages]
        views = [view for view, _, _ in pinned]
        # the shape of the request, before the CA sees it (the CA counts the maps)
        check_fmr_map(self._create, 0, views, vaddr)
        ps = self._create.page_size
        if any(v.nbytes < ps for v in views):
            raise InvalidParameter(f"a page buffer is shorter than the page size {ps}")
        self._use()
        try:
            with self._maplock:
                if self._native:
                    keys = self._ci.map_phys_fmr(self._h, views, vaddr)
                else:
                    addrs = [addr for _, _, addr in pinned]
                    keys = self._h.map(self._ci, self._pd.ci_handle, views, addrs, vaddr)
                with self._lock:
                    self._pinned = [export for _, export, _ in pinned]
                    self._mapped = True
                    self.lkey, self.rkey = keys.lkey, keys.rkey
                    self.vaddr, self.length = keys.vaddr, keys.length
        finally:
            self._unuse()
        return keys.lkey, keys.rkey

    def unmap(self) -> None:
        """``mlnx_unmap_fmr``: the mapping's keys stop working; maps may start over."""
        self._use()
        try:
            self._unmap()
        finally:
            self._unuse()

    def _unmap(self) -> None:
        with self._maplock:
            if self._native:
                self._ci.unmap_fmr(self._h)
            else:
                self._h.unmap(self._ci)
            with self._lock:
                self._pinned = []
                self._mapped = False
                self.lkey = self.rkey = self.vaddr = self.length = 0

    def destroy(self) -> None:
        """``mlnx_destroy_fmr``: synchronous; ``ResourceBusy`` while mapped."""
        self._destroy_now()

    def _check_busy(self) -> None:
        if self._mapped:
            raise ResourceBusy("the FMR is mapped: unmap it first")

    def _cleanup(self) -> None:
        if self._mapped:  # a cascade (the PD goes): unmap first, as a consumer would
            self._unmap()
        if self._native:
            self._ci.dealloc_fmr(self._h)

    def _unlink(self) -> None:
        self._pinned = []
